#include "model/make_model.h"

#include <fmt/format.h>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <numbers>

#include "core/error.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "model/safetensors_writer.h"

namespace di::model {

// ---- presets ------------------------------------------------------------------------------------

bool ModelSpec::is_moe_layer(int64_t layer_idx) const {
  if (num_experts == 0) return false;
  if (arch == "qwen3_moe") {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer_idx) ==
               mlp_only_layers.end() &&
           (layer_idx + 1) % decoder_sparse_step == 0;
  }
  return layer_idx >= first_k_dense_replace;  // deepseek, moe_layer_freq 1
}

namespace {

using ojson = nlohmann::ordered_json;

const std::map<std::string, std::vector<std::string>, std::less<>>& preset_table() {
  static const std::map<std::string, std::vector<std::string>, std::less<>> table = {
      {"llama", {"tiny", "small", "llama3-8b"}},
      {"qwen3", {"tiny", "small"}},
      {"qwen3_moe", {"tiny", "small", "qwen3-30b-a3b"}},
      {"deepseek_v2", {"tiny", "small", "deepseek-v2-lite"}},
      {"deepseek_v3", {"tiny", "small", "deepseek-v3-fp8-small"}},
  };
  return table;
}

ojson llama3_rope() {
  return {{"factor", 8.0},
          {"high_freq_factor", 4.0},
          {"low_freq_factor", 1.0},
          {"original_max_position_embeddings", 8192},
          {"rope_type", "llama3"}};
}

ojson yarn_rope(double factor, int64_t original_max, double mscale) {
  return {{"beta_fast", 32},
          {"beta_slow", 1},
          {"factor", factor},
          {"mscale", mscale},
          {"mscale_all_dim", mscale},
          {"original_max_position_embeddings", original_max},
          {"type", "yarn"}};
}

ModelSpec llama_spec(std::string_view preset) {
  ModelSpec s;
  s.arch = "llama";
  s.rms_norm_eps = 1e-5;
  s.bos_token_id = 1;
  s.eos_token_id = 2;
  if (preset == "tiny") {
    // 3 query heads sharing 1 KV head; Llama 3 RoPE scaling with its real constants, so all three
    // frequency bands (kept, smoothed, divided by 8) occur in head_dim 32.
    s.vocab_size = 1000, s.hidden_size = 96, s.intermediate_size = 192, s.num_hidden_layers = 2;
    s.num_attention_heads = 3, s.num_key_value_heads = 1, s.head_dim = 32;
    s.rope_theta = 500000.0, s.rope_scaling = llama3_rope(), s.max_position_embeddings = 131072;
  } else if (preset == "small") {
    s.vocab_size = 2048, s.hidden_size = 256, s.intermediate_size = 704, s.num_hidden_layers = 4;
    s.num_attention_heads = 4, s.num_key_value_heads = 2, s.head_dim = 64;
    s.rope_theta = 10000.0, s.max_position_embeddings = 4096;
  } else {  // llama3-8b: meta-llama/Llama-3.1-8B
    s.vocab_size = 128256, s.hidden_size = 4096, s.intermediate_size = 14336;
    s.num_hidden_layers = 32, s.num_attention_heads = 32, s.num_key_value_heads = 8;
    s.head_dim = 128, s.rope_theta = 500000.0, s.rope_scaling = llama3_rope();
    s.max_position_embeddings = 131072, s.bos_token_id = 128000, s.eos_token_id = 128001;
  }
  return s;
}

ModelSpec qwen3_spec(std::string_view arch, std::string_view preset) {
  ModelSpec s;
  s.arch = std::string(arch);
  s.rms_norm_eps = 1e-6, s.rope_theta = 1000000.0, s.max_position_embeddings = 40960;
  s.bos_token_id = 1, s.eos_token_id = 2;
  const bool moe = arch == "qwen3_moe";
  if (preset == "tiny") {
    // head_dim * heads != hidden (160 vs 64), as in every real Qwen3.
    s.vocab_size = 1000, s.hidden_size = 64, s.intermediate_size = moe ? 192 : 160;
    s.num_hidden_layers = 3, s.num_attention_heads = moe ? 3 : 5, s.num_key_value_heads = 1;
    s.head_dim = 32;
    s.tie_word_embeddings = !moe;  // as Qwen3-0.6B; exercises the absent lm_head
    if (moe) {
      s.num_experts = 8, s.num_experts_per_tok = 2, s.moe_intermediate_size = 48;
      s.norm_topk_prob = true, s.mlp_only_layers = {1};
    }
  } else if (preset == "small") {
    s.vocab_size = 2048, s.hidden_size = 256, s.intermediate_size = 768;
    s.num_hidden_layers = 4, s.num_attention_heads = 8, s.num_key_value_heads = 2, s.head_dim = 64;
    if (moe) {
      s.num_experts = 16, s.num_experts_per_tok = 4, s.moe_intermediate_size = 128;
      s.norm_topk_prob = true, s.decoder_sparse_step = 2;  // MoE in layers 1 and 3
    }
  } else {  // qwen3-30b-a3b: Qwen/Qwen3-30B-A3B
    s.vocab_size = 151936, s.hidden_size = 2048, s.intermediate_size = 6144;
    s.num_hidden_layers = 48, s.num_attention_heads = 32, s.num_key_value_heads = 4;
    s.head_dim = 128, s.num_experts = 128, s.num_experts_per_tok = 8;
    s.moe_intermediate_size = 768, s.norm_topk_prob = true;
    s.bos_token_id = 151643, s.eos_token_id = 151645;
  }
  return s;
}

ModelSpec deepseek_spec(std::string_view arch, std::string_view preset) {
  ModelSpec s;
  s.arch = std::string(arch);
  const bool v3 = arch == "deepseek_v3";
  s.rms_norm_eps = 1e-6, s.rope_theta = 10000.0, s.bos_token_id = 0, s.eos_token_id = 1;
  s.scoring_func = v3 ? "sigmoid" : "softmax";
  s.topk_method = v3 ? "noaux_tc" : "greedy";
  s.norm_topk_prob = v3;
  s.routed_scaling_factor = v3 ? 2.5 : 1.0;
  s.first_k_dense_replace = 1;
  s.num_nextn_predict_layers = v3 ? 1 : 0;
  if (preset == "tiny") {
    s.vocab_size = 1000, s.hidden_size = 64, s.intermediate_size = 160;
    s.moe_intermediate_size = 32, s.num_hidden_layers = 3, s.num_attention_heads = 3;
    s.q_lora_rank = v3 ? 48 : 0, s.kv_lora_rank = 32;
    s.qk_nope_head_dim = 16, s.qk_rope_head_dim = 8, s.v_head_dim = 16;
    s.num_experts = 8, s.n_shared_experts = 1, s.num_experts_per_tok = 2;
    if (v3) {
      s.n_group = 4, s.topk_group = 2;
    } else {  // grouped routing, unlike V2-Lite, so the tiny model exercises it
      s.topk_method = "group_limited_greedy", s.n_group = 2, s.topk_group = 1;
      s.routed_scaling_factor = 1.5;
    }
    s.max_position_embeddings = 2048;
    s.rope_scaling = yarn_rope(4.0, 512, v3 ? 1.0 : 0.707);
  } else if (preset == "small") {
    s.vocab_size = 2048, s.hidden_size = 256, s.intermediate_size = 512;
    s.moe_intermediate_size = 64, s.num_hidden_layers = 4, s.num_attention_heads = 4;
    s.q_lora_rank = 96, s.kv_lora_rank = 64;
    s.qk_nope_head_dim = 32, s.qk_rope_head_dim = 16, s.v_head_dim = 32;
    s.num_experts = 16, s.n_shared_experts = v3 ? 1 : 2, s.num_experts_per_tok = 4;
    if (v3) s.n_group = 4, s.topk_group = 2;
    s.max_position_embeddings = 163840;
    s.rope_scaling = yarn_rope(40.0, 4096, v3 ? 1.0 : 0.707);
  } else if (preset == "deepseek-v2-lite") {  // deepseek-ai/DeepSeek-V2-Lite
    s.vocab_size = 102400, s.hidden_size = 2048, s.intermediate_size = 10944;
    s.moe_intermediate_size = 1408, s.num_hidden_layers = 27, s.num_attention_heads = 16;
    s.q_lora_rank = 0, s.kv_lora_rank = 512;
    s.qk_nope_head_dim = 128, s.qk_rope_head_dim = 64, s.v_head_dim = 128;
    s.num_experts = 64, s.n_shared_experts = 2, s.num_experts_per_tok = 6;
    s.max_position_embeddings = 163840, s.rope_scaling = yarn_rope(40.0, 4096, 0.707);
    s.bos_token_id = 100000, s.eos_token_id = 100001;
  } else {  // deepseek-v3-fp8-small: DeepSeek-V3's MLA dims, vocab, routing and FP8 format at
            // 2048 hidden, 6 layers (1 dense) + MTP, 64 experts: ~4.6 GB.
    s.vocab_size = 129280, s.hidden_size = 2048, s.intermediate_size = 6144;
    s.moe_intermediate_size = 1024, s.num_hidden_layers = 6, s.num_attention_heads = 16;
    s.q_lora_rank = 1536, s.kv_lora_rank = 512;
    s.qk_nope_head_dim = 128, s.qk_rope_head_dim = 64, s.v_head_dim = 128;
    s.num_experts = 64, s.n_shared_experts = 1, s.num_experts_per_tok = 8;
    s.n_group = 8, s.topk_group = 4;
    s.max_position_embeddings = 163840, s.rope_scaling = yarn_rope(40.0, 4096, 1.0);
    s.fp8 = true;
  }
  s.num_key_value_heads = s.num_attention_heads;
  return s;
}

}  // namespace

const std::vector<std::string>& supported_archs() {
  static const std::vector<std::string> archs = [] {
    std::vector<std::string> v;
    for (const auto& [arch, presets] : preset_table()) v.push_back(arch);
    return v;
  }();
  return archs;
}

std::vector<std::string> presets_for(std::string_view arch) {
  auto it = preset_table().find(arch);
  return it == preset_table().end() ? std::vector<std::string>{} : it->second;
}

Result<ModelSpec> model_spec(std::string_view arch, std::string_view preset) {
  auto it = preset_table().find(arch);
  if (it == preset_table().end()) {
    return make_status(StatusCode::kInvalidArgument, "unknown --arch '{}'; supported: {}", arch,
                       fmt::join(supported_archs(), ", "));
  }
  const auto& presets = it->second;
  if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
    return make_status(StatusCode::kInvalidArgument,
                       "--preset '{}' is not available for --arch {}; choose one of: {}", preset,
                       arch, fmt::join(presets, ", "));
  }
  ModelSpec s;
  if (arch == "llama") {
    s = llama_spec(preset);
  } else if (arch == "qwen3" || arch == "qwen3_moe") {
    s = qwen3_spec(arch, preset);
  } else {
    s = deepseek_spec(arch, preset);
  }
  s.preset = std::string(preset);
  return s;
}

// ---- config.json
// ----------------------------------------------------------------------------------

ojson hf_config(const ModelSpec& s, DType dtype) {
  const char* torch_dtype = dtype == DType::kF32 ? "float32" : "bfloat16";
  ojson c;
  if (s.arch == "llama") {
    c["architectures"] = {"LlamaForCausalLM"};
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
    c["bos_token_id"] = s.bos_token_id;
    c["eos_token_id"] = s.eos_token_id;
    if (s.head_dim * s.num_attention_heads != s.hidden_size) c["head_dim"] = s.head_dim;
    c["hidden_act"] = "silu";
    c["hidden_size"] = s.hidden_size;
    c["initializer_range"] = 0.02;
    c["intermediate_size"] = s.intermediate_size;
    c["max_position_embeddings"] = s.max_position_embeddings;
    c["mlp_bias"] = false;
    c["model_type"] = "llama";
    c["num_attention_heads"] = s.num_attention_heads;
    c["num_hidden_layers"] = s.num_hidden_layers;
    c["num_key_value_heads"] = s.num_key_value_heads;
    c["pretraining_tp"] = 1;
    c["rms_norm_eps"] = s.rms_norm_eps;
    c["rope_scaling"] = s.rope_scaling;
    c["rope_theta"] = s.rope_theta;
    c["tie_word_embeddings"] = s.tie_word_embeddings;
    c["torch_dtype"] = torch_dtype;
    c["use_cache"] = true;
    c["vocab_size"] = s.vocab_size;
  } else if (s.arch == "qwen3" || s.arch == "qwen3_moe") {
    const bool moe = s.arch == "qwen3_moe";
    c["architectures"] = {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
    c["bos_token_id"] = s.bos_token_id;
    if (moe) c["decoder_sparse_step"] = s.decoder_sparse_step;
    c["eos_token_id"] = s.eos_token_id;
    c["head_dim"] = s.head_dim;
    c["hidden_act"] = "silu";
    c["hidden_size"] = s.hidden_size;
    c["initializer_range"] = 0.02;
    c["intermediate_size"] = s.intermediate_size;
    c["max_position_embeddings"] = s.max_position_embeddings;
    c["max_window_layers"] = s.num_hidden_layers;
    if (moe) c["mlp_only_layers"] = s.mlp_only_layers;
    c["model_type"] = s.arch;
    if (moe) {
      c["moe_intermediate_size"] = s.moe_intermediate_size;
      c["norm_topk_prob"] = s.norm_topk_prob;
    }
    c["num_attention_heads"] = s.num_attention_heads;
    if (moe) {
      c["num_experts"] = s.num_experts;
      c["num_experts_per_tok"] = s.num_experts_per_tok;
    }
    c["num_hidden_layers"] = s.num_hidden_layers;
    c["num_key_value_heads"] = s.num_key_value_heads;
    if (moe) c["output_router_logits"] = false;
    c["rms_norm_eps"] = s.rms_norm_eps;
    c["rope_scaling"] = s.rope_scaling;
    c["rope_theta"] = s.rope_theta;
    if (moe) c["router_aux_loss_coef"] = 0.001;
    c["sliding_window"] = nullptr;
    c["tie_word_embeddings"] = s.tie_word_embeddings;
    c["torch_dtype"] = torch_dtype;
    c["use_cache"] = true;
    c["use_sliding_window"] = false;
    c["vocab_size"] = s.vocab_size;
  } else {
    const bool v3 = s.arch == "deepseek_v3";
    c["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
    if (!v3) c["aux_loss_alpha"] = 0.001;
    c["bos_token_id"] = s.bos_token_id;
    c["eos_token_id"] = s.eos_token_id;
    if (v3) c["ep_size"] = 1;
    c["first_k_dense_replace"] = s.first_k_dense_replace;
    c["hidden_act"] = "silu";
    c["hidden_size"] = s.hidden_size;
    c["initializer_range"] = 0.02;
    c["intermediate_size"] = s.intermediate_size;
    c["kv_lora_rank"] = s.kv_lora_rank;
    c["max_position_embeddings"] = s.max_position_embeddings;
    c["model_type"] = s.arch;
    c["moe_intermediate_size"] = s.moe_intermediate_size;
    c["moe_layer_freq"] = 1;
    c["n_group"] = s.n_group;
    c["n_routed_experts"] = s.num_experts;
    c["n_shared_experts"] = s.n_shared_experts;
    c["norm_topk_prob"] = s.norm_topk_prob;
    c["num_attention_heads"] = s.num_attention_heads;
    c["num_experts_per_tok"] = s.num_experts_per_tok;
    c["num_hidden_layers"] = s.num_hidden_layers;
    c["num_key_value_heads"] = s.num_key_value_heads;
    if (v3) c["num_nextn_predict_layers"] = s.num_nextn_predict_layers;
    if (!v3) c["pretraining_tp"] = 1;
    c["q_lora_rank"] = s.q_lora_rank > 0 ? ojson(s.q_lora_rank) : ojson(nullptr);
    c["qk_nope_head_dim"] = s.qk_nope_head_dim;
    c["qk_rope_head_dim"] = s.qk_rope_head_dim;
    c["rms_norm_eps"] = s.rms_norm_eps;
    c["rope_scaling"] = s.rope_scaling;
    c["rope_theta"] = s.rope_theta;
    c["routed_scaling_factor"] = s.routed_scaling_factor;
    c["scoring_func"] = s.scoring_func;
    if (!v3) c["seq_aux"] = true;
    c["tie_word_embeddings"] = s.tie_word_embeddings;
    c["topk_group"] = s.topk_group;
    c["topk_method"] = s.topk_method;
    c["torch_dtype"] = torch_dtype;
    c["use_cache"] = true;
    c["v_head_dim"] = s.v_head_dim;
    c["vocab_size"] = s.vocab_size;
  }
  if (s.fp8) {
    c["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {kFp8BlockSize, kFp8BlockSize}}};
  }
  return c;
}

ojson hf_generation_config(const ModelSpec& s) {
  return {{"_from_model_config", true},
          {"bos_token_id", s.bos_token_id},
          {"eos_token_id", s.eos_token_id}};
}

// ---- tensor plan
// ----------------------------------------------------------------------------------

namespace {

constexpr float kNormNoise = 0.1f;
constexpr float kBiasStd = 0.05f;

class Planner {
 public:
  Planner(const ModelSpec& s, DType dtype) : s_(s), dtype_(dtype) {}

  std::vector<TensorPlan> run() {
    const float embed_std =
        s_.tie_word_embeddings ? static_cast<float>(std::pow(s_.hidden_size, -0.25)) : 1.0f;
    values("model.embed_tokens.weight", {s_.vocab_size, s_.hidden_size}, 0.0f, embed_std);
    for (int64_t i = 0; i < s_.num_hidden_layers; ++i) decoder_layer(i);
    norm("model.norm.weight", s_.hidden_size);
    if (!s_.tie_word_embeddings) {
      values("lm_head.weight", {s_.vocab_size, s_.hidden_size}, 0.0f, inv_sqrt(s_.hidden_size));
    }
    for (int64_t j = 0; j < s_.num_nextn_predict_layers; ++j) mtp_layer(s_.num_hidden_layers + j);
    return std::move(out_);
  }

 private:
  static float inv_sqrt(int64_t n) { return static_cast<float>(1.0 / std::sqrt(double(n))); }

  TensorPlan& values(std::string name, Shape shape, float mean, float std, DType dtype) {
    TensorPlan t;
    t.rng_name = name;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.mean = mean;
    t.std = std;
    out_.push_back(std::move(t));
    return out_.back();
  }
  TensorPlan& values(std::string name, Shape shape, float mean, float std) {
    return values(std::move(name), std::move(shape), mean, std, dtype_);
  }
  void norm(const std::string& name, int64_t dim) { values(name, {dim}, 1.0f, kNormNoise); }

  // A bias-free linear layer `prefix`.weight of shape [out, in].
  void linear(const std::string& prefix, int64_t out, int64_t in, bool quantizable = true) {
    if (!(s_.fp8 && quantizable)) {
      values(prefix + ".weight", {out, in}, 0.0f, inv_sqrt(in));
      return;
    }
    values(prefix + ".weight", {out, in}, 0.0f, inv_sqrt(in), DType::kFP8E4M3).kind =
        TensorPlan::Kind::kFp8Weight;
    auto blocks = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
    TensorPlan& scale =
        values(prefix + ".weight_scale_inv", {blocks(out), blocks(in)}, 0.0f, 0.0f, DType::kF32);
    scale.kind = TensorPlan::Kind::kFp8ScaleInv;
    scale.rng_name = prefix + ".weight";
  }

  void mlp(const std::string& prefix, int64_t inter) {
    linear(prefix + ".gate_proj", inter, s_.hidden_size);
    linear(prefix + ".up_proj", inter, s_.hidden_size);
    linear(prefix + ".down_proj", s_.hidden_size, inter);
  }

  void attention(const std::string& p) {
    const int64_t h = s_.hidden_size;
    if (!s_.is_deepseek()) {
      linear(p + ".q_proj", s_.num_attention_heads * s_.head_dim, h);
      linear(p + ".k_proj", s_.num_key_value_heads * s_.head_dim, h);
      linear(p + ".v_proj", s_.num_key_value_heads * s_.head_dim, h);
      linear(p + ".o_proj", h, s_.num_attention_heads * s_.head_dim);
      if (s_.arch == "qwen3" || s_.arch == "qwen3_moe") {
        norm(p + ".q_norm.weight", s_.head_dim);
        norm(p + ".k_norm.weight", s_.head_dim);
      }
      return;
    }
    const int64_t heads = s_.num_attention_heads;
    const int64_t q_head_dim = s_.qk_nope_head_dim + s_.qk_rope_head_dim;
    if (s_.q_lora_rank > 0) {
      linear(p + ".q_a_proj", s_.q_lora_rank, h);
      norm(p + ".q_a_layernorm.weight", s_.q_lora_rank);
      linear(p + ".q_b_proj", heads * q_head_dim, s_.q_lora_rank);
    } else {
      linear(p + ".q_proj", heads * q_head_dim, h);
    }
    linear(p + ".kv_a_proj_with_mqa", s_.kv_lora_rank + s_.qk_rope_head_dim, h);
    norm(p + ".kv_a_layernorm.weight", s_.kv_lora_rank);
    linear(p + ".kv_b_proj", heads * (s_.qk_nope_head_dim + s_.v_head_dim), s_.kv_lora_rank);
    linear(p + ".o_proj", h, heads * s_.v_head_dim);
  }

  void decoder_layer(int64_t i) {
    const std::string p = fmt::format("model.layers.{}", i);
    norm(p + ".input_layernorm.weight", s_.hidden_size);
    attention(p + ".self_attn");
    norm(p + ".post_attention_layernorm.weight", s_.hidden_size);
    if (!s_.is_moe_layer(i)) {
      mlp(p + ".mlp", s_.intermediate_size);
      return;
    }
    linear(p + ".mlp.gate", s_.num_experts, s_.hidden_size, /*quantizable=*/false);
    if (s_.topk_method == "noaux_tc") {
      values(p + ".mlp.gate.e_score_correction_bias", {s_.num_experts}, 0.0f, kBiasStd,
             DType::kF32);
    }
    for (int64_t e = 0; e < s_.num_experts; ++e) {
      mlp(fmt::format("{}.mlp.experts.{}", p, e), s_.moe_intermediate_size);
    }
    if (s_.n_shared_experts > 0) {
      mlp(p + ".mlp.shared_experts", s_.moe_intermediate_size * s_.n_shared_experts);
    }
  }

  // DeepSeek-V3 multi-token prediction layer: its own copies of embed_tokens and lm_head (same
  // values as the main ones), two norms, the 2h -> h projection, and a full decoder layer.
  void mtp_layer(int64_t i) {
    const std::string p = fmt::format("model.layers.{}", i);
    const float embed_std = out_.front().std;
    values(p + ".embed_tokens.weight", {s_.vocab_size, s_.hidden_size}, 0.0f, embed_std).rng_name =
        "model.embed_tokens.weight";
    norm(p + ".enorm.weight", s_.hidden_size);
    norm(p + ".hnorm.weight", s_.hidden_size);
    linear(p + ".eh_proj", s_.hidden_size, 2 * s_.hidden_size, /*quantizable=*/false);
    decoder_layer(i);
    norm(p + ".shared_head.norm.weight", s_.hidden_size);
    values(p + ".shared_head.head.weight", {s_.vocab_size, s_.hidden_size}, 0.0f,
           inv_sqrt(s_.hidden_size))
        .rng_name = s_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  }

  const ModelSpec& s_;
  DType dtype_;
  std::vector<TensorPlan> out_;
};

}  // namespace

std::vector<TensorPlan> plan_tensors(const ModelSpec& spec, DType dtype) {
  DI_CHECK(dtype == DType::kBF16 || dtype == DType::kF32, "make-model writes bf16 or f32, not {}",
           dtype_name(dtype));
  return Planner(spec, dtype).run();
}

// ---- values -------------------------------------------------------------------------------------

namespace {

uint64_t mix64(uint64_t z) {  // SplitMix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t stream_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix64(mix64(seed) ^ h);
}

// Standard normals for elements [begin, end) of stream `key`: pair k = (2k, 2k+1) comes from one
// 64-bit counter hash through Box-Muller, so any element range can be generated independently.
void fill_normal(uint64_t key, int64_t begin, int64_t end, float* out) {
  constexpr float kTwoPi = 2.0f * std::numbers::pi_v<float>;
  constexpr float k2m32 = 1.0f / 4294967296.0f;
  for (int64_t i = begin; i < end;) {
    const int64_t pair = i / 2;
    uint64_t h = mix64(key + static_cast<uint64_t>(pair) * 0x9e3779b97f4a7c15ull);
    float u1 = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
    float u2 = static_cast<float>(static_cast<uint32_t>(h)) * k2m32;
    float r = std::sqrt(-2.0f * std::log(u1));
    float a = kTwoPi * u2;
    if (i % 2 == 0) {
      *out++ = r * std::cos(a);
      ++i;
      if (i == end) break;
    }
    *out++ = r * std::sin(a);
    ++i;
  }
}

struct ChunkFiller {
  uint64_t seed;
  // The scales of the FP8 weight being written, handed to its kFp8ScaleInv successor.
  std::vector<float> fp8_scales;

  // Fills rows [row_begin, row_end) of `t` into `dst`, in parallel.
  void fill(const TensorPlan& t, int64_t row_begin, int64_t row_end, std::byte* dst) {
    // Elements per row (dim 0); 1 for vectors.
    const int64_t cols =
        t.shape.size() >= 2 && t.shape[0] > 0 ? shape_numel(t.shape) / t.shape[0] : 1;
    const uint64_t key = stream_key(seed, t.rng_name);
    switch (t.kind) {
      case TensorPlan::Kind::kValues: {
        const int64_t n = (row_end - row_begin) * cols;
        const int64_t first = row_begin * cols;
        ThreadPool::global().parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
          constexpr int64_t kTile = 4096;
          float tile[kTile];
          for (int64_t i = b; i < e; i += kTile) {
            const int64_t m = std::min(kTile, e - i);
            fill_normal(key, first + i, first + i + m, tile);
            for (int64_t j = 0; j < m; ++j) tile[j] = t.mean + t.std * tile[j];
            if (t.dtype == DType::kF32) {
              std::memcpy(dst + i * 4, tile, static_cast<size_t>(m) * 4);
            } else {
              auto* o = reinterpret_cast<uint16_t*>(dst) + i;
              for (int64_t j = 0; j < m; ++j) o[j] = f32_to_bf16(tile[j]);
            }
          }
        });
        break;
      }
      case TensorPlan::Kind::kFp8Weight: {
        // Rows come in whole 128-row stripes (the last may be short); one task per 128x128 block.
        const int64_t rows_total = t.shape[0];
        const int64_t col_blocks = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
        const int64_t row_blocks = (rows_total + kFp8BlockSize - 1) / kFp8BlockSize;
        if (row_begin == 0) fp8_scales.assign(static_cast<size_t>(row_blocks * col_blocks), 0.0f);
        const int64_t stripe0 = row_begin / kFp8BlockSize;
        const int64_t stripes = (row_end - row_begin + kFp8BlockSize - 1) / kFp8BlockSize;
        auto* o = reinterpret_cast<uint8_t*>(dst);
        ThreadPool::global().parallel_for(stripes * col_blocks, 1, [&](int64_t b, int64_t e) {
          std::vector<float> block(static_cast<size_t>(kFp8BlockSize * kFp8BlockSize));
          for (int64_t task = b; task < e; ++task) {
            const int64_t stripe = stripe0 + task / col_blocks, cb = task % col_blocks;
            const int64_t r0 = stripe * kFp8BlockSize;
            const int64_t r1 = std::min(r0 + kFp8BlockSize, rows_total);
            const int64_t c0 = cb * kFp8BlockSize, c1 = std::min(c0 + kFp8BlockSize, cols);
            const int64_t w = c1 - c0;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; ++r) {
              float* v = block.data() + (r - r0) * w;
              fill_normal(key, r * cols + c0, r * cols + c1, v);
              for (int64_t j = 0; j < w; ++j) {
                v[j] *= t.std;
                amax = std::max(amax, std::fabs(v[j]));
              }
            }
            const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;  // e4m3 max finite
            fp8_scales[static_cast<size_t>(stripe * col_blocks + cb)] = scale;
            for (int64_t r = r0; r < r1; ++r) {
              const float* v = block.data() + (r - r0) * w;
              uint8_t* q = o + (r - row_begin) * cols + c0;
              for (int64_t j = 0; j < w; ++j) q[j] = f32_to_fp8e4m3(v[j] / scale);
            }
          }
        });
        break;
      }
      case TensorPlan::Kind::kFp8ScaleInv: {
        DI_CHECK(static_cast<int64_t>(fp8_scales.size()) == shape_numel(t.shape),
                 "{}: the scales of its weight are missing", t.name);
        std::memcpy(dst, fp8_scales.data() + row_begin * cols,
                    static_cast<size_t>((row_end - row_begin) * cols) * 4);
        break;
      }
    }
  }
};

class ProgressBar {
 public:
  ProgressBar(uint64_t total, bool enabled) : total_(total), enabled_(enabled) {
    start_ = std::chrono::steady_clock::now();
  }
  void update(uint64_t done) {
    if (!enabled_) return;
    const int permille = total_ == 0 ? 1000 : static_cast<int>(done * 1000 / total_);
    if (permille == last_permille_) return;
    last_permille_ = permille;
    const double secs = elapsed();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    constexpr int kWidth = 30;
    const int filled = permille * kWidth / 1000;
    std::fprintf(stderr, "\r[%s%s] %5.1f%% %s / %s  %s/s  eta %.0fs  ",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), permille / 10.0,
                 format_bytes(done).c_str(), format_bytes(total_).c_str(),
                 format_bytes(static_cast<uint64_t>(rate)).c_str(), eta);
    if (done >= total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  uint64_t total_;
  bool enabled_;
  int last_permille_ = -1;
  std::chrono::steady_clock::time_point start_;
};

void write_json(const std::filesystem::path& path, const ojson& j) {
  std::ofstream f(path);
  DI_CHECK(f.good(), "cannot create {}", path.string());
  f << j.dump(2) << "\n";
  f.close();
  DI_CHECK(f.good(), "writing {} failed", path.string());
}

uint64_t tensor_bytes(const TensorPlan& t) {
  return static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
}

// Shards as index ranges of `plan`; an FP8 weight and its scales stay together.
std::vector<std::pair<size_t, size_t>> plan_shards(const std::vector<TensorPlan>& plan,
                                                   uint64_t max_bytes) {
  std::vector<std::pair<size_t, size_t>> shards;
  size_t begin = 0;
  uint64_t size = 0;
  for (size_t i = 0; i < plan.size();) {
    size_t unit_end = i + 1;
    if (plan[i].kind == TensorPlan::Kind::kFp8Weight) unit_end = i + 2;
    uint64_t unit = 0;
    for (size_t j = i; j < unit_end; ++j) unit += tensor_bytes(plan[j]);
    if (i > begin && size + unit > max_bytes) {
      shards.emplace_back(begin, i);
      begin = i;
      size = 0;
    }
    size += unit;
    i = unit_end;
  }
  shards.emplace_back(begin, plan.size());
  return shards;
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", bytes);
}

MakeModelReport make_model(const MakeModelOptions& options) {
  auto spec_or = model_spec(options.arch, options.preset);
  DI_CHECK(spec_or.is_ok(), "{}", spec_or.status().message());
  ModelSpec spec = std::move(spec_or).value();
  spec.fp8 = spec.fp8 || options.fp8;
  DI_CHECK(options.vocab_size >= 0, "vocab size {} is negative", options.vocab_size);
  if (options.vocab_size > 0) spec.vocab_size = options.vocab_size;
  if (options.q_lora_rank >= 0) {
    DI_CHECK(spec.arch == "deepseek_v2" || spec.arch == "deepseek_v3",
             "q_lora_rank applies to DeepSeek models, not {}", spec.arch);
    spec.q_lora_rank = options.q_lora_rank;
  }
  DI_CHECK(options.max_shard_bytes > 0, "the maximum shard size must be positive");
  DI_CHECK(options.dry_run || !options.out_dir.empty(), "an output directory is required");

  MakeModelReport report;
  report.spec = spec;
  const std::vector<TensorPlan> plan = plan_tensors(spec, options.dtype);
  for (const TensorPlan& t : plan) {
    report.data_bytes += tensor_bytes(t);
    if (t.kind != TensorPlan::Kind::kFp8ScaleInv) report.num_params += shape_numel(t.shape);
  }
  report.num_tensors = static_cast<int64_t>(plan.size());
  const auto shards = plan_shards(plan, options.max_shard_bytes);
  for (size_t k = 0; k < shards.size(); ++k) {
    ShardReport sr;
    sr.file = shards.size() == 1
                  ? "model.safetensors"
                  : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    for (size_t i = shards[k].first; i < shards[k].second; ++i)
      sr.data_bytes += tensor_bytes(plan[i]);
    sr.num_tensors = static_cast<int64_t>(shards[k].second - shards[k].first);
    report.shards.push_back(sr);
  }
  if (options.dry_run) return report;

  namespace fs = std::filesystem;
  const fs::path dir = options.out_dir;
  fs::create_directories(dir);
  // Our files from an earlier run (a different shard count would leave stale shards behind).
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                      (name.starts_with("model-") && name.ends_with(".safetensors"));
    if (ours && entry.is_regular_file()) fs::remove(entry.path());
  }
  write_json(dir / "config.json", hf_config(spec, options.dtype));
  write_json(dir / "generation_config.json", hf_generation_config(spec));
  if (options.config_only) return report;

  // Chunks of ~64 MB: generated on the pool into one buffer while the other is written.
  constexpr uint64_t kChunkBytes = 64ull << 20;
  std::array<std::vector<std::byte>, 2> buffers;
  int cur = 0;
  ChunkFiller filler{options.seed, {}};
  ProgressBar progress(report.data_bytes,
                       options.progress && report.data_bytes >= 256'000'000 && isatty(2));
  uint64_t done = 0;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  ojson weight_map = ojson::object();

  for (size_t k = 0; k < shards.size(); ++k) {
    std::vector<SafetensorsEntry> entries;
    for (size_t i = shards[k].first; i < shards[k].second; ++i) {
      entries.push_back({plan[i].name, plan[i].dtype, plan[i].shape});
      weight_map[plan[i].name] = report.shards[k].file;
    }
    const fs::path final_path = dir / report.shards[k].file;
    const fs::path tmp_path = fs::path(final_path.string() + ".tmp");
    SafetensorsWriter writer(tmp_path, std::move(entries), metadata);
    std::future<void> pending;  // after `writer`: destroyed (waited for) first on an exception
    for (size_t i = shards[k].first; i < shards[k].second; ++i) {
      const TensorPlan& t = plan[i];
      const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
      const uint64_t row_bytes = rows == 0 ? 0 : tensor_bytes(t) / static_cast<uint64_t>(rows);
      int64_t rows_per_chunk =
          row_bytes == 0 ? rows
                         : std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row_bytes));
      if (t.kind == TensorPlan::Kind::kFp8Weight) {
        rows_per_chunk = std::max<int64_t>(1, rows_per_chunk / kFp8BlockSize) * kFp8BlockSize;
      }
      for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
        const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
        const size_t nbytes = static_cast<size_t>(static_cast<uint64_t>(r1 - r0) * row_bytes);
        std::vector<std::byte>& buf = buffers[static_cast<size_t>(cur)];
        if (buf.size() < nbytes) buf.resize(nbytes);
        filler.fill(t, r0, r1, buf.data());
        if (pending.valid()) pending.get();
        pending = std::async(std::launch::async, [&writer, &buf, nbytes] {
          writer.append(std::span<const std::byte>(buf.data(), nbytes));
        });
        cur ^= 1;
        done += nbytes;
        progress.update(done);
      }
    }
    if (pending.valid()) pending.get();
    writer.finish();
    fs::rename(tmp_path, final_path);
  }
  if (shards.size() > 1) {
    ojson index;
    index["metadata"] = {{"total_size", report.data_bytes}};
    index["weight_map"] = weight_map;
    write_json(dir / "model.safetensors.index.json", index);
  }
  report.seconds = progress.elapsed();
  return report;
}

}  // namespace di::model
