#pragma once
// EpMoeHook: expert parallelism inside the model (issue #8). A MoeExpertHook (model/layers.h)
// that runs a MoE block's routed experts across the EP group instead of on this GPU alone:
//
//   each rank routes its own tokens (DP attention: its own requests, its own KV)
//   topk_ids -> host (sync) -> EpMoeCuda::forward over the NCCL transport:
//     dispatch rows to the rank owning each expert (contiguous_placement: rank r owns experts
//     [r * spr, (r + 1) * spr), spr = ceil(E / N)) -> the rank runs Backend::moe_experts ONCE on
//     all rows it received (top-1, weight 1, the row's expert) -> combine back in j order.
//
// Every rank keeps the full ExpertWeights loaded but only ever computes its own experts. Shared
// experts stay local (MoeBlock adds them after the hook).
//
// Two exchanges:
//   throughput (default; prefill and mixed steps): the above, two host syncs per layer in
//     EpMoeCuda plus one here (the ids), exact per-entry returns; eager only.
//   latency (set_latency_rows(B) > 0; decode steps of a DP group): EpMoeLatency
//     (ep_moe_latency.h): fixed B rows per rank, all-gather + moe_experts on this rank's
//     experts + fixed all-to-all + rank sum; no host sync, so the step can be a CUDA graph.
//     Every rank must use the same B in the same step (the group agrees on it per step).
// Lockstep: every rank must call every MoE layer the same number of times per step; a rank
// without tokens calls it with 0 rows. One hook serves every MoE layer of a model (the layers
// share E, H and top_k); calls are sequential on the backend's stream.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers.h"
#include "parallel/cuda/ep_moe_cuda.h"
#include "parallel/cuda/ep_moe_latency.h"
#include "parallel/ep_moe_plan.h"

namespace di::parallel::cuda {

// Totals over every call since construction (or reset_totals()).
struct EpHookTotals {
  int64_t calls = 0;
  int64_t tokens = 0;         // routed tokens of this rank
  int64_t rows_sent = 0;      // dispatch rows sent (incl. to itself)
  int64_t rows_computed = 0;  // expert rows this rank computed for the whole group
  int64_t dispatch_bytes = 0;
  int64_t combine_bytes = 0;
  int64_t latency_calls = 0;  // calls that took the latency exchange
};

class EpMoeHook final : public MoeExpertHook {
 public:
  // `transport` must outlive the hook; `stream` must be the backend's stream
  // (cuda::CudaBackend::stream()) so that the exchange is ordered with the model's kernels.
  // dtype: the backend's compute dtype (bf16, or f32 in the verification mode).
  // max_latency_rows > 0 allocates the latency exchange for up to that many tokens per rank.
  // peer (optional, with max_latency_rows): the latency exchange runs peer to peer
  // (peer_exchange.h) instead of over the transport.
  EpMoeHook(EpTransport& transport, int32_t num_experts, int32_t hidden, int32_t top_k, DType dtype,
            cudaStream_t stream, int32_t max_latency_rows = 0, const PeerRank* peer = nullptr);

  // B > 0: the following calls take the latency exchange with B rows per rank (each call's
  // tokens <= B); 0: the throughput exchange. Same B on every rank for the same step.
  void set_latency_rows(int32_t rows_per_rank);
  int32_t latency_rows() const { return latency_rows_; }

  void run(Backend& be, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
           const ExpertWeights& experts, Tensor& out) override;

  const ExpertPlacement& placement() const { return placement_; }
  const EpHookTotals& totals() const { return totals_; }
  void reset_totals() { totals_ = {}; }

 private:
  ExpertPlacement placement_;
  int32_t num_experts_;
  int32_t hidden_;
  int32_t top_k_;
  DType dtype_;
  cudaStream_t stream_;
  EpMoeCuda moe_;
  std::unique_ptr<EpMoeLatency> latency_;  // null without max_latency_rows
  int32_t latency_rows_ = 0;
  std::vector<int32_t> ids_host_;
  EpHookTotals totals_;
};

// The exchange's row type for a compute dtype (bf16 or f32; throws otherwise).
RowDtype row_dtype(DType dtype);

// Sets (or clears, with nullptr) the hook on every MoE block of `blocks`.
void attach_expert_hook(std::span<MoeBlock* const> blocks, MoeExpertHook* hook);

}  // namespace di::parallel::cuda
