#!/usr/bin/env python3
# Copyright 2026 The deepinfer Authors. Apache-2.0.
"""Dry run of scripts/gen_goldens.py without transformers (CPU, torch only).

Puts a small stand-in `transformers` package on sys.path that mimics the 5.x surface the generator uses
(config classes with `rope_parameters`, `from_config` / `from_pretrained(output_loading_info=True)`,
fused runtime experts that `save_pretrained` writes FUSED, `generate`), then runs every model through the
generator's full flow: init, quality gate, save, per-expert rewrite, MTP tensors, legacy config.json,
reload, parameter check, outputs, golden.json. The numbers are meaningless; the flow and the files are
what this checks. The real oracle run happens on the GPU machine with real transformers.

    python3 scripts/check_goldens_local.py
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

FAKE = textwrap.dedent(r'''
    import copy, json, math, os, re
    import torch
    from torch import nn
    import importlib.util as _ilu
    _spec = _ilu.spec_from_file_location("_gg", os.environ["GG_PATH"])
    _gg = _ilu.module_from_spec(_spec); _spec.loader.exec_module(_gg)

    __version__ = "0.0-fake"

    class PreTrainedConfig:
        model_type = "fake"
        def __init__(self, rope_parameters=None, rope_theta=None, rope_scaling=None, **kw):
            for k, v in kw.items():
                setattr(self, k, v)
            if rope_parameters is None:
                rope_parameters = dict(rope_scaling or {})
                rope_parameters.setdefault("rope_type", rope_parameters.pop("type", "default"))
                rope_parameters.pop("type", None)
                rope_parameters["rope_theta"] = rope_theta
            self.rope_parameters = dict(rope_parameters)
            self._attn_implementation = "eager"
        def to_dict(self):
            d = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
            d["model_type"] = self.model_type
            d["architectures"] = [ARCH[self.model_type]]
            return d

    def _cfg(name, mt):
        return type(name, (PreTrainedConfig,), {"model_type": mt})
    LlamaConfig = _cfg("LlamaConfig", "llama")
    Qwen3Config = _cfg("Qwen3Config", "qwen3")
    Qwen3MoeConfig = _cfg("Qwen3MoeConfig", "qwen3_moe")
    DeepseekV2Config = _cfg("DeepseekV2Config", "deepseek_v2")
    DeepseekV3Config = _cfg("DeepseekV3Config", "deepseek_v3")
    CFG = {c.model_type: c for c in (LlamaConfig, Qwen3Config, Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config)}
    ARCH = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}

    class GenerationConfig:
        def __init__(self):
            self.eos_token_id = None; self.bos_token_id = None; self.pad_token_id = None
            self.do_sample = False; self.num_beams = 1; self.max_new_tokens = None; self.min_new_tokens = None

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__(); self.weight = nn.Parameter(torch.ones(n))
        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    class Experts(nn.Module):
        def __init__(self, c):
            super().__init__()
            e = c.get("n_routed_experts") or c.get("num_experts"); h = c["hidden_size"]; i = c["moe_intermediate_size"]
            self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, h))
            self.down_proj = nn.Parameter(torch.zeros(e, h, i))

    class Router(nn.Module):
        def __init__(self, c, bias):
            super().__init__()
            e = c.get("n_routed_experts") or c.get("num_experts")
            self.weight = nn.Parameter(torch.zeros(e, c["hidden_size"]))
            if bias:
                self.register_buffer("e_score_correction_bias", torch.zeros(e))

    class Moe(nn.Module):
        def __init__(self, c, mt):
            super().__init__()
            self.c = c; self.mt = mt
            self.experts = Experts(c)
            self.gate = Router(c, mt == "deepseek_v3")
            if mt.startswith("deepseek"):
                self.shared_experts = Mlp(c, c["moe_intermediate_size"])
            if mt == "deepseek_v2":
                self.topk_method = c["topk_method"]
        def forward(self, x):
            sh = x.shape; x = x.reshape(-1, sh[-1])
            p = (x @ self.gate.weight.t()).softmax(-1)
            k = self.c["num_experts_per_tok"]
            if self.mt == "deepseek_v2":
                _ = self.num_experts  # the HF bug the generator patches
            w, idx = p.topk(k, -1)
            out = torch.zeros_like(x)
            for t in range(x.shape[0]):
                for j in range(k):
                    e = int(idx[t, j])
                    g, u = (self.experts.gate_up_proj[e] @ x[t]).chunk(2)
                    out[t] += w[t, j] * (self.experts.down_proj[e] @ (nn.functional.silu(g) * u))
            out = out.reshape(sh)
            if hasattr(self, "shared_experts"):
                out = out + self.shared_experts(x.reshape(sh))
            return out

    class Mlp(nn.Module):
        def __init__(self, c, i):
            super().__init__()
            h = c["hidden_size"]
            self.gate_proj = nn.Linear(h, i, bias=False); self.up_proj = nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)
        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Attn(nn.Module):
        def __init__(self, c):
            super().__init__()
            h = c["hidden_size"]
            self.q_proj = nn.Linear(h, h, bias=False); self.k_proj = nn.Linear(h, h, bias=False)
            self.v_proj = nn.Linear(h, h, bias=False); self.o_proj = nn.Linear(h, h, bias=False)
            self.scaling = h ** -0.5
        def forward(self, x):
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            s = (q @ k.transpose(-1, -2)) * self.scaling
            n = x.shape[-2]
            s = s.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1), -1e9)
            return self.o_proj(s.softmax(-1) @ v)

    class Layer(nn.Module):
        def __init__(self, c, mt, i):
            super().__init__()
            self.self_attn = Attn(c)
            self.input_layernorm = RMSNorm(c["hidden_size"]); self.post_attention_layernorm = RMSNorm(c["hidden_size"])
            dense = i in c.get("mlp_only_layers", []) or i < c.get("first_k_dense_replace", 0)
            self.mlp = Mlp(c, c["intermediate_size"]) if (dense or mt in ("llama", "qwen3")) else Moe(c, mt)
        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.tensor([1.0, 0.1]), persistent=False)
            self.attention_scaling = 1.0; self.rope_type = "default"

    class Inner(nn.Module):
        def __init__(self, c, mt):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
            self.layers = nn.ModuleList(Layer(c, mt, i) for i in range(c["num_hidden_layers"]))
            self.norm = RMSNorm(c["hidden_size"]); self.rotary_emb = Rotary()

    class Out:
        def __init__(self, logits): self.logits = logits

    class CausalLM(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config; c = config.__dict__; mt = config.model_type
            self.model = Inner(c, mt)
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
            if c.get("tie_word_embeddings"):
                self.lm_head.weight = self.model.embed_tokens.weight
            self.generation_config = GenerationConfig()
        def forward(self, input_ids, use_cache=False, **kw):
            x = self.model.embed_tokens(input_ids)
            for l in self.model.layers:
                x = l(x)
            return Out(self.lm_head(self.model.norm(x)))
        def generate(self, input_ids, attention_mask=None, generation_config=None, use_cache=True):
            seq = input_ids
            for _ in range(generation_config.max_new_tokens):
                t = self(seq).logits[:, -1].argmax(-1, keepdim=True)
                seq = torch.cat([seq, t], 1)
            return seq
        def save_pretrained(self, d, safe_serialization=True):
            sd = {k: v for k, v in self.state_dict().items()}
            if self.config.__dict__.get("tie_word_embeddings"):
                sd.pop("lm_head.weight")
            _gg.write_safetensors(os.path.join(d, "model.safetensors"), sd, force_own=True)  # fused, like old 5.x
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(self.config.to_dict(), f)
            with open(os.path.join(d, "generation_config.json"), "w") as f:
                json.dump({}, f)

    for _a in ARCH.values():
        globals()[_a] = type(_a, (CausalLM,), {})

    class AutoModelForCausalLM:
        @staticmethod
        def from_config(cfg, attn_implementation=None, experts_implementation=None):
            if experts_implementation is not None and cfg.model_type in ("llama", "qwen3"):
                raise ValueError("this model has no experts")  # exercises the fallback
            return globals()[ARCH[cfg.model_type]](cfg)
        @staticmethod
        def from_pretrained(d, dtype=None, attn_implementation=None, experts_implementation=None,
                            output_loading_info=False):
            with open(os.path.join(d, "config.json")) as f:
                raw = json.load(f)
            mt = raw.pop("model_type"); raw.pop("architectures", None)
            cfg = CFG[mt](**raw)
            m = AutoModelForCausalLM.from_config(cfg, experts_implementation=experts_implementation)
            sd = _gg.read_safetensors(os.path.join(d, "model.safetensors"))
            # per-expert -> fused, as the 5.x loader's conversion mapping does
            fused = {}
            for k in list(sd):
                mm = re.match(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
                if mm:
                    fused.setdefault(mm.group(1), {}).setdefault(mm.group(3), {})[int(mm.group(2))] = sd.pop(k)
            for p, parts in fused.items():
                n = len(parts["gate_proj"])
                sd[p + ".gate_up_proj"] = torch.stack([torch.cat([parts["gate_proj"][e], parts["up_proj"][e]], 0)
                                                       for e in range(n)])
                sd[p + ".down_proj"] = torch.stack([parts["down_proj"][e] for e in range(n)])
            own = m.state_dict()
            unexpected = sorted(k for k in sd if k not in own)
            missing = sorted(k for k in own if k not in sd and not (k == "lm_head.weight" and cfg.tie_word_embeddings))
            m.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
            info = {"missing_keys": missing, "unexpected_keys": unexpected, "mismatched_keys": [], "error_msgs": []}
            return (m, info) if output_loading_info else m
''')


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    gen = os.path.join(here, "gen_goldens.py")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = os.path.join(tmp, "fake", "transformers")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(FAKE)
        out = os.path.join(tmp, "golden")
        env = dict(os.environ, PYTHONPATH=os.path.join(tmp, "fake"), GG_PATH=gen)
        r = subprocess.run([sys.executable, gen, "--out", out, "--device", "cpu"], env=env,
                           capture_output=True, text=True)
        print(r.stdout[-6000:])
        print(r.stderr[-3000:], file=sys.stderr)
        ok = r.returncode == 0
        for name in sorted(os.listdir(out)):
            g = os.path.join(out, name, "golden.json")
            if not os.path.exists(g):
                print(f"{name}: no golden.json")
                ok = False
                continue
            with open(g) as f:
                data = json.load(f)
            with open(os.path.join(out, name, "config.json")) as f:
                cfg = json.load(f)
            need = {"model", "arch", "prompts", "last_logits", "greedy", "all_logits_prompt0"}
            shapes = ([len(p) for p in data["prompts"]], len(data["last_logits"]), len(data["last_logits"][0]),
                      [len(g) for g in data["greedy"]], len(data["all_logits_prompt0"]))
            good = need <= set(data) and all(len(g) == 24 for g in data["greedy"]) and "rope_theta" in cfg
            print(f"{name}: keys ok={need <= set(data)} shapes={shapes} rope_theta={cfg.get('rope_theta')} "
                  f"rope_scaling={cfg.get('rope_scaling')} files={sorted(os.listdir(os.path.join(out, name)))}")
            ok = ok and good
    print("local dry run:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
