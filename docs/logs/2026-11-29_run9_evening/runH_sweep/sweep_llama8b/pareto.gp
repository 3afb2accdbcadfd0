set terminal pngcairo size 900,600 font 'sans,11'
set grid
set key top right
set datafile commentschars '#'
set output '/tmp/gc/sweep_llama8b/pareto.png'
set title 'Output throughput per GPU vs per-user speed (1 GPU)'
set xlabel 'output tokens/s per user (mean of 1/TPOT)'
set ylabel 'output tokens/s per GPU'
set offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05
plot '/tmp/gc/sweep_llama8b/sweep.dat' using 2:3 with points pt 7 ps 1.5 title 'concurrency', \
     '/tmp/gc/sweep_llama8b/sweep.dat' using 2:3:(sprintf('c=%d', $1)) with labels offset 1.2,0.8 notitle, \
     '/tmp/gc/sweep_llama8b/pareto_front.dat' using 1:2 with lines lw 2 title 'Pareto front'
