#include "model/config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace di {
namespace {

using json = nlohmann::json;

template <typename T>
T get_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

std::optional<double> opt_double(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return it->get<double>();
}

// Reads rope settings from either transformers 5 `rope_parameters` or 4.x `rope_scaling` +
// `rope_theta`.
RopeConfig parse_rope(const json& j, double default_theta) {
  RopeConfig r;
  r.theta = get_or<double>(j, "rope_theta", default_theta);
  const json* p = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) p = &*it;
  if (auto it = j.find("rope_scaling"); p == nullptr && it != j.end() && it->is_object()) p = &*it;
  if (p == nullptr) return r;
  r.theta = get_or<double>(*p, "rope_theta", r.theta);
  std::string type = get_or<std::string>(*p, "rope_type", get_or<std::string>(*p, "type", "default"));
  if (type == "default") {
    r.type = RopeConfig::Type::kDefault;
  } else if (type == "linear") {
    r.type = RopeConfig::Type::kLinear;
  } else if (type == "llama3") {
    r.type = RopeConfig::Type::kLlama3;
  } else if (type == "yarn" || type == "deepseek_yarn") {
    r.type = RopeConfig::Type::kYarn;
  } else {
    throw Error("unsupported rope type '" + type + "' (supported: default, linear, llama3, yarn)");
  }
  r.factor = get_or<double>(*p, "factor", 1.0);
  r.low_freq_factor = get_or<double>(*p, "low_freq_factor", 1.0);
  r.high_freq_factor = get_or<double>(*p, "high_freq_factor", 4.0);
  if (auto it = p->find("original_max_position_embeddings"); it != p->end() && !it->is_null())
    r.original_max_position_embeddings = it->get<int64_t>();
  r.beta_fast = get_or<double>(*p, "beta_fast", 32.0);
  r.beta_slow = get_or<double>(*p, "beta_slow", 1.0);
  r.mscale = opt_double(*p, "mscale");
  r.mscale_all_dim = opt_double(*p, "mscale_all_dim");
  r.attention_factor = opt_double(*p, "attention_factor");
  r.truncate = get_or<bool>(*p, "truncate", true);
  return r;
}

double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kLlama: return "LlamaForCausalLM";
    case Arch::kQwen3: return "Qwen3ForCausalLM";
    case Arch::kQwen3Moe: return "Qwen3MoeForCausalLM";
    case Arch::kDeepseekV2: return "DeepseekV2ForCausalLM";
    case Arch::kDeepseekV3: return "DeepseekV3ForCausalLM";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts == 0) return false;
  switch (arch) {
    case Arch::kQwen3Moe:
      if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
        return false;
      return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
    case Arch::kDeepseekV2:
    case Arch::kDeepseekV3:
      return layer >= first_k_dense_replace && layer % std::max<int64_t>(1, moe_layer_freq) == 0;
    default:
      return false;
  }
}

double ModelConfig::attention_scale() const {
  if (!is_mla()) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  // DeepSeek (and HF 5.17, measured by scripts/gen_goldens.py for V2 and V3) multiplies the scale by
  // mscale(factor, mscale_all_dim)² when the rope is scaled.
  if (rope.type != RopeConfig::Type::kDefault && rope.mscale_all_dim &&
      *rope.mscale_all_dim != 0.0) {
    double m = yarn_mscale(rope.factor, *rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    return make_status(StatusCode::kInvalidArgument, "{}: invalid JSON: {}", source, e.what());
  }
  try {
    ModelConfig c;
    std::string arch;
    if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty())
      arch = (*it)[0].get<std::string>();
    c.model_type = get_or<std::string>(j, "model_type", "");
    if (arch == "LlamaForCausalLM" || (arch.empty() && c.model_type == "llama")) {
      c.arch = Arch::kLlama;
    } else if (arch == "Qwen3ForCausalLM" || (arch.empty() && c.model_type == "qwen3")) {
      c.arch = Arch::kQwen3;
    } else if (arch == "Qwen3MoeForCausalLM" || (arch.empty() && c.model_type == "qwen3_moe")) {
      c.arch = Arch::kQwen3Moe;
    } else if (arch == "DeepseekV2ForCausalLM" || (arch.empty() && c.model_type == "deepseek_v2")) {
      c.arch = Arch::kDeepseekV2;
    } else if (arch == "DeepseekV3ForCausalLM" || (arch.empty() && c.model_type == "deepseek_v3")) {
      c.arch = Arch::kDeepseekV3;
    } else {
      return make_status(StatusCode::kUnimplemented,
                         "{}: unsupported architecture '{}' (model_type '{}'); supported: "
                         "LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, "
                         "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM",
                         source, arch, c.model_type);
    }
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.intermediate_size = get_or<int64_t>(j, "intermediate_size", 0);
    c.num_hidden_layers = j.at("num_hidden_layers").get<int64_t>();
    c.num_attention_heads = j.at("num_attention_heads").get<int64_t>();
    c.num_key_value_heads = get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads);
    c.head_dim = get_or<int64_t>(j, "head_dim", c.hidden_size / c.num_attention_heads);
    c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
    c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings", 2048);
    c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
    c.attention_bias = get_or<bool>(j, "attention_bias", false);
    c.hidden_act = get_or<std::string>(j, "hidden_act", "silu");
    c.torch_dtype = get_or<std::string>(j, "torch_dtype", get_or<std::string>(j, "dtype", "float32"));
    c.rope = parse_rope(j, c.arch == Arch::kLlama ? 10000.0 : 10000.0);
    if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
      if (it->is_array()) {
        for (const auto& v : *it) c.eos_token_ids.push_back(v.get<int64_t>());
      } else {
        c.eos_token_ids.push_back(it->get<int64_t>());
      }
    }
    if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null())
      c.bos_token_id = it->get<int64_t>();

    if (c.arch == Arch::kQwen3Moe) {
      // transformers 5.x writes num_local_experts; Hub checkpoints use num_experts.
      c.num_experts = get_or<int64_t>(j, "num_experts", get_or<int64_t>(j, "num_local_experts", 0));
      c.num_experts_per_tok = get_or<int64_t>(j, "num_experts_per_tok", 0);
      c.moe_intermediate_size = get_or<int64_t>(j, "moe_intermediate_size", 0);
      c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
      c.decoder_sparse_step = get_or<int64_t>(j, "decoder_sparse_step", 1);
      if (auto it = j.find("mlp_only_layers"); it != j.end() && it->is_array())
        c.mlp_only_layers = it->get<std::vector<int64_t>>();
    }
    if (c.is_mla()) {
      c.num_experts = get_or<int64_t>(j, "n_routed_experts", 0);
      c.num_experts_per_tok = get_or<int64_t>(j, "num_experts_per_tok", 0);
      c.moe_intermediate_size = get_or<int64_t>(j, "moe_intermediate_size", 0);
      c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
      c.n_shared_experts = get_or<int64_t>(j, "n_shared_experts", 0);
      c.first_k_dense_replace = get_or<int64_t>(j, "first_k_dense_replace", 0);
      c.moe_layer_freq = get_or<int64_t>(j, "moe_layer_freq", 1);
      c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0);
      c.scoring_func = get_or<std::string>(
          j, "scoring_func", c.arch == Arch::kDeepseekV3 ? "sigmoid" : "softmax");
      c.topk_method = get_or<std::string>(
          j, "topk_method", c.arch == Arch::kDeepseekV3 ? "noaux_tc" : "greedy");
      c.n_group = get_or<int64_t>(j, "n_group", 1);
      c.topk_group = get_or<int64_t>(j, "topk_group", c.n_group);
      c.q_lora_rank = get_or<int64_t>(j, "q_lora_rank", 0);
      c.kv_lora_rank = j.at("kv_lora_rank").get<int64_t>();
      c.qk_nope_head_dim = j.at("qk_nope_head_dim").get<int64_t>();
      c.qk_rope_head_dim = j.at("qk_rope_head_dim").get<int64_t>();
      c.v_head_dim = j.at("v_head_dim").get<int64_t>();
      c.rope_interleave = c.arch == Arch::kDeepseekV2 || get_or<bool>(j, "rope_interleave", true);
      c.num_nextn_predict_layers = get_or<int64_t>(j, "num_nextn_predict_layers", 0);
      c.head_dim = c.qk_rope_head_dim;  // HF DeepSeek configs set head_dim to the rope dim
      if (c.scoring_func != "softmax" && c.scoring_func != "sigmoid")
        return make_status(StatusCode::kUnimplemented, "{}: unsupported scoring_func '{}'", source,
                           c.scoring_func);
      if (c.topk_method != "greedy" && c.topk_method != "group_limited_greedy" &&
          c.topk_method != "noaux_tc")
        return make_status(StatusCode::kUnimplemented, "{}: unsupported topk_method '{}'", source,
                           c.topk_method);
    }
    if (auto it = j.find("quantization_config"); it != j.end() && it->is_object()) {
      std::string method = get_or<std::string>(*it, "quant_method", "");
      if (method != "fp8")
        return make_status(StatusCode::kUnimplemented,
                           "{}: unsupported quantization method '{}' (supported: fp8)", source,
                           method);
      c.fp8_weights = true;
      if (auto b = it->find("weight_block_size"); b != it->end() && b->is_array() && b->size() == 2) {
        c.fp8_block_n = (*b)[0].get<int64_t>();
        c.fp8_block_k = (*b)[1].get<int64_t>();
      }
    }
    // Sanity checks that would otherwise surface as out-of-bounds reads.
    auto positive = [&](int64_t v, const char* name) -> Status {
      if (v <= 0) return make_status(StatusCode::kInvalidArgument, "{}: {} must be > 0, got {}", source, name, v);
      return Status::ok();
    };
    DI_RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
    DI_RETURN_IF_ERROR(positive(c.hidden_size, "hidden_size"));
    DI_RETURN_IF_ERROR(positive(c.num_hidden_layers, "num_hidden_layers"));
    DI_RETURN_IF_ERROR(positive(c.num_attention_heads, "num_attention_heads"));
    DI_RETURN_IF_ERROR(positive(c.num_key_value_heads, "num_key_value_heads"));
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      return make_status(StatusCode::kInvalidArgument,
                         "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                         source, c.num_attention_heads, c.num_key_value_heads);
    if (c.num_experts > 0) {
      DI_RETURN_IF_ERROR(positive(c.num_experts_per_tok, "num_experts_per_tok"));
      DI_RETURN_IF_ERROR(positive(c.moe_intermediate_size, "moe_intermediate_size"));
      if (c.n_group <= 0 || c.num_experts % c.n_group != 0 || c.topk_group > c.n_group)
        return make_status(StatusCode::kInvalidArgument,
                           "{}: {} experts cannot be split into n_group {} with topk_group {}",
                           source, c.num_experts, c.n_group, c.topk_group);
    }
    if (c.hidden_act != "silu")
      return make_status(StatusCode::kUnimplemented, "{}: unsupported hidden_act '{}' (silu only)",
                         source, c.hidden_act);
    return c;
  } catch (const std::exception& e) {
    return make_status(StatusCode::kInvalidArgument, "{}: {}", source, e.what());
  }
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream f(path);
  if (!f)
    return make_status(StatusCode::kNotFound, "{}: cannot open (is '{}' a model directory?)", path,
                       model_dir);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace di
