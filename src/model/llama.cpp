// The grouped-query-attention family: LlamaForCausalLM (incl. Llama 3 rope scaling),
// Qwen3ForCausalLM (RMSNorm on q and k per head) and Qwen3MoeForCausalLM (sparse MoE MLPs).
//
// Per layer:  h = norm(x);  q,k,v = split(h · Wqkvᵀ);  [q,k = head_norm(q,k)];  rope(q, k)
//             store k,v → paged pool;  a = attention(q, pool)
//             (all of this but the GEMM: Backend::qkv_rope_attention)
//             x += o_proj(a)   (Backend::fused_linear with the residual add)
//             x += ffn(norm(x))
// The norms, the residual adds and the MLP's silu·mul ride on the neighbouring linear layer
// (Backend::fused_linear: one kernel per linear at decode batch sizes on CUDA). x, the residual
// stream, is always current; h = norm(x) is materialised only for MoE blocks (several readers).
// KV entry per token and layer: [K: kv_heads × head_dim | V: kv_heads × head_dim].
#include "model/architectures.h"
#include "model/layers.h"
#include "model/rope.h"

namespace di {
namespace {

struct GqaLayer {
  Tensor input_norm, post_norm;
  Tensor qkv, qkv_bias;  // [(Hq + 2·Hkv)·D, H], bias optional
  Tensor o_proj, o_bias;
  Tensor q_norm, k_norm;  // [D] (Qwen3)
  FeedForward ffn;
};

class GqaModel final : public Model {
 public:
  GqaModel(ModelConfig config, Backend& backend, const Checkpoint& ck, const LoadOptions& opts)
      : Model(std::move(config), backend) {
    const ModelConfig& c = config_;
    WeightLoader w(ck, backend, c, opts.random);
    w.set_round_to_bf16(opts.round_weights_to_bf16);
    const int64_t hidden = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads,
                  hkv = c.num_key_value_heads;
    ends_ = DecoderEnds::load(w, c);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      GqaLayer L;
      L.input_norm = w.load(p + "input_layernorm.weight", {hidden});
      L.post_norm = w.load(p + "post_attention_layernorm.weight", {hidden});
      L.qkv = w.load_concat_rows(
          {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"},
          {{hq * d, hidden}, {hkv * d, hidden}, {hkv * d, hidden}});
      if (w.has(p + "self_attn.q_proj.bias")) {
        Tensor qb = w.load_host_f32(p + "self_attn.q_proj.bias", {hq * d});
        Tensor kb = w.load_host_f32(p + "self_attn.k_proj.bias", {hkv * d});
        Tensor vb = w.load_host_f32(p + "self_attn.v_proj.bias", {hkv * d});
        Tensor all = Tensor::empty({(hq + 2 * hkv) * d}, DType::kF32);
        std::copy(qb.f32(), qb.f32() + qb.numel(), all.f32());
        std::copy(kb.f32(), kb.f32() + kb.numel(), all.f32() + hq * d);
        std::copy(vb.f32(), vb.f32() + vb.numel(), all.f32() + (hq + hkv) * d);
        L.qkv_bias = w.upload(all);
      }
      L.o_proj = w.load(p + "self_attn.o_proj.weight", {hidden, hq * d});
      L.o_bias = w.load_optional(p + "self_attn.o_proj.bias", {hidden});
      if (c.arch != Arch::kLlama) {
        L.q_norm = w.load(p + "self_attn.q_norm.weight", {d});
        L.k_norm = w.load(p + "self_attn.k_norm.weight", {d});
      }
      if (c.is_moe_layer(l)) {
        L.ffn.is_moe = true;
        MoeBlock& m = L.ffn.moe;
        m.gate = w.load(p + "mlp.gate.weight", {c.num_experts, hidden});
        m.experts = w.load_experts(p + "mlp.experts.", c.num_experts, hidden, c.moe_intermediate_size);
        m.routing.scoring = MoeRoutingParams::Scoring::kSoftmax;
        m.routing.num_experts = static_cast<int32_t>(c.num_experts);
        m.routing.top_k = static_cast<int32_t>(c.num_experts_per_tok);
        m.routing.renormalize = c.norm_topk_prob;
      } else {
        L.ffn.mlp = Mlp::load(w, p + "mlp.", hidden, c.intermediate_size);
      }
      layers_.push_back(std::move(L));
    }
    max_context_ = opts.max_context > 0 ? opts.max_context : c.max_position_embeddings;
    cos_sin_ = w.upload(make_cos_sin_table(compute_rope(c.rope, d, c.max_position_embeddings), max_context_));
  }

  int32_t kv_entry_size() const override {
    return static_cast<int32_t>(2 * config_.num_key_value_heads * config_.head_dim);
  }

  std::vector<MoeBlock*> moe_blocks() override {  // EPLB (issue #8)
    std::vector<MoeBlock*> out;
    for (GqaLayer& L : layers_)
      if (L.ffn.is_moe) out.push_back(&L.ffn.moe);
    return out;
  }

  Tensor forward(const Tensor& token_ids, const PagedBatch& batch, Tensor& pool,
                 const Tensor& logit_rows) override {
    Backend& be = backend_;
    const ModelConfig& c = config_;
    const DType dt = be.compute_dtype();
    const int64_t t = token_ids.numel(), hidden = c.hidden_size, d = c.head_dim,
                  hq = c.num_attention_heads, hkv = c.num_key_value_heads;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const KvLayout layout = kv_layout(static_cast<int32_t>(pool.size(0)), static_cast<int32_t>(pool.size(2)));

    Tensor x = be.empty({t, hidden}, dt);
    be.embedding(token_ids, ends_.embed, x);
    Tensor qkv = be.empty({t, (hq + 2 * hkv) * d}, dt);
    Tensor q = be.empty({t, hq, d}, dt);
    Tensor attn = be.empty({t, hq, d}, dt);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const GqaLayer& L = layers_[l];
      norm_linear(be, x, L.input_norm, eps, L.qkv, L.qkv_bias.is_null() ? nullptr : &L.qkv_bias,
                  qkv);
      // split qkv, [q/k norm], rope, k/v -> pool, attention -> attn: one op (one kernel on CUDA
      // for decode batches).
      QkvRopeStoreParams qp;
      qp.qkv = &qkv;
      qp.q_out = &q;
      qp.pool = &pool;
      qp.layout = layout;
      qp.layer = static_cast<int32_t>(l);
      qp.num_q_heads = static_cast<int32_t>(hq);
      qp.num_kv_heads = static_cast<int32_t>(hkv);
      qp.head_dim = static_cast<int32_t>(d);
      qp.q_norm = L.q_norm.is_null() ? nullptr : &L.q_norm;
      qp.k_norm = L.k_norm.is_null() ? nullptr : &L.k_norm;
      qp.eps = eps;
      qp.cos_sin = &cos_sin_;
      qp.batch = &batch;
      PagedAttentionParams ap;
      ap.q = &q;
      ap.out = &attn;
      ap.pool = &pool;
      ap.layout = layout;
      ap.layer = static_cast<int32_t>(l);
      ap.num_q_heads = static_cast<int32_t>(hq);
      ap.num_kv_heads = static_cast<int32_t>(hkv);
      ap.head_dim_qk = ap.head_dim_v = static_cast<int32_t>(d);
      ap.k_offset = 0;
      ap.v_offset = static_cast<int32_t>(hkv * d);
      ap.kv_head_stride = static_cast<int32_t>(d);
      ap.scale = static_cast<float>(c.attention_scale());
      ap.batch = &batch;
      be.qkv_rope_attention(qp, ap);  // q is scratch: a fused implementation keeps it on chip
      linear_add(be, attn.reshape({t, hq * d}), L.o_proj, L.o_bias.is_null() ? nullptr : &L.o_bias,
                 x);
      L.ffn.forward_residual(be, x, L.post_norm, eps);
    }
    return ends_.logits(be, x, logit_rows, eps);
  }

 private:
  DecoderEnds ends_;
  std::vector<GqaLayer> layers_;
  Tensor cos_sin_;
};

}  // namespace

std::unique_ptr<Model> make_gqa_model(const ModelConfig& config, Backend& backend,
                                      const Checkpoint& ck, const LoadOptions& opts) {
  return std::make_unique<GqaModel>(config, backend, ck, opts);
}

}  // namespace di
