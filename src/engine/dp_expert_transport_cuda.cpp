// The CUDA side of dp_expert_transport.h (CUDA builds with NCCL only): one NCCL communicator per
// DP rank, all created by this process (ncclCommInitAll), NcclTransport + EpMoeHook per rank
// (parallel/cuda/ep_moe_hook.h, the path bench_cuda_ep verified on 2 H200s).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/dp_expert_transport.h"
#include "model/layers.h"
#include "parallel/cuda/cuda_check.h"
#include "parallel/cuda/ep_comm.h"
#include "parallel/cuda/ep_moe_hook.h"
#include "parallel/cuda/peer_exchange_group.h"

namespace di {
namespace {

using parallel::cuda::EpComm;
using parallel::cuda::EpMoeHook;
using parallel::cuda::NcclTransport;

// EpMoeHook that refuses to run once the group's communicators were aborted (a rank failed in
// the middle of a step: the ranks no longer agree on which collective comes next).
class GuardedHook final : public MoeExpertHook {
 public:
  GuardedHook(std::unique_ptr<EpMoeHook> hook, const std::atomic<bool>& broken)
      : hook_(std::move(hook)), broken_(broken) {}
  void run(Backend& be, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
           const ExpertWeights& experts, Tensor& out) override {
    DI_CHECK(!broken_.load(),
             "the EP group's NCCL communicators were aborted after a failed step; restart the "
             "server");
    hook_->run(be, x, topk_ids, topk_weights, experts, out);
  }
  EpMoeHook& inner() { return *hook_; }

 private:
  std::unique_ptr<EpMoeHook> hook_;
  const std::atomic<bool>& broken_;
};

class NcclExpertTransport final : public DpExpertTransport {
 public:
  explicit NcclExpertTransport(std::span<const int32_t> devices)
      : devices_(devices.begin(), devices.end()), comms_(EpComm::init_all(devices)) {
    for (const EpComm& c : comms_) transports_.push_back(std::make_unique<NcclTransport>(c));
    hooks_.resize(comms_.size());
    DI_LOG_INFO("DP group: NCCL {} communicators over CUDA devices {} ({})",
                parallel::cuda::nccl_runtime_version(), fmt::join(devices_, ","),
                comms_.front().init_path());
  }
  ~NcclExpertTransport() override {
    // Communicators go after the hooks that use them (member order) and after every rank thread
    // stopped (the group destroys its ranks first).
    hooks_.clear();
  }

  int32_t num_ranks() const override { return static_cast<int32_t>(devices_.size()); }
  void bind_thread(int32_t rank_idx) override {
    CUDA_CHECK(cudaSetDevice(devices_.at(static_cast<size_t>(rank_idx))));
  }

  void attach(int32_t rank_idx, Backend& backend, Model& model, int32_t max_decode_rows,
              int32_t num_expert_slots) override {
    auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
    DI_CHECK(cuda != nullptr, "the NCCL EP transport needs the CUDA backend, got '{}'",
             backend.name());
    const std::vector<MoeBlock*> blocks = model.moe_blocks();
    DI_CHECK(!blocks.empty(), "EP needs a MoE model");
    const MoeBlock& b = *blocks.front();
    const auto hidden = static_cast<int32_t>(b.experts.gate_up.size(2));
    const int32_t n = num_ranks();
    DI_CHECK(num_expert_slots == 0 || num_expert_slots % n == 0, "EP: {} EPLB slots over {} ranks",
             num_expert_slots, n);
    // With EPLB the hook's "experts" are the N·S physical slots: contiguous_placement(N·S, N)
    // gives rank r exactly [r·S, (r+1)·S) in the throughput and the latency exchange.
    const int32_t owned =
        num_expert_slots > 0 ? num_expert_slots : static_cast<int32_t>(b.experts.gate_up.size(0));
    if (rank_idx == 0 && max_decode_rows > 0)
      make_peer_exchange(hidden, b.routing.top_k, backend.compute_dtype(), max_decode_rows);
    auto hook = std::make_unique<EpMoeHook>(
        *transports_.at(static_cast<size_t>(rank_idx)), owned, hidden, b.routing.top_k,
        backend.compute_dtype(), cuda->stream(), max_decode_rows,
        peer_ && max_decode_rows > 0 ? &peer_->rank(rank_idx) : nullptr);
    auto& slot = hooks_.at(static_cast<size_t>(rank_idx));
    slot = std::make_unique<GuardedHook>(std::move(hook), broken_);
    parallel::cuda::attach_expert_hook(blocks, slot.get());
  }

  void set_latency_rows(int32_t rank_idx, int32_t rows) override {
    hooks_.at(static_cast<size_t>(rank_idx))->inner().set_latency_rows(rows);
  }

  std::string fatal_error() const override {
    std::lock_guard lock(reason_mu_);
    return broken_reason_;
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard lock(reason_mu_);
      if (broken_reason_.empty()) {
        broken_reason_ = fmt::format("the DP group's NCCL communicators were aborted ({})", reason);
      }
    }
    if (broken_.exchange(true)) return;
    DI_LOG_ERROR("DP group: aborting the NCCL communicators ({}); every later step fails", reason);
    if (peer_) peer_->abort();
    for (EpComm& c : comms_) c.abort();
  }
  void reset() override {}  // an aborted communicator cannot be revived: GuardedHook refuses

 private:
  // The decode exchange peer to peer (peer_exchange.h) when every pair of the group's GPUs has
  // peer access; DEEPINFER_EP_PEER=0 keeps it on NCCL (A/B). Made once, at rank 0's attach.
  void make_peer_exchange(int32_t hidden, int32_t top_k, DType dtype, int32_t max_rows) {
    if (di::env::is("DEEPINFER_EP_PEER", "0")) {
      DI_LOG_INFO("DP group: decode exchange over NCCL (DEEPINFER_EP_PEER=0)");
      return;
    }
    if (!parallel::cuda::PeerExchangeGroup::supported(devices_)) {
      DI_LOG_INFO("DP group: decode exchange over NCCL (no peer access between the GPUs)");
      return;
    }
    peer_ = std::make_unique<parallel::cuda::PeerExchangeGroup>(
        devices_, max_rows,
        parallel::cuda::latency_row_bytes(hidden, top_k, parallel::cuda::row_dtype(dtype)),
        int64_t{hidden} * static_cast<int64_t>(dtype_size(dtype)));
    DI_LOG_INFO("DP group: decode exchange peer to peer (direct stores between the GPUs)");
  }

  std::vector<int32_t> devices_;
  std::vector<EpComm> comms_;
  std::unique_ptr<parallel::cuda::PeerExchangeGroup> peer_;  // before the hooks that use it
  std::vector<std::unique_ptr<NcclTransport>> transports_;
  std::vector<std::unique_ptr<GuardedHook>> hooks_;
  std::atomic<bool> broken_{false};
  mutable std::mutex reason_mu_;
  std::string broken_reason_;
};

}  // namespace

std::unique_ptr<DpExpertTransport> make_nccl_expert_transport(std::span<const int32_t> devices) {
  return std::make_unique<NcclExpertTransport>(devices);
}

void bind_rank_device(const std::string& backend, int32_t device_idx) {
  if (backend == "cpu") return;
  CUDA_CHECK(cudaSetDevice(device_idx));
}

std::vector<int32_t> probe_healthy_cuda_devices(std::string* report) {
  std::vector<int32_t> healthy;
  std::string text;
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    if (report != nullptr) *report = fmt::format("no CUDA devices ({})", cudaGetErrorString(e));
    return healthy;
  }
  constexpr size_t kProbeBytes = size_t{64} << 20;
  for (int d = 0; d < count; ++d) {
    void* p = nullptr;
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the context
    if (e == cudaSuccess) e = cudaMalloc(&p, kProbeBytes);
    if (e == cudaSuccess) e = cudaMemset(p, 0, kProbeBytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (p != nullptr) (void)cudaFree(p);
    if (e == cudaSuccess) {
      healthy.push_back(d);
      text += fmt::format("GPU {}: ok; ", d);
    } else {
      (void)cudaGetLastError();
      text += fmt::format("GPU {}: skipped ({}); ", d, cudaGetErrorString(e));
    }
  }
  if (count > 0) (void)cudaSetDevice(healthy.empty() ? 0 : healthy.front());
  if (report != nullptr) *report = text;
  return healthy;
}

}  // namespace di
