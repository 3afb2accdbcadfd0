#pragma once
// The op interface every backend implements. The CPU backend (cpu/) is the fp32 reference that
// every other backend is tested against (tests/ops). Model code (model/) drives a Backend only
// through these ops, so the same model code runs on every backend.
//
// Conventions: activations are row-major [tokens, features]; "T" is the number of tokens in the
// batch; weights of linear layers are [out_features, in_features] as in Hugging Face checkpoints.
// Integer metadata (positions, block tables) are i32 tensors on the backend's device.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tensor/tensor.h"

namespace di {

// Paged KV pool layout (design.md §3): block-major, all layers of a block contiguous, so a block
// moves between tiers as one chunk.   pool = [num_blocks][num_layers][block_size][entry_size]
// entry_size is the per-token, per-layer width in elements: 2 * kv_heads * head_dim for GQA
// (K then V), kv_lora_rank + qk_rope_head_dim for MLA (the compressed latent, then the rope key).
struct KvLayout {
  int32_t num_blocks = 0;
  int32_t num_layers = 0;
  int32_t block_size = 64;
  int32_t entry_size = 0;
  int64_t block_stride() const { return int64_t{num_layers} * block_size * entry_size; }
  int64_t layer_offset(int32_t layer) const { return int64_t{layer} * block_size * entry_size; }
  size_t pool_elems() const { return static_cast<size_t>(num_blocks) * block_stride(); }
};

// The batch's paged-KV view, shared by every layer (CSR over sequences). All i32 on the device.
struct PagedBatch {
  Tensor positions;     // [T] absolute position of each new token in its sequence
  Tensor slot_mapping;  // [T] block_id * block_size + offset where each new token's KV goes;
                        // negative: padding (CUDA-graph buckets), nothing is written
  Tensor qo_indptr;     // [S + 1] new tokens of sequence s are rows [qo_indptr[s], qo_indptr[s+1])
  Tensor kv_indptr;     // [S + 1] blocks of sequence s are kv_indices[kv_indptr[s] .. kv_indptr[s+1])
                        // (none: a padding sequence, whose attention output is zero)
  Tensor kv_indices;    // block ids, concatenated per sequence
  Tensor kv_last_len;   // [S] valid tokens in each sequence's last block (1..block_size)
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;
  int32_t max_kv_len = 0;  // host-side hint for kernels that size work by context length
};

// One attention call over the paged cache: for every new token, causal attention over cache
// positions [0, position]. Keys and values are read from the pool with explicit offsets so GQA
// (separate K and V heads) and MLA (K = [latent, rope], V = latent, one shared head) use one op.
struct PagedAttentionParams {
  const Tensor* q = nullptr;  // [T, num_q_heads, head_dim_qk], or the first part (q_rope below)
  // Optional second part of the query (MLA: the roped q_pe next to the absorbed q_lat, so neither
  // is copied into one buffer): when set, q is [T, num_q_heads, head_dim_qk - rope_dim], q_rope
  // is [T, num_q_heads, rope_dim] (rope_dim = q_rope->size(-1)), and the query of (t, h) is
  // [q[t, h, :] | q_rope[t, h, :]]. Same results as attention on the concatenation.
  const Tensor* q_rope = nullptr;
  Tensor* out = nullptr;      // [T, num_q_heads, head_dim_v]
  const Tensor* pool = nullptr;  // the KV pool, KvLayout order
  KvLayout layout;
  int32_t layer = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;  // q head h reads kv head h / (num_q_heads / num_kv_heads)
  int32_t head_dim_qk = 0;
  int32_t head_dim_v = 0;
  int32_t k_offset = 0;       // elements from the start of a token's entry to K of kv head 0
  int32_t v_offset = 0;       // elements from the start of a token's entry to V of kv head 0
  int32_t kv_head_stride = 0; // elements between consecutive kv heads (for K and for V)
  float scale = 1.0f;         // softmax scale applied to q·k
  const PagedBatch* batch = nullptr;
  // Optional per-head output projection (MLA's W_UV): with head_w [num_q_heads, n, head_dim_v],
  // the op also computes head_out [T, num_q_heads, n] = head_linear(out, head_w), and `out` is
  // scratch whose contents are unspecified afterwards (a backend may merge the attention's
  // partial states inside the projection and never write it: CUDA's batch-1 MLA decode).
  const Tensor* head_w = nullptr;
  Tensor* head_out = nullptr;
};

// The attention prologue of the GQA family (Llama, Qwen3) as one op: split the fused QKV GEMM
// output, per-head RMSNorm of q and k when the weights are given (Qwen3), rope q and k over the
// whole head (pairs (i, i + head_dim/2)), q -> q_out, k and v -> the pool entries of the batch's
// new tokens in layer `layer`, entry = [K: kv_heads x head_dim | V: kv_heads x head_dim].
struct QkvRopeStoreParams {
  const Tensor* qkv = nullptr;      // [T, (num_q_heads + 2 * num_kv_heads) * head_dim]
  Tensor* q_out = nullptr;          // [T, num_q_heads, head_dim]
  Tensor* pool = nullptr;           // the KV pool, KvLayout order
  KvLayout layout;
  int32_t layer = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const Tensor* q_norm = nullptr;   // [head_dim] or null (no q/k norm)
  const Tensor* k_norm = nullptr;   // [head_dim] or null
  float eps = 1e-6f;
  const Tensor* cos_sin = nullptr;  // [max_pos, head_dim], as for rope()
  const PagedBatch* batch = nullptr;
};

// The attention prologue of multi-head latent attention (DeepSeek V2/V3, model/deepseek_v3.cpp)
// as one op. Inputs are column ranges of 2-D row-major tensors, so both can be parts of one fused
// projection output [T, q part | latent | k_pe] (the same tensor may be passed twice):
//   q rows:  q[t, q_col + h * (nope_dim + rope_dim) + i], the per-head [q_nope | q_pe] (no q_lora:
//            the fused projection; with q_lora: q_b's output, q_col = 0)
//   kv_a:    kv_a[t, kv_col + i], i < latent_dim + rope_dim: [latent | k_pe] of kv_a_proj_with_mqa
// Outputs:
//   q_nope[t, h, :]  = q_nope part of head h, copied              [T, num_heads, nope_dim]
//   q_pe[t, h, :]    = rope(q_pe part of head h)                  [T, num_heads, rope_dim]
//   pool entry of token t in layer `layer`, elements [0, latent_dim + rope_dim):
//                      [rms_norm(latent) · kv_a_norm (eps) | rope(k_pe)]
//   q_lat (optional, with w_uk_t): head_linear(q_nope, w_uk_t)   [T, num_heads, latent_dim]
//                      the absorbed query W_UK,hᵀ q_nope[t, h] (CUDA computes it in the same
//                      launch)
// rope as Backend::rope over the rope_dim values (pairs (2i, 2i+1) when interleaved, else
// (i, i + rope_dim/2)) at batch->positions[t]. Tokens with a negative slot (padding) write no KV.
// Each step rounds to the storage dtype like the composed ops do (mla_rope_store_composed).
struct MlaRopeStoreParams {
  const Tensor* q = nullptr;     // [T, q_row_width] (any shape with T rows), q part at q_col
  int32_t q_col = 0;             // first column of head 0's q_nope in each row of q
  const Tensor* kv_a = nullptr;  // [T, kv_row_width], [latent | k_pe] at kv_col
  int32_t kv_col = 0;
  Tensor* q_nope = nullptr;  // [T, num_heads, nope_dim], contiguous
  Tensor* q_pe = nullptr;    // [T, num_heads, rope_dim], contiguous
  Tensor* pool = nullptr;    // the KV pool, KvLayout order; entry_size >= latent + rope
  KvLayout layout;
  int32_t layer = 0;
  int32_t num_heads = 0;
  int32_t nope_dim = 0;               // qk_nope_head_dim
  int32_t rope_dim = 0;               // qk_rope_head_dim, even
  int32_t latent_dim = 0;             // kv_lora_rank
  const Tensor* kv_a_norm = nullptr;  // [latent_dim]
  float eps = 1e-6f;
  const Tensor* cos_sin = nullptr;  // [max_pos, rope_dim], as for rope()
  bool interleaved = false;
  const PagedBatch* batch = nullptr;
  const Tensor* w_uk_t = nullptr;  // [num_heads, latent_dim, nope_dim]: with q_lat, the absorption
  Tensor* q_lat = nullptr;         // [T, num_heads, latent_dim]
};

// Router of a mixture-of-experts layer: scores, optional group limit, top-k, weights.
struct MoeRoutingParams {
  enum class Scoring { kSoftmax, kSigmoid };
  enum class GroupScore { kMax, kTopTwoSum };
  Scoring scoring = Scoring::kSoftmax;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t num_groups = 1;   // experts split into groups of num_experts / num_groups
  int32_t topk_groups = 1;  // only experts of the best topk_groups groups are eligible
  GroupScore group_score = GroupScore::kMax;
  const Tensor* correction_bias = nullptr;  // [E] f32, added to scores for selection only (V3)
  bool renormalize = false;  // divide the top-k weights by their sum (+ renorm_eps)
  float renorm_eps = 0.0f;
  float scaling = 1.0f;      // routed_scaling_factor, applied after renormalisation
};

// A softmax router with no bias and no group limit (Qwen3-MoE, DeepSeek-V2-Lite) selects on the
// logits (softmax is monotonic): ids = the k largest logits, the lower id first on ties. Weights,
// exps and sums in double, then · scaling:
//   renormalised (Qwen3-MoE): w_j = exp(l_j - max) / Σ_s exp(l_s - max), the sum over the k slots
//     in slot order (the denominator over all E cancels; renorm_eps <= 1e-12 is below a float's
//     resolution of the top-k sum, which is >= k / E);
//   not renormalised (V2-Lite): w_j = exp(l_j - max) / moe_softmax_denominator(l).
// The general formula's values up to rounding, with no per-expert division and no selection
// waiting for the softmax. The CUDA router kernels take the answer as MoeRouteParams::on_logits
// (kernels/moe.h). DEEPINFER_MOE_ROUTE_ON_LOGITS=0 (read once) turns it off on every backend
// (the A/B against the general formula).
bool moe_route_on_logits(const MoeRoutingParams& p);

// Σ_i exp(l_i - mx) over e logits in double, in the order every backend uses (the CUDA router's
// warp reduction): "lane" j < 32 sums exp(l_{j + 32 s} - mx) for s ascending; then five butterfly
// rounds, for o = 16, 8, 4, 2, 1: v_j = v_j + v_{j xor o}; the result is v_0 (every v_j is equal).
// The exps are std::exp here and CUDA's exp on the GPU (the same value except for rare last-bit
// differences).
double moe_softmax_denominator(const float* l, int64_t e, float mx);

// One linear layer with its elementwise neighbours (Backend::fused_linear; the decode path of
// issue #5 runs it as one kernel for a few rows):
//   a = x                          (kNone)
//       rms_norm(x, norm_w, eps)   (kRmsNorm: x is the residual stream [M, K])
//       silu(gate) * up            (kSiluMul: x = [gate | up], [M, 2K], as silu_mul)
//   r = a · wᵀ (+ bias)                         w [N, K]
//   y = r                          (when y is given; [M, N], compute dtype or f32)
//   residual += r                  (when residual is given; [M, N] compute dtype; no alias of x)
//   silu_out: y = silu(r[:, :N/2]) * r[:, N/2:] instead (as silu_mul on r: the gate / up
//     projection with its activation; y [M, N/2] compute dtype, no residual)
struct FusedLinearParams {
  enum class In { kNone, kRmsNorm, kSiluMul };
  In in = In::kNone;
  bool silu_out = false;
  const Tensor* x = nullptr;
  const Tensor* norm_w = nullptr;  // [K] (kRmsNorm)
  float eps = 1e-6f;
  const Tensor* w = nullptr;
  const Tensor* bias = nullptr;    // [N] or null
  Tensor* y = nullptr;
  Tensor* residual = nullptr;
};

// Stacked expert weights. gate_up[e] = [gate_proj; up_proj] of expert e.
struct ExpertWeights {
  Tensor gate_up;  // [E, 2 * I, H]
  Tensor down;     // [E, H, I]
};

// The router of a MoE block with the block's pre-norm (Backend::moe_norm_route):
//   h       = rms_norm(x) · norm_w                 (as rms_norm; the experts read it)
//   logits  = h · gateᵀ                            f32 [T, E]
//   ids, weights = moe_route(logits, routing)
struct MoeNormRouteParams {
  const Tensor* x = nullptr;       // [T, H] the residual stream
  const Tensor* norm_w = nullptr;  // [H] post_attention_layernorm
  float eps = 1e-6f;
  const Tensor* gate = nullptr;  // [E, H] router weight
  MoeRoutingParams routing;
  Tensor* h = nullptr;             // [T, H] compute dtype
  Tensor* topk_ids = nullptr;      // [T, k] i32
  Tensor* topk_weights = nullptr;  // [T, k] f32
  Tensor* logits = nullptr;        // [T, E] f32, optional (tests): the router logits
};

// A MoE block's output added to the residual stream (Backend::moe_residual):
//   residual += Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])  (as moe_experts)
//               + shared(x[t])          (optional SwiGLU MLP, as Mlp: gate_up silu·mul, down)
// Composed, each term rounds to the compute dtype as the separate ops do (moe_experts, the
// shared MLP, add, add); a fused implementation may sum the routed and shared experts in f32
// and round once.
struct MoeResidualParams {
  const Tensor* x = nullptr;  // [T, H] rms_norm(residual) · norm_w
  const Tensor* topk_ids = nullptr;
  const Tensor* topk_weights = nullptr;
  const ExpertWeights* experts = nullptr;
  const Tensor* shared_gate_up = nullptr;  // [2·Is, H] or null
  const Tensor* shared_down = nullptr;     // [H, Is]
  Tensor* residual = nullptr;              // [T, H] compute dtype
  // Optional: the norm that made x (x == rms_norm(residual) · norm_w, eps), so a backend may
  // recompute x from the residual itself (CUDA: the shared expert starts before the router ends).
  // The residual must be unchanged since x was computed (MoeBlock: moe_norm_route only reads it).
  const Tensor* norm_w = nullptr;  // [H]
  float eps = 0.0f;
};

// One decode step (one new token per sequence) for n <= bucket sequences, host side: what a
// captured step graph (Backend::make_decode_graph) needs to replay it.
struct DecodeStepInputs {
  std::vector<int32_t> token_ids;   // [n] the token each sequence feeds
  std::vector<int32_t> positions;   // [n] its position
  std::vector<int32_t> slots;       // [n] block_id * block_size + offset of its KV
  std::vector<std::vector<int32_t>> block_tables;  // [n] block ids covering [0, position]
  int32_t block_size = 0;
};

// One row of Backend::sample_on_device: the part of sampling::SamplingParams a device sampler
// draws with (penalties need the token history and stay on the host, as do log-probabilities).
struct DeviceSampleRow {
  float temperature = 1.0f;  // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = -1;        // <= 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  int64_t position = 0;  // index of the token being sampled in its sequence
};

// forward(token_ids [T] i32, batch, logit_rows [R] i32) -> logits [R, vocab] f32 on the device.
using DecodeForward = std::function<Tensor(const Tensor&, const PagedBatch&, const Tensor&)>;

// A decode step captured once for `bucket()` sequences and replayed with new metadata (CUDA
// graphs: one launch instead of hundreds of kernel launches per step).
class DecodeStepGraph {
 public:
  virtual ~DecodeStepGraph() = default;
  virtual int32_t bucket() const = 0;
  virtual int32_t max_blocks_per_seq() const = 0;
  // Logits [bucket, vocab] f32 on the device; rows >= n are padding. Valid until the next run.
  virtual const Tensor& run(const DecodeStepInputs& in) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  // The dtype activations and the KV cache use on this backend (f32 on the CPU).
  virtual DType compute_dtype() const = 0;
  // Whether linear() takes a DeepSeek block-scaled FP8 weight [n, k] (fp8_e4m3 with 128x128
  // f32 block_scales(), see tensor.h) as-is. The WeightLoader asks this per linear weight and
  // dequantizes when the answer is no (always on the CPU backend, the reference).
  virtual bool supports_fp8_block_linear(int64_t n, int64_t k) const {
    (void)n;
    (void)k;
    return false;
  }
  // Bytes this backend can still allocate: the device's free memory, or the host's
  // MemAvailable on the CPU; -1 when unknown. load_model checks a checkpoint against it before
  // it loads anything.
  virtual int64_t available_memory_bytes() const { return -1; }

  virtual Tensor empty(const Shape& shape, DType dtype) = 0;
  virtual Tensor zeros(const Shape& shape, DType dtype) = 0;
  // Copies a host tensor to the device, converting to `dtype` (weights, metadata).
  virtual Tensor upload(const Tensor& host, DType dtype) = 0;
  // Copies a device tensor to a host f32 (or i32) tensor.
  virtual Tensor download(const Tensor& t) = 0;
  virtual void synchronize() = 0;

  // out[t] = table[ids[t]]                           ids [T] i32, table [V, H], out [T, H]
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // y = x · wᵀ (+ bias)                              x [M, K], w [N, K], y [M, N]
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;
  // y = x / rms(x) * w over the last dim            x, y [..., D], w [D]; may alias
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  // residual += x; y = rms_norm(residual)           the fused pre-norm of the next block
  virtual void add_rms_norm(const Tensor& x, Tensor& residual, const Tensor& w, float eps,
                            Tensor& y) = 0;
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;  // may alias
  // out = silu(gate) * up, with gate_up = [gate | up] along the last dim.   [T, 2I] -> [T, I]
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  // Rotary embedding in place on x [T, heads, row] for dims [rot_begin, rot_begin + rot_dim) of
  // each head row. cos_sin [max_pos, rot_dim]: cos of the rot_dim/2 frequencies, then sin.
  // interleaved: pairs (2i, 2i+1) rotate by frequency i (DeepSeek); else pairs (i, i + rot_dim/2).
  virtual void rope(Tensor& x, int32_t rot_begin, int32_t rot_dim, const Tensor& positions,
                    const Tensor& cos_sin, bool interleaved) = 0;
  // Copies columns [col_begin, col_begin + w) of each row of src [R, C] into dst (R·w values, any shape).
  virtual void copy_columns(const Tensor& src, int32_t col_begin, Tensor& dst) = 0;
  // Writes src (R·w values, any shape) into columns [col_begin, col_begin + w) of dst [R, C].
  virtual void write_columns(const Tensor& src, Tensor& dst, int32_t col_begin) = 0;
  // Writes src [T, width] into the pool entries of the batch's new tokens, at `entry_offset`
  // elements into each entry of layer `layer`.
  virtual void store_kv(const Tensor& src, Tensor& pool, const KvLayout& layout, int32_t layer,
                        int32_t entry_offset, const PagedBatch& batch) = 0;
  // Copies whole blocks (every layer: block_stride() elements each) within the pool, in order:
  // block src_dst[i].second becomes a copy of block src_dst[i].first (copy-on-write for n > 1).
  virtual void copy_blocks(Tensor& pool, const KvLayout& layout,
                           std::span<const std::pair<int32_t, int32_t>> src_dst) = 0;
  virtual void paged_attention(const PagedAttentionParams& p) = 0;
  // QkvRopeStoreParams above. The reference is qkv_rope_store_composed (copy_columns, rms_norm,
  // rope, store_kv: the CPU backend's implementation; any backend may use it); CUDA fuses it.
  virtual void qkv_rope_store(const QkvRopeStoreParams& p) = 0;
  // The attention of a GQA layer from its QKV GEMM output: exactly qkv_rope_store(store), then
  // paged_attention(attn) (the reference, qkv_rope_attention_composed: the CPU backend's
  // implementation). attn reads the query store writes: attn.q is store.q_out, and both name the
  // same pool, layer and batch. Afterwards the pool holds the new K/V exactly as qkv_rope_store
  // writes them and *attn.out the attention output; *store.q_out is scratch that a fused
  // implementation may leave unwritten (callers must not read it). A fused implementation may
  // assume, as the engine guarantees, that each new token's slot is the pool slot of its position
  // in its sequence. Every backend composes it today: the two fused CUDA kernels measured for it
  // were slower and were removed in run 46 (docs/cuda_backend.md "Fused decode attention").
  virtual void qkv_rope_attention(const QkvRopeStoreParams& store,
                                  const PagedAttentionParams& attn) = 0;
  // FusedLinearParams above. The reference is fused_linear_composed (rms_norm / silu_mul,
  // linear, add: the CPU backend's implementation); CUDA fuses small batches into one kernel.
  virtual void fused_linear(const FusedLinearParams& p) = 0;
  // MlaRopeStoreParams above. The reference is mla_rope_store_composed (copy_columns, rms_norm,
  // rope, store_kv: the CPU backend's implementation; any backend may use it); CUDA fuses it.
  virtual void mla_rope_store(const MlaRopeStoreParams& p) = 0;
  // y[t, h] = w[h] · x[t, h]                        x [T, Hd, K], w [Hd, N, K], y [T, Hd, N]
  virtual void head_linear(const Tensor& x, const Tensor& w, Tensor& y) = 0;
  // Router: logits [T, E] f32 -> topk_ids [T, k] i32 and topk_weights [T, k] f32.
  virtual void moe_route(const Tensor& logits, const MoeRoutingParams& p, Tensor& topk_ids,
                         Tensor& topk_weights) = 0;
  // out[t] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])      x, out [T, H]
  // Entries with a negative id are skipped (padding, or an expert another EP rank computes:
  // parallel/cuda/ep_moe_latency.h); a token with none gets out[t] = 0. Ids >= E are errors.
  virtual void moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const ExpertWeights& w, Tensor& out) = 0;
  // MoeNormRouteParams above. The reference is moe_norm_route_composed (rms_norm, linear,
  // moe_route: the CPU backend's implementation); CUDA runs a few decode tokens as one kernel.
  virtual void moe_norm_route(const MoeNormRouteParams& p) = 0;
  // MoeResidualParams above. The reference is moe_residual_composed (moe_experts, the shared
  // MLP's two linear layers, two adds: the CPU backend's implementation); CUDA runs one decode
  // token as two kernels.
  virtual void moe_residual(const MoeResidualParams& p) = 0;

  // ---- EPLB (issue #8; docs/expert_parallelism.md "EPLB in the engine") ----
  // The defaults throw; the CPU and CUDA backends override them. They are defined inline so that
  // Backend keeps no key function (its vtable and typeinfo stay in every user, as before).
  // counts[e] += entries of topk_ids equal to e; negative ids (padding) are skipped.
  //                                                  topk_ids [T, k] i32, counts [E] i32
  virtual void moe_count_experts(const Tensor& /*topk_ids*/, Tensor& /*counts*/) {
    DI_FAIL("backend '{}' does not implement moe_count_experts", name());
  }
  // Logical -> physical expert ids: for e = topk_ids[t, j] with n = replica_indptr[e + 1] -
  // replica_indptr[e] replicas, phys_ids[t, j] = replica_slots[replica_indptr[e] + t % n].
  // topk_ids, phys_ids [T, k] i32 (distinct tensors); replica_indptr [E + 1] i32; replica_slots
  // [S] i32 (the first replica_indptr[E] entries are used).
  virtual void moe_map_replicas(const Tensor& /*topk_ids*/, const Tensor& /*replica_indptr*/,
                                const Tensor& /*replica_slots*/, Tensor& /*phys_ids*/) {
    DI_FAIL("backend '{}' does not implement moe_map_replicas", name());
  }
  // Raw copy of `rows` rows (along dim 0) from src starting at src_row to dst starting at
  // dst_row, in stream order. Same dtype and row size; src and dst ranges must not overlap.
  virtual void copy_rows(const Tensor& /*src*/, int64_t /*src_row*/, Tensor& /*dst*/,
                         int64_t /*dst_row*/, int64_t /*rows*/) {
    DI_FAIL("backend '{}' does not implement copy_rows", name());
  }

  // Fills `t` (the compute dtype, on this backend) with uniform(-scale, scale) values from a
  // counter hash of `seed`: random weights for benchmarks (`serve --random-weights`). false where
  // the backend has no such fill; the caller then generates the values on the host.
  virtual bool fill_uniform(Tensor& /*t*/, uint64_t /*seed*/, float /*scale*/) { return false; }

  // ---- sampling on the device ----
  // Whether sample_on_device() is implemented (false on the CPU, where the logits are on the
  // host already and sampling::sample_batch is the sampler).
  virtual bool can_sample_on_device() const { return false; }
  // One token per row of `logits` ([rows.size(), vocab] f32 on this backend's device), drawn
  // as sampling::sample() draws it for the same temperature / top-k / top-p / min-p, seed and
  // position and no penalties: the same logits give the same token. -1 for a row whose logits
  // are all -inf/NaN (where sample() throws). Blocks until the tokens are on the host.
  virtual std::vector<int32_t> sample_on_device(const Tensor& /*logits*/,
                                                std::span<const DeviceSampleRow> /*rows*/) {
    DI_FAIL("backend '{}' does not sample on the device", name());
  }

  // ---- decode step graphs ----
  // Captures one decode step of `forward` for up to `bucket` sequences of at most
  // `max_blocks_per_seq` KV blocks each. nullptr where the backend has no such thing (CPU): the
  // caller runs the forward itself. Throws when the forward cannot be captured.
  virtual std::unique_ptr<DecodeStepGraph> make_decode_graph(DecodeForward /*forward*/,
                                                             int32_t /*bucket*/,
                                                             int32_t /*max_blocks_per_seq*/,
                                                             int32_t /*block_size*/) {
    return nullptr;
  }
};

// Backend::qkv_rope_store as the composition of the backend's existing ops (the reference).
void qkv_rope_store_composed(Backend& be, const QkvRopeStoreParams& p);
// Backend::qkv_rope_attention as qkv_rope_store then paged_attention on `be` (the reference).
void qkv_rope_attention_composed(Backend& be, const QkvRopeStoreParams& store,
                                 const PagedAttentionParams& attn);
// Backend::fused_linear as the composition of the backend's existing ops (the reference).
void fused_linear_composed(Backend& be, const FusedLinearParams& p);
// Backend::mla_rope_store as the composition of the backend's existing ops (the reference).
void mla_rope_store_composed(Backend& be, const MlaRopeStoreParams& p);
// Backend::paged_attention with head_w: attention into p.out, then head_linear into p.head_out.
void paged_attention_head_composed(Backend& be, const PagedAttentionParams& p);
void moe_norm_route_composed(Backend& be, const MoeNormRouteParams& p);
void moe_residual_composed(Backend& be, const MoeResidualParams& p);

std::unique_ptr<Backend> make_cpu_backend();
// "cpu", "cuda" (bf16) or "cuda-fp32" (the fp32 verification mode: f32 activations, weights and
// KV, true-fp32 GEMMs; when built with CUDA); throws with the list of available backends otherwise.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace di
