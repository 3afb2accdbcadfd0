#include "backend/cuda/cuda_graph.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "core/env.h"
#include "core/logging.h"

#include "backend/cuda/cuda_check.h"
#include "backend/decode_step.h"

namespace di::cuda {

CudaGraph::~CudaGraph() {
  if (be_) cudaStreamSynchronize(be_->stream());  // no replay may still use the private blocks
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void CudaGraph::capture(CudaBackend& be, const std::function<void()>& enqueue) {
  DI_CHECK(exec_ == nullptr, "CudaGraph::capture: already captured");
  be_ = &be;
  // Relaxed: cudaMalloc from the caching allocator is allowed while capturing.
  CUDA_CHECK(cudaStreamBeginCapture(be.stream(), cudaStreamCaptureModeRelaxed));
  be.allocator().begin_private();
  try {
    enqueue();
  } catch (...) {
    private_blocks_ = be.allocator().end_private();
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(be.stream(), &g);  // returns "invalidated" after a failed capture
    if (g) cudaGraphDestroy(g);
    // Clear the runtime's last error, or the caller's next launch check would report this
    // capture's failure (seen on the H200: the fp32 mode's MoE path synchronizes, the capture
    // fails, the engine falls back to eager and its first launch failed "capture invalidated").
    (void)cudaGetLastError();
    throw;
  }
  private_blocks_ = be.allocator().end_private();
  CUDA_CHECK(cudaStreamEndCapture(be.stream(), &graph_));
  CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

std::string CudaGraph::node_summary() const {
  if (graph_ == nullptr) return "not captured";
  size_t n = 0;
  if (cudaGraphGetNodes(graph_, nullptr, &n) != cudaSuccess) return "?";
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0 && cudaGraphGetNodes(graph_, nodes.data(), &n) != cudaSuccess) return "?";
  std::map<std::string, int> by_type;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    if (cudaGraphNodeGetType(node, &t) != cudaSuccess) {
      ++by_type["?"];
      continue;
    }
    switch (t) {
      case cudaGraphNodeTypeKernel:
        ++by_type["kernel"];
        break;
      case cudaGraphNodeTypeMemcpy:
        ++by_type["memcpy"];
        break;
      case cudaGraphNodeTypeMemset:
        ++by_type["memset"];
        break;
      case cudaGraphNodeTypeHost:
        ++by_type["host"];
        break;
      case cudaGraphNodeTypeGraph:
        ++by_type["child graph"];
        break;
      case cudaGraphNodeTypeEmpty:
        ++by_type["empty"];
        break;
      case cudaGraphNodeTypeWaitEvent:
        ++by_type["event wait"];
        break;
      case cudaGraphNodeTypeEventRecord:
        ++by_type["event record"];
        break;
      default:
        ++by_type["other(" + std::to_string(static_cast<int>(t)) + ")"];
        break;
    }
  }
  std::string out;
  for (const auto& [name, count] : by_type) {
    if (!out.empty()) out += ", ";
    out += std::to_string(count) + " " + name;
  }
  return out;
}

void CudaGraph::replay() {
  DI_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing captured");
  CUDA_CHECK(cudaGraphLaunch(exec_, be_->stream()));
}

DecodeGraph::DecodeGraph(CudaBackend& be, Forward forward, int32_t bucket,
                         int32_t max_blocks_per_seq, int32_t block_size)
    : be_(be),
      forward_(std::move(forward)),
      bucket_(bucket),
      max_blocks_per_seq_(max_blocks_per_seq),
      block_size_(block_size) {
  DI_CHECK(bucket > 0 && max_blocks_per_seq > 0 && block_size > 0,
           "DecodeGraph: bucket {} blocks/seq {} block size {}", bucket, max_blocks_per_seq,
           block_size);
  ids_ = be.zeros({bucket}, DType::kI32);
  rows_ = be.zeros({bucket}, DType::kI32);
  batch_.positions = be.zeros({bucket}, DType::kI32);
  batch_.slot_mapping = be.zeros({bucket}, DType::kI32);
  batch_.qo_indptr = be.zeros({bucket + 1}, DType::kI32);
  batch_.kv_indptr = be.zeros({bucket + 1}, DType::kI32);
  batch_.kv_indices = be.zeros({int64_t{bucket} * max_blocks_per_seq}, DType::kI32);
  batch_.kv_last_len = be.zeros({bucket}, DType::kI32);
  batch_.num_seqs = bucket;
  batch_.num_tokens = bucket;
  batch_.max_kv_len = max_blocks_per_seq * block_size;
}

cudaError_t DecodeGraph::ReplayStats::collect() {
  if (!pending) return cudaSuccess;
  pending = false;
  float ms = 0;
  const cudaError_t e = cudaEventElapsedTime(&ms, start, stop);
  if (e != cudaSuccess) return e;
  gpu_ms += ms;
  max_ms = std::max<double>(max_ms, ms);
  return cudaSuccess;
}

DecodeGraph::~DecodeGraph() {
  if (!stats_) return;
  be_.synchronize();
  (void)stats_->collect();  // a destructor reports what it can
  DI_LOG_INFO(
      "decode graph ({} seqs, {} blocks/seq): {} replays, GPU {:.1f} us mean, {:.1f} us "
      "max; nodes: {}",
      bucket_, max_blocks_per_seq_, stats_->replays,
      stats_->replays > 0 ? 1000.0 * stats_->gpu_ms / static_cast<double>(stats_->replays) : 0.0,
      1000.0 * stats_->max_ms, graph_.node_summary());
  cudaEventDestroy(stats_->start);
  cudaEventDestroy(stats_->stop);
}

void DecodeGraph::fill(const DecodeStepInputs& in) {
  PaddedDecodeStep step = pad_decode_step(in, bucket_, max_blocks_per_seq_, block_size_);
  be_.synchronize();  // the previous step's staging buffers may still be read
  if (stats_) CUDA_CHECK(stats_->collect());
  staging_ = {step.ids,       step.positions,  step.slots,       step.qo_indptr,
              step.kv_indptr, step.kv_indices, step.kv_last_len, step.rows};
  be_.copy_to_device(step.ids, ids_);
  be_.copy_to_device(step.positions, batch_.positions);
  be_.copy_to_device(step.slots, batch_.slot_mapping);
  be_.copy_to_device(step.qo_indptr, batch_.qo_indptr);
  be_.copy_to_device(step.kv_indptr, batch_.kv_indptr);
  be_.copy_to_device(step.kv_indices, batch_.kv_indices);
  be_.copy_to_device(step.kv_last_len, batch_.kv_last_len);
  be_.copy_to_device(step.rows, rows_);
}

void DecodeGraph::capture() {
  DecodeStepInputs pad;
  pad.block_size = block_size_;
  fill(pad);
  be_.set_attention_max_kv_len(batch_.max_kv_len);
  forward_(ids_, batch_, rows_);  // warm-up: kernels configured, allocator cache filled
  be_.synchronize();
  graph_.capture(be_, [&] { logits_ = forward_(ids_, batch_, rows_); });
  be_.set_attention_max_kv_len(0);
  if (di::env::is("DEEPINFER_GRAPH_STATS", "1")) {
    stats_ = std::make_unique<ReplayStats>();
    CUDA_CHECK(cudaEventCreate(&stats_->start));
    CUDA_CHECK(cudaEventCreate(&stats_->stop));
    DI_LOG_INFO("decode graph ({} seqs, {} blocks/seq) captured; nodes: {}", bucket_,
                max_blocks_per_seq_, graph_.node_summary());
  }
}

void DecodeGraph::replay_timed() {
  if (!stats_) {
    graph_.replay();
    return;
  }
  CUDA_CHECK(cudaEventRecord(stats_->start, be_.stream()));
  graph_.replay();
  CUDA_CHECK(cudaEventRecord(stats_->stop, be_.stream()));
  stats_->pending = true;
  ++stats_->replays;
}

const Tensor& DecodeGraph::run(const DecodeStepInputs& in) {
  fill(in);
  replay_timed();
  return logits_;
}

const Tensor& DecodeGraph::replay() {
  graph_.replay();
  return logits_;
}

Tensor DecodeGraph::run_eager(const DecodeStepInputs& in) {
  fill(in);
  be_.set_attention_max_kv_len(batch_.max_kv_len);
  Tensor out = forward_(ids_, batch_, rows_);
  be_.set_attention_max_kv_len(0);
  return out;
}

std::unique_ptr<DecodeStepGraph> CudaBackend::make_decode_graph(DecodeForward forward,
                                                                int32_t bucket,
                                                                int32_t max_blocks_per_seq,
                                                                int32_t block_size) {
  auto graph = std::make_unique<DecodeGraph>(*this, std::move(forward), bucket, max_blocks_per_seq,
                                             block_size);
  graph->capture();
  return graph;
}

}  // namespace di::cuda
