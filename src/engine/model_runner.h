#pragma once
// ModelRunner: runs one scheduler StepPlan on the model. It owns the KV pool tensor and turns the
// plan's host metadata (token ids, positions, CSR block tables, slots) into a PagedBatch of device
// tensors, performs the plan's block copies, runs the forward and brings the requested logit rows
// back to the host (execute), or leaves them on the device for a device sampler
// (execute_on_device). It knows nothing about requests, sampling or queues.
//
//   StepPlan ──► copy_blocks(plan.block_copies) ──► upload ids / positions / CSR ──► forward
//            ◄── logits [rows, vocab] on the host ◄── download ◄──────────────────────┘
//                                       (execute_on_device: no download)
//
// Decode-only steps can replay captured step graphs instead (enable_decode_graphs; CUDA graphs on
// the CUDA backend, nothing on the CPU): one graph per (power-of-two bucket of sequences,
// power-of-two context bucket >= 1,024 tokens), captured on first use, padded up to its buckets.
// The logits are the same computation as the eager forward's (the padding rows write no KV and are
// never read back).
//
// Only the engine thread calls it.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/step_sync.h"
#include "model/model.h"
#include "scheduler/scheduler.h"

namespace di {

// The decode shape a DP group agreed on for this step (step_sync.h), as the runner uses it:
// every rank pads its decode step to `bucket` sequences and looks its step graph up by the
// group's longest context, so all ranks replay graphs of one key. bucket 0: no agreement (a
// standalone engine, or a step that is not a plain decode on every rank).
struct GroupDecode {
  int32_t bucket = 0;
  int32_t max_blocks = 0;
  // A rank of a DP group: it may replay or capture a step graph only when the group agreed on a
  // decode bucket (bucket > 0). With bucket 0 another rank runs a prefill or mixed step, every
  // rank takes the throughput exchange eagerly, and a graph (which holds the latency exchange)
  // would pair its collectives with nobody's.
  bool member = false;
};

class ModelRunner {
 public:
  // Allocates a zeroed pool of `num_blocks` blocks of `block_size` tokens on `backend`.
  ModelRunner(Model& model, Backend& backend, int32_t num_blocks, int32_t block_size);

  const KvLayout& layout() const { return layout_; }
  const Tensor& pool() const { return pool_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }

  // Copies every layer of each source block into its destination block (copy-on-write of a
  // shared partial block for n > 1 siblings). Must run before the forward of the same step.
  void copy_blocks(std::span<const BlockCopy> copies);

  // Runs the forward over every scheduled token of `plan` (decodes, then prefill chunks) and
  // returns the f32 host logits [logit_rows.size(), vocab] of the given batch rows (indices into
  // plan.input_ids; repeats allowed). Performs plan.block_copies first.
  // In a DP group (group.bucket > 0, every rank the same) a decode step runs as that bucket.
  Tensor execute(const StepPlan& plan, std::span<const int32_t> logit_rows,
                 const GroupDecode& group = {});
  // execute() without the download: the logits [logit_rows.size(), vocab] f32 on the backend's
  // device (the host on the CPU backend), possibly still being computed (stream order). Valid
  // until the next execute*: a graph step's logits are rows of the graph's own buffer.
  Tensor execute_on_device(const StepPlan& plan, std::span<const int32_t> logit_rows,
                           const GroupDecode& group = {});

  // This rank's side of the group's agreement: rows = sequences when the step is a plain decode
  // step (one token per sequence, every row's logits in order), else -1; its longest context.
  DecodeShape decode_shape(const StepPlan& plan, std::span<const int32_t> logit_rows) const;
  // The power-of-two bucket of `rows` sequences (>= 1), at most max_batch.
  static int32_t decode_bucket(int32_t rows, int32_t max_batch);

  // One padding token through every layer, discarding its logits: a rank of a DP group that has
  // nothing to run while others step (every MoE layer is a collective, dp_engine_group.h). The
  // token writes no KV (slot -1) and belongs to a sequence without blocks (zero attention), the
  // padding rows of backend/decode_step.h; the pool is untouched.
  // With group.bucket > 0 it replays the group's step graph with no sequences (every row
  // padding) where graphs are on, so a padding rank costs what a decode rank costs.
  void execute_padding(const GroupDecode& group = {});

  // Decode-only steps of up to `max_batch` sequences (each within `max_model_len` tokens) replay
  // step graphs where the backend makes them. A backend without graphs, or a capture that fails
  // (logged once), leaves every step eager.
  void enable_decode_graphs(int32_t max_batch, int32_t max_model_len);
  bool decode_graphs_enabled() const { return graphs_on_; }
  int64_t graph_steps() const { return graph_steps_; }  // steps served by a replay

 private:
  // The graph path of execute_on_device(); a null Tensor when the step does not qualify or
  // graphs are off.
  Tensor execute_graph(const StepPlan& plan, const std::vector<int32_t>& slots,
                       std::span<const int32_t> logit_rows, const GroupDecode& group);
  // The step graph of (bucket sequences, max_blocks context), captured on first use; null when
  // graphs are off or the capture failed (then graphs stay off).
  DecodeStepGraph* graph_for(int32_t bucket, int32_t max_blocks);

  Model& model_;
  Backend& backend_;
  KvLayout layout_;
  Tensor pool_;  // [num_blocks][num_layers][block_size][entry_size], backend compute dtype
  bool graphs_on_ = false;
  int32_t graph_max_batch_ = 0;
  int32_t graph_max_blocks_ = 0;
  // By (batch bucket, context bucket in blocks): both powers of two, captured on first use.
  std::map<std::pair<int32_t, int32_t>, std::unique_ptr<DecodeStepGraph>> graphs_;
  int64_t graph_steps_ = 0;
};

// Bytes of one KV block of `model` (all layers) in the backend's compute dtype.
int64_t kv_block_bytes(const Model& model, const Backend& backend, int32_t block_size);

}  // namespace di
