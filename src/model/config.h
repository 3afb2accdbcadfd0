#pragma once
// ModelConfig: what the engine needs from a Hugging Face `config.json`, for the five supported
// architectures. Field names follow the HF configs; absent optional fields take HF's defaults.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace di {

enum class Arch { kLlama, kQwen3, kQwen3Moe, kDeepseekV2, kDeepseekV3 };
const char* arch_name(Arch a);  // the HF architectures[] string

struct RopeConfig {
  enum class Type { kDefault, kLinear, kLlama3, kYarn };
  Type type = Type::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::optional<int64_t> original_max_position_embeddings;
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
  bool truncate = true;
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string hidden_act = "silu";
  RopeConfig rope;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::string torch_dtype = "float32";

  // Mixture of experts (Qwen3-MoE, DeepSeek).
  int64_t num_experts = 0;  // n_routed_experts / num_experts; 0 = dense
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;            // Qwen3-MoE
  std::vector<int64_t> mlp_only_layers;       // Qwen3-MoE
  int64_t n_shared_experts = 0;               // DeepSeek
  int64_t first_k_dense_replace = 0;          // DeepSeek
  int64_t moe_layer_freq = 1;                 // DeepSeek
  double routed_scaling_factor = 1.0;         // DeepSeek
  std::string scoring_func = "softmax";       // DeepSeek: softmax (V2) or sigmoid (V3)
  std::string topk_method = "greedy";         // greedy | group_limited_greedy | noaux_tc
  int64_t n_group = 1;
  int64_t topk_group = 1;

  // Multi-head latent attention (DeepSeek).
  int64_t q_lora_rank = 0;  // 0 = no q compression (q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;  // DeepSeek V3: rope on interleaved pairs (V2 always is)
  int64_t num_nextn_predict_layers = 0;

  // FP8 block-scaled weights (DeepSeek): quantization_config.weight_block_size.
  bool fp8_weights = false;
  int64_t fp8_block_n = 128;
  int64_t fp8_block_k = 128;

  bool is_mla() const { return arch == Arch::kDeepseekV2 || arch == Arch::kDeepseekV3; }
  bool is_moe_layer(int64_t layer) const;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Softmax scale of attention (includes DeepSeek's YaRN mscale² where HF applies it).
  double attention_scale() const;
};

// Parses config.json text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace di
