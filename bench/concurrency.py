#!/usr/bin/env python3
"""Shared rounds and the prefix cache, measured through the HTTP API of `tensorfold serve`.

usage: python3 bench/concurrency.py MODEL.gguf [--engine tensorfold|llama-server] [--bin BINARY]
                                   [--streams 1,2,4,8,16] [--max-tokens 64] [--parallel 16] [--threads 2]
                                   [--json OUT]

Starts the server (`tensorfold serve`, or llama.cpp's `llama-server` built by bench/build-llama-server.sh, on
the same GGUF with --parallel P slots), then:
  A. N concurrent chat requests (distinct prompts, greedy, max_tokens) for each N: aggregate generated tok/s
     (all completion tokens / wall time from first send to last reply) and the median per-stream decode tok/s
     ((completion tokens - 1) / tensorfold.decode_s; llama-server: its own timings.predicted_per_second);
  B. time to first token of a short request sent while a ~2k-token prompt is filling (streamed; the short
     request is sent when the long one has been accepted), against the same short request alone;
  C. a ~4k-token prompt sent twice (max_tokens 1): time to first token cold vs served from the prefix cache.
Only the standard library: raw HTTP over http.client, one thread per stream.
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time

WORDS = ("alpha beta gamma delta river stone cloud maple copper orbit lantern meadow signal harbor velvet "
         "quartz ember willow canyon pixel").split()


def filler(n_words, salt):
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n_words))


def start_server(args):
    if args.engine == "llama-server":
        # One slot per stream, each with the whole context (the KV is not shared across slots otherwise).
        cmd = [args.bin, "-m", args.model, "--port", str(args.port), "--host", "127.0.0.1", "-t", str(args.threads),
               "-tb", str(args.threads), "-np", str(args.parallel), "-c", str(8192 * args.parallel), "--no-webui"]
    else:
        cmd = [args.bin, "serve", args.model, "--port", "0", "--threads", str(args.threads), "--parallel",
               str(args.parallel), "--no-live-line", "--context", "8192"]
    # Both print "... listening on http://127.0.0.1:PORT" on stderr once they accept requests.
    ready = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.time() + 300
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("server exited:\n" + "".join(lines))
        lines.append(line)
        m = ready.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            banner = "".join(lines) if args.engine == "tensorfold" else " ".join(cmd) + "\n"
            return proc, int(m.group(1)), banner
    raise SystemExit("server did not start")


def chat(port, content, max_tokens, stream=False):
    """Returns (reply json or None, ttft seconds or None, total seconds)."""
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": stream,
                       "stream_options": {"include_usage": True} if stream else None})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if not stream:
        data = json.loads(resp.read())
        return data, None, time.time() - t0
    ttft, last = None, None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if ttft is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
            ttft = time.time() - t0
        if "tensorfold" in chunk or "usage" in chunk and chunk["usage"]:
            last = chunk
    return last, ttft, time.time() - t0


def workload_a(port, n, max_tokens):
    results = [None] * n
    prompts = [f"Write a short paragraph about {WORDS[i % len(WORDS)]} number {i}." for i in range(n)]

    def one(i):
        results[i] = chat(port, prompts[i], max_tokens)[0]

    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    per = [per_stream_tps(r) for r in results]
    return {"streams": n, "tokens": tokens, "wall_s": wall, "aggregate_tps": tokens / wall,
            "per_stream_tps_median": statistics.median(per)}


def per_stream_tps(r):
    if "tensorfold" in r:
        return (r["usage"]["completion_tokens"] - 1) / max(r["tensorfold"]["decode_s"], 1e-9)
    return r["timings"]["predicted_per_second"]


def workload_b(port):
    long_prompt = "Summarize this text: " + filler(1500, 3)
    short = "Say hello."
    alone = chat(port, short, 8, stream=True)[1]
    box = {}
    t = threading.Thread(target=lambda: box.update(r=chat(port, long_prompt, 8, stream=True)))
    t.start()
    time.sleep(0.3)  # a benchmark's arrival offset, not synchronization: the long prompt is filling by then
    during = chat(port, short, 8, stream=True)[1]
    t.join()
    return {"short_ttft_alone_s": alone, "short_ttft_during_long_prefill_s": during,
            "long_prompt_tokens": box["r"][0]["usage"]["prompt_tokens"]}


def workload_c(port):
    prompt = "Read this and answer with one word: " + filler(3700, 5)
    cold = chat(port, prompt, 1, stream=True)
    warm = chat(port, prompt, 1, stream=True)
    return {"prompt_tokens": cold[0]["usage"]["prompt_tokens"], "cold_ttft_s": cold[1] or cold[2],
            "cached_ttft_s": warm[1] or warm[2],
            "cached_tokens": (warm[0]["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--engine", choices=["tensorfold", "llama-server"], default="tensorfold")
    ap.add_argument("--bin", help="default: target/release/tensorfold or .llama/bin/llama-server")
    ap.add_argument("--port", type=int, default=18080, help="llama-server's port (tensorfold picks a free one)")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.bin is None:
        args.bin = ".llama/bin/llama-server" if args.engine == "llama-server" else "target/release/tensorfold"
    proc, port, banner = start_server(args)
    print(banner, end="")
    out = {"engine": args.engine, "model": args.model, "parallel": args.parallel, "a": [], "b": None, "c": None}
    try:
        chat(port, "warm up", 4)
        print("| streams | tokens | wall s | aggregate tok/s | per-stream decode tok/s (median) |")
        print("|---:|---:|---:|---:|---:|")
        for n in [int(x) for x in args.streams.split(",")]:
            r = workload_a(port, n, args.max_tokens)
            out["a"].append(r)
            print(f"| {n} | {r['tokens']} | {r['wall_s']:.2f} | {r['aggregate_tps']:.1f} | "
                  f"{r['per_stream_tps_median']:.1f} |", flush=True)
        out["b"] = workload_b(port)
        print("B:", json.dumps(out["b"]), flush=True)
        out["c"] = workload_c(port)
        print("C:", json.dumps(out["c"]), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
