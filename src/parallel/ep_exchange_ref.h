#pragma once
// Host reference of the data movement of an EP MoE layer (ep_layout.h), in fp32, for N simulated
// ranks in one process. The NCCL/CUDA implementation must match it bit for bit given the same
// expert outputs: every step is a pure gather, and the combine sums in the single-device order.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "parallel/ep_layout.h"
#include "parallel/expert_placement.h"

namespace di::parallel {

// One rank's input to the layer (its DP-attention tokens).
struct RankBatch {
  std::vector<float> x;             // [num_tokens, hidden]
  std::vector<int32_t> topk_ids;    // [num_tokens, top_k] logical experts or kNoExpert
  std::vector<float> topk_weights;  // [num_tokens, top_k]
};

// Applies logical expert `expert_idx` to rows: in, out [num_rows, hidden]. Must treat rows
// independently (as a batch-invariant GEMM does).
using ExpertFn = std::function<void(int32_t expert_idx, std::span<const float> in,
                                    std::span<float> out, int32_t hidden)>;

// Steps, each a gather (rows are `hidden` floats):
// sender: send rows [num_send_rows, hidden] from x [num_tokens, hidden].
std::vector<float> pack_send_rows(const DispatchPlan& plan, std::span<const float> x,
                                  int32_t hidden);
// receiver: expanded rows [num_entries, hidden] from received rows [num_recv_rows, hidden].
std::vector<float> expand_rows(const ReceivePlan& plan, std::span<const float> recv_rows,
                               int32_t hidden);
// receiver: return rows [num_entries, hidden] from expert outputs in expanded order.
std::vector<float> pack_return_rows(const ReceivePlan& plan, std::span<const float> expert_out,
                                    int32_t hidden);
// sender: out[t] = sum_j w[t, j] * combine_buf[entry_return_idx[t, j]], j ascending from 0.0f.
std::vector<float> combine_rows(const DispatchPlan& plan, std::span<const float> combine_buf,
                                std::span<const float> topk_weights, int32_t hidden);

// What the layer's exchange looked like, for tests and statistics.
struct EpLayerTrace {
  std::vector<DispatchPlan> dispatch;                 // [num_ranks]
  std::vector<ReceivePlan> receive;                   // [num_ranks]
  std::vector<std::vector<int32_t>> recv_local_slot;  // [num_ranks] metadata each rank received
};

// The whole layer on num_ranks = placement.num_ranks() simulated ranks: plan, all-to-all rows and
// metadata, expand, run each local slot's expert on its contiguous block, return, combine.
// Returns each rank's output [num_tokens, hidden].
std::vector<std::vector<float>> run_ep_moe_reference(const ExpertPlacement& placement,
                                                     std::span<const RankBatch> batches,
                                                     int32_t top_k, int32_t hidden,
                                                     const ExpertFn& expert,
                                                     EpLayerTrace* trace = nullptr);

// Single-device MoE over one batch: out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t]), j ascending.
std::vector<float> run_moe_reference(const RankBatch& batch, int32_t top_k, int32_t hidden,
                                     const ExpertFn& expert);

}  // namespace di::parallel
