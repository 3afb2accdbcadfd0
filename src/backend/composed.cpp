// Reference compositions of fused ops out of the basic ones (backend.h), and the routing rule
// every backend shares (moe_route_on_logits, moe_softmax_denominator). A library of its own so that
// both the CPU backend and the CUDA backend (which falls back to them) can link it.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backend/backend.h"
#include "backend/moe_softmax_denominator.h"
#include "core/env.h"
#include "core/error.h"

namespace di {

bool moe_route_on_logits(const MoeRoutingParams& p) {
  static const bool enabled = !di::env::is("DEEPINFER_MOE_ROUTE_ON_LOGITS", "0");
  return enabled && p.scoring == MoeRoutingParams::Scoring::kSoftmax &&
         (!p.renormalize || p.renorm_eps <= 1e-12f) && p.correction_bias == nullptr &&
         (p.num_groups <= 1 || p.topk_groups >= p.num_groups);
}

double moe_softmax_denominator(const float* l, int64_t e, float mx) {
  return softmax_denominator_lanes(l, e, mx);
}

void paged_attention_head_composed(Backend& be, const PagedAttentionParams& p) {
  DI_CHECK(p.head_w != nullptr && p.head_out != nullptr && p.out != nullptr,
           "paged_attention: head_w needs head_out and out (the attention's scratch)");
  PagedAttentionParams a = p;
  a.head_w = nullptr;
  a.head_out = nullptr;
  be.paged_attention(a);
  be.head_linear(*p.out, *p.head_w, *p.head_out);
}

void fused_linear_composed(Backend& be, const FusedLinearParams& p) {
  DI_CHECK(p.x && p.w && (p.y || p.residual), "fused_linear: missing x, w or an output");
  const Tensor& x = *p.x;
  const int64_t rows = x.numel() / std::max<int64_t>(x.size(-1), 1);
  const int64_t k = p.w->size(1), n = p.w->size(0);
  Tensor a;
  switch (p.in) {
    case FusedLinearParams::In::kNone:
      a = x;
      break;
    case FusedLinearParams::In::kRmsNorm:
      DI_CHECK(p.norm_w != nullptr, "fused_linear: kRmsNorm without norm_w");
      a = be.empty({rows, k}, be.compute_dtype());
      be.rms_norm(x, *p.norm_w, p.eps, a);
      break;
    case FusedLinearParams::In::kSiluMul:
      DI_CHECK(x.size(-1) == 2 * k, "fused_linear: kSiluMul input {} for weight of {} inputs",
               x.describe(), k);
      a = be.empty({rows, k}, be.compute_dtype());
      be.silu_mul(x, a);
      break;
  }
  if (p.silu_out) {
    DI_CHECK(p.y != nullptr && p.residual == nullptr && n % 2 == 0,
             "fused_linear: silu_out needs y, no residual and an even number of outputs ({})", n);
    Tensor r = be.empty({rows, n}, be.compute_dtype());
    be.linear(a, *p.w, p.bias, r);
    be.silu_mul(r, *p.y);
    return;
  }
  if (p.residual == nullptr) {
    be.linear(a, *p.w, p.bias, *p.y);
    return;
  }
  if (p.y != nullptr) {
    be.linear(a, *p.w, p.bias, *p.y);
    be.add(*p.residual, *p.y, *p.residual);
    return;
  }
  Tensor r = be.empty({rows, n}, be.compute_dtype());
  be.linear(a, *p.w, p.bias, r);
  be.add(*p.residual, r, *p.residual);
}

void qkv_rope_attention_composed(Backend& be, const QkvRopeStoreParams& store,
                                 const PagedAttentionParams& attn) {
  DI_CHECK(store.q_out != nullptr && attn.q != nullptr && store.q_out->raw() == attn.q->raw() &&
               attn.q_rope == nullptr,
           "qkv_rope_attention: attention must read the query qkv_rope_store writes (q_out)");
  DI_CHECK(store.pool != nullptr && attn.pool != nullptr && store.pool->raw() == attn.pool->raw() &&
               store.layer == attn.layer && store.batch == attn.batch,
           "qkv_rope_attention: store and attention must name the same pool, layer and batch");
  be.qkv_rope_store(store);
  be.paged_attention(attn);
}

}  // namespace di

namespace di {

void moe_norm_route_composed(Backend& be, const MoeNormRouteParams& p) {
  DI_CHECK(p.x && p.norm_w && p.gate && p.h && p.topk_ids && p.topk_weights,
           "moe_norm_route: missing x, norm_w, gate or an output");
  const int64_t t = p.x->size(0), e = p.gate->size(0);
  be.rms_norm(*p.x, *p.norm_w, p.eps, *p.h);
  Tensor scratch;
  Tensor* logits = p.logits;
  if (logits == nullptr) {
    scratch = be.empty({t, e}, DType::kF32);
    logits = &scratch;
  }
  be.linear(*p.h, *p.gate, nullptr, *logits);
  be.moe_route(*logits, p.routing, *p.topk_ids, *p.topk_weights);
}

void moe_residual_composed(Backend& be, const MoeResidualParams& p) {
  DI_CHECK(p.x && p.topk_ids && p.topk_weights && p.experts && p.residual,
           "moe_residual: missing x, topk_ids, topk_weights, experts or residual");
  DI_CHECK((p.shared_gate_up == nullptr) == (p.shared_down == nullptr),
           "moe_residual: the shared expert needs both gate_up and down");
  const DType dt = be.compute_dtype();
  Tensor out = be.empty(p.x->shape(), dt);
  be.moe_experts(*p.x, *p.topk_ids, *p.topk_weights, *p.experts, out);
  if (p.shared_gate_up != nullptr) {
    const int64_t t = p.x->size(0), inter = p.shared_gate_up->size(0) / 2;
    Tensor h = be.empty({t, inter}, dt);
    FusedLinearParams f;
    f.silu_out = true;
    f.x = p.x;
    f.w = p.shared_gate_up;
    f.y = &h;
    be.fused_linear(f);
    Tensor s = be.empty(p.x->shape(), dt);
    be.linear(h, *p.shared_down, nullptr, s);
    be.add(out, s, out);
  }
  be.add(*p.residual, out, *p.residual);
}

}  // namespace di
