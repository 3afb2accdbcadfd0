// The fused GQA decode attention (see qkv_rope_attention.h).
//
// Napkin math, Llama-3.1-8B decode, batch 1, 512-token context, per layer: K/V read 512 x 8 x
// 128 x 2 x 2 B = 2 MB (0.5 us at 4.3 TB/s); the unfused path is 3 kernels (qkv_rope_store 3.1
// us, gqa_decode 15.3 us, combine 3.5 us by ncu) plus two launch/drain gaps, i.e. latency, not
// bytes. Fused: one kernel; the prologue adds G + 2 head rows of loads per CTA, and the combine
// runs in the last CTA of each (sequence, kv head) instead of a second grid. Not yet measured.
#include <cstdlib>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gqa_decode.cuh"
#include "backend/cuda/kernels/qkv_rope_attention.h"
#include "backend/cuda/kernels/qkv_rope_rows.cuh"
#include "backend/cuda/kernels/split_combine.cuh"

namespace di::cuda {
namespace {

static_assert(kGqaDecodeWarps * 32 == kQkvRowThreads,
              "the prologue's norm reduction must run on qkv_rope_store_kernel's thread count");
constexpr int kThreads = kQkvRowThreads;
// combine_splits_kernel's block size: the in-kernel merge uses it too, for the same bits.
constexpr int kCombineThreads = 128;
static_assert(kThreads == kCombineThreads, "the merge must reduce over the combine's block size");

// The split whose CTA writes the new K/V of a token at `pos`: the one that reads that position.
__device__ __forceinline__ int owner_split(int32_t pos, const PagedAttentionKernelParams& a) {
  return pos < 0 ? 0 : min(pos / a.split_size, a.num_splits - 1);
}

template <int E, int G>
__global__ void __launch_bounds__(kThreads)
    qkv_rope_attention_kernel(QkvRopeAttentionKernelParams p) {
  pdl_trigger();  // the next (PDL-launched) GEMV may start loading its weights
  pdl_wait();     // launched as a PDL dependent: the qkv GEMV's output is complete only after this
  constexpr int D = 32 * E;
  __shared__ GqaDecodeShared<E, G> sh;
  __shared__ float row_s[G * D];
  __shared__ float scratch[G * 32];
  __shared__ __align__(16) bf16 q_s[G * D];
  __shared__ bool last_s;
  const QkvRopeStoreKernelParams& st = p.store;
  const PagedAttentionKernelParams& at = p.attn;
  const int split = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
  const int lane = threadIdx.x & 31;
  const int q_begin = at.qo_indptr[s], q_end = at.qo_indptr[s + 1];
  const int heads = st.num_q_heads + 2 * st.num_kv_heads;
  const bf16* qkv = static_cast<const bf16*>(st.qkv);
  const RopeCosSin cs{st.cos_sin, st.cos_sin_f32, st.max_pos};
  const bf16* q_norm = static_cast<const bf16*>(st.q_norm);
  const bf16* k_norm = static_cast<const bf16*>(st.k_norm);

  // 1. The new K/V this split reads (all branches depend only on blockIdx and the metadata).
  for (int i = q_begin; i < q_end; ++i) {
    const int32_t pos = st.positions[i], slot = st.slot_mapping[i];
    if (owner_split(pos, at) != split || slot < 0) continue;
    const int64_t block = slot / st.block_size, off = slot % st.block_size;
    if (block >= st.num_blocks) continue;
    bf16* entry = static_cast<bf16*>(st.pool) + block * st.block_stride + st.layer_offset +
                  off * st.entry_size;
    qkv_store_kv_head<bf16>(qkv + int64_t{i} * heads * D, entry, st.num_q_heads, st.num_kv_heads,
                            kvh, D, k_norm, st.eps, pos, cs, row_s, scratch);
  }
  // The K/V rows above are read back by other threads of this CTA (global writes before a
  // barrier are visible to the whole block); no other CTA reads them (the owner rule).
  __syncthreads();

  // 2. Per new token: q on chip, then the attention over this split.
  const GqaDecodeSeq seq = gqa_decode_seq(at, s);
  for (int i = q_begin; i < q_end; ++i) {
    const bf16* row = qkv + int64_t{i} * heads * D;
    qkv_rope_rows<bf16, G>(row + int64_t{kvh} * G * D, q_s, D, q_norm, st.eps, true,
                           st.positions[i], cs, row_s, scratch);
    __syncthreads();  // q_s is written by other threads (rope)
    float q[G][E];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      load_bf16_e<E>(q_s + h * D + lane * E, q[h]);
#pragma unroll
      for (int e = 0; e < E; ++e) q[h][e] *= at.scale;
    }
    gqa_decode_token<E, G>(at, split, kvh, seq, i, q, sh);  // ends with a barrier: q_s is free
  }
  if (at.num_splits == 1) return;

  // 3. Split combine by the last CTA of (sequence, kv head) to arrive.
  // NOTES: every thread fences its own partial writes before the barrier, so thread 0's atomic
  // is ordered after all of them (the threadfence-reduction pattern of the CUDA guide).
  __threadfence();
  __syncthreads();
  uint32_t* counter = p.counters + int64_t{s} * at.num_kv_heads + kvh;
  if (threadIdx.x == 0) last_s = atomicAdd(counter, 1u) == static_cast<uint32_t>(at.num_splits - 1);
  __syncthreads();
  if (!last_s) return;
  __threadfence();  // acquire side: the other splits' partials, read through L2 below
  const int64_t rows = int64_t{at.num_tokens} * at.num_q_heads;
  for (int i = q_begin; i < q_end; ++i) {
    for (int h = 0; h < G; ++h) {
      const int64_t row = int64_t{i} * at.num_q_heads + kvh * G + h;
      for (int d0 = 0; d0 < D; d0 += kCombineThreads)
        combine_split_row_dim<bf16, true>(at.partial_o, at.partial_ml, rows, at.num_splits, D, row,
                                          d0 + static_cast<int>(threadIdx.x), at.out);
    }
  }
  // Every CTA of this (sequence, kv head) has counted; nothing else touches the counter before
  // the kernel ends, so a plain store readies it for the next launch (and graph replay).
  if (threadIdx.x == 0) *counter = 0;
}

template <int E, int G>
cudaError_t launch_eg(const QkvRopeAttentionKernelParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.attn.num_splits),
                  static_cast<unsigned>(p.attn.num_kv_heads), static_cast<unsigned>(p.attn.num_seqs));
  return launch_pdl(qkv_rope_attention_kernel<E, G>, grid, dim3(kThreads), 0, stream, p);
}

template <int E>
cudaError_t launch_e(const QkvRopeAttentionKernelParams& p, cudaStream_t stream) {
  switch (p.attn.num_q_heads / p.attn.num_kv_heads) {
    case 1:
      return launch_eg<E, 1>(p, stream);
    case 2:
      return launch_eg<E, 2>(p, stream);
    case 4:
      return launch_eg<E, 4>(p, stream);
    case 8:
      return launch_eg<E, 8>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool qkv_rope_attention_supported(const QkvRopeAttentionKernelParams& p) {
  const QkvRopeStoreKernelParams& st = p.store;
  const PagedAttentionKernelParams& at = p.attn;
  if (st.f32 || p.counters == nullptr || !gqa_decode_supported(at)) return false;
  const int32_t d = st.head_dim;
  return st.num_q_heads == at.num_q_heads && st.num_kv_heads == at.num_kv_heads &&
         at.head_dim_qk == d && at.head_dim_v == d && at.k_offset == 0 &&
         at.v_offset == st.num_kv_heads * d && at.kv_head_stride == d &&
         st.entry_size == at.entry_size && st.entry_size == 2 * st.num_kv_heads * d &&
         st.block_size == at.block_size && st.block_stride == at.block_stride &&
         st.layer_offset == at.layer_offset && st.pool == static_cast<const void*>(at.pool) &&
         st.tokens == at.num_tokens && at.split_size > 0 && at.num_splits >= 1 &&
         (at.num_splits == 1 || (at.partial_o != nullptr && at.partial_ml != nullptr));
}

cudaError_t launch_qkv_rope_attention(const QkvRopeAttentionKernelParams& p, cudaStream_t stream) {
  if (p.attn.num_tokens == 0 || p.attn.num_seqs == 0) return cudaSuccess;
  switch (p.store.head_dim) {
    case 64:
      return launch_e<2>(p, stream);
    case 128:
      return launch_e<4>(p, stream);
    case 256:
      return launch_e<8>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace di::cuda
