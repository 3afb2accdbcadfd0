#pragma once
// DpExpertTransport: the device side of a DP engine group (dp_engine_group.h): which device a
// rank's thread drives, and the MoE expert hook (model/layers.h) that moves each rank's routed
// rows to the rank owning their expert and back.
//
//   backend cpu   make_shm_expert_transport: rank threads exchange through shared memory
//                 (parallel/shm_ep_group.h); bind_thread does nothing.
//   backend cuda  make_nccl_expert_transport (dp_expert_transport_cuda.cpp, CUDA builds with
//                 NCCL only): one NCCL communicator per rank from ncclCommInitAll over the
//                 group's devices, NcclTransport + EpMoeHook per rank; bind_thread =
//                 cudaSetDevice(devices[rank]).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace di {

class DpExpertTransport {
 public:
  virtual ~DpExpertTransport() = default;
  virtual int32_t num_ranks() const = 0;
  // Makes the calling thread drive rank r's device (before loading its model, and first thing
  // on its engine thread).
  virtual void bind_thread(int32_t rank_idx) = 0;
  // Creates rank r's expert hook for its backend and model and attaches it to every MoE block.
  // Called once per rank, in rank order, on a thread bound to the rank's device.
  // max_decode_rows > 0: the hook also gets the decode (latency) exchange for up to that many
  // tokens per rank (CUDA; the shared-memory exchange has one path for every step).
  // num_expert_slots: 0 = the model's E routed experts, rank r owns [r·spr, (r+1)·spr),
  // spr = ceil(E / N); > 0 = EPLB's physical slots (N·S, a multiple of N): the hook then gets
  // physical ids and weights (MoeBlock::forward) and rank r owns slots [r·S, (r+1)·S).
  virtual void attach(int32_t rank_idx, Backend& backend, Model& model, int32_t max_decode_rows,
                      int32_t num_expert_slots) = 0;
  // The exchange of rank r's next forwards: rows > 0 the latency exchange with that many rows
  // per rank (same on every rank), 0 the throughput exchange. On the engine thread of rank r.
  virtual void set_latency_rows(int32_t /*rank_idx*/, int32_t /*rows*/) {}
  // A rank's step failed mid-way: release ranks blocked in the exchange (their step fails too).
  virtual void abort(const std::string& reason) = 0;
  // Every rank is between steps (at the group barrier): make the exchange usable after abort(),
  // or fail later steps with a clear message where that is impossible (NCCL).
  virtual void reset() = 0;
  // Non-empty when the exchange cannot be used again (NCCL after abort): the reason.
  virtual std::string fatal_error() const { return {}; }
};

std::unique_ptr<DpExpertTransport> make_shm_expert_transport(int32_t num_ranks);

// Device binding without an expert exchange (dense models: independent DP ranks).
// CPU: does nothing. CUDA: cudaSetDevice.
void bind_rank_device(const std::string& backend, int32_t device_idx);

#ifdef DI_HAVE_EP_NCCL
// One rank per device in `devices` (distinct CUDA device indices).
std::unique_ptr<DpExpertTransport> make_nccl_expert_transport(std::span<const int32_t> devices);
#endif

// `serve --dp-size auto`: the CUDA devices that pass a context creation and a 64 MiB allocation,
// in index order; `report` lists every device with its outcome. Empty without CUDA.
std::vector<int32_t> probe_healthy_cuda_devices(std::string* report);

}  // namespace di
