#pragma once
// CUDA graphs for decode batch-size buckets.
//
// CudaGraph captures whatever a callable enqueues on the backend's stream and replays it.
// DecodeGraph applies it to one decode step (one new token per sequence) of a bucket of
// `bucket` sequences: the step's metadata lives in fixed device buffers (token ids, positions,
// slots, the CSR block table, logit rows) that run() refreshes with async copies before each
// replay; sequences beyond the live batch are padding (slot -1: no KV written; no blocks: zero
// attention). The attention kernel is captured with the bucket's largest context
// (CudaBackend::set_attention_max_kv_len), so any shorter context replays correctly.
//
// Requirements on the captured forward: no host synchronisation (download, moe_experts) and no
// uploads inside; every temporary from Backend::empty (the caching allocator keeps addresses).
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace di::cuda {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Temporaries freed during the capture stay private to this graph (CudaAllocator::begin_private).
  void capture(CudaBackend& be, const std::function<void()>& enqueue);
  void replay();
  bool captured() const { return exec_ != nullptr; }
  // Nodes of the captured graph by type, e.g. "412 kernel, 3 memcpy, 1 host" (diagnostics).
  std::string node_summary() const;

 private:
  CudaBackend* be_ = nullptr;
  std::shared_ptr<void> private_blocks_;  // released after the graph (declared first)
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

using DecodeStepInputs = di::DecodeStepInputs;  // backend/backend.h

class DecodeGraph final : public DecodeStepGraph {
 public:
  // forward(token_ids [bucket] i32, batch, logit_rows [bucket] i32) -> logits [bucket, vocab] f32
  using Forward = DecodeForward;

  DecodeGraph(CudaBackend& be, Forward forward, int32_t bucket, int32_t max_blocks_per_seq,
              int32_t block_size);
  ~DecodeGraph() override;
  // Runs one eager warm-up step on padding (fills the allocator's cache) and captures.
  void capture();
  // Refreshes the metadata and replays; returns the logits of all bucket rows (rows >= n are
  // padding). Valid until the next run().
  const Tensor& run(const DecodeStepInputs& in) override;
  // Replays with the metadata of the last run() (benchmarks: times the graph alone).
  const Tensor& replay();
  // The same step without the graph, through identical device buffers (for tests).
  Tensor run_eager(const DecodeStepInputs& in);
  int32_t bucket() const override { return bucket_; }
  int32_t max_blocks_per_seq() const override { return max_blocks_per_seq_; }

 private:
  void fill(const DecodeStepInputs& in);
  void replay_timed();

  CudaBackend& be_;
  Forward forward_;
  int32_t bucket_, max_blocks_per_seq_, block_size_;
  Tensor ids_, rows_, logits_;
  PagedBatch batch_;
  // Host staging, kept alive until the next fill (the async copies read it).
  std::vector<Tensor> staging_;
  CudaGraph graph_;
  // DEEPINFER_GRAPH_STATS=1: GPU time of every replay (events around the launch, read at the
  // next fill, after its synchronize), logged with the node summary when the graph is destroyed.
  struct ReplayStats {
    cudaEvent_t start = nullptr, stop = nullptr;
    bool pending = false;  // a replay's events not read yet
    // After a synchronize: adds the pending replay's time (no-op when none is pending).
    cudaError_t collect();
    int64_t replays = 0;
    double gpu_ms = 0, max_ms = 0;
  };
  std::unique_ptr<ReplayStats> stats_;
};

}  // namespace di::cuda
