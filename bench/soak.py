#!/usr/bin/env python3
"""A soak of a running `tensorfold serve`: many clients for minutes of mixed traffic, then the checks.

usage: python3 bench/soak.py --base-url http://127.0.0.1:PORT --pid PID [--clients 64] [--seconds 600]
                             [--warmup 60] [--json OUT] [--model ID]

Each client loops over requests drawn from a fixed seeded mix:
  - the route: /v1/chat/completions, /v1/completions or /v1/responses; streamed or not;
  - the prompt: a long shared preamble (the prefix cache serves it) and one of 16 questions, greedy or sampled
    with a seed, max_tokens 8, 24 or 48: 96 distinct requests in all, each sent many times;
  - what the client does: reads the whole reply (most), disconnects right after sending (mid-prefill),
    disconnects after two streamed events (mid-stream), or sends a prompt longer than the context (400
    context_length_exceeded expected).
Then it waits for the server to go idle and checks, printing one line each and "ALL OK" when all hold:
  - no 5xx, and every refused request has the expected status and error shape;
  - RSS (from /proc/PID/status) at the end within 5% of RSS after the warm-up;
  - /health: no request running or waiting, no KV block held beyond the prefix cache's idle blocks, the stored
    responses within the server's bounds (--store-max-entries and --store-max-mib; 1024 and 64 by default);
  - every completed reply's token_sha equals the token_sha of the same request sent alone afterwards.
Only the standard library (http.client, one thread per client).
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
from collections import defaultdict

PREAMBLE = ("You are a careful assistant for a team that maintains a large code base. Answer briefly. " * 12).strip()
QUESTIONS = [f"Question {i}: name one {w} in a sentence." for i, w in enumerate(
    "colour fruit river city metal tree bird planet tool sport song river2 number shape fish stone".split())]
ROUTES = ["chat", "completions", "responses"]
MAX_TOKENS = [8, 24, 48]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Soak:
    def __init__(self, args):
        u = urllib.parse.urlparse(args.base_url)
        self.host, self.port = u.hostname, u.port
        self.args = args
        self.lock = threading.Lock()
        self.statuses = defaultdict(int)  # (kind, status) -> count
        self.failures = []
        self.shas = defaultdict(set)  # request key -> token_sha values of completed replies
        self.completed = 0
        self.stop_at = 0.0
        self.context = None
        self.model = args.model

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=300)

    def get(self, path):
        c = self.conn()
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, json.loads(body)

    def fail(self, msg):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(msg)

    def count(self, kind, status):
        with self.lock:
            self.statuses[(kind, status)] += 1

    @staticmethod
    def body(key, stream, prompt_text=None):
        route, q, max_tokens, sampled = key
        text = prompt_text if prompt_text is not None else f"{PREAMBLE}\n\n{QUESTIONS[q]}"
        common = {"temperature": 0.8 if sampled else 0.0, "seed": 1000 + q if sampled else None, "stream": stream}
        common = {k: v for k, v in common.items() if v is not None}
        if route == "chat":
            b = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **common}
            if stream:
                b["stream_options"] = {"include_usage": True}
            return "/v1/chat/completions", b
        if route == "completions":
            return "/v1/completions", {"prompt": text, "max_tokens": max_tokens, **common}
        return "/v1/responses", {"input": text, "max_output_tokens": max_tokens, **common}

    @staticmethod
    def receipt_of_events(route, raw):
        """The token_sha of a streamed reply (None when it has no final receipt)."""
        for line in raw.decode("utf-8", "replace").splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            try:
                ev = json.loads(data)
            except ValueError:
                return None
            if route == "responses":
                if ev.get("type") in ("response.completed", "response.incomplete"):
                    return ev["response"]["tensorfold"]["token_sha"]
            elif "tensorfold" in ev:
                return ev["tensorfold"]["token_sha"]
        return None

    def send(self, path, body):
        c = self.conn()
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return c

    def complete(self, key, stream):
        """Sends one request and reads it whole: the token_sha, or None after recording a failure."""
        path, body = self.body(key, stream)
        if self.model:
            body["model"] = self.model
        c = self.send(path, body)
        r = c.getresponse()
        raw = r.read()
        c.close()
        self.count("complete", r.status)
        if r.status == 429:
            return None  # the queue was full (disconnected requests not yet ended): a refusal, not a failure
        if r.status != 200:
            self.fail(f"{path} {key} stream={stream}: {r.status} {raw[:200]!r}")
            return None
        if stream:
            sha = self.receipt_of_events(key[0], raw)
        else:
            sha = json.loads(raw).get("tensorfold", {}).get("token_sha")
        if sha is None:
            self.fail(f"{path} {key} stream={stream}: no receipt in {raw[-300:]!r}")
        return sha

    def one(self, rng):
        key = (rng.choice(ROUTES), rng.randrange(len(QUESTIONS)), rng.choice(MAX_TOKENS), rng.random() < 0.5)
        stream = rng.random() < 0.5
        what = rng.random()
        if what < 0.75:
            sha = self.complete(key, stream)
            if sha is not None:
                with self.lock:
                    self.shas[key].add(sha)
                    self.completed += 1
        elif what < 0.85:
            # Mid-prefill: the request goes out, the client goes away.
            path, body = self.body(key, stream)
            c = self.send(path, body)
            c.sock.close()
            self.count("disconnect-prefill", 0)
        elif what < 0.95:
            # Mid-stream: two events, then away.
            path, body = self.body(key, True)
            c = self.send(path, body)
            r = c.getresponse()
            self.count("disconnect-stream", r.status)
            if r.status != 200:
                self.fail(f"{path} {key} (to be cut): {r.status}")
            else:
                seen = 0
                while seen < 2:
                    line = r.fp.readline()
                    if not line:
                        break
                    seen += line.startswith(b"data:")
            c.sock.close()
        else:
            # Longer than the context: refused with the route's error shape.
            long_text = " ".join(["lantern"] * (2 * self.context))
            path, body = self.body(key, False, long_text)
            c = self.send(path, body)
            r = c.getresponse()
            raw = r.read()
            c.close()
            self.count("oversized", r.status)
            try:
                err = json.loads(raw)["error"]
                ok = r.status == 400 and err.get("code") == "context_length_exceeded"
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                self.fail(f"{path} oversized: {r.status} {raw[:200]!r}")

    def client(self, i):
        rng = random.Random(i)
        while time.time() < self.stop_at:
            try:
                self.one(rng)
            except (OSError, http.client.HTTPException) as e:
                self.fail(f"client {i}: {type(e).__name__}: {e}")

    def run(self):
        a = self.args
        _, models = self.get("/v1/models")
        m = models["data"][0]
        self.context = m["max_model_len"]
        self.model = self.model or m["id"]
        start = time.time()
        self.stop_at = start + a.seconds
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(a.clients)]
        for t in threads:
            t.start()
        rss_warm = None
        samples = []
        while any(t.is_alive() for t in threads):
            time.sleep(1.0)
            now = time.time() - start
            r = rss_kib(a.pid)
            samples.append((round(now, 1), r))
            if rss_warm is None and now >= a.warmup:
                rss_warm = r
        for t in threads:
            t.join()
        elapsed = time.time() - start
        # Idle again: poll /health (the disconnected requests end when the engine notices them).
        deadline = time.time() + 60
        while True:
            _, h = self.get("/health")
            if h["requests_running"] == 0 and h["requests_waiting"] == 0 and h["kv_blocks_used"] == 0:
                break
            if time.time() > deadline:
                break
            time.sleep(0.2)
        rss_end = rss_kib(a.pid)
        rss_warm = rss_warm or samples[0][1]
        # Solo: each distinct request that completed, alone, non-streamed.
        mismatches = []
        for key, shas in sorted(self.shas.items()):
            solo = self.complete(key, False)
            if shas != {solo}:
                mismatches.append((key, sorted(shas), solo))
        fivexx = sum(n for (_, s), n in self.statuses.items() if s >= 500)
        growth = (rss_end - rss_warm) / rss_warm
        result = {
            "clients": a.clients, "seconds": round(elapsed, 1), "completed": self.completed,
            "distinct_requests": len(self.shas),
            "statuses": {f"{k}:{s}": n for (k, s), n in sorted(self.statuses.items())},
            "rss_warm_mib": round(rss_warm / 1024, 1), "rss_end_mib": round(rss_end / 1024, 1),
            "rss_growth": round(growth, 4), "health_end": h, "solo_mismatches": len(mismatches),
            "failures": self.failures[:10],
        }
        print(json.dumps(result, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({**result, "rss_samples": samples}, f, indent=1)
        checks = [
            ("no 5xx", fivexx == 0, f"{fivexx}"),
            ("every refusal as expected, no client error", not self.failures, "; ".join(self.failures[:5])),
            ("completed replies", self.completed > 0, f"{self.completed}"),
            ("RSS within 5% of its warm value", abs(growth) <= 0.05, f"{rss_warm} -> {rss_end} KiB"),
            ("idle at the end", h["requests_running"] == 0 and h["requests_waiting"] == 0, json.dumps(h)),
            ("no KV block held beyond the prefix cache", h["kv_blocks_used"] == 0, json.dumps(h)),
            ("stored responses bounded in entries and bytes",
             h["stored_responses"] <= a.store_max_entries and h["stored_response_bytes"] <= a.store_max_mib << 20,
             f"{h['stored_responses']} entries, {h['stored_response_bytes']} bytes"),
            ("every completed reply equals its solo run", not mismatches, f"{mismatches[:3]}"),
        ]
        for name, ok, detail in checks:
            print(f"{'ok' if ok else 'FAIL'}: {name} ({detail})")
        if all(ok for _, ok, _ in checks):
            print("ALL OK")
            return 0
        return 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080 (a /v1 suffix is ok)")
    p.add_argument("--pid", type=int, required=True, help="the server's process id (for its RSS)")
    p.add_argument("--model", default=None)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--warmup", type=float, default=60, help="seconds before the RSS baseline is taken")
    p.add_argument("--store-max-entries", type=int, default=1024, help="the server's --store-max-entries")
    p.add_argument("--store-max-mib", type=int, default=64, help="the server's --store-max-mib")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    a.base_url = a.base_url.removesuffix("/").removesuffix("/v1")
    sys.exit(Soak(a).run())


if __name__ == "__main__":
    main()
