#include "parallel/ep_exchange_ref.h"

#include <algorithm>

#include "core/error.h"

namespace di::parallel {
namespace {

void copy_row(std::span<const float> src, int64_t src_row, std::span<float> dst, int64_t dst_row,
              int32_t hidden) {
  std::copy_n(src.begin() + src_row * hidden, hidden, dst.begin() + dst_row * hidden);
}

// acc += w * row, element by element (the combine's only arithmetic).
void accumulate(std::span<float> acc, float w, std::span<const float> row) {
  for (size_t h = 0; h < acc.size(); ++h) acc[h] += w * row[h];
}

}  // namespace

std::vector<float> pack_send_rows(const DispatchPlan& plan, std::span<const float> x,
                                  int32_t hidden) {
  DI_CHECK(x.size() == static_cast<size_t>(plan.num_tokens) * hidden,
           "x has {} floats, expected {} tokens x {}", x.size(), plan.num_tokens, hidden);
  std::vector<float> out(static_cast<size_t>(plan.num_send_rows()) * hidden);
  for (int32_t row = 0; row < plan.num_send_rows(); ++row) {
    copy_row(x, plan.send_token_idx[row], out, row, hidden);
  }
  return out;
}

std::vector<float> expand_rows(const ReceivePlan& plan, std::span<const float> recv_rows,
                               int32_t hidden) {
  DI_CHECK(recv_rows.size() == static_cast<size_t>(plan.num_recv_rows()) * hidden,
           "received {} floats, expected {} rows x {}", recv_rows.size(), plan.num_recv_rows(),
           hidden);
  std::vector<float> out(static_cast<size_t>(plan.num_entries()) * hidden);
  for (int32_t m = 0; m < plan.num_entries(); ++m) {
    copy_row(recv_rows, plan.expand_src_row[m], out, m, hidden);
  }
  return out;
}

std::vector<float> pack_return_rows(const ReceivePlan& plan, std::span<const float> expert_out,
                                    int32_t hidden) {
  DI_CHECK(expert_out.size() == static_cast<size_t>(plan.num_entries()) * hidden,
           "expert output has {} floats, expected {} rows x {}", expert_out.size(),
           plan.num_entries(), hidden);
  std::vector<float> out(expert_out.size());
  for (int32_t i = 0; i < plan.num_entries(); ++i) {
    copy_row(expert_out, plan.return_src[i], out, i, hidden);
  }
  return out;
}

std::vector<float> combine_rows(const DispatchPlan& plan, std::span<const float> combine_buf,
                                std::span<const float> topk_weights, int32_t hidden) {
  const size_t num_entries = static_cast<size_t>(plan.num_tokens) * plan.top_k;
  DI_CHECK(topk_weights.size() == num_entries, "topk_weights has {} entries, expected {}",
           topk_weights.size(), num_entries);
  DI_CHECK(combine_buf.size() == static_cast<size_t>(plan.num_entries_sent()) * hidden,
           "combine buffer has {} floats, expected {} rows x {}", combine_buf.size(),
           plan.num_entries_sent(), hidden);
  std::vector<float> out(static_cast<size_t>(plan.num_tokens) * hidden, 0.0f);
  for (int32_t t = 0; t < plan.num_tokens; ++t) {
    std::span<float> acc(out.data() + static_cast<size_t>(t) * hidden, hidden);
    for (int32_t j = 0; j < plan.top_k; ++j) {
      const int32_t src = plan.entry_return_idx[t * plan.top_k + j];
      if (src < 0) continue;
      accumulate(acc, topk_weights[t * plan.top_k + j],
                 combine_buf.subspan(static_cast<size_t>(src) * hidden, hidden));
    }
  }
  return out;
}

std::vector<std::vector<float>> run_ep_moe_reference(const ExpertPlacement& placement,
                                                     std::span<const RankBatch> batches,
                                                     int32_t top_k, int32_t hidden,
                                                     const ExpertFn& expert, EpLayerTrace* trace) {
  const int32_t n = placement.num_ranks();
  const int32_t slots = placement.slots_per_rank();
  DI_CHECK(static_cast<int32_t>(batches.size()) == n, "{} batches for {} ranks", batches.size(), n);
  DI_CHECK(hidden > 0, "hidden {}", hidden);

  // Senders: plan and pack.
  std::vector<DispatchPlan> dispatch;
  std::vector<std::vector<float>> send(n);
  for (int32_t r = 0; r < n; ++r) {
    dispatch.push_back(plan_dispatch(placement, r, batches[r].topk_ids, top_k));
    send[r] = pack_send_rows(dispatch[r], batches[r].x, hidden);
  }

  // All-to-all #1: rank q receives, from each r in rank order, r's rows for q and their metadata.
  std::vector<ReceivePlan> receive;
  std::vector<std::vector<int32_t>> recv_meta(n);
  std::vector<std::vector<float>> expert_returns(n);
  for (int32_t q = 0; q < n; ++q) {
    std::vector<int32_t> indptr(n + 1, 0);
    std::vector<float> rows;
    for (int32_t r = 0; r < n; ++r) {
      const DispatchPlan& p = dispatch[r];
      indptr[r + 1] = indptr[r] + p.send_count(q);
      rows.insert(rows.end(), send[r].begin() + static_cast<int64_t>(p.send_indptr[q]) * hidden,
                  send[r].begin() + static_cast<int64_t>(p.send_indptr[q + 1]) * hidden);
      recv_meta[q].insert(
          recv_meta[q].end(),
          p.send_local_slot.begin() + static_cast<int64_t>(p.send_indptr[q]) * top_k,
          p.send_local_slot.begin() + static_cast<int64_t>(p.send_indptr[q + 1]) * top_k);
    }
    receive.push_back(plan_receive(q, n, slots, top_k, indptr, recv_meta[q]));
    const ReceivePlan& rp = receive.back();

    // Each local slot's block is contiguous: one expert call per slot (the grouped GEMM).
    std::vector<float> expanded = expand_rows(rp, rows, hidden);
    std::vector<float> out(expanded.size());
    for (int32_t s = 0; s < slots; ++s) {
      const int64_t begin = static_cast<int64_t>(rp.slot_indptr[s]) * hidden;
      const int64_t count =
          static_cast<int64_t>(rp.slot_indptr[s + 1] - rp.slot_indptr[s]) * hidden;
      if (count == 0) continue;
      const int32_t e = placement.expert_at(q * slots + s);
      DI_CHECK(e != kEmptySlot, "rank {} received rows for empty slot {}", q, s);
      expert(e, std::span<const float>(expanded).subspan(begin, count),
             std::span<float>(out).subspan(begin, count), hidden);
    }
    expert_returns[q] = pack_return_rows(rp, out, hidden);
  }

  // All-to-all #2: rank r receives, from each q in rank order, q's returns for r; then combines.
  std::vector<std::vector<float>> result(n);
  for (int32_t r = 0; r < n; ++r) {
    std::vector<float> combine_buf;
    for (int32_t q = 0; q < n; ++q) {
      const ReceivePlan& rp = receive[q];
      DI_CHECK(rp.return_indptr[r + 1] - rp.return_indptr[r] ==
                   dispatch[r].combine_indptr[q + 1] - dispatch[r].combine_indptr[q],
               "rank {} returns {} rows to rank {}, which expects {}", q,
               rp.return_indptr[r + 1] - rp.return_indptr[r], r,
               dispatch[r].combine_indptr[q + 1] - dispatch[r].combine_indptr[q]);
      combine_buf.insert(
          combine_buf.end(),
          expert_returns[q].begin() + static_cast<int64_t>(rp.return_indptr[r]) * hidden,
          expert_returns[q].begin() + static_cast<int64_t>(rp.return_indptr[r + 1]) * hidden);
    }
    result[r] = combine_rows(dispatch[r], combine_buf, batches[r].topk_weights, hidden);
  }
  if (trace != nullptr) {
    trace->dispatch = std::move(dispatch);
    trace->receive = std::move(receive);
    trace->recv_local_slot = std::move(recv_meta);
  }
  return result;
}

std::vector<float> run_moe_reference(const RankBatch& batch, int32_t top_k, int32_t hidden,
                                     const ExpertFn& expert) {
  DI_CHECK(top_k > 0 && hidden > 0 && batch.x.size() % hidden == 0, "top_k {} hidden {}", top_k,
           hidden);
  const size_t num_tokens = batch.x.size() / hidden;
  DI_CHECK(batch.topk_ids.size() == num_tokens * top_k &&
               batch.topk_weights.size() == num_tokens * top_k,
           "routing has {} ids / {} weights for {} tokens x {}", batch.topk_ids.size(),
           batch.topk_weights.size(), num_tokens, top_k);
  std::vector<float> out(batch.x.size(), 0.0f);
  std::vector<float> y(hidden);
  for (size_t t = 0; t < num_tokens; ++t) {
    std::span<const float> xt(batch.x.data() + t * hidden, hidden);
    std::span<float> acc(out.data() + t * hidden, hidden);
    for (int32_t j = 0; j < top_k; ++j) {
      const int32_t e = batch.topk_ids[t * top_k + j];
      if (e == kNoExpert) continue;
      expert(e, xt, y, hidden);
      accumulate(acc, batch.topk_weights[t * top_k + j], y);
    }
  }
  return out;
}

}  // namespace di::parallel
