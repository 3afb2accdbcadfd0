#pragma once
// Tensor: a dense, row-major (contiguous) n-d array on one device, sharing its storage.
//
// A Tensor either owns its bytes (allocated) or views bytes owned by someone else (an mmap'd
// checkpoint, a KV pool); `storage_` keeps the owner alive either way. Views share storage, so
// copying a Tensor is cheap and never copies data.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/dtype.h"

namespace di {

enum class Device : uint8_t { kCPU, kCUDA };

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // Allocates uninitialised CPU memory (64-byte aligned).
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // Wraps memory owned by `owner` (may be null for memory that outlives the tensor).
  static Tensor view_of(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                        Device device = Device::kCPU);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_null() const { return data_ == nullptr && shape_.empty(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  float* f32() const;  // checks dtype == f32

  // Same bytes, new shape (numel must match).
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Element i along dim 0, with that dim dropped.
  Tensor operator[](int64_t i) const;

  // A CPU fp32 copy (converting bf16 / f16 / fp8).
  Tensor to_f32() const;
  // A CPU copy converted to `dtype` (from f32 only, or identity).
  Tensor to(DType dtype) const;
  Tensor clone() const;

  std::string describe() const;  // "bf16[4096, 11008]"

  // ---- Block-scaled FP8 weights (DeepSeek; issue #6) ----
  // An e4m3 linear weight w [N, K] may carry its f32 block scales `scale_inv` (on the same device):
  //   w[i, j] = fp8[i, j] * scales[i / 128, j / 128],
  // scales of shape [ceil(N/128), fp8_block_scale_cols(K)]: the checkpoint's row-major
  // [ceil(N/128), ceil(K/128)] with each row padded to a multiple of 4 floats (16 bytes; padding
  // = 1.0), the layout cuBLASLt's BLK128x128_32F mode reads.
  // Only a backend that reports supports_fp8_block_linear() is handed such weights (by the
  // WeightLoader, for 2-D linear weights); everywhere else weights are dequantized at load.
  // Copies share the scales; reshape/slice views drop them.
  const Tensor* block_scales() const { return block_scales_.get(); }
  Tensor with_block_scales(Tensor scales) const;

 private:
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
  std::shared_ptr<void> storage_;
  std::shared_ptr<const Tensor> block_scales_;  // FP8 block scales (see block_scales())
};

// Columns of an FP8 weight's block-scale tensor for k input features (see block_scales()).
inline int64_t fp8_block_scale_cols(int64_t k) { return ((k + 127) / 128 + 3) / 4 * 4; }

// Throws with the tensor's name when its shape differs from `expected`.
void check_shape(const Tensor& t, const Shape& expected, const std::string& name);

}  // namespace di
