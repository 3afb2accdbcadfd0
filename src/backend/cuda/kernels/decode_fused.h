#pragma once
// Fused kernels of the decode path (issue #5) and the fp32-mode kernels that have no bf16 twin
// elsewhere. One POD params struct per kernel; element type bf16 or f32 (`f32`). Host-includable.
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

// The GQA attention prologue in one launch (Backend::qkv_rope_store): for every token t and head
// row of the fused QKV GEMM output qkv[t] = [q heads | k heads | v heads] (head_dim each):
//   q heads: [q_norm RMSNorm] -> rope -> q_out[t, h, :]
//   k heads: [k_norm RMSNorm] -> rope -> pool entry of slot_mapping[t], layer, K part (head g)
//   v heads: copied              -> pool entry, V part (offset num_kv_heads * head_dim)
// Each step rounds to the element type like the unfused ops (rms_norm, rope, store_kv) do.
// Rope: non-interleaved pairs (i, i + head_dim/2) over the whole head; positions outside
// [0, max_pos) are left unrotated. Slots < 0 or in blocks >= num_blocks are not stored.
// One CTA of 128 threads per (token, head row); head_dim <= kMaxFusedHeadDim.
inline constexpr int kMaxFusedHeadDim = 512;
struct QkvRopeStoreKernelParams {
  const void* qkv;             // [tokens, (num_q_heads + 2 * num_kv_heads) * head_dim]
  void* q_out;                 // [tokens, num_q_heads, head_dim]
  void* pool;                  // KvLayout order
  const void* q_norm;          // [head_dim] or null
  const void* k_norm;          // [head_dim] or null
  const void* cos_sin;         // [max_pos, head_dim]: cos of head_dim/2 freqs then sin
  bool cos_sin_f32;
  int32_t max_pos;
  const int32_t* positions;    // [tokens]
  const int32_t* slot_mapping; // [tokens]
  int64_t tokens;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;            // even, <= kMaxFusedHeadDim
  float eps;
  int32_t block_size;
  int32_t entry_size;
  int64_t block_stride;
  int64_t layer_offset;
  int64_t num_blocks;
  bool f32;                    // element type of qkv, q_out, pool, norms
};
void launch_qkv_rope_store(const QkvRopeStoreKernelParams& p, cudaStream_t stream);
// One warp per head row instead of one 128-thread CTA (bf16, head dims 64 / 128 / 256; the same
// bits by construction: qkv_rope_rows.cuh, qkv_rope_row_warp; checked on the H200 in run 39).
// 1 = on (the default), 0 = the CTA per row (DEEPINFER_ROPE_STORE_WARP=0).
// qkv_rope_store_warp_launches() counts the launches that took it (tests).
void set_qkv_rope_store_warp(int on);
int qkv_rope_store_warp();
int64_t qkv_rope_store_warp_launches();

// The MLA attention prologue in one launch (Backend::mla_rope_store; DeepSeek V2/V3). Per token t,
// from the q rows (q[t * q_ld + q_col + h * (nope + rope) + i]) and the kv_a rows
// (kv_a[t * kv_ld + kv_col + i] = [latent | k_pe]), which may be parts of one fused projection:
//   block y == 0: the pool entry of slot_mapping[t]: [rms_norm(latent) * kv_a_norm | rope(k_pe)]
//   block y >= 1: q heads [(y - 1) * kMlaHeadsPerCta, + kMlaHeadsPerCta): q_nope[t, h] = the
//                 nope part, q_pe[t, h] = rope(the rope part)
// Each step rounds to the element type like the composed ops (rms_norm, rope, store_kv) do. Rope
// as RopeParams (interleaved pairs (2i, 2i+1) or (i, i + rope/2)); positions outside [0, max_pos)
// are left unrotated. Slots < 0 or in blocks >= num_blocks write no KV.
// grid (tokens, 1 + ceil(num_heads / kMlaHeadsPerCta)), 256 threads.
inline constexpr int kMlaHeadsPerCta = 8;
struct MlaRopeStoreKernelParams {
  const void* q;  // q part of row t at q + t * q_ld + q_col
  int64_t q_ld;   // elements between the rows of q
  int64_t q_col;
  const void* kv_a;  // [latent | k_pe] of row t at kv_a + t * kv_ld + kv_col
  int64_t kv_ld;
  int64_t kv_col;
  void* q_nope;           // [tokens, num_heads, nope_dim]
  void* q_pe;             // [tokens, num_heads, rope_dim]
  void* pool;             // KvLayout order; entry elements [0, latent + rope) are written
  const void* kv_a_norm;  // [latent_dim]
  const void* cos_sin;    // [max_pos, rope_dim]: cos of rope_dim/2 freqs then sin
  bool cos_sin_f32;
  int32_t max_pos;
  const int32_t* positions;     // [tokens]
  const int32_t* slot_mapping;  // [tokens]
  int64_t tokens;
  int32_t num_heads;
  int32_t nope_dim;
  int32_t rope_dim;  // even
  int32_t latent_dim;
  float eps;
  bool interleaved;
  int32_t block_size;
  int32_t entry_size;
  int64_t block_stride;
  int64_t layer_offset;
  int64_t num_blocks;
  bool f32;  // element type of q, kv_a, q_nope, q_pe, pool, kv_a_norm
};
void launch_mla_rope_store(const MlaRopeStoreKernelParams& p, cudaStream_t stream);

// mla_rope_store and the absorbed query q_lat[t, h] = W_UK,hᵀ q_nope[t, h] (head_linear.h, with
// w_uk_t [num_heads, lat, nope_dim]) in one launch: the head_linear CTAs read the nope parts from
// the q rows in place (the values mla_rope_store copies to q_nope), so the two have no order
// between them and q_lat is bitwise the head_linear op's on q_nope. grid = the rope/store CTAs
// (tokens x parts, first) + num_heads x ceil(lat / 32) CTAs of two 16-column head_linear groups;
// 256 threads. Supported (mla_rope_store_uk_supported): bf16, head_linear_small's shapes
// (tokens <= 64, nope_dim % 8, lat % 8), q rows and head strides 16-byte aligned.
bool mla_rope_store_uk_supported(const MlaRopeStoreKernelParams& p, int64_t lat);
cudaError_t launch_mla_rope_store_uk(const MlaRopeStoreKernelParams& p, const void* w_uk_t,
                                     void* q_lat, int32_t lat, cudaStream_t stream);

// fp32 mode's MoE combine: out[t, :] = sum_j topk_weights[t, j] * y[slot_row[t * top_k + j], :],
// j ascending, f32 (the bf16 version is launch_moe_combine in moe.h).
struct MoeCombineF32OutParams {
  const float* y;              // [tokens * top_k, hidden]
  const int32_t* slot_row;     // [tokens * top_k]
  const float* topk_weights;   // [tokens, top_k]
  float* out;                  // [tokens, hidden]
  int64_t tokens;
  int32_t top_k;
  int32_t hidden;
};
void launch_moe_combine_f32_out(const MoeCombineF32OutParams& p, cudaStream_t stream);

}  // namespace di::cuda
