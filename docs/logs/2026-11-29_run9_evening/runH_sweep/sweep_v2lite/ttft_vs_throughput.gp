set terminal pngcairo size 900,600 font 'sans,11'
set grid
set key top right
set datafile commentschars '#'
set output '/tmp/gc/sweep_v2lite/ttft_vs_throughput.png'
set title 'Time to first token vs output throughput (1 GPU)'
set xlabel 'output tokens/s per GPU'
set ylabel 'TTFT (ms)'
set offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05
plot '/tmp/gc/sweep_v2lite/sweep.dat' using 3:4 with linespoints pt 7 lw 2 title 'TTFT p50', \
     '/tmp/gc/sweep_v2lite/sweep.dat' using 3:5 with linespoints pt 5 lw 2 title 'TTFT p99', \
     '/tmp/gc/sweep_v2lite/sweep.dat' using 3:5:(sprintf('c=%d', $1)) with labels offset 1.2,0.8 notitle
