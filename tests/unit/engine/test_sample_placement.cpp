// Which rows force a step onto the host sampler (engine/sample_placement.h): penalties and
// logprobs do, plain greedy / temperature / top-k / top-p / min-p do not; the switch and the
// backend come first; a single host-only row sends the whole step to the host.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/sample_placement.h"

namespace di {
namespace {

using sampling::LogprobMode;
using sampling::SamplingParams;

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams seeded(float t, int32_t top_k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

TEST(SamplePlacement, RowsTheDeviceSamplerDrawsExactly) {
  const std::vector<SamplingParams> device_rows{
      greedy(),
      SamplingParams{},  // temperature 1, no filters
      seeded(0.7f, 40, 1.0f, 0.0f, 1),
      seeded(1.3f, -1, 0.9f, 0.0f, 2),
      seeded(0.5f, 0, 1.0f, 0.05f, 3),
      seeded(1.0f, 5, 0.8f, 0.1f, 4),
  };
  for (size_t i = 0; i < device_rows.size(); ++i) {
    EXPECT_EQ(row_needs_host(device_rows[i], false), HostSampling::kNone) << "row " << i;
  }
  // The logprob mode alone changes nothing: it only matters when logprobs are reported.
  SamplingParams processed = greedy();
  processed.logprob_mode = LogprobMode::kProcessed;
  EXPECT_EQ(row_needs_host(processed, false), HostSampling::kNone);
}

TEST(SamplePlacement, PenaltiesAndLogprobsNeedTheHost) {
  SamplingParams rep = greedy();
  rep.repetition_penalty = 1.1f;
  SamplingParams freq = seeded(0.8f, 10, 1.0f, 0.0f, 7);
  freq.frequency_penalty = 0.5f;
  SamplingParams pres = greedy();
  pres.presence_penalty = -0.5f;
  EXPECT_EQ(row_needs_host(rep, false), HostSampling::kPenalties);
  EXPECT_EQ(row_needs_host(freq, false), HostSampling::kPenalties);
  EXPECT_EQ(row_needs_host(pres, false), HostSampling::kPenalties);

  EXPECT_EQ(row_needs_host(greedy(), true), HostSampling::kLogprobs);  // EngineRequest::logprobs
  SamplingParams top = seeded(1.0f, -1, 0.95f, 0.0f, 9);
  top.top_logprobs = 3;  // implies logprobs
  EXPECT_EQ(row_needs_host(top, false), HostSampling::kLogprobs);
  top.top_logprobs = 1;
  EXPECT_EQ(row_needs_host(top, false), HostSampling::kLogprobs);
  // Both: penalties are named first.
  rep.top_logprobs = 2;
  EXPECT_EQ(row_needs_host(rep, true), HostSampling::kPenalties);
}

TEST(SamplePlacement, OneHostRowSendsTheWholeStepToTheHost) {
  SamplePlacement all_device(true, true);
  for (int i = 0; i < 17; ++i) all_device.add_row(seeded(0.9f, 20, 0.9f, 0.0f, i), false);
  all_device.add_row(greedy(), false);
  EXPECT_TRUE(all_device.on_device());
  EXPECT_EQ(all_device.reason(), HostSampling::kNone);
  EXPECT_EQ(all_device.num_rows(), 18);

  SamplePlacement one_logprobs(true, true);
  one_logprobs.add_row(greedy(), false);
  one_logprobs.add_row(greedy(), true);
  one_logprobs.add_row(greedy(), false);
  EXPECT_FALSE(one_logprobs.on_device());
  EXPECT_EQ(one_logprobs.reason(), HostSampling::kLogprobs);

  SamplingParams pen = greedy();
  pen.frequency_penalty = 1.0f;
  SamplePlacement first_wins(true, true);
  first_wins.add_row(greedy(), false);
  first_wins.add_row(pen, false);
  first_wins.add_row(greedy(), true);  // later rows do not overwrite the first reason
  EXPECT_EQ(first_wins.reason(), HostSampling::kPenalties);
  EXPECT_EQ(first_wins.num_rows(), 3);
}

TEST(SamplePlacement, SwitchBackendAndEmptyStepsComeFirst) {
  SamplePlacement off(false, true);
  off.add_row(greedy(), false);
  EXPECT_EQ(off.reason(), HostSampling::kDisabled);
  SamplePlacement cpu(true, false);  // the CPU backend
  cpu.add_row(greedy(), false);
  EXPECT_EQ(cpu.reason(), HostSampling::kBackend);
  SamplePlacement off_cpu(false, false);
  EXPECT_EQ(off_cpu.reason(), HostSampling::kDisabled);
  SamplingParams pen = greedy();
  pen.repetition_penalty = 2.0f;
  SamplePlacement cpu_pen(true, false);
  cpu_pen.add_row(pen, false);
  EXPECT_EQ(cpu_pen.reason(), HostSampling::kBackend);
  // A step that samples nothing (prefill chunks only) has nothing to put on the device.
  SamplePlacement none(true, true);
  EXPECT_FALSE(none.on_device());
  EXPECT_EQ(none.reason(), HostSampling::kNoRows);
  EXPECT_STREQ(host_sampling_name(none.reason()), "no_rows");
  EXPECT_STREQ(host_sampling_name(HostSampling::kLogprobs), "logprobs");
}

TEST(SamplePlacement, DeviceRowCarriesTheDrawingFields) {
  const SamplingParams p = seeded(0.6f, 12, 0.85f, 0.02f, 0xDEADBEEFCAFEull);
  const DeviceSampleRow r = device_sample_row(p, 1234567);
  EXPECT_EQ(r.temperature, 0.6f);
  EXPECT_EQ(r.top_k, 12);
  EXPECT_EQ(r.top_p, 0.85f);
  EXPECT_EQ(r.min_p, 0.02f);
  EXPECT_EQ(r.seed, 0xDEADBEEFCAFEull);
  EXPECT_EQ(r.position, 1234567);
}

TEST(SamplePlacement, EnvironmentSwitch) {
  const char* saved = std::getenv("DEEPINFER_GPU_SAMPLING");
  const std::string old = saved != nullptr ? saved : "";
  ::unsetenv("DEEPINFER_GPU_SAMPLING");
  EXPECT_TRUE(device_sampling_allowed_by_env());
  ::setenv("DEEPINFER_GPU_SAMPLING", "0", 1);
  EXPECT_FALSE(device_sampling_allowed_by_env());
  ::setenv("DEEPINFER_GPU_SAMPLING", "1", 1);
  EXPECT_TRUE(device_sampling_allowed_by_env());
  if (saved != nullptr) {
    ::setenv("DEEPINFER_GPU_SAMPLING", old.c_str(), 1);
  } else {
    ::unsetenv("DEEPINFER_GPU_SAMPLING");
  }
}

}  // namespace
}  // namespace di
