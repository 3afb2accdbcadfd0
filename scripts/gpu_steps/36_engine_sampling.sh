# Sampling on the GPU inside the engine (issues #5/#6/#8; engine/sample_placement.h):
# tests/ops/test_cuda_engine.cpp CudaEngineSampling — the engine with the device sampler vs the
# host sampler (EngineConfig::device_sampling off, what DEEPINFER_GPU_SAMPLING=0 does) on the
# golden models (cuda-fp32 and cuda): phases of 1, 3 and 17 rows, then a penalty + logprobs mix
# that falls back to the host; every event must be identical. Lines:
#   [engine-sampling] backend=.. model=.. events=.. same=.. device_steps=.. steps=.. ..
run_step engine_sampling 180 .gpu_bin/test_cuda_engine --gtest_color=no \
  --gtest_filter='Golden/CudaEngineSampling.*'
{
  echo "engine sampling (test_cuda_engine): rc=${rcs[${#rcs[@]}-1]} $(grep -c '^\[       OK \]' "$OUT/engine_sampling.log") ok, $(grep -c '^\[  FAILED  \].*(' "$OUT/engine_sampling.log") failed"
  grep -h '^\[engine-sampling\]' "$OUT/engine_sampling.log"
  grep -h -A4 'Failure' "$OUT/engine_sampling.log" | head -8
} >>"$OUT/summary_extra.txt"
