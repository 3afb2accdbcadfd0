#pragma once
// Queues: every unfinished sequence, and which queue it is in. Owned by the Scheduler; read by
// schedule(). A finished sequence leaves `seqs` in the same update that reports it.
#include <deque>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "scheduler/sequence.h"

namespace di {

struct Queues {
  std::unordered_map<SeqId, Sequence> seqs;
  std::deque<SeqId> waiting;   // sorted by more_urgent(): the head is admitted first
  std::vector<SeqId> running;  // admission order; schedule() sorts by urgency itself

  const Sequence& seq(SeqId id) const;
  Sequence& seq(SeqId id);
  // Inserts at the position more_urgent() gives. A preempted sequence keeps its arrival, so it
  // goes back in front of everything that arrived after it.
  void push_waiting(SeqId id);

  // Every sequence is in exactly one queue with a matching status; `waiting` is sorted; waiting
  // sequences hold no KV and their hash chains match their tokens; running sequences are in the
  // KV manager with the same tokens, and hold blocks for every computed token.
  void check_integrity(const KvCacheManager& kv) const;
};

}  // namespace di
