#pragma once
// Random-weight models in Hugging Face layout (config.json, generation_config.json, safetensors
// shards + index), for tests (tiny, small) and benchmarks (real shapes) without downloading
// checkpoints. `deepinfer make-model` is the command-line front end.
//
// Architectures and their presets:
//   llama        tiny, small, llama3-8b              (LlamaForCausalLM)
//   qwen3        tiny, small                         (Qwen3ForCausalLM)
//   qwen3_moe    tiny, small, qwen3-30b-a3b          (Qwen3MoeForCausalLM)
//   deepseek_v2  tiny, small, deepseek-v2-lite       (DeepseekV2ForCausalLM)
//   deepseek_v3  tiny, small, deepseek-v3-fp8-small  (DeepseekV3ForCausalLM)
//
// Values: element i of a tensor is mean + std * N(0,1), the normal drawn by Box-Muller from a
// counter-based hash of (seed, tensor, i / 2) — independent of shard size, chunking and thread
// count. Scales keep a random network well-conditioned at any depth:
//   linear projections      std 1/sqrt(fan_in)     each sublayer adds O(1) to the residual
//   embed_tokens (untied)   std 1                  the residual starts at O(1)
//   lm_head                 std 1/sqrt(hidden)     logits ~ N(0, 1): neither flat nor one-hot
//   tied embedding          std hidden^-1/4        a compromise between the two roles
//   RMSNorm weights         1 + N(0, 0.1)          a skipped norm weight is visible in outputs
//   router gate             std 1/sqrt(hidden)
//   e_score_correction_bias N(0, 0.05), f32        large enough to change some expert choices
// DeepSeek FP8 (fp8 presets or `fp8` option): linear weights except the router gate, lm_head and
// the MTP eh_proj are e4m3 with one f32 `weight_scale_inv` per 128x128 block (amax / 448), as in
// DeepSeek-V3's checkpoints; embeddings and norms keep the chosen dtype.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tensor/tensor.h"

namespace di::model {

// The shape of one model, in the vocabulary of HF config.json.
struct ModelSpec {
  std::string arch;    // llama | qwen3 | qwen3_moe | deepseek_v2 | deepseek_v3
  std::string preset;  // tiny | small | llama3-8b | ...
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // llama / qwen3
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  nlohmann::ordered_json rope_scaling;  // null or the HF object
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  // Mixture of experts (qwen3_moe, deepseek_*); num_experts == 0 means dense.
  int64_t num_experts = 0;  // HF: num_experts (qwen3_moe) / n_routed_experts (deepseek)
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;       // qwen3_moe
  std::vector<int64_t> mlp_only_layers;  // qwen3_moe
  int64_t n_shared_experts = 0;          // deepseek
  int64_t first_k_dense_replace = 0;     // deepseek
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::string topk_method;   // greedy | group_limited_greedy | noaux_tc
  std::string scoring_func;  // softmax | sigmoid

  // Multi-head latent attention (deepseek_*).
  int64_t q_lora_rank = 0;  // 0: no q compression (HF null), q_proj instead of q_a/q_b
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t num_nextn_predict_layers = 0;  // deepseek_v3 MTP

  bool fp8 = false;  // DeepSeek block-scaled FP8 linear weights

  bool is_deepseek() const { return arch == "deepseek_v2" || arch == "deepseek_v3"; }
  // Whether decoder layer `layer_idx` (MTP layers included) has a sparse MoE block.
  bool is_moe_layer(int64_t layer_idx) const;
};

const std::vector<std::string>& supported_archs();
// The presets `arch` allows (empty for an unknown arch).
std::vector<std::string> presets_for(std::string_view arch);
// kInvalidArgument, listing what is allowed, for an unknown arch or preset.
Result<ModelSpec> model_spec(std::string_view arch, std::string_view preset);

// One tensor to write: how to fill it and where it goes.
struct TensorPlan {
  enum class Kind : uint8_t {
    kValues,       // mean + std * N(0,1), stored in `dtype`
    kFp8Weight,    // std * N(0,1) quantised to e4m3 with 128x128 block scales
    kFp8ScaleInv,  // the f32 block scales of the kFp8Weight right before it
  };
  std::string name;
  DType dtype;
  Shape shape;
  Kind kind = Kind::kValues;
  float mean = 0.0f;
  float std = 0.0f;
  // The generator stream: the tensor's own name, or that of the tensor it duplicates (DeepSeek's
  // MTP layer stores copies of embed_tokens and lm_head).
  std::string rng_name;
};

inline constexpr int64_t kFp8BlockSize = 128;

// Every tensor of the checkpoint in file order; `dtype` is the storage type of non-FP8 tensors.
std::vector<TensorPlan> plan_tensors(const ModelSpec& spec, DType dtype);
nlohmann::ordered_json hf_config(const ModelSpec& spec, DType dtype);
nlohmann::ordered_json hf_generation_config(const ModelSpec& spec);

struct MakeModelOptions {
  std::string arch;
  std::string preset;
  std::filesystem::path out_dir;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // bf16 or f32
  bool fp8 = false;            // force DeepSeek FP8 linear weights (implied by *-fp8-* presets)
  uint64_t max_shard_bytes = 4'000'000'000;  // a single tensor larger than this gets its own shard
  bool dry_run = false;                      // plan and report; write nothing
  bool config_only = false;  // write config.json + generation_config.json, no weights (serve --random-weights)
  int64_t vocab_size = 0;    // > 0: replaces the preset's (to match a tokenizer we have)
  int64_t q_lora_rank = -1;  // >= 0: replaces a DeepSeek preset's (tests of weight layouts)
  bool progress = true;                      // a progress bar on stderr for writes over 256 MB
};

struct ShardReport {
  std::string file;
  int64_t num_tensors = 0;
  uint64_t data_bytes = 0;
};

struct MakeModelReport {
  ModelSpec spec;
  int64_t num_tensors = 0;
  int64_t num_params = 0;
  uint64_t data_bytes = 0;  // sum of tensor sizes (index.json "total_size")
  std::vector<ShardReport> shards;
  double seconds = 0.0;
};

// Writes the model into options.out_dir (created if needed; our own files from an earlier run are
// replaced, shards are written as *.tmp and renamed when complete). Throws di::Error on invalid
// options or I/O failure.
MakeModelReport make_model(const MakeModelOptions& options);

std::string format_bytes(uint64_t bytes);  // "1.23 GB" (decimal units)

}  // namespace di::model
