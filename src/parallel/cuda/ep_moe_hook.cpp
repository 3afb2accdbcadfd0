#include "parallel/cuda/ep_moe_hook.h"

#include <algorithm>
#include <cstring>

#include "parallel/cuda/cuda_check.h"

namespace di::parallel::cuda {
RowDtype row_dtype(DType dtype) {
  DI_CHECK(dtype == DType::kBF16 || dtype == DType::kF32,
           "EpMoeHook: activations must be bf16 or f32, got {}", dtype_name(dtype));
  return dtype == DType::kBF16 ? RowDtype::kBfloat16 : RowDtype::kFloat32;
}

EpMoeHook::EpMoeHook(EpTransport& transport, int32_t num_experts, int32_t hidden, int32_t top_k,
                     DType dtype, cudaStream_t stream, int32_t max_latency_rows,
                     const PeerRank* peer)
    : placement_(contiguous_placement(num_experts, transport.num_ranks())),
      num_experts_(num_experts),
      hidden_(hidden),
      top_k_(top_k),
      dtype_(dtype),
      stream_(stream),
      moe_(transport, hidden, top_k, row_dtype(dtype), stream) {
  if (max_latency_rows > 0) {
    // contiguous_placement: rank r owns [r * spr, min(E, (r + 1) * spr)).
    const int32_t n = transport.num_ranks(), r = transport.rank_idx();
    const int32_t spr = (num_experts + n - 1) / n;
    latency_ = std::make_unique<EpMoeLatency>(
        transport, hidden, top_k, row_dtype(dtype), std::min(num_experts, r * spr),
        std::min(num_experts, (r + 1) * spr), max_latency_rows, stream, peer);
  }
}

void EpMoeHook::set_latency_rows(int32_t rows_per_rank) {
  DI_CHECK(rows_per_rank >= 0, "EpMoeHook: {} latency rows", rows_per_rank);
  DI_CHECK(rows_per_rank == 0 || (latency_ && rows_per_rank <= latency_->max_rows_per_rank()),
           "EpMoeHook: {} latency rows per rank, the exchange was sized for {}", rows_per_rank,
           latency_ ? latency_->max_rows_per_rank() : 0);
  latency_rows_ = rows_per_rank;
}

void EpMoeHook::run(Backend& be, const Tensor& x, const Tensor& topk_ids,
                    const Tensor& topk_weights, const ExpertWeights& experts, Tensor& out) {
  const int64_t t = x.size(0);
  DI_CHECK(x.device() == Device::kCUDA && out.device() == Device::kCUDA,
           "EpMoeHook: x and out must be on the GPU");
  DI_CHECK(x.dtype() == dtype_ && out.dtype() == dtype_ && x.dim() == 2 && x.size(1) == hidden_ &&
               out.numel() == x.numel(),
           "EpMoeHook: x {} / out {} vs hidden {} {}", x.describe(), out.describe(), hidden_,
           dtype_name(dtype_));
  DI_CHECK(topk_ids.dtype() == DType::kI32 && topk_ids.numel() == t * top_k_ &&
               topk_weights.dtype() == DType::kF32 && topk_weights.numel() == t * top_k_,
           "EpMoeHook: topk_ids {} / topk_weights {} vs {} tokens x top_k {}", topk_ids.describe(),
           topk_weights.describe(), t, top_k_);
  DI_CHECK(experts.gate_up.size(0) == num_experts_,
           "EpMoeHook: the layer has {} experts, the placement {}", experts.gate_up.size(0),
           num_experts_);

  if (latency_rows_ > 0) {
    DI_CHECK(t <= latency_rows_, "EpMoeHook: {} tokens in a latency step of {} rows per rank", t,
             latency_rows_);
    // Decode: fixed sizes on the device only (graph-capturable); this rank's experts over every
    // rank's rows, then the partial sums go back to their tokens' ranks.
    latency_->dispatch(x.raw(), topk_ids.data<const int32_t>(), topk_weights.data<const float>(),
                       static_cast<int32_t>(t), latency_rows_);
    const int64_t m = latency_->num_rows();
    const Tensor x_all =
        Tensor::view_of(latency_->x_all(), {m, hidden_}, dtype_, nullptr, Device::kCUDA);
    const Tensor ids_all =
        Tensor::view_of(latency_->owned_ids(), {m, top_k_}, DType::kI32, nullptr, Device::kCUDA);
    const Tensor w_all =
        Tensor::view_of(latency_->weights_all(), {m, top_k_}, DType::kF32, nullptr, Device::kCUDA);
    Tensor partial =
        Tensor::view_of(latency_->partial(), {m, hidden_}, dtype_, nullptr, Device::kCUDA);
    be.moe_experts(x_all, ids_all, w_all, experts, partial);
    latency_->combine(out.raw(), static_cast<int32_t>(t));
    ++totals_.calls;
    ++totals_.latency_calls;
    totals_.tokens += t;
    totals_.rows_sent += latency_rows_;
    totals_.dispatch_bytes += latency_->dispatch_bytes();
    totals_.combine_bytes += latency_->combine_bytes();
    return;
  }

  // The dispatch plan is built on the host: bring this rank's routing back (sync).
  ids_host_.assign(static_cast<size_t>(t * top_k_), 0);
  if (t > 0) {
    CUDA_CHECK(cudaMemcpyAsync(ids_host_.data(), topk_ids.raw(), ids_host_.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (int32_t e : ids_host_) {
      DI_CHECK(e >= 0 && e < num_experts_, "EpMoeHook: routed expert id {} outside [0, {})", e,
               num_experts_);
    }
  }

  // The experts of this rank over every row it received: one moe_experts call with top-1,
  // weight 1 (out_row = 1 * expert(row), rounded once to the compute dtype).
  const GroupedExpertFn grouped = [&](const void* in, void* expert_out,
                                      std::span<const int32_t> row_expert, cudaStream_t) {
    const auto m = static_cast<int64_t>(row_expert.size());
    Tensor ids_h = Tensor::empty({m, 1}, DType::kI32);
    std::memcpy(ids_h.raw(), row_expert.data(), row_expert.size_bytes());
    Tensor ones_h = Tensor::empty({m, 1}, DType::kF32);
    std::fill_n(ones_h.data<float>(), m, 1.0f);
    const Tensor ids_d = be.upload(ids_h, DType::kI32);
    const Tensor ones_d = be.upload(ones_h, DType::kF32);
    const Tensor in_t =
        Tensor::view_of(const_cast<void*>(in), {m, hidden_}, dtype_, nullptr, Device::kCUDA);
    Tensor out_t = Tensor::view_of(expert_out, {m, hidden_}, dtype_, nullptr, Device::kCUDA);
    be.moe_experts(in_t, ids_d, ones_d, experts, out_t);
  };

  EpMoeInput input;
  input.x = x.raw();
  input.topk_ids = ids_host_;
  input.topk_weights = topk_weights.data<const float>();
  input.num_tokens = static_cast<int32_t>(t);
  const EpMoeStats stats = moe_.forward(placement_, input, grouped, out.raw());

  ++totals_.calls;
  totals_.tokens += t;
  totals_.rows_sent += stats.num_send_rows;
  totals_.rows_computed += stats.num_entries;
  totals_.dispatch_bytes += stats.dispatch_bytes;
  totals_.combine_bytes += stats.combine_bytes;
}

void attach_expert_hook(std::span<MoeBlock* const> blocks, MoeExpertHook* hook) {
  for (MoeBlock* b : blocks) {
    DI_CHECK(b != nullptr, "attach_expert_hook: null block");
    b->expert_hook = hook;
  }
}

}  // namespace di::parallel::cuda
