// make-model and the safetensors writer, checked against an independent reader: a minimal
// safetensors parser written here, and the expected tensor list derived from config.json by the
// rules of HF transformers' modeling files (not from make_model's own plan).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/make_model.h"
#include "model/safetensors_writer.h"

namespace di::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- an independent minimal safetensors reader
// ----------------------------------------------------

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

size_t dtype_bytes(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "BF16" || d == "F16") return 2;
  if (d == "F8_E4M3" || d == "U8") return 1;
  ADD_FAILURE() << "unexpected dtype " << d;
  return 1;
}

std::map<std::string, StTensor> read_safetensors(const fs::path& path, json* metadata = nullptr) {
  std::string file = read_file(path);
  EXPECT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u) << "header not padded to 8 bytes";
  EXPECT_LE(8 + n, file.size());
  std::string header_text = file.substr(8, n);
  const size_t last = header_text.find_last_not_of(' ');
  EXPECT_EQ(header_text[last], '}') << "padding must be spaces after the JSON";
  json header = json::parse(header_text);
  const std::string data = file.substr(8 + n);
  std::map<std::string, StTensor> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (metadata) *metadata = v;
      continue;
    }
    StTensor t;
    t.dtype = v.at("dtype").get<std::string>();
    t.shape = v.at("shape").get<std::vector<int64_t>>();
    auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
    EXPECT_EQ(off.size(), 2u);
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    EXPECT_EQ(off[1] - off[0], numel * dtype_bytes(t.dtype)) << name;
    EXPECT_LE(off[1], data.size()) << name;
    t.bytes = data.substr(off[0], off[1] - off[0]);
    ranges.emplace_back(off[0], off[1]);
    out[name] = std::move(t);
  }
  // The data region is exactly covered, without gaps or overlaps.
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, pos);
    pos = e;
  }
  EXPECT_EQ(pos, data.size());
  return out;
}

// Reads a whole model directory (single file or index + shards) into one map.
std::map<std::string, StTensor> read_model(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) {
    EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
    return read_safetensors(dir / "model.safetensors");
  }
  json index = json::parse(read_file(dir / "model.safetensors.index.json"));
  std::map<std::string, StTensor> all;
  std::set<std::string> files;
  for (auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
  uint64_t total = 0;
  for (const std::string& f : files) {
    for (auto& [name, t] : read_safetensors(dir / f)) {
      EXPECT_EQ(index["weight_map"].value(name, ""), f) << name << " is in " << f;
      total += t.bytes.size();
      all[name] = std::move(t);
    }
  }
  EXPECT_EQ(all.size(), index["weight_map"].size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  return all;
}

float bf16_value(const std::string& b, size_t i) {
  uint32_t bits = static_cast<uint32_t>(static_cast<uint8_t>(b[2 * i])) |
                  static_cast<uint32_t>(static_cast<uint8_t>(b[2 * i + 1])) << 8;
  bits <<= 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float e4m3_value(uint8_t v) {  // OCP E4M3FN
  const int sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 0xf && mant == 7) return NAN;
  float mag = exp == 0 ? std::ldexp(static_cast<float>(mant) / 8.0f, -6)
                       : std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

std::vector<float> values_of(const StTensor& t) {
  std::vector<float> v;
  if (t.dtype == "BF16") {
    for (size_t i = 0; i < t.bytes.size() / 2; ++i) v.push_back(bf16_value(t.bytes, i));
  } else if (t.dtype == "F32") {
    v.resize(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  } else if (t.dtype == "F8_E4M3") {
    for (char c : t.bytes) v.push_back(e4m3_value(static_cast<uint8_t>(c)));
  }
  return v;
}

// ---- the expected checkpoint, derived from config.json
// --------------------------------------------

enum class Role { kEmbed, kLmHead, kProj, kNorm, kRouter, kBias, kScale };

struct Expected {
  std::string dtype;
  std::vector<int64_t> shape;
  Role role;
  int64_t fan_in = 0;
};

std::map<std::string, Expected> expected_tensors(const json& c) {
  const std::string type = c.at("model_type");
  const std::string base = c.at("torch_dtype") == "float32" ? "F32" : "BF16";
  const bool fp8 = c.contains("quantization_config");
  const int64_t h = c.at("hidden_size"), vocab = c.at("vocab_size");
  const int64_t layers = c.at("num_hidden_layers");
  const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3";
  std::map<std::string, Expected> e;
  auto linear = [&](const std::string& p, int64_t out, int64_t in, bool quantizable = true) {
    if (fp8 && quantizable) {
      e[p + ".weight"] = {"F8_E4M3", {out, in}, Role::kProj, in};
      e[p + ".weight_scale_inv"] = {"F32", {(out + 127) / 128, (in + 127) / 128}, Role::kScale};
    } else {
      e[p + ".weight"] = {base, {out, in}, Role::kProj, in};
    }
  };
  auto norm = [&](const std::string& n, int64_t d) { e[n] = {base, {d}, Role::kNorm}; };
  auto mlp = [&](const std::string& p, int64_t inter) {
    linear(p + ".gate_proj", inter, h);
    linear(p + ".up_proj", inter, h);
    linear(p + ".down_proj", h, inter);
  };
  auto is_moe = [&](int64_t i) {
    if (type == "qwen3_moe") {
      auto only = c.at("mlp_only_layers").get<std::vector<int64_t>>();
      return std::find(only.begin(), only.end(), i) == only.end() &&
             c.at("num_experts").get<int64_t>() > 0 &&
             (i + 1) % c.at("decoder_sparse_step").get<int64_t>() == 0;
    }
    if (deepseek) {
      return i >= c.at("first_k_dense_replace").get<int64_t>() &&
             i % c.at("moe_layer_freq").get<int64_t>() == 0;
    }
    return false;
  };
  auto layer = [&](int64_t i) {
    const std::string p = "model.layers." + std::to_string(i);
    norm(p + ".input_layernorm.weight", h);
    norm(p + ".post_attention_layernorm.weight", h);
    const std::string a = p + ".self_attn";
    const int64_t heads = c.at("num_attention_heads");
    if (deepseek) {
      const int64_t nope = c.at("qk_nope_head_dim"), rope = c.at("qk_rope_head_dim");
      const int64_t vd = c.at("v_head_dim"), kv = c.at("kv_lora_rank");
      if (c.at("q_lora_rank").is_null()) {
        linear(a + ".q_proj", heads * (nope + rope), h);
      } else {
        const int64_t q = c.at("q_lora_rank");
        linear(a + ".q_a_proj", q, h);
        norm(a + ".q_a_layernorm.weight", q);
        linear(a + ".q_b_proj", heads * (nope + rope), q);
      }
      linear(a + ".kv_a_proj_with_mqa", kv + rope, h);
      norm(a + ".kv_a_layernorm.weight", kv);
      linear(a + ".kv_b_proj", heads * (nope + vd), kv);
      linear(a + ".o_proj", h, heads * vd);
    } else {
      const int64_t kvh = c.at("num_key_value_heads");
      const int64_t hd = c.contains("head_dim") ? c.at("head_dim").get<int64_t>() : h / heads;
      linear(a + ".q_proj", heads * hd, h);
      linear(a + ".k_proj", kvh * hd, h);
      linear(a + ".v_proj", kvh * hd, h);
      linear(a + ".o_proj", h, heads * hd);
      if (type == "qwen3" || type == "qwen3_moe") {
        norm(a + ".q_norm.weight", hd);
        norm(a + ".k_norm.weight", hd);
      }
    }
    if (!is_moe(i)) {
      mlp(p + ".mlp", c.at("intermediate_size"));
      return;
    }
    const int64_t experts = deepseek ? c.at("n_routed_experts") : c.at("num_experts");
    const int64_t inter = c.at("moe_intermediate_size");
    e[p + ".mlp.gate.weight"] = {base, {experts, h}, Role::kRouter, h};
    if (c.value("topk_method", "") == "noaux_tc") {
      e[p + ".mlp.gate.e_score_correction_bias"] = {"F32", {experts}, Role::kBias};
    }
    for (int64_t x = 0; x < experts; ++x) mlp(p + ".mlp.experts." + std::to_string(x), inter);
    if (deepseek && c.at("n_shared_experts").get<int64_t>() > 0) {
      mlp(p + ".mlp.shared_experts", inter * c.at("n_shared_experts").get<int64_t>());
    }
  };
  e["model.embed_tokens.weight"] = {base, {vocab, h}, Role::kEmbed};
  for (int64_t i = 0; i < layers; ++i) layer(i);
  norm("model.norm.weight", h);
  if (!c.at("tie_word_embeddings").get<bool>()) {
    e["lm_head.weight"] = {base, {vocab, h}, Role::kLmHead, h};
  }
  for (int64_t j = 0; j < c.value("num_nextn_predict_layers", 0); ++j) {
    const std::string p = "model.layers." + std::to_string(layers + j);
    e[p + ".embed_tokens.weight"] = {base, {vocab, h}, Role::kEmbed};
    norm(p + ".enorm.weight", h);
    norm(p + ".hnorm.weight", h);
    e[p + ".eh_proj.weight"] = {base, {h, 2 * h}, Role::kProj, 2 * h};
    norm(p + ".shared_head.norm.weight", h);
    e[p + ".shared_head.head.weight"] = {base, {vocab, h}, Role::kLmHead, h};
    layer(layers + j);
  }
  return e;
}

struct Stats {
  double mean = 0, std = 0;
  float max_abs = 0;
  size_t nonzero = 0;
};

Stats stats_of(const std::vector<float>& v, float scale = 1.0f) {
  Stats s;
  double sum = 0, sq = 0;
  for (float x : v) {
    sum += x * scale;
    sq += double(x * scale) * (x * scale);
    s.max_abs = std::max(s.max_abs, std::fabs(x * scale));
    s.nonzero += x != 0.0f;
  }
  s.mean = sum / double(v.size());
  s.std = std::sqrt(std::max(0.0, sq / double(v.size()) - s.mean * s.mean));
  return s;
}

// Dequantised values of an FP8 weight; also checks every 128x128 block reaches 448 (amax scaling).
std::vector<float> dequantize(const StTensor& w, const StTensor& scale, const std::string& name) {
  std::vector<float> q = values_of(w), s = values_of(scale);
  const int64_t rows = w.shape[0], cols = w.shape[1], cb = scale.shape[1];
  std::vector<float> block_amax(s.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t b = static_cast<size_t>((r / 128) * cb + c / 128);
      float& x = q[static_cast<size_t>(r * cols + c)];
      block_amax[b] = std::max(block_amax[b], std::fabs(x));
      x *= s[b];
    }
  }
  for (size_t b = 0; b < s.size(); ++b) {
    EXPECT_GT(s[b], 0.0f) << name;
    EXPECT_EQ(block_amax[b], 448.0f) << name << " block " << b;
  }
  return q;
}

void check_values(const std::string& name, const Expected& e, const StTensor& t,
                  const std::map<std::string, StTensor>& all, const json& config) {
  if (e.role == Role::kScale) return;  // checked with its weight
  std::vector<float> v;
  if (t.dtype == "F8_E4M3") {
    v = dequantize(t, all.at(name + "_scale_inv"), name);
  } else {
    v = values_of(t);
  }
  Stats s = stats_of(v);
  ASSERT_GT(s.nonzero, v.size() * 9 / 10) << name << " is (mostly) zero";
  const int64_t h = config.at("hidden_size");
  const double n = static_cast<double>(v.size());
  // Relative tolerance for a std estimated from n samples (~3.5 standard errors), plus bf16/fp8.
  const double tol = 3.5 / std::sqrt(2.0 * n) + 0.03;
  auto expect_std = [&](double want) {
    EXPECT_NEAR(s.std / want, 1.0, tol) << name << " std " << s.std << " want " << want;
    EXPECT_NEAR(s.mean, 0.0, 4.0 * want / std::sqrt(n) + 1e-3) << name;
  };
  switch (e.role) {
    case Role::kProj:
    case Role::kRouter:
      expect_std(1.0 / std::sqrt(double(e.fan_in)));
      break;
    case Role::kLmHead:
      expect_std(1.0 / std::sqrt(double(h)));
      break;
    case Role::kEmbed:
      expect_std(config.at("tie_word_embeddings").get<bool>() ? std::pow(double(h), -0.25) : 1.0);
      break;
    case Role::kNorm:
      EXPECT_NEAR(s.mean, 1.0, 0.06) << name;
      EXPECT_GT(s.std, 0.05) << name;
      EXPECT_LT(s.std, 0.16) << name;
      break;
    case Role::kBias:
      EXPECT_GT(s.std, 0.01) << name;
      EXPECT_LT(s.max_abs, 0.3f) << name;
      break;
    case Role::kScale:
      break;
  }
}

// ---- fixtures -----------------------------------------------------------------------------------

class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              ("di_make_model_" + std::to_string(::getpid()) + "_" + tag)) {
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

MakeModelOptions options(const std::string& arch, const std::string& preset, const fs::path& dir,
                         uint64_t seed = 1) {
  MakeModelOptions o;
  o.arch = arch;
  o.preset = preset;
  o.out_dir = dir;
  o.seed = seed;
  o.progress = false;
  return o;
}

// Writes arch/preset, reads it back independently and checks every tensor against config.json.
std::map<std::string, StTensor> write_and_check(const MakeModelOptions& o, json* config_out) {
  MakeModelReport r = make_model(o);
  json config = json::parse(read_file(o.out_dir / "config.json"));
  json gen = json::parse(read_file(o.out_dir / "generation_config.json"));
  EXPECT_EQ(gen.at("eos_token_id"), config.at("eos_token_id"));
  EXPECT_LT(config.at("eos_token_id").get<int64_t>(), config.at("vocab_size").get<int64_t>());
  std::map<std::string, StTensor> got = read_model(o.out_dir);
  std::map<std::string, Expected> want = expected_tensors(config);
  for (const auto& [name, e] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << "missing tensor " << name;
      continue;
    }
    EXPECT_EQ(it->second.dtype, e.dtype) << name;
    EXPECT_EQ(it->second.shape, e.shape) << name;
    if (it->second.dtype == e.dtype && it->second.shape == e.shape) {
      check_values(name, e, it->second, got, config);
    }
  }
  for (const auto& [name, t] : got) EXPECT_TRUE(want.count(name)) << "unexpected tensor " << name;
  EXPECT_EQ(r.num_tensors, static_cast<int64_t>(want.size()));
  if (config_out) *config_out = config;
  return got;
}

// ---- tests --------------------------------------------------------------------------------------

class TinyPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyPreset, MatchesHfLayoutAndScales) {
  const std::string arch = GetParam();
  TempDir dir("tiny_" + arch);
  json c;
  auto got = write_and_check(options(arch, "tiny", dir.path()), &c);
  EXPECT_LT(fs::file_size(dir.path() / "model.safetensors"), 1'200'000u);
  EXPECT_EQ(c.at("model_type"), arch);
  EXPECT_EQ(c.at("vocab_size"), 1000);
  EXPECT_EQ(c.at("torch_dtype"), "bfloat16");
  const int64_t heads = c.at("num_attention_heads");
  EXPECT_EQ(heads % 2, 1) << "tiny presets use odd head counts";
  if (arch == "llama") {
    EXPECT_EQ(c.at("architectures")[0], "LlamaForCausalLM");
    EXPECT_EQ(c.at("rope_scaling").at("rope_type"), "llama3");
    for (const char* k :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      EXPECT_TRUE(c.at("rope_scaling").contains(k)) << k;
    }
    EXPECT_LT(c.at("num_key_value_heads").get<int64_t>(), heads);
  } else if (arch == "qwen3") {
    EXPECT_EQ(c.at("architectures")[0], "Qwen3ForCausalLM");
    EXPECT_NE(c.at("head_dim").get<int64_t>() * heads, c.at("hidden_size").get<int64_t>());
    EXPECT_TRUE(c.at("tie_word_embeddings").get<bool>());
    EXPECT_FALSE(got.count("lm_head.weight"));
  } else if (arch == "qwen3_moe") {
    EXPECT_EQ(c.at("architectures")[0], "Qwen3MoeForCausalLM");
    for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                          "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}) {
      EXPECT_TRUE(c.contains(k)) << k;
    }
    EXPECT_TRUE(got.count("model.layers.1.mlp.gate_proj.weight"));  // an mlp_only layer
    EXPECT_TRUE(got.count("model.layers.2.mlp.experts.7.down_proj.weight"));
  } else {
    const bool v3 = arch == "deepseek_v3";
    EXPECT_EQ(c.at("architectures")[0], v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM");
    EXPECT_EQ(c.at("rope_scaling").at("type"), "yarn");
    EXPECT_EQ(c.at("scoring_func"), v3 ? "sigmoid" : "softmax");
    EXPECT_EQ(c.at("topk_method"), v3 ? "noaux_tc" : "group_limited_greedy");
    EXPECT_EQ(c.at("q_lora_rank").is_null(), !v3);
    for (const char* k : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                          "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                          "moe_intermediate_size", "first_k_dense_replace", "n_group", "topk_group",
                          "routed_scaling_factor", "norm_topk_prob"}) {
      EXPECT_TRUE(c.contains(k)) << k;
    }
    EXPECT_TRUE(got.count("model.layers.0.mlp.down_proj.weight"));  // first_k_dense_replace
    EXPECT_TRUE(got.count("model.layers.1.mlp.shared_experts.up_proj.weight"));
    if (v3) {
      EXPECT_EQ(c.at("num_nextn_predict_layers"), 1);
      // The MTP layer's copies equal the main embedding and head, as in DeepSeek's checkpoints.
      EXPECT_EQ(got.at("model.layers.3.embed_tokens.weight").bytes,
                got.at("model.embed_tokens.weight").bytes);
      EXPECT_EQ(got.at("model.layers.3.shared_head.head.weight").bytes,
                got.at("lm_head.weight").bytes);
      EXPECT_NE(got.at("model.layers.3.enorm.weight").bytes,
                got.at("model.layers.3.hnorm.weight").bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyPreset,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "deepseek_v2",
                                           "deepseek_v3"));

TEST(MakeModel, SmallPresetsMatchHfLayout) {
  for (const std::string arch : {"qwen3_moe", "deepseek_v2"}) {
    TempDir dir("small_" + arch);
    json c;
    write_and_check(options(arch, "small", dir.path()), &c);
    if (arch == "qwen3_moe") {
      EXPECT_EQ(c.at("decoder_sparse_step"), 2);
    } else {
      EXPECT_FALSE(c.at("q_lora_rank").is_null());
    }
  }
}

TEST(MakeModel, SameSeedSameBytesDifferentSeedDifferentValues) {
  TempDir a("seed_a"), b("seed_b"), c("seed_c");
  make_model(options("llama", "tiny", a.path(), 7));
  make_model(options("llama", "tiny", b.path(), 7));
  make_model(options("llama", "tiny", c.path(), 8));
  const std::string fa = read_file(a.path() / "model.safetensors");
  EXPECT_EQ(fa, read_file(b.path() / "model.safetensors"));
  EXPECT_EQ(read_file(a.path() / "config.json"), read_file(b.path() / "config.json"));
  auto ta = read_safetensors(a.path() / "model.safetensors");
  auto tc = read_safetensors(c.path() / "model.safetensors");
  ASSERT_EQ(ta.size(), tc.size());
  for (const auto& [name, t] : ta) {
    EXPECT_EQ(t.shape, tc.at(name).shape);
    EXPECT_NE(t.bytes, tc.at(name).bytes) << name;
  }
  // Different tensors of one model are different streams.
  EXPECT_NE(ta.at("model.layers.0.self_attn.q_proj.weight").bytes.substr(0, 64),
            ta.at("model.layers.0.self_attn.o_proj.weight").bytes.substr(0, 64));
}

TEST(MakeModel, ShardsAndIndexAreConsistentAndHoldTheSameValues) {
  TempDir single("shard_single"), sharded("shard_many");
  auto one = write_and_check(options("deepseek_v3", "tiny", single.path()), nullptr);
  MakeModelOptions o = options("deepseek_v3", "tiny", sharded.path());
  o.max_shard_bytes = 150'000;
  MakeModelReport r = make_model(o);
  ASSERT_GT(r.shards.size(), 3u);
  EXPECT_FALSE(fs::exists(sharded.path() / "model.safetensors"));
  json index = json::parse(read_file(sharded.path() / "model.safetensors.index.json"));
  std::set<std::string> files;
  for (auto& [name, f] : index.at("weight_map").items()) files.insert(f.get<std::string>());
  EXPECT_EQ(files.size(), r.shards.size());
  const size_t n = r.shards.size();
  for (size_t k = 1; k <= n; ++k) {
    char want[64];
    std::snprintf(want, sizeof(want), "model-%05zu-of-%05zu.safetensors", k, n);
    EXPECT_TRUE(files.count(want)) << want;
    // A shard exceeds the limit only when it holds one oversized tensor (or FP8 weight + scales).
    uint64_t data = 0;
    auto shard = read_safetensors(sharded.path() / want);
    for (auto& [name, t] : shard) data += t.bytes.size();
    if (shard.size() > 1) {
      EXPECT_LE(data, o.max_shard_bytes) << want;
    }
  }
  auto many = read_model(sharded.path());
  ASSERT_EQ(many.size(), one.size());
  for (const auto& [name, t] : one) EXPECT_EQ(many.at(name).bytes, t.bytes) << name;
  // Re-running into the same directory without sharding removes the stale shards.
  o.max_shard_bytes = 1ull << 40;
  make_model(o);
  EXPECT_TRUE(fs::exists(sharded.path() / "model.safetensors"));
  EXPECT_FALSE(fs::exists(sharded.path() / "model.safetensors.index.json"));
  EXPECT_EQ(read_file(sharded.path() / "model.safetensors"),
            read_file(single.path() / "model.safetensors"));
}

TEST(MakeModel, DeepseekFp8BlockScales) {
  TempDir dir("fp8");
  MakeModelOptions o = options("deepseek_v3", "small", dir.path());
  o.fp8 = true;
  json c;
  auto got = write_and_check(o, &c);  // dequantised std and per-block amax == 448 checked there
  const json& q = c.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "fp8");
  EXPECT_EQ(q.at("fmt"), "e4m3");
  EXPECT_EQ(q.at("activation_scheme"), "dynamic");
  EXPECT_EQ(q.at("weight_block_size"), json::array({128, 128}));
  // Multi-block scales with a short last block: kv_a_proj_with_mqa is [64 + 16, 256].
  EXPECT_EQ(got.at("model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv").shape,
            (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(got.at("model.layers.0.mlp.down_proj.weight_scale_inv").shape,
            (std::vector<int64_t>{2, 4}));
  // Not quantised, as in DeepSeek's checkpoints.
  EXPECT_EQ(got.at("model.layers.1.mlp.gate.weight").dtype, "BF16");
  EXPECT_EQ(got.at("model.layers.4.eh_proj.weight").dtype, "BF16");
  EXPECT_EQ(got.at("lm_head.weight").dtype, "BF16");
  EXPECT_EQ(got.at("model.norm.weight").dtype, "BF16");
}

TEST(MakeModel, F32IsTheUnroundedBf16Model) {
  TempDir b("dtype_bf16"), f("dtype_f32");
  make_model(options("qwen3", "tiny", b.path()));
  MakeModelOptions o = options("qwen3", "tiny", f.path());
  o.dtype = DType::kF32;
  json c;
  auto f32 = write_and_check(o, &c);
  EXPECT_EQ(c.at("torch_dtype"), "float32");
  auto bf16 = read_safetensors(b.path() / "model.safetensors");
  for (const auto& [name, t] : bf16) {
    std::vector<float> wide = values_of(f32.at(name));
    std::vector<float> narrow = values_of(t);
    ASSERT_EQ(wide.size(), narrow.size());
    for (size_t i = 0; i < wide.size(); ++i) {
      ASSERT_EQ(bf16_to_f32(f32_to_bf16(wide[i])), narrow[i]) << name << "[" << i << "]";
    }
  }
}

TEST(MakeModel, InvalidCombinationsAreClearErrors) {
  auto bad = model_spec("llama", "qwen3-30b-a3b");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tiny, small, llama3-8b"), std::string::npos)
      << bad.status().message();
  auto unknown = model_spec("gpt2", "tiny");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("deepseek_v3"), std::string::npos);
  EXPECT_THROW(make_model(options("qwen3", "deepseek-v2-lite", "/nonexistent/x")), Error);
  EXPECT_EQ(presets_for("qwen3"), (std::vector<std::string>{"tiny", "small"}));
  EXPECT_TRUE(presets_for("mistral").empty());
  for (const std::string& arch : supported_archs()) {
    for (const std::string& preset : presets_for(arch)) {
      EXPECT_TRUE(model_spec(arch, preset).is_ok()) << arch << " " << preset;
    }
  }
}

TEST(MakeModel, DryRunReportsRealCheckpointSizesWithoutWriting) {
  TempDir dir("dry");
  MakeModelOptions o = options("llama", "llama3-8b", dir.path());
  o.dry_run = true;
  MakeModelReport r = make_model(o);
  EXPECT_FALSE(fs::exists(dir.path()));
  EXPECT_EQ(r.num_params, 8'030'261'248);  // Llama-3.1-8B
  EXPECT_EQ(r.data_bytes, 2u * 8'030'261'248u);
  EXPECT_EQ(r.shards.size(), 5u);
  EXPECT_EQ(r.shards[0].file, "model-00001-of-00005.safetensors");
  o.arch = "qwen3_moe", o.preset = "qwen3-30b-a3b";
  EXPECT_NEAR(double(make_model(o).num_params), 30.53e9, 0.01e9);  // Qwen3-30B-A3B
  o.arch = "deepseek_v2", o.preset = "deepseek-v2-lite";
  EXPECT_NEAR(double(make_model(o).num_params), 15.71e9, 0.01e9);  // DeepSeek-V2-Lite
  o.arch = "deepseek_v3", o.preset = "deepseek-v3-fp8-small";
  MakeModelReport v3 = make_model(o);
  EXPECT_TRUE(v3.spec.fp8);
  EXPECT_LT(v3.data_bytes, 5'000'000'000u);
}

TEST(MakeModel, ConfigOnlyWritesTheConfigsAndNoWeights) {
  TempDir dir("config_only");
  MakeModelOptions o = options("deepseek_v2", "deepseek-v2-lite", dir.path());
  o.config_only = true;
  o.vocab_size = 129280;  // the DeepSeek-V3 tokenizer's
  make_model(o);
  EXPECT_TRUE(fs::exists(dir.path() / "config.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "generation_config.json"));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_FALSE(e.path().extension() == ".safetensors") << e.path();
  std::ifstream in(dir.path() / "config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c.at("vocab_size").get<int64_t>(), 129280);
  EXPECT_EQ(c.at("num_hidden_layers").get<int64_t>(), 27);
  o.vocab_size = -1;
  EXPECT_THROW(make_model(o), std::exception);
}

// ---- the writer on its own
// ------------------------------------------------------------------------

TEST(SafetensorsWriter, StreamsChunksAndChecksBoundaries) {
  TempDir dir("writer");
  fs::create_directories(dir.path());
  const fs::path p = dir.path() / "t.safetensors";
  {
    SafetensorsWriter w(
        p, {{"a", DType::kF32, {2, 3}}, {"empty", DType::kBF16, {0, 4}}, {"b", DType::kU8, {5}}},
        {{"format", "pt"}});
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    auto bytes = std::as_bytes(std::span<const float>(a));
    w.append(bytes.subspan(0, 10));
    w.append(bytes.subspan(10));
    EXPECT_EQ(w.current_tensor(), 2u);  // "empty" was skipped
    const std::byte six[6] = {};
    EXPECT_THROW(w.append(six), Error);  // crosses the end of "b"
    const std::byte five[5] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                               std::byte{5}};
    w.append(five);
    w.finish();
  }
  json meta;
  auto t = read_safetensors(p, &meta);
  EXPECT_EQ(meta.at("format"), "pt");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(values_of(t.at("a")), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.at("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(t.at("b").bytes, std::string("\x01\x02\x03\x04\x05", 5));

  SafetensorsWriter short_write(dir.path() / "short.safetensors", {{"x", DType::kF32, {4}}});
  const std::byte four[4] = {};
  short_write.append(four);
  EXPECT_THROW(short_write.finish(), Error);
  EXPECT_THROW(SafetensorsWriter(dir.path() / "dup.safetensors",
                                 {{"x", DType::kF32, {1}}, {"x", DType::kF32, {1}}}),
               Error);
}

}  // namespace
}  // namespace di::model
