// The host-only parts of dp_expert_transport.h: the shared-memory transport of the CPU backend,
// and the fallbacks of the CUDA helpers in builds without CUDA.
#include "engine/dp_expert_transport.h"

#include "core/error.h"
#include "model/layers.h"
#include "parallel/shm_ep_group.h"

namespace di {
namespace {

class ShmExpertTransport final : public DpExpertTransport {
 public:
  explicit ShmExpertTransport(int32_t num_ranks) : num_ranks_(num_ranks) {}
  int32_t num_ranks() const override { return num_ranks_; }
  void bind_thread(int32_t /*rank_idx*/) override {}

  void attach(int32_t rank_idx, Backend& backend, Model& model, int32_t /*max_decode_rows*/,
              int32_t num_expert_slots) override {
    DI_CHECK(backend.device() == Device::kCPU,
             "the shared-memory EP transport runs on the CPU backend, not '{}'", backend.name());
    const std::vector<MoeBlock*> blocks = model.moe_blocks();
    DI_CHECK(!blocks.empty(), "EP needs a MoE model");
    const MoeBlock& b = *blocks.front();
    const auto num_experts = static_cast<int32_t>(b.experts.gate_up.size(0));
    const auto hidden = static_cast<int32_t>(b.experts.gate_up.size(2));
    const int32_t owned = num_expert_slots > 0 ? num_expert_slots : num_experts;
    DI_CHECK(num_expert_slots == 0 || num_expert_slots % num_ranks_ == 0,
             "EP: {} EPLB slots over {} ranks", num_expert_slots, num_ranks_);
    if (!group_) {
      group_ = std::make_unique<parallel::ShmEpGroup>(num_ranks_, owned, b.routing.top_k, hidden);
    }
    DI_CHECK(group_->placement().num_experts() == owned,
             "EP: rank {} attaches {} experts, the group has {}", rank_idx, owned,
             group_->placement().num_experts());
    for (MoeBlock* m : blocks) {
      DI_CHECK(m->experts.gate_up.size(0) == num_experts && m->routing.top_k == b.routing.top_k,
               "EP: every MoE layer must have {} experts and top-{}", num_experts, b.routing.top_k);
      m->expert_hook = &group_->hook(rank_idx);
    }
  }

  void abort(const std::string& reason) override {
    if (group_) group_->abort(reason);
  }
  void reset() override {
    if (group_) group_->reset();
  }

 private:
  const int32_t num_ranks_;
  std::unique_ptr<parallel::ShmEpGroup> group_;
};

}  // namespace

std::unique_ptr<DpExpertTransport> make_shm_expert_transport(int32_t num_ranks) {
  return std::make_unique<ShmExpertTransport>(num_ranks);
}

#ifndef DI_HAVE_EP_NCCL
void bind_rank_device(const std::string& backend, int32_t device_idx) {
  (void)device_idx;
  DI_CHECK(backend == "cpu", "backend '{}' with --dp-size needs a CUDA build with NCCL", backend);
}

std::vector<int32_t> probe_healthy_cuda_devices(std::string* report) {
  if (report != nullptr) *report = "this build has no CUDA/NCCL support";
  return {};
}
#endif

}  // namespace di
