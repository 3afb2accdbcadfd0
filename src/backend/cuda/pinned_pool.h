#pragma once
// A cache of page-locked host blocks for device-to-host copies (CudaBackend::download).
//
// A fresh pageable buffer per download costs twice: the copy runs through the driver's staging
// buffers, and every page of a new multi-MB allocation is faulted in (glibc returns large blocks
// to the kernel on free, so each step's logits, 16 MB at 32 rows of a 129K vocabulary, would
// fault again). Blocks here are pinned once and reused: a released block goes back to a free
// list keyed by its (power-of-two) size, up to `max_cached_bytes`; beyond that it is freed.
//
// Thread-safe; blocks outlive the pool (a tensor released after the backend frees its block).
#include <cstddef>
#include <memory>

namespace di::cuda {

class PinnedHostPool {
 public:
  explicit PinnedHostPool(size_t max_cached_bytes);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  // A pinned block of at least `bytes`; null (and *ptr null) if pinning fails, so that the
  // caller can fall back to pageable memory. The owner returns the block when released.
  std::shared_ptr<void> allocate(size_t bytes, void** ptr);

  size_t bytes_cached() const;
  // Throws unless the cached bytes equal the sum of the free blocks' sizes, every size is a power
  // of two, and the total is within the limit.
  void check_integrity() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace di::cuda
