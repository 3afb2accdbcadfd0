#include "model/weight_loader.h"

#include <cstring>

#include "core/thread_pool.h"

namespace di {

Tensor WeightLoader::upload(const Tensor& host_f32) {
  if (backend_.device() == Device::kCPU && backend_.compute_dtype() == DType::kF32) return host_f32;
  return backend_.upload(host_f32, backend_.compute_dtype());
}

Tensor WeightLoader::load_host_f32(const std::string& name, const Shape& shape) {
  Tensor stored = ck_.get(name, shape);
  if (stored.dtype() != DType::kFP8E4M3) return stored.to_f32();
  // DeepSeek FP8: w[i, j] = fp8[i, j] * scale_inv[i / bn, j / bk]
  const std::string scale_name = name + "_scale_inv";
  DI_CHECK(shape.size() == 2, "{}: FP8 tensor '{}' must be 2-D, got {}", ck_.file_of(name), name,
           shape_str(shape));
  const int64_t bn = config_.fp8_block_n, bk = config_.fp8_block_k;
  const int64_t rows = shape[0], cols = shape[1];
  const Shape scale_shape{(rows + bn - 1) / bn, (cols + bk - 1) / bk};
  if (!ck_.has(scale_name))
    DI_FAIL("{}: FP8 tensor '{}' has no block scales '{}' {}", ck_.file_of(name), name, scale_name,
            shape_str(scale_shape));
  Tensor scale = ck_.get(scale_name, scale_shape).to_f32();
  Tensor out = Tensor::empty(shape, DType::kF32);
  const auto* q = stored.data<uint8_t>();
  ThreadPool::global().parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t j = 0; j < cols; ++j)
        out.f32()[i * cols + j] =
            fp8e4m3_to_f32(q[i * cols + j]) * scale.f32()[(i / bn) * scale_shape[1] + j / bk];
  });
  return out;
}

Tensor WeightLoader::load(const std::string& name, const Shape& shape) {
  return upload(load_host_f32(name, shape));
}

Tensor WeightLoader::load_optional(const std::string& name, const Shape& shape) {
  if (!ck_.has(name)) return Tensor();
  return load(name, shape);
}

Tensor WeightLoader::load_concat_rows(const std::vector<std::string>& names,
                                      const std::vector<Shape>& shapes) {
  int64_t rows = 0, cols = shapes.at(0).back();
  for (const auto& s : shapes) rows += s[0];
  Tensor out = Tensor::empty({rows, cols}, DType::kF32);
  int64_t at = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor t = load_host_f32(names[i], shapes[i]);
    std::memcpy(out.f32() + at * cols, t.f32(), t.nbytes());
    at += shapes[i][0];
  }
  return upload(out);
}

ExpertWeights WeightLoader::load_experts(const std::string& prefix, int64_t num_experts,
                                         int64_t hidden, int64_t inter) {
  Tensor gate_up = Tensor::empty({num_experts, 2 * inter, hidden}, DType::kF32);
  Tensor down = Tensor::empty({num_experts, hidden, inter}, DType::kF32);
  const size_t half = static_cast<size_t>(inter * hidden);
  for (int64_t e = 0; e < num_experts; ++e) {
    const std::string p = prefix + std::to_string(e) + ".";
    Tensor g = load_host_f32(p + "gate_proj.weight", {inter, hidden});
    Tensor u = load_host_f32(p + "up_proj.weight", {inter, hidden});
    Tensor d = load_host_f32(p + "down_proj.weight", {hidden, inter});
    float* gu = gate_up.f32() + static_cast<size_t>(e) * 2 * half;
    std::memcpy(gu, g.f32(), half * 4);
    std::memcpy(gu + half, u.f32(), half * 4);
    std::memcpy(down.f32() + static_cast<size_t>(e) * half, d.f32(), half * 4);
  }
  return ExpertWeights{upload(gate_up), upload(down)};
}

}  // namespace di
