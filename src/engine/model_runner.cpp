#include "engine/model_runner.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/logging.h"

namespace di {
namespace {

Tensor host_i32(std::span<const int32_t> v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

}  // namespace

int64_t kv_block_bytes(const Model& model, const Backend& backend, int32_t block_size) {
  return model.kv_layout(1, block_size).block_stride() *
         static_cast<int64_t>(dtype_size(backend.compute_dtype()));
}

ModelRunner::ModelRunner(Model& model, Backend& backend, int32_t num_blocks, int32_t block_size)
    : model_(model), backend_(backend), layout_(model.kv_layout(num_blocks, block_size)) {
  DI_CHECK(num_blocks > 0 && block_size > 0, "KV pool of {} blocks x {} tokens", num_blocks,
           block_size);
  pool_ = backend_.zeros(
      {layout_.num_blocks, layout_.num_layers, layout_.block_size, layout_.entry_size},
      backend_.compute_dtype());
}

void ModelRunner::copy_blocks(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  std::vector<std::pair<int32_t, int32_t>> src_dst;
  src_dst.reserve(copies.size());
  for (const BlockCopy& c : copies) src_dst.emplace_back(c.src.value(), c.dst.value());
  backend_.copy_blocks(pool_, layout_, src_dst);
}

Tensor ModelRunner::execute(const StepPlan& plan, std::span<const int32_t> logit_rows,
                            const GroupDecode& group) {
  Tensor host = backend_.download(execute_on_device(plan, logit_rows, group));
  DI_CHECK(host.dtype() == DType::kF32 &&
               host.numel() == static_cast<int64_t>(logit_rows.size()) * vocab_size(),
           "forward returned {} for {} logit rows of vocab {}", host.describe(), logit_rows.size(),
           vocab_size());
  return host;
}

Tensor ModelRunner::execute_on_device(const StepPlan& plan, std::span<const int32_t> logit_rows,
                                      const GroupDecode& group) {
  const ScheduleResult& s = plan.schedule;
  const auto num_tokens = static_cast<int32_t>(plan.input_ids.size());
  DI_CHECK(num_tokens > 0 && plan.positions.size() == plan.input_ids.size(),
           "step with {} token ids and {} positions", plan.input_ids.size(), plan.positions.size());
  const PagedBatchView& v = plan.paged;
  DI_CHECK(v.slot_block_ids.size() == plan.input_ids.size(), "step with {} tokens but {} KV slots",
           plan.input_ids.size(), v.slot_block_ids.size());
  copy_blocks(plan.block_copies);

  // Query rows per sequence in plan order (decodes, then prefills), as the CSR view is built.
  std::vector<int32_t> qo_indptr{0};
  int32_t max_kv_len = 0;
  for (const auto* list : {&s.decodes, &s.prefills}) {
    for (const ScheduledSeq& e : *list) {
      qo_indptr.push_back(qo_indptr.back() + e.num_tokens);
      max_kv_len = std::max(max_kv_len, e.start + e.num_tokens);
    }
  }
  const auto num_seqs = static_cast<int32_t>(qo_indptr.size()) - 1;
  DI_CHECK(qo_indptr.back() == num_tokens && v.indptr.size() == qo_indptr.size(),
           "plan of {} sequences covers {} tokens; the batch has {} tokens and {} block lists",
           num_seqs, qo_indptr.back(), num_tokens, v.indptr.size() - 1);
  std::vector<int32_t> slots(plan.input_ids.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i] = v.slot_block_ids[i] * layout_.block_size + v.slot_offsets[i];
  }
  for (int32_t r : logit_rows) {
    DI_CHECK(r >= 0 && r < num_tokens, "logit row {} outside the batch of {} tokens", r,
             num_tokens);
  }

  if (graphs_on_) {
    if (Tensor out = execute_graph(plan, slots, logit_rows, group); !out.is_null()) return out;
  }

  PagedBatch batch;
  batch.positions = backend_.upload(host_i32(plan.positions), DType::kI32);
  batch.slot_mapping = backend_.upload(host_i32(slots), DType::kI32);
  batch.qo_indptr = backend_.upload(host_i32(qo_indptr), DType::kI32);
  batch.kv_indptr = backend_.upload(host_i32(v.indptr), DType::kI32);
  batch.kv_indices = backend_.upload(host_i32(v.indices), DType::kI32);
  batch.kv_last_len = backend_.upload(host_i32(v.last_len), DType::kI32);
  batch.num_seqs = num_seqs;
  batch.num_tokens = num_tokens;
  batch.max_kv_len = max_kv_len;
  Tensor ids = backend_.upload(host_i32(plan.input_ids), DType::kI32);
  Tensor rows = backend_.upload(host_i32(logit_rows), DType::kI32);
  Tensor logits = model_.forward(ids, batch, pool_, rows);
  DI_CHECK(logits.dtype() == DType::kF32 && logits.dim() == 2 &&
               logits.size(0) == static_cast<int64_t>(logit_rows.size()) &&
               logits.size(1) == vocab_size(),
           "forward returned {} for {} logit rows of vocab {}", logits.describe(),
           logit_rows.size(), vocab_size());
  return logits;
}

DecodeShape ModelRunner::decode_shape(const StepPlan& plan,
                                      std::span<const int32_t> logit_rows) const {
  const ScheduleResult& s = plan.schedule;
  const PagedBatchView& v = plan.paged;
  const auto n = static_cast<int32_t>(plan.input_ids.size());
  DecodeShape shape;
  for (size_t i = 0; i + 1 < v.indptr.size(); ++i) {
    shape.max_blocks = std::max(shape.max_blocks, v.indptr[i + 1] - v.indptr[i]);
  }
  if (!s.prefills.empty() || static_cast<int32_t>(s.decodes.size()) != n || n == 0 ||
      static_cast<int32_t>(logit_rows.size()) != n) {
    return shape;  // rows -1
  }
  for (int32_t i = 0; i < n; ++i) {
    if (logit_rows[static_cast<size_t>(i)] != i) return shape;
  }
  shape.rows = n;
  return shape;
}

int32_t ModelRunner::decode_bucket(int32_t rows, int32_t max_batch) {
  int32_t bucket = 1;
  while (bucket < rows) bucket *= 2;
  return std::max(1, std::min(bucket, max_batch));
}

void ModelRunner::execute_padding(const GroupDecode& group) {
  if (group.bucket > 0 && graphs_on_ && group.bucket <= graph_max_batch_ &&
      group.max_blocks <= graph_max_blocks_) {
    if (DecodeStepGraph* graph = graph_for(group.bucket, group.max_blocks)) {
      DecodeStepInputs in;  // no sequences: every row of the bucket is padding
      in.block_size = layout_.block_size;
      graph->run(in);
      ++graph_steps_;
      return;
    }
  }
  const std::vector<int32_t> zero{0}, pad_slot{-1}, one_seq{0, 1}, no_blocks{0, 0};
  PagedBatch batch;
  batch.positions = backend_.upload(host_i32(zero), DType::kI32);
  batch.slot_mapping = backend_.upload(host_i32(pad_slot), DType::kI32);
  batch.qo_indptr = backend_.upload(host_i32(one_seq), DType::kI32);
  batch.kv_indptr = backend_.upload(host_i32(no_blocks), DType::kI32);
  batch.kv_indices = backend_.upload(host_i32(zero), DType::kI32);  // one unused entry
  batch.kv_last_len = backend_.upload(host_i32(zero), DType::kI32);
  batch.num_seqs = 1;
  batch.num_tokens = 1;
  batch.max_kv_len = 1;
  const Tensor ids = backend_.upload(host_i32(zero), DType::kI32);
  const Tensor rows = backend_.upload(host_i32(zero), DType::kI32);
  model_.forward(ids, batch, pool_, rows);
}

void ModelRunner::enable_decode_graphs(int32_t max_batch, int32_t max_model_len) {
  DI_CHECK(max_batch > 0 && max_model_len > 0, "decode graphs for {} sequences of {} tokens",
           max_batch, max_model_len);
  graphs_.clear();
  graph_max_batch_ = max_batch;
  graph_max_blocks_ = (max_model_len + layout_.block_size - 1) / layout_.block_size;
  graphs_on_ = true;
}

Tensor ModelRunner::execute_graph(const StepPlan& plan, const std::vector<int32_t>& slots,
                                  std::span<const int32_t> logit_rows, const GroupDecode& group) {
  const PagedBatchView& v = plan.paged;
  const auto n = static_cast<int32_t>(plan.input_ids.size());
  // Decode only (one token per sequence), every row's logits once in order, within the sizes
  // the graphs were made for.
  if (group.member && group.bucket <= 0) return Tensor();  // the group steps eagerly
  const DecodeShape shape = decode_shape(plan, logit_rows);
  if (shape.rows < 0 || n > graph_max_batch_) return Tensor();
  int32_t bucket = decode_bucket(n, graph_max_batch_);
  int32_t max_blocks = shape.max_blocks;
  if (group.bucket > 0) {  // a DP group: every rank replays the same key
    if (group.bucket < n) return Tensor();
    bucket = group.bucket;
    max_blocks = std::max(max_blocks, group.max_blocks);
  }
  if (bucket > graph_max_batch_ || max_blocks > graph_max_blocks_) return Tensor();
  DecodeStepGraph* graph = graph_for(bucket, max_blocks);
  if (graph == nullptr) return Tensor();
  DecodeStepInputs in;
  in.block_size = layout_.block_size;
  in.token_ids.assign(plan.input_ids.begin(), plan.input_ids.end());
  in.positions = plan.positions;
  in.slots = slots;
  in.block_tables.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    in.block_tables.emplace_back(v.indices.begin() + v.indptr[static_cast<size_t>(i)],
                                 v.indices.begin() + v.indptr[static_cast<size_t>(i) + 1]);
  }
  const Tensor& logits = graph->run(in);
  ++graph_steps_;
  return logits.slice_rows(0, n);
}

DecodeStepGraph* ModelRunner::graph_for(int32_t bucket, int32_t max_blocks) {
  if (!graphs_on_) return nullptr;
  // Context bucket: attention is captured for a maximum context, and its split-KV grid and
  // combine cover that whole length on every replay, so one graph sized for max_model_len
  // (128K tokens) would make every short-context step pay for 128K. Powers of two of at least
  // 1,024 tokens keep the waste under 2x.
  const int32_t min_blocks = std::max(1, 1024 / layout_.block_size);
  int32_t ctx_blocks = min_blocks;
  while (ctx_blocks < max_blocks) ctx_blocks *= 2;
  ctx_blocks = std::min(ctx_blocks, graph_max_blocks_);
  std::unique_ptr<DecodeStepGraph>& graph = graphs_[{bucket, ctx_blocks}];
  if (!graph) {
    try {
      graph = backend_.make_decode_graph(
          [this](const Tensor& ids, const PagedBatch& b, const Tensor& rows) {
            return model_.forward(ids, b, pool_, rows);
          },
          bucket, ctx_blocks, layout_.block_size);
    } catch (const std::exception& e) {
      DI_LOG_WARN("decode graphs off: capturing a step of {} sequences failed: {}", bucket,
                  e.what());
      graph.reset();
    }
    if (!graph) {  // no graphs on this backend, or the capture failed: eager from now on
      graphs_on_ = false;
      graphs_.clear();
      return nullptr;
    }
  }
  return graph.get();
}

}  // namespace di
