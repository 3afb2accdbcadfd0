#pragma once
// Building blocks shared by the architectures: the gated MLP, the mixture-of-experts block and
// the decoder skeleton (embedding → layers → final norm → logits of selected rows).
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weight_loader.h"

namespace di {

// SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused into one [2I, H] weight.
struct Mlp {
  Tensor gate_up;  // [2I, H]
  Tensor down;     // [H, I]
  int64_t inter = 0;

  static Mlp load(WeightLoader& w, const std::string& prefix, int64_t hidden, int64_t inter);
  void forward(Backend& be, const Tensor& x, Tensor& out) const;  // x, out [T, H]
};

struct MoeBlock {
  Tensor gate;             // [E, H] router weight
  Tensor correction_bias;  // [E] (DeepSeek V3), else null
  ExpertWeights experts;
  bool has_shared = false;
  Mlp shared;
  MoeRoutingParams routing;

  void forward(Backend& be, const Tensor& x, Tensor& out) const;  // x, out [T, H]
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
