#pragma once
// `deepinfer bench engine`: offline throughput and latency of the engine core, no HTTP.
//
// For each batch size B, B requests of --input-len random token ids (no shared prefixes) and
// --output-len new tokens run as one continuous batch through Generator (engine/generator.h):
//
//   prefill run  max_tokens = 1: one forward over all B prompts + one sample      → t_prefill
//   full run     max_tokens = output_len: the prefill step + (output_len - 1) decode steps → t_full
//
//   prefill tok/s     = B * input_len / t_prefill
//   decode step (ms)  = (t_full - t_prefill) / (output_len - 1)     one token for each of B rows
//   decode tok/s      = B * (output_len - 1) / (t_full - t_prefill)
//   total tok/s       = B * (input_len + output_len) / t_full
//
// Each time is the median of --iters runs after --warmup-iters unrecorded ones.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace di::bench {

struct EngineBenchOptions {
  std::string model_dir;  // "" = the shipped demo model
  std::string backend = "cpu";
  int32_t input_len = 512;
  int32_t output_len = 128;
  std::vector<int32_t> batch_sizes = {1};
  int32_t iters = 3;
  int32_t warmup_iters = 1;
  int32_t block_size = 64;
  int32_t prefill_chunk = 0;  // 0 = whole prompts in one step
  uint64_t seed = 0;
  std::string result_json;
};

struct EngineBenchPoint {
  int32_t batch_size = 0;
  double prefill_s = 0;  // median t_prefill
  double full_s = 0;     // median t_full
  double prefill_tok_s = 0;
  double decode_tok_s = 0;
  double decode_step_ms = 0;
  double total_tok_s = 0;
};

// The derived numbers from measured times (separate for testing).
EngineBenchPoint engine_point(int32_t batch_size, int32_t input_len, int32_t output_len,
                              double prefill_s, double full_s);

nlohmann::json run_engine_bench(const EngineBenchOptions& options);
std::string format_engine_table(const nlohmann::json& results);

}  // namespace di::bench
