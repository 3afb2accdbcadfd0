#pragma once
// EpComm: the NCCL communicator of one EP group, one process per GPU.
//
// Launching N > 1 ranks (one process per GPU, same host or not):
//   rm -f /shared/ep.id   # a fresh path per launch; a stale file from an old job would be read
//   for r in 0..N-1:
//     DI_EP_RANK=r DI_EP_WORLD=N DI_EP_DEVICE=<local gpu> DI_EP_UNIQUE_ID_FILE=/shared/ep.id
//     <engine> &
// Rank 0 creates the ncclUniqueId and publishes it by writing a temporary file and renaming it
// onto DI_EP_UNIQUE_ID_FILE (so no reader sees a partial id); the other ranks poll for the file
// (DI_EP_INIT_TIMEOUT_S, default 120 s) and then all call ncclCommInitRank. The path must be
// visible to every rank (local disk for one host, a shared file system across hosts).
// World size 1 without a file uses ncclCommInitAll on one device: no file, no rendezvous.
#include <nccl.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace di::parallel::cuda {

struct EpCommConfig {
  int32_t rank_idx = 0;
  int32_t num_ranks = 1;
  int32_t device_idx = 0;         // CUDA device this process drives
  std::string unique_id_path;     // required when num_ranks > 1; optional for 1 (then InitRank)
  double init_timeout_s = 120.0;  // how long ranks > 0 wait for the id file
};

// Reads DI_EP_RANK (default 0), DI_EP_WORLD (default 1), DI_EP_DEVICE (default 0),
// DI_EP_UNIQUE_ID_FILE (default empty) and DI_EP_INIT_TIMEOUT_S; throws on malformed values or a
// rank outside [0, world).
EpCommConfig ep_comm_config_from_env();

// Owns an ncclComm_t; move-only. The constructor makes device_idx current on this thread.
class EpComm {
 public:
  explicit EpComm(const EpCommConfig& config);
  // One process driving every rank (the serving engine's DP group, one thread per rank):
  // ncclCommInitAll over `devices`, communicator r on devices[r].
  static std::vector<EpComm> init_all(std::span<const int32_t> devices);
  ~EpComm();
  EpComm(EpComm&& other) noexcept;
  EpComm& operator=(EpComm&& other) noexcept;
  EpComm(const EpComm&) = delete;
  EpComm& operator=(const EpComm&) = delete;

  ncclComm_t get() const { return comm_; }
  // ncclCommAbort: releases a rank blocked in a collective whose peer will never come (a failed
  // step). The communicator is unusable afterwards (get() returns null).
  void abort();
  int32_t rank_idx() const { return rank_idx_; }
  int32_t num_ranks() const { return num_ranks_; }
  int32_t device_idx() const { return device_idx_; }
  // "ncclCommInitAll" or "ncclCommInitRank": which path created the communicator.
  const char* init_path() const { return init_path_; }

 private:
  EpComm() = default;
  ncclComm_t comm_ = nullptr;
  int32_t rank_idx_ = 0;
  int32_t num_ranks_ = 0;
  int32_t device_idx_ = 0;
  const char* init_path_ = "";
};

// "2.28.9": the NCCL library loaded at run time (may differ from the headers built against).
std::string nccl_runtime_version();

}  // namespace di::parallel::cuda
