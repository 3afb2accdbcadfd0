#include "backend/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace di::cuda {

struct CudaAllocator::State {
  mutable std::mutex mu;
  std::multimap<size_t, void*> free;  // rounded size -> block
  size_t in_use = 0;
  size_t cached = 0;
  bool private_mode = false;
  std::multimap<size_t, void*> private_free;  // freed during capture

  // Called with `mu` held by the deleters: where a freed block goes.
  void give_back(size_t size, void* ptr) {
    in_use -= size;
    if (private_mode) {
      private_free.emplace(size, ptr);
      return;
    }
    free.emplace(size, ptr);
    cached += size;
  }

  void release_all_locked() {
    for (auto& [size, ptr] : free) cudaFree(ptr);
    free.clear();
    cached = 0;
  }
};

namespace {
// Small blocks round to 512 B, large ones to 2 MiB, so a step's shapes map to few size classes.
size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < (size_t{1} << 20)) return (bytes + 511) & ~size_t{511};
  return (bytes + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1);
}
}  // namespace

CudaAllocator::CudaAllocator() : state_(std::make_shared<State>()) {}

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->release_all_locked();
}

std::shared_ptr<void> CudaAllocator::allocate(size_t bytes, void** ptr) {
  const size_t size = round_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    // Best fit, but never hand out a block more than twice (or 64 MiB over) the request. While
    // capturing, blocks freed by the same capture come first.
    if (state_->private_mode) {
      auto pit = state_->private_free.lower_bound(size);
      if (pit != state_->private_free.end() && pit->first <= 2 * size) {
        p = pit->second;
        const size_t got = pit->first;
        state_->private_free.erase(pit);
        state_->in_use += got;
        *ptr = p;
        std::shared_ptr<State> st = state_;
        return std::shared_ptr<void>(p, [st, got](void* q) {
          std::lock_guard<std::mutex> l(st->mu);
          st->give_back(got, q);
        });
      }
    }
    auto it = state_->free.lower_bound(size);
    if (it != state_->free.end() && it->first <= std::max(2 * size, size + (size_t{64} << 20))) {
      p = it->second;
      const size_t got = it->first;
      state_->free.erase(it);
      state_->cached -= got;
      state_->in_use += got;
      *ptr = p;
      std::shared_ptr<State> st = state_;
      return std::shared_ptr<void>(p, [st, got](void* q) {
        std::lock_guard<std::mutex> l(st->mu);
        st->give_back(got, q);
      });
    }
  }
  cudaError_t err = cudaMalloc(&p, size);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->release_all_locked();
    }
    err = cudaMalloc(&p, size);
  }
  DI_CHECK(err == cudaSuccess, "cudaMalloc of {} bytes failed: {} ({} MiB in use)", size,
           cudaGetErrorString(err), bytes_in_use() >> 20);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->in_use += size;
  }
  *ptr = p;
  std::shared_ptr<State> st = state_;
  return std::shared_ptr<void>(p, [st, size](void* q) {
    std::lock_guard<std::mutex> l(st->mu);
    st->give_back(size, q);
  });
}

void CudaAllocator::begin_private() {
  std::lock_guard<std::mutex> lock(state_->mu);
  DI_CHECK(!state_->private_mode, "CudaAllocator::begin_private: already in a private pool");
  state_->private_mode = true;
}

std::shared_ptr<void> CudaAllocator::end_private() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->private_mode = false;
  auto blocks = std::make_shared<std::multimap<size_t, void*>>(std::move(state_->private_free));
  state_->private_free.clear();
  std::shared_ptr<State> st = state_;
  return std::shared_ptr<void>(blocks.get(), [st, blocks](void*) {
    std::lock_guard<std::mutex> l(st->mu);
    for (auto& [size, ptr] : *blocks) {
      st->free.emplace(size, ptr);
      st->cached += size;
    }
  });
}

void CudaAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->release_all_locked();
}

size_t CudaAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->in_use;
}

size_t CudaAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->cached;
}

}  // namespace di::cuda
