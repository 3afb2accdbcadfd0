#include "scheduler/queues.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"

namespace di {

const Sequence& Queues::seq(SeqId id) const {
  auto it = seqs.find(id);
  DI_CHECK(it != seqs.end(), "unknown sequence {}", id.value());
  return it->second;
}

Sequence& Queues::seq(SeqId id) {
  auto it = seqs.find(id);
  DI_CHECK(it != seqs.end(), "unknown sequence {}", id.value());
  return it->second;
}

void Queues::push_waiting(SeqId id) {
  auto pos = std::upper_bound(waiting.begin(), waiting.end(), id,
                              [&](SeqId a, SeqId b) { return more_urgent(seq(a), seq(b)); });
  waiting.insert(pos, id);
}

void Queues::check_integrity(const KvCacheManager& kv) const {
  std::unordered_set<SeqId> seen;
  for (size_t i = 0; i < waiting.size(); ++i) {
    SeqId id = waiting[i];
    DI_CHECK(seen.insert(id).second, "sequence {} is queued twice", id.value());
    const Sequence& s = seq(id);
    DI_CHECK(s.status == SeqStatus::kWaiting || s.status == SeqStatus::kPreempted,
             "sequence {} is in the waiting queue with status {}", id.value(),
             seq_status_name(s.status));
    DI_CHECK(i == 0 || !more_urgent(s, seq(waiting[i - 1])),
             "waiting queue is out of order at sequence {}", id.value());
    DI_CHECK(!kv.contains(id), "waiting sequence {} holds KV state", id.value());
    DI_CHECK(s.block_hashes == kv.hash_tokens(s.tokens(), s.params->cache_salt),
             "waiting sequence {}: stale hash chain", id.value());
  }
  for (SeqId id : running) {
    DI_CHECK(seen.insert(id).second, "sequence {} is queued twice", id.value());
    const Sequence& s = seq(id);
    DI_CHECK(s.status == SeqStatus::kRunning, "sequence {} is running with status {}", id.value(),
             seq_status_name(s.status));
    DI_CHECK(kv.contains(id), "running sequence {} has no KV state", id.value());
    std::span<const TokenId> kv_tokens = kv.tokens(id);
    std::vector<TokenId> tokens = s.tokens();
    DI_CHECK(std::equal(kv_tokens.begin(), kv_tokens.end(), tokens.begin(), tokens.end()),
             "running sequence {}: KV manager holds other tokens", id.value());
    DI_CHECK(static_cast<int64_t>(kv.block_table(id).size()) * kv.block_size() >=
                 kv.num_computed_tokens(id),
             "running sequence {}: computed tokens without blocks", id.value());
  }
  for (const auto& [id, s] : seqs) {
    DI_CHECK(seen.contains(id), "sequence {} is in no queue", id.value());
    DI_CHECK(s.seq_id == id, "sequence stored under id {} says {}", id.value(), s.seq_id.value());
    DI_CHECK(s.num_output_tokens() < s.params->max_tokens,
             "unfinished sequence {} has {} of {} "
             "tokens",
             id.value(), s.num_output_tokens(), s.params->max_tokens);
  }
  DI_CHECK(seen.size() == seqs.size(), "{} queued ids for {} sequences", seen.size(), seqs.size());
  DI_CHECK(kv.num_seqs() == static_cast<int32_t>(running.size()),
           "KV manager has {} sequences, {} running", kv.num_seqs(), running.size());
}

}  // namespace di
