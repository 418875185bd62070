"""Write fixtures/quality/: real-model quality references from transformers fp32 (dequantized GGUF weights).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/real_quality.py
      (QUALITY_MODELS=smollm2,gemma3 to restrict; TORCH_THREADS=2 by default; ~10 min on 2 cores)

Writes
  fixtures/quality/text.txt             ~17 KB of real English prose and Python code, all PSF-licensed text
                                        shipped with CPython 3.11 (see text_sources.json)
  fixtures/quality/text_sources.json    where each piece of text.txt came from (file, offsets, sha256)
  fixtures/quality/<short>.json         teacher-forced top-1 / next-token NLL / perplexity over that text
  fixtures/quality/<short>_greedy.json  8 prompts x 32 greedy tokens
for smollm2, qwen05 and gemma3.

Model: AutoModelForCausalLM.from_pretrained(models/, gguf_file=..., dtype=float32, attn_implementation="eager"):
transformers dequantizes every GGUF tensor to fp32 (so this is the *dequantized-weights, fp32-math* reference,
not llama.cpp's quantized math; see llama_cpp_greedy.py for that).  Needs `accelerate` (transformers refuses
to load a GGUF without it).

Tokenization is llama.cpp's (llama-cpp-python, Llama(vocab_only=True)):
  text:    tokenize(text, add_bos=<GGUF add_bos flag>, special=False)  (parse_special off, as llama-perplexity)
  prompts: tokenize(rendered, add_bos=<flag>, special=True)             (chat markup must become control tokens)
Only gemma3 has add_bos = true (BOS 2).

Teacher forcing: the text tokens (without BOS) are cut into windows of 1024, 1024 and 512 positions of model
input; each window is a fresh context (no state carried over), and for gemma3 each window's input is BOS +
1023 / 1023 / 511 text tokens.  For every input position j of a window: top1[j] = argmax of the fp32 logits,
margin[j] = top-1 minus top-2 logit, and for j < len-1: nll[j] = -log softmax(logits[j])[input[j+1]]
(log-softmax in float64).  perplexity = exp(mean of all nll of all windows).

Greedy: 8 prompts (chat-rendered with the GGUF's chat template via transformers apply_chat_template(...,
add_generation_prompt=True, tokenize=False) for smollm2/qwen05; plain text for gemma3, a base model), then 32
steps of argmax with the KV cache (model(..., past_key_values=...)), no logits processors and no stop at EOS:
all 32 tokens are recorded, with `first_eog` = index of the first end-of-generation token (llama.cpp's EOG set)
or null.  An engine that stops at EOG compares generated[:first_eog+1].
Deterministic: re-running gives byte-identical files (same versions; nll/margin are rounded to 1e-4 / 1e-3).
"""

import contextlib
import ctypes
import io
import json
import math
import os
import sys
import sysconfig
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import FIXTURES_DIR, MODELS, MODELS_DIR, file_sha256, model_path, sha256_text  # noqa: E402

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))

QUALITY = ["smollm2", "qwen05", "gemma3"]
WINDOWS = [1024, 1024, 512]  # model-input lengths (incl. BOS where the model adds one)
N_NEW = 32
OUT = FIXTURES_DIR / "quality"

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    [{"role": "user", "content": "Explain what a hash table is in two sentences."}],
    [{"role": "system", "content": "You are a terse assistant. Answer with as few words as possible."},
     {"role": "user", "content": "What is 17 times 23?"}],
    [{"role": "user", "content": "Translate 'good morning, my friend' into Spanish and French."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "What does `git rebase` do? Keep it short."}],
    [{"role": "user", "content": "Fix the bug:\n\n```python\ndef mean(xs):\n    return sum(xs) / len(xs) + 1\n```"}],
]
TEXT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "import numpy as np\n\n# Compute the mean of each column\n",
    "Water boils at a temperature of",
    "The theory of general relativity was developed by",
    "Here is a list of fruits: apple, banana,",
]


# --------------------------------------------------------------------------------------------- text

def build_text():
    """~17 KB of real prose and code from CPython's own (PSF-licensed) files. Deterministic for CPython 3.11.7."""
    import argparse
    import bisect
    import heapq
    import json as json_mod

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lic_path = stdlib / "LICENSE.txt"
    lic = lic_path.read_text(encoding="utf-8")
    a = lic.index("A. HISTORY OF THE SOFTWARE")
    b = lic.index("B. TERMS AND CONDITIONS")
    history = lic[a:b].strip()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        import this  # noqa: F401  (prints the Zen of Python)
    zen = buf.getvalue().strip()
    bisect_src = Path(bisect.__file__).read_text(encoding="utf-8").strip()

    pieces = [
        ("CPython LICENSE.txt, section A (history of the software)", str(lic_path), "prose", history),
        ("The Zen of Python (`import this`)", "Lib/this.py output", "prose", zen),
        ("heapq.__about__ (essay on heaps by François Pinard)", heapq.__file__, "prose", heapq.__about__.strip()),
        ("json module docstring", json_mod.__file__, "prose+code", json_mod.__doc__.strip()),
        ("bisect.py source", bisect.__file__, "code", bisect_src),
        ("argparse module docstring", argparse.__file__, "prose+code", argparse.__doc__.strip()),
    ]
    text, sources = "", []
    for title, path, kind, body in pieces:
        if text:
            text += "\n\n"
        start = len(text.encode("utf-8"))
        text += body
        sources.append({"title": title, "file": path.replace(sys.base_prefix, "<python>").replace(sys.prefix, "<venv>"),
                        "kind": kind, "byte_start": start, "byte_end": len(text.encode("utf-8")),
                        "sha256": sha256_text(body)})
    text += "\n"
    meta = {
        "python": sys.version.split()[0],
        "license": "Python Software Foundation License Version 2 (all pieces are part of the CPython distribution)",
        "bytes": len(text.encode("utf-8")),
        "sha256": sha256_text(text),
        "pieces": sources,
        "made_by": "tools/reference/real_quality.py build_text()",
    }
    return text, meta


# ------------------------------------------------------------------------------------- tokenization

class LlamaCppVocab:
    def __init__(self, path):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        v = self.vocab
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(v))
        self.bos = int(llama_cpp.llama_vocab_bos(v))
        n = llama_cpp.llama_vocab_n_tokens(v)
        self.eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(v, i)]

    def tokenize(self, text, special):
        return [int(t) for t in self.llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=special)]

    def detok(self, ids):
        n = len(ids)
        arr = (self.lc.llama_token * max(n, 1))(*ids)
        cap = 16 * n + 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            r = self.lc.llama_detokenize(self.vocab, arr, n, buf, cap, False, True)
            if r >= 0:
                return buf.raw[:r].decode("utf-8", errors="replace")
            cap = -r + 1

    def close(self):
        self.llm.close()


# ------------------------------------------------------------------------------------------ models

def load_hf(filename):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    t = time.time()
    model = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR), gguf_file=filename, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=filename)
    return model, tok, time.time() - t


def teacher_forced(model, inp):
    with torch.no_grad():
        logits = model(torch.tensor([inp])).logits[0].float()
    top2 = torch.topk(logits, 2, dim=-1)
    top1 = top2.indices[:, 0].tolist()
    margin = (top2.values[:, 0] - top2.values[:, 1]).tolist()
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.tensor(inp[1:])
    nll = (-lp[:-1].gather(1, tgt[:, None])[:, 0]).tolist()
    del logits, lp
    return top1, margin, nll


def greedy(model, prompt_ids, n_new):
    out_ids, margins = [], []
    with torch.no_grad():
        o = model(torch.tensor([prompt_ids]), use_cache=True)
        past = o.past_key_values
        logits = o.logits[0, -1].float()
        for step in range(n_new):
            v = torch.topk(logits, 2)
            nxt = int(v.indices[0])
            out_ids.append(nxt)
            margins.append(round(float(v.values[0] - v.values[1]), 4))
            if step == n_new - 1:
                break
            o = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            logits = o.logits[0, -1].float()
    return out_ids, margins


def r4(xs):
    return [round(float(x), 4) for x in xs]


def one_model(short, text, text_meta):
    filename = MODELS[short]
    path = model_path(filename)
    t0 = time.time()
    voc = LlamaCppVocab(path)
    all_ids = voc.tokenize(text, special=False)
    ids_special = voc.tokenize(text, special=True)
    text_ids = all_ids[1:] if voc.add_bos else all_ids
    if voc.add_bos:
        assert all_ids[0] == voc.bos

    model, tok, t_load = load_hf(filename)
    hf_text_ids = [int(x) for x in tok.encode(text, add_special_tokens=False)]
    print(f"{short}: loaded in {t_load:.0f}s; text -> {len(text_ids)} tokens (llama.cpp), "
          f"transformers agrees: {hf_text_ids == text_ids}", flush=True)

    # ---- teacher-forced windows
    windows, all_nll, pos = [], [], 0
    n_bos = 1 if voc.add_bos else 0
    t1 = time.time()
    for w in WINDOWS:
        n_text = w - n_bos
        seg = text_ids[pos:pos + n_text]
        assert len(seg) == n_text, f"text too short for {short}: need {pos + n_text} tokens, have {len(text_ids)}"
        inp = ([voc.bos] if voc.add_bos else []) + seg
        top1, margin, nll = teacher_forced(model, inp)
        all_nll += nll
        windows.append({"text_start": pos, "text_end": pos + n_text, "bos": bool(voc.add_bos), "input": inp,
                        "top1": top1, "margin": [round(float(x), 3) for x in margin], "nll": r4(nll),
                        "perplexity": round(math.exp(sum(nll) / len(nll)), 4)})
        print(f"  window {pos}..{pos + n_text}: ppl {windows[-1]['perplexity']}, "
              f"{time.time() - t1:.0f}s", flush=True)
        pos += n_text
    t_tf = time.time() - t1
    ppl = math.exp(sum(all_nll) / len(all_nll))

    # ---- greedy
    t2 = time.time()
    is_chat = short != "gemma3"
    cases = []
    for i, p in enumerate(CHAT_PROMPTS if is_chat else TEXT_PROMPTS):
        rendered = tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) if is_chat else p
        pids = voc.tokenize(rendered, special=True)
        hf_pids = [int(x) for x in tok.encode(rendered, add_special_tokens=True)]
        gen, margins = greedy(model, pids, N_NEW)
        eog = next((k for k, t in enumerate(gen) if t in voc.eog), None)
        cases.append({"index": i, "messages" if is_chat else "prompt": p, "rendered": rendered,
                      "prompt_ids": pids, "transformers_prompt_ids_agree": hf_pids == pids,
                      "generated": gen, "first_eog": eog, "margins": margins,
                      "text": voc.detok(gen)})
        print(f"  greedy {i}: {voc.detok(gen)!r}", flush=True)
    t_greedy = time.time() - t2

    common_head = {
        "model": filename,
        "sha256": file_sha256(path),
        "architecture": model.config.model_type,
        "reference": f"transformers {version('transformers')} AutoModelForCausalLM.from_pretrained(models/, "
                     f"gguf_file=..., dtype=float32, attn_implementation='eager') (GGUF tensors dequantized to "
                     f"fp32), torch {version('torch')} CPU, {torch.get_num_threads()} threads; tokenization by "
                     f"llama.cpp (llama-cpp-python {version('llama_cpp_python')}, vocab_only)",
        "add_bos": voc.add_bos,
        "bos_id": voc.bos,
        "eog_ids": voc.eog,
    }
    head = dict(common_head)
    head.update({
        "text_file": "text.txt",
        "text_sha256": text_meta["sha256"],
        "tokenize": "llama.cpp tokenize(text, add_bos=add_bos, special=False); `ids` excludes the BOS",
        "n_text_tokens": len(text_ids),
        "transformers_tokenization_agrees": hf_text_ids == text_ids,
        "parse_special_changes_ids": ids_special != all_ids,
        "ids": text_ids,
        "window_sizes": WINDOWS,
        "n_positions": sum(len(w["top1"]) for w in windows),
        "n_nll": len(all_nll),
        "perplexity": round(ppl, 4),
        "mean_nll": round(sum(all_nll) / len(all_nll), 6),
        "fields": "windows[k]: text_start/text_end index `ids`; input = ([bos] if bos) + ids[text_start:text_end]; "
                  "top1[j] = argmax logits at input position j; margin[j] = top1 - top2 logit (3 dp); "
                  "nll[j] = -log p(input[j+1] | input[:j+1]) (4 dp), len(input)-1 values",
    })
    from common import write_json_lines
    write_json_lines(OUT / f"{short}.json", head, "windows", windows)

    ghead = dict(common_head)
    ghead.update({
        "prompt_format": ("chat: transformers apply_chat_template(messages, add_generation_prompt=True, "
                          "tokenize=False) with the GGUF's template" if is_chat else "plain text (base model)"),
        "tokenize": "llama.cpp tokenize(rendered, add_bos=add_bos, special=True)",
        "n_new": N_NEW,
        "decoding": "greedy argmax of fp32 logits, KV cache, no logits processors, no stop at EOG (all 32 kept); "
                    "first_eog = index of the first EOG token or null; margins = top1 - top2 logit per step",
    })
    write_json_lines(OUT / f"{short}_greedy.json", ghead, "cases", cases)
    voc.close()
    del model
    print(f"{short}: {head['n_positions']} positions, perplexity {ppl:.4f}; seconds: load {t_load:.0f}, "
          f"teacher-forced {t_tf:.0f}, greedy {t_greedy:.0f}, total {time.time() - t0:.0f}", flush=True)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    text, meta = build_text()
    (OUT / "text.txt").write_text(text, encoding="utf-8")
    (OUT / "text_sources.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"text.txt: {meta['bytes']} bytes, sha256 {meta['sha256']}", flush=True)
    want = os.environ.get("QUALITY_MODELS")
    shorts = [s.strip() for s in want.split(",")] if want else QUALITY
    for s in shorts:
        one_model(s, text, meta)


if __name__ == "__main__":
    main()
