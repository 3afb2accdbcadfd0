#pragma once
// A loaded model: weights on a backend and a forward pass over a paged batch.
//
//   auto model = load_model("/models/tiny", backend, {});
//   KvLayout layout = model->kv_layout(num_blocks, 64);
//   Tensor logits = model->forward(token_ids, batch, pool, logit_rows);   // [R, vocab]
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace di {

struct RandomWeights;  // model/weight_loader.h
struct MoeBlock;  // model/layers.h

struct LoadOptions {
  // Longest context the engine will run; sizes the rope tables. 0 = max_position_embeddings.
  int64_t max_context = 0;
  // Set by make_random_model(): weights come from RandomWeights, not from the checkpoint.
  const RandomWeights* random = nullptr;
  // On an f32 backend, weights and rope tables rounded to bf16 precision, as a bf16 backend
  // stores them: the reference that isolates bf16 kernels' own error (tests/ops/test_cuda_golden).
  bool round_weights_to_bf16 = false;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  int64_t max_context() const { return max_context_; }

  // Per-token, per-layer width of a KV entry in elements (GQA: 2·kv_heads·head_dim; MLA:
  // kv_lora_rank + qk_rope_head_dim).
  virtual int32_t kv_entry_size() const = 0;
  KvLayout kv_layout(int32_t num_blocks, int32_t block_size) const {
    return KvLayout{num_blocks, static_cast<int32_t>(config_.num_hidden_layers), block_size,
                    kv_entry_size()};
  }

  // Runs every layer over the batch's new tokens, writing their KV into `pool`, and returns the
  // logits [R, vocab] of the token rows listed in `logit_rows` ([R] i32 on the device).
  virtual Tensor forward(const Tensor& token_ids, const PagedBatch& batch, Tensor& pool,
                         const Tensor& logit_rows) = 0;

  // Whether the checkpoint carried DeepSeek's multi-token-prediction layers (loaded, for the
  // speculative decoder).
  virtual int64_t num_mtp_layers() const { return 0; }

  // The routed MoE blocks of the main layers in layer order (not the MTP layers), for the EPLB
  // runtime (engine/eplb_runtime.h); empty for dense models.
  virtual std::vector<MoeBlock*> moe_blocks() { return {}; }

 protected:
  Model(ModelConfig config, Backend& backend) : config_(std::move(config)), backend_(backend) {}
  ModelConfig config_;
  Backend& backend_;
  int64_t max_context_ = 0;
};

// Loads config.json + safetensors from `model_dir` onto `backend`. Throws di::Error naming the
// file and tensor on missing or unexpected tensors, shape mismatches, unsupported architectures
// or dtypes, and truncated or corrupt files.
std::unique_ptr<Model> load_model(const std::string& model_dir, Backend& backend,
                                  const LoadOptions& options = {});

// The model of `config` with random weights made directly on `backend` (no checkpoint, nothing
// written): benchmarks at real shapes and tests. Deterministic for random.seed; see RandomWeights.
//   RandomWeights r{.seed = 1, .fill = [&](Tensor& t, uint64_t s, float a) { cuda.fill_random(t, s, a); }};
//   auto model = make_random_model(config, cuda, r, {.max_context = 4096});
std::unique_ptr<Model> make_random_model(const ModelConfig& config, Backend& backend,
                                         const RandomWeights& random, LoadOptions options = {});

}  // namespace di
