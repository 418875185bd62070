"""Write fixtures/tiny-qwen3/: a tiny random Qwen3 checkpoint with a small tokenizer and Qwen3's thinking chat
template, plus transformers' fp32 logits and chat renderings to check TensorFold against.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python tools/reference/make_tiny_qwen3.py      (~10 s; needs torch,
      transformers, tokenizers, safetensors, numpy from requirements.txt)

What it writes (a Hugging Face model directory, loadable by `from_pretrained` and by `tensorfold`):
  config.json, model.safetensors, generation_config.json   Qwen3ForCausalLM, fp32, random weights (torch seed
                  1234): hidden 64, 2 layers, 4 heads / 2 KV heads, head_dim 16, intermediate 128, q/k norms,
                  tied embeddings (as Qwen3-0.6B), vocab_size padded past the tokenizer (as Qwen3 pads its head).
                  Norm weights are re-randomised (1 + 0.3 N(0,1)) so a wrong norm shows in the logits.
  tokenizer.json  byte-level BPE trained here on fixtures/quality/text.txt plus a few chat sentences, Qwen2's
                  pre-tokenizer regex, NFC; added tokens <|endoftext|> <|im_start|> <|im_end|> (special) and
                  <tool_call> </tool_call> <think> </think> (not special), in Qwen3's order.
  tokenizer_config.json   Qwen3's fields (Qwen2Tokenizer class, eos <|im_end|>, pad <|endoftext|>, no BOS) and
                  `chat_template`: Qwen3's template (enable_thinking, reasoning_content, tools, tool responses).
  reference.json  per prompt: the ids transformers' tokenizer gives, fp32 logits (hex of the f32 bit patterns, as
                  fixtures/tiny/*/reference.json) at every position of the first prompt and the last 8 positions
                  of the others, argmax and top-1 margin at every position, 8 greedy ids.
  chat.json       conversations rendered by transformers' apply_chat_template (enable_thinking true / false /
                  undefined, reasoning_content, <think> inside content, tool calls and responses), with their ids.
Deterministic: a second run gives byte-identical files.
"""

import json
import os
import time
from importlib.metadata import version

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from common import FIXTURES_DIR  # noqa: E402

torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "1")))

OUT = FIXTURES_DIR / "tiny-qwen3"
SEED = 1234
BPE_VOCAB = 400  # 256 byte tokens + merges + the 3 special tokens given to the trainer
N_GREEDY = 8
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                     r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

CHAT_SENTENCES = [
    "You are a helpful assistant.", "What is the capital of France?", "The capital of France is Paris.",
    "Let me think about this step by step.", "Okay, the user asks about the weather.",
    "Call the get_weather function with the city name.", '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "What is 2 + 2? The answer is 4.", "Hello! How can I help you today?",
]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

CONVERSATIONS = [
    dict(name="user_thinking_on", messages=[{"role": "user", "content": "What is 2 + 2?"}], enable_thinking=True),
    dict(name="user_thinking_off", messages=[{"role": "user", "content": "What is 2 + 2?"}], enable_thinking=False),
    dict(name="user_thinking_default", messages=[{"role": "user", "content": "What is 2 + 2?"}]),
    dict(name="system_multi_turn_reasoning_content", enable_thinking=True, messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris.",
         "reasoning_content": "\nThe user asks about France.\n"},
        {"role": "user", "content": "And of Italy?"}]),
    dict(name="think_inside_content_last_turn", add_generation_prompt=False, messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello! How can I help you today?"}]),
    dict(name="think_inside_content_earlier_turn", enable_thinking=False, messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "Thanks"}]),
    dict(name="tools_call_and_response", enable_thinking=True, tools=[WEATHER_TOOL], messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"}]),
]

# Prompts for reference logits: rendered conversations (thinking on / off) and one with a reply inside <think>.
LOGIT_PROMPTS = ["user_thinking_on", "user_thinking_off", "system_multi_turn_reasoning_content"]
EXTRA_REPLY = "<think>\nThe user asks 2 + 2.\n</think>\n\nThe answer is 4.<|im_end|>"


def f32_hex(row):
    a = np.ascontiguousarray(row, dtype=np.float32).view(np.uint32)
    return "".join(f"{int(x):08x}" for x in a)


def dump(path, obj):
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n")


def train_tokenizer():
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    text = (FIXTURES_DIR / "quality" / "text.txt").read_text()
    tok.train_from_iterator([text] + CHAT_SENTENCES * 4, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return tok


def main():
    t0 = time.time()
    OUT.mkdir(parents=True, exist_ok=True)
    for f in OUT.iterdir():
        f.unlink()

    tok = train_tokenizer()
    tok.save(str(OUT / "tokenizer.json"))
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    ids_of = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}
    vocab_size = (n_tok + 31) // 32 * 32 + 32  # padded head rows past the tokenizer, as Qwen3 has

    added_decoder = {str(ids_of[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": t in SPECIAL} for t in SPECIAL + ADDED}
    dump(OUT / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added_decoder,
        "additional_special_tokens": SPECIAL[1:], "bos_token": None, "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 256, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    })

    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        attention_bias=False, initializer_range=0.2, bos_token_id=ids_of["<|endoftext|>"],
        eos_token_id=ids_of["<|im_end|>"], pad_token_id=ids_of["<|endoftext|>"],
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float32))
    model.save_pretrained(OUT)
    dump(OUT / "generation_config.json", {
        "bos_token_id": ids_of["<|endoftext|>"], "do_sample": True,
        "eos_token_id": [ids_of["<|im_end|>"], ids_of["<|endoftext|>"]], "pad_token_id": ids_of["<|endoftext|>"],
        "temperature": 0.6, "top_k": 20, "top_p": 0.95,
    })

    hf_tok = AutoTokenizer.from_pretrained(OUT)
    m = Qwen3ForCausalLM.from_pretrained(OUT, attn_implementation="eager", dtype=torch.float32).eval()
    assert m.config.tie_word_embeddings
    n_params = sum(p.numel() for p in m.parameters())

    cases = []
    for conv in CONVERSATIONS:
        kwargs = {}
        if "enable_thinking" in conv:
            kwargs["enable_thinking"] = conv["enable_thinking"]
        rendered = hf_tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                              add_generation_prompt=conv.get("add_generation_prompt", True), **kwargs)
        ids = hf_tok.encode(rendered, add_special_tokens=False)
        assert ids == tok.encode(rendered, add_special_tokens=False).ids, conv["name"]
        assert hf_tok.decode(ids) == rendered, conv["name"]
        cases.append(dict(conv, add_generation_prompt=conv.get("add_generation_prompt", True), rendered=rendered,
                          ids=ids))
    dump(OUT / "chat.json", {
        "transformers": version("transformers"), "tokenizers": version("tokenizers"),
        "method": "AutoTokenizer.from_pretrained(dir).apply_chat_template(messages, tools=tools, tokenize=False, "
                  "add_generation_prompt=..., [enable_thinking=...]); ids = encode(rendered, add_special_tokens=False)",
        "cases": cases,
    })

    by_name = {c["name"]: c for c in cases}
    prompts = [(n, by_name[n]["rendered"]) for n in LOGIT_PROMPTS]
    prompts.append(("thinking_reply", by_name["user_thinking_on"]["rendered"] + EXTRA_REPLY))
    refs = []
    with torch.no_grad():
        for name, text in prompts:
            ids = hf_tok.encode(text, add_special_tokens=False)
            logits = m(torch.tensor([ids])).logits[0].float().numpy()
            seq = list(ids)
            for _ in range(N_GREEDY):
                seq.append(int(torch.argmax(m(torch.tensor([seq])).logits[0, -1])))
            srt = np.sort(logits, axis=-1)
            positions = list(range(len(ids))) if name == LOGIT_PROMPTS[0] else list(range(len(ids) - 8, len(ids)))
            refs.append({
                "name": name, "text": text, "input_ids": ids,
                "argmax": [int(x) for x in logits.argmax(-1)],
                "top1_margin": [round(float(a - b), 6) for a, b in zip(srt[:, -1], srt[:, -2])],
                "greedy": seq[len(ids):],
                "positions": positions,
                "logits_f32_hex": [f32_hex(logits[i]) for i in positions],
            })
    dump(OUT / "reference.json", {
        "model_class": "Qwen3ForCausalLM", "seed": SEED, "n_params": n_params, "tokenizer_size": n_tok,
        "vocab_size": vocab_size, "token_ids": ids_of, "transformers": version("transformers"),
        "torch": version("torch"), "attn_implementation": "eager",
        "logits": "model(input_ids).logits[0] in fp32 at `positions` (every position of the first prompt, the last 8 "
                  "of the others); one string per position, hex of the f32 bit patterns",
        "greedy": "argmax of a full forward over the growing sequence, 8 steps, no EOS stop",
        "prompts": refs,
    })
    size = sum(f.stat().st_size for f in OUT.iterdir())
    print(f"tiny-qwen3: {n_params} params, tokenizer {n_tok} tokens, head {vocab_size}, {size} bytes, "
          f"{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
