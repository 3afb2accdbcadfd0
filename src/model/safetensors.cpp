#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace di {

class MappedFile {
 public:
  ~MappedFile() {
    if (data_ != nullptr && data_ != MAP_FAILED) munmap(data_, size_);
  }
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0)
      return make_status(StatusCode::kNotFound, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      ::close(fd);
      return make_status(StatusCode::kInternal, "{}: cannot stat", path);
    }
    auto f = std::make_shared<MappedFile>();
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
      f->data_ = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (f->data_ == MAP_FAILED) {
        ::close(fd);
        return make_status(StatusCode::kInternal, "{}: mmap failed: {}", path, std::strerror(errno));
      }
    }
    ::close(fd);
    return f;
  }
  const char* data() const { return static_cast<const char*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

namespace {

Status parse_header(const MappedFile& f, int file_idx, std::map<std::string, SafetensorsEntry>* out) {
  if (f.size() < 8)
    return make_status(StatusCode::kDataLoss, "{}: truncated: {} bytes, no header", f.path(), f.size());
  uint64_t header_len = 0;
  std::memcpy(&header_len, f.data(), 8);
  if (header_len > f.size() - 8 || header_len > (uint64_t{100} << 20))
    return make_status(StatusCode::kDataLoss,
                       "{}: corrupt or truncated: header length {} but file has {} bytes",
                       f.path(), header_len, f.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(std::string_view(f.data() + 8, header_len));
  } catch (const std::exception& e) {
    return make_status(StatusCode::kDataLoss, "{}: corrupt header JSON: {}", f.path(), e.what());
  }
  if (!header.is_object())
    return make_status(StatusCode::kDataLoss, "{}: header is not a JSON object", f.path());
  const size_t data_start = 8 + header_len;
  const size_t data_size = f.size() - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    SafetensorsEntry e;
    e.name = it.key();
    e.file_idx = file_idx;
    try {
      std::string dt = v.at("dtype").get<std::string>();
      if (!parse_dtype(dt, &e.dtype))
        return make_status(StatusCode::kUnimplemented,
                           "{}: tensor '{}' has unsupported dtype {} (supported: F32, BF16, F16, "
                           "F8_E4M3, I32, I64, U8)",
                           f.path(), e.name, dt);
      e.shape = v.at("shape").get<Shape>();
      auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1])
        return make_status(StatusCode::kDataLoss, "{}: tensor '{}' has bad data_offsets", f.path(), e.name);
      size_t expected = static_cast<size_t>(shape_numel(e.shape)) * dtype_size(e.dtype);
      if (offs[1] - offs[0] != expected)
        return make_status(StatusCode::kDataLoss,
                           "{}: tensor '{}' {}{} needs {} bytes but data_offsets span {}",
                           f.path(), e.name, dtype_name(e.dtype), shape_str(e.shape), expected,
                           offs[1] - offs[0]);
      if (offs[1] > data_size)
        return make_status(StatusCode::kDataLoss,
                           "{}: truncated: tensor '{}' ends at byte {} of the data section, which "
                           "has only {} bytes",
                           f.path(), e.name, offs[1], data_size);
      e.offset = data_start + offs[0];
      e.nbytes = expected;
    } catch (const std::exception& ex) {
      return make_status(StatusCode::kDataLoss, "{}: bad header entry '{}': {}", f.path(), e.name, ex.what());
    }
    if (out->count(e.name))
      return make_status(StatusCode::kDataLoss, "{}: tensor '{}' appears in two files", f.path(), e.name);
    (*out)[e.name] = e;
  }
  return Status::ok();
}

}  // namespace

Result<Checkpoint> Checkpoint::open_files(const std::vector<std::string>& files) {
  Checkpoint ck;
  for (size_t i = 0; i < files.size(); ++i) {
    auto f = MappedFile::open(files[i]);
    if (!f) return f.status();
    DI_RETURN_IF_ERROR(parse_header(**f, static_cast<int>(i), &ck.entries_));
    ck.files_.push_back(*f);
  }
  return ck;
}

Result<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string index = model_dir + "/model.safetensors.index.json";
  const std::string single = model_dir + "/model.safetensors";
  if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(ss.str());
    } catch (const std::exception& e) {
      return make_status(StatusCode::kDataLoss, "{}: invalid JSON: {}", index, e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return make_status(StatusCode::kDataLoss, "{}: no weight_map object", index);
    std::vector<std::string> shards;
    std::map<std::string, std::string> weight_map;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      std::string shard = it.value().get<std::string>();
      weight_map[it.key()] = shard;
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    std::sort(shards.begin(), shards.end());
    std::vector<std::string> paths;
    for (const auto& s : shards) paths.push_back(model_dir + "/" + s);
    auto ck = open_files(paths);
    if (!ck) return ck.status();
    for (const auto& [name, shard] : weight_map) {
      if (!ck->has(name))
        return make_status(StatusCode::kDataLoss, "{}: lists tensor '{}' in {}, which lacks it",
                           index, name, shard);
      const auto& e = ck->entries_.at(name);
      if (ck->files_[static_cast<size_t>(e.file_idx)]->path() != model_dir + "/" + shard)
        return make_status(StatusCode::kDataLoss, "{}: tensor '{}' is listed in {} but found in {}",
                           index, name, shard, ck->files_[static_cast<size_t>(e.file_idx)]->path());
    }
    return ck;
  }
  if (fs::exists(single)) return open_files({single});
  return make_status(StatusCode::kNotFound,
                     "{}: no model.safetensors or model.safetensors.index.json", model_dir);
}

const SafetensorsEntry& Checkpoint::entry(const std::string& name) const {
  auto it = entries_.find(name);
  DI_CHECK(it != entries_.end(), "checkpoint has no tensor '{}'", name);
  return it->second;
}

Tensor Checkpoint::get(const std::string& name) const {
  const auto& e = entry(name);
  used_.insert(name);
  const auto& f = files_[static_cast<size_t>(e.file_idx)];
  return Tensor::view_of(const_cast<char*>(f->data() + e.offset), e.shape, e.dtype, f);
}

Tensor Checkpoint::get(const std::string& name, const Shape& expected) const {
  if (!has(name)) DI_FAIL("missing tensor '{}' (expected shape {})", name, shape_str(expected));
  const auto& e = entry(name);
  if (e.shape != expected)
    DI_FAIL("{}: tensor '{}' has shape {}, expected {}", file_of(name), name, shape_str(e.shape),
            shape_str(expected));
  return get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_)
    if (!used_.count(k)) out.push_back(k);
  return out;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  return files_[static_cast<size_t>(entry(name).file_idx)]->path();
}

}  // namespace di
