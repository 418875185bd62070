#!/usr/bin/env node
// Tool calls against a running `tensorfold serve` (Hermes template, Qwen2.5-Coder-0.5B) through the official
// `openai` JavaScript SDK (package.json pins it): a streamed chat with `tools` whose `delta.tool_calls` add up to
// the non-streamed call, and the SDK's tool-running helper `client.chat.completions.runTools` (non-streamed and
// streamed) calling a JS function with the parsed arguments and sending its result back.
//
// Run by crates/cli/tests/serve_js.rs:
//
//     node tools_client.mjs --base-url http://127.0.0.1:PORT/v1 --model ID [--only NAME,...]
//
// Prints one line per check and "ALL OK" at the end; exits 1 when a check failed.

import { parseArgs } from "node:util";
import OpenAI from "openai";

const { values: ARGS } = parseArgs({
  options: {
    "base-url": { type: "string" },
    model: { type: "string" },
    only: { type: "string" },
  },
});
if (!ARGS["base-url"] || !ARGS.model) {
  console.error("usage: node tools_client.mjs --base-url http://127.0.0.1:PORT/v1 --model ID [--only NAME,...]");
  process.exit(2);
}

const CLIENT = new OpenAI({ baseURL: ARGS["base-url"], apiKey: "unused", maxRetries: 0, timeout: 300_000 });

const CITY = {
  type: "object",
  properties: { city: { type: "string", description: "The city name" } },
  required: ["city"],
  additionalProperties: false,
};
const WEATHER = {
  type: "function",
  function: { name: "get_weather", description: "Get the current weather in a city", parameters: CITY },
};
const ASK = [{ role: "user", content: "What is the weather like in Paris today?" }];
const WEATHER_REPORT = "Sunny, 21 degrees Celsius, light wind from the west.";

class Failure extends Error {}

function check(cond, msg) {
  if (!cond) throw new Failure(msg);
}

const show = (v) => JSON.stringify(v);

/** The receipt's `token_sha`: an extra field `tensorfold` on the reply object or on a stream's last chunk. */
function shaOf(obj) {
  const sha = obj?.tensorfold?.token_sha;
  check(typeof sha === "string" && sha.length > 0, `no tensorfold.token_sha on ${show(obj)}`);
  return sha;
}

/** Arguments JSON text that parses to an object with `city` a non-empty string; returns the object. */
function cityArgs(text) {
  let args;
  try {
    args = JSON.parse(text);
  } catch (e) {
    throw new Failure(`arguments do not parse as JSON (${e.message}): ${show(text)}`);
  }
  check(args !== null && typeof args === "object" && !Array.isArray(args), `arguments not an object: ${show(text)}`);
  check(typeof args.city === "string" && args.city.length > 0, `arguments without a string city: ${show(text)}`);
  return args;
}

// tool_choice "required" streamed: the argument fragments concatenate to JSON with a string `city`, the
// finish is `tool_calls`, and the non-streamed request gives the same call and the same tokens.
async function t_streamed_required_call() {
  const body = { model: ARGS.model, messages: ASK, tools: [WEATHER], tool_choice: "required", temperature: 0, max_tokens: 120 };
  const stream = await CLIENT.chat.completions.create({ ...body, stream: true });
  const calls = new Map();
  let content = null;
  let finish = null;
  let last = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    last = chunk;
    for (const c of chunk.choices) {
      if (c.delta?.content) content = (content ?? "") + c.delta.content;
      for (const tc of c.delta?.tool_calls ?? []) {
        if (!calls.has(tc.index)) {
          check(typeof tc.id === "string" && tc.id.length > 0, `first delta of call ${tc.index} has no id: ${show(tc)}`);
          check(tc.type === "function", `first delta of call ${tc.index} has type ${show(tc.type)}`);
          calls.set(tc.index, { name: tc.function?.name, args: "", fragments: 0 });
        }
        const call = calls.get(tc.index);
        if (tc.function?.arguments) {
          call.args += tc.function.arguments;
          call.fragments += 1;
        }
      }
      finish = c.finish_reason ?? finish;
    }
  }
  check(calls.size >= 1, `no delta.tool_calls in ${chunks} chunks`);
  check(content === null, `content beside a forced call: ${show(content)}`);
  check(finish === "tool_calls", `finish_reason ${show(finish)}`);
  const streamed = [...calls.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => c);
  for (const c of streamed) {
    check(c.name === "get_weather", `streamed call of ${show(c.name)}`);
    cityArgs(c.args);
  }
  const streamedSha = shaOf(last);

  const reply = await CLIENT.chat.completions.create(body);
  const choice = reply.choices[0];
  check(choice.finish_reason === "tool_calls", `non-streamed finish_reason ${show(choice.finish_reason)}`);
  check(choice.message.content === null, `non-streamed content beside a forced call: ${show(choice.message.content)}`);
  const want = (choice.message.tool_calls ?? []).map((c) => ({ name: c.function.name, args: c.function.arguments }));
  const got = streamed.map((c) => ({ name: c.name, args: c.args }));
  check(show(got) === show(want), `streamed calls ${show(got)} != non-streamed ${show(want)}`);
  check(shaOf(reply) === streamedSha, `streamed token_sha ${streamedSha} != non-streamed ${shaOf(reply)}`);
  const frags = streamed.map((c) => c.fragments).join("+");
  return `${got.map((c) => `${c.name}(${c.args})`).join(", ")} from ${frags} fragments in ${chunks} chunks, token_sha ${streamedSha}`;
}

/** A get_weather tool for runTools whose JS function records the arguments it was given. */
function runnableWeather(seen) {
  return {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city",
      parameters: CITY,
      parse: JSON.parse,
      function: (args) => {
        seen.push(args);
        return WEATHER_REPORT;
      },
    },
  };
}

/** The runner's conversation holds the assistant call and, right after it, the tool message with the result. */
function checkToolRound(messages, seen) {
  check(seen.length >= 1, "the JS function was never called");
  for (const args of seen) {
    check(args !== null && typeof args === "object", `the JS function got ${show(args)}, not parsed arguments`);
    check(typeof args.city === "string" && args.city.length > 0, `the JS function got no string city: ${show(args)}`);
  }
  const at = messages.findIndex((m) => m.role === "assistant" && m.tool_calls?.length);
  check(at >= 0, `no assistant message with tool_calls in ${show(messages)}`);
  const call = messages[at].tool_calls[0];
  check(call.function.name === "get_weather", `call of ${show(call.function.name)}`);
  const tool = messages[at + 1];
  check(tool?.role === "tool", `no tool message after the call: ${show(messages.slice(at))}`);
  check(tool.tool_call_id === call.id, `tool_call_id ${show(tool.tool_call_id)} != call id ${show(call.id)}`);
  check(tool.content === WEATHER_REPORT, `tool message content ${show(tool.content)}`);
  return at;
}

// runTools with a named tool_choice: one forced call, the function runs on its parsed arguments, its result is
// added as a tool message, and the helper ends there (it stops once the named function ran).
async function t_run_tools_named() {
  const seen = [];
  const runner = CLIENT.chat.completions.runTools({
    model: ARGS.model,
    messages: ASK,
    tools: [runnableWeather(seen)],
    tool_choice: { type: "function", function: { name: "get_weather" } },
    temperature: 0,
    max_tokens: 120,
  });
  const calls = [];
  runner.on("functionToolCall", (fc) => calls.push(fc));
  const final = await runner.finalChatCompletion();
  await runner.done();
  check(seen.length === 1, `the JS function ran ${seen.length} times, want 1`);
  check(calls.length === 1 && calls[0].name === "get_weather", `functionToolCall events ${show(calls)}`);
  cityArgs(calls[0].arguments);
  check(show(JSON.parse(calls[0].arguments)) === show(seen[0]), `function got ${show(seen[0])} for ${calls[0].arguments}`);
  const all = runner.allChatCompletions();
  check(all.length === 1, `${all.length} chat completions, want 1`);
  check(final.choices[0].finish_reason === "tool_calls", `finish_reason ${show(final.choices[0].finish_reason)}`);
  shaOf(final);
  const messages = runner.messages;
  const at = checkToolRound(messages, seen);
  check(at === messages.length - 2, `messages after the tool result: ${show(messages.slice(at + 2))}`);
  return `get_weather(${show(seen[0])}) -> tool message, 1 completion`;
}

// The helper's loop with tool_choice "required" and `maxChatCompletions: 2`: every reply is a forced call, so
// the helper runs the JS function on each call's parsed arguments, sends its result back as a tool message, asks
// again, and ends without an error after its two completions. (Under tool_choice "auto" Qwen2.5-Coder-0.5B writes
// the call as bare JSON, not in `<tool_call>` tags, and after a tool result it repeats the call, so the bound on
// completions is what ends the loop.)
async function loop(stream) {
  const seen = [];
  const params = {
    model: ARGS.model,
    messages: ASK,
    tools: [runnableWeather(seen)],
    tool_choice: "required",
    parallel_tool_calls: false,
    temperature: 0,
    max_tokens: 120,
  };
  const runner = CLIENT.chat.completions.runTools(stream ? { ...params, stream: true } : params, { maxChatCompletions: 2 });
  const events = [];
  runner.on("functionToolCall", (fc) => events.push(fc));
  let chunks = 0;
  if (stream) runner.on("chunk", () => (chunks += 1));
  await runner.done();
  const all = runner.allChatCompletions();
  check(all.length === 2, `${all.length} chat completions, want 2`);
  const messages = runner.messages;
  check(show(messages.map((m) => m.role)) === show(["user", "assistant", "tool", "assistant", "tool"]), `message roles ${show(messages.map((m) => m.role))}`);
  checkToolRound(messages, seen);
  checkToolRound(messages.slice(3), seen);
  check(seen.length === 2, `the JS function ran ${seen.length} times, want 2`);
  check(events.length === 2, `${events.length} functionToolCall events, want 2`);
  const calls = [];
  for (const [i, c] of all.entries()) {
    const choice = c.choices[0];
    check(choice.finish_reason === "tool_calls", `completion ${i} finish_reason ${show(choice.finish_reason)}`);
    check(choice.message.tool_calls?.length === 1, `completion ${i} calls ${show(choice.message.tool_calls)}`);
    const call = choice.message.tool_calls[0].function;
    check(show(JSON.parse(call.arguments)) === show(seen[i]), `function got ${show(seen[i])} for ${call.arguments}`);
    check(events[i].name === call.name && events[i].arguments === call.arguments, `event ${show(events[i])} != call ${show(call)}`);
    cityArgs(call.arguments);
    calls.push({ name: call.name, args: call.arguments });
  }
  const final = await runner.finalChatCompletion();
  check(final === all[1], "finalChatCompletion is not the last completion");
  if (stream) {
    check(chunks > 2, `${chunks} chunks streamed`);
  } else {
    for (const c of all) shaOf(c);
    const [p0, p1] = all.map((c) => c.usage?.prompt_tokens);
    check(p1 > p0, `the second request's prompt (${p1} tokens) does not extend the first's (${p0})`);
  }
  return { seen, calls, chunks };
}

async function t_run_tools_loop() {
  const r = await loop(false);
  return `2 completions, get_weather ran on ${show(r.seen)}, 2 tool messages`;
}

// The same loop through the streaming runner (`stream: true`): the same calls, assembled from the chunks.
async function t_run_tools_loop_streamed() {
  const plain = await loop(false);
  const streamed = await loop(true);
  check(show(streamed.calls) === show(plain.calls), `streamed loop calls ${show(streamed.calls)} != non-streamed ${show(plain.calls)}`);
  return `${streamed.chunks} chunks, the same 2 calls as non-streamed`;
}

const CHECKS = [t_streamed_required_call, t_run_tools_named, t_run_tools_loop, t_run_tools_loop_streamed];

async function main() {
  const only = ARGS.only ? new Set(ARGS.only.split(",")) : null;
  const { VERSION } = await import("openai/version");
  console.log(`openai ${VERSION}, node ${process.version}, ${ARGS["base-url"]}, model ${ARGS.model}`);
  let failed = 0;
  for (const t of CHECKS) {
    if (only && !only.has(t.name)) continue;
    const started = performance.now();
    try {
      const what = await t();
      console.log(`ok   ${t.name} (${((performance.now() - started) / 1000).toFixed(1)} s): ${what}`);
    } catch (e) {
      failed += 1;
      console.log(`FAIL ${t.name} (${((performance.now() - started) / 1000).toFixed(1)} s): ${e instanceof Failure ? e.message : e?.stack ?? e}`);
    }
  }
  if (failed) {
    console.log(`${failed} check(s) failed`);
    process.exit(1);
  }
  console.log("ALL OK");
}

await main();
