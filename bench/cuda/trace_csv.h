#pragma once
// The CSV of a recorded kernel timeline (kernels/trace.h, a -DDI_TRACE=1 build), times in ns from
// the first recorded CTA start; scripts/trace_layers.py reads it. Shared by bench_cuda_model
// --trace and bench_cuda_moe --trace.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/kernels/trace.h"

namespace di::bench {

inline void write_trace_csv(const std::string& path, const std::vector<cuda::TraceEvent>& ev) {
  uint64_t t0 = UINT64_MAX;
  for (const auto& e : ev) t0 = std::min<uint64_t>(t0, e.t_start);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::printf("[trace] cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "site,tag,cta,smid,start_ns,wait_ns,end_ns,mark_ns\n");
  for (const auto& e : ev) {
    const auto rel = [&](uint64_t t) { return t == 0 ? -1ll : static_cast<long long>(t - t0); };
    std::fprintf(f, "%u,%u,%u,%u,%lld,%lld,%lld,%lld\n", e.site, e.tag, e.cta, e.smid,
                 rel(e.t_start), rel(e.t_wait), rel(e.t_end), rel(e.t_mark));
  }
  std::fclose(f);
  std::printf("[trace] %zu CTA events -> %s\n", ev.size(), path.c_str());
}

}  // namespace di::bench
