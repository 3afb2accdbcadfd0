#include "tensor/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace di {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) DI_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  size_t padded = ((bytes + 63) / 64) * 64;
  if (padded == 0) padded = 64;
  void* p = std::aligned_alloc(64, padded);
  DI_CHECK(p != nullptr, "out of host memory allocating {} bytes", padded);
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::view_of(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                       Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::move(owner);
  return t;
}

Tensor Tensor::with_block_scales(Tensor scales) const {
  DI_CHECK(dtype_ == DType::kFP8E4M3 && dim() == 2 && scales.dtype() == DType::kF32 &&
               scales.dim() == 2 && scales.device() == device_,
           "with_block_scales: {} with scales {} (need a 2-d fp8_e4m3 weight, 2-d f32 scales on "
           "the same device)",
           describe(), scales.describe());
  Tensor t = *this;
  t.block_scales_ = std::make_shared<const Tensor>(std::move(scales));
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  DI_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, describe());
  return shape_[static_cast<size_t>(d)];
}

float* Tensor::f32() const {
  DI_CHECK(dtype_ == DType::kF32, "expected an f32 tensor, got {}", describe());
  return static_cast<float*>(data_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DI_CHECK(infer < 0, "reshape {} has two -1 dims", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<size_t>(infer)] = known == 0 ? 0 : numel() / known;
  DI_CHECK(shape_numel(s) == numel(), "cannot reshape {} to {}", describe(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  DI_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
           "slice [{}, {}) out of range for {}", begin, end, describe());
  Tensor t = *this;
  int64_t row = numel() / std::max<int64_t>(1, shape_[0]);
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  Tensor t = slice_rows(i, i + 1);
  t.shape_.erase(t.shape_.begin());
  return t;
}

Tensor Tensor::to_f32() const {
  DI_CHECK(device_ == Device::kCPU, "to_f32 needs a CPU tensor, got {}", describe());
  Tensor out = empty(shape_, DType::kF32);
  convert_to_f32(dtype_, data_, out.f32(), static_cast<size_t>(numel()));
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  if (dtype == DType::kF32) return to_f32();
  DI_CHECK(dtype_ == DType::kF32, "conversion {} -> {} goes through f32", dtype_name(dtype_),
           dtype_name(dtype));
  Tensor out = empty(shape_, dtype);
  convert_from_f32(dtype, f32(), out.data_, static_cast<size_t>(numel()));
  return out;
}

Tensor Tensor::clone() const {
  DI_CHECK(device_ == Device::kCPU, "clone needs a CPU tensor");
  Tensor out = empty(shape_, dtype_);
  std::memcpy(out.data_, data_, nbytes());
  return out;
}

std::string Tensor::describe() const {
  return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_));
}

void check_shape(const Tensor& t, const Shape& expected, const std::string& name) {
  DI_CHECK(t.shape() == expected, "tensor '{}' has shape {}, expected {}", name,
           shape_str(t.shape()), shape_str(expected));
}

}  // namespace di
