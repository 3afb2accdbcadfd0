#include "backend/cuda/cuda_sampler.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/sampling.h"

namespace di::cuda {

std::vector<int32_t> sample_on_gpu(CudaBackend& be, const Tensor& logits,
                                   const std::vector<sampling::SamplingParams>& params,
                                   const std::vector<int64_t>& positions) {
  DI_CHECK(logits.device() == Device::kCUDA && logits.dtype() == DType::kF32 && logits.dim() == 2,
           "sample_on_gpu: logits must be CUDA f32 [rows, vocab], got {}", logits.describe());
  const auto rows = static_cast<int32_t>(logits.size(0));
  const auto vocab = static_cast<int32_t>(logits.size(1));
  DI_CHECK(params.size() == static_cast<size_t>(rows) && positions.size() == params.size(),
           "sample_on_gpu: {} params / {} positions for {} rows", params.size(), positions.size(),
           rows);
  if (rows == 0) return {};
  Tensor host = Tensor::empty({static_cast<int64_t>(rows) * static_cast<int64_t>(sizeof(SampleRowParams))},
                              DType::kU8);
  auto* rp = static_cast<SampleRowParams*>(host.raw());
  for (int32_t r = 0; r < rows; ++r) {
    const auto& sp = params[static_cast<size_t>(r)];
    DI_CHECK(!sp.has_penalties(), "sample_on_gpu: row {} has penalties (not on the GPU yet)", r);
    rp[r] = SampleRowParams{sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.seed,
                            positions[static_cast<size_t>(r)]};
  }
  Tensor dev_params = be.upload(host, DType::kU8);
  Tensor tokens = be.empty({rows}, DType::kI32);
  const size_t ws_bytes = sample_workspace_bytes(rows, vocab);
  Tensor ws = be.empty({static_cast<int64_t>(ws_bytes)}, DType::kU8);
  SampleParams p{static_cast<const float*>(logits.raw()),
                 static_cast<const SampleRowParams*>(dev_params.raw()),
                 static_cast<int32_t*>(tokens.raw()), rows, vocab, ws.raw(), ws_bytes};
  launch_sample(p, be.stream());
  CUDA_CHECK_LAUNCH("sample");
  Tensor out = be.download(tokens);
  return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + rows);
}

}  // namespace di::cuda

