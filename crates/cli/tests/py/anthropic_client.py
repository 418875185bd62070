#!/usr/bin/env python3
"""Anthropic's Messages API against a running `tensorfold serve`, through the official `anthropic` Python package:
`messages.create`, `messages.stream` (text_stream == the non-streamed text, same token_sha), the raw event order,
stop sequences, forced `tool_use` (tool_choice any / tool; input_json_delta parts add up to the final input, which
validates against input_schema), a tool round trip, `count_tokens` == the prompt tokens usage reports, drafted ==
serial, and the SDK's error classes (400, 401, 404, 413, 429).

Run by crates/cli/tests/serve_anthropic.rs:

    anthropic_client.py --base-url http://127.0.0.1:PORT[/v1] --model ID --api-key KEY [--only t_a,t_b]

The server runs with `--api-key KEY --parallel 1 --max-queue 1 --max-body-mib 1` (the 401, 413 and 429 checks rely
on them). Prints "ALL OK" and exits 0 when every check passed.
"""

import argparse
import json
import sys
import threading
import time

import anthropic
import harness
import httpx2 as httpx
import jsonschema

ARGS = None
CLIENT = None

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city", "input_schema": CITY}
TIME = {"name": "get_time", "description": "The local time in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SCHEMAS = {"get_weather": CITY, "get_time": TIME["input_schema"]}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it there?"}]
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def extra(obj):
    return obj.model_extra or {}


def sha_of(msg):
    return extra(msg)["tensorfold"]["token_sha"]


def sampled(kw):
    """The SDK has no sampling keywords (temperature, top_p, top_k): they go in `extra_body` (greedy unless
    given)."""
    body = dict(kw.pop("extra_body", None) or {})
    body.setdefault("temperature", kw.pop("temperature", 0))
    kw["extra_body"] = body
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", HELLO)
    kw.setdefault("max_tokens", 40)
    return kw


def create(**kw):
    return CLIENT.messages.create(**sampled(kw))


def stream(**kw):
    return CLIENT.messages.stream(**sampled(kw))


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def raw_events(**kw):
    """The raw stream events of a request (dicts, in order)."""
    with CLIENT.messages.create(stream=True, **sampled(kw)) as s:
        return [ev.to_dict() for ev in s]


def check_order(events):
    """Anthropic's event order: message_start, then per block start / deltas / stop with rising indexes,
    message_delta, message_stop (pings anywhere after message_start)."""
    types = [e["type"] for e in events if e["type"] != "ping"]
    check(types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], f"order: {types}")
    msg = events[0]["message"]
    check(msg["content"] == [] and msg["role"] == "assistant" and msg["id"].startswith("msg_"), f"start: {msg}")
    check(msg["usage"]["input_tokens"] > 0, f"start usage: {msg['usage']}")
    open_index, next_index = None, 0
    for e in events[1:-2]:
        t = e["type"]
        if t == "content_block_start":
            check(open_index is None and e["index"] == next_index, f"block start out of order: {e}")
            open_index, next_index = e["index"], next_index + 1
        elif t == "content_block_delta":
            check(e["index"] == open_index, f"delta outside its block: {e}")
        elif t == "content_block_stop":
            check(e["index"] == open_index, f"stop of a block not open: {e}")
            open_index = None
        else:
            check(t == "ping", f"unexpected event {e}")
    check(open_index is None, "a block was left open")


def blocks_of(events):
    """The content blocks a raw stream adds up to (tool input from the concatenated input_json_delta parts)."""
    blocks, parts = [], {}
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[e["index"]]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                parts.setdefault(e["index"], []).append(d["partial_json"])
    for i, ps in parts.items():
        blocks[i]["input"] = json.loads("".join(ps))
    return blocks


def delta_of(events):
    return next(e for e in events if e["type"] == "message_delta")


def t_create():
    m = create()
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), f"message: {m}")
    check(m.model == ARGS.model, f"model {m.model}")
    check(m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None, f"stop: {m.stop_reason}")
    check(len(m.content) == 1 and m.content[0].type == "text" and m.content[0].text.strip(), f"content: {m.content}")
    u = m.usage
    check(u.input_tokens > 0 and 0 < u.output_tokens <= 40, f"usage: {u}")
    check(u.cache_read_input_tokens is not None and u.cache_creation_input_tokens == 0, f"usage: {u}")
    r = extra(m)["tensorfold"]
    check(len(r["token_sha"]) == 12 and r["rounds"] > 0, f"receipt: {r}")
    if m.stop_reason == "max_tokens":
        check(u.output_tokens == 40, f"max_tokens with {u.output_tokens} tokens")


def t_stream_equals_create():
    m = create(max_tokens=60)
    with stream(max_tokens=60) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check(text == text_of(m), f"text_stream {text!r} != create {text_of(m)!r}")
    check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens,
          f"final {final.stop_reason}/{final.usage} vs {m.stop_reason}/{m.usage}")
    check(final.usage.input_tokens + final.usage.cache_read_input_tokens
          == m.usage.input_tokens + m.usage.cache_read_input_tokens, f"usage {final.usage} vs {m.usage}")
    events = raw_events(max_tokens=60)
    check_order(events)
    d = delta_of(events)
    check(d["tensorfold"]["token_sha"] == sha_of(m), f"stream sha {d['tensorfold']} vs {sha_of(m)}")
    check(d["delta"]["stop_reason"] == m.stop_reason and d["usage"]["output_tokens"] == m.usage.output_tokens, f"{d}")
    check([b["text"] for b in blocks_of(events)] == [text_of(m)], "raw stream text differs")


def t_stop_sequence():
    m = create(max_tokens=40)
    words = text_of(m).split()
    check(len(words) >= 4, f"reply too short for a stop sequence: {text_of(m)!r}")
    stop = words[3]
    cut = text_of(m)[: text_of(m).index(stop)]
    s = create(max_tokens=40, stop_sequences=["\u00a7never\u00a7", stop])
    check(s.stop_reason == "stop_sequence" and s.stop_sequence == stop, f"{s.stop_reason} {s.stop_sequence!r}")
    check(text_of(s) == cut, f"{text_of(s)!r} != {cut!r}")
    events = raw_events(max_tokens=40, stop_sequences=[stop])
    d = delta_of(events)["delta"]
    check(d == {"stop_reason": "stop_sequence", "stop_sequence": stop}, f"stream delta {d}")


def tool_uses(m):
    return [b for b in m.content if b.type == "tool_use"]


def check_inputs(uses):
    for u in uses:
        check(u["name"] in SCHEMAS, f"unknown tool {u['name']}")
        jsonschema.validate(u["input"], SCHEMAS[u["name"]])


def t_tool_any():
    for one in (False, True):
        kw = dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                  tool_choice={"type": "any", "disable_parallel_tool_use": one})
        m = create(**kw)
        uses = tool_uses(m)
        check(m.stop_reason == "tool_use" and uses, f"no tool_use: {m}")
        check(not one or len(uses) == 1, f"disable_parallel_tool_use with {len(uses)} calls")
        check(all(u.id.startswith("toolu_") for u in uses), f"ids {[u.id for u in uses]}")
        got = [{"name": u.name, "input": u.input} for u in uses]
        check_inputs(got)
        events = raw_events(**kw)
        check_order(events)
        streamed = [{"name": b["name"], "input": b["input"]} for b in blocks_of(events) if b["type"] == "tool_use"]
        check(streamed == got, f"streamed calls {streamed} != {got}")
        check(delta_of(events)["delta"]["stop_reason"] == "tool_use", "stream stop_reason")
        check(delta_of(events)["tensorfold"]["token_sha"] == sha_of(m), "stream sha differs")


def t_tool_named():
    kw = dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=120, tool_choice={"type": "tool", "name": "get_time"})
    m = create(**kw)
    uses = tool_uses(m)
    check(m.stop_reason == "tool_use" and [u.name for u in uses] == ["get_time"], f"{m}")
    check_inputs([{"name": u.name, "input": u.input} for u in uses])
    with stream(**kw) as s:
        final = s.get_final_message()
    check([(u.name, u.input) for u in tool_uses(final)] == [(u.name, u.input) for u in uses], f"stream: {final}")


def t_count_tokens():
    kw = dict(messages=ASK, tools=[WEATHER, TIME], system="You are terse.")
    n = CLIENT.messages.count_tokens(model=ARGS.model, **kw).input_tokens
    m = create(max_tokens=8, **kw)
    u = m.usage
    check(n == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens, f"count {n} vs usage {u}")
    bare = CLIENT.messages.count_tokens(model=ARGS.model, messages=ASK).input_tokens
    check(bare < n, f"tools and system add tokens: {bare} vs {n}")


def t_tool_round_trip():
    first = create(messages=ASK, tools=[WEATHER], max_tokens=120, tool_choice={"type": "tool", "name": "get_weather"})
    uses = tool_uses(first)
    check(len(uses) == 1, f"{first}")
    history = ASK + [
        {"role": "assistant", "content": [b.to_dict() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": [{"type": "text", "text": "12 C and sunny"}]}]},
    ]
    before = CLIENT.messages.count_tokens(model=ARGS.model, messages=ASK, tools=[WEATHER]).input_tokens
    after = CLIENT.messages.count_tokens(model=ARGS.model, messages=history, tools=[WEATHER]).input_tokens
    check(after > before, f"the call and its result are rendered: {before} -> {after}")
    m = create(messages=history, tools=[WEATHER], max_tokens=60, tool_choice={"type": "auto"})
    check(m.stop_reason in ("end_turn", "max_tokens", "tool_use") and m.content, f"final: {m}")
    check(text_of(m).strip() or tool_uses(m), f"no answer: {m}")
    print(f"     final answer: {text_of(m)!r}")


def t_drafted_equals_serial():
    for kw in (dict(max_tokens=60),
               dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=120, tool_choice={"type": "any"})):
        d = create(**kw)
        s = create(extra_body={"draft": False}, **kw)
        check(sha_of(d) == sha_of(s), f"drafted {sha_of(d)} != serial {sha_of(s)}")
        check(extra(s)["tensorfold"]["min_rows"] == 1, f"serial receipt {extra(s)['tensorfold']}")
        strip = lambda m: [{k: v for k, v in b.to_dict().items() if k != "id"} for b in m.content]  # noqa: E731
        check(strip(d) == strip(s), f"{strip(d)} != {strip(s)}")


def status_error(fn, cls, status, kind):
    try:
        fn()
    except cls as e:
        check(e.status_code == status, f"{cls.__name__}: status {e.status_code}")
        check(e.body["type"] == "error" and e.body["error"]["type"] == kind, f"body {e.body}")
        check(isinstance(e.body["error"]["message"], str) and e.body["error"]["message"], f"body {e.body}")
        return e
    raise Failure(f"expected {cls.__name__}")


def t_errors():
    status_error(lambda: create(temperature=5), anthropic.BadRequestError, 400, "invalid_request_error")
    status_error(lambda: create(messages=[]), anthropic.BadRequestError, 400, "invalid_request_error")
    status_error(lambda: create(extra_body={"max_tokens": None}), anthropic.BadRequestError, 400,
                 "invalid_request_error")
    e = status_error(lambda: create(model="no-such-model"), anthropic.NotFoundError, 404, "not_found_error")
    check("no-such-model" in e.body["error"]["message"], f"{e.body}")
    status_error(lambda: CLIENT.messages.count_tokens(model="no-such-model", messages=HELLO),
                 anthropic.NotFoundError, 404, "not_found_error")
    wrong = anthropic.Anthropic(base_url=ARGS.base_url, api_key="wrong", max_retries=0)
    status_error(lambda: wrong.messages.create(model=ARGS.model, messages=HELLO, max_tokens=4),
                 anthropic.AuthenticationError, 401, "authentication_error")
    # x-api-key (the header Anthropic's API takes) works as well as a bearer key.
    for key, ok in ((ARGS.api_key, True), ("wrong", False)):
        c = anthropic.Anthropic(base_url=ARGS.base_url, api_key=None, auth_token=None, max_retries=0,
                                default_headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
        call = lambda: c.messages.count_tokens(model=ARGS.model, messages=HELLO)  # noqa: E731
        if ok:
            check(call().input_tokens > 0, "x-api-key refused")
        else:
            status_error(call, anthropic.AuthenticationError, 401, "authentication_error")
    big = [{"role": "user", "content": "x" * (1 << 20)}]
    status_error(lambda: create(messages=big), anthropic.RequestTooLargeError, 413, "request_too_large")
    # The OpenAI routes keep OpenAI's shape.
    r = httpx.post(ARGS.base_url + "/v1/chat/completions", json={"messages": HELLO}, timeout=60)
    check(r.status_code == 401 and r.json()["error"]["type"] == "authentication_error" and "type" not in r.json(),
          f"OpenAI 401 {r.status_code} {r.text}")


def health():
    return httpx.get(ARGS.base_url + "/health", timeout=30).json()


def wait_for(what, cond, bound=120.0):
    deadline = time.time() + bound
    while True:
        h = health()
        if cond(h):
            return h
        check(time.time() < deadline, f"{what}: not within {bound} s; health {h}")
        time.sleep(0.05)


def t_rate_limited():
    """--parallel 1 --max-queue 1: a long request runs, a second waits, a third gets 429."""
    with stream(max_tokens=1500) as long:
        next(iter(long.text_stream))  # the long request is running (its first text arrived)
        result = {}

        def waiting():
            try:
                result["m"] = create(max_tokens=4)
            except Exception as e:  # noqa: BLE001 - reported below
                result["e"] = e

        t = threading.Thread(target=waiting)
        t.start()
        wait_for("the second request waits", lambda h: h["requests_waiting"] == 1)
        status_error(lambda: create(max_tokens=4), anthropic.RateLimitError, 429, "rate_limit_error")
    # Leaving the stream closes the connection, which cancels the long request; the waiting one runs.
    t.join(timeout=120)
    check(not t.is_alive() and "m" in result, f"the waiting request: {result}")
    check(result["m"].stop_reason in ("end_turn", "max_tokens"), f"{result['m']}")


def t_thinking_budget():
    """Run against the tiny Qwen3 fixture (random weights: a bias on <think>, as reasoning_client.py uses at this
    prompt, makes the first token open the block): `thinking` with budget_tokens 4 gives a thinking block first and
    at most 4 tokens between <think> and </think>; streamed == non-streamed, drafted == serial; `disabled` gives no
    thinking block."""
    ask = [{"role": "user", "content": "What is 2 + 2?"}]
    tok = lambda s: httpx.post(ARGS.base_url + "/tokenize", json={"prompt": s, "add_special_tokens": False},  # noqa: E731
                               headers={"x-api-key": ARGS.api_key}, timeout=60).json()["tokens"]
    (start,), (end,) = tok("<think>"), tok("</think>")
    bias = {"logit_bias": {str(start): 4}}
    kw = dict(messages=ask, max_tokens=24, thinking={"type": "enabled", "budget_tokens": 4})
    m = create(extra_body={"return_token_ids": True, **bias}, **kw)
    check(m.content and m.content[0].type == "thinking", f"no thinking block first: {m.content}")
    check(m.content[0].signature == "", f"signature {m.content[0].signature!r}")
    ids = extra(m)["token_ids"]
    check(ids[0] == start and end in ids and ids.index(end) <= 5, f"more than 4 thinking tokens: {ids}")
    events = raw_events(extra_body=bias, **kw)
    check_order(events)
    streamed = blocks_of(events)
    check(streamed[0]["type"] == "thinking" and streamed[0]["thinking"] == m.content[0].thinking, f"{streamed}")
    check([b["type"] for b in streamed] == [b.type for b in m.content], f"{streamed} vs {m.content}")
    check(delta_of(events)["tensorfold"]["token_sha"] == sha_of(m), "stream sha differs")
    s = create(extra_body={"draft": False, **bias}, **kw)
    check(sha_of(s) == sha_of(m), "serial differs")
    off = create(messages=ask, max_tokens=8, thinking={"type": "disabled"}, extra_body=bias)
    check(all(b.type != "thinking" for b in off.content), f"thinking while disabled: {off.content}")


TESTS = [t_create, t_stream_equals_create, t_stop_sequence, t_tool_any, t_tool_named, t_count_tokens,
         t_tool_round_trip, t_drafted_equals_serial, t_errors, t_rate_limited, t_thinking_budget]


def main():
    global ARGS, CLIENT
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--only", default="", help="comma-separated test names (default: all but t_thinking_budget)")
    ARGS = p.parse_args()
    # The server's root: the SDK adds /v1/messages itself.
    ARGS.base_url = ARGS.base_url.removesuffix("/").removesuffix("/v1")
    CLIENT = anthropic.Anthropic(base_url=ARGS.base_url, api_key=ARGS.api_key, max_retries=0, timeout=300)
    print(f"anthropic {anthropic.__version__}, {ARGS.base_url}, model {ARGS.model}")
    only = [n for n in ARGS.only.split(",") if n]
    return harness.run_all([t for t in TESTS if not ((only and t.__name__ not in only) or (not only and t is t_thinking_budget))])


if __name__ == "__main__":
    sys.exit(main())
