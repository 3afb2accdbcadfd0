#include "parallel/cuda/ep_moe_latency.h"

#include <vector>

#include "parallel/cuda/cuda_check.h"

namespace di::parallel::cuda {

EpMoeLatency::EpMoeLatency(EpTransport& transport, int32_t hidden, int32_t top_k, RowDtype dtype,
                           int32_t expert_begin, int32_t expert_end, int32_t max_rows_per_rank,
                           cudaStream_t stream, const PeerRank* peer)
    : transport_(transport),
      hidden_(hidden),
      top_k_(top_k),
      dtype_(dtype),
      expert_begin_(expert_begin),
      expert_end_(expert_end),
      max_rows_(max_rows_per_rank),
      stream_(stream),
      row_bytes_(latency_row_bytes(hidden, top_k, dtype)) {
  DI_CHECK(hidden > 0 && top_k > 0 && max_rows_per_rank > 0 && expert_begin >= 0 &&
               expert_begin <= expert_end,
           "EpMoeLatency: hidden {} top_k {} max rows {} experts [{}, {})", hidden, top_k,
           max_rows_per_rank, expert_begin, expert_end);
  const auto n = static_cast<size_t>(transport.num_ranks());
  const auto rows = static_cast<size_t>(max_rows_per_rank);
  const size_t x_row = static_cast<size_t>(hidden) * dtype_bytes(dtype);
  packed_.reserve(rows * static_cast<size_t>(row_bytes_));
  packed_all_.reserve(n * rows * static_cast<size_t>(row_bytes_));
  x_all_.reserve(n * rows * x_row);
  owned_ids_.reserve(n * rows * static_cast<size_t>(top_k) * sizeof(int32_t));
  weights_all_.reserve(n * rows * static_cast<size_t>(top_k) * sizeof(float));
  partial_.reserve(n * rows * x_row);
  returned_.reserve(n * rows * x_row);
  if (peer != nullptr) {
    DI_CHECK(peer->num_ranks == transport.num_ranks() && peer->rank == transport.rank_idx() &&
                 peer->max_rows >= max_rows_per_rank && peer->row_bytes == row_bytes_ &&
                 peer->ret_row_bytes == static_cast<int64_t>(x_row),
             "EpMoeLatency: peer exchange of rank {}/{} ({} rows, {} / {} B) for rank {}/{} ({} "
             "rows, {} / {} B)",
             peer->rank, peer->num_ranks, peer->max_rows, peer->row_bytes, peer->ret_row_bytes,
             transport.rank_idx(), transport.num_ranks(), max_rows_per_rank, row_bytes_, x_row);
    peer_ = *peer;
  }
}

void EpMoeLatency::dispatch(const void* x, const int32_t* topk_ids, const float* topk_weights,
                            int32_t num_tokens, int32_t rows_per_rank) {
  DI_CHECK(num_tokens >= 0 && num_tokens <= rows_per_rank && rows_per_rank >= 1 &&
               rows_per_rank <= max_rows_,
           "EpMoeLatency: {} tokens in {} rows per rank (at most {})", num_tokens, rows_per_rank,
           max_rows_);
  rows_ = rows_per_rank;
  if (peer_) {
    CUDA_CHECK(launch_peer_dispatch(
        PeerDispatchParams{*peer_, x, topk_ids, topk_weights, num_tokens, rows_per_rank, hidden_,
                           top_k_, dtype_, expert_begin_, expert_end_, x_all_.data(),
                           owned_ids_.as<int32_t>(), weights_all_.as<float>()},
        stream_));
    return;
  }
  CUDA_CHECK(
      launch_latency_pack(LatencyPackParams{packed_.data(), x, topk_ids, topk_weights, num_tokens,
                                            rows_per_rank, hidden_, top_k_, row_bytes_, dtype_},
                          stream_));
  transport_.all_gather(packed_.data(), packed_all_.data(), int64_t{rows_per_rank} * row_bytes_,
                        stream_);
  CUDA_CHECK(launch_latency_unpack(
      LatencyUnpackParams{x_all_.data(), owned_ids_.as<int32_t>(), weights_all_.as<float>(),
                          packed_all_.data(), num_rows(), hidden_, top_k_, row_bytes_,
                          expert_begin_, expert_end_, dtype_},
      stream_));
}

void EpMoeLatency::combine(void* out, int32_t num_tokens) {
  DI_CHECK(rows_ > 0 && num_tokens >= 0 && num_tokens <= rows_,
           "EpMoeLatency: combine of {} tokens after a dispatch of {} rows per rank", num_tokens,
           rows_);
  if (peer_) {
    CUDA_CHECK(launch_peer_combine(
        PeerCombineParams{*peer_, partial_.data(), out, num_tokens, rows_, hidden_, dtype_},
        stream_));
    return;
  }
  const int32_t n = transport_.num_ranks();
  std::vector<int32_t> indptr(static_cast<size_t>(n) + 1);
  for (int32_t q = 0; q <= n; ++q) indptr[static_cast<size_t>(q)] = q * rows_;
  const AllToAllRows op{partial_.data(), indptr, returned_.data(), indptr,
                        static_cast<int64_t>(hidden_) * static_cast<int64_t>(dtype_bytes(dtype_))};
  transport_.all_to_all(std::span<const AllToAllRows>(&op, 1), stream_);
  CUDA_CHECK(launch_rank_sum(
      RankSumParams{out, returned_.data(), num_tokens, rows_, n, hidden_, dtype_}, stream_));
}

int64_t EpMoeLatency::dispatch_bytes() const {
  return int64_t{rows_} * row_bytes_ * (transport_.num_ranks() - 1);
}

int64_t EpMoeLatency::combine_bytes() const {
  return int64_t{rows_} * hidden_ * static_cast<int64_t>(dtype_bytes(dtype_)) *
         (transport_.num_ranks() - 1);
}

}  // namespace di::parallel::cuda
