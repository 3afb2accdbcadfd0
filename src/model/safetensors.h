#pragma once
// Memory-mapped reader of Hugging Face safetensors checkpoints, single-file or sharded.
//
// File format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets are relative to the end of the header.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/tensor.h"

namespace di {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t offset = 0;  // from the start of the file
  size_t nbytes = 0;
  int file_idx = 0;
};

class MappedFile;

// All tensors of a model directory: `model.safetensors`, or shards listed by
// `model.safetensors.index.json`. Tensors are views into the mapping (no copy).
class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& model_dir);
  static Result<Checkpoint> open_files(const std::vector<std::string>& files);

  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  // A view of the stored bytes (stored dtype); marks the tensor as used.
  Tensor get(const std::string& name) const;
  // As get(), checking the shape; the error names the tensor and its file.
  Tensor get(const std::string& name, const Shape& expected) const;
  std::vector<std::string> names() const;
  // Names never fetched with get(): the loader reports them as unexpected tensors.
  std::vector<std::string> unused() const;
  const std::string& file_of(const std::string& name) const;

 private:
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, SafetensorsEntry> entries_;
  mutable std::set<std::string> used_;
};

}  // namespace di
