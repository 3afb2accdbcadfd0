"""The deepinfer demo model: a small DeepSeek-V3 (MLA + MoE + one MTP layer) for training and export.

The math mirrors HF transformers' `modeling_deepseek_v3.py` so that an exported checkpoint loads in
`DeepseekV3ForCausalLM` with the same logits:
  * RMSNorm in fp32: w * (x * rsqrt(mean(x^2) + eps)).
  * MLA without weight absorption: q = q_b(norm(q_a(x))), [k_nope | v] = kv_b(norm(c_kv)),
    k_rope shared by all heads; scale = (qk_nope + qk_rope)^-0.5 (no YaRN).
  * RoPE with `rope_interleave=True`: the rope part of q and k is first de-interleaved
    (x0,x1,x2,x3,... -> x0,x2,...,x1,x3,...) and then rotated with rotate_half and
    cos/sin = cat(freqs, freqs). This equals DeepSeek's complex rotation of (x0,x1),(x2,x3),... pairs.
  * Router: sigmoid(x W^T) in fp32; choice uses scores + e_score_correction_bias, groups ranked by the
    sum of their top-2 choice scores, `topk_group` groups kept (others filled with 0.0, as HF does),
    top-k experts; weights are the raw sigmoid scores of the chosen experts, normalised to sum 1
    (norm_topk_prob) and multiplied by routed_scaling_factor. Shared experts are added unweighted.
  * MTP layer (DeepSeek-V3 report, laid out as in DeepSeek's checkpoints and vLLM/SGLang):
    m = eh_proj(cat(enorm(embed(t_{i+1})), hnorm(h_i))), h_i = the main model's final-normed hidden state
    at position i; m goes through one decoder layer (MoE), then shared_head.norm and shared_head.head;
    it predicts t_{i+2}. embed and head are shared with the main model (copies in the checkpoint).

Training-only choices: routed experts are stored stacked ([E, 2I, H] gate|up and [E, H, I] down) and
run on tokens sorted by expert; the router bias is not trained by gradient but by DeepSeek's
auxiliary-loss-free rule (see `update_router_bias`). Works on torch 1.13 (CPU) and 2.x (CUDA).
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Configuration


def demo_config(vocab_size=8192, preset="demo"):
    """HF DeepseekV3Config fields for the demo model (plus DeepSeek's own V3 config keys)."""
    if preset == "demo":
        dims = dict(hidden_size=256, intermediate_size=768, moe_intermediate_size=128, num_hidden_layers=5,
                    num_attention_heads=4, q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=48,
                    qk_rope_head_dim=16, v_head_dim=64, n_routed_experts=16, n_group=4, topk_group=2,
                    num_experts_per_tok=4)
    elif preset == "tiny":  # CPU tests only
        dims = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
                    num_attention_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                    qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_group=4, topk_group=2,
                    num_experts_per_tok=2)
    else:
        raise ValueError(f"unknown preset {preset!r}")
    cfg = dict(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        vocab_size=vocab_size,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        hidden_act="silu",
        max_position_embeddings=4096,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        use_cache=True,
        pad_token_id=None,
        bos_token_id=0,
        eos_token_id=1,
        pretraining_tp=1,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rope_scaling=None,
        rope_interleave=True,
        attention_bias=False,
        attention_dropout=0.0,
        num_nextn_predict_layers=1,
        # DeepSeek V3's own config.json keys (ignored by HF, read by other engines).
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        ep_size=1,
        torch_dtype="bfloat16",
        dtype="bfloat16",
    )
    cfg.update(dims)
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    # transformers 5.x reads RoPE settings from rope_parameters; 4.x from rope_theta/rope_scaling.
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    return cfg


# ---------------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope_interleaved(x, cos, sin):
    """x: [B, heads, T, d_rope]; cos/sin: [T, d_rope] (cat(freqs, freqs)). HF `rope_interleave=True`."""
    b, h, t, d = x.shape
    x = x.reshape(b, h, t, d // 2, 2).transpose(3, 4).reshape(b, h, t, d)
    return x * cos + rotate_half(x) * sin


def rope_cos_sin(cfg, positions, device):
    d = cfg["qk_rope_head_dim"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def causal_attention(q, k, v, scale):
    if hasattr(F, "scaled_dot_product_attention"):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        except TypeError:  # torch 2.0 has no `scale` argument
            q = q * (scale * math.sqrt(q.shape[-1]))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    att = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    att = torch.softmax(att.float(), dim=-1).to(q.dtype)
    return torch.matmul(att, v)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.d_nope = cfg["qk_nope_head_dim"]
        self.d_rope = cfg["qk_rope_head_dim"]
        self.d_v = cfg["v_head_dim"]
        self.kv_rank = cfg["kv_lora_rank"]
        self.scale = (self.d_nope + self.d_rope) ** -0.5
        self.q_a_proj = nn.Linear(h, cfg["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(cfg["q_lora_rank"], 1e-6)  # HF uses the default eps here
        self.q_b_proj = nn.Linear(cfg["q_lora_rank"], self.nh * (self.d_nope + self.d_rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_rank + self.d_rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, 1e-6)
        self.kv_b_proj = nn.Linear(self.kv_rank, self.nh * (self.d_nope + self.d_v), bias=False)
        self.o_proj = nn.Linear(self.nh * self.d_v, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, t, self.nh, self.d_nope + self.d_rope).transpose(1, 2)
        q_nope, q_rope = q.split([self.d_nope, self.d_rope], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_rope = ckv.split([self.kv_rank, self.d_rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.nh, self.d_nope + self.d_v).transpose(1, 2)
        k_nope, v = kv.split([self.d_nope, self.d_v], dim=-1)
        k_rope = k_rope.reshape(b, 1, t, self.d_rope)
        q_rope = apply_rope_interleaved(q_rope, cos.to(q_rope.dtype), sin.to(q_rope.dtype))
        k_rope = apply_rope_interleaved(k_rope, cos.to(k_rope.dtype), sin.to(k_rope.dtype))
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(b, self.nh, t, self.d_rope)), dim=-1)
        if q.dtype != v.dtype:
            v = v.to(q.dtype)
        o = causal_attention(q, k, v, self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.d_v))


class MLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        inter = cfg["moe_intermediate_size"]
        self.n_exp = cfg["n_routed_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.n_group = cfg["n_group"]
        self.topk_group = cfg["topk_group"]
        self.norm_topk = cfg["norm_topk_prob"]
        self.scaling = cfg["routed_scaling_factor"]
        self.inter = inter
        if self.n_exp % self.n_group or self.n_exp // self.n_group < 2:
            raise ValueError("n_routed_experts must split into n_group groups of at least 2 experts")
        self.gate_weight = nn.Parameter(torch.empty(self.n_exp, h))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.n_exp, dtype=torch.float32))
        self.w_gate_up = nn.Parameter(torch.empty(self.n_exp, 2 * inter, h))  # [gate; up] per expert
        self.w_down = nn.Parameter(torch.empty(self.n_exp, h, inter))
        self.shared_experts = MLP(h, inter * cfg["n_shared_experts"])
        self.last_load = None  # tokens per expert of the last forward, for the bias update

    def route(self, x):
        """x: [N, H] -> (expert ids [N, k], weights [N, k] fp32). Same math as HF's DeepseekV3TopkRouter."""
        dev_type = x.device.type
        with torch.autocast(device_type=dev_type, enabled=False):
            scores = F.linear(x.float(), self.gate_weight.float()).sigmoid()
        with torch.no_grad():
            choice = scores + self.e_score_correction_bias.unsqueeze(0)
            per_group = self.n_exp // self.n_group
            group_scores = choice.view(-1, self.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
            score_mask = group_mask.unsqueeze(-1).expand(-1, self.n_group, per_group).reshape(-1, self.n_exp)
            choice = choice.masked_fill(~score_mask.bool(), 0.0)
            idx = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * self.scaling

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        n = x2.shape[0]
        idx, w = self.route(x2)
        flat = idx.reshape(-1)
        counts = torch.bincount(flat, minlength=self.n_exp)
        self.last_load = counts.detach()
        order = torch.argsort(flat)
        token = order // self.top_k
        xs = x2.index_select(0, token)
        outs = []
        # One host sync per layer to split by expert: 2 GEMMs per expert on contiguous rows.
        for e, chunk in enumerate(xs.split(counts.tolist())):
            if chunk.shape[0] == 0:
                continue
            gu = F.linear(chunk, self.w_gate_up[e])
            g, u = gu.split(self.inter, dim=-1)
            outs.append(F.linear(F.silu(g) * u, self.w_down[e]))
        y = torch.cat(outs, dim=0)
        y = y.float() * w.reshape(-1).index_select(0, order).unsqueeze(-1)
        routed = torch.zeros(n, shape[-1], dtype=torch.float32, device=x.device).index_add_(0, token, y)
        return routed.to(x.dtype).view(shape) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.is_moe = layer_idx >= cfg["first_k_dense_replace"]
        self.mlp = MoE(cfg) if self.is_moe else MLP(h, cfg["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTPLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = DecoderLayer(cfg, cfg["num_hidden_layers"])
        self.shared_head_norm = RMSNorm(h, eps)


class DemoDeepseekV3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(h, cfg["vocab_size"], bias=False)
        self.mtp = MTPLayer(cfg) if cfg.get("num_nextn_predict_layers", 0) else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        std = self.cfg["initializer_range"]
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            else:
                p.fill_(1.0)  # RMSNorm weights (the only 1-D parameters)
        # Residual-output projections start smaller so the residual stream grows slowly with depth.
        depth = 2 * (self.cfg["num_hidden_layers"] + 1)
        for m in self.modules():
            if isinstance(m, MLA):
                m.o_proj.weight.mul_(1.0 / math.sqrt(depth))
            if isinstance(m, MLP):
                m.down_proj.weight.mul_(1.0 / math.sqrt(depth))
            if isinstance(m, MoE):
                m.w_down.mul_(1.0 / math.sqrt(depth))

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def trunk(self, ids):
        """ids [B, T] -> final-normed hidden [B, T, H]."""
        t = ids.shape[1]
        cos, sin = rope_cos_sin(self.cfg, torch.arange(t, device=ids.device), ids.device)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x), (cos, sin)

    def mtp_hidden(self, h_main, next_ids, cos, sin):
        """h_main [B, T, H] at positions i, next_ids [B, T] = tokens i+1 -> MTP hidden for predicting i+2."""
        m = self.mtp
        e = self.embed_tokens(next_ids)
        x = m.eh_proj(torch.cat((m.enorm(e), m.hnorm(h_main)), dim=-1))
        x = m.block(x, cos, sin)
        return m.shared_head_norm(x)

    def forward(self, ids, next_ids=None):
        """Returns (main logits [B, T, V], mtp logits [B, T, V] or None)."""
        h, (cos, sin) = self.trunk(ids)
        logits = self.lm_head(h)
        mtp_logits = None
        if next_ids is not None and self.mtp is not None:
            mtp_logits = self.lm_head(self.mtp_hidden(h, next_ids, cos, sin))
        return logits, mtp_logits

    @torch.no_grad()
    def update_router_bias(self, gamma):
        """DeepSeek-V3 auxiliary-loss-free balancing: b_e += gamma * sign(mean load - load_e).

        The bias is then shifted so that its minimum is 0. A common shift of every expert's bias changes
        neither the group ranking (top-2 sums shift equally) nor the expert choice nor the weights (they use
        the raw scores), but it keeps scores + bias > 0, so HF's 0.0 fill for masked groups and DeepSeek's
        -inf fill pick the same experts.
        """
        for moe in self.moe_layers():
            if moe.last_load is None:
                continue
            load = moe.last_load.float()
            moe.e_score_correction_bias.add_(gamma * torch.sign(load.mean() - load))
            moe.e_score_correction_bias.sub_(moe.e_score_correction_bias.min())


def count_parameters(model):
    """(parameters in the exported checkpoint, of which embedding/head copies). The MTP layer's
    embed_tokens and shared_head.head are exported as copies of the main ones, as DeepSeek does."""
    n = sum(p.numel() for p in model.parameters())
    n += sum(b.numel() for _, b in model.named_buffers() if b.dim() == 1)  # router biases
    emb = model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    if model.mtp is not None:
        n += emb
        emb *= 2
    return n, emb


# ---------------------------------------------------------------------------------------------
# HF / DeepSeek checkpoint layout


def _layer_tensors(prefix, layer):
    out = {
        f"{prefix}.input_layernorm.weight": layer.input_layernorm.weight,
        f"{prefix}.post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
    }
    a = layer.self_attn
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
        out[f"{prefix}.self_attn.{name}.weight"] = getattr(a, name).weight
    out[f"{prefix}.self_attn.q_a_layernorm.weight"] = a.q_a_layernorm.weight
    out[f"{prefix}.self_attn.kv_a_layernorm.weight"] = a.kv_a_layernorm.weight
    mlp = layer.mlp
    if isinstance(mlp, MoE):
        out[f"{prefix}.mlp.gate.weight"] = mlp.gate_weight
        out[f"{prefix}.mlp.gate.e_score_correction_bias"] = mlp.e_score_correction_bias
        for e in range(mlp.n_exp):
            g, u = mlp.w_gate_up[e].split(mlp.inter, dim=0)
            out[f"{prefix}.mlp.experts.{e}.gate_proj.weight"] = g
            out[f"{prefix}.mlp.experts.{e}.up_proj.weight"] = u
            out[f"{prefix}.mlp.experts.{e}.down_proj.weight"] = mlp.w_down[e]
        sh = mlp.shared_experts
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{prefix}.mlp.shared_experts.{name}.weight"] = getattr(sh, name).weight
    else:
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"{prefix}.mlp.{name}.weight"] = getattr(mlp, name).weight
    return out


def checkpoint_tensors(model):
    """name -> tensor in DeepSeek-V3 / HF naming. Router biases stay fp32 (as in DeepSeek's release)."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight,
           "lm_head.weight": model.lm_head.weight}
    for i, layer in enumerate(model.layers):
        out.update(_layer_tensors(f"model.layers.{i}", layer))
    if model.mtp is not None:
        p = f"model.layers.{len(model.layers)}"
        m = model.mtp
        out[f"{p}.enorm.weight"] = m.enorm.weight
        out[f"{p}.hnorm.weight"] = m.hnorm.weight
        out[f"{p}.eh_proj.weight"] = m.eh_proj.weight
        out[f"{p}.shared_head.norm.weight"] = m.shared_head_norm.weight
        out[f"{p}.shared_head.head.weight"] = model.lm_head.weight
        out[f"{p}.embed_tokens.weight"] = model.embed_tokens.weight
        out.update(_layer_tensors(p, m.block))
    return out


@torch.no_grad()
def load_checkpoint_tensors(model, tensors, strict=True):
    """Inverse of checkpoint_tensors (tensors: name -> tensor). Copies into the model's parameters."""
    targets = checkpoint_tensors(model)
    missing = [k for k in targets if k not in tensors]
    unexpected = [k for k in tensors if k not in targets]
    if strict and (missing or unexpected):
        raise RuntimeError(f"checkpoint mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for k, dst in targets.items():
        src = tensors[k]
        if tuple(src.shape) != tuple(dst.shape):
            raise RuntimeError(f"{k}: checkpoint shape {tuple(src.shape)} != model shape {tuple(dst.shape)}")
        dst.copy_(src.to(dst.dtype))  # dst may be a view (expert slices): copy_ writes through
    if model.mtp is not None:
        p = f"model.layers.{len(model.layers)}"
        for a, b in ((f"{p}.embed_tokens.weight", "model.embed_tokens.weight"),
                     (f"{p}.shared_head.head.weight", "lm_head.weight")):
            if not torch.equal(tensors[a], tensors[b]):
                raise RuntimeError(f"{a} differs from {b}; this model shares them")


# ---------------------------------------------------------------------------------------------
# safetensors (written by hand: the format is an 8-byte header length, a JSON header, raw data)

_ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
_ST_RAW = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32}
_ST_BACK = {v: k for k, v in _ST_DTYPES.items()}


def save_safetensors(tensors, path, metadata=None):
    header = {"__metadata__": dict(metadata or {}, format="pt")}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        dt = _ST_DTYPES[t.dtype]
        raw = t.view(_ST_RAW[dt]).numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=_ST_RAW[info["dtype"]]) if b > a else \
            torch.empty(0, dtype=_ST_RAW[info["dtype"]])
        out[name] = raw.view(_ST_BACK[info["dtype"]]).reshape(info["shape"]).clone()
    return out


def export_hf(model, out_dir, tokenizer_dir, extra_metadata=None):
    """Writes config.json, model.safetensors (bf16; router biases fp32), tokenizer files."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(model.cfg)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    tensors = {}
    for k, v in checkpoint_tensors(model).items():
        v = v.detach().float()
        tensors[k] = v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)
    save_safetensors(tensors, os.path.join(out_dir, "model.safetensors"), extra_metadata)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tokenizer_dir, name)
        with open(src, "rb") as fi, open(os.path.join(out_dir, name), "wb") as fo:
            fo.write(fi.read())
    return os.path.getsize(os.path.join(out_dir, "model.safetensors"))


def load_exported(model_dir, device="cpu"):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = DemoDeepseekV3(cfg)
    load_checkpoint_tensors(model, load_safetensors(os.path.join(model_dir, "model.safetensors")))
    return model.to(device).eval()
