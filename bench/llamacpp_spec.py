"""llama.cpp's side of the drafted-decoding benchmark (and, with --tensorfold, ours, interleaved).

usage:
  .venv/bin/python bench/llamacpp_spec.py TARGET.gguf [--draft DRAFT.gguf] --prompts bench/prompts/drafting.json
      [--max-tokens 128] [--runs 3] [--threads 2] [--n-ctx 4096] [--lookup 10,2] [--draft-max 16]
      [--draft-p-min 0.75] [--warmup 1] [--kinds code-edit,json] [--limit N]
      [--tensorfold target/release/tensorfold] [--tf-arg=--max-window=8 ...] [--json OUT.json] [--quiet]

Every prompt ({"kind", "messages"} objects) is rendered with the GGUF's own `tokenizer.chat_template` through
llama-cpp-python's `Jinja2ChatFormatter` and tokenized exactly as its chat handler does
(`tokenize(text, add_bos=False, special=True)`); generation is greedy (temperature 0, repetition penalty 1,
i.e. llama-cpp-python's sampler chain `penalties(neutral) -> greedy`) and stops at an end-of-generation token
or after --max-tokens tokens. The stop token, when drawn, is kept in the token ids and counted, like
TensorFold's `tokens=N`.

llama.cpp modes (all on ONE `Llama` context per target; mode = which `draft_model` is attached):
  serial      `Llama.generate()` with no draft model: one `llama_decode` of one token per step, logits of the
              last row only (`logits_all=False`), exactly what `create_completion` does.
  lookupN     `Llama.generate()` with `LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=N)` as
              draft_model (N from --lookup; llama-cpp-python's docs: 10 for GPU, 2 for CPU). Each step it takes
              the last 2 (else 1) token(s), finds their FIRST earlier occurrence in prompt+reply, and proposes the
              (up to) N tokens that followed; the target evaluates [pending token + drafts] in one batch with
              logits on every row and accepts drafts while the greedy pick at each row equals the next draft.
  draft       (with --draft) the same verify loop with `GreedyDraftModel` (below) as draft_model: a second
              `Llama` on DRAFT.gguf drafting greedily, modelled on llama.cpp's common/speculative.cpp
              (`common_speculative_gen_draft`, used by llama-speculative-simple and llama-server): up to
              --draft-max (16) tokens, each the draft's argmax; stop after a token whose probability (softmax
              over the draft's top 10 logits, as its top-k-10 draft sampler computes it) is below --draft-p-min
              (0.75), that token still included. The draft context keeps its own KV cache in sync with the
              target's sequence: before each proposal it keeps the longest prefix of what it already evaluated
              that the target's current sequence starts with (removing the rest from its KV with
              `llama_memory_seq_rm` via `Llama.eval`), evaluates the remaining tokens (at least the pending
              one), then evaluates each drafted token but the last. Rejected drafts are thus rolled back on the
              next proposal. The draft's prompt is evaluated lazily on the first proposal (as llama.cpp's
              speculative example and TensorFold's draft proposer do), i.e. inside decode time; that time is
              also measured on its own (see decode_tok_s_excl_draft_prompt).
  In the drafted modes the number of drafts per round is clamped so a round never verifies past
  --max-tokens (llama-server does the same: n_draft <= n_predict - n_decoded - 1); llama-cpp-python itself
  only clamps to n_ctx.

Every run starts from an empty KV cache (`Llama.reset()`; no prompt-prefix reuse between runs): the prompt is
evaluated with `Llama.eval(prompt)` (n_batch 512, logits of its last row only, the same in every mode), then
`Llama.generate(prompt)` finds the whole prompt cached and samples the first token from those logits. So prompt
processing is identical across modes (llama-cpp-python would otherwise compute logits for every prompt row
when a draft model is attached).

Timing (wall clock, time.perf_counter around the token generator):
  ttft_s       reset -> first token drawn (prompt evaluation + one sample).
  decode_s     first token drawn -> last token drawn (or the stop token).
  decode_tok_s (tokens - 1) / decode_s, the same definition as TensorFold's `decode=` (its decode_s starts
               after prefill and counts tokens - 1).
  decode_tok_s_excl_draft_prompt  draft mode only: the same with the draft model's first (prompt) evaluation
               subtracted.
  llama's own counters (`llama_perf_context`) are stored per run as well, but note that llama.cpp counts every
  decode call of more than one token -- i.e. every verify batch -- as "prompt eval", so its "eval tok/s" is not
  a decode speed in the drafted modes. In serial runs `llama_perf_eval_tok_s` (n_eval / t_eval) is stored as a
  cross-check of decode_tok_s (they agree to a few percent: the Python loop adds little).
  rounds       target decode calls after the first token (serial: tokens - 1; drafted: one per verify batch);
  drafted / accepted  draft tokens verified / accepted (a draft is accepted when the target's greedy token at
               its position equals it). TensorFold's receipt reports the same three counts.

Identity check: each mode's token ids are compared with the serial ids of the same prompt and run (and serial
runs with each other). A mismatch means llama.cpp's drafted (batched) evaluation picked a different greedy token
somewhere -- its batched kernels do not promise the same bits as its one-row kernels.

--tensorfold BIN also runs `BIN run TARGET --chat --prompt=TEXT [--system=...] --temperature 0 --max-tokens N
--threads T` with `--no-drafts`, `--drafter auto` and (with --draft) `--drafter DRAFT.gguf`, interleaved with
the llama.cpp modes run by run (llama serial, tf serial, llama lookupN..., tf auto, llama draft, tf draft; the
order of the pairs rotates every run and which engine goes first inside a pair alternates), so slow periods of the machine hit both engines. Its stderr receipt
(token_sha, tokens, prompt_tokens, decode tok/s, rounds, drafted, accepted) is parsed; the drafted
token_sha is checked against the serial one, and its text against llama.cpp's serial text.

Medians: per prompt over --runs runs; per kind and overall the median of the per-prompt medians (and the
median of per-prompt speedups vs the same engine's serial mode). Warm-up: --warmup runs of every mode on the
first prompt (8 tokens) before measuring.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding


# --------------------------------------------------------------------------------------------- draft models


class GreedyDraftModel(LlamaDraftModel):
    """Greedy drafting with a second llama.cpp context (see the module docstring for the exact behaviour)."""

    def __init__(self, path, n_ctx, threads, n_max=16, p_min=0.75, top_k=10):
        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.n_max, self.p_min, self.top_k = n_max, p_min, top_k
        self.reset()

    def reset(self):
        self.llm.reset()  # n_tokens = 0: the next eval removes everything from the KV cache
        self.prompt_eval_s = None  # seconds of the first call's evaluation (the prompt)
        self.fed_tokens = 0  # tokens evaluated by the draft context this run

    def _last_logits(self):
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))

    def __call__(self, input_ids, /, max_draft=None, **kwargs):
        ids = input_ids.tolist()
        n_max = self.n_max if max_draft is None else min(self.n_max, max_draft)
        if n_max <= 0 or not ids:
            return np.array([], dtype=np.intc)
        d = self.llm
        held = d.input_ids[: d.n_tokens]
        common = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # evaluate at least the pending token to get fresh logits
        d.n_tokens = common  # Llama.eval() first removes KV entries from n_tokens on
        t = time.perf_counter()
        d.eval(ids[common:])
        if self.prompt_eval_s is None:
            self.prompt_eval_s = time.perf_counter() - t
        self.fed_tokens += len(ids) - common
        out = []
        while True:
            logits = self._last_logits()
            tok = int(np.argmax(logits))
            out.append(tok)
            if len(out) >= n_max:
                break
            if self.p_min > 0:
                top = np.partition(logits, -self.top_k)[-self.top_k:].astype(np.float64)
                p = 1.0 / np.exp(top - float(logits[tok])).sum()
                if p < self.p_min:
                    break
            d.eval([tok])
            self.fed_tokens += 1
        return np.array(out, dtype=np.intc)


class RecordingDraft(LlamaDraftModel):
    """Wraps a draft model: clamps each proposal to the token budget and records every proposal."""

    def __init__(self, inner, prompt_len, max_tokens):
        self.inner, self.prompt_len, self.max_tokens = inner, prompt_len, max_tokens
        self.proposals = []  # (tokens generated so far incl. the pending one, [draft ids])
        self.draft_s = 0.0

    def __call__(self, input_ids, /, **kwargs):
        generated = len(input_ids) - self.prompt_len
        k = max(0, self.max_tokens - generated - 1)
        t = time.perf_counter()
        if isinstance(self.inner, GreedyDraftModel):
            d = self.inner(input_ids, max_draft=k)
        else:
            d = self.inner(input_ids)[:k]
        self.draft_s += time.perf_counter() - t
        d = np.asarray(d, dtype=np.intc)
        self.proposals.append((generated, [int(x) for x in d]))
        return d


def count_accepted(proposals, ids):
    drafted = accepted = 0
    for g, d in proposals:
        drafted += len(d)
        for i, t in enumerate(d):
            if g + i < len(ids) and ids[g + i] == t:
                accepted += 1
            else:
                break
    return drafted, accepted


# --------------------------------------------------------------------------------------------- llama.cpp runs


class Target:
    def __init__(self, path, n_ctx, threads):
        # logits_all=True only sizes llama-cpp-python's score buffer for drafted runs (n_ctx x n_vocab, touched
        # only where written); each run sets _logits_all itself: False (serial), True (drafted, which is what
        # Llama(draft_model=...) sets).
        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         logits_all=True, verbose=False)
        m = self.llm.metadata
        tmpl = m.get("tokenizer.chat_template")
        if not tmpl:
            sys.exit(f"{path}: no tokenizer.chat_template in the GGUF")
        eos_id, bos_id = self.llm.token_eos(), self.llm.token_bos()
        model = self.llm._model
        self.formatter = Jinja2ChatFormatter(
            template=tmpl,
            eos_token=model.token_get_text(eos_id) if eos_id != -1 else "",
            bos_token=model.token_get_text(bos_id) if bos_id != -1 else "",
            stop_token_ids=[eos_id],
        )
        self.vocab = model.vocab

    def render(self, messages):
        r = self.formatter(messages=messages)
        return self.llm.tokenize(r.prompt.encode("utf-8"), add_bos=not r.added_special, special=True)

    def is_eog(self, tok):
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, tok))

    def run(self, prompt, max_tokens, draft=None):
        """One greedy generation; draft is None or a LlamaDraftModel (GreedyDraftModel gets reset)."""
        llm = self.llm
        if isinstance(draft, GreedyDraftModel):
            draft.reset()
        rec = RecordingDraft(draft, len(prompt), max_tokens) if draft is not None else None
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        llm.reset()
        llm.draft_model = None
        llm._logits_all = False
        llm.eval(prompt)
        llm._logits_all = rec is not None
        llm.draft_model = rec
        ids = []
        t_first = None
        gen = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)
        for tok in gen:
            if t_first is None:
                t_first = time.perf_counter()
            ids.append(int(tok))
            if self.is_eog(tok) or len(ids) >= max_tokens:
                break
        t_end = time.perf_counter()
        gen.close()
        llm.draft_model = None
        perf = llama_cpp.llama_perf_context(llm.ctx)
        decode_s = t_end - t_first
        n = len(ids)
        out = {
            "tokens": n,
            "prompt_tokens": len(prompt),
            "finish": "stop" if self.is_eog(ids[-1]) else "length",
            "ttft_s": t_first - t0,
            "decode_s": decode_s,
            "decode_tok_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            "ids": ids,
            "llama_perf": {"t_p_eval_ms": perf.t_p_eval_ms, "n_p_eval": perf.n_p_eval,
                           "t_eval_ms": perf.t_eval_ms, "n_eval": perf.n_eval},
        }
        if rec is None and perf.n_eval > 0 and perf.t_eval_ms > 0:
            # cross-check of the wall-clock decode speed (serial only: one-token decode calls)
            out["llama_perf_eval_tok_s"] = perf.n_eval / (perf.t_eval_ms / 1000.0)
        if rec is None:
            out.update(rounds=max(0, n - 1), drafted=0, accepted=0)
        else:
            drafted, accepted = count_accepted(rec.proposals, ids)
            out.update(rounds=len(rec.proposals), drafted=drafted, accepted=accepted, draft_s=rec.draft_s)
            if isinstance(draft, GreedyDraftModel):
                dp = draft.prompt_eval_s or 0.0
                out["draft_prompt_eval_s"] = dp
                out["draft_fed_tokens"] = draft.fed_tokens
                rest = decode_s - dp
                out["decode_tok_s_excl_draft_prompt"] = (n - 1) / rest if n > 1 and rest > 0 else None
        out["text"] = llm.detokenize([t for t in ids if not self.is_eog(t)], prev_tokens=prompt).decode(
            "utf-8", errors="replace")
        return out


# --------------------------------------------------------------------------------------------- TensorFold runs

RECEIPT = re.compile(r"token_sha=(\S+) tokens=(\d+) prompt_tokens=(\d+) finish=(\S+) seed=(\S+) "
                     r"prefill=([\d.]+|inf|NaN) tok/s decode=([\d.]+|inf|NaN) tok/s rounds=(\d+) drafted=(\d+) "
                     r"accepted=(\d+)")


def tf_run(binary, model, messages, max_tokens, threads, drafter, extra):
    system = [m["content"] for m in messages if m["role"] == "system"]
    users = [m["content"] for m in messages if m["role"] == "user"]
    if len(users) != 1 or len(messages) != len(users) + len(system) or len(system) > 1:
        raise SystemExit("tensorfold run takes one user message (and at most one system message) per prompt")
    cmd = [binary, "run", model, "--chat", f"--prompt={users[0]}", "--temperature", "0",
           "--max-tokens", str(max_tokens), "--threads", str(threads)]
    if system:
        cmd.append(f"--system={system[0]}")
    cmd += ["--no-drafts"] if drafter is None else ["--drafter", drafter]
    cmd += extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - t0
    err = p.stderr.decode("utf-8", errors="replace")
    m = RECEIPT.search(err)
    if p.returncode != 0 or not m:
        raise SystemExit(f"tensorfold failed (rc {p.returncode}): {' '.join(cmd[:3])} ...\n{err[-2000:]}")
    sha, n, pt, finish, seed, pre, dec, rounds, drafted, accepted = m.groups()
    text = p.stdout.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]  # `run` ends the text with one newline
    return {
        "token_sha": sha, "tokens": int(n), "prompt_tokens": int(pt), "finish": finish.lower(),
        "prefill_tok_s": float(pre), "decode_tok_s": float(dec), "rounds": int(rounds),
        "drafted": int(drafted), "accepted": int(accepted), "wall_s": wall, "text": text,
        "receipt": err.strip().splitlines()[-1],
    }


# --------------------------------------------------------------------------------------------- statistics


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize_prompt(runs):
    """runs: list of per-run dicts of one mode; returns medians and sums."""
    s = {
        "decode_tok_s": med([r.get("decode_tok_s") for r in runs]),
        "tokens": med([r["tokens"] for r in runs]),
        "rounds": sum(r["rounds"] for r in runs),
        "drafted": sum(r["drafted"] for r in runs),
        "accepted": sum(r["accepted"] for r in runs),
        "tokens_total": sum(r["tokens"] for r in runs),
    }
    if "ttft_s" in runs[0]:
        s["ttft_s"] = med([r["ttft_s"] for r in runs])
    if any("decode_tok_s_excl_draft_prompt" in r for r in runs):
        s["decode_tok_s_excl_draft_prompt"] = med([r.get("decode_tok_s_excl_draft_prompt") for r in runs])
    if any("mismatch" in r for r in runs):
        s["mismatched_runs"] = sum(1 for r in runs if r.get("mismatch"))
    return s


def group_summary(prompt_results, modes):
    """prompt_results: list of {"modes": {mode: {"summary": ...}}}; per mode medians of per-prompt medians."""
    out = {}
    for mode in modes:
        rows = [p["modes"][mode]["summary"] for p in prompt_results if mode in p["modes"]]
        if not rows:
            continue
        serial = "tf-serial" if mode.startswith("tf-") else "serial"
        speedups = []
        for p in prompt_results:
            a, b = p["modes"].get(mode), p["modes"].get(serial)
            if a and b and a["summary"]["decode_tok_s"] and b["summary"]["decode_tok_s"]:
                speedups.append(a["summary"]["decode_tok_s"] / b["summary"]["decode_tok_s"])
        drafted = sum(r["drafted"] for r in rows)
        rounds = sum(r["rounds"] for r in rows)
        g = {
            "prompts": len(rows),
            "decode_tok_s": med([r["decode_tok_s"] for r in rows]),
            "speedup_vs_serial": med(speedups),
            "acceptance": sum(r["accepted"] for r in rows) / drafted if drafted else None,
            "tokens_per_round": sum(r["tokens_total"] for r in rows) / rounds if rounds else None,
            "drafted": drafted, "accepted": sum(r["accepted"] for r in rows), "rounds": rounds,
        }
        if any("decode_tok_s_excl_draft_prompt" in r for r in rows):
            g["decode_tok_s_excl_draft_prompt"] = med([r.get("decode_tok_s_excl_draft_prompt") for r in rows])
        if any("ttft_s" in r for r in rows):
            g["ttft_s"] = med([r.get("ttft_s") for r in rows])
        if any("mismatched_runs" in r for r in rows):
            g["mismatched_runs"] = sum(r.get("mismatched_runs", 0) for r in rows)
            g["mismatched_prompts"] = sum(1 for r in rows if r.get("mismatched_runs"))
        out[mode] = g
    return out


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def print_table(title, groups, modes, f):
    print(f"\n## {title}", file=f)
    hdr = "| group | mode | prompts | decode tok/s | x serial | accept | tok/round | mismatch runs (prompts) | ttft s |"
    print(hdr, file=f)
    print("|" + "---|" * 9, file=f)
    for gname, g in groups.items():
        first = True
        for mode in modes:
            if mode not in g:
                continue
            s = g[mode]
            dec = fmt(s["decode_tok_s"])
            if s.get("decode_tok_s_excl_draft_prompt") is not None:
                dec += f" ({fmt(s['decode_tok_s_excl_draft_prompt'])} w/o draft prompt)"
            mm = f"{s['mismatched_runs']} ({s['mismatched_prompts']})" if "mismatched_runs" in s else "—"
            print(f"| {gname if first else ''} | {mode} | {s['prompts']} | {dec} | {fmt(s['speedup_vs_serial'], '.2f')}"
                  f" | {fmt(s['acceptance'], '.2f')} | {fmt(s['tokens_per_round'], '.2f')} | {mm} |"
                  f" {fmt(s.get('ttft_s'), '.2f')} |", file=f)
            first = False


# --------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("--draft", help="draft model GGUF (same vocabulary as the target)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--lookup", default="10,2", help="num_pred_tokens values for prompt lookup ('' = none)")
    ap.add_argument("--draft-max", type=int, default=16, help="most drafts per round (llama.cpp default 16)")
    ap.add_argument("--draft-p-min", type=float, default=0.75,
                    help="stop drafting after a token below this probability (llama.cpp default 0.75; 0 = off)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--kinds", help="comma-separated kinds to keep")
    ap.add_argument("--limit", type=int, help="first N prompts (after --kinds)")
    ap.add_argument("--tensorfold", metavar="BIN", help="also run TensorFold's `BIN run`, interleaved")
    ap.add_argument("--tf-arg", action="append", default=[], help="extra argument for `tensorfold run` (repeat)")
    ap.add_argument("--json", help="write everything here")
    ap.add_argument("--quiet", action="store_true", help="no per-run lines")
    a = ap.parse_args()

    prompts = json.load(open(a.prompts))
    if a.kinds:
        keep = set(a.kinds.split(","))
        prompts = [p for p in prompts if p["kind"] in keep]
    if a.limit:
        prompts = prompts[: a.limit]
    if not prompts:
        sys.exit("no prompts")

    target = Target(a.target, a.n_ctx, a.threads)
    draft_model = GreedyDraftModel(a.draft, a.n_ctx, a.threads, a.draft_max, a.draft_p_min) if a.draft else None
    lookups = [int(x) for x in a.lookup.split(",") if x.strip()]

    # (engine, mode, how); pairs are interleaved llama / tensorfold
    llama_modes = [("serial", None)] + [(f"lookup{n}", n) for n in lookups] + ([("draft", "model")] if a.draft else [])
    tf_modes = []
    if a.tensorfold:
        tf_modes = [("tf-serial", None), ("tf-auto", "auto")] + ([("tf-draft", a.draft)] if a.draft else [])

    def llama_once(mode_how, prompt_ids, max_tokens):
        how = mode_how[1]
        if how is None:
            d = None
        elif how == "model":
            d = draft_model
        else:
            d = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=how)
        return target.run(prompt_ids, max_tokens, d)

    def tf_once(mode_how, messages, max_tokens):
        return tf_run(a.tensorfold, a.target, messages, max_tokens, a.threads, mode_how[1], a.tf_arg)

    # The schedule of one run: llama serial, tf serial, llama lookups, tf auto, llama draft, tf draft.
    slots = [[("llama", llama_modes[0])] + ([("tf", tf_modes[0])] if tf_modes else [])]
    slots.append([("llama", m) for m in llama_modes[1:1 + len(lookups)]] + ([("tf", tf_modes[1])] if tf_modes else []))
    if a.draft:
        slots.append([("llama", llama_modes[-1])] + ([("tf", tf_modes[2])] if tf_modes else []))
    slots = [s for s in slots if s]

    log = sys.stderr
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.2f} before the run; llama.cpp's spinning thread pool slows down far "
              f"more than TensorFold when cores are shared, so numbers from a busy machine are not comparable",
              file=log)
    rendered = [target.render(p["messages"]) for p in prompts]
    for p, ids in zip(prompts, rendered):
        if len(ids) + a.max_tokens + a.draft_max + 2 > a.n_ctx:
            sys.exit(f"a prompt of {len(ids)} tokens does not fit --n-ctx {a.n_ctx} with --max-tokens {a.max_tokens}")

    print(f"# {os.path.basename(a.target)}" + (f" draft {os.path.basename(a.draft)}" if a.draft else "")
          + f", {len(prompts)} prompts, max_tokens {a.max_tokens}, runs {a.runs}, threads {a.threads}, "
          f"llama-cpp-python {llama_cpp.__version__}", file=log)
    for _ in range(a.warmup):
        for slot in slots:
            for eng, m in slot:
                if eng == "llama":
                    llama_once(m, rendered[0], min(8, a.max_tokens))
                else:
                    tf_once(m, prompts[0]["messages"], min(8, a.max_tokens))

    results = []
    for pi, (p, ids) in enumerate(zip(prompts, rendered)):
        runs = {m[0]: [] for m in llama_modes + tf_modes}
        for r in range(a.runs):
            order = slots[r % len(slots):] + slots[: r % len(slots)]  # rotate which pair goes first
            for slot in order:
                # alternate which engine goes first inside a pair too
                for eng, m in (slot if r % 2 == 0 else slot[::-1]):
                    if eng == "llama":
                        res = llama_once(m, ids, a.max_tokens)
                    else:
                        res = tf_once(m, p["messages"], a.max_tokens)
                    res["run"] = r
                    runs[m[0]].append(res)
            # identity checks of this run
            ser = runs["serial"][-1]
            for name, _ in llama_modes[1:]:
                x = runs[name][-1]
                x["mismatch"] = x["ids"] != ser["ids"]
                x["first_diff"] = next((i for i, (u, v) in enumerate(zip(x["ids"], ser["ids"])) if u != v),
                                       None if len(x["ids"]) == len(ser["ids"]) else min(len(x["ids"]), len(ser["ids"])))
            if r > 0:
                ser["mismatch"] = ser["ids"] != runs["serial"][0]["ids"]  # serial vs its own first run
            if tf_modes:
                ts = runs["tf-serial"][-1]
                ts["same_text_as_llama_serial"] = ts["text"] == ser["text"]
                for name, _ in tf_modes[1:]:
                    x = runs[name][-1]
                    x["mismatch"] = x["token_sha"] != ts["token_sha"]
            if not a.quiet:
                line = f"[{pi + 1}/{len(prompts)} {p['kind']} run {r + 1}]"
                for name in runs:
                    x = runs[name][-1]
                    extra = ""
                    if x["drafted"]:
                        extra = f" acc {x['accepted']}/{x['drafted']}"
                    if x.get("mismatch"):
                        extra += " MISMATCH"
                    line += f" {name} {fmt(x['decode_tok_s'])}{extra};"
                print(line, file=log, flush=True)
        modes = {}
        for name, rs in runs.items():
            modes[name] = {"summary": summarize_prompt(rs), "runs": rs}
        entry = {"index": pi, "kind": p["kind"], "prompt_tokens": len(ids), "modes": modes}
        if tf_modes:
            entry["tf_prompt_tokens"] = runs["tf-serial"][0]["prompt_tokens"]
            if entry["tf_prompt_tokens"] != len(ids):
                print(f"  note: prompt {pi}: llama.cpp renders {len(ids)} prompt tokens, TensorFold "
                      f"{entry['tf_prompt_tokens']}", file=log)
        results.append(entry)

    mode_names = [m[0] for m in llama_modes + tf_modes]
    kinds = sorted({p["kind"] for p in prompts}, key=[p["kind"] for p in prompts].index)
    by_kind = {k: group_summary([r for r in results if r["kind"] == k], mode_names) for k in kinds}
    overall = group_summary(results, mode_names)
    groups = dict(by_kind)
    groups["ALL"] = overall

    print_table(f"{os.path.basename(a.target)}" + (f" (draft {os.path.basename(a.draft)})" if a.draft else "")
                + f", max_tokens {a.max_tokens}, runs {a.runs}, threads {a.threads}; medians of per-prompt medians",
                groups, mode_names, sys.stdout)
    print("\nmismatch: runs whose token ids differ from llama.cpp serial's (tf-*: whose token_sha differs from "
          "tf-serial's); serial: runs differing from its own first run.", file=sys.stdout)
    if tf_modes:
        same = sum(1 for r in results for x in r["modes"]["tf-serial"]["runs"] if x.get("same_text_as_llama_serial"))
        total = sum(len(r["modes"]["tf-serial"]["runs"]) for r in results)
        ptok = sum(1 for r in results if r.get("tf_prompt_tokens") == r["prompt_tokens"])
        print(f"tf-serial text == llama.cpp serial text in {same}/{total} runs; same prompt token count in "
              f"{ptok}/{len(results)} prompts.", file=sys.stdout)

    if a.json:
        doc = {
            "target": a.target, "draft": a.draft, "prompts_file": a.prompts, "max_tokens": a.max_tokens,
            "runs": a.runs, "threads": a.threads, "n_ctx": a.n_ctx, "lookup": lookups, "draft_max": a.draft_max,
            "draft_p_min": a.draft_p_min, "tensorfold": a.tensorfold, "tf_args": a.tf_arg,
            "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "by_kind": by_kind, "overall": overall, "prompts": results,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
        print(f"wrote {a.json}", file=sys.stdout)


if __name__ == "__main__":
    main()
