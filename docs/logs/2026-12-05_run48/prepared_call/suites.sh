#!/usr/bin/env bash
# Run 48's prepared verification call (no device was lent in run 48): the GPU suites on the tree
# after run 48's removals (the GQA cluster decode kernel and its test, the slot down kernel's
# MinBlocks-1 switch; every default kernel byte-identical to 45e4247's, which run 47 call 5
# verified: test_backend_ops 365/365, test_cuda_mla 75/75, test_cuda_golden 16/16, and
# test_cuda_moe 246/246 in call 1). Expect test_backend_ops one test fewer (the cluster test).
# run.sh already runs the attention part of test_backend_ops and the whole test_cuda_moe (with
# the feature patch); this is the full set, for a call to spare, through the project's own
# runner (its steps: ops, moe_test = test_cuda_moe without its grouped / v2 / router tests,
# mla_ops, golden, the two MoE models at 1 / 32 / 256). With
# the demo model moved aside for the carry limit, golden's two demo_code cases cannot load.
# Bundle (here): BUNDLE_TARGETS="test_backend_ops test_cuda_moe test_cuda_mla test_cuda_golden
#   bench_cuda_model" JOBS=2 bash scripts/build_gpu_bundle.sh; rm -f .gpu_pack/tokenizers.tar.xz;
#   move models/deepinfer-demo-code/model.safetensors aside; carry [".gpu_pack"]; restore it.
GPU_CHECK_ONLY="ops moe_test mla_ops golden model_v2lite model_qwen3moe" exec bash scripts/gpu_check.sh
