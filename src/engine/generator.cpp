#include "engine/generator.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "engine/eplb_runtime.h"
#include "engine/token_sampler.h"

namespace di {
namespace {

struct SeqState {
  const GenerateRequest* req = nullptr;
  std::vector<int32_t> tokens;  // prompt then generated tokens
  int64_t num_computed = 0;     // tokens whose KV is in the cache
  std::vector<int32_t> blocks;
  bool done = false;
  GenerateResult result;
};

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

}  // namespace

Generator::Generator(Model& model, Backend& backend, GeneratorOptions options)
    : model_(model), backend_(backend), options_(options) {
  DI_CHECK(options_.block_size > 0, "block size must be positive, got {}", options_.block_size);
}

std::vector<GenerateResult> Generator::generate(const std::vector<GenerateRequest>& requests) {
  const int32_t bs = options_.block_size;
  const int64_t vocab = model_.config().vocab_size;
  std::vector<SeqState> seqs(requests.size());
  int64_t blocks_needed = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    DI_CHECK(!r.prompt.empty(), "request {} has an empty prompt", i);
    for (int32_t id : r.prompt)
      DI_CHECK(id >= 0 && id < vocab, "request {}: token id {} outside the vocabulary [0, {})", i, id, vocab);
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
    DI_CHECK(total <= model_.max_context(),
             "request {}: prompt ({}) + max_tokens ({}) exceeds the context length {}", i,
             r.prompt.size(), r.max_tokens, model_.max_context());
    seqs[i].req = &r;
    seqs[i].tokens = r.prompt;
    blocks_needed += (total + bs - 1) / bs;
  }
  const int32_t num_blocks =
      options_.num_blocks > 0 ? options_.num_blocks : static_cast<int32_t>(std::max<int64_t>(1, blocks_needed));
  DI_CHECK(num_blocks >= blocks_needed, "{} KV blocks needed, {} available", blocks_needed, num_blocks);
  const KvLayout layout = model_.kv_layout(num_blocks, bs);
  Tensor pool = backend_.zeros({layout.num_blocks, layout.num_layers, layout.block_size, layout.entry_size},
                               backend_.compute_dtype());
  std::vector<int32_t> free_blocks(static_cast<size_t>(num_blocks));
  std::iota(free_blocks.rbegin(), free_blocks.rend(), 0);

  while (true) {
    // Gather this step's work: each active sequence contributes its uncomputed tokens (a prefill
    // chunk) or its last sampled token (decode).
    std::vector<int32_t> ids, positions, slots, qo{0}, kv_ptr{0}, kv_idx, last_len, logit_rows;
    std::vector<size_t> active;
    int32_t max_kv = 0;
    bool has_prompt_tokens = false;  // a prefill step for EPLB's statistics
    for (size_t i = 0; i < seqs.size(); ++i) {
      SeqState& s = seqs[i];
      if (s.done) continue;
      const int64_t n_total = static_cast<int64_t>(s.tokens.size());
      int64_t n_new = n_total - s.num_computed;
      if (options_.prefill_chunk > 0) n_new = std::min<int64_t>(n_new, options_.prefill_chunk);
      const int64_t end = s.num_computed + n_new;
      if (s.num_computed < static_cast<int64_t>(s.req->prompt.size())) has_prompt_tokens = true;
      while (static_cast<int64_t>(s.blocks.size()) * bs < end) {
        DI_CHECK(!free_blocks.empty(), "out of KV blocks");
        s.blocks.push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      for (int64_t p = s.num_computed; p < end; ++p) {
        ids.push_back(s.tokens[static_cast<size_t>(p)]);
        positions.push_back(static_cast<int32_t>(p));
        slots.push_back(s.blocks[static_cast<size_t>(p / bs)] * bs + static_cast<int32_t>(p % bs));
      }
      qo.push_back(static_cast<int32_t>(ids.size()));
      const int64_t used_blocks = (end + bs - 1) / bs;
      for (int64_t b = 0; b < used_blocks; ++b) kv_idx.push_back(s.blocks[static_cast<size_t>(b)]);
      kv_ptr.push_back(static_cast<int32_t>(kv_idx.size()));
      last_len.push_back(static_cast<int32_t>(end - (used_blocks - 1) * bs));
      max_kv = std::max<int32_t>(max_kv, static_cast<int32_t>(end));
      // Logits only when this step reaches the end of the known tokens.
      if (end == n_total) logit_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      else logit_rows.push_back(-1);
      s.num_computed = end;
      active.push_back(i);
    }
    if (active.empty()) break;

    PagedBatch batch;
    batch.positions = backend_.upload(host_i32(positions), DType::kI32);
    batch.slot_mapping = backend_.upload(host_i32(slots), DType::kI32);
    batch.qo_indptr = backend_.upload(host_i32(qo), DType::kI32);
    batch.kv_indptr = backend_.upload(host_i32(kv_ptr), DType::kI32);
    batch.kv_indices = backend_.upload(host_i32(kv_idx), DType::kI32);
    batch.kv_last_len = backend_.upload(host_i32(last_len), DType::kI32);
    batch.num_seqs = static_cast<int32_t>(active.size());
    batch.num_tokens = static_cast<int32_t>(ids.size());
    batch.max_kv_len = max_kv;
    std::vector<int32_t> rows;
    for (int32_t r : logit_rows)
      if (r >= 0) rows.push_back(r);
    if (options_.eplb)
      options_.eplb->begin_step(has_prompt_tokens ? EplbPhase::kPrefill : EplbPhase::kDecode);
    Tensor logits_dev = model_.forward(backend_.upload(host_i32(ids), DType::kI32), batch, pool,
                                       backend_.upload(host_i32(rows), DType::kI32));
    Tensor logits = backend_.download(logits_dev);
    if (options_.eplb) options_.eplb->end_step();  // may rebalance, between steps

    size_t row = 0;
    for (size_t a = 0; a < active.size(); ++a) {
      if (logit_rows[a] < 0) continue;
      SeqState& s = seqs[active[a]];
      const float* l = logits.f32() + static_cast<int64_t>(row++) * vocab;
      const GenerateRequest& r = *s.req;
      if (s.result.output.empty() && s.result.last_prompt_logits.empty())
        s.result.last_prompt_logits.assign(l, l + vocab);
      if (static_cast<int32_t>(s.result.output.size()) >= r.max_tokens) {
        s.done = true;
        continue;
      }
      if (options_.keep_step_logits) s.result.step_logits.emplace_back(l, l + vocab);
      const int64_t position = static_cast<int64_t>(s.tokens.size());
      const int32_t next = sample_next_token(l, vocab, r, position, s.tokens, s.result.output);
      s.result.output.push_back(next);
      s.tokens.push_back(next);
      const bool stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), next) != r.stop_ids.end();
      if (stop || static_cast<int32_t>(s.result.output.size()) >= r.max_tokens) s.done = true;
    }
  }
  std::vector<GenerateResult> out;
  for (auto& s : seqs) out.push_back(std::move(s.result));
  return out;
}

}  // namespace di
