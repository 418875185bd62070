//! Writes the seed corpus under `fuzz/seeds/<target>/` (small valid inputs of each surface; every file under
//! 4 KiB): `cargo run -p tf-fuzz --example make_seeds`. Seeds of found crashes (`crash-*`) are kept as they are.

use serde_json::{json, Value};
use std::path::Path;
use tf_core::DType;
use tf_loader::gguf::{GgufArray, GgufValue};
use tf_loader::gguf_writer::GgufWriter;

fn s(v: &str) -> GgufValue {
    GgufValue::String(v.into())
}

fn strs(v: &[&str]) -> GgufValue {
    GgufValue::Array(GgufArray::String(v.iter().map(|x| x.to_string()).collect()))
}

/// Byte-level BPE: the byte alphabet as GPT-2 maps it (printable ASCII as itself), a few merges, specials.
fn bpe_tokens() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
    tokens.extend(
        ["Ġ", "Ċ", "he", "ll", "hell", "hello", "Ġw", "<|im_start|>", "<|im_end|>", "<|endoftext|>"].map(String::from),
    );
    (tokens, ["h e", "l l", "he ll", "hell o", "Ġ w"].map(String::from).to_vec())
}

fn gguf_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let (tokens, merges) = bpe_tokens();
    let n = tokens.len();
    let mut types = vec![1i32; n];
    types[n - 3..].fill(3);
    let llama = GgufWriter::new()
        .kv("general.architecture", s("llama"))
        .kv("llama.block_count", GgufValue::U32(2))
        .kv("llama.context_length", GgufValue::U32(64))
        .kv("llama.embedding_length", GgufValue::U32(8))
        .kv("llama.feed_forward_length", GgufValue::U32(16))
        .kv("llama.attention.head_count", GgufValue::U32(2))
        .kv("llama.attention.head_count_kv", GgufValue::U32(1))
        .kv("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5))
        .kv("llama.rope.freq_base", GgufValue::F32(10000.0))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("qwen2"))
        .kv("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(tokens)))
        .kv("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(types)))
        .kv("tokenizer.ggml.merges", GgufValue::Array(GgufArray::String(merges)))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(n as u32 - 2))
        .kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(false))
        .tensor_f32("token_embd.weight", &[8, 2], &[0.5; 16])
        .tensor("blk.0.attn_q.weight", DType::Q8_0, &[32, 1], vec![1; 34])
        .to_bytes();
    let spm_tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "▁h", "e", "l", "o", "▁hello"];
    let gemma = GgufWriter::new()
        .alignment(64)
        .kv("general.architecture", s("gemma3"))
        .kv("gemma3.block_count", GgufValue::U32(7))
        .kv("gemma3.embedding_length", GgufValue::U32(16))
        .kv("gemma3.feed_forward_length", GgufValue::U32(32))
        .kv("gemma3.attention.head_count", GgufValue::U32(4))
        .kv("gemma3.attention.key_length", GgufValue::U32(4))
        .kv("gemma3.attention.sliding_window", GgufValue::U32(8))
        .kv("tokenizer.ggml.model", s("llama"))
        .kv("tokenizer.ggml.tokens", strs(&spm_tokens))
        .kv("tokenizer.ggml.scores", GgufValue::Array(GgufArray::F32((0..12).map(|i| -(i as f32)).collect())))
        .kv("tokenizer.ggml.token_type", GgufValue::Array(GgufArray::I32(vec![2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1])))
        .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
        .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
        .kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(true))
        .kv("nested", GgufValue::Array(GgufArray::Array(vec![GgufArray::U64(vec![1, 2]), GgufArray::Bool(vec![true])])))
        .tensor("blk.0.ffn_down.weight", DType::F16, &[4, 2], vec![0; 16])
        .tensor("blk.0.ffn_up.weight", DType::Q4K, &[256], vec![3; 144])
        .to_bytes();
    let bare = GgufWriter::new().kv("general.architecture", s("qwen3")).kv("f", GgufValue::F64(1.0)).to_bytes();
    vec![("llama-bpe.gguf", llama), ("gemma3-spm.gguf", gemma), ("bare.gguf", bare)]
}

fn safetensors_file(header: &Value, data_len: usize) -> Vec<u8> {
    let mut h = header.to_string().into_bytes();
    while !(8 + h.len()).is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend((0..data_len).map(|i| i as u8));
    out
}

fn safetensors_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let two = json!({
        "__metadata__": {"format": "pt"},
        "embed": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "norm": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
    });
    let kinds = json!({
        "a": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [0, 5], "data_offsets": [8, 8]},
        "c": {"dtype": "F16", "shape": [2, 2, 1], "data_offsets": [8, 16]},
        "d": {"dtype": "BOOL", "shape": [3], "data_offsets": [16, 19]},
    });
    vec![
        ("two.safetensors", safetensors_file(&two, 32)),
        ("kinds.safetensors", safetensors_file(&kinds, 19)),
        ("empty.safetensors", safetensors_file(&json!({}), 0)),
    ]
}

fn flagged(flags: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![flags];
    v.extend_from_slice(rest);
    v
}

fn tokenizer_seeds() -> Vec<(String, Vec<u8>)> {
    let texts = [
        "Hello, world!",
        "  two  spaces\tand\ttabs\n\n\n",
        "<|im_start|>user\nhi<|im_end|>",
        "<start_of_turn>user\nCafé ▁ 🦀<end_of_turn><bos>",
        "fn main() { println!(\"{}\", 3.14159); } // 1,000,000",
        "日本語 한국어 العربية ‍👨‍👩‍👧",
        "e\u{301} \u{feff}\u{200b}\u{1}",
    ];
    let mut out = Vec::new();
    for tok in 0..4u8 {
        for (i, t) in texts.iter().enumerate() {
            // Vary add_special / parse_special / skip_special over the texts.
            let flags = tok | ((i as u8 % 8) << 2);
            out.push((format!("text-{tok}-{i}"), flagged(flags & !32, t.as_bytes())));
        }
        let ids: Vec<u8> = (0..24u32).flat_map(|i| (i * 977 + 3).to_le_bytes()[..3].to_vec()).collect();
        out.push((format!("ids-{tok}"), flagged(tok | 32, &ids)));
    }
    out
}

fn template_seeds() -> Vec<(String, Vec<u8>)> {
    let path = tf_testkit::repo_root().join("fixtures/chat/conversations.json");
    let convs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&path).expect("conversations")).unwrap();
    let mut out = Vec::new();
    for (i, c) in convs.iter().enumerate() {
        let mut o = json!({"messages": c["messages"]});
        if !c["tools"].is_null() {
            o["tools"] = c["tools"].clone();
        }
        let bytes = o.to_string().into_bytes();
        if bytes.len() < 2000 {
            let flags = 64 | (i as u8 % 3) | (u8::from(c["add_generation_prompt"] == true) << 2) | ((i as u8 % 3) << 4);
            out.push((format!("json-{i:02}"), flagged(flags, &bytes)));
        }
    }
    // Structured mode: parts split at NUL, first byte role (bits 0-2), shape (3-5), extras (6-7).
    let parts: &[&[u8]] = &[b"\x02be brief", b"\x00Hello <|im_end|>", b"\x41\x00", b"\x03{\"t\": 1}", b"\x80thinking"];
    out.push(("structured-0".into(), flagged(4, &parts.join(&0u8))));
    out.push(("structured-1".into(), flagged(1 | 8 | 16, &parts.join(&0u8))));
    out.push(("structured-2".into(), flagged(2 | 4 | 32, b"\x00hi\x00\x21?\x00\x05who")));
    out
}

fn route_seeds() -> Vec<(&'static str, &'static str, Value)> {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"enum": ["a", "b"]}},
        "required": ["n"], "additionalProperties": false});
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    vec![
        ("chat", "plain", json!({"model": "fuzz", "messages": msgs, "max_tokens": 8, "temperature": 0})),
        (
            "chat",
            "sampling",
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
            "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": -1, "stop": ["\n", "END"],
            "logit_bias": {"5": -100, "7": 2.5}, "logprobs": true, "top_logprobs": 3, "n": 1, "stream": true,
            "stream_options": {"include_usage": true}, "priority": "background", "draft": false,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "return_token_ids": true}),
        ),
        (
            "chat",
            "tools",
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": tools, "tool_choice": "required",
            "parallel_tool_calls": false, "max_completion_tokens": 32}),
        ),
        (
            "chat",
            "schema",
            json!({"messages": msgs, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}, "reasoning_effort": "low",
            "chat_template_kwargs": {"enable_thinking": false}}),
        ),
        (
            "chat",
            "guided",
            json!({"messages": msgs, "guided_choice": ["yes", "no"], "user": "u1",
            "guided_json": null, "max_tokens": 4}),
        ),
        (
            "chat",
            "thinking",
            json!({"messages": msgs, "thinking_budget": 16, "max_tokens": 64,
            "response_format": {"type": "json_object"}}),
        ),
        ("completions", "string", json!({"prompt": "Once upon a time", "max_tokens": 16, "stop": "\n"})),
        ("completions", "ids", json!({"prompt": [[1, 2, 3]], "echo": true, "logprobs": 2, "max_tokens": 0})),
        (
            "completions",
            "regex",
            json!({"prompt": ["x"], "guided_regex": "[a-z]+( [0-9]{1,3})?", "best_of": 1,
            "seed": 3, "stream": true, "stream_options": {"include_usage": false}}),
        ),
        (
            "completions",
            "lark",
            json!({"prompt": "Answer:", "guided_grammar": "start: \"yes\" | \"no\" | NUM\nNUM: /[0-9]+/",
            "max_tokens": 4}),
        ),
        (
            "responses",
            "text",
            json!({"model": "fuzz", "input": "Hello", "instructions": "Be brief.",
            "max_output_tokens": 16, "store": false}),
        ),
        (
            "responses",
            "items",
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "reasoning": {"effort": "high"}}),
        ),
        (
            "responses",
            "previous",
            json!({"previous_response_id": "resp_fuzz", "input": "And then?",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}, "metadata": {"k": "v"}}),
        ),
        (
            "messages",
            "plain",
            json!({"model": "fuzz", "max_tokens": 16, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hi"}], "stop_sequences": ["\n\n"], "temperature": 0.5}),
        ),
        (
            "messages",
            "tools",
            json!({"max_tokens": 64, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "s"},
             {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "hot"}]}],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 32}, "metadata": {"user_id": "u"}}),
        ),
        (
            "messages",
            "prefill",
            json!({"max_tokens": 8, "stream": true, "messages": [
            {"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}],
            "system": [{"type": "text", "text": "sys"}], "thinking": {"type": "disabled"}}),
        ),
        (
            "count_tokens",
            "plain",
            json!({"model": "fuzz", "messages": [{"role": "user", "content": "Hi"}],
            "system": "Be brief."}),
        ),
        (
            "count_tokens",
            "tools",
            json!({"messages": [{"role": "user", "content": "Weather?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}}),
        ),
        (
            "tokenize",
            "prompt",
            json!({"prompt": "Hello <|im_start|> world", "add_special_tokens": false,
            "return_token_strs": true}),
        ),
        ("tokenize", "messages", json!({"model": "fuzz", "messages": msgs, "tools": tools})),
        ("detokenize", "ids", json!({"tokens": [1, 2, 3, 300]})),
        ("detokenize", "empty", json!({"model": "tiny-qwen3", "tokens": []})),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    assert!(bytes.len() <= 4096, "{name}: {} bytes", bytes.len());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let seeds = tf_fuzz::fuzz_dir().join("seeds");
    // Generated seeds are rewritten; crash reproductions (crash-*) stay.
    for t in tf_fuzz::TARGETS {
        if let Ok(rd) = std::fs::read_dir(seeds.join(t.name)) {
            for e in rd.flatten() {
                if !e.file_name().to_string_lossy().starts_with("crash-") {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }
    }
    for (name, b) in gguf_seeds() {
        write(&seeds.join("gguf"), name, &b);
    }
    for (name, b) in safetensors_seeds() {
        write(&seeds.join("safetensors"), name, &b);
    }
    for (name, b) in tokenizer_seeds() {
        write(&seeds.join("tokenizer"), &name, &b);
    }
    for (name, b) in template_seeds() {
        write(&seeds.join("chat_template"), &name, &b);
    }
    for (target, name, body) in route_seeds() {
        write(&seeds.join(target), &format!("{name}.json"), body.to_string().as_bytes());
    }
    println!("seeds written under {}", seeds.display());
}
