#!/usr/bin/env python3
"""A storm of stalled clients against a running `tensorfold serve`, and how the server holds up.

usage: python3 bench/slow-clients.py --base-url http://127.0.0.1:PORT [--half-open 5000] [--trickle 200]
                                     [--header-timeout 10] [--body-timeout 30] [--json OUT]

Opens HALF_OPEN connections that each send part of a request header and then nothing, and TRICKLE connections
that send a whole header announcing a 4 KiB body and then one body byte a second. While they are all open it
times GET /health and a short chat request (max_tokens 8, greedy) five times each. Then it waits for the server
to close every stalled connection and reports, per kind, how long after it was opened the last one was closed,
against the server's --header-timeout / --body-timeout (pass the values the server runs with).
Checks (one line each, "ALL OK" when all hold): every /health and chat answered 200 within 1 s; every stalled
connection closed by the server within its timeout plus 2 s; the trickling ones answered 408 first.
Only the standard library.
"""
import argparse
import http.client
import json
import resource
import selectors
import socket
import sys
import threading
import time
import urllib.parse

HALF = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-"
HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4096\r\n\r\n")


def timed(host, port, method, path, body=None):
    t = time.time()
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request(method, path, body=json.dumps(body) if body else None,
              headers={"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, time.time() - t


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--half-open", type=int, default=5000)
    p.add_argument("--trickle", type=int, default=200)
    p.add_argument("--header-timeout", type=float, default=10)
    p.add_argument("--body-timeout", type=float, default=30)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    u = urllib.parse.urlparse(a.base_url.removesuffix("/").removesuffix("/v1"))
    host, port = u.hostname, u.port
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = a.half_open + a.trickle + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))

    sel = selectors.DefaultSelector()
    opened = {}
    kinds = {}
    t0 = time.time()
    for i in range(a.half_open + a.trickle):
        s = socket.create_connection((host, port))
        kind = "half-open" if i < a.half_open else "trickle"
        s.sendall(HALF if kind == "half-open" else HEAD)
        s.setblocking(False)
        opened[s] = time.time()
        kinds[s] = kind
        sel.register(s, selectors.EVENT_READ)
    open_s = time.time() - t0
    trickling = [s for s, k in kinds.items() if k == "trickle"]
    stop = threading.Event()

    def feed():
        while not stop.is_set():
            for s in list(trickling):
                try:
                    s.send(b" ")
                except OSError:
                    trickling.remove(s)
            stop.wait(1.0)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()

    probes = []
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
    for _ in range(5):
        probes.append(("health",) + timed(host, port, "GET", "/health"))
        probes.append(("chat",) + timed(host, port, "POST", "/v1/chat/completions", chat))

    closed = {}
    answered = {}
    deadline = time.time() + max(a.header_timeout, a.body_timeout) + 30
    while len(closed) < len(opened) and time.time() < deadline:
        for key, _ in sel.select(timeout=1.0):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if data:
                answered[s] = answered.get(s, b"") + data
                continue
            closed[s] = time.time() - opened[s]
            sel.unregister(s)
            s.close()
    stop.set()

    def summary(kind):
        ts = [closed[s] for s in opened if kinds[s] == kind and s in closed]
        left = sum(1 for s in opened if kinds[s] == kind and s not in closed)
        statuses = {}
        for s in opened:
            if kinds[s] == kind and s in answered:
                code = answered[s].split(b" ", 2)[1].decode() if answered[s].startswith(b"HTTP/") else "?"
                statuses[code] = statuses.get(code, 0) + 1
        return {"closed": len(ts), "still_open": left, "first_close_s": round(min(ts), 2) if ts else None,
                "last_close_s": round(max(ts), 2) if ts else None, "answers": statuses}

    result = {
        "half_open": a.half_open, "trickle": a.trickle, "open_all_s": round(open_s, 2),
        "probes": [{"what": w, "status": st, "seconds": round(d, 3)} for w, st, d in probes],
        "half_open_closes": summary("half-open"), "trickle_closes": summary("trickle"),
    }
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    h, t = result["half_open_closes"], result["trickle_closes"]
    checks = [
        ("/health and chat answered 200 within 1 s while the storm is open",
         all(st == 200 and d <= 1.0 for _, st, d in probes), json.dumps(result["probes"])),
        ("every half-open connection closed within --header-timeout + 2 s",
         h["still_open"] == 0 and (h["last_close_s"] or 0) <= a.header_timeout + 2, json.dumps(h)),
        ("every trickling connection answered 408 and closed within --body-timeout + 2 s",
         t["still_open"] == 0 and (t["last_close_s"] or 0) <= a.body_timeout + 2
         and t["answers"].get("408", 0) == a.trickle, json.dumps(t)),
    ]
    for name, ok, detail in checks:
        print(f"{'ok' if ok else 'FAIL'}: {name} ({detail})")
    if all(ok for _, ok, _ in checks):
        print("ALL OK")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
