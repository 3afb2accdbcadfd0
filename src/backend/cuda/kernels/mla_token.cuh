#pragma once
// The context of one new token of an MLA decode batch, shared by the per-token MLA kernels
// (mla_decode_cluster.cu, mla_decode_wide.cu). Device-only.
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/mla_decode.h"

namespace di::cuda {

// The sequence owning token t: the number of s in [1, num_seqs] with qo_indptr[s] <= t (empty
// sequences included), counted by the whole block (every thread must call it).
__device__ inline int mla_find_sequence(const int32_t* qo_indptr, int num_seqs, int t) {
  int count = 0;
  for (int base = 1; base <= num_seqs; base += static_cast<int>(blockDim.x)) {
    const int i = base + static_cast<int>(threadIdx.x);
    count += __syncthreads_count(i <= num_seqs && qo_indptr[i] <= t);
  }
  return count;
}

struct MlaTokenContext {
  int kv_first;  // the sequence's first entry in kv_indices
  int n_kv;      // cache entries token t attends ([0, n_kv); 0: a padding token)
  int old_end;   // entries before it were stored by earlier steps (the rest by this one's store)
};

// Decode batches: sequence t owns token t (checked, with every thread reading the same words, so
// the branch is uniform); otherwise a block-wide count over qo_indptr.
__device__ inline MlaTokenContext mla_token_context(const MlaDecodeCall& p, int t) {
  const int guess = min(t, p.num_seqs - 1);
  const int q_lo = p.qo_indptr[guess], q_hi = p.qo_indptr[guess + 1];
  int kv_first = p.kv_indptr[guess], kv_next = p.kv_indptr[guess + 1];
  int last_len = p.kv_last_len[guess], qlen = q_hi - q_lo;
  const int pos_in = p.positions[t];
  if (!(q_lo <= t && t < q_hi)) {
    const int s = mla_find_sequence(p.qo_indptr, p.num_seqs, t);
    kv_first = p.kv_indptr[s];
    kv_next = p.kv_indptr[s + 1];
    last_len = p.kv_last_len[s];
    qlen = p.qo_indptr[s + 1] - p.qo_indptr[s];
  }
  const int nblocks = kv_next - kv_first;
  const int kv_len = nblocks > 0 ? (nblocks - 1) * p.block_size + last_len : 0;
  MlaTokenContext c;
  c.kv_first = kv_first;
  c.n_kv = max(0, min(pos_in, kv_len - 1) + 1);
  c.old_end = kv_len - qlen;
  return c;
}

}  // namespace di::cuda
