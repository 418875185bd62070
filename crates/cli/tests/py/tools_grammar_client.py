#!/usr/bin/env python3
"""Grammar-enforced replies against a running `tensorfold serve` (Hermes template, Qwen2.5-Coder-0.5B), through the
official `openai` Python package: forced tool calls (`tool_choice` required / named, `parallel_tool_calls`) always
give valid calls, JSON formats give replies that validate, choices and regexes hold; each drafted == serial and
streamed == non-streamed by token ids, and concurrent == solo.

Run by crates/cli/tests/serve_tools_grammar.rs:

    tools_grammar_client.py --base-url http://127.0.0.1:PORT/v1 --model ID

Needs `jsonschema` (crates/cli/tests/py/requirements.txt). Prints "ALL OK" and exits 0 when every check passed.
"""

import argparse
import json
import re
import sys
import threading
import traceback

import jsonschema
import harness
import openai
import pydantic

ARGS = None
CLIENT = None

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SCHEMAS = {"get_weather": CITY, "get_time": TIME["function"]["parameters"]}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it there?"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def sha_of(obj):
    return (obj.model_extra or {})["tensorfold"]["token_sha"]


def chat(**kw):
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", ASK)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    return CLIENT.chat.completions.create(**kw)


def stream_chat(**kw):
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", ASK)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    content, calls, finish, last = None, {}, None, None
    for ch in CLIENT.chat.completions.create(stream=True, **kw):
        last = ch
        for c in ch.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for tc in c.delta.tool_calls or []:
                if tc.index not in calls:
                    calls[tc.index] = [tc.function.name, ""]
                calls[tc.index][1] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return content, calls, finish, last


def same_message(a, b):
    """Equal content and calls (name and arguments); call ids are fresh in every reply."""
    calls = lambda m: [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]
    return a.content == b.content and calls(a) == calls(b)


def with_variants(kw, validate):
    """Runs kw non-streamed (drafted), with draft: false, and streamed; validates the reply; checks that all three
    are the same tokens and the same result. Returns the non-streamed reply."""
    r = chat(**kw)
    validate(r.choices[0])
    extra = dict(kw.get("extra_body") or {})
    s = chat(**{**kw, "extra_body": {**extra, "draft": False}})
    check(sha_of(s) == sha_of(r), f"drafted {sha_of(r)} != serial {sha_of(s)} for {kw}")
    check(same_message(s.choices[0].message, r.choices[0].message), "serial reply differs")
    content, calls, finish, last = stream_chat(**kw)
    check(sha_of(last) == sha_of(r), f"streamed {sha_of(last)} != {sha_of(r)}")
    m = r.choices[0].message
    want_calls = {i: [c.function.name, c.function.arguments] for i, c in enumerate(m.tool_calls or [])}
    check((content, finish) == (m.content, r.choices[0].finish_reason), f"streamed content/finish {(content, finish)}")
    check(calls == want_calls, f"streamed calls {calls} != {want_calls}")
    return r


def valid_calls(choice, names=None, count=None):
    calls = choice.message.tool_calls or []
    check(calls, f"no tool call: {choice.message}")
    if count is not None:
        check(len(calls) == count, f"{len(calls)} calls, want {count}")
    check(choice.message.content is None, f"content beside forced calls: {choice.message.content!r}")
    for c in calls:
        check(c.function.name in (names or SCHEMAS), f"call of {c.function.name}")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    if choice.finish_reason != "length":
        check(choice.finish_reason == "tool_calls", f"finish {choice.finish_reason}")


def t_required_one_call():
    with_variants(dict(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False), lambda c: valid_calls(c, count=1))
    # Sampled: the keyed draw over the grammar's allowed ids, the same tokens drafted or not.
    sampled = dict(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, temperature=0.9, seed=11)
    with_variants(sampled, lambda c: valid_calls(c, count=1))


def t_required_parallel():
    with_variants(dict(tools=[WEATHER, TIME], tool_choice="required", max_tokens=200), valid_calls)


def t_named():
    for name in ["get_time", "get_weather"]:
        choice = {"type": "function", "function": {"name": name}}
        with_variants(dict(tools=[WEATHER, TIME], tool_choice=choice), lambda c, n=name: valid_calls(c, names=[n], count=1))


def t_required_on_a_plain_question():
    # Even where the model would answer in text, the reply is a call.
    msgs = [{"role": "user", "content": "Write a haiku about the sea."}]
    with_variants(dict(messages=msgs, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), lambda c: valid_calls(c, count=1))


def t_responses_required():
    tools = [{"type": "function", "name": "get_weather", "parameters": CITY}]
    r = CLIENT.responses.create(model=ARGS.model, input="Weather in Oslo?", tools=tools, tool_choice="required",
                                parallel_tool_calls=False, temperature=0, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"output {r.output}")
    jsonschema.validate(json.loads(calls[0].arguments), CITY)
    r2 = CLIENT.responses.create(model=ARGS.model, input="Weather in Oslo?", tools=tools,
                                 tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=80)
    check([o.type for o in r2.output] == ["function_call"], f"named output {r2.output}")


def json_reply(schema):
    def validate(choice):
        check(choice.finish_reason == "stop", f"finish {choice.finish_reason}: {choice.message.content!r}")
        v = json.loads(choice.message.content)
        if schema is None:
            check(isinstance(v, dict), f"not an object: {v!r}")
        else:
            jsonschema.validate(v, schema)
    return validate


def t_json_schema():
    msgs = [{"role": "user", "content": "Invent a person: name, age and up to three tags."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    with_variants(dict(messages=msgs, response_format=rf, max_tokens=150), json_reply(PERSON))
    with_variants(dict(messages=msgs, response_format=rf, max_tokens=150, temperature=0.8, seed=7), json_reply(PERSON))


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int
    tags: list[str] = pydantic.Field(max_length=3)


def t_parse_pydantic():
    """The SDK's structured-output helper: a Pydantic model becomes a strict json_schema, the reply is parsed into it."""
    msgs = [{"role": "user", "content": "Invent a person: name, age and up to three tags."}]
    for extra in [dict(temperature=0), dict(temperature=0.8, seed=5)]:
        r = CLIENT.chat.completions.parse(model=ARGS.model, messages=msgs, response_format=Person, max_tokens=200, **extra)
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "stop", f"finish {r.choices[0].finish_reason}")
        check(isinstance(m.parsed, Person), f"parsed {m.parsed!r} from {m.content!r}")
        check(m.parsed == Person.model_validate_json(m.content), "parsed differs from the content")
        serial = CLIENT.chat.completions.parse(model=ARGS.model, messages=msgs, response_format=Person, max_tokens=200,
                                              extra_body={"draft": False}, **extra)
        check(sha_of(serial) == sha_of(r), f"drafted {sha_of(r)} != serial {sha_of(serial)}")


def t_json_object():
    msgs = [{"role": "user", "content": "Give a JSON object with the keys city and country for Paris."}]
    with_variants(dict(messages=msgs, response_format={"type": "json_object"}, max_tokens=150), json_reply(None))


def t_responses_text_format():
    r = CLIENT.responses.create(model=ARGS.model, input="Invent a person.", temperature=0, max_output_tokens=150,
                                text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    check(r.status == "completed", f"status {r.status}")
    jsonschema.validate(json.loads(r.output_text), PERSON)


def t_choice_and_regex():
    msgs = [{"role": "user", "content": "Is the sky green? Answer yes or no."}]
    def in_choices(c):
        check(c.message.content in ("yes", "no", "maybe"), f"choice {c.message.content!r}")
    with_variants(dict(messages=msgs, extra_body={"guided_choice": ["yes", "no", "maybe"]}), in_choices)
    rx = r"[0-9]{3}-[0-9]{4}"
    def matches(c):
        check(re.fullmatch(rx, c.message.content), f"regex {c.message.content!r}")
    with_variants(dict(messages=[{"role": "user", "content": "Give me a phone number."}], extra_body={"guided_regex": rx}), matches)
    c = CLIENT.completions.create(model=ARGS.model, prompt="A JSON object about cats:", max_tokens=100, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    check(isinstance(json.loads(c.choices[0].text), dict), f"completions json_object {c.choices[0].text!r}")


def t_concurrent_equals_solo():
    msgs = [{"role": "user", "content": "Invent a person: name, age and up to three tags."}]
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reqs = [dict(messages=msgs, response_format=rf, max_tokens=150, temperature=0.9, seed=40 + i) for i in range(4)]
    reqs.append(dict(tools=[WEATHER, TIME], tool_choice="required", temperature=0.9, seed=3))
    solo = [sha_of(chat(**kw)) for kw in reqs]
    got = [None] * len(reqs)
    errors = [None] * len(reqs)
    barrier = threading.Barrier(len(reqs))

    def worker(i):
        try:
            barrier.wait(timeout=60)
            got[i] = sha_of(stream_chat(**reqs[i])[3])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[i] = "".join(traceback.format_exception(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in range(len(reqs)):
        check(errors[i] is None, f"request {i} failed:\n{errors[i]}")
        check(got[i] == solo[i], f"request {i}: concurrent {got[i]} != solo {solo[i]}")


TESTS = [t_required_one_call, t_required_parallel, t_named, t_required_on_a_plain_question, t_responses_required,
         t_json_schema, t_parse_pydantic, t_json_object, t_responses_text_format, t_choice_and_regex, t_concurrent_equals_solo]


def main():
    global ARGS, CLIENT
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--only", default="", help="comma-separated test names (default: all)")
    ARGS = p.parse_args()
    CLIENT = openai.OpenAI(base_url=ARGS.base_url, api_key="none", max_retries=0, timeout=300)
    print(f"openai {openai.__version__}, {ARGS.base_url}, model {ARGS.model}")
    only = [n for n in ARGS.only.split(",") if n]
    return harness.run_all([t for t in TESTS if not (only and t.__name__ not in only)])


if __name__ == "__main__":
    sys.exit(main())
