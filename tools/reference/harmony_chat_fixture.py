"""Writes fixtures/chat/gpt-oss.json: gpt-oss's chat template (fixtures/chat/templates/gpt-oss.jinja) rendered by
transformers' `render_jinja_template` for conversations with tools, tool calls, tool results and reasoning
(`thinking`), with `strftime_now` fixed to DATE so the output does not depend on the day.

Run: HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/harmony_chat_fixture.py
"""

import json
import pathlib

import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "fixtures/chat/templates/gpt-oss.jinja"
OUT = ROOT / "fixtures/chat/gpt-oss.json"
DATE = "2026-01-15"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches documents.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "limit": {"type": "number", "nullable": True},
                    "filters": {
                        "type": "object",
                        "properties": {"lang": {"type": "string"}, "exact": {"type": "boolean"}},
                        "required": ["lang"],
                    },
                },
                "required": ["query"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The time."}},
]

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}

CONVERSATIONS = [
    {"name": "user_only", "messages": [{"role": "user", "content": "Hi!"}], "add_generation_prompt": True},
    {
        "name": "system_tools_user",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}],
        "tools": TOOLS,
        "add_generation_prompt": True,
        "kwargs": {"reasoning_effort": "high"},
    },
    {
        "name": "call_with_reasoning_then_result",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "thinking": "The user wants the weather; call get_weather.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3, \"sky\": \"snow\"}"},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    {
        "name": "call_result_final_then_user",
        "messages": [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "thinking": "Dropped: a final answer follows.", "tool_calls": [CALL]},
            {"role": "tool", "content": "3 degrees"},
            {"role": "assistant", "content": "It is 3 °C in Oslo."},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    {
        "name": "final_with_thinking_last",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "thinking": "Simple sum.", "content": "4"},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "content_and_thinking_with_call_raises",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "thinking": "a", "content": "b", "tool_calls": [CALL]},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
]


def main():
    source = TEMPLATE.read_text(encoding="utf-8")
    compiled = ctu._compile_jinja_template(source)
    compiled.environment.globals["strftime_now"] = lambda fmt: DATE
    cases = []
    for conv in CONVERSATIONS:
        case = {"name": conv["name"], "messages": conv["messages"], "tools": conv.get("tools"),
                "add_generation_prompt": conv["add_generation_prompt"], "kwargs": conv.get("kwargs", {})}
        try:
            rendered, _ = ctu.render_jinja_template(
                conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=source,
                add_generation_prompt=conv["add_generation_prompt"], **conv.get("kwargs", {}))
            case["rendered"], case["error"] = rendered[0], None
        except Exception as e:  # the template's raise_exception
            case["rendered"], case["error"] = None, f"{type(e).__name__}: {e}"
        cases.append(case)
    out = {
        "template_file": "templates/gpt-oss.jinja",
        "template_source": "openai/gpt-oss-120b chat_template.jinja (as copied into llama.cpp "
                           "models/templates/openai-gpt-oss-120b.jinja), Apache-2.0",
        "reference": f"transformers {transformers.__version__} render_jinja_template",
        "strftime_now": DATE,
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
