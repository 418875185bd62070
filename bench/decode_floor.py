#!/usr/bin/env python3
"""Serial decode against the memory-bandwidth floor, measured in one run.

The floor of one serial decode step is the bytes of weights it reads (`weight_bytes_per_token` from `tensorfold
bench --json`) over the device's copy bandwidth (read + write of a 4 GiB buffer, measured here with torch before and
after the rounds, so a drifting machine shows). Rounds alternate the shapes, and optionally module variants, so
every number is taken under the same conditions; medians and ranges per shape and variant are printed, with the
percentage of the floor.

Run on the GPU machine from the repository root (after scripts/device-tests.sh built .device/):
  python3 bench/decode_floor.py [--rounds 4] [--variant NAME=ENV=VALUE,ENV=VALUE ...] [--out FILE.json]
A variant sets environment variables for its runs (for instance
`--variant pipe=TF_CUDA_DEFINES=IL_PIPE=0`); the pseudo-variable ARGS adds
space-separated arguments to `tensorfold bench` instead (`--variant serial=ARGS=--no-run-ahead`) and BIN another
`tensorfold` binary (an A/B of host code); without any variant, the default build runs.
`--copy-gbs X` skips the torch measurement and uses X GB/s (for machines without torch, or for a smoke test with
`--backend cpu`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = ["qwen2.5-1.5b", "qwen2.5-7b", "llama-3-8b"]


def copy_bandwidth_gbs():
    """Read + write bandwidth of a device-to-device copy of 4 GiB, GB/s (median of 3 timings of 10 copies)."""
    try:
        import torch
    except ImportError:
        sys.exit("decode_floor: torch is needed to measure the copy bandwidth (or pass --copy-gbs)")
    if not torch.cuda.is_available():
        sys.exit("decode_floor: no CUDA device for torch (pass --copy-gbs to give the bandwidth)")
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 10)
    del x, y
    torch.cuda.empty_cache()
    return 2 * (4 << 30) / statistics.median(times) / 1e6


def parse_variant(text):
    name, _, rest = text.partition("=")
    if not name or not rest:
        raise argparse.ArgumentTypeError(f"variant {text!r}: expected NAME=ENV=VALUE[,ENV=VALUE...]")
    env = {}
    for item in rest.split(","):
        k, sep, v = item.partition("=")
        if not k or not sep:
            raise argparse.ArgumentTypeError(f"variant {text!r}: {item!r} is not ENV=VALUE")
        env[k] = v
    return name, env


def bench_once(args, shape, env):
    cmd = [
        args.tensorfold, "bench", os.path.join(args.shapes, shape + ".json"), "--load-format", "dummy",
        "--backend", args.backend, "--precision", "full", "--json", "--prompt-tokens", str(args.prompt_tokens),
        "--gen-tokens", str(args.gen_tokens), "--runs", str(args.runs),
    ]
    env = dict(env)
    if "BIN" in env:
        cmd[0] = env.pop("BIN")
    cmd += env.pop("ARGS", "").split()
    try:
        r = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=args.timeout)
    except FileNotFoundError:
        raise RuntimeError(f"no tensorfold binary at {args.tensorfold} (scripts/device-tests.sh builds it)")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{shape}: tensorfold bench took over {args.timeout} s")
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{shape}: tensorfold bench exited {r.returncode}: {' | '.join(tail)}")
    out = json.loads(r.stdout)
    return out["decode_tok_s"], out["weight_bytes_per_token"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorfold", default=".device/bin/tensorfold")
    ap.add_argument("--shapes", default=".device/shapes", help="directory of <shape>.json configs")
    ap.add_argument("--shape", action="append", help=f"shape name (repeatable; default {', '.join(SHAPES)})")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--rounds", type=int, default=4, help="alternated rounds (each shape and variant once per round)")
    ap.add_argument("--runs", type=int, default=3, help="tensorfold bench --runs (it reports their median)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per tensorfold bench call")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[])
    ap.add_argument("--copy-gbs", type=float, help="copy bandwidth in GB/s instead of measuring it")
    ap.add_argument("--out", help="also write every number as JSON here")
    args = ap.parse_args()
    if args.rounds < 1 or args.runs < 1:
        ap.error("--rounds and --runs must be at least 1")
    shapes = args.shape or SHAPES
    variants = args.variant or [("default", {})]
    if len({n for n, _ in variants}) != len(variants):
        ap.error("variant names must differ")

    bw_before = args.copy_gbs or copy_bandwidth_gbs()
    print(f"copy bandwidth (read + write): {bw_before:.0f} GB/s", flush=True)
    tok = {(s, n): [] for s in shapes for n, _ in variants}
    wbytes = {}
    t0 = time.time()
    for rnd in range(1, args.rounds + 1):
        for s in shapes:
            line = [f"round {rnd} {s}:"]
            for name, env in variants:
                t, b = bench_once(args, s, env)
                tok[(s, name)].append(t)
                wbytes[s] = b
                line.append(f"{name} {t:.1f}")
            print(" ".join(line), f"({time.time() - t0:.0f} s)", flush=True)
    bw_after = args.copy_gbs or copy_bandwidth_gbs()
    print(f"copy bandwidth after the rounds: {bw_after:.0f} GB/s", flush=True)
    bw = (bw_before + bw_after) / 2

    print("\n| shape | variant | decode tok/s median | range | floor tok/s | % of floor (median, range) |")
    print("|---|---|---:|---:|---:|---:|")
    rows = []
    for s in shapes:
        floor = bw * 1e9 / wbytes[s]
        for name, _ in variants:
            v = tok[(s, name)]
            med = statistics.median(v)
            rows.append({"shape": s, "variant": name, "decode_tok_s": v, "median": med, "floor_tok_s": floor,
                         "weight_bytes_per_token": wbytes[s]})
            print(f"| {s} | {name} | {med:.1f} | {min(v):.1f}–{max(v):.1f} | {floor:.1f} | "
                  f"{100 * med / floor:.1f}% ({100 * min(v) / floor:.1f}–{100 * max(v) / floor:.1f}%) |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_gbs_before": bw_before, "copy_gbs_after": bw_after, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        sys.exit(f"decode_floor: {e}")
