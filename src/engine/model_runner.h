#pragma once
// ModelRunner: runs one scheduler StepPlan on the model. It owns the KV pool tensor and turns the
// plan's host metadata (token ids, positions, CSR block tables, slots) into a PagedBatch of device
// tensors, performs the plan's block copies, runs the forward and brings the requested logit rows
// back to the host. It knows nothing about requests, sampling or queues.
//
//   StepPlan ──► copy_blocks(plan.block_copies) ──► upload ids / positions / CSR ──► forward
//            ◄── logits [rows, vocab] on the host ◄── download ◄──────────────────────┘
//
// Decode-only steps can replay captured step graphs instead (enable_decode_graphs; CUDA graphs on
// the CUDA backend, nothing on the CPU): one graph per (power-of-two bucket of sequences,
// power-of-two context bucket >= 1,024 tokens), captured on first use, padded up to its buckets. The logits are the same computation as the eager
// forward's (the padding rows write no KV and are never read back).
//
// Only the engine thread calls it.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "scheduler/scheduler.h"

namespace di {

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
  Tensor execute(const StepPlan& plan, std::span<const int32_t> logit_rows);

  // One padding token through every layer, discarding its logits: a rank of a DP group that has
  // nothing to run while others step (every MoE layer is a collective, dp_engine_group.h). The
  // token writes no KV (slot -1) and belongs to a sequence without blocks (zero attention), the
  // padding rows of backend/decode_step.h; the pool is untouched.
  void execute_padding();

  // Decode-only steps of up to `max_batch` sequences (each within `max_model_len` tokens) replay
  // step graphs where the backend makes them. A backend without graphs, or a capture that fails
  // (logged once), leaves every step eager.
  void enable_decode_graphs(int32_t max_batch, int32_t max_model_len);
  bool decode_graphs_enabled() const { return graphs_on_; }
  int64_t graph_steps() const { return graph_steps_; }  // steps served by a replay

 private:
  // The graph path of execute(); a null Tensor when the step does not qualify or graphs are off.
  Tensor execute_graph(const StepPlan& plan, const std::vector<int32_t>& slots,
                       std::span<const int32_t> logit_rows);

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
