#!/usr/bin/env python3
"""Two `tensorfold` binaries (A and B, e.g. two commits) on one GGUF, measured in alternation on this machine.

usage: python3 bench/engine-loop.py MODEL.gguf --a BIN_A --b BIN_B [--runs 3] [--threads 2] [--json OUT]

Rows (medians over --runs; every measurement runs A then B, so a slow period of the machine hits both):
  bench decode          `tensorfold bench MODEL --prompt-tokens 64 --gen-tokens 128`: serial decode tok/s.
  bench N streams       `tensorfold bench MODEL --streams N --prompt-tokens 64 --gen-tokens 64` for N in 1, 4, 8, 16:
                        aggregate decode tok/s.
  serve --parallel P    `tensorfold serve MODEL --parallel P --no-prefix-cache` (P = 1 and the default), one chat
                        request at a time, greedy, 128 tokens, "draft": false: (completion tokens - 1) / decode_s
                        of the reply's `tensorfold` receipt.
  serve code edits      the same server at the default --parallel with `--draft-branches 3` (tree windows): the
                        code-edit prompts of bench/prompts/drafting.json, drafted, greedy: decode tok/s, and
                        whether every drafted reply equals its `"draft": false` reply (token_sha).
Plain Python (urllib); no other package.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request


def bench(binary, model, threads, extra):
    cmd = [binary, "bench", model, "--threads", str(threads), "--json"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class Server:
    def __init__(self, binary, model, threads, extra):
        cmd = [binary, "serve", model, "--host", "127.0.0.1", "--port", "0", "--threads", str(threads),
               "--no-prefix-cache"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        marker = "listening on http://127.0.0.1:"
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"{cmd} exited before listening")
            if marker in line:
                self.port = int(line.split(marker)[1].split()[0].rstrip("/").split("/")[0])
                return
        raise RuntimeError(f"{cmd} did not start")

    def chat(self, messages, max_tokens, draft):
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "draft": draft}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            reply = json.loads(r.read())
        tf = reply["tensorfold"]
        n = reply["usage"]["completion_tokens"]
        return (n - 1) / max(tf["decode_s"], 1e-9), tf["token_sha"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    bins = {"A": args.a, "B": args.b}
    rows = {}

    def add(name, which, value):
        rows.setdefault(name, {"A": [], "B": []})[which].append(value)

    for run in range(args.runs):
        for which, b in bins.items():
            r = bench(b, args.model, args.threads, ["--prompt-tokens", "64", "--gen-tokens", "128", "--runs", "1"])
            add("bench decode", which, r["decode_tok_s"])
        for n in [1, 4, 8, 16]:
            for which, b in bins.items():
                r = bench(b, args.model, args.threads,
                          ["--streams", str(n), "--prompt-tokens", "64", "--gen-tokens", "64", "--runs", "1"])
                add(f"bench {n} streams (aggregate)", which, r["aggregate_decode_tok_s"])
        print(f"run {run + 1}: bench rows done", flush=True)

    ask = [{"role": "user", "content": "Write a Python function that merges two sorted lists, with a docstring."}]
    prompts = [p["messages"] for p in json.load(open("bench/prompts/drafting.json")) if p["kind"] == "code-edit"]
    equal = {"A": 0, "B": 0}
    for label, extra in [("serve --parallel 1", ["--parallel", "1"]), ("serve default --parallel", [])]:
        servers = {w: Server(b, args.model, args.threads, extra) for w, b in bins.items()}
        try:
            for w, s in servers.items():
                s.chat(ask, 8, False)  # warm-up
            for _ in range(args.runs):
                for w, s in servers.items():
                    add(label + ", serial decode", w, s.chat(ask, 128, False)[0])
        finally:
            for s in servers.values():
                s.stop()
    servers = {w: Server(b, args.model, args.threads, ["--draft-branches", "3"]) for w, b in bins.items()}
    try:
        for msgs in prompts:
            for w, s in servers.items():
                tps, sha = s.chat(msgs, 128, True)
                _, serial_sha = s.chat(msgs, 128, False)
                add("serve code edits, drafted (tree windows)", w, tps)
                equal[w] += sha == serial_sha
    finally:
        for s in servers.values():
            s.stop()

    print(f"\nA = {args.a}\nB = {args.b}\n")
    print("| measurement | A tok/s | B tok/s | B / A |")
    print("|---|---:|---:|---:|")
    table = []
    for name, v in rows.items():
        a, b = statistics.median(v["A"]), statistics.median(v["B"])
        table.append({"row": name, "a": a, "b": b, "a_runs": v["A"], "b_runs": v["B"]})
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print(f"\ndrafted == serial on code edits: A {equal['A']}/{len(prompts)}, B {equal['B']}/{len(prompts)}")
    if args.json:
        json.dump({"rows": table, "equal": equal, "prompts": len(prompts)}, open(args.json, "w"), indent=1)
    if equal["B"] != len(prompts):
        sys.exit(1)


if __name__ == "__main__":
    main()
