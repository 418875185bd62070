#!/usr/bin/env python3
"""TensorFold vs llama.cpp, both as OpenAI-compatible servers on the same GGUF, driven by the same client.

usage: .venv-test/bin/python bench/compare-servers.py MODEL.gguf [--runs 5] [--threads 2] [--max-tokens 128]
           [--prefill 512,2048] [--long-decode 64] [--prompts bench/prompts/drafting.json] [--kinds code-edit,prose]
           [--per-kind 2] [--tensorfold target/release/tensorfold] [--llama-server .llama/bin/llama-server]
           [--llama-spec ARGS] [--json OUT]

Servers: `tensorfold serve MODEL --parallel 1 --no-prefix-cache` and llama.cpp's `llama-server -m MODEL -np 1`
(bench/build-llama-server.sh builds it from the llama.cpp that PyPI's llama-cpp-python vendors), each with
--threads threads and a 4096-token context; for llama.cpp's speculative mode a second llama-server with
--llama-spec's arguments (default: its n-gram lookup over the context, `--spec-type ngram-simple`; pass
`-md DRAFT.gguf` for a draft model). Both run at once but only one works at a time: every measurement
alternates between the engines (TF, llama, TF, llama, ...), so a slow period of the machine hits both.

Measured through the official `openai` client (streaming; times on the client):
  decode   one fixed chat prompt, greedy, --max-tokens tokens: (completion tokens - 1) / (last token time -
           first token time). TensorFold with "draft": false (serial), then drafted.
  prefill  prompts of about N tokens (a different prefix every run, so no cache applies), max_tokens 1:
           prompt tokens / time to the first token. After the longest one, --long-decode tokens are decoded:
           serial decode tok/s at that context length (attention's share grows with it).
  drafted  the prompt file's prompts (--kinds, --per-kind each), greedy: decode tok/s of TensorFold serial and
           drafted and of llama.cpp serial and speculative; whether each drafted reply equals its serial
           reply (TensorFold: always, by design; llama.cpp's is counted).
  memory   each server's peak RSS (VmHWM) at the end.
Medians over --runs runs; ratios are TensorFold / llama.cpp.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from openai import OpenAI

WORDS = ("alpha beta gamma delta river stone cloud maple copper orbit lantern meadow signal harbor velvet "
         "quartz ember willow canyon pixel").split()
DECODE_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a map in a bottle."


def start(cmd, ready, name):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 600
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit(f"{name} exited:\n" + "".join(lines[-30:]))
        lines.append(line)
        m = ready.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(1))
    raise SystemExit(f"{name} did not start")


def peak_rss_mib(proc):
    with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Engine:
    def __init__(self, name, port, extra):
        self.name = name
        self.client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=1800, max_retries=0)
        self.extra = extra
        self.model = self.client.models.list().data[0].id  # each server names its model its own way

    def chat(self, messages, max_tokens, extra=None):
        """Streams one greedy reply; returns (text, completion tokens, prompt tokens, ttft s, decode tok/s)."""
        body = dict(self.extra)
        body.update(extra or {})
        t0 = time.perf_counter()
        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body=body)
        text, times, usage = [], [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
                times.append(time.perf_counter())
            if chunk.usage:
                usage = chunk.usage
        n = usage.completion_tokens if usage else len(times)
        ttft = (times[0] - t0) if times else time.perf_counter() - t0
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        tps = (n - 1) / span if span > 0 and n > 1 else float("nan")
        return "".join(text), n, usage.prompt_tokens if usage else 0, ttft, tps


def filler(n_words, salt):
    return " ".join(WORDS[(i * 7 + salt * 13) % len(WORDS)] for i in range(n_words))


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--long-decode", type=int, default=64,
                    help="tokens decoded after the longest prefill prompt (decode speed at that context; 0: none)")
    ap.add_argument("--prompts", default="bench/prompts/drafting.json")
    ap.add_argument("--kinds", default="code-edit,code-gen,prose,json,multilingual")
    ap.add_argument("--per-kind", type=int, default=2)
    ap.add_argument("--tensorfold", default="target/release/tensorfold")
    ap.add_argument("--llama-server", default=".llama/bin/llama-server")
    ap.add_argument("--llama-spec", default="--spec-type ngram-simple",
                    help="arguments that turn on llama-server's speculative decoding ('' to skip it)")
    ap.add_argument("--json")
    args = ap.parse_args()
    t = str(args.threads)
    procs = {}
    tf_proc, tf_port = start([args.tensorfold, "serve", args.model, "--port", "0", "--threads", t, "--parallel", "1",
                              "--no-prefix-cache", "--no-live-line", "--context", "4096"],
                             re.compile(r"listening on http://127\.0\.0\.1:(\d+)"), "tensorfold")
    procs["tensorfold"] = tf_proc
    llama_cmd = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "-t", t, "-tb", t, "-np", "1",
                 "-c", "4096", "--no-webui", "--cache-reuse", "0"]
    ready = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
    ll_proc, ll_port = start(llama_cmd + ["--port", "18181"], ready, "llama-server")
    procs["llama.cpp"] = ll_proc
    tf = Engine("tensorfold", tf_port, {})
    ll = Engine("llama.cpp", ll_port, {"cache_prompt": False})
    spec = None
    if args.llama_spec.strip():
        sp_proc, sp_port = start(llama_cmd + ["--port", "18182"] + args.llama_spec.split(), ready, "llama-server spec")
        procs["llama.cpp spec"] = sp_proc
        spec = Engine("llama.cpp spec", sp_port, {"cache_prompt": False})
    out = {"model": args.model, "threads": args.threads, "runs": args.runs, "commit": git_commit(),
           "cpu": cpu_name(), "llama_build": llama_build(args.llama_server), "decode": {}, "prefill": {},
           "long_decode": None, "drafted": [], "peak_rss_mib": {}}
    try:
        msgs = [{"role": "user", "content": DECODE_PROMPT}]
        for e in [tf, ll]:  # warm-up
            e.chat(msgs, 8, {"draft": False} if e is tf else None)
        dec = {"tensorfold serial": [], "tensorfold drafted": [], "llama.cpp serial": []}
        for _ in range(args.runs):
            dec["tensorfold serial"].append(tf.chat(msgs, args.max_tokens, {"draft": False})[4])
            dec["llama.cpp serial"].append(ll.chat(msgs, args.max_tokens)[4])
            dec["tensorfold drafted"].append(tf.chat(msgs, args.max_tokens)[4])
        out["decode"] = {k: {"runs": v, "median": med(v)} for k, v in dec.items()}
        sizes = [int(x) for x in args.prefill.split(",") if x]
        for n in sizes:
            pf = {"tensorfold": [], "llama.cpp": []}
            ld = {"tensorfold": [], "llama.cpp": []}
            # After the longest prompt, decode --long-decode tokens too: decode speed at that context length.
            gen = args.long_decode if n == max(sizes) and args.long_decode > 1 else 1
            for r in range(args.runs):
                for e in [tf, ll]:
                    content = f"Run {r} {e.name}. Summarize: " + filler(int(n * 0.9), r)
                    _, _, ptok, ttft, tps = e.chat([{"role": "user", "content": content}], gen,
                                                   {"draft": False} if e is tf else None)
                    pf[e.name].append(ptok / ttft)
                    ld[e.name].append(tps)
            out["prefill"][str(n)] = {k: {"runs": v, "median": med(v)} for k, v in pf.items()}
            if gen > 1:
                out["long_decode"] = {"context": n, **{k: {"runs": v, "median": med(v)} for k, v in ld.items()}}
        prompts = json.load(open(args.prompts))
        kinds = args.kinds.split(",")
        chosen = []
        for k in kinds:
            chosen += [p for p in prompts if p["kind"] == k][: args.per_kind]
        for p in chosen:
            row = {"kind": p["kind"]}
            a_text, _, _, _, row["tf_serial"] = tf.chat(p["messages"], args.max_tokens, {"draft": False})
            b_text, _, _, _, row["llama_serial"] = ll.chat(p["messages"], args.max_tokens)
            c_text, _, _, _, row["tf_drafted"] = tf.chat(p["messages"], args.max_tokens)
            row["tf_equal"] = a_text == c_text
            if spec:
                d_text, _, _, _, row["llama_spec"] = spec.chat(p["messages"], args.max_tokens)
                row["llama_spec_equal"] = d_text == b_text
            out["drafted"].append(row)
            print(json.dumps(row), flush=True)
        out["peak_rss_mib"] = {k: peak_rss_mib(p) for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=60)
    report(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def report(out):
    d = out["decode"]
    print(f"\n# {os.path.basename(out['model'])} — commit {out['commit']}, {out['cpu']}, {out['threads']} threads, "
          f"medians of {out['runs']} runs; llama-server: {out.get('llama_build', 'unknown build')}")
    base = d["llama.cpp serial"]["median"]
    print("| decode | tok/s | / llama.cpp serial |\n|---|---:|---:|")
    for k, v in d.items():
        print(f"| {k} | {v['median']:.1f} | {v['median'] / base:.2f} |")
    print("\n| prefill prompt | TensorFold tok/s | llama.cpp tok/s | ratio |\n|---:|---:|---:|---:|")
    for n, v in out["prefill"].items():
        a, b = v["tensorfold"]["median"], v["llama.cpp"]["median"]
        print(f"| ~{n} tokens | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    if out.get("long_decode"):
        v = out["long_decode"]
        a, b = v["tensorfold"]["median"], v["llama.cpp"]["median"]
        print(f"\n| serial decode after a ~{v['context']}-token prompt | TensorFold {a:.1f} tok/s | llama.cpp "
              f"{b:.1f} tok/s | ratio {a / b:.2f} |")
    rows = out["drafted"]
    if rows:
        print("\n| kind | prompts | TF serial | TF drafted | llama.cpp serial | llama.cpp spec | TF drafted / llama.cpp "
              "serial | TF drafted / llama.cpp spec | TF drafted == serial | llama.cpp spec == serial |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in dict.fromkeys(r["kind"] for r in rows):
            rs = [r for r in rows if r["kind"] == k]
            m = {c: med([r.get(c, float("nan")) for r in rs]) for c in ["tf_serial", "tf_drafted", "llama_serial",
                                                                          "llama_spec"]}
            eq = sum(r["tf_equal"] for r in rs)
            leq = sum(r.get("llama_spec_equal", False) for r in rs)
            print(f"| {k} | {len(rs)} | {m['tf_serial']:.1f} | {m['tf_drafted']:.1f} | {m['llama_serial']:.1f} | "
                  f"{m['llama_spec']:.1f} | {m['tf_drafted'] / m['llama_serial']:.2f} | "
                  f"{m['tf_drafted'] / m['llama_spec']:.2f} | {eq}/{len(rs)} | {leq}/{len(rs)} |")
    rss = out["peak_rss_mib"]
    print("\n| peak RSS MiB | " + " | ".join(f"{k}: {v:.0f}" for k, v in rss.items()) + " |")
    if rss.get("llama.cpp"):
        print(f"TensorFold / llama.cpp peak RSS: {rss['tensorfold'] / rss['llama.cpp']:.2f}")


def llama_build(server):
    """The flags bench/build-llama-server.sh recorded next to the binary, if any."""
    try:
        with open(server + ".flags") as f:
            return f.read().strip()
    except OSError:
        return "unknown build (no .flags file)"


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{os.cpu_count()} × {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    sys.exit(main())
