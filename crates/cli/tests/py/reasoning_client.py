#!/usr/bin/env python3
"""Reasoning controls against a running `tensorfold serve fixtures/tiny-qwen3`, through the official `openai`
Python package.

Run by crates/cli/tests/serve_reasoning.rs:

    reasoning_client.py --base-url http://127.0.0.1:PORT/v1 --model ID --mode split|none

The tiny checkpoint has random weights: its replies are gibberish that never opens `<think>` by itself, so the
requests that test thinking add `logit_bias` on `<think>` (id 405), which makes the first token open the block;
from there the thinking budget decides where `</think>` (id 406) goes. Checks compare token ids, not content.

* `split` (the server's default `--reasoning-parser auto`, Qwen3's from the template): with `enable_thinking` and
  `thinking_budget` N in {1, 4, 16} the reply's token ids are `<think>`, N thinking tokens, `</think>` (forced),
  then the answer; `reasoning_content` and `content` are exactly the detokenized parts; streamed ==
  non-streamed (chat and Responses, whose output is a `reasoning` item then a `message` item, streamed with
  `response.reasoning_text.delta`/`.done`); drafted == serial (greedy and sampled); a `json_schema` grammar
  starts after the thinking (the checkpoint's 256-token context cannot hold the tools prompt, so forced calls
  after thinking are covered by the unit tests of crates/server/src/reply.rs); `enable_thinking: false` renders
  an empty think block and the reply has no reasoning; `reasoning_effort` turns thinking on in the template;
  bad fields are 400s.
* `none` (`--reasoning-parser none`): the same budgeted request leaves `<think>`…`</think>` in `content`.

Every check runs even when an earlier one failed; prints "ALL OK" and exits 0 when all passed.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

import harness
import openai

ARGS = None
CLIENT = None
ROOT = None

THINK, END_THINK, IM_END = 405, 406, 402
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
CITY = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# Greedy and sampled, each with a bias on <think> that opens the block at this prompt's first position (and
# leaves other tokens in the thinking).
MODES = [
    ("greedy", {"temperature": 0, "logit_bias": {"405": 4}}),
    ("sampled", {"temperature": 0.7, "seed": 5, "logit_bias": {"405": 5}}),
]


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def raw(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ROOT + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def detok(ids):
    status, body = raw("POST", "/detokenize", {"tokens": list(ids)})
    check(status == 200, f"/detokenize: {status} {body}")
    return body["prompt"]


def extra(obj):
    return obj.model_extra or {}


def thinking_body(n, **more):
    body = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget": n, "return_token_ids": True}
    body.update(more)
    return body


def chat(n, sampling, max_tokens, **kw):
    body = thinking_body(n, **kw.pop("extra_body", {}))
    return CLIENT.chat.completions.create(
        model=ARGS.model, messages=ASK, max_tokens=max_tokens, extra_body=body, **sampling, **kw
    )


def chat_stream(n, sampling, max_tokens, **kw):
    body = thinking_body(n, **kw.pop("extra_body", {}))
    stream = CLIENT.chat.completions.create(
        model=ARGS.model, messages=ASK, max_tokens=max_tokens, extra_body=body, stream=True,
        stream_options={"include_usage": True}, **sampling, **kw
    )
    out = {"reasoning": "", "content": "", "ids": [], "finish": None, "tf": None, "usage": None, "calls": {}}
    saw_reasoning_after_content = False
    for chunk in stream:
        if extra(chunk).get("tensorfold"):
            out["tf"] = extra(chunk)["tensorfold"]
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for c in chunk.choices:
            out["ids"].extend(extra(c).get("token_ids") or [])
            d = c.delta
            r = extra(d).get("reasoning_content")
            if r:
                if out["content"] or out["calls"]:
                    saw_reasoning_after_content = True
                out["reasoning"] += r
            if d.content:
                out["content"] += d.content
            for tc in d.tool_calls or []:
                call = out["calls"].setdefault(tc.index, {"name": None, "arguments": ""})
                if tc.function and tc.function.name:
                    call["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            if c.finish_reason:
                out["finish"] = c.finish_reason
    check(not saw_reasoning_after_content, "a reasoning delta came after the answer began")
    return out


def structure(ids, n, label):
    """Checks `<think>`, at most n thinking tokens, `</think>` right where the budget forces it; returns k, the
    index of `</think>`."""
    check(ids and ids[0] == THINK, f"{label}: the reply does not open <think>: {ids[:8]}")
    check(END_THINK in ids, f"{label}: no </think> in {ids}")
    k = ids.index(END_THINK)
    check(k - 1 <= n, f"{label}: {k - 1} thinking tokens over the budget {n}")
    check(k == n + 1, f"{label}: </think> at {k}, not where the budget of {n} forces it ({n + 1})")
    check(IM_END not in ids[1:k], f"{label}: the reply ended inside thinking")
    return k


def answer_ids(ids, k):
    rest = ids[k + 1:]
    if rest and rest[-1] == IM_END:
        rest = rest[:-1]
    return rest


def test_budget_structure_and_split():
    for n in (1, 4, 16):
        for name, sampling in MODES:
            label = f"budget {n} {name}"
            r = chat(n, sampling, n + 12)
            c = r.choices[0]
            ids = extra(c)["token_ids"]
            k = structure(ids, n, label)
            reasoning = extra(c.message).get("reasoning_content")
            want_reasoning = detok(ids[1:k]).strip("\n")
            check(reasoning == want_reasoning, f"{label}: reasoning_content {reasoning!r} != {want_reasoning!r}")
            want_content = detok(answer_ids(ids, k)).lstrip("\n")
            check(c.message.content == want_content, f"{label}: content {c.message.content!r} != {want_content!r}")
            check("</think>" not in (c.message.content or "") or "</think>" in want_content, f"{label}: marker leak")
            details = r.usage.completion_tokens_details
            check(details is not None and details.reasoning_tokens == k + 1, f"{label}: {details} != {k + 1}")
            tf = extra(r)["tensorfold"]
            # Streamed == non-streamed: the same ids, reasoning and content.
            s = chat_stream(n, sampling, n + 12)
            check(s["ids"] == ids, f"{label}: streamed ids {s['ids']} != {ids}")
            check(s["tf"]["token_sha"] == tf["token_sha"], f"{label}: streamed token_sha differs")
            check(s["reasoning"] == reasoning, f"{label}: streamed reasoning {s['reasoning']!r} != {reasoning!r}")
            check(s["content"] == c.message.content, f"{label}: streamed content {s['content']!r}")
            check(s["finish"] == c.finish_reason, f"{label}: finish {s['finish']} != {c.finish_reason}")
            sd = s["usage"].completion_tokens_details
            check(sd is not None and sd.reasoning_tokens == k + 1, f"{label}: streamed reasoning_tokens {sd}")
            print(f"  {label}: ids {ids[:k + 2]}… thinking {k - 1} tokens, sha {tf['token_sha']}, "
                  f"min_rows {tf['min_rows']}, drafted {tf['drafted']}, accepted {tf['accepted']}")
    # Without a budget the block runs to max_tokens: all reasoning, no content.
    r = chat(None, MODES[0][1], 12)
    c = r.choices[0]
    ids = extra(c)["token_ids"]
    check(ids[0] == THINK and END_THINK not in ids, f"no budget: {ids}")
    check(c.finish_reason == "length" and c.message.content == "", f"no budget: {c.finish_reason} {c.message.content!r}")
    check(extra(c.message).get("reasoning_content") == detok(ids[1:]).strip("\n"), "no budget: reasoning_content")


def test_drafted_equals_serial():
    for n in (1, 4, 16):
        for name, sampling in MODES:
            label = f"budget {n} {name}"
            drafted = chat(n, sampling, n + 24)
            serial = chat(n, sampling, n + 24, extra_body={"draft": False})
            td, ts = extra(drafted)["tensorfold"], extra(serial)["tensorfold"]
            check(td["token_sha"] == ts["token_sha"], f"{label}: drafted {td} != serial {ts}")
            check(extra(drafted.choices[0])["token_ids"] == extra(serial.choices[0])["token_ids"], f"{label}: ids")
            check(ts["min_rows"] == 1 and not ts["drafts"], f"{label}: serial receipt {ts}")
            check(td["drafts"] and td["drafted"] > 0, f"{label}: drafted receipt {td} (windows did not run)")
            structure(extra(drafted.choices[0])["token_ids"], n, label)
            dm, sm = drafted.choices[0].message, serial.choices[0].message
            check(extra(dm).get("reasoning_content") == extra(sm).get("reasoning_content"), f"{label}: reasoning")
            check(dm.content == sm.content, f"{label}: content")
            print(f"  {label}: drafted == serial, sha {td['token_sha']}, drafted {td['drafted']} "
                  f"accepted {td['accepted']} rounds {td['rounds']} vs {ts['rounds']}")


def responses_request(n, sampling, stream=False):
    body = {"thinking_budget": n}
    body.update({k: v for k, v in sampling.items() if k in ("seed", "logit_bias")})
    return CLIENT.responses.create(
        model=ARGS.model, input=ASK[0]["content"], max_output_tokens=n + 12, reasoning={"effort": "low"},
        extra_body=body, stream=stream, temperature=sampling["temperature"],
    )


def test_responses():
    for n in (1, 4, 16):
        for name, sampling in MODES:
            label = f"responses budget {n} {name}"
            # The same tokens as chat: the same prompt (effort low turns enable_thinking on), budget and sampling.
            c = chat(n, sampling, n + 12)
            ids = extra(c.choices[0])["token_ids"]
            k = structure(ids, n, label)
            r = responses_request(n, sampling)
            tf = extra(r)["tensorfold"]
            check(tf["token_sha"] == extra(c)["tensorfold"]["token_sha"], f"{label}: token_sha differs from chat's")
            types = [o.type for o in r.output]
            check(types[:2] == ["reasoning", "message"], f"{label}: output types {types}")
            item = r.output[0]
            check(item.summary == [] and len(item.content) == 1, f"{label}: reasoning item {item}")
            check(item.content[0].type == "reasoning_text", f"{label}: part type {item.content[0].type}")
            reasoning = extra(c.choices[0].message).get("reasoning_content")
            check(item.content[0].text == reasoning, f"{label}: reasoning {item.content[0].text!r} != {reasoning!r}")
            text = r.output[1].content[0].text
            check(text == c.choices[0].message.content, f"{label}: message text {text!r}")
            check(r.usage.output_tokens_details.reasoning_tokens == k + 1, f"{label}: {r.usage.output_tokens_details}")
            # Streamed: the events add up to the same items.
            events = list(responses_request(n, sampling, stream=True))
            kinds = [e.type for e in events]
            rdelta = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
            rdone = [e.text for e in events if e.type == "response.reasoning_text.done"]
            tdelta = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            check(rdelta == reasoning and rdone == [reasoning], f"{label}: streamed reasoning {rdelta!r} {rdone}")
            check(tdelta == text, f"{label}: streamed text {tdelta!r} != {text!r}")
            first_text = kinds.index("response.output_text.delta") if "response.output_text.delta" in kinds else None
            last_reason = max(i for i, t in enumerate(kinds) if t == "response.reasoning_text.delta")
            check(first_text is None or last_reason < first_text, f"{label}: reasoning after text in {kinds}")
            final = events[-1].response
            check(extra(final)["tensorfold"]["token_sha"] == tf["token_sha"], f"{label}: streamed token_sha")
            check([o.type for o in final.output] == types, f"{label}: streamed output types")
            check(final.output[0].content[0].text == reasoning, f"{label}: streamed final reasoning item")
            seq = [e.sequence_number for e in events]
            check(seq == list(range(len(seq))), f"{label}: sequence numbers")
            print(f"  {label}: output {types}, sha {tf['token_sha']} == chat's, streamed == non-streamed")
    # The stored conversation carries the reasoning into the next turn's template.
    r = responses_request(4, MODES[0][1])
    follow = CLIENT.responses.create(
        model=ARGS.model, input="And 3 + 3?", previous_response_id=r.id, max_output_tokens=4, temperature=0,
        extra_body={"return_token_ids": True},
    )
    check(follow.status in ("completed", "incomplete"), f"follow-up: {follow.status}")
    # Reasoning items sent back as input are accepted.
    again = CLIENT.responses.create(
        model=ARGS.model, max_output_tokens=4, temperature=0,
        input=[{"role": "user", "content": "What is 2 + 2?"},
               {"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": "Two and two."}]},
               {"role": "assistant", "content": "4"},
               {"role": "user", "content": "And 3 + 3?"}],
    )
    check(again.status in ("completed", "incomplete"), f"reasoning input item: {again.status}")


def test_grammar_after_thinking():
    for name, sampling in MODES:
        label = f"json_schema {name}"
        kw = dict(response_format=CITY)
        r = chat(4, sampling, 48, **kw)
        c = r.choices[0]
        ids = extra(c)["token_ids"]
        k = structure(ids, 4, label)
        check(c.finish_reason == "stop", f"{label}: finish {c.finish_reason} ({detok(ids)!r})")
        check(ids[k + 1] == detok_first_brace(), f"{label}: the answer does not start with the grammar: {ids}")
        value = json.loads(c.message.content)
        check(value.get("city") in ("Oslo", "Paris") and len(value) == 1, f"{label}: {value}")
        reasoning = extra(c.message).get("reasoning_content")
        check(reasoning == detok(ids[1:k]).strip("\n"), f"{label}: reasoning {reasoning!r}")
        s = chat_stream(4, sampling, 48, **kw)
        check(s["ids"] == ids and s["reasoning"] == reasoning, f"{label}: streamed reasoning/ids")
        check(s["content"] == c.message.content, f"{label}: streamed content {s['content']!r}")
        serial = chat(4, sampling, 48, extra_body={"draft": False}, **kw)
        check(extra(serial)["tensorfold"]["token_sha"] == extra(r)["tensorfold"]["token_sha"], f"{label}: serial")
        # Thinking off: the grammar starts at the first token.
        off = chat(4, sampling, 48, extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)
        oc = off.choices[0]
        check(extra(oc.message).get("reasoning_content") is None, f"{label}, thinking off: reasoning present")
        check(json.loads(oc.message.content).get("city") in ("Oslo", "Paris"), f"{label}, off: {oc.message.content}")
        print(f"  {label}: thinking {k - 1} tokens then {c.message.content}, drafted == serial == streamed")


def detok_first_brace():
    status, body = raw("POST", "/tokenize", {"prompt": "{", "add_special_tokens": False})
    check(status == 200 and body["count"] == 1, f"/tokenize '{{': {status} {body}")
    return body["tokens"][0]


def prompt_text(r):
    return detok(extra(r)["prompt_token_ids"])


def test_thinking_off_and_effort():
    for name, sampling in MODES:
        sampling = {k: v for k, v in sampling.items() if k != "logit_bias"}
        # 6 tokens: without a grammar the checkpoint's head (448 rows) can draw ids past its 407-token vocabulary.
        r = CLIENT.chat.completions.create(
            model=ARGS.model, messages=ASK, max_tokens=6, **sampling,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}, "thinking_budget": 2,
                        "return_token_ids": True},
        )
        p = prompt_text(r)
        check(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), f"thinking off {name}: prompt {p[-60:]!r}")
        m = r.choices[0].message
        check(extra(m).get("reasoning_content") is None, f"thinking off {name}: reasoning {extra(m)}")
        ids = extra(r.choices[0])["token_ids"]
        want = detok(ids[:-1] if ids[-1] == IM_END else ids)
        check(m.content == want, f"thinking off {name}: content {m.content!r} != {want!r}")
        check(THINK not in ids[:1], f"thinking off {name}: opened a block {ids}")
    for effort in ("low", "medium", "high"):
        r = CLIENT.chat.completions.create(
            model=ARGS.model, messages=ASK, max_tokens=2, temperature=0, reasoning_effort=effort,
            extra_body={"return_token_ids": True},
        )
        p = prompt_text(r)
        check(p.endswith("<|im_start|>assistant\n"), f"effort {effort}: prompt {p[-60:]!r}")
    # reasoning_effort "none" and absent leave the template's default (the same prompt as no field).
    base = prompt_text(CLIENT.chat.completions.create(model=ARGS.model, messages=ASK, max_tokens=1,
                                                      extra_body={"return_token_ids": True}))
    none = prompt_text(CLIENT.chat.completions.create(model=ARGS.model, messages=ASK, max_tokens=1,
                                                      extra_body={"return_token_ids": True,
                                                                  "reasoning_effort": "none"}))
    check(base == none, "reasoning_effort none changed the prompt")
    # chat_template_kwargs win over the effort.
    r = CLIENT.chat.completions.create(
        model=ARGS.model, messages=ASK, max_tokens=1, reasoning_effort="high",
        extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}},
    )
    check(prompt_text(r).endswith("</think>\n\n"), "chat_template_kwargs did not override the effort")


def test_bad_fields():
    cases = [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_budget": -1}, "thinking_budget"),
        ({"thinking_budget": "4"}, "thinking_budget"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
    ]
    for body, param in cases:
        status, r = raw("POST", "/v1/chat/completions", {"model": ARGS.model, "messages": ASK, **body})
        check(status == 400 and r["error"]["param"] == param, f"{body}: {status} {r}")
    for body, param in [({"reasoning": {"effort": "lots"}}, "reasoning.effort"), ({"reasoning": 1}, "reasoning")]:
        status, r = raw("POST", "/v1/responses", {"model": ARGS.model, "input": "hi", **body})
        check(status == 400 and r["error"]["param"] == param, f"{body}: {status} {r}")


def test_parser_none():
    for n in (1, 4):
        for name, sampling in MODES:
            label = f"parser none, budget {n} {name}"
            r = chat(n, sampling, n + 12)
            c = r.choices[0]
            ids = extra(c)["token_ids"]
            k = structure(ids, n, label)
            check(extra(c.message).get("reasoning_content") is None, f"{label}: reasoning_content present")
            want = detok(ids[:-1] if ids[-1] == IM_END else ids)
            check(c.message.content == want, f"{label}: content {c.message.content!r} != {want!r}")
            check(c.message.content.startswith("<think>") and "</think>" in c.message.content, f"{label}: markers")
            s = chat_stream(n, sampling, n + 12)
            check(s["content"] == want and s["reasoning"] == "", f"{label}: streamed {s['content']!r}")
            rr = responses_request(n, sampling)
            check([o.type for o in rr.output] == ["message"], f"{label}: responses output {rr.output}")
            check(rr.output[0].content[0].text == want, f"{label}: responses text")
            print(f"  {label}: content keeps the block ({k - 1} thinking tokens)")


def main():
    global ARGS, CLIENT, ROOT
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=["split", "none"], required=True)
    ARGS = ap.parse_args()
    CLIENT = openai.OpenAI(base_url=ARGS.base_url, api_key="unused", max_retries=0, timeout=300)
    ROOT = ARGS.base_url.rsplit("/v1", 1)[0]
    tests = {
        "split": [test_budget_structure_and_split, test_drafted_equals_serial, test_responses,
                  test_grammar_after_thinking, test_thinking_off_and_effort, test_bad_fields],
        "none": [test_parser_none],
    }[ARGS.mode]
    sys.exit(harness.run_all(tests))


if __name__ == "__main__":
    main()
