# The engine with decode-step CUDA graphs vs eager (issue #5, ModelRunner::enable_decode_graphs):
# tests/ops/test_cuda_engine.cpp on the golden models. Lines:
#   [engine-graph] model=.. requests=.. tokens=.. same=.. near_tie_splits=.. bad_splits=.. graph_steps=..
run_step engine_graphs 60 .gpu_bin/test_cuda_engine --gtest_color=no \
  --gtest_filter='Golden/CudaEngineGraphs.*'  # CudaEngineSampling: 36_engine_sampling.sh
{
  echo "engine graphs (test_cuda_engine): rc=${rcs[${#rcs[@]}-1]} $(grep -c '^\[       OK \]' "$OUT/engine_graphs.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/engine_graphs.log") failed"
  grep -h '^\[engine-graph\]' "$OUT/engine_graphs.log"
  grep -h -A4 'Failure' "$OUT/engine_graphs.log" | head -8
} >>"$OUT/summary_extra.txt"
