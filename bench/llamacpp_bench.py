"""llama.cpp's prefill and serial decode speed on a GGUF, measured the way `tensorfold bench` measures ours.

Prompt: the same fixed English passage `tensorfold bench` uses, tokenized by llama.cpp and repeated to
--prompt-tokens ids. Prefill: one eval of the whole prompt (n_batch = prompt length) after a reset. Decode:
--gen-tokens greedy steps of one token each (argmax of the last logits, then eval of that token). One warm-up
run, then --runs measured runs; medians are printed as one JSON object.

Run with the reference venv (tools/reference/setup-venv.sh builds llama-cpp-python):
  .venv/bin/python bench/llamacpp_bench.py MODEL.gguf --threads 2 --prompt-tokens 512 --gen-tokens 128 --runs 3
"""
import argparse
import json
import statistics
import time

import llama_cpp
import numpy as np

TEXT = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
        "report, which describes how the new bridge was designed, financed and built over three years by engineers "
        "from several countries. ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    n_ctx = a.prompt_tokens + a.gen_tokens + 8
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=n_ctx, n_batch=a.prompt_tokens, n_ubatch=a.prompt_tokens,
                          n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    unit = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    prompt = (unit * (a.prompt_tokens // len(unit) + 1))[:a.prompt_tokens]
    n_vocab = llm.n_vocab()

    def last_argmax():
        # Only the last row has logits (logits_all=False); read them straight from the context.
        return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))))

    pre, dec = [], []
    for run in range(a.runs + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        tok = last_argmax()
        t2 = time.perf_counter()
        for _ in range(a.gen_tokens - 1):
            llm.eval([tok])
            tok = last_argmax()
        t3 = time.perf_counter()
        if run > 0:
            pre.append(a.prompt_tokens / (t1 - t0))
            dec.append((a.gen_tokens - 1) / (t3 - t2))
    print(json.dumps({
        "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        "model": a.model, "threads": a.threads, "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens,
        "runs": a.runs, "prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
        "prefill_tok_s_runs": pre, "decode_tok_s_runs": dec,
    }))


if __name__ == "__main__":
    main()
