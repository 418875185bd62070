#!/usr/bin/env python3
"""Drives a running `tensorfold serve` with the official `openai` Python package, as a user's program would.

Run by crates/cli/tests/serve_openai.rs:

    openai_client.py --base-url http://127.0.0.1:PORT/v1 --model ID [--mode full|auth] [--api-key KEY]

Every check runs even when an earlier one failed; the script prints one line per check and exits 1 when any
failed (with the traceback of each), 0 after printing "ALL OK" otherwise. Extension fields go through
`extra_body`; the `tensorfold` object of a reply is read from `model_extra`.
"""

import argparse
import hashlib
import json
import math
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

import harness
import openai

ARGS = None
CLIENT = None
ROOT = None  # the base URL without /v1 (for /health, /metrics, /tokenize, /detokenize)

TF_KEYS = ["token_sha", "min_rows", "rounds", "drafted", "accepted", "drafts", "cached_tokens", "prefill_s", "decode_s"]


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def raw(method, path, body=None, headers=None):
    """A plain HTTP request to ROOT + path; returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ROOT + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    text = payload.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def auth_headers():
    return {"Authorization": f"Bearer {ARGS.api_key}"} if ARGS.api_key else {}


def tokenize(text, add_special_tokens=True):
    status, body = raw(
        "POST",
        "/tokenize",
        {"model": ARGS.model, "prompt": text, "add_special_tokens": add_special_tokens},
        auth_headers(),
    )
    check(status == 200, f"/tokenize -> {status} {body}")
    return body


def tf_of(obj):
    """The `tensorfold` extension object of a reply or chunk, checked for its fields."""
    extra = obj.model_extra or {}
    tf = extra.get("tensorfold")
    check(isinstance(tf, dict), f"no tensorfold object on {obj}")
    for k in TF_KEYS:
        check(k in tf, f"tensorfold object lacks {k}: {tf}")
    sha = tf["token_sha"]
    check(isinstance(sha, str) and len(sha) == 12 and all(c in "0123456789abcdef" for c in sha), f"token_sha {sha!r}")
    check(isinstance(tf["drafts"], bool), f"drafts is not a bool: {tf}")
    for k in ["min_rows", "rounds", "drafted", "accepted", "cached_tokens"]:
        check(isinstance(tf[k], int) and tf[k] >= 0, f"tensorfold.{k} = {tf[k]!r}")
    check(tf["accepted"] <= tf["drafted"], f"accepted > drafted: {tf}")
    return tf


def sha12(ids):
    return hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()[:12]


def expect_error(kinds, fn, what):
    """Runs fn, which must raise one of `kinds` (openai exception classes); checks the OpenAI error shape."""
    try:
        fn()
    except kinds as e:
        body = e.body
        check(isinstance(body, dict), f"{what}: error body is not an object: {body!r}")
        check(isinstance(body.get("message"), str) and body["message"], f"{what}: no error.message: {body}")
        check(isinstance(body.get("type"), str) and body["type"], f"{what}: no error.type: {body}")
        return e
    except openai.APIStatusError as e:
        raise Failure(f"{what}: expected {kinds}, got HTTP {e.status_code} {type(e).__name__}: {e.body}")
    raise Failure(f"{what}: expected {kinds}, the request succeeded")


# ---------------------------------------------------------------- full mode

CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Write one sentence about the sea."},
]


def chat(**kw):
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", CHAT)
    kw.setdefault("max_tokens", 16)
    return CLIENT.chat.completions.create(**kw)


def stream_chat(**kw):
    """A streamed chat request; returns (text, finish_reason, chunks) after checking the chunk sequence."""
    chunks = list(chat(stream=True, **kw))
    check(chunks, "no chunks")
    ids = {c.id for c in chunks}
    check(len(ids) == 1, f"chunk ids differ: {ids}")
    for c in chunks:
        check(c.object == "chat.completion.chunk", f"chunk object {c.object!r}")
        check(c.model == ARGS.model, f"chunk model {c.model!r}")
    check(chunks[0].choices and chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    finishing = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    check(len(finishing) == 1, f"finish_reason on chunks {finishing}")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[finishing[0]].choices[0].finish_reason, chunks, finishing[0]


def t_models_and_health():
    models = CLIENT.models.list().data
    check([m.id for m in models] == [ARGS.model], f"/v1/models ids {[m.id for m in models]}")
    m = models[0]
    check(m.object == "model" and m.owned_by == "tensorfold" and isinstance(m.created, int), f"model entry {m}")
    status, h = raw("GET", "/health")
    check(status == 200, f"/health -> {status}")
    check(h.get("status") == "ok" and h.get("model") == ARGS.model, f"/health {h}")
    for k in ["requests_running", "requests_waiting", "kv_blocks_used", "kv_blocks_total"]:
        check(isinstance(h.get(k), int) and h[k] >= 0, f"/health {k}: {h}")
    check(h["kv_blocks_total"] > 0, f"/health kv_blocks_total {h}")


def t_chat_streamed_equals_nonstreamed():
    r = chat(temperature=0.8, seed=1234, extra_body={"return_token_ids": True})
    check(r.object == "chat.completion" and r.model == ARGS.model, f"reply {r}")
    check(len(r.choices) == 1, f"choices {r.choices}")
    ch = r.choices[0]
    text = ch.message.content
    check(ch.message.role == "assistant" and isinstance(text, str) and text, f"message {ch.message}")
    check(ch.finish_reason in ("stop", "length"), f"finish_reason {ch.finish_reason!r}")
    tf = tf_of(r)
    u = r.usage
    ids = (ch.model_extra or {}).get("token_ids")
    pids = (r.model_extra or {}).get("prompt_token_ids")
    check(isinstance(ids, list) and all(isinstance(i, int) for i in ids), f"choices[0].token_ids {ids!r}")
    check(isinstance(pids, list) and pids, f"prompt_token_ids {pids!r}")
    check(u.completion_tokens == len(ids), f"completion_tokens {u.completion_tokens} != len(token_ids) {len(ids)}")
    check(u.prompt_tokens == len(pids), f"prompt_tokens {u.prompt_tokens} != len(prompt_token_ids) {len(pids)}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    check(1 <= u.completion_tokens <= 16, f"completion_tokens {u.completion_tokens} with max_tokens 16")
    if ch.finish_reason == "length":
        check(u.completion_tokens == 16, f"finish length after {u.completion_tokens} tokens")
        check(tf["token_sha"] == sha12(ids), f"token_sha {tf['token_sha']} != sha of token_ids {sha12(ids)}")
    details = u.prompt_tokens_details
    if details is not None and details.cached_tokens is not None:
        check(details.cached_tokens == tf["cached_tokens"], f"cached_tokens {details} vs {tf}")

    # Streamed with usage: usage chunk last, empty choices, carries tensorfold.
    s_text, s_finish, chunks, fin = stream_chat(
        temperature=0.8, seed=1234, stream_options={"include_usage": True}, extra_body={"return_token_ids": True}
    )
    last = chunks[-1]
    check(fin == len(chunks) - 2, f"finish chunk at {fin} of {len(chunks)} (usage chunk must follow it)")
    check(last.choices == [] and last.usage is not None, f"last chunk is not the usage chunk: {last}")
    check(s_text == text, f"streamed text {s_text!r} != non-streamed {text!r}")
    check(s_finish == ch.finish_reason, f"streamed finish {s_finish} != {ch.finish_reason}")
    check(last.usage.completion_tokens == u.completion_tokens, f"streamed usage {last.usage} vs {u}")
    check(last.usage.prompt_tokens == u.prompt_tokens, f"streamed usage {last.usage} vs {u}")
    s_tf = tf_of(last)
    check(s_tf["token_sha"] == tf["token_sha"], f"streamed token_sha {s_tf['token_sha']} != {tf['token_sha']}")

    # Streamed without usage: the tensorfold object rides on the finish chunk, and there is no usage chunk.
    s2_text, _, chunks2, fin2 = stream_chat(temperature=0.8, seed=1234)
    check(fin2 == len(chunks2) - 1, f"finish chunk at {fin2} of {len(chunks2)} without include_usage")
    check(all(c.usage is None for c in chunks2), "a usage chunk without stream_options.include_usage")
    check(s2_text == text, f"streamed text {s2_text!r} != {text!r}")
    check(tf_of(chunks2[fin2])["token_sha"] == tf["token_sha"], "token_sha on the finish chunk")

    # A different seed is a different request: the seed really reaches the sampler (asserted over 3 seeds, so a
    # single coincidence cannot fail it).
    shas = {tf_of(chat(temperature=1.0, seed=s))["token_sha"] for s in (1, 2, 3)}
    check(len(shas) > 1, f"seeds 1, 2, 3 at temperature 1 all gave token_sha {shas}")


def t_reruns_repeat():
    a = chat(temperature=0)
    b = chat(temperature=0)
    check(a.choices[0].message.content == b.choices[0].message.content, "greedy reruns differ")
    check(tf_of(a)["token_sha"] == tf_of(b)["token_sha"], "greedy token_sha differs")
    # No seed: the seed is derived from the prompt, so a sampled request repeats too.
    c = chat(temperature=0.9)
    d = chat(temperature=0.9)
    check(c.choices[0].message.content == d.choices[0].message.content, "unseeded sampled reruns differ")
    check(tf_of(c)["token_sha"] == tf_of(d)["token_sha"], "unseeded token_sha differs")


def t_stop_strings():
    msgs = [{"role": "user", "content": "Describe a cat in two sentences."}]
    full = chat(messages=msgs, temperature=0, max_tokens=16).choices[0].message.content
    check(len(full) >= 12, f"greedy reply too short to pick a stop string from: {full!r}")
    k = len(full) // 2
    while k < len(full) - 3 and not full[k : k + 3].strip():
        k += 1
    stop = full[k : k + 3]
    expected = full[: full.find(stop)]
    for stop_arg in (stop, [stop, "\u2603never\u2603"]):
        r = chat(messages=msgs, temperature=0, max_tokens=16, stop=stop_arg)
        got = r.choices[0].message.content or ""
        check(stop not in got, f"stop {stop!r}: reply still contains it: {got!r}")
        check(got == expected, f"stop {stop_arg!r}: got {got!r}, expected the greedy reply cut before it: {expected!r}")
        check(r.choices[0].finish_reason == "stop", f"stop {stop_arg!r}: finish_reason {r.choices[0].finish_reason}")
    # Streamed, the stop string must not leak in a delta either.
    s_text, s_finish, _, _ = stream_chat(messages=msgs, temperature=0, max_tokens=16, stop=stop)
    check(s_text == expected and s_finish == "stop", f"streamed stop: {s_text!r} ({s_finish})")


def t_chat_logprobs():
    r = chat(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    ch = r.choices[0]
    content = ch.logprobs.content
    check(len(content) == r.usage.completion_tokens, f"{len(content)} logprob entries for {r.usage.completion_tokens} tokens")
    for i, e in enumerate(content):
        check(math.isfinite(e.logprob) and e.logprob <= 0, f"entry {i}: logprob {e.logprob}")
        tops = e.top_logprobs
        check(len(tops) == 3, f"entry {i}: {len(tops)} top_logprobs")
        vals = [t.logprob for t in tops]
        check(vals == sorted(vals, reverse=True), f"entry {i}: top_logprobs not sorted: {vals}")
        check(all(math.isfinite(v) and v <= 0 for v in vals), f"entry {i}: {vals}")
        check(len({t.token for t in tops}) == 3, f"entry {i}: repeated top tokens {tops}")
        # Greedy: the chosen token is the most likely one.
        check(e.token == tops[0].token and abs(e.logprob - tops[0].logprob) < 1e-5, f"entry {i}: {e} vs top {tops[0]}")
    if ch.finish_reason == "length":
        joined = "".join(e.token for e in content)
        check(joined == ch.message.content, f"logprob tokens {joined!r} != text {ch.message.content!r}")
    r0 = chat(temperature=0, max_tokens=4, logprobs=True, top_logprobs=0)
    check(all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content), "top_logprobs 0 must give empty lists")
    check(r0.choices[0].message.content == ch.message.content[: len(r0.choices[0].message.content)], "logprobs changed the text")


def t_completions():
    prompt = "The capital of France is"
    r = CLIENT.completions.create(model=ARGS.model, prompt=prompt, max_tokens=8, temperature=0)
    check(r.object == "text_completion" and r.model == ARGS.model, f"reply {r}")
    text = r.choices[0].text
    check(text, "empty completion")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish {r.choices[0].finish_reason}")
    tok = tokenize(prompt)
    ids = tok["tokens"]
    check(r.usage.prompt_tokens == len(ids), f"prompt_tokens {r.usage.prompt_tokens} vs /tokenize {len(ids)}")
    sha = tf_of(r)["token_sha"]
    # The same prompt as token ids gives the same completion.
    r2 = CLIENT.completions.create(model=ARGS.model, prompt=ids, max_tokens=8, temperature=0)
    check(r2.choices[0].text == text, f"token-id prompt gave {r2.choices[0].text!r}, string prompt {text!r}")
    check(tf_of(r2)["token_sha"] == sha, "token-id prompt token_sha differs")
    check(r2.usage.prompt_tokens == len(ids), f"token-id prompt_tokens {r2.usage.prompt_tokens}")
    # Legacy logprobs on generated tokens.
    r3 = CLIENT.completions.create(model=ARGS.model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    lp = r3.choices[0].logprobs
    n = r3.usage.completion_tokens
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, f"logprobs {lp}")
    for i in range(n):
        check(math.isfinite(lp.token_logprobs[i]) and lp.token_logprobs[i] <= 0, f"token_logprobs {lp.token_logprobs}")
        top = lp.top_logprobs[i]
        check(isinstance(top, dict) and 2 <= len(top) <= 3, f"top_logprobs[{i}] {top}")
        check(max(top.values()) >= lp.token_logprobs[i] - 1e-5, f"top_logprobs[{i}] {top} below chosen")
    check(r3.choices[0].text == text[: len(r3.choices[0].text)], f"logprobs changed the text: {r3.choices[0].text!r}")
    # echo with generation: the prompt, then the completion.
    r4 = CLIENT.completions.create(model=ARGS.model, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    check(r4.choices[0].text.startswith(prompt), f"echo text {r4.choices[0].text!r}")
    check(r4.choices[0].text[len(prompt) :] == text[: len(r4.choices[0].text) - len(prompt)], f"echo {r4.choices[0].text!r}")
    # Streamed completions repeat the non-streamed text.
    s = "".join(c.choices[0].text for c in CLIENT.completions.create(model=ARGS.model, prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
    check(s == text, f"streamed completion {s!r} != {text!r}")


def score(prompt):
    """The evaluation-harness scoring form: echo the prompt with per-token logprobs, generate nothing."""
    r = CLIENT.completions.create(model=ARGS.model, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    ch = r.choices[0]
    lp = ch.logprobs
    check(ch.text == prompt, f"echo text {ch.text!r} != prompt {prompt!r}")
    n = len(lp.tokens)
    check(len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, f"ragged logprobs {lp}")
    check("".join(lp.tokens) == prompt, f"tokens {lp.tokens} do not join to the prompt")
    check(n == len(tokenize(prompt)["tokens"]), f"{n} tokens vs /tokenize")
    check(lp.token_logprobs[0] is None, f"first token_logprob {lp.token_logprobs[0]!r} (must be null)")
    for i in range(1, n):
        v = lp.token_logprobs[i]
        check(isinstance(v, float) and math.isfinite(v) and v <= 0, f"token_logprobs[{i}] = {v!r}")
        top = lp.top_logprobs[i]
        check(isinstance(top, dict) and 1 <= len(top) <= 2, f"top_logprobs[{i}] = {top!r}")
        check(max(top.values()) >= v - 1e-5, f"top_logprobs[{i}] {top} below the token's {v}")
    check(lp.text_offset[0] == 0, f"text_offset {lp.text_offset}")
    for i in range(1, n):
        check(lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1]), f"text_offset {lp.text_offset}")
    check(r.usage.completion_tokens == 0, f"usage {r.usage}")
    return sum(lp.token_logprobs[1:])


def t_completions_scoring():
    good = score("The quick brown fox jumps over the lazy dog.")
    bad = score("dog lazy the over jumps fox brown quick The.")
    # The model's own likelihood must prefer the real sentence to the same words scrambled.
    check(good > bad + 5, f"log-likelihood of the sentence {good:.2f} vs scrambled {bad:.2f}")


RESPONSE_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def t_responses():
    kw = dict(model=ARGS.model, input="Name three colors.", instructions="Answer briefly.", max_output_tokens=16, temperature=0)
    r = CLIENT.responses.create(**kw)
    check(r.object == "response" and r.id, f"response {r}")
    check(r.status in ("completed", "incomplete"), f"status {r.status}")
    # The message item ends as the response does (OpenAI marks a reply cut by max_output_tokens "incomplete").
    check([o.status for o in r.output] == [r.status], f"output item status {[o.status for o in r.output]} vs {r.status}")
    check((r.incomplete_details is not None) == (r.status == "incomplete"), f"incomplete_details {r.incomplete_details}")
    cut = CLIENT.responses.create(**{**kw, "max_output_tokens": 2})
    check(
        cut.status == "incomplete" and [o.status for o in cut.output] == ["incomplete"]
        and cut.incomplete_details.reason == "max_output_tokens" and cut.usage.output_tokens == 2,
        f"a 2-token reply: {cut}",
    )
    text = r.output_text
    check(text, f"empty output_text: {r}")
    check(r.usage and 1 <= r.usage.output_tokens <= 16 and r.usage.input_tokens > 0, f"usage {r.usage}")
    tf_of(r)

    events = list(CLIENT.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1] or t != "response.output_text.delta"]
    # A reply cut by max_output_tokens ends with response.incomplete (status "incomplete"), as OpenAI's does.
    final = "response.completed" if r.status == "completed" else "response.incomplete"
    check(collapsed == RESPONSE_ORDER[:-1] + [final], f"event order {collapsed} (non-streamed status {r.status})")
    check(events[-1].response.status == r.status, f"streamed status {events[-1].response.status} vs {r.status}")
    item_done = next(e for e in events if e.type == "response.output_item.done")
    check(item_done.item.status == r.status, f"streamed item status {item_done.item.status} vs {r.status}")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    completed = events[-1].response
    check(deltas == done.text == completed.output_text, f"deltas {deltas!r} / done {done.text!r} / completed {completed.output_text!r}")
    check(deltas == text, f"streamed response text {deltas!r} != non-streamed {text!r}")
    seqs = [getattr(e, "sequence_number", None) for e in events]
    if all(s is not None for s in seqs):
        check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"sequence_number {seqs}")
    check(events[0].response.id == completed.id, "response ids differ between created and completed")

    # Input as a list of message items with input_text parts.
    r2 = CLIENT.responses.create(
        model=ARGS.model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Name three colors."}]}],
        instructions="Answer briefly.",
        max_output_tokens=16,
        temperature=0,
    )
    check(r2.output_text == text, f"message-item input gave {r2.output_text!r}, string input {text!r}")


def t_responses_chaining():
    r1 = CLIENT.responses.create(model=ARGS.model, input="My name is Ada. Reply with OK.", max_output_tokens=8, temperature=0)
    r2 = CLIENT.responses.create(
        model=ARGS.model, input="What is my name?", previous_response_id=r1.id, max_output_tokens=12, temperature=0
    )
    check(r2.output_text, "chained response is empty")
    check(r2.id != r1.id, "same id for two responses")
    # The chained prompt holds the first turn (its input and output) before the new input.
    floor = r1.usage.input_tokens + r1.usage.output_tokens
    check(r2.usage.input_tokens > floor, f"chained input_tokens {r2.usage.input_tokens} <= first turn's {floor}")
    expect_error(
        (openai.BadRequestError, openai.NotFoundError),
        lambda: CLIENT.responses.create(model=ARGS.model, input="hi", previous_response_id="resp_does_not_exist", max_output_tokens=4),
        "unknown previous_response_id",
    )


def t_tokenize_detokenize():
    text = "Hello world, this is a plain ASCII test."
    tok = tokenize(text, add_special_tokens=False)
    ids = tok["tokens"]
    check(ids and all(isinstance(i, int) for i in ids), f"/tokenize {tok}")
    check(tok["count"] == len(ids), f"count {tok}")
    check(isinstance(tok["max_model_len"], int) and tok["max_model_len"] > 0, f"max_model_len {tok}")
    status, de = raw("POST", "/detokenize", {"model": ARGS.model, "tokens": ids}, auth_headers())
    check(status == 200 and de.get("prompt") == text, f"/detokenize -> {status} {de}")
    status, m = raw("POST", "/tokenize", {"model": ARGS.model, "messages": [{"role": "user", "content": "hi"}]}, auth_headers())
    check(status == 200 and m["count"] == len(m["tokens"]) and m["count"] > 1, f"/tokenize messages -> {status} {m}")
    status, de = raw("POST", "/detokenize", {"tokens": m["tokens"]}, auth_headers())
    check(status == 200 and "hi" in de["prompt"] and len(de["prompt"]) > 2, f"templated prompt {de}")


def t_metrics():
    req = urllib.request.Request(ROOT + "/metrics")
    with urllib.request.urlopen(req, timeout=60) as resp:
        check(resp.status == 200, f"/metrics {resp.status}")
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            if "{" in line:
                name, rest = line[: line.index("{")], line[line.rindex("}") + 1 :]
            else:
                name, _, rest = line.partition(" ")
            values.setdefault(name, float(rest.split()[0]))
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
    ]:
        check(name in values, f"/metrics lacks {name}")
    check(values["vllm:prompt_tokens_total"] > 0, "prompt_tokens_total is 0 after requests")
    check(values["vllm:generation_tokens_total"] > 0, "generation_tokens_total is 0 after requests")
    check(values["vllm:time_to_first_token_seconds_count"] > 0, "no time-to-first-token samples")
    check(0 <= values["vllm:kv_cache_usage_perc"] <= 1, f"kv_cache_usage_perc {values['vllm:kv_cache_usage_perc']}")


def t_errors():
    max_len = tokenize("x")["max_model_len"]

    def ctx_check(e, what):
        check(e.status_code == 400, f"{what}: {e.status_code}")
        check(e.body.get("code") == "context_length_exceeded", f"{what}: code {e.body.get('code')!r}")
        check(e.body.get("type") == "invalid_request_error", f"{what}: type {e.body.get('type')!r}")
        check(str(max_len) in e.body["message"], f"{what}: message does not name the context {max_len}: {e.body['message']!r}")

    e = expect_error(openai.BadRequestError, lambda: chat(max_tokens=max_len), "chat max_tokens = context")
    ctx_check(e, "chat max_tokens = context")
    e = expect_error(openai.BadRequestError, lambda: chat(max_tokens=max_len, stream=True), "streamed chat max_tokens = context")
    ctx_check(e, "streamed chat max_tokens = context")
    e = expect_error(
        openai.BadRequestError,
        lambda: CLIENT.completions.create(model=ARGS.model, prompt="hello", max_tokens=max_len),
        "completions max_tokens = context",
    )
    ctx_check(e, "completions max_tokens = context")
    long_prompt = "hello world " * (max_len // 2 + 16)
    e = expect_error(
        openai.BadRequestError,
        lambda: chat(messages=[{"role": "user", "content": long_prompt}], max_tokens=1),
        "prompt longer than the context",
    )
    ctx_check(e, "prompt longer than the context")

    e = expect_error(openai.BadRequestError, lambda: chat(n=2), "n=2")
    check(e.param == "n", f"n=2: param {e.param!r}")
    check(e.body.get("type") == "invalid_request_error", f"n=2: {e.body}")

    # OpenAI answers an unknown model with 404 (model_not_found); vLLM too. The contract allows 400 or 404.
    expect_error((openai.BadRequestError, openai.NotFoundError), lambda: chat(model="no-such-model"), "unknown model")
    expect_error(
        (openai.BadRequestError, openai.NotFoundError),
        lambda: CLIENT.completions.create(model="no-such-model", prompt="hi", max_tokens=2),
        "unknown model (completions)",
    )

    for what, kw in [
        ("temperature -1", dict(temperature=-1)),
        ("top_p 1.5", dict(top_p=1.5)),
        ("max_tokens -1", dict(max_tokens=-1)),
        ("top_logprobs 21", dict(logprobs=True, top_logprobs=21)),
        ("empty messages", dict(messages=[])),
        ("unknown role", dict(messages=[{"role": "wizard", "content": "hi"}])),
        ("priority bogus", dict(extra_body={"priority": "urgent"})),
    ]:
        e = expect_error(openai.BadRequestError, lambda: chat(**kw), what)
        check(e.body.get("type") == "invalid_request_error", f"{what}: {e.body}")
    expect_error(
        openai.BadRequestError,
        lambda: CLIENT.completions.create(model=ARGS.model, prompt=["one", "two"], max_tokens=2),
        "two string prompts",
    )
    expect_error(
        openai.BadRequestError,
        lambda: CLIENT.completions.create(model=ARGS.model, prompt="hi", max_tokens=2, logprobs=6),
        "legacy logprobs 6",
    )
    # Unknown fields are ignored, not errors.
    r = chat(max_tokens=4, extra_body={"some_future_field": {"nested": [1, 2]}, "another": None})
    check(r.choices[0].message.content is not None, "unknown fields broke the request")


def t_extensions():
    # draft: false gives the same bytes as drafting (drafts change speed only), and min_rows 1.
    a = chat(temperature=0.7, seed=7, extra_body={"draft": False})
    b = chat(temperature=0.7, seed=7, extra_body={"draft": True})
    c = chat(temperature=0.7, seed=7, extra_body={"priority": "background", "top_k": 40, "min_p": 0.01, "repetition_penalty": 1.0})
    tfa, tfb = tf_of(a), tf_of(b)
    check(a.choices[0].message.content == b.choices[0].message.content, "draft on/off changed the text")
    check(tfa["token_sha"] == tfb["token_sha"], "draft on/off changed token_sha")
    check(tfa["drafts"] is False and tfa["drafted"] == 0 and tfa["min_rows"] <= 1, f"draft false: {tfa}")
    check(c.choices[0].message.content, "extension fields request failed")
    # Penalties and text-part content are accepted.
    r = chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": "Write one sentence about the sea."}]}],
        temperature=0,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        top_p=0.9,
        user="tester",
    )
    check(r.choices[0].message.content, "text parts request failed")
    # Content parts and a plain string are the same prompt.
    p1 = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}], max_tokens=1, extra_body={"return_token_ids": True})
    p2 = chat(messages=[{"role": "user", "content": "Hi there"}], max_tokens=1, extra_body={"return_token_ids": True})
    check(p1.model_extra.get("prompt_token_ids") == p2.model_extra.get("prompt_token_ids"), "text parts and string differ")
    # max_completion_tokens is honoured like max_tokens.
    m = chat(temperature=0, max_completion_tokens=3, messages=[{"role": "user", "content": "Count from one to twenty."}])
    check(m.usage.completion_tokens <= 3, f"max_completion_tokens 3 gave {m.usage.completion_tokens} tokens")


def t_logit_bias():
    # A bias of -100 bans the greedy reply's first token; +100 on a token makes every greedy draw that token.
    kw = dict(temperature=0, max_tokens=4, extra_body={"return_token_ids": True})
    plain = chat(**kw).choices[0].model_extra["token_ids"]
    banned = chat(logit_bias={str(plain[0]): -100}, **kw).choices[0].model_extra["token_ids"]
    check(banned[0] != plain[0], f"logit_bias -100 on {plain[0]} kept it: {plain} / {banned}")
    forced = next(t for t in range(1000, 2000) if t not in plain)
    r = chat(logit_bias={str(forced): 100}, **kw)
    got = r.choices[0].model_extra["token_ids"]
    check(got == [forced] * 4, f"logit_bias +100 on {forced} gave {got}")
    # Streamed, the same bias gives the same text; a token id outside the vocabulary is a 400 naming the field.
    text, _, _, _ = stream_chat(logit_bias={str(forced): 100}, temperature=0, max_tokens=4)
    check(text == r.choices[0].message.content, f"streamed {text!r} != {r.choices[0].message.content!r}")
    e = expect_error(openai.BadRequestError, lambda: chat(logit_bias={"999999999": 5}, max_tokens=1), "logit_bias id")
    check(e.body.get("param") == "logit_bias", f"error {e.body}")


def t_concurrent_streams():
    n = 8
    reqs = [
        dict(messages=[{"role": "user", "content": f"Give one short fact about the number {i + 1}."}], temperature=0.7, seed=100 + i, max_tokens=12)
        for i in range(n)
    ]
    solo = []
    for kw in reqs:
        r = chat(**kw)
        solo.append((r.choices[0].message.content, tf_of(r)["token_sha"]))
    results = [None] * n
    errors = [None] * n
    barrier = threading.Barrier(n)

    def worker(i):
        try:
            barrier.wait(timeout=60)
            text, finish, chunks, _ = stream_chat(stream_options={"include_usage": True}, **reqs[i])
            results[i] = (text, finish, tf_of(chunks[-1])["token_sha"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[i] = "".join(traceback.format_exception(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    started = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1, 180 - (time.time() - started)))
    check(not any(t.is_alive() for t in threads), "concurrent streams did not finish within 180 s")
    for i in range(n):
        check(errors[i] is None, f"stream {i} failed:\n{errors[i]}")
        text, finish, sha = results[i]
        check(text and finish in ("stop", "length"), f"stream {i}: {text!r} {finish!r}")
        # concurrent == solo: each stream equals the same request served alone.
        check((text, sha) == solo[i], f"stream {i}: concurrent {(text, sha)} != solo {solo[i]}")


FULL = [
    t_models_and_health,
    t_chat_streamed_equals_nonstreamed,
    t_reruns_repeat,
    t_stop_strings,
    t_chat_logprobs,
    t_completions,
    t_completions_scoring,
    t_responses,
    t_logit_bias,
    t_responses_chaining,
    t_tokenize_detokenize,
    t_errors,
    t_extensions,
    t_concurrent_streams,
    t_metrics,
]


# ---------------------------------------------------------------- auth mode


def t_auth():
    status, h = raw("GET", "/health")
    check(status == 200 and h.get("status") == "ok", f"/health without a key -> {status} {h}")
    for headers, what in [({}, "no key"), ({"Authorization": "Bearer wrong"}, "wrong key"), ({"Authorization": f"Basic {ARGS.api_key}"}, "Basic scheme")]:
        status, body = raw("GET", "/v1/models", headers=headers)
        check(status == 401, f"/v1/models with {what} -> {status} {body}")
        check(isinstance(body, dict) and body.get("error", {}).get("type") == "authentication_error", f"{what}: {body}")
        status, body = raw("POST", "/v1/chat/completions", {"model": ARGS.model, "messages": CHAT, "max_tokens": 2}, headers)
        check(status == 401, f"chat with {what} -> {status} {body}")
    wrong = openai.OpenAI(base_url=ARGS.base_url, api_key="wrong", max_retries=0, timeout=120)
    expect_error(openai.AuthenticationError, lambda: wrong.models.list(), "models.list with a wrong key")
    expect_error(
        openai.AuthenticationError,
        lambda: wrong.chat.completions.create(model=ARGS.model, messages=CHAT, max_tokens=2),
        "chat with a wrong key",
    )
    expect_error(
        openai.AuthenticationError,
        lambda: wrong.chat.completions.create(model=ARGS.model, messages=CHAT, max_tokens=2, stream=True),
        "streamed chat with a wrong key",
    )
    expect_error(
        openai.AuthenticationError,
        lambda: wrong.responses.create(model=ARGS.model, input="hi", max_output_tokens=2),
        "responses with a wrong key",
    )
    # The right key works, on every kind of route; the model id is the --name given.
    check([m.id for m in CLIENT.models.list().data] == [ARGS.model], "models with the right key")
    r = chat(max_tokens=8, temperature=0)
    check(r.model == ARGS.model and r.choices[0].message.content, f"chat with the right key: {r}")
    text, finish, _, _ = stream_chat(max_tokens=8, temperature=0)
    check(text == r.choices[0].message.content and finish, f"streamed chat with the right key: {text!r}")
    rr = CLIENT.responses.create(model=ARGS.model, input="hi", max_output_tokens=4)
    check(rr.output_text, "responses with the right key")
    c = CLIENT.completions.create(model=ARGS.model, prompt="Hello", max_tokens=4)
    check(c.choices[0].text is not None, "completions with the right key")


AUTH = [t_auth]


def main():
    global ARGS, CLIENT, ROOT
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["full", "auth"], default="full")
    p.add_argument("--api-key", default=None)
    ARGS = p.parse_args()
    ROOT = ARGS.base_url.rstrip("/").removesuffix("/v1")
    # No retries: a retried 5xx or 429 would hide a server fault.
    CLIENT = openai.OpenAI(base_url=ARGS.base_url, api_key=ARGS.api_key or "none", max_retries=0, timeout=120)
    print(f"openai {openai.__version__}, server {ROOT}, model {ARGS.model}, mode {ARGS.mode}")
    return harness.run_all(FULL if ARGS.mode == "full" else AUTH)


if __name__ == "__main__":
    sys.exit(main())
