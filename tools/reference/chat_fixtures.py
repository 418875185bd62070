"""Write fixtures/chat/conversations.json and fixtures/chat/<short>.json (rendered chat templates).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/chat_fixtures.py
      (FIXTURE_MODELS=smollm2,qwen05 to restrict)

Reference renderer: transformers' `tok.apply_chat_template(messages, tools=..., add_generation_prompt=...,
tokenize=False, **({"enable_thinking": x} if set))` with the tokenizer loaded from the GGUF
(`AutoTokenizer.from_pretrained(models/, gguf_file=...)`); its chat_template is the GGUF's `tokenizer.chat_template`.
A conversation that makes the template (or transformers) raise gets `"rendered": null` and the error string.

Every case is ALSO rendered with a plain jinja2 ImmutableSandboxedEnvironment configured like transformers
(trim_blocks, lstrip_blocks, loopcontrols, raise_exception/strftime_now globals, tojson(ensure_ascii=False)),
with the template read by gguf-py; `jinja2_plain` says whether that matched transformers case by case. If
transformers cannot load a GGUF's tokenizer, the jinja2 rendering is used as the reference.

`llama_cpp_builtin`: llama.cpp's own C++ template engine (`llama_chat_apply_template`, which recognises known
template families by substrings and renders role/content only — no tools, no tool_calls) for comparison; for a
GGUF without a chat template it is asked for the family the architecture implies ("gemma" for gemma3).

The template text of each model is also written to fixtures/chat/templates/<short>.jinja.
Deterministic (none of these templates calls strftime_now).
"""

import ctypes
import json
import os
import traceback
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jinja2  # noqa: E402
import jinja2.ext  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402
from gguf import GGUFReader  # noqa: E402

from common import FIXTURES_DIR, MODELS_DIR, file_sha256, model_path, selected_models, sha256_text, write_json_lines  # noqa: E402

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation. Returns the top matches.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 20},
            },
            "required": ["query"],
        },
    },
}

LONG_CODE = '''Please review this code:

```python
import json


def load(path):
    """Load a JSON file."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for key, value in sorted(data.items()):
        if isinstance(value, list):
            print(f"{key}: {len(value)} items")
        else:
            print(f"{key} = {value!r}")
    return data
```

And the Rust version:

```rust
use std::collections::BTreeMap;

fn main() {
    let mut m: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    m.entry("a").or_default().push(1);
    for (k, v) in &m {
        println!("{k}: {v:?}");
    }
}
```
'''

CONVERSATIONS = [
    {"name": "single_user", "messages": [{"role": "user", "content": "Hello!"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "single_user_no_generation_prompt", "messages": [{"role": "user", "content": "Hello!"}],
     "add_generation_prompt": False, "tools": None},
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "empty_system", "messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Hi"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "multi_turn", "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 = 4."},
        {"role": "user", "content": "And times 3?"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "system_multi_turn", "messages": [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Ahoy, matey!"},
        {"role": "user", "content": "Where is the treasure?"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "assistant_last_no_generation_prompt", "messages": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi there!"}],
     "add_generation_prompt": False, "tools": None},
    {"name": "unicode_content", "messages": [
        {"role": "system", "content": "Réponds en français. 日本語もOK。"},
        {"role": "user", "content": "你好 👋🏽 café naïve — Привет, مرحبا, שלום\nnew line\ttab"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "whitespace_content", "messages": [
        {"role": "user", "content": "  leading and trailing spaces  \n\n"}],
     "add_generation_prompt": True, "tools": None},
    {"name": "special_token_text_in_content", "messages": [
        {"role": "user", "content": "Explain <|im_end|> and <end_of_turn> and <bos> tokens."}],
     "add_generation_prompt": True, "tools": None},
    {"name": "long_code", "messages": [
        {"role": "system", "content": "You are a senior code reviewer."},
        {"role": "user", "content": LONG_CODE},
        {"role": "assistant", "content": "Both look fine.\n\n```rust\nfn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n```\n"},
        {"role": "user", "content": "Now add error handling\n    (keep the indentation)."}],
     "add_generation_prompt": True, "tools": None},
    {"name": "tools_user", "messages": [
        {"role": "user", "content": "What's the weather in Paris?"}],
     "add_generation_prompt": True, "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    {"name": "tools_system_user", "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Find docs about tokenizers."}],
     "add_generation_prompt": True, "tools": [SEARCH_TOOL]},
    {"name": "tool_call_and_result", "messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}],
     "add_generation_prompt": True, "tools": [WEATHER_TOOL]},
    {"name": "parallel_tool_calls", "messages": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris and Tokyo, then search docs for 'umbrella'."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_b", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "18C, rain"},
        {"role": "tool", "tool_call_id": "call_b", "name": "get_weather", "content": "25C, sun"},
        {"role": "assistant", "content": "Paris: 18C and rain. Tokyo: 25C and sunny."},
        {"role": "user", "content": "Thanks!"}],
     "add_generation_prompt": True, "tools": [WEATHER_TOOL, SEARCH_TOOL]},
    {"name": "tool_call_with_content", "messages": [
        {"role": "user", "content": "Search for 'gguf'."},
        {"role": "assistant", "content": "Let me search.", "tool_calls": [
            {"id": "call_x", "type": "function",
             "function": {"name": "search_docs", "arguments": {"query": "gguf", "limit": 3}}}]},
        {"role": "tool", "tool_call_id": "call_x", "name": "search_docs", "content": "[\"gguf.md\", \"format.md\"]"}],
     "add_generation_prompt": True, "tools": [SEARCH_TOOL]},
    {"name": "enable_thinking_false", "messages": [{"role": "user", "content": "Think about it: 17*23?"}],
     "add_generation_prompt": True, "tools": None, "enable_thinking": False},
    {"name": "enable_thinking_true", "messages": [{"role": "user", "content": "Think about it: 17*23?"}],
     "add_generation_prompt": True, "tools": None, "enable_thinking": True},
    {"name": "consecutive_user_messages", "messages": [
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."}],
     "add_generation_prompt": True, "tools": None},
    {"name": "assistant_first", "messages": [
        {"role": "assistant", "content": "How can I help?"},
        {"role": "user", "content": "Tell me a joke."}],
     "add_generation_prompt": True, "tools": None},
    {"name": "system_only", "messages": [{"role": "system", "content": "You are terse."}],
     "add_generation_prompt": True, "tools": None},
]

# GGUF without tokenizer.chat_template: which llama.cpp built-in family to ask for, by architecture.
BUILTIN_FALLBACK = {"gemma3": "gemma"}


def write_conversations():
    out = FIXTURES_DIR / "chat" / "conversations.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    assert len({c["name"] for c in CONVERSATIONS}) == len(CONVERSATIONS)
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in CONVERSATIONS)
    out.write_text("[\n" + body + "\n]\n", encoding="utf-8")
    print(f"wrote {out} ({len(CONVERSATIONS)} conversations)")


def plain_jinja_env():
    """A jinja2 environment configured like transformers' chat-template environment."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        from datetime import datetime
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_plain(env, template, conv, special_tokens):
    # Like transformers: drop keys whose value is None; special tokens (bos_token, eos_token, ...) are variables.
    messages = [{k: v for k, v in m.items() if v is not None} for m in conv["messages"]]
    kwargs = dict(special_tokens)
    if "enable_thinking" in conv:
        kwargs["enable_thinking"] = conv["enable_thinking"]
    return env.from_string(template).render(messages=messages, tools=conv["tools"], documents=None,
                                             add_generation_prompt=conv["add_generation_prompt"], **kwargs)


def render_transformers(tok, conv):
    extra = {"enable_thinking": conv["enable_thinking"]} if "enable_thinking" in conv else {}
    return tok.apply_chat_template(conv["messages"], tools=conv["tools"],
                                   add_generation_prompt=conv["add_generation_prompt"], tokenize=False, **extra)


def render_llama_cpp_builtin(tmpl, conv):
    """llama.cpp's built-in (non-Jinja) renderer; role/content only."""
    import llama_cpp

    if conv["tools"] or any(m.get("tool_calls") for m in conv["messages"]):
        return None, "not rendered: llama_chat_apply_template has no tools/tool_calls support"
    msgs = conv["messages"]
    keep = []
    arr = (llama_cpp.llama_chat_message * len(msgs))()
    for i, m in enumerate(msgs):
        role = m["role"].encode()
        content = (m.get("content") or "").encode("utf-8")
        keep += [role, content]
        arr[i].role = role
        arr[i].content = content
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_chat_apply_template(tmpl.encode("utf-8"), arr, len(msgs),
                                                conv["add_generation_prompt"], buf, cap)
        if n < 0:
            return None, f"llama_chat_apply_template returned {n} (template not supported)"
        if n <= cap:
            return buf.raw[:n].decode("utf-8", errors="replace"), None
        cap = n + 1


def err_str(e):
    return f"{type(e).__name__}: {e}"


def one_model(short, filename):
    path = model_path(filename)
    reader = GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    f = reader.fields.get("tokenizer.chat_template")
    template = f.contents() if f is not None else None
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()

    def tok_str(key):
        fld = reader.fields.get(key)
        return tokens[int(fld.contents())] if fld is not None else None

    gguf_special = {"bos_token": tok_str("tokenizer.ggml.bos_token_id"),
                    "eos_token": tok_str("tokenizer.ggml.eos_token_id"),
                    "unk_token": tok_str("tokenizer.ggml.unknown_token_id"),
                    "pad_token": tok_str("tokenizer.ggml.padding_token_id")}
    gguf_special = {k: v for k, v in gguf_special.items() if v is not None}
    del reader

    tok, tok_error = None, None
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=filename)
    except Exception as e:
        tok_error = err_str(e)
        traceback.print_exc()

    if template is not None:
        tdir = FIXTURES_DIR / "chat" / "templates"
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / f"{short}.jinja").write_text(template, encoding="utf-8")

    if tok is not None:
        special = dict(tok.special_tokens_map)
        if template is not None and tok.chat_template != template:
            print(f"  WARNING {short}: transformers' chat_template differs from the GGUF's tokenizer.chat_template")
    else:
        special = gguf_special

    env = plain_jinja_env()
    builtin_tmpl = template if template is not None else BUILTIN_FALLBACK.get(arch)

    cases = []
    plain_mismatch = []
    for conv in CONVERSATIONS:
        case = {"name": conv["name"], "rendered": None, "error": None}
        # reference: transformers
        if tok is not None:
            try:
                case["rendered"] = render_transformers(tok, conv)
            except Exception as e:
                case["error"] = err_str(e)
        # plain jinja2 (fallback reference / cross-check)
        plain, plain_err = None, None
        if template is not None:
            try:
                plain = render_plain(env, template, conv, special)
            except Exception as e:
                plain_err = err_str(e)
            if tok is None:
                case["rendered"], case["error"] = plain, plain_err
            elif plain != case["rendered"] or (plain_err is None) != (case["error"] is None):
                plain_mismatch.append(conv["name"])
        elif tok is None:
            case["error"] = "no tokenizer.chat_template in GGUF"
        # llama.cpp built-in
        if builtin_tmpl is not None:
            r, e = render_llama_cpp_builtin(builtin_tmpl, conv)
            case["llama_cpp_builtin"] = {"rendered": r, "error": e}
        cases.append(case)

    if template is None:
        src = "none: this GGUF has no tokenizer.chat_template"
        if tok is not None:
            src += " (so transformers' apply_chat_template raises: see each case's error)"
    elif tok is not None:
        src = (f"tokenizer.chat_template from GGUF, rendered by transformers {version('transformers')} "
               f"apply_chat_template (tokenizer loaded from the GGUF; jinja2 {jinja2.__version__})")
    else:
        src = (f"tokenizer.chat_template from GGUF (read with gguf-py {version('gguf')}), rendered by a plain jinja2 "
               f"{jinja2.__version__} ImmutableSandboxedEnvironment configured like transformers, because "
               f"transformers could not load this GGUF's tokenizer: {tok_error}")
    if builtin_tmpl is None:
        builtin_desc = None
    else:
        builtin_desc = ("the GGUF template string (family detected by llama.cpp)" if template is not None
                        else f"built-in family name {builtin_tmpl!r}") + f"; llama-cpp-python {version('llama_cpp_python')}"
    head = {
        "model": filename,
        "sha256": file_sha256(path),
        "architecture": arch,
        "template_source": src,
        "template_sha256": sha256_text(template) if template is not None else None,
        "template_file": f"templates/{short}.jinja" if template is not None else None,
        "bos_token": special.get("bos_token"),
        "eos_token": special.get("eos_token"),
        "template_variables": sorted(set(special) | {"messages", "tools", "documents", "add_generation_prompt"}),
        "jinja2_plain": ("not compared (no template)" if template is None else
                         "matches transformers on every case" if not plain_mismatch else
                         f"differs from transformers on: {plain_mismatch}"),
        "llama_cpp_builtin_template": builtin_desc,
    }
    out = FIXTURES_DIR / "chat" / f"{short}.json"
    write_json_lines(out, head, "cases", cases)
    n_err = sum(1 for c in cases if c["error"])
    print(f"{short}: {len(cases)} cases, {n_err} errors, jinja2 plain: {head['jinja2_plain']} -> {out}", flush=True)
    for c in cases:
        if c["error"]:
            print(f"  ERROR {c['name']}: {c['error']}")


def main():
    write_conversations()
    for short, filename in selected_models().items():
        one_model(short, filename)


if __name__ == "__main__":
    main()
