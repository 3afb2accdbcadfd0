// The multi-head latent attention family: DeepseekV2ForCausalLM and DeepseekV3ForCausalLM.
//
// Attention runs absorbed: the cache holds, per token and layer, only the normalised latent
// c = kv_a_layernorm(x·W_kvᵃ)[:L] and the roped key k_pe (L + R values, e.g. 512 + 64), and all
// heads share it as one KV head:
//   score_h(t, j) = (W_UK,hᵀ q_nope,h) · c_j + q_pe,h · k_pe,j        (W_UK,h: rows of kv_b_proj)
//   out_h = W_UV,h · Σ_j softmax_j · c_j
// which equals Hugging Face's non-absorbed computation up to fp32 reassociation.
//
// MoE: softmax routing (V2) or sigmoid + e_score_correction_bias (V3), group-limited top-k,
// shared experts, routed_scaling_factor; the first `first_k_dense_replace` layers are dense.
// The MTP layers (V3, `num_nextn_predict_layers`) are loaded for speculative decoding.
#include "model/architectures.h"
#include "model/layers.h"
#include "model/rope.h"

namespace di {
namespace {

struct MlaLayer {
  Tensor input_norm, post_norm;
  // The projections of x: q_proj [Hq·(dn+dr), H] (q_lora_rank == 0) or q_a_proj [Lq, H], and
  // kv_a_proj_with_mqa [L + dr, H]. Normally one weight q_kv_a = [q part ; kv_a] (Q + L + dr
  // rows; one GEMM whose output columns are [q part | latent | k_pe]); q_in and kv_a_proj apart
  // instead when concatenating would dequantize an FP8 weight the backend takes (load_layer).
  Tensor q_kv_a;
  Tensor q_in, kv_a_proj;
  Tensor q_a_norm, q_b;            // [Lq], [Hq·(dn+dr), Lq] when q_lora_rank > 0
  Tensor kv_a_norm;                // [L]
  Tensor w_uk_t;                   // [Hq, L, dn]   (transposed k_nope rows of kv_b_proj)
  Tensor w_uv;                     // [Hq, dv, L]   (v rows of kv_b_proj)
  Tensor o_proj;                   // [H, Hq·dv]
  FeedForward ffn;
};

// DeepSeek's multi-token-prediction module: h' = layer(eh_proj([hnorm(h); enorm(emb(t+1))])).
struct MtpLayer {
  Tensor enorm, hnorm, eh_proj;  // [H], [H], [H, 2H]
  Tensor head_norm, head;        // shared_head.norm [H], shared_head.head [V, H]
  Tensor embed;                  // [V, H] (absent in some checkpoints: the main embedding is shared)
  MlaLayer layer;
};

// HF's DeepSeek attention builds its q/kv norms with the default eps (1e-6), not rms_norm_eps.
constexpr float kLoraNormEps = 1e-6f;

class MlaModel final : public Model {
 public:
  MlaModel(ModelConfig config, Backend& backend, const Checkpoint& ck, const LoadOptions& opts)
      : Model(std::move(config), backend) {
    const ModelConfig& c = config_;
    WeightLoader w(ck, backend, c, opts.random);
    w.set_round_to_bf16(opts.round_weights_to_bf16);
    ends_ = DecoderEnds::load(w, c);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      layers_.push_back(load_layer(w, "model.layers." + std::to_string(l) + ".", l));
    }
    for (int64_t m = 0; m < c.num_nextn_predict_layers; ++m) {
      const int64_t idx = c.num_hidden_layers + m;
      const std::string p = "model.layers." + std::to_string(idx) + ".";
      if (!w.has(p + "eh_proj.weight")) break;  // config announces MTP, checkpoint omits it
      MtpLayer t;
      const int64_t hidden = c.hidden_size;
      t.enorm = w.load(p + "enorm.weight", {hidden});
      t.hnorm = w.load(p + "hnorm.weight", {hidden});
      t.eh_proj = w.load(p + "eh_proj.weight", {hidden, 2 * hidden});
      t.head_norm = w.load(p + "shared_head.norm.weight", {hidden});
      t.head = w.load_optional(p + "shared_head.head.weight", {c.vocab_size, hidden});
      t.embed = w.load_optional(p + "embed_tokens.weight", {c.vocab_size, hidden});
      // The MTP block's MoE follows the model's MoE layout.
      t.layer = load_layer(w, p, std::max<int64_t>(idx, c.first_k_dense_replace));
      mtp_.push_back(std::move(t));
    }
    max_context_ = opts.max_context > 0 ? opts.max_context : c.max_position_embeddings;
    cos_sin_ = w.upload(make_cos_sin_table(
        compute_rope(c.rope, c.qk_rope_head_dim, c.max_position_embeddings), max_context_));
  }

  int32_t kv_entry_size() const override {
    return static_cast<int32_t>(config_.kv_lora_rank + config_.qk_rope_head_dim);
  }
  int64_t num_mtp_layers() const override { return static_cast<int64_t>(mtp_.size()); }

  std::vector<MoeBlock*> moe_blocks() override {  // EPLB (issue #8); MTP layers excluded
    std::vector<MoeBlock*> out;
    for (MlaLayer& L : layers_)
      if (L.ffn.is_moe) out.push_back(&L.ffn.moe);
    return out;
  }

  Tensor forward(const Tensor& token_ids, const PagedBatch& batch, Tensor& pool,
                 const Tensor& logit_rows) override {
    Backend& be = backend_;
    const ModelConfig& c = config_;
    const DType dt = be.compute_dtype();
    const int64_t t = token_ids.numel(), hidden = c.hidden_size;
    const float eps = static_cast<float>(c.rms_norm_eps);
    const KvLayout layout = kv_layout(static_cast<int32_t>(pool.size(0)), static_cast<int32_t>(pool.size(2)));

    Tensor x = be.empty({t, hidden}, dt);
    be.embedding(token_ids, ends_.embed, x);
    Tensor h = be.empty({t, hidden}, dt);
    // x is the residual stream; the norms, residual adds and silu·mul ride on the neighbouring
    // linear layers (Backend::fused_linear, FeedForward::forward_residual); h: scratch for norm(x)
    // when the q and kv_a projections are two GEMMs.
    for (size_t l = 0; l < layers_.size(); ++l) {
      const MlaLayer& L = layers_[l];
      attention(L, static_cast<int32_t>(l), x, eps, h, batch, pool, layout);
      L.ffn.forward_residual(be, x, L.post_norm, eps);
    }
    return ends_.logits(be, x, logit_rows, eps);
  }

 private:
  MlaLayer load_layer(WeightLoader& w, const std::string& p, int64_t layer_idx) {
    const ModelConfig& c = config_;
    const int64_t hidden = c.hidden_size, hq = c.num_attention_heads, dn = c.qk_nope_head_dim,
                  dr = c.qk_rope_head_dim, dv = c.v_head_dim, lat = c.kv_lora_rank;
    MlaLayer L;
    L.input_norm = w.load(p + "input_layernorm.weight", {hidden});
    L.post_norm = w.load(p + "post_attention_layernorm.weight", {hidden});
    const std::string a = p + "self_attn.";
    const std::string q_name = a + (c.q_lora_rank > 0 ? "q_a_proj.weight" : "q_proj.weight");
    const std::string kv_name = a + "kv_a_proj_with_mqa.weight";
    const Shape q_shape{q_width(), hidden}, kv_shape{lat + dr, hidden};
    // Concatenated unless that turns an FP8 weight the backend takes into bf16: DeepSeek-V3 FP8
    // on CUDA keeps q_a_proj (1536 rows) in FP8 but not kv_a (576 rows, no multiple of 128), so
    // the pair could not stay FP8 and it keeps two GEMMs instead of doubling q_a_proj's bytes.
    const bool concat = w.keeps_fp8({q_name, kv_name}, {q_shape, kv_shape}) ||
                        !(w.keeps_fp8({q_name}, {q_shape}) || w.keeps_fp8({kv_name}, {kv_shape}));
    if (concat) {
      L.q_kv_a = w.load_concat_rows({q_name, kv_name}, {q_shape, kv_shape});
    } else {
      L.q_in = w.load(q_name, q_shape);
      L.kv_a_proj = w.load(kv_name, kv_shape);
    }
    if (c.q_lora_rank > 0) {
      L.q_a_norm = w.load(a + "q_a_layernorm.weight", {c.q_lora_rank});
      L.q_b = w.load(a + "q_b_proj.weight", {hq * (dn + dr), c.q_lora_rank});
    }
    L.kv_a_norm = w.load(a + "kv_a_layernorm.weight", {lat});
    // Split kv_b_proj [Hq·(dn+dv), L] into the absorbed per-head matrices.
    Tensor kv_b = w.load_host_f32(a + "kv_b_proj.weight", {hq * (dn + dv), lat});
    Tensor uk_t = Tensor::empty({hq, lat, dn}, DType::kF32);
    Tensor uv = Tensor::empty({hq, dv, lat}, DType::kF32);
    for (int64_t head = 0; head < hq; ++head) {
      const float* rows = kv_b.f32() + head * (dn + dv) * lat;
      for (int64_t i = 0; i < dn; ++i)
        for (int64_t j = 0; j < lat; ++j) uk_t.f32()[(head * lat + j) * dn + i] = rows[i * lat + j];
      std::copy(rows + dn * lat, rows + (dn + dv) * lat, uv.f32() + head * dv * lat);
    }
    L.w_uk_t = w.upload(uk_t);
    L.w_uv = w.upload(uv);
    L.o_proj = w.load(a + "o_proj.weight", {hidden, hq * dv});
    if (c.is_moe_layer(layer_idx)) {
      L.ffn.is_moe = true;
      MoeBlock& m = L.ffn.moe;
      m.gate = w.load(p + "mlp.gate.weight", {c.num_experts, hidden});
      if (c.arch == Arch::kDeepseekV3 || w.has(p + "mlp.gate.e_score_correction_bias"))
        m.correction_bias = w.load_host_f32(p + "mlp.gate.e_score_correction_bias", {c.num_experts});
      m.experts = w.load_experts(p + "mlp.experts.", c.num_experts, hidden, c.moe_intermediate_size);
      if (c.n_shared_experts > 0) {
        m.has_shared = true;
        m.shared = Mlp::load(w, p + "mlp.shared_experts.", hidden,
                             c.moe_intermediate_size * c.n_shared_experts);
      }
      MoeRoutingParams& r = m.routing;
      r.num_experts = static_cast<int32_t>(c.num_experts);
      r.top_k = static_cast<int32_t>(c.num_experts_per_tok);
      r.scaling = static_cast<float>(c.routed_scaling_factor);
      if (c.topk_method != "greedy") {
        r.num_groups = static_cast<int32_t>(c.n_group);
        r.topk_groups = static_cast<int32_t>(c.topk_group);
      }
      if (c.scoring_func == "sigmoid") {
        // V3: select on sigmoid + bias, group score = sum of the group's two best, weights from
        // the unbiased sigmoid, renormalised when norm_topk_prob, then scaled.
        r.scoring = MoeRoutingParams::Scoring::kSigmoid;
        r.group_score = MoeRoutingParams::GroupScore::kTopTwoSum;
        r.renormalize = c.norm_topk_prob;
        r.renorm_eps = 1e-20f;
      } else {
        // V2: softmax scores, group score = the group's best. DeepSeek-V2 renormalises instead of
        // scaling when norm_topk_prob is set (top_k > 1); HF 5.x always scales, and both agree
        // for the released checkpoints (norm_topk_prob false).
        r.scoring = MoeRoutingParams::Scoring::kSoftmax;
        r.group_score = MoeRoutingParams::GroupScore::kMax;
        if (c.norm_topk_prob && c.num_experts_per_tok > 1) {
          r.renormalize = true;
          r.renorm_eps = 1e-20f;
          r.scaling = 1.0f;
        }
      }
    } else {
      L.ffn.mlp = Mlp::load(w, p + "mlp.", hidden, c.intermediate_size);
    }
    return L;
  }

  // Columns of the q projection's output: Hq·(dn+dr) (q_proj) or Lq (q_a_proj).
  int64_t q_width() const {
    const ModelConfig& c = config_;
    return c.q_lora_rank > 0 ? c.q_lora_rank
                             : c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  }

  // Decode at batch 1 is launch-bound, so the block is few kernels (docs/cuda_backend.md):
  //   linear [q | kv_a] -> (q_lora: rms_norm, q_b) -> mla_rope_store with W_UK (one kernel on
  //   CUDA) -> paged_attention (q = q_lat, q_rope = q_pe) with W_UV (head_w) -> linear o_proj
  // x += o_proj(MLA(norm(x))). h: [T, hidden] scratch for norm(x) when the q and kv_a
  // projections are two GEMMs (the fused one reads x and normalises on the way).
  void attention(const MlaLayer& L, int32_t layer, Tensor& x, float eps, Tensor& h,
                 const PagedBatch& batch, Tensor& pool, const KvLayout& layout) {
    Backend& be = backend_;
    const ModelConfig& c = config_;
    const DType dt = be.compute_dtype();
    const int64_t t = x.size(0), hq = c.num_attention_heads, dn = c.qk_nope_head_dim,
                  dr = c.qk_rope_head_dim, dv = c.v_head_dim, lat = c.kv_lora_rank, qw = q_width();
    // The projections: [q part | latent | k_pe] per token, in one tensor or two.
    Tensor proj, q_part, kv_a;
    if (!L.q_kv_a.is_null()) {
      proj = be.empty({t, qw + lat + dr}, dt);
      norm_linear(be, x, L.input_norm, eps, L.q_kv_a, nullptr, proj);
    } else {
      be.rms_norm(x, L.input_norm, eps, h);
      q_part = be.empty({t, qw}, dt);
      be.linear(h, L.q_in, nullptr, q_part);
      kv_a = be.empty({t, lat + dr}, dt);
      be.linear(h, L.kv_a_proj, nullptr, kv_a);
    }
    MlaRopeStoreParams rp;
    rp.q = proj.is_null() ? &q_part : &proj;
    rp.q_col = 0;
    rp.kv_a = proj.is_null() ? &kv_a : &proj;
    rp.kv_col = static_cast<int32_t>(proj.is_null() ? 0 : qw);
    Tensor q;  // with q_lora: q_b(rms_norm(q_a)) = [q_nope | q_pe] per head
    if (c.q_lora_rank > 0) {
      Tensor qa = q_part;
      if (qa.is_null() && t == 1) {
        // One token (batch-1 decode): its q_a columns are contiguous, so a view of them.
        qa = proj.reshape({qw + lat + dr, 1}).slice_rows(0, qw).reshape({1, qw});
      } else if (qa.is_null()) {
        // TODO(#6): an rms_norm reading a row stride would read q_a in place here too.
        qa = be.empty({t, qw}, dt);
        be.copy_columns(proj, 0, qa);
      }
      q = be.empty({t, hq * (dn + dr)}, dt);
      norm_linear(be, qa, L.q_a_norm, kLoraNormEps, L.q_b, nullptr, q);
      rp.q = &q;
    }
    // q_nope, roped q_pe, and the new tokens' cache entries [normalised latent | roped k_pe].
    Tensor q_nope = be.empty({t, hq, dn}, dt);
    Tensor q_pe = be.empty({t, hq, dr}, dt);
    rp.q_nope = &q_nope;
    rp.q_pe = &q_pe;
    rp.pool = &pool;
    rp.layout = layout;
    rp.layer = layer;
    rp.num_heads = static_cast<int32_t>(hq);
    rp.nope_dim = static_cast<int32_t>(dn);
    rp.rope_dim = static_cast<int32_t>(dr);
    rp.latent_dim = static_cast<int32_t>(lat);
    rp.kv_a_norm = &L.kv_a_norm;
    rp.eps = kLoraNormEps;
    rp.cos_sin = &cos_sin_;
    rp.interleaved = c.rope_interleave;
    rp.batch = &batch;
    // W_UK absorbed into the query in the same op: q_lat[t, h] = W_UK,hᵀ q_nope[t, h]; attention
    // reads the query [q_lat | q_pe] from the two tensors.
    Tensor q_lat = be.empty({t, hq, lat}, dt);
    rp.w_uk_t = &L.w_uk_t;
    rp.q_lat = &q_lat;
    be.mla_rope_store(rp);
    Tensor o_lat = be.empty({t, hq, lat}, dt);
    PagedAttentionParams ap;
    ap.q = &q_lat;
    ap.q_rope = &q_pe;
    ap.out = &o_lat;
    ap.pool = &pool;
    ap.layout = layout;
    ap.layer = layer;
    ap.num_q_heads = static_cast<int32_t>(hq);
    ap.num_kv_heads = 1;
    ap.head_dim_qk = static_cast<int32_t>(lat + dr);
    ap.head_dim_v = static_cast<int32_t>(lat);
    ap.k_offset = 0;
    ap.v_offset = 0;
    ap.kv_head_stride = 0;
    ap.scale = static_cast<float>(c.attention_scale());
    ap.batch = &batch;
    // W_UV in the same op: a backend may merge the attention's partials inside it (CUDA, batch
    // 1); o_lat is then scratch.
    Tensor o_heads = be.empty({t, hq, dv}, dt);
    ap.head_w = &L.w_uv;
    ap.head_out = &o_heads;
    be.paged_attention(ap);
    linear_add(be, o_heads.reshape({t, hq * dv}), L.o_proj, nullptr, x);
  }

  DecoderEnds ends_;
  std::vector<MlaLayer> layers_;
  std::vector<MtpLayer> mtp_;
  Tensor cos_sin_;
};

}  // namespace

std::unique_ptr<Model> make_mla_model(const ModelConfig& config, Backend& backend,
                                      const Checkpoint& ck, const LoadOptions& opts) {
  return std::make_unique<MlaModel>(config, backend, ck, opts);
}

}  // namespace di
