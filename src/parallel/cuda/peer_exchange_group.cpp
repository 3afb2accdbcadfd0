#include "parallel/cuda/peer_exchange_group.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace di::parallel::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("PeerExchangeGroup: ") + what + ": " +
                             cudaGetErrorString(e));
  }
}

// Restores the calling thread's current device on scope exit.
struct DeviceGuard {
  int saved = 0;
  DeviceGuard() { (void)cudaGetDevice(&saved); }
  ~DeviceGuard() { (void)cudaSetDevice(saved); }
};

}  // namespace

bool PeerExchangeGroup::supported(std::span<const int32_t> devices) {
  if (devices.empty() || devices.size() > static_cast<size_t>(kPeerMaxRanks)) return false;
  // Distinct GPUs only: ranks sharing a GPU would spin on each other inside one device (seen to
  // hang on one H200 with 2-3 simulated ranks); such a group keeps the NCCL exchange.
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < devices.size(); ++j) {
      const int32_t a = devices[i], b = devices[j];
      if (i == j) continue;
      if (a == b) return false;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0) {
        (void)cudaGetLastError();
        return false;
      }
    }
  }
  return true;
}

PeerExchangeGroup::PeerExchangeGroup(std::span<const int32_t> devices, int32_t max_rows,
                                     int64_t row_bytes, int64_t ret_row_bytes)
    : devices_(devices.begin(), devices.end()) {
  if (!supported(devices)) {
    throw std::runtime_error("PeerExchangeGroup: the devices lack peer access to each other");
  }
  if (max_rows <= 0 || row_bytes <= 0 || ret_row_bytes <= 0 || row_bytes % 16 != 0) {
    throw std::runtime_error("PeerExchangeGroup: bad buffer sizes");
  }
  DeviceGuard guard;
  const auto n = static_cast<int32_t>(devices_.size());
  check(cudaHostAlloc(reinterpret_cast<void**>(&abort_host_), sizeof(int32_t),
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "abort flag");
  *abort_host_ = 0;
  ranks_.resize(static_cast<size_t>(n));
  auto alloc = [&](int32_t dev, size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    allocations_.push_back({dev, p});
    check(cudaMemset(p, 0, bytes), "cudaMemset");
    return p;
  };
  const size_t slots = size_t{2} * static_cast<size_t>(n) * static_cast<size_t>(max_rows);
  for (int32_t r = 0; r < n; ++r) {
    const int32_t dev = devices_[static_cast<size_t>(r)];
    check(cudaSetDevice(dev), "cudaSetDevice");
    for (int32_t q = 0; q < n; ++q) {
      if (devices_[static_cast<size_t>(q)] == dev) continue;  // itself (or a test's co-rank)
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices_[static_cast<size_t>(q)], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        check(e, "cudaDeviceEnablePeerAccess");
      }
    }
    PeerRank& pr = ranks_[static_cast<size_t>(r)];
    pr.rank = r;
    pr.num_ranks = n;
    pr.max_rows = max_rows;
    pr.row_bytes = row_bytes;
    pr.ret_row_bytes = ret_row_bytes;
    void* gather = alloc(dev, slots * static_cast<size_t>(row_bytes));
    void* ret = alloc(dev, slots * static_cast<size_t>(ret_row_bytes));
    auto* arrive =
        static_cast<uint32_t*>(alloc(dev, sizeof(uint32_t) * 2 * static_cast<size_t>(n)));
    pr.calls = static_cast<uint32_t*>(alloc(dev, sizeof(uint32_t) * 4));
    pr.tickets = static_cast<uint32_t*>(alloc(dev, sizeof(uint32_t) * 2));
    int32_t* abort_dev = nullptr;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&abort_dev), abort_host_, 0),
          "cudaHostGetDevicePointer");
    pr.abort_flag = abort_dev;
    for (PeerRank& other : ranks_) {  // this rank's addresses, in every rank's table
      other.gather[r] = gather;
      other.ret[r] = ret;
      other.arrive[r] = arrive;
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
}

PeerExchangeGroup::~PeerExchangeGroup() {
  DeviceGuard guard;
  for (const Allocation& a : allocations_) {
    (void)cudaSetDevice(a.device);
    (void)cudaFree(a.ptr);
  }
  if (abort_host_ != nullptr) (void)cudaFreeHost(abort_host_);
}

void PeerExchangeGroup::check_integrity() const {
  const auto n = static_cast<int32_t>(ranks_.size());
  auto fail = [](const std::string& what) {
    throw std::runtime_error("PeerExchangeGroup::check_integrity: " + what);
  };
  if (n < 1 || n > kPeerMaxRanks || devices_.size() != ranks_.size()) fail("bad rank count");
  const PeerRank& first = ranks_.front();
  for (int32_t r = 0; r < n; ++r) {
    const PeerRank& pr = ranks_[static_cast<size_t>(r)];
    if (pr.rank != r || pr.num_ranks != n) fail("rank " + std::to_string(r) + " has a bad index");
    if (pr.max_rows != first.max_rows || pr.row_bytes != first.row_bytes ||
        pr.ret_row_bytes != first.ret_row_bytes) {
      fail("rank " + std::to_string(r) + " has other buffer sizes");
    }
    if (pr.calls == nullptr || pr.tickets == nullptr || pr.abort_flag == nullptr) {
      fail("rank " + std::to_string(r) + " lacks its counters");
    }
    for (int32_t q = 0; q < kPeerMaxRanks; ++q) {
      const bool live = q < n;
      if (pr.gather[q] != first.gather[q] || pr.ret[q] != first.ret[q] ||
          pr.arrive[q] != first.arrive[q] || live != (pr.gather[q] != nullptr) ||
          live != (pr.ret[q] != nullptr) || live != (pr.arrive[q] != nullptr)) {
        fail("rank " + std::to_string(r) + "'s address table differs at " + std::to_string(q));
      }
    }
  }
}

void PeerExchangeGroup::abort() {
  if (abort_host_ != nullptr) *reinterpret_cast<volatile int32_t*>(abort_host_) = 1;
}

}  // namespace di::parallel::cuda
