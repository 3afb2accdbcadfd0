#pragma once
// A caching device allocator: freed blocks go back to size-keyed free lists instead of cudaFree
// (which synchronises the device), so a forward pass that allocates its temporaries with
// Backend::empty costs no cudaMalloc after the first step.
//
// Safe with one stream: a block freed on the host while kernels that use it are still queued is
// reused only by work enqueued later on the same stream. The same property makes it safe under
// CUDA graph capture: temporaries of the captured region keep their addresses in the graph, and
// eager work between replays may reuse them (replays are serialised on the stream).
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace di::cuda {

class CudaAllocator {
 public:
  CudaAllocator();
  ~CudaAllocator();
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // A device block of at least `bytes` (256-byte aligned); the owner returns it to the cache
  // when its last reference goes away.
  std::shared_ptr<void> allocate(size_t bytes, void** ptr);
  // cudaFree's every cached (unused) block.
  void release_cached();

  // A private pool for CUDA graph capture: between begin_private() and end_private(), freed
  // blocks are kept for reuse by later allocations of the same capture only, and end_private()
  // hands all of them to the returned owner, which gives them back to the cache when the graph
  // that baked their addresses in is destroyed. Without it, a block freed during capture could
  // be handed to a live tensor that the next replay would overwrite.
  void begin_private();
  std::shared_ptr<void> end_private();

  size_t bytes_in_use() const;
  size_t bytes_cached() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace di::cuda
