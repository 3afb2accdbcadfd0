#include "scheduler/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace di {

ScheduleResult schedule(const Queues& queues, const KvBudget& budget_in, const Limits& limits) {
  DI_CHECK(limits.max_num_batched_tokens > 0 && limits.max_num_seqs > 0,
           "limits must be positive: {} tokens, {} sequences", limits.max_num_batched_tokens,
           limits.max_num_seqs);
  KvBudget kv = budget_in;
  const KvCacheManager& manager = budget_in.kv();
  ScheduleResult r;
  int32_t tokens_left = limits.max_num_batched_tokens;

  std::vector<const Sequence*> order;
  order.reserve(queues.running.size());
  for (SeqId id : queues.running) order.push_back(&queues.seq(id));
  std::sort(order.begin(), order.end(),
            [](const Sequence* a, const Sequence* b) { return more_urgent(*a, *b); });
  auto is_decode = [&](const Sequence& s) {
    return !s.output.empty() && manager.num_computed_tokens(s.seq_id) == s.num_tokens() - 1;
  };

  // 1. Decodes. Victims come from the least urgent end of `order`, so a victim has not been
  // scheduled yet, and `end` shrinks past it.
  size_t end = order.size();
  for (size_t i = 0; i < end && tokens_left > 0; ++i) {
    const Sequence& s = *order[i];
    if (!is_decode(s)) continue;
    while (!kv.can_allocate_slots(s.seq_id) && end > i) {
      const Sequence& victim = *order[--end];
      kv.free(victim.seq_id);
      r.preempted.push_back(victim.seq_id);
    }
    if (end == i) break;  // preempted itself
    kv.allocate_slots(s.seq_id);
    r.decodes.push_back({s.seq_id, s.num_tokens() - 1, 1, s.num_samples});
    --tokens_left;
  }

  // 2. Chunks of running prefills: their blocks were allocated at admission.
  int32_t num_running = 0;
  for (size_t i = 0; i < end; ++i) {
    const Sequence& s = *order[i];
    num_running += s.num_samples;
    if (is_decode(s) || tokens_left == 0) continue;
    int32_t start = manager.num_computed_tokens(s.seq_id);
    int32_t num = std::min(s.num_tokens() - start, tokens_left);
    if (num <= 0) continue;  // sampled token not appended yet: nothing to compute
    kv.allocate_slots(s.seq_id);
    bool last = start + num == s.num_tokens();
    r.prefills.push_back({s.seq_id, start, num, last ? s.num_samples : 0});
    tokens_left -= num;
  }

  // 3. Admissions, FCFS: the first waiting sequence that does not fit blocks those behind it.
  size_t num_admitted = 0;
  if (r.preempted.empty()) {
    for (SeqId id : queues.waiting) {
      const Sequence& s = queues.seq(id);
      if (tokens_left == 0 || num_running + s.num_samples > limits.max_num_seqs) break;
      PrefixMatch match = manager.match_prefix(s.block_hashes, s.num_tokens());
      if (!kv.can_admit(match, s.num_tokens())) break;
      kv.admit(match, s.num_tokens());
      int32_t num = std::min(s.num_tokens() - match.num_cached_tokens, tokens_left);
      bool last = match.num_cached_tokens + num == s.num_tokens();
      r.prefills.push_back({id, match.num_cached_tokens, num, last ? s.num_samples : 0});
      r.admitted.push_back(id);
      tokens_left -= num;
      num_running += s.num_samples;
      ++num_admitted;
    }
  }
  r.waiting.assign(queues.waiting.begin() + static_cast<ptrdiff_t>(num_admitted),
                   queues.waiting.end());
  r.num_batched_tokens = limits.max_num_batched_tokens - tokens_left;
  return r;
}

}  // namespace di
