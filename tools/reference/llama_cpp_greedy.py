"""Write fixtures/quality/<short>_llamacpp.json: llama.cpp's own outputs (its native quantized math).

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/llama_cpp_greedy.py
      (after real_quality.py, whose <short>_greedy.json / <short>.json give the exact prompt / window ids;
       QUALITY_MODELS=smollm2,gemma3 to restrict; ~3 min on 2 cores)

llama-cpp-python (CPU, n_threads = n_threads_batch = 2, flash_attn off, default f16 KV cache, mmap):
  greedy          for each of the 8 prompts of <short>_greedy.json (same prompt_ids): eval(prompt_ids), then 32
                  times: argmax of llama_get_logits_ith(ctx, -1) (temperature 0 = plain argmax, no sampler, no
                  repetition penalty), eval([token]); no stop at EOG (first_eog marks it).  n_ctx 512.
  teacher_forced  the windows of <short>.json (same input ids): Llama(n_ctx=1024, n_batch=1024, logits_all=True),
                  reset + eval(window) -> logits at every position -> top1, nll (float64 log-softmax), perplexity.
Each case also says how it compares with transformers-fp32 (real_quality.py): `first_divergence` is the first
index where the 32 generated ids differ (null when all 32 agree), and top-1 agreement over all positions.
"""

import ctypes
import json
import math
import os
import time
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

from common import FIXTURES_DIR, MODELS, file_sha256, model_path, write_json_lines  # noqa: E402

QUALITY = ["smollm2", "qwen05", "gemma3"]
OUT = FIXTURES_DIR / "quality"
N_THREADS = 2


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_llama(llm, n_vocab, prompt_ids, n_new):
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for step in range(n_new):
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if step < n_new - 1:
            llm.eval([nxt])
    return out


def detok(llm, ids):
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = len(ids)
    arr = (llama_cpp.llama_token * max(n, 1))(*ids)
    cap = 16 * n + 64
    while True:
        buf = ctypes.create_string_buffer(cap)
        r = llama_cpp.llama_detokenize(vocab, arr, n, buf, cap, False, True)
        if r >= 0:
            return buf.raw[:r].decode("utf-8", errors="replace")
        cap = -r + 1


def one_model(short):
    filename = MODELS[short]
    path = model_path(filename)
    hf_greedy = json.loads((OUT / f"{short}_greedy.json").read_text(encoding="utf-8"))
    hf_tf = json.loads((OUT / f"{short}.json").read_text(encoding="utf-8"))
    sha = file_sha256(path)
    assert hf_greedy["sha256"] == sha and hf_tf["sha256"] == sha, "fixtures were made from a different GGUF"
    eog = set(hf_greedy["eog_ids"])

    # ---- greedy
    t0 = time.time()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=N_THREADS,
                          n_threads_batch=N_THREADS, verbose=False)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    cases = []
    for c in hf_greedy["cases"]:
        gen = greedy_llama(llm, n_vocab, c["prompt_ids"], hf_greedy["n_new"])
        fd = first_divergence(gen, c["generated"])
        cases.append({
            "index": c["index"], "prompt_ids": c["prompt_ids"], "generated": gen,
            "first_eog": next((k for k, t in enumerate(gen) if t in eog), None),
            "text": detok(llm, gen),
            "first_divergence_vs_transformers": fd,
            "transformers_margin_at_divergence": None if fd is None else c["margins"][fd],
        })
        print(f"  {short} greedy {c['index']}: diverge at {fd}  {cases[-1]['text']!r}", flush=True)
    llm.close()
    t_greedy = time.time() - t0

    # ---- teacher forced on the same windows
    t1 = time.time()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_batch=1024, n_threads=N_THREADS,
                          n_threads_batch=N_THREADS, logits_all=True, verbose=False)
    windows, all_nll, agree, total = [], [], 0, 0
    for w in hf_tf["windows"]:
        inp = w["input"]
        llm.reset()
        llm.eval(inp)
        logits = np.array(llm.scores[:len(inp)], dtype=np.float32)
        top1 = [int(x) for x in logits.argmax(-1)]
        lg = logits.astype(np.float64)
        mx = lg.max(-1, keepdims=True)
        lse = (mx[:, 0] + np.log(np.exp(lg - mx).sum(-1)))
        nll = [float(lse[j] - lg[j, inp[j + 1]]) for j in range(len(inp) - 1)]
        all_nll += nll
        a = sum(1 for x, y in zip(top1, w["top1"]) if x == y)
        agree += a
        total += len(top1)
        windows.append({"text_start": w["text_start"], "text_end": w["text_end"], "top1": top1,
                        "nll": [round(x, 4) for x in nll],
                        "perplexity": round(math.exp(sum(nll) / len(nll)), 4),
                        "top1_agree_with_transformers": a})
        print(f"  {short} window {w['text_start']}..{w['text_end']}: ppl {windows[-1]['perplexity']} "
              f"(transformers {w['perplexity']}), top1 agree {a}/{len(top1)}", flush=True)
    llm.close()
    t_tf = time.time() - t1
    ppl = math.exp(sum(all_nll) / len(all_nll))

    # top-1 agreement restricted to positions where transformers' margin is clear (> 0.5 logit)
    clear = [(x == y) for w, lw in zip(hf_tf["windows"], windows)
             for x, y, m in zip(lw["top1"], w["top1"], w["margin"]) if m > 0.5]
    head = {
        "model": filename,
        "sha256": sha,
        "reference": f"llama.cpp via llama-cpp-python {version('llama_cpp_python')}, CPU, n_threads={N_THREADS}, "
                     f"flash_attn off, f16 KV cache (its native quantized-weight math)",
        "n_new": hf_greedy["n_new"],
        "greedy_decoding": "argmax of llama_get_logits_ith(ctx, -1), n_ctx 512, no sampler, no stop at EOG",
        "greedy_identical_to_transformers": sum(1 for c in cases if c["first_divergence_vs_transformers"] is None),
        "first_divergence_vs_transformers": [c["first_divergence_vs_transformers"] for c in cases],
        "teacher_forced": {
            "setup": "Llama(n_ctx=1024, n_batch=1024, logits_all=True); reset + eval(window input) per window; "
                     "windows/input ids = those of <short>.json",
            "perplexity": round(ppl, 4),
            "transformers_perplexity": hf_tf["perplexity"],
            "top1_agree_with_transformers": agree,
            "positions": total,
            "top1_agree_where_transformers_margin_gt_0.5": [sum(clear), len(clear)],
        },
    }
    write_json_lines(OUT / f"{short}_llamacpp.json", head, "cases", cases, tail={"windows": windows})
    print(f"{short}: greedy identical {head['greedy_identical_to_transformers']}/8, divergences "
          f"{head['first_divergence_vs_transformers']}; teacher-forced ppl {ppl:.4f} vs {hf_tf['perplexity']}, "
          f"top1 agree {agree}/{total}; {t_greedy:.0f}s + {t_tf:.0f}s", flush=True)


def main():
    want = os.environ.get("QUALITY_MODELS")
    for s in ([s.strip() for s in want.split(",")] if want else QUALITY):
        one_model(s)


if __name__ == "__main__":
    main()
