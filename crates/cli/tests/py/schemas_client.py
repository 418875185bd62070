#!/usr/bin/env python3
"""Structured output under generated JSON schemas, through the official `openai` Python package.

Run by crates/cli/tests/serve_schemas.rs against a running `tensorfold serve`:

    schemas_client.py --base-url http://127.0.0.1:PORT/v1 --model ID [--count 200] [--seed S] [--exact 12]

It generates `--count` JSON schemas from a seeded generator (nested objects, arrays, enums, bounded numbers,
required and optional fields, `additionalProperties: false`), asks for each with `response_format`
`json_schema` (`strict: true`), half greedy and half sampled, eight requests at a time, and checks every reply
with the `jsonschema` package: every reply that ended (`finish_reason: "stop"`) parses and validates. A reply
cut at `max_tokens` cannot parse by definition; a small model sometimes repeats digits of a number until it is
cut (the grammar allows a number of any length; 0 to 5 of 200 in measured runs), so cut replies are listed and
at most 5% of them are allowed.
For the first
`--exact` schemas it also sends the same request with `"draft": false` and compares the `token_sha` of the two
replies (drafted == serial under a grammar). Prints one line per failure and "ALL OK" at the end; exits 1 on
any failure. The seed is printed first, so a failing run can be replayed with `--seed`.
"""

import argparse
import concurrent.futures
import json
import random
import sys
import time

import jsonschema
import openai

WORDS = ["id", "name", "kind", "size", "tags", "owner", "count", "price", "ok", "mode", "items", "meta", "level", "note"]
ENUM_WORDS = ["red", "green", "blue", "low", "high", "yes", "no", "alpha", "beta", "gamma"]


def gen_scalar(rng):
    kind = rng.choice(["string", "string_enum", "integer", "number", "boolean"])
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 8)}
    if kind == "string_enum":
        return {"type": "string", "enum": rng.sample(ENUM_WORDS, rng.randint(1, 4))}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "number":
        lo = rng.randint(-10, 10)
        return {"type": "number", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    return {"type": "boolean"}


def gen_schema(rng, depth):
    """A value schema; objects and arrays nest at most `depth` more levels."""
    roll = rng.random()
    if depth > 0 and roll < 0.25:
        return gen_object(rng, depth - 1)
    if depth > 0 and roll < 0.45:
        return {"type": "array", "items": gen_schema(rng, depth - 1), "minItems": rng.randint(0, 1), "maxItems": rng.randint(1, 3)}
    return gen_scalar(rng)


def gen_object(rng, depth):
    names = rng.sample(WORDS, rng.randint(1, 4))
    props = {n: gen_schema(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    obj = {"type": "object", "properties": props, "required": required}
    if rng.random() < 0.6:
        obj["additionalProperties"] = False
    return obj


def ask(client, model, i, schema, draft):
    greedy = i % 2 == 0
    kwargs = {"temperature": 0.0} if greedy else {"temperature": 0.8, "top_p": 0.95}
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Reply with one JSON object for a small inventory record."}],
        max_tokens=1000,
        seed=1000 + i,
        response_format={"type": "json_schema", "json_schema": {"name": f"record_{i}", "schema": schema, "strict": True}},
        extra_body={"draft": draft},
        **kwargs,
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--exact", type=int, default=12)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    schemas = [gen_object(rng, 2) for _ in range(args.count)]
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    failures = []
    cut = []
    started = time.time()

    def one(i):
        reply = ask(client, args.model, i, schemas[i], True)
        choice = reply.choices[0]
        text = choice.message.content or ""
        if i < args.exact:
            serial = ask(client, args.model, i, schemas[i], False)
            a = reply.model_extra["tensorfold"]
            b = serial.model_extra["tensorfold"]
            if a["token_sha"] != b["token_sha"] or serial.choices[0].message.content != text:
                return f"schema {i}: drafted {a['token_sha']} != serial {b['token_sha']}"
            if b["drafts"] is not False:
                return f"schema {i}: the serial reply drafted: {b}"
        if choice.finish_reason == "length":
            cut.append(f"schema {i}: cut at max_tokens after {len(text)} characters: {text[:60]!r}...")
            return None
        if choice.finish_reason != "stop":
            return f"schema {i}: finish_reason {choice.finish_reason!r}, reply {text!r}"
        try:
            value = json.loads(text)
            jsonschema.validate(value, schemas[i])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"schema {i}: {type(e).__name__}: {str(e).splitlines()[0]}\n  schema {json.dumps(schemas[i])}\n  reply {text!r}"
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        for i, err in enumerate(pool.map(one, range(args.count))):
            if err:
                failures.append(err)
                print("FAIL " + err, flush=True)
    for c in cut:
        print("CUT " + c, flush=True)
    print(f"{args.count} schemas ({len(cut)} cut at max_tokens), {args.exact} drafted == serial, "
          f"{time.time() - started:.1f} s", flush=True)
    if len(cut) > args.count // 20:
        failures.append(f"{len(cut)} replies cut at max_tokens, more than 5%")
    if failures:
        print(f"{len(failures)} failed (seed {seed})")
        sys.exit(1)
    print("ALL OK")


if __name__ == "__main__":
    main()
