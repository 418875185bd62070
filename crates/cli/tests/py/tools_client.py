#!/usr/bin/env python3
"""Tool calls against a running `tensorfold serve`, through the official `openai` Python package.

Run by crates/cli/tests/serve_tools.rs:

    tools_client.py --base-url http://127.0.0.1:PORT/v1 --model ID --mode hermes|json

* `hermes`: a model whose chat template teaches the Hermes format (detected): earlier calls and tool results go
  through the template (arguments rendered as objects, results in <tool_response>), a reply that is bare JSON is
  content (no call invented), and bad tools / tool_choice / schemas are 400s naming the parameter.
* `json`: the same model served with `--tool-parser llama3`, which reads a reply that is a JSON object with a name
  as a call (greedy Qwen2.5-Coder-0.5B answers the weather question so): calls in chat replies and streams
  (argument deltas concatenate to the non-streamed arguments, same tokens), `tool_choice: none`, a reply cut
  inside its call, and the Responses API's function_call items, events and round trip.

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

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The local time in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


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
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    text = payload.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def sha_of(obj):
    return (obj.model_extra or {})["tensorfold"]["token_sha"]


def chat(**kw):
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", ASK)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 60)
    return CLIENT.chat.completions.create(**kw)


def stream_chat(**kw):
    """(content or None, {index: [id, type, name, arguments]}, finish_reason, last chunk, chunks)."""
    kw.setdefault("model", ARGS.model)
    kw.setdefault("messages", ASK)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 60)
    content, calls, finish, chunks = None, {}, None, []
    for ch in CLIENT.chat.completions.create(stream=True, **kw):
        chunks.append(ch)
        for c in ch.choices:
            d = c.delta
            if d.content:
                content = (content or "") + d.content
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    check(tc.id and tc.type == "function" and tc.function.name, f"first delta of call {tc.index} lacks id/type/name: {tc}")
                    check(tc.function.arguments == "", f"first delta of call {tc.index} has arguments {tc.function.arguments!r}")
                    calls[tc.index] = [tc.id, tc.type, tc.function.name, ""]
                else:
                    check(tc.id is None and tc.function.name is None, f"a later delta repeats id/name: {tc}")
                    calls[tc.index][3] += tc.function.arguments or ""
            if c.finish_reason:
                finish = c.finish_reason
    return content, calls, finish, chunks[-1], chunks


def expect_400(fn, param, what):
    try:
        fn()
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(body.get("type") == "invalid_request_error", f"{what}: error type {body}")
        check(body.get("param") == param, f"{what}: param {body.get('param')!r} != {param!r} ({body})")
        check(param in body.get("message", ""), f"{what}: the message does not name {param}: {body}")
        return body
    except openai.APIStatusError as e:
        raise Failure(f"{what}: expected 400, got {e.status_code} {e.body}")
    raise Failure(f"{what}: expected 400, the request succeeded")


# ---------------------------------------------------------------- hermes mode

HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{\"city\": \"Paris\"}"}},
    ]},
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 22 C"},
    {"role": "tool", "tool_call_id": "call_b", "content": "14:05"},
]


def t_tool_results_through_the_template():
    status, body = raw("POST", "/tokenize", {"model": ARGS.model, "messages": HISTORY, "tools": [WEATHER, TIME]})
    check(status == 200, f"/tokenize -> {status} {body}")
    status, text = raw("POST", "/detokenize", {"model": ARGS.model, "tokens": body["tokens"]})
    check(status == 200, f"/detokenize -> {status} {text}")
    prompt = text["prompt"]
    # The tools are offered, the earlier calls render as the model writes them (arguments as an object, not a
    # JSON string inside JSON), and both results sit in one user turn.
    check('"name": "get_weather"' in prompt and "<tools>" in prompt, f"tools not rendered:\n{prompt}")
    want = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    check(want in prompt, f"the earlier call is not rendered as {want!r}:\n{prompt}")
    check('"arguments": "{' not in prompt, f"arguments were rendered as a string:\n{prompt}")
    want = "<|im_start|>user\n<tool_response>\nsunny, 22 C\n</tool_response>\n<tool_response>\n14:05\n</tool_response><|im_end|>"
    check(want in prompt, f"tool results not rendered as {want!r}:\n{prompt}")
    # A chat request with that history is served; the reply's prompt is the same tokens.
    r = chat(messages=HISTORY, tools=[WEATHER, TIME], max_tokens=16)
    check(r.usage.prompt_tokens == body["count"], f"prompt tokens {r.usage.prompt_tokens} != /tokenize {body['count']}")
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"finish {r.choices[0].finish_reason}")


def t_bare_json_is_content():
    # Greedy, this model answers with bare JSON, not the <tool_call> wrapper its template asks for: no call.
    r = chat(tools=[WEATHER])
    m = r.choices[0].message
    check(not m.tool_calls and r.choices[0].finish_reason == "stop", f"unexpected calls: {m}")
    check(m.content and m.content.lstrip().startswith("{"), f"content {m.content!r}")
    content, calls, finish, _, _ = stream_chat(tools=[WEATHER])
    check((content, calls, finish) == (m.content, {}, "stop"), f"streamed {(content, calls, finish)}")


def t_errors():
    expect_400(lambda: chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice", "unknown function")
    expect_400(lambda: chat(tool_choice="required"), "tool_choice", "required without tools")
    bad = {"type": "function", "function": {"name": "f", "parameters": ["x"]}}
    expect_400(lambda: chat(tools=[bad]), "tools[0].function.parameters", "non-object parameters")
    expect_400(lambda: chat(tools=[WEATHER, WEATHER]), "tools[1].function.name", "a function given twice")
    expect_400(lambda: chat(tools=[{"type": "code_interpreter"}]), "tools[0].type", "a non-function tool")
    # Schemas that cannot compile are refused before anything runs, streamed or not, naming the parameter.
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": "zero"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for stream in (False, True):
        expect_400(lambda: chat(response_format=rf, stream=stream), "response_format.json_schema.schema", "bad schema")
    expect_400(lambda: chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 7}}), "response_format.json_schema.schema", "schema 7")
    expect_400(lambda: chat(extra_body={"guided_regex": "(ab"}), "guided_regex", "bad regex")
    expect_400(lambda: chat(extra_body={"guided_grammar": "start: nothing_defined"}), "guided_grammar", "bad grammar")
    expect_400(lambda: chat(extra_body={"guided_choice": []}), "guided_choice", "no choices")
    expect_400(
        lambda: CLIENT.completions.create(model=ARGS.model, prompt="x", max_tokens=2, extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}),
        "response_format.json_schema.schema",
        "completions bad schema",
    )
    expect_400(
        lambda: CLIENT.responses.create(model=ARGS.model, input="hi", max_output_tokens=2, text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}),
        "text.format.schema",
        "responses bad schema",
    )
    expect_400(
        lambda: CLIENT.responses.create(model=ARGS.model, input="hi", max_output_tokens=2, tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}),
        "tool_choice",
        "responses unknown function",
    )
    # Forcing a call and a JSON format cannot go together.
    expect_400(lambda: chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "response_format", "forced call + format")


HERMES = [t_tool_results_through_the_template, t_bare_json_is_content, t_errors]


# ---------------------------------------------------------------- json mode (--tool-parser llama3)


def t_chat_calls():
    r = chat(tools=[WEATHER, TIME], extra_body={"return_token_ids": True})
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"finish {c.finish_reason}: {c.message}")
    check(c.message.content is None, f"content {c.message.content!r} beside the call")
    calls = c.message.tool_calls
    check(len(calls) == 1, f"calls {calls}")
    call = calls[0]
    check(call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather", f"call {call}")
    check(json.loads(call.function.arguments) == {"city": "Paris"}, f"arguments {call.function.arguments!r}")
    # Streamed: one call, first delta id/type/name with "" arguments, deltas adding up to the same arguments,
    # from the same tokens.
    content, scalls, finish, last, _ = stream_chat(tools=[WEATHER, TIME])
    check(content is None and finish == "tool_calls", f"streamed content {content!r} finish {finish}")
    check(list(scalls) == [0], f"streamed calls {scalls}")
    sid, stype, sname, sargs = scalls[0]
    check((stype, sname, sargs) == ("function", "get_weather", call.function.arguments), f"streamed call {scalls[0]} != {call}")
    check(sid.startswith("call_"), f"streamed id {sid}")
    check(sha_of(last) == sha_of(r), "streamed tokens differ from the non-streamed ones")
    # Drafted == serial: the same tokens with drafts off.
    s = chat(tools=[WEATHER, TIME], extra_body={"draft": False})
    check(sha_of(s) == sha_of(r) and s.choices[0].message.tool_calls[0].function.arguments == call.function.arguments, "draft: false differs")
    # The call goes back through the template with its result: the next reply is served.
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 22 C"},
    ]
    r2 = chat(messages=follow, tools=[WEATHER, TIME], max_tokens=24)
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens, f"follow-up prompt {r2.usage.prompt_tokens}")


def t_choice_none_and_no_tools():
    # tool_choice none: the tools are rendered but nothing is parsed: the JSON is content.
    r = chat(tools=[WEATHER], tool_choice="none")
    m = r.choices[0].message
    check(not m.tool_calls and r.choices[0].finish_reason == "stop", f"tool_choice none parsed a call: {m}")
    check(json.loads(m.content)["name"] == "get_weather", f"content {m.content!r}")
    # No tools: no parsing either.
    r = chat()
    check(not r.choices[0].message.tool_calls, f"parsed a call without tools: {r.choices[0].message}")


def t_cut_inside_a_call():
    # max_tokens ends the reply inside the call: no half-parsed call, the partial text is dropped.
    r = chat(tools=[WEATHER], max_tokens=8)
    c = r.choices[0]
    check(c.finish_reason == "length", f"finish {c.finish_reason}")
    check(not c.message.tool_calls and c.message.content == "", f"cut reply {c.message}")
    content, calls, finish, last, _ = stream_chat(tools=[WEATHER], max_tokens=8)
    check(finish == "length" and content is None, f"streamed cut: {content!r} {finish}")
    check(sha_of(last) == sha_of(r), "streamed tokens differ")
    # The stream had announced the call (name known); its arguments are incomplete JSON.
    check(list(calls) == [0] and calls[0][2] == "get_weather", f"streamed cut calls {calls}")


RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
               "parameters": WEATHER["function"]["parameters"]}]
RESP_INPUT = "What is the weather in Paris? Use the tool."


def t_responses_function_call():
    r = CLIENT.responses.create(model=ARGS.model, input=RESP_INPUT, tools=RESP_TOOLS, temperature=0, max_output_tokens=60)
    check(r.status == "completed", f"status {r.status}")
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and len(r.output) == 1, f"output {r.output}")
    fc = calls[0]
    check(fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.status == "completed", f"item {fc}")
    check(json.loads(fc.arguments) == {"city": "Paris"}, f"arguments {fc.arguments!r}")
    check(r.tools and r.tools[0].name == "get_weather", f"tools echo {r.tools}")
    # Streamed: the item added, argument deltas, done with the same arguments, then the item done.
    types, deltas, done_args, done_item, final = [], "", None, None, None
    with CLIENT.responses.stream(model=ARGS.model, input=RESP_INPUT, tools=RESP_TOOLS, temperature=0, max_output_tokens=60) as s:
        for ev in s:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                deltas += ev.delta
            elif ev.type == "response.function_call_arguments.done":
                done_args = ev.arguments
            elif ev.type == "response.output_item.done":
                done_item = ev.item
            elif ev.type == "response.completed":
                final = ev.response
    want = ["response.created", "response.in_progress", "response.output_item.added"]
    check(types[:3] == want, f"event order {types}")
    check(types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"], f"event order {types}")
    check(deltas == done_args == fc.arguments, f"streamed arguments {deltas!r} / {done_args!r} != {fc.arguments!r}")
    check(done_item.type == "function_call" and done_item.name == "get_weather", f"done item {done_item}")
    check(final.output[0].arguments == fc.arguments, f"final output {final.output}")
    check(sha_of(final) == sha_of(r), "streamed tokens differ")
    # Round trip, chained: the call's output goes back by previous_response_id.
    r2 = CLIENT.responses.create(
        model=ARGS.model,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 22 C"}],
        tools=RESP_TOOLS,
        temperature=0,
        max_output_tokens=24,
    )
    check(r2.status in ("completed", "incomplete") and r2.usage.input_tokens > r.usage.input_tokens, f"chained {r2}")
    # Round trip, stateless: the call and its output as input items give the same prompt.
    r3 = CLIENT.responses.create(
        model=ARGS.model,
        input=[
            {"role": "user", "content": RESP_INPUT},
            {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 22 C"},
        ],
        tools=RESP_TOOLS,
        temperature=0,
        max_output_tokens=24,
    )
    check(r3.usage.input_tokens == r2.usage.input_tokens, f"stateless prompt {r3.usage.input_tokens} != chained {r2.usage.input_tokens}")
    check(sha_of(r3) == sha_of(r2), "stateless and chained round trips differ")


JSON = [t_chat_calls, t_choice_none_and_no_tools, t_cut_inside_a_call, t_responses_function_call]


def main():
    global ARGS, CLIENT, ROOT
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["hermes", "json"], required=True)
    ARGS = p.parse_args()
    ROOT = ARGS.base_url.rstrip("/").removesuffix("/v1")
    CLIENT = openai.OpenAI(base_url=ARGS.base_url, api_key="none", max_retries=0, timeout=120)
    print(f"openai {openai.__version__}, server {ROOT}, model {ARGS.model}, mode {ARGS.mode}")
    return harness.run_all(HERMES if ARGS.mode == "hermes" else JSON)


if __name__ == "__main__":
    sys.exit(main())
