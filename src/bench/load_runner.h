#pragma once
// The load generator: sends a dataset's requests with a concurrency cap and/or an open-loop
// arrival rate, keeping each session's turns in order (SessionQueue).
//
//   W worker threads (W = --concurrency, or min(requests, 1024) when uncapped), each looping:
//     claim the next release slot k → sleep until arrival_offsets[k] → take a ready request
//     → stream it → record
//   so at most W requests are in flight and the k-th request is released no earlier than t_k.
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "bench/dataset.h"
#include "bench/openai_client.h"
#include "bench/request_record.h"

namespace di::bench {

struct LoadOptions {
  int32_t concurrency = 0;  // 0 = no cap
  double request_rate = 0;  // req/s; 0 or inf = release everything at once
  double burstiness = 1.0;  // gamma shape of the gaps; 1 = Poisson
  uint64_t seed = 0;
  bool progress = true;  // progress bar on stderr
  std::string progress_label = "bench";
};

struct LoadResult {
  std::vector<RequestRecord> records;  // in dataset order
  double duration_s = 0;               // first release to last response end
};

// `count_tokens` re-tokenizes output text when the server reports no usage (may be empty).
LoadResult run_load(const Dataset& dataset, const ClientOptions& client, const LoadOptions& load,
                    const std::function<int32_t(const std::string&)>& count_tokens);

}  // namespace di::bench
