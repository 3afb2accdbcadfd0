#pragma once
// PeerExchangeGroup: the buffers, counters and peer access of the peer-to-peer decode exchange
// (peer_exchange.h) for the ranks of one process, one GPU each.
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/cuda/peer_exchange.h"

namespace di::parallel::cuda {

// Allocates every rank's buffers on its device and enables peer access between all of them.
// Throws if a pair of devices cannot access each other (use the NCCL path then).
class PeerExchangeGroup {
 public:
  PeerExchangeGroup(std::span<const int32_t> devices, int32_t max_rows, int64_t row_bytes,
                    int64_t ret_row_bytes);
  ~PeerExchangeGroup();
  PeerExchangeGroup(const PeerExchangeGroup&) = delete;
  PeerExchangeGroup& operator=(const PeerExchangeGroup&) = delete;

  // Whether every pair of `devices` has peer access (and there are at most kPeerMaxRanks).
  // A device may repeat (tests: simulated ranks on one GPU, kernels on separate streams).
  static bool supported(std::span<const int32_t> devices);

  const PeerRank& rank(int32_t r) const { return ranks_.at(static_cast<size_t>(r)); }
  int32_t num_ranks() const { return static_cast<int32_t>(ranks_.size()); }
  // Releases every waiting exchange kernel (they return without valid results).
  void abort();
  // Throws unless every rank's view has its own index, the group's size and buffer sizes, and the
  // same address tables (every rank pushes into the same buffers). Host state only.
  void check_integrity() const;

 private:
  std::vector<int32_t> devices_;
  std::vector<PeerRank> ranks_;
  struct Allocation {
    int32_t device;
    void* ptr;
  };
  std::vector<Allocation> allocations_;
  int32_t* abort_host_ = nullptr;
};

}  // namespace di::parallel::cuda
