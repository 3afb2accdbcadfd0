#pragma once
// KvBudget: a what-if view of a KvCacheManager, so that schedule() can plan a step as a pure
// function. It mirrors the manager's allocate_slots / free / admit block arithmetic without
// touching the manager; applying the same operations in the same order to the manager succeeds.
//
// Available blocks = free + evictable (unreferenced cached). Costs:
//   allocate_slots(seq)  new blocks to cover its tokens, +1 for copy-on-write of a shared last
//   block admit(match, n)      blocks for the uncached tokens + cached hits that are unreferenced
//   now
//                        (taking them removes them from the evictable set); each hit counted once
//   free(seq)            every block whose last reference it drops becomes available again
// Rule for callers: do not admit after freeing in the same plan (a freed block could be counted
// once as available and again as a referenced hit). Operate on each sequence at most once.
//
// Apply order that keeps the plan valid: free victims, admit (reference hits) for all admitted
// sequences, then allocate_slots in plan order. Referencing hits first keeps evictions from
// taking a block that a planned admission counts on.
#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "kv/kv_cache_manager.h"

namespace di {

class KvBudget {
 public:
  explicit KvBudget(const KvCacheManager& kv)
      : kv_(&kv), num_available_(kv.num_available_blocks()) {}

  const KvCacheManager& kv() const { return *kv_; }
  int32_t num_available_blocks() const { return num_available_; }

  int32_t num_blocks_to_allocate(SeqId seq) const;
  bool can_allocate_slots(SeqId seq) const { return num_blocks_to_allocate(seq) <= num_available_; }
  void allocate_slots(SeqId seq);

  void free(SeqId seq);

  int32_t num_blocks_to_admit(const PrefixMatch& match, int32_t num_tokens) const;
  bool can_admit(const PrefixMatch& match, int32_t num_tokens) const {
    return num_blocks_to_admit(match, num_tokens) <= num_available_;
  }
  void admit(const PrefixMatch& match, int32_t num_tokens);

 private:
  int32_t ref_count(BlockId block) const;  // the manager's, minus references dropped in this plan
  void touch(SeqId seq);

  const KvCacheManager* kv_;
  int32_t num_available_;
  std::unordered_map<BlockId, int32_t> num_dropped_;
  std::unordered_set<BlockId> revived_;
  std::unordered_set<SeqId> touched_;
  bool freed_any_ = false;
};

}  // namespace di
