#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"

namespace di::sampling {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const std::vector<int32_t> kNone;

std::vector<float> logs_of(std::vector<double> probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

SamplingParams params_with(float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

void expect_dist(const std::vector<TokenProb>& got, const std::vector<TokenProb>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << "rank " << i;
    EXPECT_NEAR(got[i].prob, want[i].prob, 1e-6) << "rank " << i;
  }
}

// ---- validation ---------------------------------------------------------------------------------

TEST(SamplingParams, DefaultsAndEdgesAreValid) {
  EXPECT_TRUE(SamplingParams{}.validate().is_ok());
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.frequency_penalty = -2.0f;
  p.presence_penalty = 2.0f;
  p.top_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().to_string();
  p.top_k = -1;
  EXPECT_TRUE(p.validate().is_ok());
}

TEST(SamplingParams, OutOfRangeValuesNameTheField) {
  struct Case {
    const char* field;
    void (*mutate)(SamplingParams&);
  };
  const Case cases[] = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.5f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = kInf; }},
      {"temperature", [](SamplingParams& p) { p.temperature = std::nanf(""); }},
      {"top_k", [](SamplingParams& p) { p.top_k = -2; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.5f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = std::nanf(""); }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.1f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.1f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = -1.0f; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = 2.5f; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = -3.0f; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = 21; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = -1; }},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(p);
    Status s = p.validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
}

// ---- greedy -------------------------------------------------------------------------------------

TEST(Sampler, GreedyTakesArgmaxLowestIndexOnTies) {
  SamplingParams p = params_with(0.0f);
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(sample_token(l, p, 0, kNone, kNone), 1);
  // Independent of the seed and position.
  p.seed = 99;
  for (int64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_token(l, p, pos, kNone, kNone), 1);
  std::vector<float> masked = {-kInf, std::nanf(""), -3.0f, -kInf};
  EXPECT_EQ(sample_token(masked, p, 0, kNone, kNone), 2);
  std::vector<float> all_masked = {-kInf, -kInf};
  EXPECT_THROW(sample_token(all_masked, p, 0, kNone, kNone), Error);
  EXPECT_THROW(sample_token(all_masked, params_with(1.0f), 0, kNone, kNone), Error);
}

// The greedy token against the definition (first index of the largest logit that is neither
// NaN nor -inf) over random rows of every length 1..70 and a 129,280 vocabulary, with NaN, +-inf,
// +-0 and exact ties mixed in: the lane-wise argmax covers its tail and lane boundaries.
TEST(Sampler, GreedyMatchesTheDefinitionOnRandomRowsWithSpecialValues) {
  const SamplingParams p = params_with(0.0f);
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> pick(0, 9);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  auto reference = [](const std::vector<float>& l) {
    int32_t best = -1;
    for (size_t i = 0; i < l.size(); ++i) {
      if (std::isnan(l[i]) || l[i] == -kInf) continue;
      if (best < 0 || l[i] > l[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    }
    return best;
  };
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const size_t n = trial < 2800 ? static_cast<size_t>(1 + trial % 70) : 129280;
    std::vector<float> l(n);
    for (float& v : l) {
      switch (pick(rng)) {
        case 0: v = std::nanf(""); break;
        case 1: v = -kInf; break;
        case 2: v = trial % 7 == 0 ? kInf : 1.5f; break;  // ties (and a rare +inf)
        case 3: v = (trial & 1) ? 0.0f : -0.0f; break;
        default: v = normal(rng); break;
      }
    }
    const int32_t want = reference(l);
    if (want < 0) {
      EXPECT_THROW(sample_token(l, p, 0, kNone, kNone), Error) << "trial " << trial;
      continue;
    }
    ASSERT_EQ(sample_token(l, p, 0, kNone, kNone), want) << "trial " << trial << " n " << n;
    ++checked;
  }
  EXPECT_GT(checked, 2500);
}

// ---- filters against hand-computed distributions --------------------------------------------

TEST(Filters, TemperatureScalesLogits) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  // T = 2: weights e^0, e^0.5, e^1.
  double w0 = 1.0, w1 = std::exp(0.5), w2 = std::exp(1.0), z = w0 + w1 + w2;
  expect_dist(filtered_distribution(l, params_with(2.0f)), {{2, w2 / z}, {1, w1 / z}, {0, w0 / z}});
  // T = 0.5: weights e^0, e^2, e^4.
  w1 = std::exp(2.0);
  w2 = std::exp(4.0);
  z = w0 + w1 + w2;
  expect_dist(filtered_distribution(l, params_with(0.5f)), {{2, w2 / z}, {1, w1 / z}, {0, w0 / z}});
}

TEST(Filters, TopKKeepsKLargestLowerIdOnTies) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  SamplingParams p;
  p.top_k = 2;
  expect_dist(filtered_distribution(l, p), {{1, 0.5}, {3, 0.5}});
  p.top_k = 1;
  expect_dist(filtered_distribution(std::vector<float>{5.0f, 5.0f}, p), {{0, 1.0}});
  p.top_k = 3;
  double e3 = std::exp(3.0), e2 = std::exp(2.0), z = 2 * e3 + e2;
  expect_dist(filtered_distribution(l, p), {{1, e3 / z}, {3, e3 / z}, {2, e2 / z}});
  p.top_k = 100;  // larger than the vocabulary: off
  EXPECT_EQ(filtered_distribution(l, p).size(), 5u);
}

TEST(Filters, TopPKeepsSmallestPrefixReachingP) {
  std::vector<float> l = logs_of({0.05, 0.5, 0.1, 0.2, 0.15});
  SamplingParams p;
  p.top_p = 0.75f;  // 0.5, 0.7, 0.85 -> three tokens
  expect_dist(filtered_distribution(l, p), {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
  p.top_p = 0.6f;
  expect_dist(filtered_distribution(l, p), {{1, 0.5 / 0.7}, {3, 0.2 / 0.7}});
  p.top_p = 0.4f;  // the top token alone already has the mass
  expect_dist(filtered_distribution(l, p), {{1, 1.0}});
}

TEST(Filters, MinPDropsTokensBelowFractionOfMax) {
  std::vector<float> l = logs_of({0.05, 0.5, 0.1, 0.2, 0.15});
  SamplingParams p;
  p.min_p = 0.25f;  // keep p >= 0.125
  expect_dist(filtered_distribution(l, p), {{1, 0.5 / 0.85}, {3, 0.2 / 0.85}, {4, 0.15 / 0.85}});
  p.min_p = 0.35f;  // keep p >= 0.175
  expect_dist(filtered_distribution(l, p), {{1, 0.5 / 0.7}, {3, 0.2 / 0.7}});
  p.min_p = 1.0f;
  expect_dist(filtered_distribution(l, p), {{1, 1.0}});
}

TEST(Filters, TopPSeesTheTopKRenormalisedDistribution) {
  // top-k 2 leaves {0.4, 0.3} -> {4/7, 3/7}; top-p 0.5 then keeps only the first. Applying top-p
  // to the unfiltered distribution would have kept two tokens.
  std::vector<float> l = logs_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_k = 2;
  p.top_p = 0.5f;
  expect_dist(filtered_distribution(l, p), {{0, 1.0}});
  // min-p after top-p (0.8 keeps 3 tokens: 0.4 0.3 0.2), min_p 0.6 -> p >= 0.24 keeps two.
  p.top_k = -1;
  p.top_p = 0.8f;
  p.min_p = 0.6f;
  expect_dist(filtered_distribution(l, p), {{0, 4.0 / 7}, {1, 3.0 / 7}});
}

TEST(Filters, TemperatureAppliesBeforeTopP) {
  // T = 0.5 squares the probabilities: {0.6, 0.4} -> {0.36, 0.16}/0.52 = {0.692, 0.308}; top-p
  // 0.65 then keeps only the first token, which it would not at T = 1.
  std::vector<float> l = logs_of({0.6, 0.4});
  SamplingParams p;
  p.top_p = 0.65f;
  EXPECT_EQ(filtered_distribution(l, p).size(), 2u);
  p.temperature = 0.5f;
  expect_dist(filtered_distribution(l, p), {{0, 1.0}});
}

TEST(Filters, MaskedTokensAreNeverKept) {
  std::vector<float> l = {1.0f, -kInf, 1.0f, std::nanf("")};
  expect_dist(filtered_distribution(l, SamplingParams{}), {{0, 0.5}, {2, 0.5}});
}

// ---- penalties ----------------------------------------------------------------------------------

TEST(Penalties, RepetitionFrequencyPresence) {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  std::vector<int32_t> prompt = {0, 0};
  std::vector<int32_t> output = {1, 3, 1};
  apply_penalties(l, p, prompt, output);
  EXPECT_FLOAT_EQ(l[0], 1.0f);                      // prompt only: 2 / 2
  EXPECT_FLOAT_EQ(l[1], -2.0f - 2 * 0.5f - 0.25f);  // -1 * 2, then twice in the output
  EXPECT_FLOAT_EQ(l[2], 0.5f);                      // unseen
  EXPECT_FLOAT_EQ(l[3], 1.5f - 0.5f - 0.25f);       // 3 / 2, once in the output
  EXPECT_FLOAT_EQ(l[4], 1.0f);                      // unseen

  // Greedy sees the penalised logits: the argmax moves from token 3 to token 0.
  std::vector<float> raw = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  SamplingParams g = p;
  g.temperature = 0.0f;
  EXPECT_EQ(sample_token(raw, g, 0, prompt, output), 0);
  g.repetition_penalty = 1.0f;
  g.frequency_penalty = 0.0f;
  g.presence_penalty = 0.0f;
  EXPECT_EQ(sample_token(raw, g, 0, prompt, output), 3);

  std::vector<int32_t> bad = {5};
  EXPECT_THROW(apply_penalties(l, p, bad, kNone), Error);
}

TEST(Penalties, NegativeFrequencyPenaltyEncouragesRepeats) {
  std::vector<float> l = {1.0f, 1.2f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = -1.0f;
  std::vector<int32_t> output = {0};
  EXPECT_EQ(sample_token(l, p, 0, kNone, output), 0);
}

// ---- the draw -------------------------------------------------------------------------------

// Pearson's chi-square of `counts` against `dist` (n draws).
double chi_square(const std::map<int32_t, int64_t>& counts, const std::vector<TokenProb>& dist,
                  int64_t n) {
  double chi2 = 0.0;
  for (const TokenProb& tp : dist) {
    double expected = tp.prob * static_cast<double>(n);
    auto it = counts.find(tp.token);
    double observed = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    chi2 += (observed - expected) * (observed - expected) / expected;
  }
  return chi2;
}

TEST(Sampler, EmpiricalDistributionMatchesFilteredSoftmax) {
  std::vector<float> l = {0.3f, 2.0f, -0.5f, 1.7f, 1.1f, -2.0f,
                          0.9f, 1.4f, -1.0f, 0.0f, 1.9f, 0.6f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 8;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  p.seed = 1234;
  std::vector<TokenProb> dist = filtered_distribution(l, p);
  ASSERT_GE(dist.size(), 4u);
  const int64_t n = 60000;
  std::map<int32_t, int64_t> counts;
  for (int64_t pos = 0; pos < n; ++pos) ++counts[sample_token(l, p, pos, kNone, kNone)];
  for (const auto& [token, count] : counts) {
    EXPECT_TRUE(std::any_of(dist.begin(), dist.end(), [&](auto& t) { return t.token == token; }))
        << "token " << token << " was filtered out but sampled " << count << " times";
  }
  const double dof = static_cast<double>(dist.size() - 1);
  // Mean dof, sd sqrt(2 dof): this bound is ~6 sd out (p < 1e-6 for a correct sampler).
  const double bound = dof + 6.0 * std::sqrt(2.0 * dof);
  EXPECT_LT(chi_square(counts, dist, n), bound);
  // The statistic has power: the same counts are far from the unfiltered T = 1 softmax.
  std::vector<TokenProb> unfiltered = filtered_distribution(l, SamplingParams{});
  EXPECT_GT(chi_square(counts, unfiltered, n), 100 * bound);
}

TEST(Sampler, TiesAreOrderedByTokenId) {
  // Four equal logits: the inverse CDF over canonical order maps u in [k/4, (k+1)/4) to token k.
  std::vector<float> l = {0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.seed = 5;
  for (int64_t pos = 0; pos < 200; ++pos) {
    float u = sampling_uniform(p.seed, pos);
    EXPECT_EQ(sample_token(l, p, pos, kNone, kNone), static_cast<int32_t>(u * 4.0f));
  }
}

TEST(Sampler, SameSeedAndPositionGiveSameTokenAndDifferentPositionsVary) {
  std::vector<float> l(64, 0.0f);
  SamplingParams p;
  p.seed = 77;
  std::map<int32_t, int> seen;
  for (int64_t pos = 0; pos < 200; ++pos) {
    int32_t t = sample_token(l, p, pos, kNone, kNone);
    EXPECT_EQ(t, sample_token(l, p, pos, kNone, kNone));
    ++seen[t];
  }
  EXPECT_GT(seen.size(), 40u);
  SamplingParams other = p;
  other.seed = 78;
  int same = 0;
  for (int64_t pos = 0; pos < 200; ++pos) {
    same += sample_token(l, p, pos, kNone, kNone) == sample_token(l, other, pos, kNone, kNone);
  }
  EXPECT_LT(same, 20);
}

// ---- logprobs -----------------------------------------------------------------------------------

TEST(Logprobs, RawModeReportsLogSoftmaxOfModelLogits) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.top_k = 1;               // filters do not change raw logprobs
  p.repetition_penalty = 3;  // nor do penalties
  p.top_logprobs = 3;
  std::vector<int32_t> out = {1};
  double z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  SampleResult r = sample(l, p, 0, kNone, out);
  EXPECT_EQ(r.token, 3);  // token 1 was penalised to 1.0
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);
  EXPECT_EQ(r.top_logprobs[1].token, 3);
  EXPECT_EQ(r.top_logprobs[2].token, 2);
  EXPECT_NEAR(r.top_logprobs[2].logprob, 2.0 - z, 1e-6);
  p.top_logprobs = 0;
  EXPECT_TRUE(sample(l, p, 0, kNone, out).top_logprobs.empty());
}

TEST(Logprobs, ProcessedModeReportsTheSampledDistribution) {
  std::vector<float> l = logs_of({0.1, 0.4, 0.3, 0.2});
  SamplingParams p;
  p.top_k = 2;
  p.top_logprobs = 5;
  p.logprob_mode = LogprobMode::kProcessed;
  for (int64_t pos = 0; pos < 20; ++pos) {
    SampleResult r = sample(l, p, pos, kNone, kNone);
    ASSERT_TRUE(r.token == 1 || r.token == 2);
    EXPECT_NEAR(r.logprob, std::log(r.token == 1 ? 4.0 / 7 : 3.0 / 7), 1e-6);
    ASSERT_EQ(r.top_logprobs.size(), 2u);  // only kept tokens have a finite logprob
    EXPECT_EQ(r.top_logprobs[0].token, 1);
    EXPECT_NEAR(r.top_logprobs[1].logprob, std::log(3.0 / 7), 1e-6);
  }
  p.temperature = 0.0f;
  SampleResult g = sample(l, p, 0, kNone, kNone);
  EXPECT_EQ(g.token, 1);
  EXPECT_EQ(g.logprob, 0.0f);
}

// ---- batches ------------------------------------------------------------------------------------

TEST(SampleBatch, RowResultDoesNotDependOnBatchCompositionOrOrder) {
  const int64_t vocab = 1000, num_rows = 24;
  std::vector<float> logits(static_cast<size_t>(vocab * num_rows));
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = 3.0f * (sampling_uniform(9, static_cast<int64_t>(i), 3) - 0.5f);
  }
  std::vector<SamplingParams> params(num_rows);
  std::vector<std::vector<int32_t>> histories(num_rows);
  std::vector<SamplingRow> rows(num_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    SamplingParams& p = params[static_cast<size_t>(r)];
    p.seed = 1000 + static_cast<uint64_t>(r % 5);
    p.temperature = r % 6 == 0 ? 0.0f : 0.5f + 0.1f * static_cast<float>(r % 7);
    p.top_k = r % 3 == 0 ? 50 : -1;
    p.top_p = r % 4 == 0 ? 0.9f : 1.0f;
    p.repetition_penalty = r % 5 == 0 ? 1.3f : 1.0f;
    p.top_logprobs = 2;
    histories[static_cast<size_t>(r)] = {static_cast<int32_t>(r), static_cast<int32_t>(r * 7)};
    rows[static_cast<size_t>(r)] = {&p, 100 + r, histories[static_cast<size_t>(r)], {}};
  }
  std::vector<SampleResult> batch = sample_batch(logits, vocab, rows);

  // Alone, one row at a time.
  for (int64_t r = 0; r < num_rows; ++r) {
    auto row = std::span<const float>(logits).subspan(static_cast<size_t>(r * vocab),
                                                      static_cast<size_t>(vocab));
    const SamplingRow& sr = rows[static_cast<size_t>(r)];
    SampleResult alone = sample(row, *sr.params, sr.position, sr.prompt_ids, sr.output_ids);
    EXPECT_EQ(alone.token, batch[static_cast<size_t>(r)].token) << "row " << r;
    EXPECT_EQ(alone.logprob, batch[static_cast<size_t>(r)].logprob) << "row " << r;
  }
  // Reversed row order.
  std::vector<float> rev_logits(logits.size());
  std::vector<SamplingRow> rev_rows(rows.rbegin(), rows.rend());
  for (int64_t r = 0; r < num_rows; ++r) {
    std::copy_n(logits.begin() + (num_rows - 1 - r) * vocab, vocab, rev_logits.begin() + r * vocab);
  }
  std::vector<SampleResult> rev = sample_batch(rev_logits, vocab, rev_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    EXPECT_EQ(rev[static_cast<size_t>(num_rows - 1 - r)].token,
              batch[static_cast<size_t>(r)].token);
  }
  // Not all rows agree (the test would be vacuous if every row picked the same token).
  int32_t first = batch[1].token;
  EXPECT_TRUE(std::any_of(batch.begin(), batch.end(), [&](auto& b) { return b.token != first; }));
}

TEST(SampleBatch, ChecksShapesAndRethrowsRowErrors) {
  std::vector<float> logits(8, 0.0f);
  SamplingParams p;
  std::vector<int32_t> bad = {99};
  p.repetition_penalty = 1.1f;
  std::vector<SamplingRow> rows = {{&p, 0, {}, {}}, {&p, 0, bad, {}}};
  EXPECT_THROW(sample_batch(logits, 4, rows), Error);
  EXPECT_THROW(sample_batch(logits, 3, rows), Error);
}

}  // namespace
}  // namespace di::sampling
