#pragma once
// Absorbed MLA decode for small batches, built for latency (issue #6): the splits of a token's
// context are merged inside the kernel, over thread-block clusters, so one launch does what the
// tile kernel (mla_decode.h) does in three (tile prefix, attention, combine).
//
// Work: one CTA per (KV split of `split_size` cache entries, head tile of 16 or 32 heads, new
// token). Grid (8 · num_clusters, head_tiles, num_tokens), clusters of kMlaCluster = 8 CTAs along
// the splits. A CTA
//   1. finds its sequence (decode batches: sequence = token, checked; else a block-wide count over
//      qo_indptr), fetches the block ids of its split, then the split's latent entries and its
//      query rows into shared memory with cp.async (stages of 32 entries: one at the default
//      split of 32, two buffers in flight for longer splits);
//   2. S = Q·Kᵀ and O += P·V on mma.sync m16n8k16 (bf16 in, fp32 out), online softmax in fp32;
//   3. merges the 8 partial states of its cluster through distributed shared memory: CTA `rank`
//      owns output columns [rank · dv / 8, (rank + 1) · dv / 8) and reads them from all 8 CTAs;
//   4. one cluster (context <= 8 splits): writes out. Several clusters: writes its columns'
//      partial (o, max, sum) to global memory; the last cluster to arrive (per token, head tile
//      and column slice: an atomic counter, reset to 0 by that CTA) merges them in cluster order.
// A token's bits depend only on its own context length, position and split size (split_size, or
// long_split_size for contexts longer than long_split_from: fixed per launch plan): padding
// CTAs contribute exact zeros and the merge order is fixed, so results are batch invariant and
// equal whether the grid was sized for this batch or a graph's longest context.
//
// Launched as a PDL dependent: before griddepcontrol.wait it reads only the metadata, block ids
// and the cache entries of earlier steps, and writes nothing (see the kernel).
// Measured (H200, V2-Lite, batch 1, ctx 2048; docs/cuda_backend.md): 15.2 us per layer against
// 28.1 us for the tile kernel's three launches.
//
// Limits (the host checks them, mla_cluster_decode_supported): one latent head, K = V = the entry
// start, dv < dqk, dqk % 8 == 0 and <= 576, dv % 8 == 0 and <= 512, entry_size % 8 == 0,
// 16-byte aligned q / q_rope / pool, num_tokens <= 65535.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels/head_linear.h"
#include "backend/cuda/kernels/mla_decode.h"

namespace di::cuda {

constexpr int32_t kMlaCluster = 8;  // CTAs per cluster (the portable maximum)

struct MlaClusterDecodeParams : MlaDecodeCall {
  // plan (plan_mla_cluster_decode)
  int32_t rows_per_tile;  // 16 or 32 (kernel instantiation): heads per CTA
  int32_t head_tiles;     // grid.y = ceil(num_heads / rows_per_tile)
  int32_t split_size;     // cache entries per CTA (>= 16) of tokens with n_kv <= long_split_from
  int32_t long_split_size;  // (>= split_size) of tokens with a longer context; the shared-memory
                            // layout is this split's
  int32_t long_split_from;  // context length (cache entries) above which long_split_size applies
  int32_t num_clusters;     // grid.x / 8: clusters of the launch's most (see the planner)
  // num_clusters > 1 only: [num_clusters][num_tokens * num_heads][dv] and
  // [num_clusters][num_tokens * num_heads][8 column slices][max, sum]
  float* partial_o;
  float* partial_ml;
  // [num_tokens * head_tiles * 8], all 0 between launches (each launch leaves them 0)
  uint32_t* counters;
  // Deferred merge (run 22; plan `defer`): no merge here. CTA (split s, tile, token) writes its
  // rows' unnormalised O to partial_o — defer 1: [num_splits][num_tokens * num_heads][dv];
  // defer 2 (the k-split merge, run 24): [num_tokens * num_heads][4 quarters][num_splits][dv / 4],
  // so a merge CTA's quarter of a row is one contiguous block — and (max, sum) to partial_ml
  // [num_splits][num_tokens * num_heads][2] (max -inf: no entries); the grid's splits past the
  // token's own write nothing, and the consumer (mla_merge_uv below) merges the token's own in
  // split order. Launched without clusters; grid.x = num_splits.
  int32_t defer = 0;
  int32_t num_splits = 0;
  // Phase timing (benchmarks; null = off): per CTA (linear index over the grid) kMlaTimingSlots
  // words: [0] %globaltimer at the start, [1] at the end (ns), [2 + i] clock64 cycles from the
  // start to phase mark i (MlaTimingMark); 0 where a CTA did not pass the mark.
  unsigned long long* timing = nullptr;
  // This kernel lets its PDL dependent (the merge, which launches o_proj) start after its own
  // wait when set, else at its start (run 42; set by its launcher: on unless
  // DEEPINFER_ATTN_LATE_TRIGGER=0).
  int32_t late_trigger = 0;
};
constexpr int kMlaTimingSlots = 12;
// The marks, in kernel order: the pre-wait reads issued, griddepcontrol.wait returned, stage 0's
// data (entries and query) in shared memory, stage 0's scores and its softmax done, the stages
// done, the cluster barrier passed, the cluster merge written, the last-cluster vote known, the
// end (padding clusters: only the end).
enum MlaTimingMark {
  kMlaPreWait,
  kMlaWaited,
  kMlaStage0,
  kMlaScores0,
  kMlaSoftmax0,
  kMlaStages,
  kMlaCluster1,
  kMlaMerged,
  kMlaVoted,
  kMlaEnd,
  kMlaMarks
};

struct MlaClusterDecodePlan {
  int32_t rows_per_tile = 16;
  int32_t head_tiles = 1;
  int32_t split_size = 32;
  int32_t long_split_size = 32;
  int32_t long_split_from = 0x7fffffff;
  int32_t num_clusters = 1;
  int64_t num_counters = 0;
  size_t partial_bytes = 0;  // partial_o + partial_ml (0 with one cluster, unless deferred)
  bool defer = false;        // the deferred merge (MlaClusterDecodeParams::defer)
  int32_t num_splits = 0;    // deferred: grid.x, the partials per row
  size_t smem_bytes = 0;
};

bool mla_cluster_decode_supported(int32_t num_kv_heads, int32_t k_offset, int32_t v_offset,
                                  int32_t dqk, int32_t dv, int32_t entry_size, int32_t num_tokens);
// Split size: DEEPINFER_MLA_CLUSTER_SPLIT (>= 16, read once) if set, else below 32 decode tokens
// 32 (64 for a token whose context is longer than 1024 entries: long_split_size; by the token's
// own context, so its bits do not depend on its batch), 128 from 32 tokens on and 256 from 128
// on (mla_cluster_batch_split: a sequence's bits then depend on whether its batch has 32 tokens;
// DEEPINFER_BATCH_INVARIANT=1 keeps 32 for every batch and context); doubled only while the last
// cluster's merge weights would not fit in shared memory (contexts beyond ~150K tokens).
bool mla_cluster_batch_split();
void set_mla_cluster_batch_split_override(int on);  // tests: 1 / 0, -1 back to the env
// defer: the deferred merge's plan (num_splits, partial_bytes; no counters): the same splits.
MlaClusterDecodePlan plan_mla_cluster_decode(int32_t num_tokens, int32_t max_kv_len,
                                             int32_t num_heads, int32_t dqk, int32_t dv,
                                             bool defer = false);
cudaError_t launch_mla_cluster_decode(const MlaClusterDecodeParams& p, cudaStream_t stream);

// The deferred merge's consumer (runs 22-23): W_UV of the merged attention rows. By default one
// CTA per (64 W_UV columns = 4 groups of 16, head) (mla_merge_uv_wide_kernel; run 22's kernel,
// one CTA per 16 columns, stays as DEEPINFER_MLA_MERGE=v1): the groups' W_UV rows stream before
// griddepcontrol.wait, and so does the token's own split count (the cluster kernel's split rule
// on the batch metadata); then per token the CTA brings the row's own parts on chip once for all
// its groups (bulk copies into shared memory, chunks of up to 48 parts), weighs them with the max
// over all of them (M = max_s m_s, w_s = e^(m_s - M)), and x = bf16(Σ_s w_s o_s / Σ_s w_s l_s),
// which is what the cluster kernel would have written, goes through W_UV on mma.sync. Sums: O per
// part in split order (fmaf); the normaliser by thread (part s on thread s mod 128) then the warps'
// tree and the four warp sums in order — the same in every merge kernel (bitwise equal). Only a
// token's own parts are read, so the bits do not depend on the grid (a graph bucket's longer
// context) or the other tokens.
struct MlaMergeUvParams {
  MlaClusterDecodeParams attn;  // the deferred launch: metadata, split rule, partials, num_splits
  HeadLinearParams uv;          // x unused; w = W_UV [heads, n, dv]; y = [num_tokens, heads, n]
  // Phase timing (benchmarks; null = off): per CTA (linear index) kMlaMergeTimingSlots words of
  // %globaltimer (ns): the start, griddepcontrol.wait returned, then for the first token the max
  // over its parts, the normaliser, its first chunk of parts in shared memory, then the merged
  // rows in shared memory, (the k-split kernel only:) its partial W_UV sums in shared memory,
  // the cluster barrier passed, the outputs stored; the end (W_UV's outputs stored).
  unsigned long long* timing = nullptr;
  // The split merge at one token: the ranks push their sums to rank 0 before the cluster barrier
  // (one barrier instead of two; set by launch_mla_merge_uv from DEEPINFER_MLA_MERGE_PUSH).
  bool push = false;
};
constexpr int kMlaMergeTimingSlots = 10;
constexpr int32_t kMlaMergeChunk = 64;     // parts per shared-memory chunk (128 KB at dv = 512)
constexpr int32_t kMlaMergeMaxParts = 512;  // grid splits (ctx 32K at 64 entries per split)
bool mla_merge_uv_supported(int64_t tokens, int64_t heads, int64_t dv, int64_t n, int64_t parts);
int32_t mla_merge_uv_smem(int32_t tokens, int32_t dv, int32_t n, int32_t parts);
cudaError_t launch_mla_merge_uv(const MlaMergeUvParams& p, cudaStream_t stream);
// The partial layout the merge for this shape reads (MlaClusterDecodeParams::defer): 2 for the
// k-split kernel, else 1.
int32_t mla_merge_uv_defer_layout(int64_t tokens, int64_t dv, int64_t n, int64_t parts);
// The launch's grid size (CTAs).
int64_t mla_merge_uv_ctas(int64_t tokens, int64_t heads, int64_t dv, int64_t n, int64_t parts);
// The merge kernels, all bitwise equal: kV1 mla_merge_uv_kernel (16 W_UV columns per CTA);
// kWideBulk the wide kernel (4 groups of 16 columns per CTA, the row merged once per CTA; its
// parts bulk-copied into shared memory; a form loading them into registers was removed in run
// 47); kSplit the k-split
// cluster kernel (4 CTAs per head, each a quarter of the latent columns for all n outputs).
enum class MlaMergeKernel : int { kAuto = -1, kV1 = 0, kWideBulk = 2, kSplit = 3 };
// Which merge kernel (tests); kAuto: DEEPINFER_MLA_MERGE (v1 | wide | split; default:
// split from 48 parts in the grid on, else wide). Not thread-safe; outside captures.
void set_mla_merge_override(MlaMergeKernel kind);

}  // namespace di::cuda
