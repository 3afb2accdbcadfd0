#include "model/weight_loader.h"

#include <algorithm>
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

Tensor WeightLoader::try_load_fp8(const std::vector<std::string>& names,
                                  const std::vector<Shape>& shapes) {
  constexpr int64_t kBlock = 128;
  if (names.empty() || names.size() != shapes.size()) return Tensor();
  if (config_.fp8_block_n != kBlock || config_.fp8_block_k != kBlock) return Tensor();
  const int64_t cols = shapes[0].size() == 2 ? shapes[0][1] : -1;
  int64_t rows = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Shape& s = shapes[i];
    if (s.size() != 2 || s[1] != cols || s[0] % kBlock != 0) return Tensor();
    if (!ck_.has(names[i]) || !ck_.has(names[i] + "_scale_inv")) return Tensor();
    if (ck_.entry(names[i]).dtype != DType::kFP8E4M3) return Tensor();
    rows += s[0];
  }
  if (cols <= 0 || !backend_.supports_fp8_block_linear(rows, cols)) return Tensor();
  // Scales: the checkpoint's [rows/128, kb] with rows padded to kb4 (tensor.h, block_scales()).
  const int64_t kb = (cols + kBlock - 1) / kBlock, kb4 = fp8_block_scale_cols(cols);
  Tensor q = Tensor::empty({rows, cols}, DType::kFP8E4M3);
  Tensor scale = Tensor::empty({rows / kBlock, kb4}, DType::kF32);
  std::fill(scale.f32(), scale.f32() + scale.numel(), 1.0f);
  int64_t at = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t r = shapes[i][0];
    Tensor part = ck_.get(names[i], shapes[i]);
    Tensor part_scale = ck_.get(names[i] + "_scale_inv", {r / kBlock, kb}).to_f32();
    std::memcpy(q.data<uint8_t>() + at * cols, part.raw(), static_cast<size_t>(r * cols));
    for (int64_t b = 0; b < r / kBlock; ++b)
      std::memcpy(scale.f32() + (at / kBlock + b) * kb4, part_scale.f32() + b * kb,
                  static_cast<size_t>(kb) * sizeof(float));
    at += r;
  }
  ++num_fp8_kept_;
  Tensor dev_q = backend_.upload(q, DType::kFP8E4M3);
  return dev_q.with_block_scales(backend_.upload(scale, DType::kF32));
}

Tensor WeightLoader::load(const std::string& name, const Shape& shape) {
  if (Tensor q = try_load_fp8({name}, {shape}); !q.is_null()) return q;
  return upload(load_host_f32(name, shape));
}

Tensor WeightLoader::load_optional(const std::string& name, const Shape& shape) {
  if (!ck_.has(name)) return Tensor();
  return load(name, shape);
}

Tensor WeightLoader::load_concat_rows(const std::vector<std::string>& names,
                                      const std::vector<Shape>& shapes) {
  if (Tensor q = try_load_fp8(names, shapes); !q.is_null()) return q;
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
