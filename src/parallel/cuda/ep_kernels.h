#pragma once
// Device kernels of the EP exchange (ep_moe_cuda.h): one row gather used for pack, expand and
// return, the weighted combine, and a per-expert affine function standing in for the expert GEMMs
// in tests. Compiled by nvcc as C++17, so this header stays C++17 and free of core/ (C++20).
// Launchers check nothing beyond what a kernel would crash on and return the launch error; the
// C++20 caller (ep_moe_cuda.cpp) checks shapes and wraps the result in CUDA_CHECK.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace di::parallel::cuda {

// Element type of the hidden-state rows. The combine always accumulates in fp32.
enum class RowDtype : int32_t { kFloat32 = 0, kBfloat16 = 1 };

inline size_t dtype_bytes(RowDtype dtype) {
  return dtype == RowDtype::kFloat32 ? 4 : 2;
}
inline const char* dtype_name(RowDtype dtype) {
  return dtype == RowDtype::kFloat32 ? "fp32" : "bf16";
}

// dst[r] = src[src_row[r]] for r < num_rows; a pure copy of row_bytes bytes, any dtype.
struct GatherRowsParams {
  void* dst;               // [num_rows, row_bytes]
  const void* src;         // [>max(src_row) + 1, row_bytes]
  const int32_t* src_row;  // [num_rows] device
  int32_t num_rows;
  int64_t row_bytes;  // > 0
};
cudaError_t launch_gather_rows(const GatherRowsParams& params, cudaStream_t stream);

// out[t] = sum_j w[t, j] * combine_buf[entry_return_idx[t, j]], j ascending from 0.0f, each step
// one fp32 multiply and one fp32 add, both rounded (no FMA contraction), exactly as combine_rows
// in ep_exchange_ref.cpp; then one rounding to the output dtype. Entries with index -1 are skipped.
struct CombineParams {
  void* out;                        // [num_tokens, hidden] dtype
  const void* combine_buf;          // [num_entries_sent, hidden] dtype
  const int32_t* entry_return_idx;  // [num_tokens * top_k] device; combine_buf row or -1
  const float* topk_weights;        // [num_tokens * top_k] device
  int32_t num_tokens;
  int32_t top_k;
  int32_t hidden;
  RowDtype dtype;
};
cudaError_t launch_combine(const CombineParams& params, cudaStream_t stream);

// out = in * scale + shift per element (fp32 multiply, then fp32 add, each rounded; then one
// rounding to dtype). scale 1, shift 0 is the identity. Rows are independent (batch invariant).
struct AffineExpertParams {
  void* out;       // [num_rows, hidden] dtype
  const void* in;  // [num_rows, hidden] dtype
  int32_t num_rows;
  int32_t hidden;
  float scale;
  float shift;
  RowDtype dtype;
};
cudaError_t launch_affine_expert(const AffineExpertParams& params, cudaStream_t stream);

// ---- The decode (latency) exchange of ep_moe_latency.h: fixed sizes, no host sync ----------------
// A packed row carries one token: [x: hidden x dtype | topk_ids: top_k x i32 | topk_weights:
// top_k x f32], padded to a multiple of 16 bytes (latency_row_bytes).
inline int64_t latency_row_bytes(int32_t hidden, int32_t top_k, RowDtype dtype) {
  const int64_t raw = int64_t{hidden} * static_cast<int64_t>(dtype_bytes(dtype)) + int64_t{top_k} * 8;
  return (raw + 15) / 16 * 16;
}

// rows[r] = pack(x[r], ids[r], w[r]) for r < num_tokens; rows num_tokens .. rows_per_rank - 1
// are padding: x = 0, ids = -1, weights = 0.
struct LatencyPackParams {
  void* rows;                 // [rows_per_rank, row_bytes]
  const void* x;              // [num_tokens, hidden] dtype
  const int32_t* topk_ids;    // [num_tokens, top_k]
  const float* topk_weights;  // [num_tokens, top_k]
  int32_t num_tokens;
  int32_t rows_per_rank;
  int32_t hidden;
  int32_t top_k;
  int64_t row_bytes;
  RowDtype dtype;
};
cudaError_t launch_latency_pack(const LatencyPackParams& params, cudaStream_t stream);

// Unpacks every gathered row i < num_rows: x_all[i] = x part, weights_all[i] = weight part,
// owned_ids[i, j] = id when expert_begin <= id < expert_end (this rank computes it), else -1.
struct LatencyUnpackParams {
  void* x_all;          // [num_rows, hidden] dtype
  int32_t* owned_ids;   // [num_rows, top_k]
  float* weights_all;   // [num_rows, top_k]
  const void* rows;     // [num_rows, row_bytes]
  int32_t num_rows;
  int32_t hidden;
  int32_t top_k;
  int64_t row_bytes;
  int32_t expert_begin;
  int32_t expert_end;
  RowDtype dtype;
};
cudaError_t launch_latency_unpack(const LatencyUnpackParams& params, cudaStream_t stream);

// out[t] = sum over r = 0 .. num_ranks - 1 of partials[r * rows_per_rank + t], for t < num_tokens:
// fp32 adds (rounded, rank order, starting from rank 0's value), one rounding to dtype. One rank:
// an exact copy.
struct RankSumParams {
  void* out;             // [num_tokens, hidden] dtype
  const void* partials;  // [num_ranks * rows_per_rank, hidden] dtype
  int32_t num_tokens;
  int32_t rows_per_rank;
  int32_t num_ranks;
  int32_t hidden;
  RowDtype dtype;
};
cudaError_t launch_rank_sum(const RankSumParams& params, cudaStream_t stream);

}  // namespace di::parallel::cuda
