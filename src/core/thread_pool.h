#pragma once
// A fixed pool of worker threads for data-parallel loops on the CPU backend and the tokenizer.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace di {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items, on the
  // workers and the calling thread; returns when all chunks are done. One caller at a time uses
  // the workers: a concurrent caller from another thread (the engine thread while an HTTP worker
  // tokenizes) runs its whole range inline instead of waiting. Not reentrant.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool, sized by DEEPINFER_THREADS or the hardware concurrency.
  static ThreadPool& global();

 private:
  void worker_loop(int worker_idx);

  std::vector<std::thread> workers_;
  std::mutex caller_mu_;  // held by the one caller whose job the workers run
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace di
