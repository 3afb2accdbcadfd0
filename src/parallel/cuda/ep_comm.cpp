#include "parallel/cuda/ep_comm.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "parallel/cuda/cuda_check.h"

namespace di::parallel::cuda {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  DI_CHECK(end != nullptr && *end == '\0', "{}='{}' is not an integer", name, value);
  return parsed;
}

void write_unique_id(const std::string& path, const ncclUniqueId& id) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    DI_CHECK(out.good(), "cannot create the NCCL unique id file '{}'", tmp);
    out.write(id.internal, sizeof(id.internal));
    DI_CHECK(out.good(), "cannot write the NCCL unique id to '{}'", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  DI_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

ncclUniqueId read_unique_id(const std::string& path, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == sizeof(ncclUniqueId::internal) && !ec) break;
    DI_CHECK(std::chrono::steady_clock::now() < deadline,
             "no NCCL unique id in '{}' after {} s: is rank 0 running with the same "
             "DI_EP_UNIQUE_ID_FILE?",
             path, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ncclUniqueId id{};
  std::ifstream in(path, std::ios::binary);
  in.read(id.internal, sizeof(id.internal));
  DI_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof(id.internal)),
           "short read of the NCCL unique id from '{}'", path);
  return id;
}

}  // namespace

EpCommConfig ep_comm_config_from_env() {
  EpCommConfig config;
  config.rank_idx = static_cast<int32_t>(env_int("DI_EP_RANK", 0));
  config.num_ranks = static_cast<int32_t>(env_int("DI_EP_WORLD", 1));
  config.device_idx = static_cast<int32_t>(env_int("DI_EP_DEVICE", 0));
  config.init_timeout_s = static_cast<double>(env_int("DI_EP_INIT_TIMEOUT_S", 120));
  if (const char* path = std::getenv("DI_EP_UNIQUE_ID_FILE")) config.unique_id_path = path;
  DI_CHECK(config.num_ranks >= 1, "DI_EP_WORLD={} must be >= 1", config.num_ranks);
  DI_CHECK(config.rank_idx >= 0 && config.rank_idx < config.num_ranks,
           "DI_EP_RANK={} outside [0, DI_EP_WORLD={})", config.rank_idx, config.num_ranks);
  DI_CHECK(config.device_idx >= 0, "DI_EP_DEVICE={} must be >= 0", config.device_idx);
  return config;
}

EpComm::EpComm(const EpCommConfig& config)
    : rank_idx_(config.rank_idx), num_ranks_(config.num_ranks), device_idx_(config.device_idx) {
  DI_CHECK(num_ranks_ >= 1 && rank_idx_ >= 0 && rank_idx_ < num_ranks_, "EP rank {} of world {}",
           rank_idx_, num_ranks_);
  int num_devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  DI_CHECK(device_idx_ < num_devices, "EP rank {} asks for CUDA device {}, this process sees {}",
           rank_idx_, device_idx_, num_devices);
  CUDA_CHECK(cudaSetDevice(device_idx_));
  if (num_ranks_ == 1 && config.unique_id_path.empty()) {
    int device = device_idx_;
    NCCL_CHECK(ncclCommInitAll(&comm_, 1, &device));
    init_path_ = "ncclCommInitAll";
    return;
  }
  DI_CHECK(!config.unique_id_path.empty(),
           "EP world size {} needs DI_EP_UNIQUE_ID_FILE (a path every rank can read)", num_ranks_);
  ncclUniqueId id{};
  if (rank_idx_ == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    write_unique_id(config.unique_id_path, id);
  } else {
    id = read_unique_id(config.unique_id_path, config.init_timeout_s);
  }
  NCCL_CHECK(ncclCommInitRank(&comm_, num_ranks_, id, rank_idx_));
  init_path_ = "ncclCommInitRank";
}

std::vector<EpComm> EpComm::init_all(std::span<const int32_t> devices) {
  const auto n = static_cast<int32_t>(devices.size());
  DI_CHECK(n >= 1, "EpComm::init_all: no devices");
  int num_devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  for (int32_t d : devices) {
    DI_CHECK(d >= 0 && d < num_devices, "EpComm::init_all: CUDA device {}, this process sees {}", d,
             num_devices);
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  std::vector<int> devs(devices.begin(), devices.end());
  NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
  std::vector<EpComm> out;
  for (int32_t r = 0; r < n; ++r) {
    EpComm c;
    c.comm_ = comms[static_cast<size_t>(r)];
    c.rank_idx_ = r;
    c.num_ranks_ = n;
    c.device_idx_ = devs[static_cast<size_t>(r)];
    c.init_path_ = "ncclCommInitAll";
    out.push_back(std::move(c));
  }
  return out;
}

void EpComm::abort() {
  if (comm_ != nullptr) ncclCommAbort(std::exchange(comm_, nullptr));
}

EpComm::~EpComm() {
  // Destroy, not abort: every rank reaches here after its last collective completed.
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

EpComm::EpComm(EpComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      rank_idx_(other.rank_idx_),
      num_ranks_(other.num_ranks_),
      device_idx_(other.device_idx_),
      init_path_(other.init_path_) {}

EpComm& EpComm::operator=(EpComm&& other) noexcept {
  if (this != &other) {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    comm_ = std::exchange(other.comm_, nullptr);
    rank_idx_ = other.rank_idx_;
    num_ranks_ = other.num_ranks_;
    device_idx_ = other.device_idx_;
    init_path_ = other.init_path_;
  }
  return *this;
}

std::string nccl_runtime_version() {
  int version = 0;
  NCCL_CHECK(ncclGetVersion(&version));
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace di::parallel::cuda
