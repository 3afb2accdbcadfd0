#pragma once
// Absorbed MLA decode for batches, built for bandwidth (issue #6). The cluster kernel
// (mla_decode_cluster.h) is built for one sequence's latency: 32-entry splits merged over
// clusters of 8 CTAs. At 32+ decode tokens that costs more than it saves: every 32 entries pay
// four barriers and a cluster merge, clusters of 8 CTAs schedule in groups (30 at a time on an
// H200), and a context one entry past a multiple of 8 x split pulls in a whole extra cluster.
// Measured (ncu, V2-Lite batch 32, ctx 2048): 87.6 us per layer for 75 MB of latent, 0.39
// issued instructions per cycle per scheduler; this kernel 44.9 us (docs/cuda_backend.md).
//
// Work: one CTA per (token, head tile of 16 heads, KV split of `split_size` entries); grid
// (num_tokens, head_tiles, num_splits), so every token's first split is dispatched before any
// second one (the short last splits of a context run last, not in the first wave). A CTA of
// `warps` warps (4: 32-entry stages, two CTAs per SM; 8: 64-entry stages, one CTA per SM)
//   1. finds its sequence, fetches its query rows and the split's latent entries into shared
//      memory with cp.async, two stage buffers (the next stage lands while this one computes);
//   2. S = Q·Kᵀ per warp for 16 keys over half of the latent (the half's query fragments held in
//      registers; ldmatrix + mma.sync m16n8k16), the halves added through shared memory, row
//      maxima across the key groups through shared memory, P = 2^(S - max) -> bf16 in shared
//      memory, O += P·V with warp w owning V columns [16 (w + warps j), +16);
//   3. one split: writes O / sum. Several: writes its partial (O, max, sum) in f32; the last CTA
//      of the (token, head tile) to arrive (atomic counter, reset to 0 by that CTA) merges the
//      partials in split order.
// A token's bits depend on its context, position and split_size; split_size comes from the
// plan (batch size and the longest context), so this kernel is not batch invariant:
// DEEPINFER_BATCH_INVARIANT=1 keeps the cluster kernel (CudaBackend::paged_attention).
//
// Launched as a PDL dependent: before griddepcontrol.wait it reads only the metadata, block ids
// and the cache entries of earlier steps, and writes nothing.
//
// Limits (mla_wide_decode_supported): one latent head, K = V = the entry start, dqk % 8 == 0 and
// <= 576, dv % 16 == 0 and <= min(512, dqk), entry_size % 8 == 0 and >= dqk, 16-byte aligned
// q / q_rope / pool.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/mla_decode.h"

namespace di::cuda {

struct MlaWideDecodeParams : MlaDecodeCall {
  int32_t warps;       // 4 or 8 (kernel instantiation)
  int32_t head_tiles;  // grid.y = ceil(num_heads / 16)
  int32_t split_size;  // cache entries per CTA, a multiple of the stage (8 · warps)
  int32_t num_splits;  // grid.z: splits of the longest context
  // num_splits > 1 only: [num_splits][num_tokens * num_heads][dv] and [...][2] (max in base 2, sum)
  float* partial_o;
  float* partial_ml;
  uint32_t* counters;  // [num_tokens * head_tiles], all 0 between launches (each leaves them 0)
};

struct MlaWideDecodePlan {
  int32_t warps = 8;
  int32_t head_tiles = 1;
  int32_t split_size = 64;
  int32_t num_splits = 1;
  int64_t num_counters = 0;
  size_t partial_bytes = 0;  // partial_o + partial_ml (0 with one split)
  size_t smem_bytes = 0;
};

bool mla_wide_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset,
                               int32_t dqk, int32_t dv, int32_t entry_size);
// Decode tokens from which CudaBackend uses this kernel (DEEPINFER_MLA_WIDE_MIN_TOKENS, read
// once; default 16).
int32_t mla_wide_min_tokens();
// warps: DEEPINFER_MLA_WIDE_WARPS (4 | 8, read once), else 8 below 128 decode tokens and 4 from
// 128 (measured per batch size, mla_decode_wide.cu). split_size: the fewest
// stages per CTA that keep the CTAs of the longest context within one wave of the SMs
// (DEEPINFER_MLA_WIDE_SPLIT, a multiple of the stage, overrides).
// Tests: warps (4 | 8) and split size for the next plans; 0 leaves the env / the default.
void set_mla_wide_overrides(int32_t warps, int32_t split);
MlaWideDecodePlan plan_mla_wide_decode(int32_t num_tokens, int32_t max_kv_len, int32_t num_heads,
                                       int32_t dqk, int32_t dv, int32_t num_sms);
cudaError_t launch_mla_wide_decode(const MlaWideDecodeParams& p, cudaStream_t stream);

}  // namespace di::cuda
