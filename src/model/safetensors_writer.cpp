#include "model/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"

namespace di::model {

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kFP8E4M3:
      return "F8_E4M3";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  DI_FAIL("unknown dtype {}", static_cast<int>(dtype));
}

std::string safetensors_header(std::span<const SafetensorsEntry> tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    DI_CHECK(t.name != "__metadata__" && !t.name.empty(), "invalid tensor name '{}'", t.name);
    DI_CHECK(names.insert(t.name).second, "tensor '{}' is declared twice", t.name);
    for (int64_t d : t.shape) DI_CHECK(d >= 0, "tensor '{}' has a negative dimension", t.name);
    uint64_t end = offset + t.nbytes();
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<SafetensorsEntry> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tensors_(std::move(tensors)) {
  std::string header = safetensors_header(tensors_, metadata);
  file_ = std::fopen(path_.c_str(), "wb");
  DI_CHECK(file_ != nullptr, "cannot create {}: {}", path_.string(), std::strerror(errno));
  DI_CHECK(std::fwrite(header.data(), 1, header.size(), file_) == header.size(),
           "writing the header of {} failed: {}", path_.string(), std::strerror(errno));
  header_bytes_ = header.size();
  skip_empty_tensors();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SafetensorsWriter::skip_empty_tensors() {
  while (current_ < tensors_.size() && written_in_current_ == tensors_[current_].nbytes()) {
    ++current_;
    written_in_current_ = 0;
  }
}

void SafetensorsWriter::append(std::span<const std::byte> bytes) {
  DI_CHECK(file_ != nullptr, "{} is already finished", path_.string());
  if (bytes.empty()) return;
  DI_CHECK(current_ < tensors_.size(), "{}: {} bytes appended after the last tensor",
           path_.string(), bytes.size());
  const SafetensorsEntry& t = tensors_[current_];
  DI_CHECK(written_in_current_ + bytes.size() <= t.nbytes(),
           "{}: a chunk of {} bytes crosses the end of tensor '{}' ({} of {} bytes written)",
           path_.string(), bytes.size(), t.name, written_in_current_, t.nbytes());
  DI_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size(),
           "writing {} failed: {}", path_.string(), std::strerror(errno));
  written_in_current_ += bytes.size();
  data_bytes_ += bytes.size();
  skip_empty_tensors();
}

void SafetensorsWriter::finish() {
  DI_CHECK(file_ != nullptr, "{} is already finished", path_.string());
  DI_CHECK(current_ == tensors_.size(), "{}: tensor '{}' has {} of {} bytes", path_.string(),
           current_ < tensors_.size() ? tensors_[current_].name : "", written_in_current_,
           current_ < tensors_.size() ? tensors_[current_].nbytes() : 0);
  std::FILE* f = file_;
  file_ = nullptr;
  bool ok = std::fflush(f) == 0;
  ok = (std::fclose(f) == 0) && ok;
  DI_CHECK(ok, "closing {} failed: {}", path_.string(), std::strerror(errno));
}

}  // namespace di::model
