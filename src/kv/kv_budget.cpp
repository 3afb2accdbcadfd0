#include "kv/kv_budget.h"

#include <algorithm>

#include "core/error.h"

namespace di {

int32_t KvBudget::ref_count(BlockId block) const {
  auto it = num_dropped_.find(block);
  return kv_->ref_count(block) - (it == num_dropped_.end() ? 0 : it->second);
}

void KvBudget::touch(SeqId seq) {
  DI_CHECK(touched_.insert(seq).second, "sequence {} planned twice in one step", seq.value());
}

int32_t KvBudget::num_blocks_to_allocate(SeqId seq) const {
  const BlockTable& blocks = kv_->block_table(seq);
  const int32_t bs = kv_->block_size();
  int32_t num_tokens = kv_->num_tokens(seq);
  int32_t num_computed = kv_->num_computed_tokens(seq);
  int32_t num_new =
      std::max(num_blocks_for(num_tokens, bs) - static_cast<int32_t>(blocks.size()), 0);
  // Same rule as KvCacheManager::needs_copy_on_write, on planned ref counts.
  size_t idx = static_cast<size_t>(num_computed / bs);
  bool copy = num_computed < num_tokens && num_computed % bs != 0 && idx < blocks.size() &&
              ref_count(blocks[idx]) > 1;
  return num_new + (copy ? 1 : 0);
}

void KvBudget::allocate_slots(SeqId seq) {
  int32_t num = num_blocks_to_allocate(seq);
  DI_CHECK(num <= num_available_, "plan: sequence {} needs {} blocks, {} available", seq.value(),
           num, num_available_);
  touch(seq);
  const BlockTable& blocks = kv_->block_table(seq);
  int32_t num_computed = kv_->num_computed_tokens(seq);
  size_t idx = static_cast<size_t>(num_computed / kv_->block_size());
  if (num_computed % kv_->block_size() != 0 && idx < blocks.size() && ref_count(blocks[idx]) > 1 &&
      num_computed < kv_->num_tokens(seq)) {
    ++num_dropped_[blocks[idx]];  // the copy leaves the shared block to its other holders
  }
  num_available_ -= num;
}

void KvBudget::free(SeqId seq) {
  touch(seq);
  freed_any_ = true;
  for (BlockId b : kv_->block_table(seq)) {
    if (ref_count(b) == 1) ++num_available_;
    ++num_dropped_[b];
  }
}

int32_t KvBudget::num_blocks_to_admit(const PrefixMatch& match, int32_t num_tokens) const {
  int32_t num =
      num_blocks_for(num_tokens, kv_->block_size()) - static_cast<int32_t>(match.blocks.size());
  for (BlockId b : match.blocks) num += (ref_count(b) == 0 && !revived_.contains(b)) ? 1 : 0;
  return num;
}

void KvBudget::admit(const PrefixMatch& match, int32_t num_tokens) {
  DI_CHECK(!freed_any_, "plan: admission after a sequence was freed in the same step");
  int32_t num = num_blocks_to_admit(match, num_tokens);
  DI_CHECK(num <= num_available_, "plan: admission needs {} blocks, {} available", num,
           num_available_);
  for (BlockId b : match.blocks) {
    if (ref_count(b) == 0) revived_.insert(b);
  }
  num_available_ -= num;
}

}  // namespace di
