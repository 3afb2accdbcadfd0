#include "bench/arrivals.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace di::bench {

std::vector<double> arrival_offsets(int64_t num_requests, double rate, uint64_t seed,
                                    double burstiness) {
  DI_CHECK(num_requests >= 0, "number of requests must be >= 0, got {}", num_requests);
  DI_CHECK(burstiness > 0, "burstiness must be positive, got {}", burstiness);
  std::vector<double> t(static_cast<size_t>(num_requests), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return t;
  std::mt19937_64 rng(seed);
  // Exponential by inversion (portable across standard libraries); gamma only when asked for.
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  for (size_t i = 1; i < t.size(); ++i) {
    const double gap = burstiness == 1.0 ? -std::log1p(-uniform(rng)) / rate : gamma(rng);
    t[i] = t[i - 1] + gap;
  }
  return t;
}

}  // namespace di::bench
