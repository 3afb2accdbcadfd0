#include "parallel/cuda/ep_moe_cuda.h"

#include <utility>

#include "parallel/cuda/cuda_check.h"
#include "parallel/ep_moe_plan.h"

namespace di::parallel::cuda {
namespace {

// Uploads a host int32 array into `dst` (grown as needed). Pageable source: cudaMemcpyAsync
// returns once the data is staged, so the host vector may change afterwards.
void upload(DeviceBuffer& dst, std::span<const int32_t> src, cudaStream_t stream) {
  dst.reserve(src.size_bytes());
  if (src.empty()) return;
  CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream));
}

void gather_rows(void* dst, const void* src, const DeviceBuffer& src_row, int32_t num_rows,
                 int64_t row_bytes, cudaStream_t stream) {
  CUDA_CHECK(launch_gather_rows(
      GatherRowsParams{dst, src, src_row.as<const int32_t>(), num_rows, row_bytes}, stream));
}

}  // namespace

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (data_ != nullptr) {
    // The old buffer may still be read by queued work on any stream.
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFree(data_));
    data_ = nullptr;
    capacity_ = 0;
  }
  CUDA_CHECK(cudaMalloc(&data_, bytes));
  capacity_ = bytes;
}

void all_to_all_rows(ncclComm_t comm, int32_t num_ranks, const AllToAllRows& op,
                     cudaStream_t stream) {
  DI_CHECK(op.send_indptr.size() == static_cast<size_t>(num_ranks) + 1 &&
               op.recv_indptr.size() == static_cast<size_t>(num_ranks) + 1,
           "all_to_all_rows: send_indptr has {} and recv_indptr {} entries, expected {} ranks + 1",
           op.send_indptr.size(), op.recv_indptr.size(), num_ranks);
  DI_CHECK(op.row_bytes > 0, "all_to_all_rows: row_bytes {}", op.row_bytes);
  const auto* send_bytes = static_cast<const char*>(op.send);
  auto* recv_bytes = static_cast<char*>(op.recv);
  NCCL_CHECK(ncclGroupStart());
  for (int32_t q = 0; q < num_ranks; ++q) {
    const int64_t num_send = op.send_indptr[q + 1] - op.send_indptr[q];
    const int64_t num_recv = op.recv_indptr[q + 1] - op.recv_indptr[q];
    if (num_send > 0) {
      NCCL_CHECK(ncclSend(send_bytes + op.send_indptr[q] * op.row_bytes,
                          static_cast<size_t>(num_send * op.row_bytes), ncclUint8, q, comm,
                          stream));
    }
    if (num_recv > 0) {
      NCCL_CHECK(ncclRecv(recv_bytes + op.recv_indptr[q] * op.row_bytes,
                          static_cast<size_t>(num_recv * op.row_bytes), ncclUint8, q, comm,
                          stream));
    }
  }
  NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::all_to_all(std::span<const AllToAllRows> ops, cudaStream_t stream) {
  NCCL_CHECK(ncclGroupStart());
  for (const AllToAllRows& op : ops) all_to_all_rows(comm_.get(), comm_.num_ranks(), op, stream);
  NCCL_CHECK(ncclGroupEnd());
}

void NcclTransport::all_gather(const void* send, void* recv, int64_t bytes_per_rank,
                               cudaStream_t stream) {
  DI_CHECK(bytes_per_rank >= 0, "all_gather: {} bytes", bytes_per_rank);
  if (bytes_per_rank == 0) return;
  NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(bytes_per_rank), ncclUint8, comm_.get(),
                           stream));
}

EpMoeCuda::EpMoeCuda(EpTransport& transport, int32_t hidden, int32_t top_k, RowDtype dtype,
                     cudaStream_t stream)
    : transport_(transport), hidden_(hidden), top_k_(top_k), dtype_(dtype), stream_(stream) {
  DI_CHECK(hidden > 0 && top_k > 0, "EpMoeCuda: hidden {} top_k {}", hidden, top_k);
}

EpMoeStats EpMoeCuda::forward(const ExpertPlacement& placement, const EpMoeInput& input,
                              const DeviceExpertFn& expert, void* out) {
  return forward_impl(placement, input, &expert, nullptr, out);
}

EpMoeStats EpMoeCuda::forward(const ExpertPlacement& placement, const EpMoeInput& input,
                              const GroupedExpertFn& experts, void* out) {
  return forward_impl(placement, input, nullptr, &experts, out);
}

EpMoeStats EpMoeCuda::forward_impl(const ExpertPlacement& placement, const EpMoeInput& input,
                                   const DeviceExpertFn* per_slot,
                                   const GroupedExpertFn* grouped, void* out) {
  DI_CHECK((per_slot != nullptr) != (grouped != nullptr), "EpMoeCuda: one expert callback");
  const int32_t n = transport_.num_ranks();
  const int32_t rank = transport_.rank_idx();
  const int32_t slots = placement.slots_per_rank();
  DI_CHECK(placement.num_ranks() == n, "placement has {} ranks, the EP group {}",
           placement.num_ranks(), n);
  DI_CHECK(input.num_tokens >= 0 &&
               input.topk_ids.size() == static_cast<size_t>(input.num_tokens) * top_k_,
           "topk_ids has {} entries, expected {} tokens x top_k {}", input.topk_ids.size(),
           input.num_tokens, top_k_);
  DI_CHECK(input.num_tokens == 0 ||
               (input.x != nullptr && input.topk_weights != nullptr && out != nullptr),
           "EpMoeCuda::forward: null x, topk_weights or out for {} tokens", input.num_tokens);
  const int64_t rb = row_bytes();

  // Sender: plan on the host, upload, pack one row per (token, destination rank).
  dispatch_ = plan_dispatch(placement, rank, input.topk_ids, top_k_);
  upload(send_token_idx_, dispatch_.send_token_idx, stream_);
  upload(send_local_slot_, dispatch_.send_local_slot, stream_);
  upload(entry_return_idx_, dispatch_.entry_return_idx, stream_);
  send_rows_.reserve(static_cast<size_t>(dispatch_.num_send_rows()) * rb);
  gather_rows(send_rows_.data(), input.x, send_token_idx_, dispatch_.num_send_rows(), rb, stream_);

  // All-to-all #0: how many rows each peer sends here (sizes the receive buffers).
  std::vector<int32_t> send_counts(n);
  for (int32_t q = 0; q < n; ++q) send_counts[q] = dispatch_.send_count(q);
  counts_.reserve(2 * n * sizeof(int32_t));
  int32_t* send_counts_dev = counts_.as<int32_t>();
  int32_t* recv_counts_dev = send_counts_dev + n;
  CUDA_CHECK(cudaMemcpyAsync(send_counts_dev, send_counts.data(), n * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  count_indptr_.resize(n + 1);
  for (int32_t q = 0; q <= n; ++q) count_indptr_[q] = q;
  const AllToAllRows count_op{send_counts_dev, count_indptr_, recv_counts_dev, count_indptr_,
                              sizeof(int32_t)};
  transport_.all_to_all({&count_op, 1}, stream_);
  recv_counts_host_.assign(n, 0);
  CUDA_CHECK(cudaMemcpyAsync(recv_counts_host_.data(), recv_counts_dev, n * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // sync #1
  recv_indptr_.assign(n + 1, 0);
  for (int32_t r = 0; r < n; ++r) {
    DI_CHECK(recv_counts_host_[r] >= 0, "rank {} announced {} rows", r, recv_counts_host_[r]);
    recv_indptr_[r + 1] = recv_indptr_[r] + recv_counts_host_[r];
  }
  const int32_t num_recv_rows = recv_indptr_.back();

  // All-to-all #1: the rows and, alongside, each row's top_k local-slot ids.
  recv_rows_.reserve(static_cast<size_t>(num_recv_rows) * rb);
  recv_local_slot_dev_.reserve(static_cast<size_t>(num_recv_rows) * top_k_ * sizeof(int32_t));
  const int64_t meta_bytes = static_cast<int64_t>(top_k_) * sizeof(int32_t);
  const AllToAllRows dispatch_ops[] = {
      {send_rows_.data(), dispatch_.send_indptr, recv_rows_.data(), recv_indptr_, rb},
      {send_local_slot_.data(), dispatch_.send_indptr, recv_local_slot_dev_.data(), recv_indptr_,
       meta_bytes}};
  transport_.all_to_all(dispatch_ops, stream_);
  recv_local_slot_.assign(static_cast<size_t>(num_recv_rows) * top_k_, 0);
  if (!recv_local_slot_.empty()) {
    CUDA_CHECK(cudaMemcpyAsync(recv_local_slot_.data(), recv_local_slot_dev_.data(),
                               recv_local_slot_.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                               stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // sync #2

  // Receiver: plan, expand into per-slot blocks, run each local slot's expert, pack returns.
  receive_ = plan_receive(rank, n, slots, top_k_, recv_indptr_, recv_local_slot_);
  const int32_t num_entries = receive_.num_entries();
  upload(expand_src_row_, receive_.expand_src_row, stream_);
  upload(return_src_, receive_.return_src, stream_);
  expanded_.reserve(static_cast<size_t>(num_entries) * rb);
  expert_out_.reserve(static_cast<size_t>(num_entries) * rb);
  return_rows_.reserve(static_cast<size_t>(num_entries) * rb);
  gather_rows(expanded_.data(), recv_rows_.data(), expand_src_row_, num_entries, rb, stream_);
  if (grouped != nullptr) {
    if (num_entries > 0) {
      const std::vector<int32_t> row_expert =
          expanded_row_experts(placement, rank, receive_.slot_indptr);
      DI_CHECK(static_cast<int32_t>(row_expert.size()) == num_entries,
               "EpMoeCuda: {} expanded rows, {} entries", row_expert.size(), num_entries);
      (*grouped)(expanded_.data(), expert_out_.data(), row_expert, stream_);
    }
  } else {
    for (int32_t s = 0; s < slots; ++s) {
      const int32_t begin = receive_.slot_indptr[s];
      const int32_t count = receive_.slot_indptr[s + 1] - begin;
      if (count == 0) continue;
      const int32_t e = placement.expert_at(rank * slots + s);
      DI_CHECK(e != kEmptySlot, "rank {} received {} rows for its empty slot {}", rank, count, s);
      (*per_slot)(e, expanded_.as<const char>() + begin * rb, expert_out_.as<char>() + begin * rb,
                  count, stream_);
    }
  }
  gather_rows(return_rows_.data(), expert_out_.data(), return_src_, num_entries, rb, stream_);

  // All-to-all #2 (reverse): each rank's returns for us, concatenated by rank = combine_buf.
  const int32_t num_entries_sent = dispatch_.num_entries_sent();
  combine_buf_.reserve(static_cast<size_t>(num_entries_sent) * rb);
  const AllToAllRows combine_op{return_rows_.data(), receive_.return_indptr, combine_buf_.data(),
                                dispatch_.combine_indptr, rb};
  transport_.all_to_all({&combine_op, 1}, stream_);

  CUDA_CHECK(
      launch_combine(CombineParams{out, combine_buf_.data(), entry_return_idx_.as<const int32_t>(),
                                   input.topk_weights, input.num_tokens, top_k_, hidden_, dtype_},
                     stream_));

  EpMoeStats stats;
  stats.num_send_rows = dispatch_.num_send_rows();
  stats.num_recv_rows = num_recv_rows;
  stats.num_entries = num_entries;
  stats.num_entries_sent = num_entries_sent;
  stats.dispatch_bytes = stats.num_send_rows * (rb + meta_bytes);
  stats.combine_bytes = static_cast<int64_t>(num_entries) * rb;
  return stats;
}

}  // namespace di::parallel::cuda
