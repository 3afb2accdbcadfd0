#pragma once
// A CPU stand-in for the engine in scheduler tests: a KV "memory" that stores token ids in the
// slots the plan names. Every step it performs the block copies, writes the new tokens, reads
// each sequence's context back through the CSR view, checks it equals the sequence's tokens, and
// "samples" a token that is a hash of that context. A lost token, a wrong prefix hit, a missed
// copy-on-write or a stale block table changes the context and so every later token.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "scheduler/scheduler.h"

namespace di::testing {

class FakeEngine {
 public:
  FakeEngine(int32_t num_blocks, int32_t block_size)
      : slots_(static_cast<size_t>(num_blocks) * block_size, -1), block_size_(block_size) {}

  static TokenId next_token(std::span<const TokenId> context, int32_t sample_idx) {
    uint64_t h = 1469598103934665603ull + static_cast<uint64_t>(sample_idx) * 7919;
    for (TokenId t : context) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    return static_cast<TokenId>(10 + h % 1000);  // ids 0..9 stay free for stop tokens
  }

  std::vector<SampledTokens> run(const StepPlan& plan, const KvCacheManager& kv) {
    for (const BlockCopy& c : plan.block_copies) {
      std::copy_n(slots_.begin() + c.src.value() * block_size_, block_size_,
                  slots_.begin() + c.dst.value() * block_size_);
    }
    EXPECT_EQ(plan.input_ids.size(), plan.paged.slot_block_ids.size());
    for (size_t i = 0; i < plan.input_ids.size(); ++i) {
      slots_[plan.paged.slot_block_ids[i] * block_size_ + plan.paged.slot_offsets[i]] =
          plan.input_ids[i];
    }
    std::vector<SampledTokens> out;
    size_t s = 0;
    for (const auto* list : {&plan.schedule.decodes, &plan.schedule.prefills}) {
      for (const ScheduledSeq& e : *list) {
        std::vector<TokenId> context;
        for (int32_t j = plan.paged.indptr[s]; j < plan.paged.indptr[s + 1]; ++j) {
          bool last = j + 1 == plan.paged.indptr[s + 1];
          int32_t n = last ? plan.paged.last_len[s] : block_size_;
          for (int32_t o = 0; o < n; ++o) {
            context.push_back(slots_[plan.paged.indices[j] * block_size_ + o]);
          }
        }
        std::span<const TokenId> tokens = kv.tokens(e.seq_id);
        EXPECT_EQ(context,
                  std::vector<TokenId>(tokens.begin(), tokens.begin() + e.start + e.num_tokens))
            << "sequence " << e.seq_id.value();
        if (e.num_samples > 0) {
          SampledTokens st{e.seq_id, {}};
          for (int32_t k = 0; k < e.num_samples; ++k) {
            st.tokens.push_back(next_token(context, kv_sample_base(e) + k));
          }
          out.push_back(std::move(st));
        }
        ++s;
      }
    }
    return out;
  }

  // Sample k of an unforked group gets sample index k; a forked sibling keeps its own index.
  std::function<int32_t(const ScheduledSeq&)> sample_base;

 private:
  int32_t kv_sample_base(const ScheduledSeq& e) const { return sample_base ? sample_base(e) : 0; }

  std::vector<TokenId> slots_;
  int32_t block_size_;
};

struct Transcript {
  std::map<std::pair<uint64_t, int32_t>, std::vector<TokenId>> tokens;  // (request, sample)
  std::map<std::pair<uint64_t, int32_t>, FinishReason> reasons;
  std::map<std::pair<uint64_t, int32_t>, int32_t> cached;
};

// One engine step; checks every invariant afterwards and records the events.
inline std::vector<SeqEvent> run_step(Scheduler& sched, FakeEngine& engine, Transcript& out,
                                      const Limits& limits) {
  StepPlan plan = sched.step();
  sched.check_integrity();
  EXPECT_LE(plan.schedule.num_batched_tokens, limits.max_num_batched_tokens);
  EXPECT_EQ(static_cast<size_t>(plan.schedule.num_batched_tokens), plan.input_ids.size());
  engine.sample_base = [&](const ScheduledSeq& e) {
    return sched.queues().seq(e.seq_id).sample_idx;
  };
  std::vector<SampledTokens> sampled = engine.run(plan, sched.kv());
  std::vector<SeqEvent> events = sched.update(plan, sampled);
  sched.check_integrity();
  for (const SeqEvent& ev : events) {
    auto key = std::pair{ev.request_id.value(), ev.sample_idx};
    out.tokens[key].push_back(ev.token);
    if (ev.finish_reason != FinishReason::kNone) {
      out.reasons[key] = ev.finish_reason;
      out.cached[key] = ev.num_cached_tokens;
    }
  }
  return events;
}

}  // namespace di::testing
