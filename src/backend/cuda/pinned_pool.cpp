#include "backend/cuda/pinned_pool.h"

#include <cuda_runtime.h>

#include <bit>
#include <map>
#include <mutex>

#include "core/error.h"

namespace di::cuda {

struct PinnedHostPool::State {
  explicit State(size_t max_cached) : max_cached_bytes(max_cached) {}
  ~State() {
    for (auto& [size, ptr] : free_blocks) cudaFreeHost(ptr);
  }
  void release(void* ptr, size_t size) {
    {
      std::lock_guard lock(mu);
      if (open && cached_bytes + size <= max_cached_bytes) {
        free_blocks.emplace(size, ptr);
        cached_bytes += size;
        return;
      }
    }
    cudaFreeHost(ptr);
  }

  const size_t max_cached_bytes;
  mutable std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // size -> block
  size_t cached_bytes = 0;
  bool open = true;  // false once the pool is destroyed: released blocks are freed
};

PinnedHostPool::PinnedHostPool(size_t max_cached_bytes)
    : state_(std::make_shared<State>(max_cached_bytes)) {}

PinnedHostPool::~PinnedHostPool() {
  std::lock_guard lock(state_->mu);
  state_->open = false;
  for (auto& [size, ptr] : state_->free_blocks) cudaFreeHost(ptr);
  state_->free_blocks.clear();
  state_->cached_bytes = 0;
}

std::shared_ptr<void> PinnedHostPool::allocate(size_t bytes, void** ptr) {
  *ptr = nullptr;
  const size_t size = std::bit_ceil(std::max<size_t>(bytes, 4096));
  void* block = nullptr;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->free_blocks.find(size);
    if (it != state_->free_blocks.end()) {
      block = it->second;
      state_->free_blocks.erase(it);
      state_->cached_bytes -= size;
    }
  }
  if (block == nullptr) {
    // Portable: the block is pinned for every device's context (DP ranks share a process).
    if (cudaHostAlloc(&block, size, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
  }
  *ptr = block;
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<void>(block, [state, size](void* p) { state->release(p, size); });
}

void PinnedHostPool::check_integrity() const {
  std::lock_guard lock(state_->mu);
  size_t total = 0;
  for (const auto& [size, ptr] : state_->free_blocks) {
    DI_CHECK(ptr != nullptr && std::has_single_bit(size), "PinnedHostPool: free block {} of {} B",
             ptr, size);
    total += size;
  }
  DI_CHECK(total == state_->cached_bytes && total <= state_->max_cached_bytes,
           "PinnedHostPool: {} B in free blocks, {} B counted, limit {} B", total,
           state_->cached_bytes, state_->max_cached_bytes);
}

size_t PinnedHostPool::bytes_cached() const {
  std::lock_guard lock(state_->mu);
  return state_->cached_bytes;
}

}  // namespace di::cuda
