// Model loading: config parsing, safetensors (single and sharded), and the errors a user sees
// for broken checkpoints — each must name the file and the tensor.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace di {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TensorSpec {
  std::string name;
  Shape shape;
  std::string dtype = "F32";
};

// Writes a safetensors file of random values (an independent writer, so the reader is tested
// against the format, not against itself).
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& specs,
                       size_t truncate_data_by = 0) {
  json header = json::object();
  std::string data;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  for (const auto& s : specs) {
    size_t n = static_cast<size_t>(shape_numel(s.shape));
    size_t begin = data.size();
    if (s.dtype == "F32") {
      for (size_t i = 0; i < n; ++i) {
        float v = dist(rng);
        data.append(reinterpret_cast<const char*>(&v), 4);
      }
    } else if (s.dtype == "BF16") {
      for (size_t i = 0; i < n; ++i) {
        uint16_t v = f32_to_bf16(dist(rng));
        data.append(reinterpret_cast<const char*>(&v), 2);
      }
    } else {
      data.append(n * 2, '\0');  // an unsupported dtype's bytes
    }
    header[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  uint64_t len = h.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(data.data(), static_cast<std::streamsize>(data.size() - truncate_data_by));
}

json tiny_llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 37},
          {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 1},
          {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"rms_norm_eps", 1e-5},
          {"max_position_embeddings", 64}, {"tie_word_embeddings", true}, {"hidden_act", "silu"}};
}

std::vector<TensorSpec> tiny_llama_tensors(const std::string& dtype = "F32") {
  return {{"model.embed_tokens.weight", {37, 16}, dtype},
          {"model.norm.weight", {16}, dtype},
          {"model.layers.0.input_layernorm.weight", {16}, dtype},
          {"model.layers.0.post_attention_layernorm.weight", {16}, dtype},
          {"model.layers.0.self_attn.q_proj.weight", {16, 16}, dtype},
          {"model.layers.0.self_attn.k_proj.weight", {8, 16}, dtype},
          {"model.layers.0.self_attn.v_proj.weight", {8, 16}, dtype},
          {"model.layers.0.self_attn.o_proj.weight", {16, 16}, dtype},
          {"model.layers.0.mlp.gate_proj.weight", {24, 16}, dtype},
          {"model.layers.0.mlp.up_proj.weight", {24, 16}, dtype},
          {"model.layers.0.mlp.down_proj.weight", {16, 24}, dtype}};
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("di_loader_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_config(const json& j) { std::ofstream(dir_ / "config.json") << j.dump(); }
  std::string load_error() {
    auto be = make_cpu_backend();
    try {
      load_model(dir_.string(), *be);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(LoaderTest, LoadsSingleFileAndTiedEmbeddings) {
  write_config(tiny_llama_config());
  write_safetensors((dir_ / "model.safetensors").string(), tiny_llama_tensors());
  auto be = make_cpu_backend();
  auto model = load_model(dir_.string(), *be);
  EXPECT_EQ(model->config().arch, Arch::kLlama);
  EXPECT_EQ(model->kv_entry_size(), 2 * 1 * 8);
}

TEST_F(LoaderTest, ShardedEqualsSingleFile) {
  write_config(tiny_llama_config());
  auto specs = tiny_llama_tensors("BF16");
  write_safetensors((dir_ / "model.safetensors").string(), specs);
  // Same tensors split over two shards with an index.
  fs::path sharded = dir_ / "sharded";
  fs::create_directories(sharded);
  std::ofstream(sharded / "config.json") << tiny_llama_config().dump();
  Checkpoint single = Checkpoint::open(dir_.string()).value();
  json weight_map = json::object();
  for (int shard = 0; shard < 2; ++shard) {
    json header = json::object();
    std::string data;
    for (size_t i = static_cast<size_t>(shard); i < specs.size(); i += 2) {
      Tensor t = single.get(specs[i].name);
      size_t begin = data.size();
      data.append(static_cast<const char*>(t.raw()), t.nbytes());
      header[specs[i].name] = {{"dtype", "BF16"}, {"shape", t.shape()}, {"data_offsets", {begin, data.size()}}};
      weight_map[specs[i].name] = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    }
    std::string h = header.dump();
    uint64_t len = h.size();
    std::ofstream f(sharded / ("model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  std::ofstream(sharded / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump();

  auto be = make_cpu_backend();
  auto a = load_model(dir_.string(), *be);
  auto b = load_model(sharded.string(), *be);
  PagedBatch batch;
  auto i32 = [](std::vector<int32_t> v) {
    Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  };
  batch.positions = i32({0, 1, 2});
  batch.slot_mapping = i32({0, 1, 2});
  batch.qo_indptr = i32({0, 3});
  batch.kv_indptr = i32({0, 1});
  batch.kv_indices = i32({0});
  batch.kv_last_len = i32({3});
  batch.num_seqs = 1;
  batch.num_tokens = 3;
  Tensor ids = i32({1, 5, 9});
  Tensor rows = i32({2});
  Tensor pool_a = Tensor::zeros({1, 1, 64, a->kv_entry_size()}, DType::kF32);
  Tensor pool_b = pool_a.clone();
  Tensor la = a->forward(ids, batch, pool_a, rows);
  Tensor lb = b->forward(ids, batch, pool_b, rows);
  ASSERT_EQ(la.numel(), 37);
  for (int64_t i = 0; i < la.numel(); ++i) EXPECT_EQ(la.f32()[i], lb.f32()[i]);
}

TEST_F(LoaderTest, MissingTensorIsNamed) {
  write_config(tiny_llama_config());
  auto specs = tiny_llama_tensors();
  specs.erase(specs.begin() + 5);  // k_proj
  write_safetensors((dir_ / "model.safetensors").string(), specs);
  std::string err = load_error();
  EXPECT_NE(err.find("missing tensor 'model.layers.0.self_attn.k_proj.weight'"), std::string::npos) << err;
}

TEST_F(LoaderTest, UnexpectedTensorIsNamedWithFile) {
  write_config(tiny_llama_config());
  auto specs = tiny_llama_tensors();
  specs.push_back({"model.layers.0.self_attn.rotary_extra", {4}});
  write_safetensors((dir_ / "model.safetensors").string(), specs);
  std::string err = load_error();
  EXPECT_NE(err.find("unexpected tensor"), std::string::npos) << err;
  EXPECT_NE(err.find("rotary_extra"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST_F(LoaderTest, ShapeMismatchNamesFileTensorAndShapes) {
  write_config(tiny_llama_config());
  auto specs = tiny_llama_tensors();
  specs[8].shape = {25, 16};  // gate_proj
  write_safetensors((dir_ / "model.safetensors").string(), specs);
  std::string err = load_error();
  EXPECT_NE(err.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[25, 16]"), std::string::npos) << err;
  EXPECT_NE(err.find("[24, 16]"), std::string::npos) << err;
}

TEST_F(LoaderTest, UnsupportedArchitecture) {
  json c = tiny_llama_config();
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  write_config(c);
  write_safetensors((dir_ / "model.safetensors").string(), tiny_llama_tensors());
  std::string err = load_error();
  EXPECT_NE(err.find("unsupported architecture 'GPT2LMHeadModel'"), std::string::npos) << err;
}

TEST_F(LoaderTest, UnsupportedDtypeIsNamed) {
  write_config(tiny_llama_config());
  auto specs = tiny_llama_tensors();
  specs[1].dtype = "F64";
  // The dtype is rejected before sizes are checked.
  write_safetensors((dir_ / "model.safetensors").string(), specs);
  std::string err = load_error();
  EXPECT_NE(err.find("unsupported dtype F64"), std::string::npos) << err;
  EXPECT_NE(err.find("model.norm.weight"), std::string::npos) << err;
}

TEST_F(LoaderTest, TruncatedFileIsReported) {
  write_config(tiny_llama_config());
  write_safetensors((dir_ / "model.safetensors").string(), tiny_llama_tensors(), 100);
  std::string err = load_error();
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST_F(LoaderTest, CorruptHeaderIsReported) {
  write_config(tiny_llama_config());
  {
    std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
    uint64_t len = 20;
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << "{\"a\": {\"dtype\": oops";
  }
  std::string err = load_error();
  EXPECT_NE(err.find("corrupt header JSON"), std::string::npos) << err;
}

TEST_F(LoaderTest, MissingConfigAndWeights) {
  std::string err = load_error();
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  write_config(tiny_llama_config());
  err = load_error();
  EXPECT_NE(err.find("no model.safetensors"), std::string::npos) << err;
}

TEST_F(LoaderTest, MinLoadedWeightBytesCountsTheComputeDtype) {
  write_safetensors((dir_ / "model.safetensors").string(), tiny_llama_tensors("BF16"));
  const Checkpoint ck = Checkpoint::open(dir_.string()).value();
  int64_t numel = 0;
  for (const TensorSpec& t : tiny_llama_tensors()) numel += shape_numel(t.shape);
  auto cpu = make_cpu_backend();
  EXPECT_EQ(min_loaded_weight_bytes(ck, *cpu), numel * 4);  // bf16 stored, f32 on the CPU
}

// A checkpoint whose weights cannot fit is refused from its headers, before anything is
// allocated: a 1 TiB bf16 tensor in a sparse file (no disk used, nothing read).
TEST_F(LoaderTest, CheckpointLargerThanMemoryIsRefusedBeforeLoading) {
  auto cpu = make_cpu_backend();
  const int64_t have = cpu->available_memory_bytes();
  ASSERT_GT(have, 0) << "MemAvailable of /proc/meminfo";
  write_config(tiny_llama_config());
  const int64_t rows = int64_t{1} << 20, cols = int64_t{1} << 19;  // 2^39 elements, 1 TiB
  const uint64_t nbytes = static_cast<uint64_t>(rows * cols * 2);
  json header = json::object();
  header["model.embed_tokens.weight"] = {
      {"dtype", "BF16"}, {"shape", {rows, cols}}, {"data_offsets", {0, nbytes}}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const fs::path file = dir_ / "model.safetensors";
  {
    std::ofstream f(file, std::ios::binary);
    const uint64_t len = h.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
  }
  fs::resize_file(file, 8 + h.size() + nbytes);  // sparse
  const Checkpoint ck = Checkpoint::open(dir_.string()).value();
  EXPECT_EQ(min_loaded_weight_bytes(ck, *cpu), rows * cols * 4);
  const std::string err = load_error();
  EXPECT_NE(err.find("need at least 2199.0 GB on the cpu backend (as f32)"), std::string::npos)
      << err;
  EXPECT_NE(err.find("GB is available (MemAvailable)"), std::string::npos) << err;
  EXPECT_NE(err.find(dir_.string()), std::string::npos) << err;
}

TEST(Config, ParsesTransformers5RopeParametersAndLegacyRopeScaling) {
  json c = tiny_llama_config();
  c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  auto a = parse_model_config(c.dump(), "a").value();
  EXPECT_EQ(a.rope.type, RopeConfig::Type::kLlama3);
  EXPECT_EQ(a.rope.theta, 500000.0);
  EXPECT_EQ(a.rope.original_max_position_embeddings.value(), 8192);
  json d = tiny_llama_config();
  d["rope_theta"] = 1000.0;
  d["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"mscale", 0.707}};
  auto b = parse_model_config(d.dump(), "b").value();
  EXPECT_EQ(b.rope.type, RopeConfig::Type::kYarn);
  EXPECT_EQ(b.rope.theta, 1000.0);
  EXPECT_DOUBLE_EQ(*b.rope.mscale, 0.707);
  json e = tiny_llama_config();
  e["num_key_value_heads"] = 3;
  auto bad = parse_model_config(e.dump(), "e");
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("not a multiple"), std::string::npos);
  EXPECT_FALSE(parse_model_config("{not json", "x.json").is_ok());
}

}  // namespace
}  // namespace di
