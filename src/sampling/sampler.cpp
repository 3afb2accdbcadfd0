#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "sampling/philox.h"

namespace di::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Candidate {
  float logit;
  int32_t token;
};

// Canonical order: larger logit first, lower token id first on ties.
bool canonical_less(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

bool usable(float x) {
  return !std::isnan(x) && x != kNegInf;
}

void check_ids(std::span<const int32_t> ids, size_t vocab, const char* what) {
  for (int32_t id : ids) {
    DI_CHECK(id >= 0 && static_cast<size_t>(id) < vocab, "{} token id {} is outside [0, {})", what,
             id, vocab);
  }
}

// The first index of the largest usable logit. Two passes over the row, each without a
// data-dependent branch: the maximum in 16 independent lanes (NaN never compares greater, -inf
// never beats the -inf start), then the first index holding it. About twice as fast as one
// branchy pass on a 129K vocabulary (greedy decode samples every row every step).
int32_t argmax(std::span<const float> logits) {
  constexpr size_t kLanes = 16;
  const size_t n = logits.size();
  const float* x = logits.data();
  float lane_max[kLanes];
  std::fill_n(lane_max, kLanes, kNegInf);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lane_max[k] = x[i + k] > lane_max[k] ? x[i + k] : lane_max[k];
  }
  float best = kNegInf;
  for (size_t k = 0; k < kLanes; ++k) best = lane_max[k] > best ? lane_max[k] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  DI_CHECK(best != kNegInf, "every one of the {} logits is -inf or NaN", n);
  for (size_t j = 0; j < n; ++j) {
    if (x[j] == best) return static_cast<int32_t>(j);
  }
  DI_FAIL("argmax: the maximum {} vanished from its row", best);
}

// The n most likely tokens of `logits` under log_softmax, canonical order.
std::vector<TokenLogprob> raw_top_logprobs(std::span<const float> logits, double log_z, int32_t n) {
  std::vector<Candidate> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (usable(logits[i])) c.push_back({logits[i], static_cast<int32_t>(i)});
  }
  size_t k = std::min(c.size(), static_cast<size_t>(n));
  std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), canonical_less);
  std::vector<TokenLogprob> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    out.push_back({c[i].token, static_cast<float>(static_cast<double>(c[i].logit) - log_z)});
  }
  return out;
}

double log_sum_exp(std::span<const float> logits) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) {
    if (usable(x)) m = std::max(m, static_cast<double>(x));
  }
  double s = 0.0;
  for (float x : logits) {
    if (usable(x)) s += std::exp(static_cast<double>(x) - m);
  }
  return m + std::log(s);
}

}  // namespace

void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids) {
  if (!params.has_penalties()) return;
  const size_t vocab = logits.size();
  check_ids(prompt_ids, vocab, "prompt");
  check_ids(output_ids, vocab, "output");
  // counts[t] = occurrences of t in the output; seen[t] = t occurs in prompt or output.
  std::vector<int32_t> counts(vocab, 0);
  std::vector<uint8_t> seen(vocab, 0);
  for (int32_t id : prompt_ids) seen[static_cast<size_t>(id)] = 1;
  for (int32_t id : output_ids) {
    seen[static_cast<size_t>(id)] = 1;
    ++counts[static_cast<size_t>(id)];
  }
  const float rp = params.repetition_penalty;
  for (size_t t = 0; t < vocab; ++t) {
    if (!seen[t]) continue;
    float& l = logits[t];
    if (rp != 1.0f) l = l > 0.0f ? l / rp : l * rp;
    if (counts[t] > 0) {
      l -= params.frequency_penalty * static_cast<float>(counts[t]) + params.presence_penalty;
    }
  }
}

std::vector<TokenProb> filtered_distribution(std::span<const float> logits,
                                             const SamplingParams& params) {
  DI_CHECK(params.temperature > 0.0f, "filtered_distribution needs temperature > 0, got {}",
           params.temperature);
  std::vector<Candidate> c;
  c.reserve(logits.size());
  float max_logit = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!usable(logits[i])) continue;
    c.push_back({logits[i], static_cast<int32_t>(i)});
    max_logit = std::max(max_logit, logits[i]);
  }
  DI_CHECK(!c.empty(), "every one of the {} logits is -inf or NaN", logits.size());
  const double inv_t = 1.0 / static_cast<double>(params.temperature);
  auto weight = [&](float l) {  // exp((l - max) / T): 1 for the top token
    return std::exp((static_cast<double>(l) - static_cast<double>(max_logit)) * inv_t);
  };

  // Every filter keeps a prefix of the canonical order, so sort (a prefix) once. min-p can prune
  // before sorting only when top-p does not need the mass of the tokens it would drop.
  if (params.top_p >= 1.0f && params.min_p > 0.0f) {
    const double floor = static_cast<double>(params.min_p);
    std::erase_if(c, [&](const Candidate& x) { return weight(x.logit) < floor; });
  }
  size_t keep = c.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = static_cast<size_t>(params.top_k);
    std::partial_sort(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(keep), c.end(),
                      canonical_less);
    c.resize(keep);
  } else {
    std::sort(c.begin(), c.end(), canonical_less);
  }

  std::vector<double> w(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    w[i] = weight(c[i].logit);
    total += w[i];
  }
  if (params.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (HF TopPLogitsWarper keeps the same set).
    const double target = static_cast<double>(params.top_p) * total;
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += w[n++];
      if (cum >= target) break;
    }
    keep = n;
  }
  if (params.min_p > 0.0f) {
    const double floor = static_cast<double>(params.min_p);  // times p_max, whose weight is 1
    size_t n = 1;
    while (n < keep && w[n] >= floor) ++n;
    keep = n;
  }
  total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += w[i];
  std::vector<TokenProb> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {c[i].token, w[i] / total};
  return out;
}

SampleResult sample(std::span<const float> logits, const SamplingParams& params, int64_t position,
                    std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids) {
  DI_CHECK(!logits.empty(), "sample() needs at least one logit");
  std::vector<float> penalized;
  std::span<const float> work = logits;
  if (params.has_penalties()) {
    penalized.assign(logits.begin(), logits.end());
    apply_penalties(penalized, params, prompt_ids, output_ids);
    work = penalized;
  }

  SampleResult result;
  const bool processed = params.logprob_mode == LogprobMode::kProcessed;
  if (params.is_greedy()) {
    result.token = argmax(work);
    // Greedy samples from a point mass: its processed log-probability is 0.
    if (processed) {
      result.logprob = 0.0f;
      if (params.top_logprobs > 0) result.top_logprobs.push_back({result.token, 0.0f});
    }
  } else {
    std::vector<TokenProb> dist = filtered_distribution(work, params);
    const double u = static_cast<double>(sampling_uniform(params.seed, position));
    // Inverse CDF: the first token whose cumulative probability exceeds u. The last kept token
    // absorbs any rounding shortfall of the cumulative sum.
    size_t chosen = dist.size() - 1;
    double cum = 0.0;
    for (size_t i = 0; i < dist.size(); ++i) {
      cum += dist[i].prob;
      if (u < cum) {
        chosen = i;
        break;
      }
    }
    result.token = dist[chosen].token;
    if (processed) {
      result.logprob = static_cast<float>(std::log(dist[chosen].prob));
      size_t n = std::min(dist.size(), static_cast<size_t>(params.top_logprobs));
      for (size_t i = 0; i < n; ++i) {
        result.top_logprobs.push_back({dist[i].token, static_cast<float>(std::log(dist[i].prob))});
      }
    }
  }
  if (!processed) {
    const double log_z = log_sum_exp(logits);
    result.logprob =
        static_cast<float>(static_cast<double>(logits[static_cast<size_t>(result.token)]) - log_z);
    if (params.top_logprobs > 0) {
      result.top_logprobs = raw_top_logprobs(logits, log_z, params.top_logprobs);
    }
  }
  return result;
}

std::vector<SampleResult> sample_batch(std::span<const float> logits, int64_t vocab_size,
                                       std::span<const SamplingRow> rows, ThreadPool* pool) {
  const auto num_rows = static_cast<int64_t>(rows.size());
  DI_CHECK(vocab_size > 0 && static_cast<int64_t>(logits.size()) == num_rows * vocab_size,
           "sample_batch: {} logits for {} rows of vocab {}", logits.size(), num_rows, vocab_size);
  for (int64_t r = 0; r < num_rows; ++r) {
    DI_CHECK(rows[static_cast<size_t>(r)].params != nullptr, "sample_batch: row {} has no params",
             r);
  }
  std::vector<SampleResult> out(rows.size());
  // Workers must not throw: errors are carried back and the first (by row) is rethrown here.
  std::vector<std::exception_ptr> errors(rows.size());
  (pool != nullptr ? *pool : ThreadPool::global()).parallel_for(num_rows, 1, [&](int64_t begin,
                                                                               int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const auto i = static_cast<size_t>(r);
      try {
        auto row_logits =
            logits.subspan(i * static_cast<size_t>(vocab_size), static_cast<size_t>(vocab_size));
        out[i] = sample(row_logits, *rows[i].params, rows[i].position, rows[i].prompt_ids,
                        rows[i].output_ids);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  });
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

}  // namespace di::sampling
