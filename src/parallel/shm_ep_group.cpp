#include "parallel/shm_ep_group.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "core/error.h"
#include "parallel/ep_exchange_ref.h"
#include "parallel/ep_moe_plan.h"

namespace di::parallel {

class ShmEpGroup::RankHook final : public MoeExpertHook {
 public:
  RankHook(ShmEpGroup& group, int32_t rank_idx) : group_(group), rank_idx_(rank_idx) {}
  void run(Backend& be, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
           const ExpertWeights& experts, Tensor& out) override {
    group_.run(rank_idx_, be, x, topk_ids, topk_weights, experts, out);
  }

 private:
  ShmEpGroup& group_;
  const int32_t rank_idx_;
};

ShmEpGroup::ShmEpGroup(int32_t num_ranks, int32_t num_experts, int32_t top_k, int32_t hidden)
    : num_ranks_(num_ranks),
      num_experts_(num_experts),
      top_k_(top_k),
      hidden_(hidden),
      placement_(contiguous_placement(num_experts, num_ranks)),
      slots_(static_cast<size_t>(num_ranks)),
      totals_(static_cast<size_t>(num_ranks)) {
  DI_CHECK(top_k > 0 && hidden > 0, "ShmEpGroup: top_k {} hidden {}", top_k, hidden);
  for (int32_t r = 0; r < num_ranks; ++r) hooks_.push_back(std::make_unique<RankHook>(*this, r));
}

ShmEpGroup::~ShmEpGroup() = default;

MoeExpertHook& ShmEpGroup::hook(int32_t rank_idx) {
  DI_CHECK(rank_idx >= 0 && rank_idx < num_ranks_, "ShmEpGroup: rank {} of {}", rank_idx,
           num_ranks_);
  return *hooks_[static_cast<size_t>(rank_idx)];
}

ShmEpTotals ShmEpGroup::totals(int32_t rank_idx) const {
  std::lock_guard lock(mu_);
  return totals_.at(static_cast<size_t>(rank_idx));
}

void ShmEpGroup::abort(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv_.notify_all();
}

void ShmEpGroup::reset() {
  std::lock_guard lock(mu_);
  aborted_ = false;
  abort_reason_.clear();
  arrived_ = 0;  // ranks that arrived before the abort have left with an exception
  ++generation_;
}

void ShmEpGroup::rendezvous() {
  std::unique_lock lock(mu_);
  DI_CHECK(!aborted_, "EP exchange aborted: {}", abort_reason_);
  const uint64_t gen = generation_;
  if (++arrived_ == num_ranks_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  DI_CHECK(generation_ != gen, "EP exchange aborted: {}", abort_reason_);
}

void ShmEpGroup::run(int32_t rank_idx, Backend& be, const Tensor& x, const Tensor& topk_ids,
                     const Tensor& topk_weights, const ExpertWeights& experts, Tensor& out) {
  const int64_t t = x.dim() == 2 ? x.size(0) : -1;
  const int32_t h = hidden_, k = top_k_;
  DI_CHECK(x.device() == Device::kCPU && out.device() == Device::kCPU &&
               topk_ids.device() == Device::kCPU && topk_weights.device() == Device::kCPU,
           "ShmEpGroup: host tensors only (the CPU backend), got x {} out {}", x.describe(),
           out.describe());
  DI_CHECK(x.dtype() == DType::kF32 && out.dtype() == DType::kF32 && t >= 0 && x.size(1) == h &&
               out.numel() == x.numel(),
           "ShmEpGroup: x {} / out {} vs hidden {} f32", x.describe(), out.describe(), h);
  DI_CHECK(topk_ids.dtype() == DType::kI32 && topk_ids.numel() == t * k &&
               topk_weights.dtype() == DType::kF32 && topk_weights.numel() == t * k,
           "ShmEpGroup: topk_ids {} / topk_weights {} vs {} tokens x top_k {}", topk_ids.describe(),
           topk_weights.describe(), t, k);
  DI_CHECK(experts.gate_up.size(0) == num_experts_,
           "ShmEpGroup: the layer has {} experts, the placement {}", experts.gate_up.size(0),
           num_experts_);
  const std::span<const int32_t> ids(topk_ids.data<int32_t>(), static_cast<size_t>(t * k));
  for (int32_t e : ids) {
    DI_CHECK(e == kNoExpert || (e >= 0 && e < num_experts_),
             "ShmEpGroup: routed expert id {} outside [0, {})", e, num_experts_);
  }
  const std::span<const float> xs(x.f32(), static_cast<size_t>(t * h));

  // Sender: plan and pack this rank's rows.
  Slot& mine = slots_[static_cast<size_t>(rank_idx)];
  mine.plan = plan_dispatch(placement_, rank_idx, ids, k);
  mine.send_rows = pack_send_rows(mine.plan, xs, h);
  rendezvous();

  // Receiver: rows for this rank from every sender in rank order (all-to-all #1), then this
  // rank's experts over all of them in one moe_experts call.
  std::vector<int32_t> recv_indptr(static_cast<size_t>(num_ranks_) + 1, 0);
  std::vector<float> recv_rows;
  std::vector<int32_t> recv_meta;
  for (int32_t r = 0; r < num_ranks_; ++r) {
    const Slot& s = slots_[static_cast<size_t>(r)];
    const int64_t begin = s.plan.send_indptr[rank_idx], end = s.plan.send_indptr[rank_idx + 1];
    recv_indptr[r + 1] = recv_indptr[r] + static_cast<int32_t>(end - begin);
    recv_rows.insert(recv_rows.end(), s.send_rows.begin() + begin * h,
                     s.send_rows.begin() + end * h);
    recv_meta.insert(recv_meta.end(), s.plan.send_local_slot.begin() + begin * k,
                     s.plan.send_local_slot.begin() + end * k);
  }
  const ReceivePlan rp =
      plan_receive(rank_idx, num_ranks_, placement_.slots_per_rank(), k, recv_indptr, recv_meta);
  std::vector<float> expanded = expand_rows(rp, recv_rows, h);
  const std::vector<int32_t> row_expert =
      expanded_row_experts(placement_, rank_idx, rp.slot_indptr);
  const int64_t m = rp.num_entries();
  std::vector<float> expert_out(static_cast<size_t>(m) * h);
  if (m > 0) {
    const Tensor in_t =
        Tensor::view_of(expanded.data(), {m, h}, DType::kF32, nullptr, Device::kCPU);
    Tensor out_t = Tensor::view_of(expert_out.data(), {m, h}, DType::kF32, nullptr, Device::kCPU);
    Tensor ids_t = Tensor::empty({m, 1}, DType::kI32);
    std::copy(row_expert.begin(), row_expert.end(), ids_t.data<int32_t>());
    Tensor ones = Tensor::empty({m, 1}, DType::kF32);
    std::fill_n(ones.f32(), m, 1.0f);
    be.moe_experts(in_t, ids_t, ones, experts, out_t);
  }
  mine.returns = pack_return_rows(rp, expert_out, h);
  mine.return_indptr = rp.return_indptr;
  rendezvous();

  // Sender again: this rank's returned rows from every server in rank order (all-to-all #2),
  // then the combine in j order.
  std::vector<float> combine_buf;
  combine_buf.reserve(static_cast<size_t>(mine.plan.num_entries_sent()) * h);
  for (int32_t q = 0; q < num_ranks_; ++q) {
    const Slot& s = slots_[static_cast<size_t>(q)];
    const int64_t begin = s.return_indptr[rank_idx], end = s.return_indptr[rank_idx + 1];
    DI_CHECK(end - begin == mine.plan.combine_indptr[q + 1] - mine.plan.combine_indptr[q],
             "ShmEpGroup: rank {} returns {} rows to rank {}, which expects {}", q, end - begin,
             rank_idx, mine.plan.combine_indptr[q + 1] - mine.plan.combine_indptr[q]);
    combine_buf.insert(combine_buf.end(), s.returns.begin() + begin * h,
                       s.returns.begin() + end * h);
  }
  const std::vector<float> result =
      combine_rows(mine.plan, combine_buf,
                   std::span<const float>(topk_weights.f32(), static_cast<size_t>(t * k)), h);
  std::copy(result.begin(), result.end(), out.f32());

  std::lock_guard lock(mu_);
  ShmEpTotals& tot = totals_[static_cast<size_t>(rank_idx)];
  ++tot.calls;
  tot.tokens += t;
  tot.rows_sent += mine.plan.num_send_rows();
  tot.rows_computed += m;
}

}  // namespace di::parallel
