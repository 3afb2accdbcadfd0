#pragma once
// When each request of an open-loop load is released.
//
// Inter-arrival gaps are Gamma(shape = burstiness, scale = 1 / (rate * burstiness)): mean 1/rate
// for every burstiness; burstiness 1 is exactly exponential, i.e. a Poisson process; < 1 is
// burstier, > 1 more regular. Same seed, same schedule.
#include <cstdint>
#include <vector>

namespace di::bench {

// Release offsets in seconds from the benchmark start: t[0] = 0 and t[i] = t[i-1] + gap_i.
// rate <= 0 or infinite means "all at once": every offset is 0.
std::vector<double> arrival_offsets(int64_t num_requests, double rate, uint64_t seed,
                                    double burstiness = 1.0);

}  // namespace di::bench
