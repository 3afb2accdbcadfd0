#pragma once
// Building blocks shared by the architectures: the gated MLP, the mixture-of-experts block and
// the decoder skeleton (embedding → layers → final norm → logits of selected rows).
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weight_loader.h"

namespace di {

// The shapes of Backend::fused_linear the models use (one kernel each at decode on CUDA):
//   y = rms_norm(x) · norm_w · wᵀ (+ bias)
void norm_linear(Backend& be, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                 const Tensor* bias, Tensor& y);
//   residual += x · wᵀ (+ bias)
void linear_add(Backend& be, const Tensor& x, const Tensor& w, const Tensor* bias,
                Tensor& residual);
//   h = silu(gate) · up with [gate | up] = rms_norm(x) · norm_w · gate_upᵀ (h [T, I])
void norm_linear_silu(Backend& be, const Tensor& x, const Tensor& norm_w, float eps,
                      const Tensor& gate_up, Tensor& h);

// SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused into one [2I, H] weight.
struct Mlp {
  Tensor gate_up;  // [2I, H]
  Tensor down;     // [H, I]
  int64_t inter = 0;

  static Mlp load(WeightLoader& w, const std::string& prefix, int64_t hidden, int64_t inter);
  void forward(Backend& be, const Tensor& x, Tensor& out) const;  // x, out [T, H]
};

// EPLB state of one MoE layer (issue #8), owned by engine/eplb_runtime.h. With it attached the
// block routes as usual, counts the logical ids into `counts`, maps them to physical weight slots
// (replicas of hot experts) and runs the experts on `physical` instead of MoeBlock::experts.
struct MoeEplbState {
  ExpertWeights physical;  // [num_slots, ...] weight slots; a slot holds a copy of one expert
  Tensor replica_indptr;   // [E + 1] i32: replicas of expert e are replica_slots[indptr[e]..[e+1])
  Tensor replica_slots;    // [num_slots] i32 physical slot ids, ascending per expert
  Tensor* counts = nullptr;  // [E] i32: this step's routing is added here; null = not counted
  // Debug/test only, CPU backend: every routed logical id of this layer is appended here.
  std::vector<int32_t>* trace = nullptr;
};

// Expert execution hook (issue #8, expert parallelism): when set on a MoeBlock, the block routes
// as usual (and maps to physical slots when EPLB is attached) and then calls run() instead of
// Backend::moe_experts. The implementation may move rows
// to other ranks (parallel/cuda/ep_moe_hook.h: NCCL dispatch -> local experts -> combine), so
// every rank of an EP group must call every MoE layer the same number of times (lockstep), with
// 0 rows when it has no tokens. A plain interface: no NCCL or CUDA here.
class MoeExpertHook {
 public:
  virtual ~MoeExpertHook() = default;
  // out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]), like moe_experts.
  //   x, out [T, H] compute dtype; topk_ids [T, k] i32; topk_weights [T, k] f32.
  virtual void run(Backend& be, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                   const ExpertWeights& experts, Tensor& out) = 0;
};

struct MoeBlock {
  Tensor gate;             // [E, H] router weight
  Tensor correction_bias;  // [E] (DeepSeek V3), else null
  ExpertWeights experts;   // [E, ...] logical experts (released when EPLB holds the weights)
  bool has_shared = false;
  Mlp shared;
  MoeRoutingParams routing;
  MoeEplbState* eplb = nullptr;  // not owned; set by the EPLB runtime
  // Not owned; EP (issue #8). With `eplb` too, run() gets the physical slot ids and the physical
  // weights, so the hook must have been made for num_slots "experts" (a DP group with EPLB).
  MoeExpertHook* expert_hook = nullptr;

  void forward(Backend& be, const Tensor& x, Tensor& out) const;  // x, out [T, H]
  // x += block(rms_norm(x) · norm_w): Backend::moe_norm_route, then Backend::moe_residual
  // (routed + shared experts + the add) unless EPLB or an EP hook runs the experts.
  void forward_residual(Backend& be, Tensor& x, const Tensor& norm_w, float eps) const;

 private:
  MoeRoutingParams routing_params() const;  // routing with the correction bias attached
  // out = Σ_j w_j · expert_j(x) (+ shared(x)) through EPLB / the EP hook / moe_experts.
  void experts_out(Backend& be, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   Tensor& out) const;
};

// Either a dense MLP or a MoE block.
struct FeedForward {
  bool is_moe = false;
  Mlp mlp;
  MoeBlock moe;
  void forward(Backend& be, const Tensor& x, Tensor& out) const {
    if (is_moe) {
      moe.forward(be, x, out);
    } else {
      mlp.forward(be, x, out);
    }
  }
  // x += ffn(rms_norm(x) · norm_w), x the residual stream [T, H]. A dense MLP is two
  // Backend::fused_linear calls (norm prologue and silu·mul epilogue; the residual add); a MoE
  // block is MoeBlock::forward_residual (the router writes h = norm(x) for the experts).
  void forward_residual(Backend& be, Tensor& x, const Tensor& norm_w, float eps) const;
};

// Embedding, final norm and output head, shared by every architecture.
struct DecoderEnds {
  Tensor embed;    // [V, H]
  Tensor norm;     // [H]
  Tensor lm_head;  // [V, H] (the embedding itself when tied)

  static DecoderEnds load(WeightLoader& w, const ModelConfig& c);
  // logits [R, V] of rows `rows` of the residual stream x [T, H].
  Tensor logits(Backend& be, const Tensor& x, const Tensor& rows, float eps) const;
};

}  // namespace di
