#pragma once
// KvCacheManager: the KV state of every live sequence, on top of BlockPool + PrefixCache.
// The scheduler is its only mutator (through KvBudget it plans; through this class it applies).
//
//   admit ──► allocate_slots ──► [forward] ──► mark_computed ──► append_token ──► allocate_slots
//   ...
//     │ reuses the longest cached prefix            │ registers newly full blocks     │
//     copy-on-write ▼                                             ▼ ▼ of a shared
//   PrefixCache (hash -> block, LRU)  ◄──────  BlockPool (ref counts, free list)     partial block
//
// Lifecycle of one sequence:
//  - admit(): creates its state and references the cached blocks of its longest cached prefix;
//    allocates nothing. num_computed_tokens starts at the hit length.
//  - allocate_slots(): gives a slot to every known token (whole prompt at once; one block when a
//    decode token crosses a block boundary). Evicts LRU cached blocks when the free list is short.
//  - mark_computed(n): the KV of tokens [0, n) is written; full blocks among them enter the cache.
//    Blocks become shareable only after their KV exists, so a hit never reads unwritten KV.
//  - append_token(): records a sampled token (its KV is computed by the next step).
//  - fork(): an n > 1 sibling shares every block of its parent by reference count. Full blocks are
//    immutable. The partially filled last block is copied by the first sibling that writes into it
//    (allocate_slots returns a BlockCopy the engine performs before the step's forward); the last
//    holder writes in place. So n siblings cost n - 1 block copies and no recompute.
//  - free(): drops every reference; cached blocks go to the LRU, others to the free list. Blocks
//  are
//    released last-first so that a chain's tail is evicted before its head.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/ids.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/prefix_cache.h"

namespace di {

// One generated sequence (a request with n > 1 has n of them).
using SeqId = StrongId<struct SeqIdTag, uint64_t>;

struct KvCacheConfig {
  int32_t num_blocks = 0;
  int32_t block_size = 64;  // tokens per block
  std::string model_id;     // enters every block hash: two models never share a block
  bool enable_prefix_caching = true;
};

struct PrefixMatch {
  std::vector<BlockId> blocks;  // cached blocks holding the leading full blocks, in order
  int32_t num_cached_tokens = 0;
};

// Copy all of block `src` (every layer) into `dst` before the forward of the step that returned it.
struct BlockCopy {
  BlockId src;
  BlockId dst;
};

// Prefix-cache counters for /metrics. Every admission counts, including the re-admission of a
// preempted sequence (whose recompute the cache then saves).
struct KvStats {
  uint64_t num_query_tokens = 0;  // tokens of admitted sequences
  uint64_t num_hit_tokens = 0;    // of those, served from the prefix cache
};

class KvCacheManager {
 public:
  explicit KvCacheManager(KvCacheConfig config);

  const KvCacheConfig& config() const { return config_; }
  int32_t block_size() const { return config_.block_size; }
  int32_t num_blocks() const { return config_.num_blocks; }

  // Hash chain of the full blocks of `tokens` under this manager's model id and `cache_salt`.
  std::vector<BlockHash> hash_tokens(std::span<const TokenId> tokens,
                                     std::string_view cache_salt) const;

  // Longest cached prefix of a sequence of `num_tokens` tokens whose full blocks hash to `hashes`.
  // Covers at most num_tokens - 1 tokens: the last token is always computed, to produce logits.
  PrefixMatch match_prefix(std::span<const BlockHash> hashes, int32_t num_tokens) const;

  // Creates `seq` with `tokens` (>= 1) and references its cached prefix; returns the number of
  // cached tokens. `hashes` may carry a precomputed prefix of the chain (it is extended here).
  int32_t admit(SeqId seq, std::vector<TokenId> tokens, std::string cache_salt,
                std::vector<BlockHash> hashes = {});

  // Blocks allocate_slots(seq) takes: blocks to cover every token, plus one for copy-on-write.
  int32_t num_blocks_to_allocate(SeqId seq) const;
  bool can_allocate_slots(SeqId seq) const;
  std::optional<BlockCopy> allocate_slots(SeqId seq);

  void append_token(SeqId seq, TokenId token);
  void mark_computed(SeqId seq, int32_t num_computed_tokens);
  // Precondition: every token of `parent` is computed (call right after its prefill completes).
  void fork(SeqId parent, SeqId child);
  void free(SeqId seq);

  bool contains(SeqId seq) const { return seqs_.contains(seq); }
  const BlockTable& block_table(SeqId seq) const { return state(seq).blocks; }
  std::span<const TokenId> tokens(SeqId seq) const { return state(seq).tokens; }
  std::span<const BlockHash> block_hashes(SeqId seq) const { return state(seq).hashes; }
  int32_t num_tokens(SeqId seq) const { return static_cast<int32_t>(state(seq).tokens.size()); }
  int32_t num_computed_tokens(SeqId seq) const { return state(seq).num_computed; }
  // Tokens served from the prefix cache when `seq` was admitted (usage.cached_tokens).
  int32_t num_cached_tokens(SeqId seq) const { return state(seq).num_cached_tokens; }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs_.size()); }

  int32_t ref_count(BlockId block) const { return pool_.ref_count(block); }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int32_t num_evictable_blocks() const { return cache_.num_evictable(); }
  int32_t num_available_blocks() const { return num_free_blocks() + num_evictable_blocks(); }
  int32_t num_cached_blocks() const { return cache_.num_cached(); }
  bool is_cached(BlockId block) const { return cache_.is_cached(block); }
  const KvStats& stats() const { return stats_; }

  // Recomputes everything from scratch (including every hash chain): free + used + parked ==
  // total; ref counts == references from block tables; every hash names a live block holding
  // exactly that hash; only computed full blocks are cached; tables cover computed tokens.
  void check_integrity() const;

 private:
  struct SeqState {
    std::vector<TokenId> tokens;    // prompt, then sampled tokens
    std::vector<BlockHash> hashes;  // chain over the full blocks of `tokens`
    std::string cache_salt;
    BlockTable blocks;
    int32_t num_computed = 0;  // tokens whose KV is written; full blocks below it are registered
    int32_t num_cached_tokens = 0;
  };

  const SeqState& state(SeqId seq) const;
  SeqState& state(SeqId seq);
  bool needs_copy_on_write(const SeqState& s) const;
  std::vector<BlockId> allocate_blocks(int32_t num);
  void drop_reference(BlockId block);

  KvCacheConfig config_;
  BlockPool pool_;
  PrefixCache cache_;
  std::unordered_map<SeqId, SeqState> seqs_;
  KvStats stats_;
};

}  // namespace di
