#!/usr/bin/env python3
"""What a grammar costs and what drafting gains under one, on one `tensorfold serve`.

usage: python3 bench/structured.py MODEL.gguf [--bin target/release/tensorfold] [--runs 3] [--threads 2]

One server (`--no-prefix-cache`, default drafting). Greedy chat requests, 128 tokens at most, timed by the
reply's `tensorfold` receipt (decode tok/s = (completion tokens - 1) / decode_s):
  mask cost   the same prompt serially (`"draft": false`) without a grammar and with `response_format`
              `json_object`: the extra milliseconds per token of the constrained reply (mask, masked draw,
              matcher advance) against the unconstrained step.
  speedup     drafted / serial decode tok/s on schema-constrained prompts (`json_schema`, strict) and on the
              same prompts unconstrained; every drafted reply is checked equal to its serial one (token_sha).
Plain Python (urllib); medians over --runs.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "maxItems": 3}}, "required": ["name", "age", "tags"]},
    {"type": "object", "properties": {"file": {"type": "string", "maxLength": 40},
                                      "edits": {"type": "array", "maxItems": 4, "items": {
                                          "type": "object", "properties": {"line": {"type": "integer"},
                                                                           "old": {"type": "string", "maxLength": 60},
                                                                           "new": {"type": "string", "maxLength": 60}},
                                          "required": ["line", "old", "new"]}}}, "required": ["file", "edits"]},
]
PROMPTS = [
    "Describe a person as JSON with name, age and tags.",
    "Rename the variable `cnt` to `count` in this code and report the edits as JSON:\n"
    "def total(xs):\n    cnt = 0\n    for x in xs:\n        cnt += x\n    return cnt\n",
]


def start(binary, model, threads):
    cmd = [binary, "serve", model, "--host", "127.0.0.1", "--port", "0", "--threads", str(threads), "--no-prefix-cache"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marker = "listening on http://127.0.0.1:"
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("the server exited before listening")
        if marker in line:
            return proc, int(line.split(marker)[1].split()[0].split("/")[0])
    raise RuntimeError("the server did not start")


def chat(port, prompt, draft, response_format=None):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "temperature": 0, "draft": draft}
    if response_format:
        body["response_format"] = response_format
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    tf = reply["tensorfold"]
    n = reply["usage"]["completion_tokens"]
    return (n - 1) / max(tf["decode_s"], 1e-9), tf["token_sha"], n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--bin", default="target/release/tensorfold")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    proc, port = start(args.bin, args.model, args.threads)
    try:
        chat(port, PROMPTS[0], False)  # warm-up
        plain, constrained = [], []
        for _ in range(args.runs):
            plain.append(chat(port, PROMPTS[0], False)[0])
            constrained.append(chat(port, PROMPTS[0], False, {"type": "json_object"})[0])
        p, c = statistics.median(plain), statistics.median(constrained)
        print(f"serial decode: unconstrained {p:.1f} tok/s ({1e3 / p:.2f} ms/token), json_object {c:.1f} tok/s "
              f"({1e3 / c:.2f} ms/token): the grammar adds {1e3 / c - 1e3 / p:.2f} ms/token, "
              f"{100 * (p / c - 1):.1f}% of a step")
        rows = []
        for prompt, schema in zip(PROMPTS, SCHEMAS):
            rf = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
            for label, fmt in [("schema", rf), ("unconstrained", None)]:
                d, s, eq = [], [], True
                for _ in range(args.runs):
                    dt, dsha, _ = chat(port, prompt, True, fmt)
                    st, ssha, _ = chat(port, prompt, False, fmt)
                    d.append(dt)
                    s.append(st)
                    eq &= dsha == ssha
                rows.append((label, prompt.splitlines()[0][:40], statistics.median(s), statistics.median(d), eq))
        print("\n| prompt | reply | serial tok/s | drafted tok/s | speedup | drafted == serial |")
        print("|---|---|---:|---:|---:|---|")
        for label, prompt, s, d, eq in rows:
            print(f"| {prompt} | {label} | {s:.1f} | {d:.1f} | {d / s:.2f}x | {'yes' if eq else 'NO'} |")
        if not all(r[4] for r in rows):
            sys.exit(1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
