#pragma once
// Memory-bound kernels of the dense decoder: one POD params struct per kernel, launched on the
// backend's stream. Pointers are device pointers; all tensors are row-major and contiguous unless
// a stride says otherwise. Activations, weights and the KV pool are all of one element type:
// bf16 (__nv_bfloat16) by default, f32 when `f32` is set (the fp32 verification mode,
// make_backend("cuda-fp32")); the pointers are untyped for that reason. Host-includable.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace di::cuda {

// y = x / rms(x) * w, per row; with `residual`: residual += x (rounded to bf16) first and the norm
// is taken of the new residual. x and y may alias; residual must not alias either.
struct RmsNormParams {
  const void* x;             // [rows, d]
  void* residual;            // [rows, d] or null
  const void* w;             // [d]
  void* y;                   // [rows, d]
  int64_t rows;
  int32_t d;                 // features per row
  float eps;
  bool f32;                  // element type f32 (else bf16)
};
void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

// out = a + b, elementwise over n values (any may alias).
struct AddParams {
  const void* a;  // [n]
  const void* b;  // [n]
  void* out;      // [n]
  int64_t n;
  bool f32;
};
void launch_add(const AddParams& p, cudaStream_t stream);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]
struct SiluMulParams {
  const void* gate_up;  // [rows, 2 * inter]
  void* out;            // [rows, inter]
  int64_t rows;
  int32_t inter;
  bool f32;
};
void launch_silu_mul(const SiluMulParams& p, cudaStream_t stream);

// Rotary embedding in place on dims [rot_begin, rot_begin + rot_dim) of every head row.
struct RopeParams {
  void* x;                    // [tokens, heads, row]
  const int32_t* positions;   // [tokens]
  const void* cos_sin;        // [max_pos, rot_dim]: cos of rot_dim/2 freqs then sin; f32 or bf16
  bool cos_sin_f32;           // dtype of cos_sin
  int32_t max_pos;            // rows of cos_sin; tokens beyond it are left unrotated
  int64_t tokens;
  int32_t heads;
  int32_t row;                // elements per head row
  int32_t rot_begin;
  int32_t rot_dim;            // even
  bool interleaved;           // pairs (2i, 2i+1) (DeepSeek) instead of (i, i + rot_dim/2)
  bool f32;                   // dtype of x
};
void launch_rope(const RopeParams& p, cudaStream_t stream);

// dst[r * dst_ld + dst_off + c] = src[r * src_ld + src_off + c] for r < rows, c < width.
// copy_columns / write_columns; elem_size 2 (bf16) or 4 (f32, i32).
struct Copy2dParams {
  const void* src;
  void* dst;
  int64_t rows;
  int64_t width;    // elements per row copied
  int64_t src_ld;   // elements between rows of src
  int64_t dst_ld;   // elements between rows of dst
  int64_t src_off;  // elements into each src row
  int64_t dst_off;  // elements into each dst row
  int32_t elem_size;
};
void launch_copy_2d(const Copy2dParams& p, cudaStream_t stream);

// out[t] = table[ids[t]] (embedding lookup and row gather). Ids outside [0, num_rows) give zeros.
struct GatherRowsParams {
  const void* table;     // [num_rows, width]
  const int32_t* ids;    // [tokens]
  void* out;             // [tokens, width]
  int64_t tokens;
  int64_t num_rows;
  int64_t width;         // elements per row
  int32_t elem_size;     // 2 or 4
};
void launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// pool[slot → entry of layer `layer`][entry_offset + c] = src[t, c] for every new token t.
// Pool layout (KvLayout): [num_blocks][num_layers][block_size][entry_size], bf16 or f32.
struct StoreKvParams {
  const void* src;             // [tokens, width]
  void* pool;
  const int32_t* slot_mapping; // [tokens] block_id * block_size + offset; < 0 = skip (padding)
  int64_t tokens;
  int32_t width;               // elements per token written
  int32_t block_size;          // tokens per block
  int32_t entry_size;          // elements per token and layer
  int64_t block_stride;        // elements per block (all layers)
  int64_t layer_offset;        // elements from a block's start to this layer
  int32_t entry_offset;        // elements into the entry
  int64_t num_blocks;          // slots of blocks >= num_blocks are skipped
  bool f32;                    // dtype of src and pool
};
void launch_store_kv(const StoreKvParams& p, cudaStream_t stream);

// y[m, n] += bias[n]
struct BiasAddParams {
  void* y;                     // [m, n], f32 or bf16
  bool y_f32;
  const void* bias;            // [n], f32 when bias_f32 else bf16
  int64_t m;
  int64_t n;
  bool bias_f32;
};
void launch_bias_add(const BiasAddParams& p, cudaStream_t stream);

// out[i] = bf16(uniform(-scale, scale)) from a counter hash of (seed, i): random weights for the
// benchmarks, never zeros.
struct FillRandomParams {
  __nv_bfloat16* out;
  int64_t n;
  uint64_t seed;
  float scale;
};
void launch_fill_random(const FillRandomParams& p, cudaStream_t stream);

}  // namespace di::cuda
