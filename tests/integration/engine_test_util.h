#pragma once
// Helpers shared by the engine tests (test_engine, test_dp_engine): start an engine, make a
// greedy request.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace di::testing {

// Engine::start, failing the test (non-fatally) with the status when it does not start.
inline std::unique_ptr<Engine> start_engine(const EngineConfig& c) {
  auto r = Engine::start(c);
  if (!r.is_ok()) ADD_FAILURE() << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

// A greedy (temperature 0) request of `max_tokens` new tokens.
inline EngineRequest greedy_request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineRequest r;
  r.id = RequestId(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

}  // namespace di::testing
