#!/usr/bin/env python3
"""Compares three running `tensorfold serve` processes of one model through the official `openai` package
(completions, plain prompts: the tiny models have no chat template):

    backends_client.py --ref URL --serial URL --test URL --model ID

- `--ref`: the reference, serial and solo (`--backend cpu --no-drafts --parallel 1`);
- `--serial`: the backend under test, serial and solo (`--no-drafts --parallel 1`);
- `--test`: the backend under test with drafting and shared rounds (`--min-drafts 1 --parallel 8`).

Each request runs greedy and sampled (temperature 0.8, a seed). The checks: every reply of `--serial` equals the
reference's (text and `token_sha`; CPU == CUDA in the portable arithmetic); on `--test`, a non-streamed reply, a
streamed reply and the same requests all streamed at once equal the serial run, and the drafted rounds happened
(`tensorfold.drafted` > 0 on the replies that ran more than one round). scripts/device-run.sh `serve` starts the
servers, on the tiny shape, for every quantized type.
"""

import argparse
import sys
import threading
import time
import traceback

import harness
import openai

ARGS = None
CLIENTS = {}

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Write one sentence about the sea.",
    "abc abc abc abc abc abc abc abc",
    "Translate to French: good morning, my friend.",
]


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def requests():
    """(name, keyword arguments) of every request compared."""
    out = []
    for i, p in enumerate(PROMPTS):
        out.append((f"p{i}-greedy", dict(prompt=p, temperature=0, max_tokens=ARGS.max_tokens)))
        out.append((f"p{i}-seed", dict(prompt=p, temperature=0.8, seed=31 + i, max_tokens=ARGS.max_tokens)))
    return out


def tf_of(obj):
    tf = (obj.model_extra or {}).get("tensorfold")
    check(isinstance(tf, dict) and isinstance(tf.get("token_sha"), str), f"no tensorfold object on {obj}")
    return tf


def complete(server, **kw):
    r = CLIENTS[server].completions.create(model=ARGS.model, **kw)
    tf = tf_of(r)
    return r.choices[0].text, tf["token_sha"], tf


def stream(server, **kw):
    chunks = list(CLIENTS[server].completions.create(model=ARGS.model, stream=True, **kw))
    check(chunks, "no chunks")
    text = "".join(c.choices[0].text or "" for c in chunks if c.choices)
    return text, tf_of(chunks[-1])["token_sha"]


SERIAL = {}


def t_serial_equals_reference():
    bad = []
    for name, kw in requests():
        ref = complete("ref", **kw)[:2]
        got = complete("serial", **kw)[:2]
        SERIAL[name] = got
        if got != ref:
            bad.append(f"{name}: serial {got} != reference {ref}")
    check(not bad, "\n".join(bad))


def t_drafted_equals_serial():
    bad, drafted = [], 0
    for name, kw in requests():
        text, sha, tf = complete("test", **kw)
        drafted += tf["drafted"]
        if (text, sha) != SERIAL[name]:
            bad.append(f"{name}: drafted {(text, sha)} != serial {SERIAL[name]} ({tf})")
    check(not bad, "\n".join(bad))
    check(drafted > 0, "no request drafted a token")
    print(f"     drafted tokens over {len(requests())} replies: {drafted}")


def t_streamed_equals_serial():
    bad = []
    for name, kw in requests():
        got = stream("test", **kw)
        if got != SERIAL[name]:
            bad.append(f"{name}: streamed {got} != serial {SERIAL[name]}")
    check(not bad, "\n".join(bad))


def t_concurrent_equal_serial():
    reqs = requests()
    results, errors = [None] * len(reqs), [None] * len(reqs)
    barrier = threading.Barrier(len(reqs))

    def worker(i):
        try:
            barrier.wait(timeout=60)
            results[i] = stream("test", **reqs[i][1])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[i] = "".join(traceback.format_exception(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1, 180 - (time.time() - started)))
    check(not any(t.is_alive() for t in threads), "concurrent streams did not finish within 180 s")
    bad = []
    for i, (name, _) in enumerate(reqs):
        if errors[i]:
            bad.append(f"{name} failed:\n{errors[i]}")
        elif results[i] != SERIAL[name]:
            bad.append(f"{name}: concurrent {results[i]} != serial {SERIAL[name]}")
    check(not bad, "\n".join(bad))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--ref", required=True)
    p.add_argument("--serial", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=24)
    ARGS = p.parse_args()
    for k in ["ref", "serial", "test"]:
        CLIENTS[k] = openai.OpenAI(base_url=getattr(ARGS, k), api_key="none", max_retries=0, timeout=120)
    print(f"openai {openai.__version__}, model {ARGS.model}")
    return harness.run_all(
        [t_serial_equals_reference, t_drafted_equals_serial, t_streamed_equals_serial, t_concurrent_equal_serial]
    )


if __name__ == "__main__":
    sys.exit(main())
