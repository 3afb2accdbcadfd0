#pragma once
// Reads checkpoint tensors, converts them to the backend's compute dtype and uploads them.
// FP8 (e4m3) weights with `<name>_scale_inv` 128×128 block scales are dequantized on the CPU
// backend (the reference); tied embeddings and expert stacking are handled here too.
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace di {

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& ck, Backend& backend, const ModelConfig& config)
      : ck_(ck), backend_(backend), config_(config) {}

  bool has(const std::string& name) const { return ck_.has(name); }
  // The tensor `name` with shape `shape`, in the compute dtype, on the device.
  Tensor load(const std::string& name, const Shape& shape);
  Tensor load_optional(const std::string& name, const Shape& shape);  // null if absent
  // Host f32 copy of a tensor (dequantizing FP8 with its block scales).
  Tensor load_host_f32(const std::string& name, const Shape& shape);
  // Row-wise concatenation of several [rows_i, cols] tensors into one [Σ rows_i, cols].
  Tensor load_concat_rows(const std::vector<std::string>& names, const std::vector<Shape>& shapes);
  // Stacks per-expert weights: prefix + "{e}." + suffix for e in [0, num_experts).
  ExpertWeights load_experts(const std::string& prefix, int64_t num_experts, int64_t hidden,
                             int64_t inter);
  Tensor upload(const Tensor& host_f32);

 private:
  const Checkpoint& ck_;
  Backend& backend_;
  const ModelConfig& config_;
};

}  // namespace di
