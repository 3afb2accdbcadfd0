#pragma once
// ModelRunner: runs one scheduler StepPlan on the model. It owns the KV pool tensor and turns the
// plan's host metadata (token ids, positions, CSR block tables, slots) into a PagedBatch of device
// tensors, performs the plan's block copies, runs the forward and brings the requested logit rows
// back to the host. It knows nothing about requests, sampling or queues.
//
//   StepPlan ──► copy_blocks(plan.block_copies) ──► upload ids / positions / CSR ──► forward
//            ◄── logits [rows, vocab] on the host ◄── download ◄──────────────────────┘
//
// Only the engine thread calls it.
#include <cstdint>
#include <span>

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

 private:
  Model& model_;
  Backend& backend_;
  KvLayout layout_;
  Tensor pool_;  // [num_blocks][num_layers][block_size][entry_size], backend compute dtype
};

// Bytes of one KV block of `model` (all layers) in the backend's compute dtype.
int64_t kv_block_bytes(const Model& model, const Backend& backend, int32_t block_size);

}  // namespace di
