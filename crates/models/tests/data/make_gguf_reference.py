"""Reference logits of the real GGUF models for `tests/gguf_reference.rs`.

For each model: the prompt tokenized by llama.cpp (BOS as the vocab says), then logits at every position from
(a) transformers loading the GGUF (weights dequantized to fp32, Q/K un-permuted for llama, Gemma norms shifted
back by -1: an fp32 reference of the same weights) and (b) llama.cpp itself (its own quantized arithmetic).
Kept per position: the top 8 ids with both logits, 8 fixed probe ids, and max|logit|. A fourth case,
`gemma3_long`, runs 600 tokens so that Gemma 3's 512-token sliding window bites, and keeps the last 12 positions.
Run from the repo root (about 5 minutes on 2 cores):

    .venv/bin/python crates/models/tests/data/make_gguf_reference.py
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
from llama_cpp import Llama
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[4]
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen05": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
PROBES = [0, 1, 2, 100, 1000, 5000, 20000, 40000]
# Gemma 3's sliding window (512) only matters past 512 tokens: a long case keeps the last LONG_KEEP positions.
LONG_TEXT = " ".join(f"Item {i}: the {['red', 'green', 'blue', 'black'][i % 4]} box holds {i * 7 % 13} stones." for i in range(80))
LONG_TOKENS, LONG_KEEP = 600, 12

torch.set_num_threads(2)
out = {"prompt": PROMPT, "probes": PROBES, "models": {}}
for case in sys.argv[1:] or [*MODELS, "gemma3_long"]:
    short = case.removesuffix("_long")
    file = MODELS[short]
    llm = Llama(model_path=str(ROOT / "models" / file), n_ctx=1024, logits_all=True, verbose=False, n_threads=2)
    if case.endswith("_long"):
        ids = llm.tokenize(LONG_TEXT.encode(), add_bos=True, special=True)[:LONG_TOKENS]
        assert len(ids) == LONG_TOKENS, len(ids)
    else:
        ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    llm.eval(ids)
    lc = np.array(llm.scores[: len(ids)], dtype=np.float32)
    del llm
    model = AutoModelForCausalLM.from_pretrained(str(ROOT / "models"), gguf_file=file, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].float().numpy()
    del model
    rows = []
    first = len(ids) - LONG_KEEP if case.endswith("_long") else 0
    for p in range(first, len(ids)):
        top = np.argsort(-hf[p], kind="stable")[:8]
        rows.append({
            "top": [int(t) for t in top],
            "hf_top": [float(hf[p, t]) for t in top],
            "llama_cpp_top": [float(lc[p, t]) for t in top],
            "hf_probes": [float(hf[p, t]) for t in PROBES],
            "hf_max_abs": float(np.abs(hf[p]).max()),
            "llama_cpp_argmax": int(lc[p].argmax()),
            "position": p,
        })
    agree = sum(int(hf[p].argmax() == lc[p].argmax()) for p in range(len(ids)))
    print(f"{case}: {len(ids)} tokens, hf vs llama.cpp argmax agree {agree}/{len(ids)}, "
          f"max |diff| {np.abs(hf - lc).max():.3f} (max |logit| {np.abs(hf).max():.2f})", flush=True)
    out["models"][case] = {"file": file, "ids": [int(i) for i in ids], "positions": rows}

dst = Path(__file__).with_name("gguf_reference.json")
with open(dst, "w") as f:
    f.write('{"prompt": %s, "probes": %s, "models": {\n' % (json.dumps(PROMPT), json.dumps(PROBES)))
    items = list(out["models"].items())
    for i, (k, m) in enumerate(items):
        f.write('%s: {"file": %s, "ids": %s, "positions": [\n' % (json.dumps(k), json.dumps(m["file"]), json.dumps(m["ids"])))
        f.write(",\n".join(json.dumps(r) for r in m["positions"]))
        f.write("\n]}%s\n" % ("," if i + 1 < len(items) else ""))
    f.write("}}\n")
print("wrote", dst)
