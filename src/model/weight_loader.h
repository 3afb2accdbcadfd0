#pragma once
// Reads checkpoint tensors, converts them to the backend's compute dtype and uploads them.
// FP8 (e4m3) weights with `<name>_scale_inv` 128×128 block scales are dequantized on the CPU
// backend (the reference); tied embeddings and expert stacking are handled here too.
//
// Block-scaled FP8 on the device (issue #6): load() and load_concat_rows() keep a weight in FP8 —
// the e4m3 bytes plus its f32 scale_inv attached as Tensor::block_scales() — when all of these
// hold: the checkpoint stores it as e4m3 with `_scale_inv`, it is 2-D, the blocks are 128×128,
// every concatenated part has a multiple of 128 rows (so the scale rows concatenate too), and
// backend.supports_fp8_block_linear(n, k) says yes for the whole [n, k]. Otherwise it is
// dequantized exactly as before. Only linear weights are stored as FP8 in DeepSeek checkpoints
// (embeddings, norms, the router gate and lm_head are bf16), so what load() keeps in FP8 only
// ever reaches Backend::linear. load_host_f32 (e.g. kv_b_proj, split on the host) and
// load_experts (MoE experts: TODO(#6) grouped FP8 GEMM) always dequantize.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace di {

// A lower bound of the bytes `ck`'s tensors take once loaded on `backend`: every element at the
// size of the backend's compute dtype, except an FP8 weight the backend could keep as FP8
// (supports_fp8_block_linear for its shape: one byte an element). Nothing is loaded at fewer
// bytes, so load_model can refuse a checkpoint that cannot fit before it allocates anything.
int64_t min_loaded_weight_bytes(const Checkpoint& ck, const Backend& backend);

// Random weights instead of a checkpoint (benchmarks at real shapes without writing safetensors,
// tests). Every tensor a model asks for is made with the requested shape: values uniform in
// (-a, a) with a = sqrt(3 / fan_in) (std 1/sqrt(fan_in), fan_in = the last dim) for matrices,
// a = 1 for embed_tokens, 1 + u(-0.1, 0.1) for 1-D norm weights, u(-0.05, 0.05) for other 1-D
// tensors (biases). Optional tensors are absent (has() is false: no MTP layers, tied heads stay
// tied). The stream of a tensor is a hash of (seed, name), so a model is deterministic for a seed.
struct RandomWeights {
  uint64_t seed = 0;
  // Fills a device tensor of the compute dtype with uniform(-scale, scale) from `seed` (e.g.
  // CudaBackend::fill_random). Null: values are generated on the host (the same counter hash as
  // the CUDA fill_random kernel) and uploaded. 1-D tensors always come from the host.
  std::function<void(Tensor& t, uint64_t seed, float scale)> fill;
};

// Host f32 values of RandomWeights for the tensor `name` (what load() returns, before the
// conversion to the compute dtype when `fill` is null).
Tensor random_weight_host(const RandomWeights& r, const std::string& name, const Shape& shape);

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ck, Backend& backend, const ModelConfig& config,
               const RandomWeights* random = nullptr)
      : ck_(ck), backend_(backend), config_(config), random_(random) {}

  bool has(const std::string& name) const { return random_ == nullptr && ck_.has(name); }
  // The tensor `name` with shape `shape`, in the compute dtype, on the device.
  Tensor load(const std::string& name, const Shape& shape);
  Tensor load_optional(const std::string& name, const Shape& shape);  // null if absent
  // Host f32 copy of a tensor (dequantizing FP8 with its block scales).
  Tensor load_host_f32(const std::string& name, const Shape& shape);
  // Row-wise concatenation of several [rows_i, cols] tensors into one [Σ rows_i, cols].
  Tensor load_concat_rows(const std::vector<std::string>& names, const std::vector<Shape>& shapes);
  // Whether load_concat_rows(names, shapes) (load() for one name) keeps the weight in FP8 on
  // this backend: the conditions at the top of this file. False for random weights.
  bool keeps_fp8(const std::vector<std::string>& names, const std::vector<Shape>& shapes) const;
  // Stacks per-expert weights: prefix + "{e}." + suffix for e in [0, num_experts).
  ExpertWeights load_experts(const std::string& prefix, int64_t num_experts, int64_t hidden,
                             int64_t inter);
  Tensor upload(const Tensor& host_f32);
  // On an f32 backend, round every uploaded tensor to bf16 precision first, as a bf16 backend
  // stores it (LoadOptions::round_weights_to_bf16).
  void set_round_to_bf16(bool on) { round_bf16_ = on; }
  // Number of weights kept in FP8 by this loader so far (tests, logs).
  int64_t num_fp8_kept() const { return num_fp8_kept_; }

 private:
  const Checkpoint& ck_;
  Backend& backend_;
  const ModelConfig& config_;
  int64_t num_fp8_kept_ = 0;
  int64_t random_bytes_made_ = 0;
  // Random weights have no checkpoint to size up front (min_loaded_weight_bytes): each tensor
  // checks that it fits before it is made, so a model too large for the backend stops with a
  // message instead of an out-of-memory kill halfway.
  void check_random_fits(const std::string& name, const Shape& shape);
  bool round_bf16_ = false;

  // The row-concatenation of `names` as a device FP8 weight with block scales, or a null Tensor
  // when the conditions above do not hold (the caller dequantizes).
  Tensor try_load_fp8(const std::vector<std::string>& names, const std::vector<Shape>& shapes);
  const RandomWeights* random_ = nullptr;
};

}  // namespace di
