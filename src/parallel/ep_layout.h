#pragma once
// Dispatch layout of one MoE layer under expert parallelism (EP) with DP attention.
//
// Every rank of the EP group runs attention on its own tokens (DP attention), routes them (top-k
// logical experts per token) and then exchanges them with the ranks that hold those experts:
//
//   sender r                      all-to-all #1 (rows)          receiver q
//   x [T, H] --pack send rows-->  rows to q  ---------------->  rows from every r, by source rank
//   (one row per (token, rank))   + send_local_slot per row     --expand--> per-local-slot blocks
//                                                                grouped GEMM (one block per slot)
//   out[t] = sum_j w[t,j] y[t,j] <--- all-to-all #2 (entries) <-- one row per served (token, j)
//
// A token goes once to each rank that serves any of its k entries (it is expanded there), and one
// output row per entry comes back. The sender reduces the k outputs of a token in j order, the same
// order as a single-GPU MoE, so the result is bit-identical for any EP size and any placement.
// (Reducing on the receiver first would save combine bandwidth but make the sum depend on the
// placement; see docs/expert_parallelism.md.)
//
// Plans are plain int32 arrays with offsets so a kernel can take them as device buffers: the
// sender's plan needs only its own routing and the placement; the receiver's plan needs only the
// counts and per-row slot metadata it received.
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/expert_placement.h"

namespace di::parallel {

// Marks an unused entry: a topk id of kNoExpert (padding token, dropped entry) is not sent and
// contributes nothing to the combine.
inline constexpr int32_t kNoExpert = -1;

// Sender side: the plan of rank `rank_idx` for its own num_tokens tokens.
struct DispatchPlan {
  int32_t rank_idx = 0;
  int32_t num_ranks = 0;
  int32_t slots_per_rank = 0;
  int32_t num_tokens = 0;
  int32_t top_k = 0;

  // [num_tokens * top_k] physical slot serving entry (t, j), or kEmptySlot for a kNoExpert entry.
  std::vector<int32_t> entry_slot;

  // Send buffer: one row per (token, destination rank) pair, grouped by destination rank
  // (ascending), tokens ascending within a group. Rows for rank q are [send_indptr[q],
  // send_indptr[q + 1]).
  std::vector<int32_t> send_indptr;     // [num_ranks + 1]
  std::vector<int32_t> send_token_idx;  // [num_send_rows] local token copied into each row
  // [num_send_rows * top_k] travels with its row: for entry j of the row's token, the local slot on
  // the destination rank that serves it, or kEmptySlot when entry j is served elsewhere.
  std::vector<int32_t> send_local_slot;

  // Combine: rank q returns one row per entry it served, in (received row, j) order; the returns of
  // all ranks concatenated by rank form the combine buffer.
  std::vector<int32_t> combine_indptr;    // [num_ranks + 1] entries served by each rank
  std::vector<int32_t> entry_return_idx;  // [num_tokens * top_k] combine-buffer row, or -1

  int32_t num_send_rows() const { return send_indptr.empty() ? 0 : send_indptr.back(); }
  int32_t num_entries_sent() const { return combine_indptr.empty() ? 0 : combine_indptr.back(); }
  int32_t send_count(int32_t rank) const { return send_indptr[rank + 1] - send_indptr[rank]; }
};

// Receiver side: the plan of rank `rank_idx` for the rows it received from every rank.
struct ReceivePlan {
  int32_t rank_idx = 0;
  int32_t num_ranks = 0;
  int32_t slots_per_rank = 0;
  int32_t top_k = 0;

  std::vector<int32_t> recv_indptr;  // [num_ranks + 1] received rows, concatenated by source rank

  // Expanded layout, the grouped GEMM's input: one row per served entry, contiguous per local slot
  // (slot ascending), received-row order within a slot.
  std::vector<int32_t> slot_indptr;     // [slots_per_rank + 1]
  std::vector<int32_t> expand_src_row;  // [num_entries] received row gathered into expanded row m

  // Return buffer: one row per served entry in (received row, j) order, hence grouped by source.
  std::vector<int32_t> return_indptr;  // [num_ranks + 1] rows returned to each source rank
  std::vector<int32_t> return_src;     // [num_entries] expanded row whose output fills return row i

  int32_t num_recv_rows() const { return recv_indptr.empty() ? 0 : recv_indptr.back(); }
  int32_t num_entries() const { return slot_indptr.empty() ? 0 : slot_indptr.back(); }
};

// Chooses the replica for every entry and builds the sender's plan. topk_ids is [num_tokens, top_k]
// logical expert ids (or kNoExpert). Entries of an expert with n replicas are spread round-robin in
// (t, j) order, starting at replica rank_idx % n, so each replica gets floor or ceil of 1/n of this
// rank's entries and the remainders of different senders land on different replicas.
DispatchPlan plan_dispatch(const ExpertPlacement& placement, int32_t rank_idx,
                           std::span<const int32_t> topk_ids, int32_t top_k);

// Builds the receiver's plan from what the exchange delivered: recv_indptr (per-source row counts,
// prefix-summed) and recv_local_slot [num_recv_rows * top_k] (the senders' send_local_slot rows).
ReceivePlan plan_receive(int32_t rank_idx, int32_t num_ranks, int32_t slots_per_rank, int32_t top_k,
                         std::span<const int32_t> recv_indptr,
                         std::span<const int32_t> recv_local_slot);

// Tokens (entries) each physical slot serves under this plan, added into slot_load [num_slots].
void add_slot_load(const DispatchPlan& plan, std::span<int64_t> slot_load);

// Recomputes the plan's derived arrays from entry_slot and checks them; also that every entry's
// slot holds its expert (topk_ids) in `placement`.
void check_dispatch_plan(const DispatchPlan& plan, const ExpertPlacement& placement,
                         std::span<const int32_t> topk_ids);
void check_receive_plan(const ReceivePlan& plan, std::span<const int32_t> recv_local_slot);

}  // namespace di::parallel
