#include "parallel/ep_layout.h"

#include <numeric>

#include "core/error.h"

namespace di::parallel {
namespace {

void check_indptr(std::span<const int32_t> indptr, size_t expected_size, const char* name) {
  DI_CHECK(indptr.size() == expected_size, "{} has {} entries, expected {}", name, indptr.size(),
           expected_size);
  DI_CHECK(indptr[0] == 0, "{}[0] = {}, expected 0", name, indptr[0]);
  for (size_t i = 1; i < indptr.size(); ++i) {
    DI_CHECK(indptr[i - 1] <= indptr[i], "{} decreases at {}: {} > {}", name, i, indptr[i - 1],
             indptr[i]);
  }
}

}  // namespace

DispatchPlan plan_dispatch(const ExpertPlacement& placement, int32_t rank_idx,
                           std::span<const int32_t> topk_ids, int32_t top_k) {
  const int32_t num_ranks = placement.num_ranks();
  const int32_t slots_per_rank = placement.slots_per_rank();
  DI_CHECK(rank_idx >= 0 && rank_idx < num_ranks, "rank {} outside [0, {})", rank_idx, num_ranks);
  DI_CHECK(top_k > 0 && topk_ids.size() % top_k == 0,
           "topk_ids has {} entries, not a multiple of top_k {}", topk_ids.size(), top_k);
  DispatchPlan plan;
  plan.rank_idx = rank_idx;
  plan.num_ranks = num_ranks;
  plan.slots_per_rank = slots_per_rank;
  plan.num_tokens = static_cast<int32_t>(topk_ids.size() / top_k);
  plan.top_k = top_k;
  const int32_t num_entries = static_cast<int32_t>(topk_ids.size());

  // 1. Replica choice, and per-rank entry counts.
  plan.entry_slot.assign(num_entries, kEmptySlot);
  std::vector<int32_t> next_replica(placement.num_experts(), 0);
  std::vector<int32_t> entries_per_rank(num_ranks, 0);
  std::vector<int32_t> rows_per_rank(num_ranks, 0);
  std::vector<int32_t> last_token(num_ranks, -1);
  for (int32_t t = 0; t < plan.num_tokens; ++t) {
    for (int32_t j = 0; j < top_k; ++j) {
      const int32_t e = topk_ids[t * top_k + j];
      if (e == kNoExpert) continue;
      DI_CHECK(e >= 0 && e < placement.num_experts(), "token {} entry {} routes to expert {} of {}",
               t, j, e, placement.num_experts());
      const std::span<const int32_t> reps = placement.replicas(e);
      const int32_t n = static_cast<int32_t>(reps.size());
      const int32_t slot = reps[(next_replica[e]++ + rank_idx) % n];
      plan.entry_slot[t * top_k + j] = slot;
      const int32_t q = placement.rank_of_slot(slot);
      ++entries_per_rank[q];
      if (last_token[q] != t) {
        last_token[q] = t;
        ++rows_per_rank[q];
      }
    }
  }

  // 2. Send rows grouped by destination, tokens ascending; combine offsets in (t, j) order.
  plan.send_indptr.assign(num_ranks + 1, 0);
  plan.combine_indptr.assign(num_ranks + 1, 0);
  for (int32_t q = 0; q < num_ranks; ++q) {
    plan.send_indptr[q + 1] = plan.send_indptr[q] + rows_per_rank[q];
    plan.combine_indptr[q + 1] = plan.combine_indptr[q] + entries_per_rank[q];
  }
  plan.send_token_idx.assign(plan.num_send_rows(), 0);
  plan.send_local_slot.assign(static_cast<size_t>(plan.num_send_rows()) * top_k, kEmptySlot);
  plan.entry_return_idx.assign(num_entries, -1);
  std::vector<int32_t> row_cursor(plan.send_indptr.begin(), plan.send_indptr.end() - 1);
  std::vector<int32_t> return_cursor(plan.combine_indptr.begin(), plan.combine_indptr.end() - 1);
  std::vector<int32_t> current_row(num_ranks, -1);
  last_token.assign(num_ranks, -1);
  for (int32_t t = 0; t < plan.num_tokens; ++t) {
    for (int32_t j = 0; j < top_k; ++j) {
      const int32_t slot = plan.entry_slot[t * top_k + j];
      if (slot == kEmptySlot) continue;
      const int32_t q = placement.rank_of_slot(slot);
      if (last_token[q] != t) {
        last_token[q] = t;
        current_row[q] = row_cursor[q]++;
        plan.send_token_idx[current_row[q]] = t;
      }
      plan.send_local_slot[static_cast<size_t>(current_row[q]) * top_k + j] =
          placement.local_slot(slot);
      plan.entry_return_idx[t * top_k + j] = return_cursor[q]++;
    }
  }
  return plan;
}

ReceivePlan plan_receive(int32_t rank_idx, int32_t num_ranks, int32_t slots_per_rank, int32_t top_k,
                         std::span<const int32_t> recv_indptr,
                         std::span<const int32_t> recv_local_slot) {
  DI_CHECK(num_ranks > 0 && rank_idx >= 0 && rank_idx < num_ranks, "rank {} of {}", rank_idx,
           num_ranks);
  DI_CHECK(slots_per_rank > 0 && top_k > 0, "slots_per_rank {} top_k {}", slots_per_rank, top_k);
  check_indptr(recv_indptr, num_ranks + 1, "recv_indptr");
  const int32_t num_rows = recv_indptr.back();
  DI_CHECK(recv_local_slot.size() == static_cast<size_t>(num_rows) * top_k,
           "recv_local_slot has {} entries, expected {} rows x top_k {}", recv_local_slot.size(),
           num_rows, top_k);
  ReceivePlan plan;
  plan.rank_idx = rank_idx;
  plan.num_ranks = num_ranks;
  plan.slots_per_rank = slots_per_rank;
  plan.top_k = top_k;
  plan.recv_indptr.assign(recv_indptr.begin(), recv_indptr.end());

  plan.slot_indptr.assign(slots_per_rank + 1, 0);
  plan.return_indptr.assign(num_ranks + 1, 0);
  for (int32_t r = 0; r < num_ranks; ++r) {
    int32_t served = 0;
    for (int32_t i = recv_indptr[r]; i < recv_indptr[r + 1]; ++i) {
      for (int32_t j = 0; j < top_k; ++j) {
        const int32_t s = recv_local_slot[static_cast<size_t>(i) * top_k + j];
        if (s == kEmptySlot) continue;
        DI_CHECK(s >= 0 && s < slots_per_rank, "row {} entry {} names local slot {} of {}", i, j, s,
                 slots_per_rank);
        ++plan.slot_indptr[s + 1];
        ++served;
      }
    }
    plan.return_indptr[r + 1] = plan.return_indptr[r] + served;
  }
  std::partial_sum(plan.slot_indptr.begin(), plan.slot_indptr.end(), plan.slot_indptr.begin());

  const int32_t num_entries = plan.slot_indptr.back();
  plan.expand_src_row.assign(num_entries, 0);
  plan.return_src.assign(num_entries, 0);
  std::vector<int32_t> cursor(plan.slot_indptr.begin(), plan.slot_indptr.end() - 1);
  int32_t ret = 0;
  for (int32_t i = 0; i < num_rows; ++i) {
    for (int32_t j = 0; j < top_k; ++j) {
      const int32_t s = recv_local_slot[static_cast<size_t>(i) * top_k + j];
      if (s == kEmptySlot) continue;
      const int32_t m = cursor[s]++;
      plan.expand_src_row[m] = i;
      plan.return_src[ret++] = m;
    }
  }
  return plan;
}

void add_slot_load(const DispatchPlan& plan, std::span<int64_t> slot_load) {
  DI_CHECK(slot_load.size() == static_cast<size_t>(plan.num_ranks) * plan.slots_per_rank,
           "slot_load has {} entries, expected {}", slot_load.size(),
           plan.num_ranks * plan.slots_per_rank);
  for (int32_t s : plan.entry_slot) {
    if (s != kEmptySlot) ++slot_load[s];
  }
}

void check_dispatch_plan(const DispatchPlan& plan, const ExpertPlacement& placement,
                         std::span<const int32_t> topk_ids) {
  const int32_t k = plan.top_k;
  const int32_t n = plan.num_ranks;
  DI_CHECK(n == placement.num_ranks() && plan.slots_per_rank == placement.slots_per_rank(),
           "plan for {} ranks x {} slots, placement {} x {}", n, plan.slots_per_rank,
           placement.num_ranks(), placement.slots_per_rank());
  DI_CHECK(topk_ids.size() == static_cast<size_t>(plan.num_tokens) * k &&
               plan.entry_slot.size() == topk_ids.size() &&
               plan.entry_return_idx.size() == topk_ids.size(),
           "plan sized for {} tokens x {}, routing has {} entries", plan.num_tokens, k,
           topk_ids.size());
  check_indptr(plan.send_indptr, n + 1, "send_indptr");
  check_indptr(plan.combine_indptr, n + 1, "combine_indptr");
  DI_CHECK(plan.send_token_idx.size() == static_cast<size_t>(plan.num_send_rows()) &&
               plan.send_local_slot.size() == static_cast<size_t>(plan.num_send_rows()) * k,
           "send arrays sized {} / {} for {} rows", plan.send_token_idx.size(),
           plan.send_local_slot.size(), plan.num_send_rows());

  // Every entry goes to a slot that holds its expert.
  std::vector<int32_t> entries(n, 0);
  std::vector<int32_t> rows(n, 0);
  for (int32_t t = 0; t < plan.num_tokens; ++t) {
    std::vector<bool> seen(n, false);
    for (int32_t j = 0; j < k; ++j) {
      const int32_t e = topk_ids[t * k + j];
      const int32_t s = plan.entry_slot[t * k + j];
      if (e == kNoExpert) {
        DI_CHECK(s == kEmptySlot && plan.entry_return_idx[t * k + j] == -1,
                 "token {} entry {} has no expert but slot {}", t, j, s);
        continue;
      }
      DI_CHECK(s >= 0 && s < placement.num_slots() && placement.expert_at(s) == e,
               "token {} entry {} routes to expert {} but goes to slot {} holding {}", t, j, e, s,
               s >= 0 && s < placement.num_slots() ? placement.expert_at(s) : kEmptySlot);
      const int32_t q = placement.rank_of_slot(s);
      ++entries[q];
      if (!seen[q]) ++rows[q];
      seen[q] = true;
    }
  }

  // Send rows: one per (token, rank) pair, tokens ascending per rank, metadata matches entry_slot.
  for (int32_t q = 0; q < n; ++q) {
    DI_CHECK(plan.send_count(q) == rows[q], "rank {} gets {} rows, expected {}", q,
             plan.send_count(q), rows[q]);
    DI_CHECK(plan.combine_indptr[q + 1] - plan.combine_indptr[q] == entries[q],
             "rank {} returns {} entries, expected {}", q,
             plan.combine_indptr[q + 1] - plan.combine_indptr[q], entries[q]);
    int32_t expected_return = plan.combine_indptr[q];
    for (int32_t row = plan.send_indptr[q]; row < plan.send_indptr[q + 1]; ++row) {
      const int32_t t = plan.send_token_idx[row];
      DI_CHECK(t >= 0 && t < plan.num_tokens, "send row {} carries token {}", row, t);
      DI_CHECK(row == plan.send_indptr[q] || plan.send_token_idx[row - 1] < t,
               "send rows to rank {} not in ascending token order at row {}", q, row);
      bool any = false;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t s = plan.entry_slot[t * k + j];
        const bool here = s != kEmptySlot && placement.rank_of_slot(s) == q;
        const int32_t meta = plan.send_local_slot[static_cast<size_t>(row) * k + j];
        DI_CHECK(meta == (here ? placement.local_slot(s) : kEmptySlot),
                 "send row {} entry {}: local slot {}, expected {}", row, j, meta,
                 here ? placement.local_slot(s) : kEmptySlot);
        if (here) {
          DI_CHECK(plan.entry_return_idx[t * k + j] == expected_return,
                   "token {} entry {} returns at {}, expected {}", t, j,
                   plan.entry_return_idx[t * k + j], expected_return);
          ++expected_return;
        }
        any = any || here;
      }
      DI_CHECK(any, "send row {} to rank {} serves no entry", row, q);
    }
  }
}

void check_receive_plan(const ReceivePlan& plan, std::span<const int32_t> recv_local_slot) {
  const int32_t k = plan.top_k;
  check_indptr(plan.recv_indptr, plan.num_ranks + 1, "recv_indptr");
  check_indptr(plan.slot_indptr, plan.slots_per_rank + 1, "slot_indptr");
  check_indptr(plan.return_indptr, plan.num_ranks + 1, "return_indptr");
  const int32_t m_total = plan.num_entries();
  DI_CHECK(plan.return_indptr.back() == m_total && plan.expand_src_row.size() == size_t(m_total) &&
               plan.return_src.size() == size_t(m_total),
           "receive plan sizes disagree: {} entries, {} returned", m_total,
           plan.return_indptr.back());
  // Walk the received rows in (row, j) order: return row i must read the expanded row that holds
  // this very entry, which must lie in its slot's block.
  std::vector<bool> used(m_total, false);
  int32_t ret = 0;
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    DI_CHECK(ret == plan.return_indptr[r], "returns to rank {} start at {}, expected {}", r,
             plan.return_indptr[r], ret);
    for (int32_t i = plan.recv_indptr[r]; i < plan.recv_indptr[r + 1]; ++i) {
      for (int32_t j = 0; j < k; ++j) {
        const int32_t s = recv_local_slot[static_cast<size_t>(i) * k + j];
        if (s == kEmptySlot) continue;
        const int32_t m = plan.return_src[ret];
        DI_CHECK(m >= plan.slot_indptr[s] && m < plan.slot_indptr[s + 1],
                 "return row {} reads expanded row {}, outside slot {}'s block", ret, m, s);
        DI_CHECK(plan.expand_src_row[m] == i, "expanded row {} gathers received row {}, not {}", m,
                 plan.expand_src_row[m], i);
        DI_CHECK(!used[m], "expanded row {} returned twice", m);
        used[m] = true;
        ++ret;
      }
    }
  }
  DI_CHECK(ret == m_total, "{} entries returned, {} expanded", ret, m_total);
  for (int32_t s = 0; s < plan.slots_per_rank; ++s) {
    for (int32_t m = plan.slot_indptr[s] + 1; m < plan.slot_indptr[s + 1]; ++m) {
      DI_CHECK(plan.expand_src_row[m - 1] <= plan.expand_src_row[m],
               "slot {} block not in received-row order at {}", s, m);
    }
  }
}

}  // namespace di::parallel
