#pragma once
// Generator: offline batched generation over the paged KV cache — the engine core that
// `deepinfer generate` and the golden tests drive. Each step runs one forward over every active
// sequence's new tokens (a prefill chunk or one decode token), then samples.
//
// Blocks come from a simple free list here; the serving engine (engine loop + kv/ manager) owns
// allocation, prefix caching and preemption.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace di {

class EplbRuntime;  // engine/eplb_runtime.h

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 16;
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;
};

struct GenerateResult {
  std::vector<int32_t> output;
  std::vector<float> last_prompt_logits;  // logits at the last prompt position
  std::vector<std::vector<float>> step_logits;  // logits of each sampled position, if kept
};

struct GeneratorOptions {
  int32_t block_size = 64;
  int32_t num_blocks = 0;          // 0 = enough for the requests given
  int32_t prefill_chunk = 0;       // 0 = whole prompt in one step; else tokens per chunk
  bool keep_step_logits = false;
  // EPLB (issue #8): when set, every step is reported to it (begin_step/end_step), so routing is
  // counted and rebalances happen between steps. Not owned.
  EplbRuntime* eplb = nullptr;
};

class Generator {
 public:
  Generator(Model& model, Backend& backend, GeneratorOptions options);

  // Runs all requests together in one continuous batch until each is done.
  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests);

 private:
  Model& model_;
  Backend& backend_;
  GeneratorOptions options_;
};

}  // namespace di
