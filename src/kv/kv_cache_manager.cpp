#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "core/error.h"

namespace di {

KvCacheManager::KvCacheManager(KvCacheConfig config)
    : config_(std::move(config)),
      pool_(config_.num_blocks, config_.block_size),
      cache_(config_.num_blocks) {}

std::vector<BlockHash> KvCacheManager::hash_tokens(std::span<const TokenId> tokens,
                                                   std::string_view cache_salt) const {
  std::vector<BlockHash> hashes;
  extend_block_hashes(hashes, tokens, block_size(), config_.model_id, cache_salt);
  return hashes;
}

PrefixMatch KvCacheManager::match_prefix(std::span<const BlockHash> hashes,
                                         int32_t num_tokens) const {
  PrefixMatch match;
  if (!config_.enable_prefix_caching || num_tokens <= 0) return match;
  size_t max_blocks = std::min<size_t>(hashes.size(), (num_tokens - 1) / block_size());
  for (size_t i = 0; i < max_blocks; ++i) {
    std::optional<BlockId> block = cache_.find(hashes[i]);
    if (!block) break;  // the chain makes every later hash depend on this one
    match.blocks.push_back(*block);
  }
  match.num_cached_tokens = static_cast<int32_t>(match.blocks.size()) * block_size();
  return match;
}

int32_t KvCacheManager::admit(SeqId seq, std::vector<TokenId> tokens, std::string cache_salt,
                              std::vector<BlockHash> hashes) {
  DI_CHECK(!seqs_.contains(seq), "sequence {} is already admitted", seq.value());
  DI_CHECK(!tokens.empty(), "sequence {} has no tokens", seq.value());
  extend_block_hashes(hashes, tokens, block_size(), config_.model_id, cache_salt);
  PrefixMatch match = match_prefix(hashes, static_cast<int32_t>(tokens.size()));
  for (BlockId b : match.blocks) {
    if (pool_.ref_count(b) == 0) cache_.unpark(b);
    pool_.incref(b);
  }
  stats_.num_query_tokens += tokens.size();
  stats_.num_hit_tokens += static_cast<uint64_t>(match.num_cached_tokens);
  SeqState& s = seqs_[seq];
  s.tokens = std::move(tokens);
  s.hashes = std::move(hashes);
  s.cache_salt = std::move(cache_salt);
  s.blocks = std::move(match.blocks);
  s.num_computed = match.num_cached_tokens;
  s.num_cached_tokens = match.num_cached_tokens;
  return match.num_cached_tokens;
}

bool KvCacheManager::needs_copy_on_write(const SeqState& s) const {
  // The next write goes to position num_computed; only a partially filled block can be shared and
  // still written (full blocks are immutable), and only fork() shares partial blocks.
  int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
  if (s.num_computed >= num_tokens || s.num_computed % block_size() == 0) return false;
  size_t idx = static_cast<size_t>(s.num_computed / block_size());
  return idx < s.blocks.size() && pool_.ref_count(s.blocks[idx]) > 1;
}

int32_t KvCacheManager::num_blocks_to_allocate(SeqId seq) const {
  const SeqState& s = state(seq);
  int32_t num_new = num_blocks_for(static_cast<int32_t>(s.tokens.size()), block_size()) -
                    static_cast<int32_t>(s.blocks.size());
  return std::max(num_new, 0) + (needs_copy_on_write(s) ? 1 : 0);
}

bool KvCacheManager::can_allocate_slots(SeqId seq) const {
  return num_blocks_to_allocate(seq) <= num_available_blocks();
}

std::optional<BlockCopy> KvCacheManager::allocate_slots(SeqId seq) {
  SeqState& s = state(seq);
  int32_t num_needed = num_blocks_to_allocate(seq);
  DI_CHECK(num_needed <= num_available_blocks(), "sequence {} needs {} blocks, {} available",
           seq.value(), num_needed, num_available_blocks());
  std::optional<BlockCopy> copy;
  if (needs_copy_on_write(s)) {
    size_t idx = static_cast<size_t>(s.num_computed / block_size());
    BlockId shared = s.blocks[idx];
    DI_CHECK(!cache_.is_cached(shared), "partial block {} is cached", shared.value());
    BlockId own = allocate_blocks(1)[0];
    copy = BlockCopy{shared, own};
    s.blocks[idx] = own;
    drop_reference(shared);
    --num_needed;
  }
  for (BlockId b : allocate_blocks(num_needed)) s.blocks.push_back(b);
  return copy;
}

void KvCacheManager::append_token(SeqId seq, TokenId token) {
  SeqState& s = state(seq);
  s.tokens.push_back(token);
  extend_block_hashes(s.hashes, s.tokens, block_size(), config_.model_id, s.cache_salt);
}

void KvCacheManager::mark_computed(SeqId seq, int32_t num_computed_tokens) {
  SeqState& s = state(seq);
  DI_CHECK(num_computed_tokens >= s.num_computed &&
               num_computed_tokens <= static_cast<int32_t>(s.tokens.size()) &&
               num_computed_tokens <= static_cast<int32_t>(s.blocks.size()) * block_size(),
           "sequence {}: {} computed tokens (was {}, {} tokens, {} blocks)", seq.value(),
           num_computed_tokens, s.num_computed, s.tokens.size(), s.blocks.size());
  int32_t first = s.num_computed / block_size();
  int32_t last = num_computed_tokens / block_size();
  s.num_computed = num_computed_tokens;
  if (!config_.enable_prefix_caching) return;
  for (int32_t i = first; i < last; ++i) {
    if (!cache_.is_cached(s.blocks[i])) cache_.insert(s.hashes[i], s.blocks[i]);
  }
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  DI_CHECK(!seqs_.contains(child), "sequence {} already exists", child.value());
  const SeqState& p = state(parent);
  DI_CHECK(p.num_computed == static_cast<int32_t>(p.tokens.size()),
           "fork of sequence {} with {} of {} tokens computed", parent.value(), p.num_computed,
           p.tokens.size());
  SeqState copy = p;
  for (BlockId b : copy.blocks) pool_.incref(b);
  seqs_.emplace(child, std::move(copy));
}

void KvCacheManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "free of unknown sequence {}", seq.value());
  const BlockTable& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) drop_reference(*b);
  seqs_.erase(it);
}

std::vector<BlockId> KvCacheManager::allocate_blocks(int32_t num) {
  while (pool_.num_free() < num) {
    std::optional<BlockId> victim = cache_.evict();
    DI_CHECK(victim.has_value(), "out of KV blocks: need {}, {} free, nothing evictable", num,
             pool_.num_free());
    pool_.release(*victim);
  }
  return pool_.allocate(num);
}

void KvCacheManager::drop_reference(BlockId block) {
  if (pool_.decref(block) > 0) return;
  if (cache_.is_cached(block)) {
    cache_.park(block);
  } else {
    pool_.release(block);
  }
}

const KvCacheManager::SeqState& KvCacheManager::state(SeqId seq) const {
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "unknown sequence {}", seq.value());
  return it->second;
}

KvCacheManager::SeqState& KvCacheManager::state(SeqId seq) {
  auto it = seqs_.find(seq);
  DI_CHECK(it != seqs_.end(), "unknown sequence {}", seq.value());
  return it->second;
}

void KvCacheManager::check_integrity() const {
  pool_.check_integrity();
  cache_.check_integrity(pool_);
  const int32_t bs = block_size();
  std::vector<int32_t> refs(num_blocks(), 0);
  for (const auto& [id, s] : seqs_) {
    int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
    int32_t num_table = static_cast<int32_t>(s.blocks.size());
    DI_CHECK(num_tokens >= 1, "sequence {} has no tokens", id.value());
    DI_CHECK(num_table <= num_blocks_for(num_tokens, bs), "sequence {}: {} blocks for {} tokens",
             id.value(), num_table, num_tokens);
    DI_CHECK(
        s.num_computed >= 0 && s.num_computed <= num_tokens && s.num_computed <= num_table * bs,
        "sequence {}: {} computed tokens, {} tokens, {} blocks", id.value(), s.num_computed,
        num_tokens, num_table);
    std::vector<BlockHash> expected;
    extend_block_hashes(expected, s.tokens, bs, config_.model_id, s.cache_salt);
    DI_CHECK(expected == s.hashes, "sequence {}: stored hash chain differs from its tokens",
             id.value());
    std::unordered_set<BlockId> in_table;
    for (int32_t i = 0; i < num_table; ++i) {
      BlockId b = s.blocks[i];
      DI_CHECK(in_table.insert(b).second, "sequence {} holds block {} twice", id.value(),
               b.value());
      ++refs[b.value()];
      if (!cache_.is_cached(b)) continue;
      DI_CHECK(i < s.num_computed / bs,
               "sequence {}: block {} at index {} is cached but not a "
               "computed full block ({} computed)",
               id.value(), b.value(), i, s.num_computed);
      DI_CHECK(cache_.find(s.hashes[i]) == b,
               "sequence {}: cached block {} at index {} holds "
               "another hash than its tokens",
               id.value(), b.value(), i);
    }
  }
  int32_t num_free = 0, num_used = 0, num_parked = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    DI_CHECK(pool_.ref_count(BlockId(b)) == refs[b], "block {}: ref count {} but {} references", b,
             pool_.ref_count(BlockId(b)), refs[b]);
    if (pool_.is_free(BlockId(b))) {
      ++num_free;
    } else if (refs[b] > 0) {
      ++num_used;
    } else {
      ++num_parked;
      DI_CHECK(cache_.is_cached(BlockId(b)), "block {} is unreferenced, not free, not cached", b);
    }
  }
  DI_CHECK(num_free + num_used + num_parked == num_blocks() && num_parked == cache_.num_evictable(),
           "free {} + used {} + cached {} != total {} (evictable {})", num_free, num_used,
           num_parked, num_blocks(), cache_.num_evictable());
}

}  // namespace di
