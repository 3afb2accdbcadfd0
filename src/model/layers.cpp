#include "model/layers.h"

namespace di {

void norm_linear(Backend& be, const Tensor& x, const Tensor& norm_w, float eps, const Tensor& w,
                 const Tensor* bias, Tensor& y) {
  FusedLinearParams p;
  p.in = FusedLinearParams::In::kRmsNorm;
  p.x = &x;
  p.norm_w = &norm_w;
  p.eps = eps;
  p.w = &w;
  p.bias = bias;
  p.y = &y;
  be.fused_linear(p);
}

void linear_add(Backend& be, const Tensor& x, const Tensor& w, const Tensor* bias,
                Tensor& residual) {
  FusedLinearParams p;
  p.x = &x;
  p.w = &w;
  p.bias = bias;
  p.residual = &residual;
  be.fused_linear(p);
}

void norm_linear_silu(Backend& be, const Tensor& x, const Tensor& norm_w, float eps,
                      const Tensor& gate_up, Tensor& h) {
  FusedLinearParams p;
  p.in = FusedLinearParams::In::kRmsNorm;
  p.silu_out = true;
  p.x = &x;
  p.norm_w = &norm_w;
  p.eps = eps;
  p.w = &gate_up;
  p.y = &h;
  be.fused_linear(p);
}


Mlp Mlp::load(WeightLoader& w, const std::string& prefix, int64_t hidden, int64_t inter) {
  Mlp m;
  m.inter = inter;
  m.gate_up = w.load_concat_rows({prefix + "gate_proj.weight", prefix + "up_proj.weight"},
                                 {{inter, hidden}, {inter, hidden}});
  m.down = w.load(prefix + "down_proj.weight", {hidden, inter});
  return m;
}

void Mlp::forward(Backend& be, const Tensor& x, Tensor& out) const {
  const int64_t t = x.size(0);
  Tensor h = be.empty({t, inter}, be.compute_dtype());
  FusedLinearParams p;
  p.silu_out = true;
  p.x = &x;
  p.w = &gate_up;
  p.y = &h;
  be.fused_linear(p);
  be.linear(h, down, nullptr, out);
}

void FeedForward::forward_residual(Backend& be, Tensor& x, const Tensor& norm_w, float eps) const {
  const int64_t t = x.size(0);
  const DType dt = be.compute_dtype();
  if (is_moe) {
    moe.forward_residual(be, x, norm_w, eps);
    return;
  }
  // silu·mul as the gate_up GEMV's epilogue (the down GEMV then stages h as it is): at batch 1
  // on the H200 this is 4 us per Llama-3.1-8B layer faster than silu·mul in down's prologue,
  // where every CTA recomputed it from both halves (bench_cuda_gemv, run 13).
  Tensor h = be.empty({t, mlp.inter}, dt);
  norm_linear_silu(be, x, norm_w, eps, mlp.gate_up, h);
  linear_add(be, h, mlp.down, nullptr, x);
}

void MoeBlock::forward(Backend& be, const Tensor& x, Tensor& out) const {
  const int64_t t = x.size(0), e = gate.size(0), k = routing.top_k;
  Tensor logits = be.empty({t, e}, DType::kF32);
  be.linear(x, gate, nullptr, logits);
  Tensor ids = be.empty({t, k}, DType::kI32);
  Tensor weights = be.empty({t, k}, DType::kF32);
  be.moe_route(logits, routing_params(), ids, weights);
  experts_out(be, x, ids, weights, out);
}

void MoeBlock::forward_residual(Backend& be, Tensor& x, const Tensor& norm_w, float eps) const {
  const int64_t t = x.size(0), hidden = x.size(1), k = routing.top_k;
  const DType dt = be.compute_dtype();
  Tensor h = be.empty({t, hidden}, dt);
  Tensor ids = be.empty({t, k}, DType::kI32);
  Tensor weights = be.empty({t, k}, DType::kF32);
  MoeNormRouteParams r;
  r.x = &x;
  r.norm_w = &norm_w;
  r.eps = eps;
  r.gate = &gate;
  r.routing = routing_params();
  r.h = &h;
  r.topk_ids = &ids;
  r.topk_weights = &weights;
  be.moe_norm_route(r);
  if (eplb == nullptr && expert_hook == nullptr) {
    // Routed and shared experts and the residual add as one op (CUDA: two kernels at batch 1).
    MoeResidualParams m;
    m.x = &h;
    m.topk_ids = &ids;
    m.topk_weights = &weights;
    m.experts = &experts;
    if (has_shared) {
      m.shared_gate_up = &shared.gate_up;
      m.shared_down = &shared.down;
    }
    m.residual = &x;
    m.norm_w = &norm_w;
    m.eps = eps;
    be.moe_residual(m);
    return;
  }
  Tensor o = be.empty({t, hidden}, dt);
  experts_out(be, h, ids, weights, o);
  be.add(x, o, x);
}

MoeRoutingParams MoeBlock::routing_params() const {
  MoeRoutingParams p = routing;
  p.correction_bias = correction_bias.is_null() ? nullptr : &correction_bias;
  return p;
}

void MoeBlock::experts_out(Backend& be, const Tensor& x, const Tensor& ids, const Tensor& weights,
                           Tensor& out) const {
  const int64_t t = x.size(0), k = routing.top_k;
  if (eplb != nullptr) {
    // Logical ids are counted (this rank's tokens) and mapped to physical slots; an EP hook then
    // owns physical slots (rank r: [r·S, (r+1)·S), docs/expert_parallelism.md).
    if (eplb->counts != nullptr) be.moe_count_experts(ids, *eplb->counts);
    if (eplb->trace != nullptr && ids.device() == Device::kCPU)
      eplb->trace->insert(eplb->trace->end(), ids.data<int32_t>(), ids.data<int32_t>() + t * k);
    Tensor phys = be.empty({t, k}, DType::kI32);
    be.moe_map_replicas(ids, eplb->replica_indptr, eplb->replica_slots, phys);
    if (expert_hook != nullptr) {
      expert_hook->run(be, x, phys, weights, eplb->physical, out);
    } else {
      be.moe_experts(x, phys, weights, eplb->physical, out);
    }
  } else if (expert_hook != nullptr) {
    expert_hook->run(be, x, ids, weights, experts, out);
  } else {
    be.moe_experts(x, ids, weights, experts, out);
  }
  if (has_shared) {
    Tensor s = be.empty(out.shape(), be.compute_dtype());
    shared.forward(be, x, s);
    be.add(out, s, out);
  }
}

DecoderEnds DecoderEnds::load(WeightLoader& w, const ModelConfig& c) {
  DecoderEnds d;
  d.embed = w.load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  d.norm = w.load("model.norm.weight", {c.hidden_size});
  if (c.tie_word_embeddings && !w.has("lm_head.weight")) {
    d.lm_head = d.embed;
  } else {
    d.lm_head = w.load("lm_head.weight", {c.vocab_size, c.hidden_size});
  }
  return d;
}

Tensor DecoderEnds::logits(Backend& be, const Tensor& x, const Tensor& rows, float eps) const {
  const int64_t r = rows.numel(), h = x.size(1);
  Tensor picked = be.empty({r, h}, be.compute_dtype());
  be.embedding(rows, x, picked);  // a row gather
  Tensor out = be.empty({r, lm_head.size(0)}, DType::kF32);
  norm_linear(be, picked, norm, eps, lm_head, nullptr, out);
  return out;
}

}  // namespace di
