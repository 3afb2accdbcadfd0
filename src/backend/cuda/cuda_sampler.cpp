#include "backend/cuda/cuda_sampler.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/sampling.h"

namespace di::cuda {

std::vector<int32_t> CudaSampler::sample(const Tensor& logits,
                                         std::span<const DeviceSampleRow> rows) {
  DI_CHECK(logits.device() == Device::kCUDA && logits.dtype() == DType::kF32 && logits.dim() == 2,
           "sample_on_device: logits must be CUDA f32 [rows, vocab], got {}", logits.describe());
  DI_CHECK(logits.size(0) == static_cast<int64_t>(rows.size()),
           "sample_on_device: {} sampling rows for logits {}", rows.size(), logits.describe());
  const auto num_rows = static_cast<int32_t>(logits.size(0));
  const auto vocab = static_cast<int32_t>(logits.size(1));
  if (num_rows == 0) return {};
  DI_CHECK(vocab > 0, "sample_on_device: logits {} have no columns", logits.describe());

  const int64_t row_bytes = static_cast<int64_t>(sizeof(SampleRowParams));
  bool all_greedy = true;
  for (const DeviceSampleRow& s : rows) all_greedy = all_greedy && s.temperature == 0.0f;
  if (all_greedy && greedy_fast_path_) {
    // Greedy decode (every row temperature 0): one argmax per row, no sort, no workspace.
    if (tokens_.is_null() || tokens_.numel() < num_rows)
      tokens_ = be_.empty({num_rows}, DType::kI32);
    launch_argmax_rows(static_cast<const float*>(logits.raw()), num_rows, vocab,
                       static_cast<int32_t*>(tokens_.raw()), be_.stream());
    CUDA_CHECK_LAUNCH("argmax_rows");
    return download_tokens(num_rows);
  }
  if (tokens_.is_null() || tokens_.numel() < num_rows || params_.is_null() ||
      params_.numel() < num_rows * row_bytes) {
    params_host_ = Tensor::empty({num_rows * row_bytes}, DType::kU8);
    params_ = be_.empty({num_rows * row_bytes}, DType::kU8);
    tokens_ = be_.empty({num_rows}, DType::kI32);
  }
  const size_t ws_bytes = sample_workspace_bytes(num_rows, vocab);
  if (workspace_.is_null() || static_cast<size_t>(workspace_.numel()) < ws_bytes) {
    workspace_ = Tensor();  // back to the allocator before the larger one is taken
    workspace_ = be_.empty({static_cast<int64_t>(ws_bytes)}, DType::kU8);
  }

  auto* rp = static_cast<SampleRowParams*>(params_host_.raw());
  for (int32_t r = 0; r < num_rows; ++r) {
    const DeviceSampleRow& s = rows[static_cast<size_t>(r)];
    rp[r] = SampleRowParams{s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.position};
  }
  // The staging stays untouched until the synchronisation below, so the copy may read it late.
  be_.copy_to_device(params_host_.slice_rows(0, num_rows * row_bytes), params_);
  SampleParams p{static_cast<const float*>(logits.raw()),
                 static_cast<const SampleRowParams*>(params_.raw()),
                 static_cast<int32_t*>(tokens_.raw()),
                 num_rows,
                 vocab,
                 workspace_.raw(),
                 static_cast<size_t>(workspace_.numel())};
  launch_sample(p, be_.stream());
  CUDA_CHECK_LAUNCH("sample");
  return download_tokens(num_rows);
}

std::vector<int32_t> CudaSampler::download_tokens(int32_t num_rows) {
  tokens_host_.resize(static_cast<size_t>(num_rows));
  CUDA_CHECK(cudaMemcpyAsync(tokens_host_.data(), tokens_.raw(),
                             sizeof(int32_t) * tokens_host_.size(), cudaMemcpyDeviceToHost,
                             be_.stream()));
  CUDA_CHECK(cudaStreamSynchronize(be_.stream()));
  return tokens_host_;
}

std::vector<int32_t> CudaBackend::sample_on_device(const Tensor& logits,
                                                   std::span<const DeviceSampleRow> rows) {
  if (!sampler_) sampler_ = std::make_shared<CudaSampler>(*this);
  return sampler_->sample(logits, rows);
}

std::vector<int32_t> sample_on_gpu(CudaBackend& be, const Tensor& logits,
                                   const std::vector<sampling::SamplingParams>& params,
                                   const std::vector<int64_t>& positions) {
  DI_CHECK(positions.size() == params.size(), "sample_on_gpu: {} params / {} positions",
           params.size(), positions.size());
  std::vector<DeviceSampleRow> rows;
  rows.reserve(params.size());
  for (size_t r = 0; r < params.size(); ++r) {
    const sampling::SamplingParams& sp = params[r];
    DI_CHECK(!sp.has_penalties(), "sample_on_gpu: row {} has penalties (not on the GPU yet)", r);
    rows.push_back({sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.seed, positions[r]});
  }
  return be.sample_on_device(logits, rows);
}

}  // namespace di::cuda
