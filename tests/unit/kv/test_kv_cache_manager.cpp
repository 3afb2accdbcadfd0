#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "core/error.h"
#include "kv/kv_budget.h"
#include "kv/kv_cache_manager.h"

namespace di {
namespace {

std::vector<TokenId> iota_tokens(int32_t n, TokenId first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvCacheManager make_kv(int32_t num_blocks, int32_t block_size, std::string model = "m") {
  return KvCacheManager(KvCacheConfig{num_blocks, block_size, std::move(model), true});
}

// Admit, allocate, "compute" the whole prompt.
int32_t run_prompt(KvCacheManager& kv, SeqId seq, std::vector<TokenId> tokens,
                   std::string salt = "") {
  int32_t cached = kv.admit(seq, std::move(tokens), std::move(salt));
  kv.check_integrity();
  kv.allocate_slots(seq);
  kv.check_integrity();
  kv.mark_computed(seq, kv.num_tokens(seq));
  kv.check_integrity();
  return cached;
}

TEST(KvCacheManager, AdmitAllocateFreeKeepsCounts) {
  KvCacheManager kv = make_kv(8, 4);
  EXPECT_EQ(run_prompt(kv, SeqId(1), iota_tokens(10, 0)), 0);
  EXPECT_EQ(kv.block_table(SeqId(1)).size(), 3u);
  EXPECT_EQ(kv.num_free_blocks(), 5);
  EXPECT_EQ(kv.num_cached_blocks(), 2);  // two full computed blocks; the partial one is not cached
  for (BlockId b : kv.block_table(SeqId(1))) EXPECT_EQ(kv.ref_count(b), 1);
  kv.free(SeqId(1));
  kv.check_integrity();
  EXPECT_EQ(kv.num_free_blocks(), 6);
  EXPECT_EQ(kv.num_evictable_blocks(), 2);
  EXPECT_EQ(kv.num_available_blocks(), 8);
  EXPECT_THROW(kv.free(SeqId(1)), Error);
}

TEST(KvCacheManager, SharedPrefixHitsFullBlocksOnly) {
  KvCacheManager kv = make_kv(8, 4);
  std::vector<TokenId> a = iota_tokens(10, 0);  // blocks [0..3] [4..7] [8 9]
  run_prompt(kv, SeqId(1), a);
  std::vector<TokenId> b = a;  // same 10 tokens plus more: the partial block [8 9] must not hit
  b.push_back(100);
  b.push_back(101);
  EXPECT_EQ(run_prompt(kv, SeqId(2), b), 8);
  const BlockTable& ta = kv.block_table(SeqId(1));
  const BlockTable& tb = kv.block_table(SeqId(2));
  EXPECT_EQ(ta[0], tb[0]);
  EXPECT_EQ(ta[1], tb[1]);
  EXPECT_NE(ta[2], tb[2]);
  EXPECT_EQ(kv.ref_count(ta[0]), 2);
  EXPECT_EQ(kv.ref_count(ta[2]), 1);
  // A divergence inside block 1 hits block 0 only.
  std::vector<TokenId> c = a;
  c[5] = 999;
  EXPECT_EQ(run_prompt(kv, SeqId(3), c), 4);
  EXPECT_EQ(kv.stats().num_query_tokens, 10u + 12u + 10u);
  EXPECT_EQ(kv.stats().num_hit_tokens, 8u + 4u);
}

TEST(KvCacheManager, BlocksAreSharedOnlyAfterTheirKvIsComputed) {
  KvCacheManager kv = make_kv(8, 4);
  std::vector<TokenId> a = iota_tokens(12, 0);
  kv.admit(SeqId(1), a, "");
  kv.allocate_slots(SeqId(1));
  kv.mark_computed(SeqId(1), 5);  // chunked prefill: block 0 done, block 1 half done
  kv.check_integrity();
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(a, ""), 12).num_cached_tokens, 4);
  kv.mark_computed(SeqId(1), 12);
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(a, ""), 13).num_cached_tokens, 12);
  kv.check_integrity();
}

TEST(KvCacheManager, WholePromptHitStillComputesTheLastToken) {
  KvCacheManager kv = make_kv(8, 4);
  std::vector<TokenId> a = iota_tokens(8, 0);
  run_prompt(kv, SeqId(1), a);
  kv.free(SeqId(1));
  EXPECT_EQ(run_prompt(kv, SeqId(2), a), 4);  // not 8: the step must produce logits
}

TEST(KvCacheManager, SaltIsolatesTenants) {
  KvCacheManager kv = make_kv(8, 4);
  std::vector<TokenId> a = iota_tokens(9, 0);
  run_prompt(kv, SeqId(1), a, "tenant-a");
  EXPECT_EQ(run_prompt(kv, SeqId(2), a, "tenant-b"), 0);
  kv.free(SeqId(2));
  EXPECT_EQ(run_prompt(kv, SeqId(3), a, ""), 0);
  kv.free(SeqId(3));
  EXPECT_EQ(run_prompt(kv, SeqId(4), a, "tenant-a"), 8);
  EXPECT_EQ(kv.block_table(SeqId(4))[1], kv.block_table(SeqId(1))[1]);
}

TEST(KvCacheManager, ModelIdIsolatesModels) {
  KvCacheManager kv1 = make_kv(8, 4, "deepseek-v3");
  KvCacheManager kv2 = make_kv(8, 4, "qwen3");
  std::vector<TokenId> a = iota_tokens(9, 0);
  run_prompt(kv1, SeqId(1), a);
  EXPECT_EQ(kv1.match_prefix(kv1.hash_tokens(a, ""), 9).num_cached_tokens, 8);
  // The same tokens hashed for another model name no block of this one.
  EXPECT_EQ(kv1.match_prefix(kv2.hash_tokens(a, ""), 9).num_cached_tokens, 0);
}

TEST(KvCacheManager, LruEvictsLeastRecentlyUsedFirst) {
  KvCacheManager kv = make_kv(4, 4);
  std::vector<TokenId> a = iota_tokens(5, 0), b = iota_tokens(5, 100), c = iota_tokens(5, 200);
  for (auto [id, t] : {std::pair{1, a}, std::pair{2, b}, std::pair{3, c}}) {
    run_prompt(kv, SeqId(id), t);
    kv.free(SeqId(id));
    kv.check_integrity();
  }
  EXPECT_EQ(kv.num_evictable_blocks(), 3);
  EXPECT_EQ(run_prompt(kv, SeqId(4), a), 4);  // touch a: LRU order is now b, c, a
  kv.free(SeqId(4));
  run_prompt(kv, SeqId(5), iota_tokens(12, 300));  // needs 3 blocks, 1 free: evicts b and c
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(a, ""), 5).num_cached_tokens, 4);
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(b, ""), 5).num_cached_tokens, 0);
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(c, ""), 5).num_cached_tokens, 0);
}

TEST(KvCacheManager, ChainTailIsEvictedBeforeItsHead) {
  KvCacheManager kv = make_kv(4, 4);
  std::vector<TokenId> x = iota_tokens(13, 0);  // 3 full blocks + 1 token
  run_prompt(kv, SeqId(1), x);
  kv.free(SeqId(1));
  EXPECT_EQ(kv.num_evictable_blocks(), 3);
  run_prompt(kv, SeqId(2), iota_tokens(8, 500));  // 2 blocks: 1 free + evict 1
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(x, ""), 13).num_cached_tokens, 8);
}

TEST(KvCacheManager, EvictionNeverTouchesReferencedBlocks) {
  KvCacheManager kv = make_kv(4, 4);
  std::vector<TokenId> a = iota_tokens(9, 0);
  run_prompt(kv, SeqId(1), a);  // 3 blocks, 2 cached and referenced
  EXPECT_EQ(kv.num_evictable_blocks(), 0);
  kv.admit(SeqId(2), iota_tokens(8, 100), "");
  EXPECT_EQ(kv.num_blocks_to_allocate(SeqId(2)), 2);
  EXPECT_FALSE(kv.can_allocate_slots(SeqId(2)));
  EXPECT_THROW(kv.allocate_slots(SeqId(2)), Error);
  kv.check_integrity();
  EXPECT_EQ(kv.match_prefix(kv.hash_tokens(a, ""), 9).num_cached_tokens, 8);
  kv.free(SeqId(1));  // now the two cached blocks are evictable
  EXPECT_TRUE(kv.can_allocate_slots(SeqId(2)));
  kv.allocate_slots(SeqId(2));
  kv.check_integrity();
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesThePartialBlockOnFirstWrite) {
  KvCacheManager kv = make_kv(8, 4);
  run_prompt(kv, SeqId(1), iota_tokens(6, 0));  // [0..3] [4 5 _ _]
  kv.fork(SeqId(1), SeqId(2));
  kv.fork(SeqId(1), SeqId(3));
  kv.check_integrity();
  BlockId full = kv.block_table(SeqId(1))[0], partial = kv.block_table(SeqId(1))[1];
  EXPECT_EQ(kv.ref_count(full), 3);
  EXPECT_EQ(kv.ref_count(partial), 3);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  for (SeqId s : {SeqId(1), SeqId(2), SeqId(3)})
    kv.append_token(s, 50 + static_cast<int>(s.value()));
  // The first two writers copy the shared partial block; the last writes in place.
  std::optional<BlockCopy> c2 = kv.allocate_slots(SeqId(2));
  ASSERT_TRUE(c2.has_value());
  EXPECT_EQ(c2->src, partial);
  EXPECT_EQ(kv.block_table(SeqId(2))[1], c2->dst);
  kv.check_integrity();
  std::optional<BlockCopy> c3 = kv.allocate_slots(SeqId(3));
  ASSERT_TRUE(c3.has_value());
  EXPECT_EQ(kv.allocate_slots(SeqId(1)), std::nullopt);
  EXPECT_EQ(kv.block_table(SeqId(1))[1], partial);
  EXPECT_EQ(kv.ref_count(partial), 1);
  EXPECT_EQ(kv.ref_count(full), 3);
  kv.check_integrity();
  for (SeqId s : {SeqId(1), SeqId(2), SeqId(3)}) kv.free(s);
  kv.check_integrity();
  EXPECT_EQ(kv.num_available_blocks(), 8);
}

TEST(KvCacheManager, ForkAtBlockBoundaryNeedsNoCopy) {
  KvCacheManager kv = make_kv(8, 4);
  run_prompt(kv, SeqId(1), iota_tokens(8, 0));
  kv.fork(SeqId(1), SeqId(2));
  kv.append_token(SeqId(1), 7);
  kv.append_token(SeqId(2), 8);
  EXPECT_EQ(kv.allocate_slots(SeqId(1)), std::nullopt);
  EXPECT_EQ(kv.allocate_slots(SeqId(2)), std::nullopt);
  EXPECT_NE(kv.block_table(SeqId(1))[2], kv.block_table(SeqId(2))[2]);
  kv.check_integrity();
}

TEST(KvCacheManager, ForkRequiresAComputedParent) {
  KvCacheManager kv = make_kv(8, 4);
  kv.admit(SeqId(1), iota_tokens(6, 0), "");
  kv.allocate_slots(SeqId(1));
  EXPECT_THROW(kv.fork(SeqId(1), SeqId(2)), Error);
}

TEST(KvCacheManager, ConcurrentDuplicateBlocksStayConsistent) {
  KvCacheManager kv = make_kv(8, 4);
  std::vector<TokenId> a = iota_tokens(9, 0);
  kv.admit(SeqId(1), a, "");
  kv.admit(SeqId(2), a, "");  // both miss: nothing computed yet
  kv.allocate_slots(SeqId(1));
  kv.allocate_slots(SeqId(2));
  kv.mark_computed(SeqId(1), 9);
  kv.mark_computed(SeqId(2), 9);  // same hashes: the second copies stay uncached
  kv.check_integrity();
  EXPECT_EQ(kv.num_cached_blocks(), 2);
  kv.free(SeqId(1));
  kv.free(SeqId(2));
  kv.check_integrity();
  EXPECT_EQ(kv.num_evictable_blocks(), 2);
  EXPECT_EQ(kv.num_free_blocks(), 6);
}

TEST(KvCacheManager, SecondRequestOnA1000TokenPrefixReports960CachedTokens) {
  KvCacheManager kv = make_kv(64, 64);
  std::vector<TokenId> prefix = iota_tokens(1000, 1);
  std::vector<TokenId> first = prefix, second = prefix;
  first.push_back(7);
  second.insert(second.end(), {8, 9, 10});
  EXPECT_EQ(run_prompt(kv, SeqId(1), first), 0);
  EXPECT_EQ(run_prompt(kv, SeqId(2), second), (1000 / 64) * 64);
  EXPECT_EQ(kv.num_cached_tokens(SeqId(2)), 960);
  EXPECT_EQ(kv.stats().num_hit_tokens, 960u);
  EXPECT_EQ(kv.stats().num_query_tokens, 1001u + 1003u);
}

TEST(KvBudget, PlansWhatTheManagerThenDoes) {
  KvCacheManager kv = make_kv(6, 4);
  run_prompt(kv, SeqId(1), iota_tokens(6, 0));  // 2 blocks, 1 cached
  kv.fork(SeqId(1), SeqId(2));
  kv.append_token(SeqId(1), 1);
  kv.append_token(SeqId(2), 2);
  std::vector<TokenId> waiting = iota_tokens(9, 0);  // hits block 0 (referenced: free of cost)
  KvBudget plan(kv);
  EXPECT_EQ(plan.num_available_blocks(), 4);
  EXPECT_EQ(plan.num_blocks_to_allocate(SeqId(1)), 1);  // copy-on-write
  plan.allocate_slots(SeqId(1));
  EXPECT_EQ(plan.num_blocks_to_allocate(SeqId(2)), 0);  // the shared block is now its own
  plan.allocate_slots(SeqId(2));
  PrefixMatch m = kv.match_prefix(kv.hash_tokens(waiting, ""), 9);
  EXPECT_EQ(m.num_cached_tokens, 4);
  EXPECT_EQ(plan.num_blocks_to_admit(m, 9), 2);
  plan.admit(m, 9);
  EXPECT_EQ(plan.num_available_blocks(), 1);
  EXPECT_THROW(plan.allocate_slots(SeqId(1)), Error);  // planned twice
  // Apply in the documented order; the manager agrees.
  kv.admit(SeqId(3), waiting, "");
  EXPECT_TRUE(kv.allocate_slots(SeqId(1)).has_value());
  EXPECT_FALSE(kv.allocate_slots(SeqId(2)).has_value());
  kv.allocate_slots(SeqId(3));
  kv.check_integrity();
  EXPECT_EQ(kv.num_available_blocks(), 1);
}

TEST(KvBudget, FreeingCountsOnlyLastReferences) {
  KvCacheManager kv = make_kv(6, 4);
  run_prompt(kv, SeqId(1), iota_tokens(6, 0));
  kv.fork(SeqId(1), SeqId(2));
  KvBudget plan(kv);
  EXPECT_EQ(plan.num_available_blocks(), 4);
  plan.free(SeqId(2));
  EXPECT_EQ(plan.num_available_blocks(), 4);  // sibling still holds both blocks
  plan.free(SeqId(1));
  EXPECT_EQ(plan.num_available_blocks(), 6);
  PrefixMatch none;
  EXPECT_THROW(plan.admit(none, 1), Error);  // no admission after a free in one plan
}

// Random admit / allocate / compute / append / fork / free on a 6-block pool, checking every
// invariant after every operation and the KvBudget's prediction of every allocation.
TEST(KvCacheManager, RandomizedStress) {
  for (int32_t block_size : {1, 4}) {
    KvCacheManager kv = make_kv(6, block_size);
    std::mt19937 rng(1234 + block_size);
    std::vector<SeqId> live;
    uint64_t next_id = 0;
    auto pick = [&]() { return live[rng() % live.size()]; };
    for (int op = 0; op < 4000; ++op) {
      int kind = static_cast<int>(rng() % 6);
      if (kind == 0 || live.empty()) {
        // Prompts from a small alphabet so that prefixes repeat and hit.
        std::vector<TokenId> t(1 + rng() % (3 * block_size + 2));
        for (auto& x : t) x = static_cast<TokenId>(rng() % 2);
        std::string salt = (rng() % 4 == 0) ? "s" : "";
        KvBudget plan(kv);
        PrefixMatch m = kv.match_prefix(kv.hash_tokens(t, salt), static_cast<int32_t>(t.size()));
        if (!plan.can_admit(m, static_cast<int32_t>(t.size()))) continue;
        int32_t before = kv.num_available_blocks();
        int32_t cost = plan.num_blocks_to_admit(m, static_cast<int32_t>(t.size()));
        SeqId id(next_id++);
        EXPECT_EQ(kv.admit(id, t, salt), m.num_cached_tokens);
        kv.allocate_slots(id);
        EXPECT_EQ(kv.num_available_blocks(), before - cost);
        live.push_back(id);
      } else if (kind == 1) {  // compute some tokens
        SeqId id = pick();
        int32_t lo = kv.num_computed_tokens(id);
        int32_t hi = std::min<int32_t>(
            kv.num_tokens(id), static_cast<int32_t>(kv.block_table(id).size()) * block_size);
        if (hi > lo) kv.mark_computed(id, lo + 1 + static_cast<int32_t>(rng() % (hi - lo)));
      } else if (kind == 2) {  // sample a token, then give it a slot
        SeqId id = pick();
        if (kv.num_computed_tokens(id) != kv.num_tokens(id)) continue;
        kv.append_token(id, static_cast<TokenId>(rng() % 2));
        KvBudget plan(kv);
        if (plan.can_allocate_slots(id)) {
          int32_t before = kv.num_available_blocks();
          int32_t cost = plan.num_blocks_to_allocate(id);
          kv.allocate_slots(id);
          EXPECT_EQ(kv.num_available_blocks(), before - cost);
        } else {
          kv.free(id);
          live.erase(std::find(live.begin(), live.end(), id));
        }
      } else if (kind == 3) {  // fork
        SeqId id = pick();
        if (kv.num_computed_tokens(id) != kv.num_tokens(id)) continue;
        SeqId child(next_id++);
        kv.fork(id, child);
        live.push_back(child);
      } else {  // finish or abort
        SeqId id = pick();
        KvBudget plan(kv);
        plan.free(id);
        kv.free(id);
        EXPECT_EQ(kv.num_available_blocks(), plan.num_available_blocks());
        live.erase(std::find(live.begin(), live.end(), id));
      }
      kv.check_integrity();
    }
    for (SeqId id : live) kv.free(id);
    kv.check_integrity();
    EXPECT_EQ(kv.num_available_blocks(), 6);
    EXPECT_GT(kv.stats().num_hit_tokens, 0u);
  }
}

}  // namespace
}  // namespace di
