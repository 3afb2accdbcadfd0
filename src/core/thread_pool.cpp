#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

#include "core/env.h"

namespace di {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 0; i + 1 < std::max(1, num_threads); ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = di::env::get("DEEPINFER_THREADS")) return std::max(1, std::atoi(env));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  std::unique_lock call(call_mu_, std::try_to_lock);
  if (chunks <= 1 || workers_.empty() || !call.owns_lock()) {
    fn(0, n);
    return;
  }
  auto run_chunk = [&](int64_t c) {
    int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    fn(begin, end);
  };
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    next_chunk_ = 1;  // chunk 0 runs on the caller
    chunks_done_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunk(0);
  std::unique_lock lock(mu_);
  ++chunks_done_;
  while (next_chunk_ < job_chunks_) {
    int64_t c = next_chunk_++;
    lock.unlock();
    run_chunk(c);
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int /*worker_idx*/) {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, chunks = job_chunks_;
      lock.unlock();
      (*fn)(n * c / chunks, n * (c + 1) / chunks);
      lock.lock();
      if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
    }
  }
}

}  // namespace di
