#pragma once
// The NCCL path of one expert-parallel MoE layer: the device twin of run_ep_moe_reference
// (ep_exchange_ref.h), following the same DispatchPlan / ReceivePlan (ep_layout.h) row for row.
//
//   host: plan_dispatch(topk_ids)  --upload-->  send_token_idx, send_local_slot, entry_return_idx
//   gather x -> send rows                        [num_send_rows, hidden]
//   all-to-all-v #0: send counts (1 int32 per peer)        -> host (sync #1)
//   all-to-all-v #1: rows + send_local_slot metadata        -> host metadata (sync #2)
//   host: plan_receive(recv metadata) --upload-->  expand_src_row, return_src
//   gather recv rows -> expanded (contiguous per local slot); expert(slot) on each block
//   gather expert out -> return rows; all-to-all-v #2 (reverse) -> combine_buf
//   combine: out[t] = sum_j w[t, j] * combine_buf[entry_return_idx[t, j]], j ascending
//
// Every data step is a gather and the combine rounds like the host reference, so in fp32 the
// output equals run_ep_moe_reference (hence run_moe_reference) bit for bit given bit-identical
// experts. In bf16 rows travel as bf16, the combine accumulates in fp32 and rounds once.
// The plans are built on the host (two syncs), so forward() is not CUDA-graph capturable: this is
// the throughput exchange (prefill). Decode steps use EpMoeLatency (ep_moe_latency.h), which has
// fixed sizes and no host sync.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "parallel/cuda/ep_comm.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/ep_layout.h"
#include "parallel/expert_placement.h"

namespace di::parallel::cuda {

// A grow-only cudaMalloc'd buffer; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Ensures capacity >= bytes; old contents are lost when it grows.
  void reserve(size_t bytes);
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

// Applies logical expert `expert_idx` to `num_rows` contiguous rows (device, layer dtype,
// [num_rows, hidden]) from `in` into `out`, on `stream`. Rows must be independent.
using DeviceExpertFn = std::function<void(int32_t expert_idx, const void* in, void* out,
                                          int32_t num_rows, cudaStream_t stream)>;

// Applies the experts to all `num_rows` expanded rows at once (one grouped GEMM instead of one
// call per slot): row i of `in` ([num_rows, hidden], layer dtype, device) goes through logical
// expert row_expert[i] (host, [num_rows], rows contiguous per local slot) into row i of `out`,
// on `stream`. Not called when num_rows is 0.
using GroupedExpertFn =
    std::function<void(const void* in, void* out, std::span<const int32_t> row_expert,
                       cudaStream_t stream)>;

// One all-to-all-v of rows: rows [send_indptr[q], send_indptr[q + 1]) of `send` go to rank q,
// rows from rank r land at [recv_indptr[r], recv_indptr[r + 1]) of `recv`. Both indptr are host
// arrays [num_ranks + 1]; the caller knows every count (from the count exchange or the plans).
struct AllToAllRows {
  const void* send;  // device [send_indptr.back(), row_bytes]
  std::span<const int32_t> send_indptr;
  void* recv;  // device [recv_indptr.back(), row_bytes]
  std::span<const int32_t> recv_indptr;
  int64_t row_bytes;
};

// Moves rows between the ranks of the EP group. NcclTransport is the real one; tests add an
// in-process loopback to run N simulated ranks on one GPU.
class EpTransport {
 public:
  virtual ~EpTransport() = default;
  virtual int32_t rank_idx() const = 0;
  virtual int32_t num_ranks() const = 0;
  // Runs the exchanges as one group, enqueued on `stream` (every rank calls it with the same
  // number of ops, in the same order).
  virtual void all_to_all(std::span<const AllToAllRows> ops, cudaStream_t stream) = 0;
  // recv[r * bytes_per_rank ..] = rank r's send, for every rank r (send is bytes_per_rank bytes,
  // the same size on every rank), enqueued on `stream` (the decode exchange, ep_moe_latency.h).
  virtual void all_gather(const void* send, void* recv, int64_t bytes_per_rank,
                          cudaStream_t stream) = 0;
};

// Grouped per-peer ncclSend/ncclRecv; empty pairs are skipped on both sides (both know the
// counts). World size 1 is a self send/recv.
void all_to_all_rows(ncclComm_t comm, int32_t num_ranks, const AllToAllRows& op,
                     cudaStream_t stream);

class NcclTransport final : public EpTransport {
 public:
  explicit NcclTransport(const EpComm& comm) : comm_(comm) {}
  int32_t rank_idx() const override { return comm_.rank_idx(); }
  int32_t num_ranks() const override { return comm_.num_ranks(); }
  void all_to_all(std::span<const AllToAllRows> ops, cudaStream_t stream) override;
  void all_gather(const void* send, void* recv, int64_t bytes_per_rank,
                  cudaStream_t stream) override;

 private:
  const EpComm& comm_;
};

struct EpMoeInput {
  const void* x = nullptr;              // device [num_tokens, hidden], layer dtype
  std::span<const int32_t> topk_ids;    // host [num_tokens * top_k] logical expert or kNoExpert
  const float* topk_weights = nullptr;  // device [num_tokens * top_k]
  int32_t num_tokens = 0;
};

// What one forward moved, for bandwidth numbers and tests.
struct EpMoeStats {
  int32_t num_send_rows = 0;     // dispatch rows this rank sent (incl. to itself)
  int32_t num_recv_rows = 0;     // dispatch rows this rank received
  int32_t num_entries = 0;       // expert rows this rank computed (= return rows it sent)
  int32_t num_entries_sent = 0;  // combine rows this rank received
  int64_t dispatch_bytes = 0;    // rows + metadata this rank sent in all-to-all #1
  int64_t combine_bytes = 0;     // rows this rank sent in all-to-all #2
};

class EpMoeCuda {
 public:
  // The layer shape is fixed; the placement may change between calls (EPLB swaps whole tables).
  // `transport` must outlive this object; `stream` is where every kernel and exchange is enqueued.
  EpMoeCuda(EpTransport& transport, int32_t hidden, int32_t top_k, RowDtype dtype,
            cudaStream_t stream);

  // Writes out [num_tokens, hidden] (device, layer dtype). Every rank of the group must call it
  // with the same placement. Returns after enqueuing the combine (the stream is not synced at
  // the end); the host-side plans it used stay valid until the next call.
  EpMoeStats forward(const ExpertPlacement& placement, const EpMoeInput& input,
                     const DeviceExpertFn& expert, void* out);
  // The same with one grouped expert call per forward (EP in the model: ep_moe_hook.h).
  EpMoeStats forward(const ExpertPlacement& placement, const EpMoeInput& input,
                     const GroupedExpertFn& experts, void* out);

  const DispatchPlan& last_dispatch_plan() const { return dispatch_; }
  const ReceivePlan& last_receive_plan() const { return receive_; }

 private:
  // Exactly one of per_slot / grouped is non-null.
  EpMoeStats forward_impl(const ExpertPlacement& placement, const EpMoeInput& input,
                          const DeviceExpertFn* per_slot, const GroupedExpertFn* grouped,
                          void* out);
  int64_t row_bytes() const { return static_cast<int64_t>(hidden_) * dtype_bytes(dtype_); }

  EpTransport& transport_;
  int32_t hidden_;
  int32_t top_k_;
  RowDtype dtype_;
  cudaStream_t stream_;

  DispatchPlan dispatch_;
  ReceivePlan receive_;
  std::vector<int32_t> recv_counts_host_;
  std::vector<int32_t> recv_indptr_;
  std::vector<int32_t> recv_local_slot_;
  std::vector<int32_t> count_indptr_;  // [num_ranks + 1] = 0, 1, ..., num_ranks

  // Device plan arrays (int32) and row buffers (layer dtype).
  DeviceBuffer send_token_idx_, entry_return_idx_, send_local_slot_, recv_local_slot_dev_;
  DeviceBuffer expand_src_row_, return_src_, counts_;
  DeviceBuffer send_rows_, recv_rows_, expanded_, expert_out_, return_rows_, combine_buf_;
};

}  // namespace di::parallel::cuda
