#include "model/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "tensor/dtype.h"

namespace di {

namespace {

// The CUDA fill_random kernel's counter hash (kernels/elementwise.cu), for host-made values.
uint32_t hash_u32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, mixed with the model seed
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h ^ (seed * 0x9E3779B97F4A7C15ull + 0x632be59bd9b4e019ull);
}

bool is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }

// Bound of the uniform distribution of a >= 2-D tensor.
float matrix_scale(const std::string& name, const Shape& shape) {
  if (name.find("embed_tokens") != std::string::npos) return 1.0f;
  const double fan_in = static_cast<double>(std::max<int64_t>(shape.back(), 1));
  return static_cast<float>(std::sqrt(3.0 / fan_in));
}

}  // namespace

int64_t min_loaded_weight_bytes(const Checkpoint& ck, const Backend& backend) {
  const auto compute = static_cast<int64_t>(dtype_size(backend.compute_dtype()));
  int64_t bytes = 0;
  for (const std::string& name : ck.names()) {
    const SafetensorsEntry& e = ck.entry(name);
    const bool fp8_kept = e.dtype == DType::kFP8E4M3 && e.shape.size() == 2 &&
                          ck.has(name + "_scale_inv") &&
                          backend.supports_fp8_block_linear(e.shape[0], e.shape[1]);
    bytes += shape_numel(e.shape) * (fp8_kept ? 1 : compute);
  }
  return bytes;
}

Tensor random_weight_host(const RandomWeights& r, const std::string& name, const Shape& shape) {
  Tensor out = Tensor::empty(shape, DType::kF32);
  const uint64_t seed = tensor_seed(r.seed, name);
  float scale = 0.0f, mean = 0.0f;
  if (shape.size() <= 1) {
    mean = is_norm(name) ? 1.0f : 0.0f;
    scale = is_norm(name) ? 0.1f : 0.05f;
  } else {
    scale = matrix_scale(name, shape);
  }
  float* v = out.f32();
  const int64_t n = out.numel();
  ThreadPool::global().parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float u = static_cast<float>(hash_u32(seed * 0x9E3779B97F4A7C15ull +
                                                  static_cast<uint64_t>(i)) >> 8) *
                      (1.0f / 16777216.0f);
      v[i] = mean + (2.0f * u - 1.0f) * scale;
    }
  });
  return out;
}

Tensor WeightLoader::upload(const Tensor& host_f32) {
  if (round_bf16_ && backend_.compute_dtype() == DType::kF32 && host_f32.dtype() == DType::kF32) {
    Tensor r = Tensor::empty(host_f32.shape(), DType::kF32);
    for (int64_t i = 0; i < r.numel(); ++i) r.f32()[i] = bf16_to_f32(f32_to_bf16(host_f32.f32()[i]));
    return backend_.device() == Device::kCPU ? r : backend_.upload(r, DType::kF32);
  }
  if (backend_.device() == Device::kCPU && backend_.compute_dtype() == DType::kF32) return host_f32;
  return backend_.upload(host_f32, backend_.compute_dtype());
}

Tensor WeightLoader::load_host_f32(const std::string& name, const Shape& shape) {
  if (random_ != nullptr) return random_weight_host(*random_, name, shape);
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

namespace {
constexpr int64_t kFp8Block = 128;
}  // namespace

bool WeightLoader::keeps_fp8(const std::vector<std::string>& names,
                             const std::vector<Shape>& shapes) const {
  if (random_ != nullptr || names.empty() || names.size() != shapes.size()) return false;
  if (config_.fp8_block_n != kFp8Block || config_.fp8_block_k != kFp8Block) return false;
  const int64_t cols = shapes[0].size() == 2 ? shapes[0][1] : -1;
  int64_t rows = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Shape& s = shapes[i];
    if (s.size() != 2 || s[1] != cols || s[0] % kFp8Block != 0) return false;
    if (!ck_.has(names[i]) || !ck_.has(names[i] + "_scale_inv")) return false;
    if (ck_.entry(names[i]).dtype != DType::kFP8E4M3) return false;
    rows += s[0];
  }
  return cols > 0 && backend_.supports_fp8_block_linear(rows, cols);
}

Tensor WeightLoader::try_load_fp8(const std::vector<std::string>& names,
                                  const std::vector<Shape>& shapes) {
  constexpr int64_t kBlock = kFp8Block;
  if (!keeps_fp8(names, shapes)) return Tensor();
  const int64_t cols = shapes[0][1];
  int64_t rows = 0;
  for (const Shape& s : shapes) rows += s[0];
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

void WeightLoader::check_random_fits(const std::string& name, const Shape& shape) {
  const int64_t bytes =
      shape_numel(shape) * static_cast<int64_t>(dtype_size(backend_.compute_dtype()));
  const int64_t have = backend_.available_memory_bytes();
  if (have >= 0 && bytes > have) {
    DI_FAIL(
        "random weights: '{}' {} needs {:.2f} GB as {}, but {:.2f} GB is available on the {} "
        "backend after {:.2f} GB of weights: this model does not fit",
        name, shape_str(shape), static_cast<double>(bytes) / 1e9,
        dtype_name(backend_.compute_dtype()), static_cast<double>(have) / 1e9, backend_.name(),
        static_cast<double>(random_bytes_made_) / 1e9);
  }
  random_bytes_made_ += bytes;
}

Tensor WeightLoader::load(const std::string& name, const Shape& shape) {
  if (random_ != nullptr) check_random_fits(name, shape);
  if (random_ != nullptr && random_->fill && shape.size() >= 2) {
    Tensor t = backend_.empty(shape, backend_.compute_dtype());
    random_->fill(t, tensor_seed(random_->seed, name), matrix_scale(name, shape));
    return t;
  }
  if (Tensor q = try_load_fp8({name}, {shape}); !q.is_null()) return q;
  return upload(load_host_f32(name, shape));
}

Tensor WeightLoader::load_optional(const std::string& name, const Shape& shape) {
  if (!has(name)) return Tensor();
  return load(name, shape);
}

Tensor WeightLoader::load_concat_rows(const std::vector<std::string>& names,
                                      const std::vector<Shape>& shapes) {
  int64_t rows = 0, cols = shapes.at(0).back();
  for (const auto& s : shapes) rows += s[0];
  if (random_ != nullptr) return load(names.at(0) + "+concat", {rows, cols});
  if (Tensor q = try_load_fp8(names, shapes); !q.is_null()) return q;
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
  if (random_ != nullptr)
    return ExpertWeights{load(prefix + "gate_up", {num_experts, 2 * inter, hidden}),
                         load(prefix + "down", {num_experts, hidden, inter})};
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
