#pragma once
// A streaming writer of the safetensors format (https://github.com/huggingface/safetensors):
//
//   [u64 little-endian N][N bytes of JSON header, padded with spaces to a multiple of 8][data]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the start of the data) plus an optional "__metadata__" string map. All tensors are
// declared up front, so the header is written first and the data then streams in declaration order
// without ever holding a whole tensor in memory.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace di::model {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;

  uint64_t nbytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

// "F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "U8".
const char* safetensors_dtype_name(DType dtype);

// The complete header (length prefix, JSON, padding) for `tensors` laid out in order.
std::string safetensors_header(std::span<const SafetensorsEntry> tensors,
                               const std::map<std::string, std::string>& metadata);

class SafetensorsWriter {
 public:
  // Creates `path` (truncating it) and writes the header. Names must be unique.
  SafetensorsWriter(const std::filesystem::path& path, std::vector<SafetensorsEntry> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // closes without checking; call finish() to know the file is complete
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next bytes of the current tensor. A chunk never crosses a tensor boundary; the
  // writer moves to the next tensor when the current one is complete.
  void append(std::span<const std::byte> bytes);
  // Checks every tensor is complete, flushes and closes. Throws di::Error on any shortfall or I/O
  // error.
  void finish();

  // Index of the tensor the next append() belongs to (== number of tensors when done).
  size_t current_tensor() const { return current_; }
  uint64_t data_bytes() const { return data_bytes_; }
  uint64_t file_bytes() const { return header_bytes_ + data_bytes_; }

 private:
  void skip_empty_tensors();

  std::filesystem::path path_;
  std::vector<SafetensorsEntry> tensors_;
  std::FILE* file_ = nullptr;
  uint64_t header_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
};

}  // namespace di::model
