//! Tokenizers on arbitrary bytes and chat templates with hostile messages.
//!
//! Tokenizers: the three GGUF vocabularies of the real models (Qwen2.5 and SmolLM2 byte-level BPE, Gemma 3
//! SentencePiece; `scripts/fetch-models.sh` fetches them) and the Hugging Face `tokenizer.json` of
//! `fixtures/tiny-qwen3`. Templates: Qwen2.5's and SmolLM2's from `fixtures/chat/templates`, Qwen3's from
//! `fixtures/tiny-qwen3`.

use crate::check_message;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use tf_text::{ChatRenderOptions, ChatTemplate, IncrementalDetokenizer, TextError, Tokenizer};

/// The tokenizers the target picks from (the first byte's low two bits).
pub const TOKENIZERS: [&str; 4] = ["qwen05", "smollm2", "gemma3", "tiny-qwen3"];

/// A tokenizer by [`TOKENIZERS`] name, loaded once.
pub fn tokenizer_named(name: &str) -> Arc<Tokenizer> {
    static CELLS: [OnceLock<Arc<Tokenizer>>; 4] = [const { OnceLock::new() }; 4];
    let i = TOKENIZERS.iter().position(|n| *n == name).unwrap_or_else(|| panic!("no tokenizer `{name}`"));
    CELLS[i]
        .get_or_init(|| {
            let tok = if name == "tiny-qwen3" {
                Tokenizer::from_hf_dir(&tf_testkit::repo_root().join("fixtures/tiny-qwen3")).map_err(|e| e.to_string())
            } else {
                let path = tf_testkit::model_path(name);
                let file = tf_loader::gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
                tf_cli::gguf_text::tokenizer_from_gguf(file.metadata())
            };
            Arc::new(tok.unwrap_or_else(|e| panic!("tokenizer {name}: {e}")))
        })
        .clone()
}

fn is_gguf(name: &str) -> bool {
    name != "tiny-qwen3"
}

fn check_text_error(what: &str, e: &TextError) {
    check_message(what, &e.to_string());
}

/// Decodes `ids` whole and through the incremental detokenizer (one id at a time, then `finish`): the pieces
/// add up to the whole decode.
fn check_decode(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let whole = tok.decode(ids, skip_special).unwrap_or_else(|e| panic!("decode of in-vocabulary ids: {e}"));
    let mut d = IncrementalDetokenizer::new(skip_special);
    let mut pieces = String::new();
    for &id in ids {
        pieces.push_str(&d.push(tok, id).unwrap_or_else(|e| panic!("detokenizer push: {e}")));
    }
    pieces.push_str(&d.finish(tok).unwrap_or_else(|e| panic!("detokenizer finish: {e}")));
    assert!(pieces == whole, "incremental detokenization {pieces:?} differs from decode {whole:?} of {ids:?}");
    whole
}

/// Whether `c` alone encodes and decodes to itself: false for characters with a byte the vocabulary has no token
/// for (SmolLM2's lacks 21 of the 256; its encoding drops them, as llama.cpp's does).
fn representable(tok: &Tokenizer, name: &str, c: char) -> bool {
    thread_local! {
        static SEEN: std::cell::RefCell<HashMap<(&'static str, char), bool>> = Default::default();
    }
    let key = (TOKENIZERS.iter().find(|n| **n == name).copied().unwrap_or(""), c);
    if let Some(b) = SEEN.with(|m| m.borrow().get(&key).copied()) {
        return b;
    }
    let s = c.to_string();
    let ok = tok.encode(&s, false, false).ok().and_then(|ids| tok.decode(&ids, false).ok()).is_some_and(|d| d == s);
    SEEN.with(|m| m.borrow_mut().insert(key, ok));
    ok
}

/// Bytes → tokenizer. The first byte picks the tokenizer (bits 0–1), `add_special` (bit 2), `parse_special`
/// (bit 3), `skip_special` (bit 4) and the mode (bit 5): the rest is text (lossy UTF-8) to encode, or ids to
/// decode (little-endian 24-bit, modulo the vocabulary size + 2, so some lie outside it).
pub fn tokenizer(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let name = TOKENIZERS[(flags & 3) as usize];
    let tok = tokenizer_named(name);
    let (add, parse, skip) = (flags & 4 != 0, flags & 8 != 0, flags & 16 != 0);
    let vocab = tok.vocab_size();
    if flags & 32 != 0 {
        let ids: Vec<u32> =
            rest.chunks(3).map(|c| c.iter().rev().fold(0u32, |a, &b| a << 8 | b as u32) % (vocab as u32 + 2)).collect();
        let outside = ids.iter().any(|&id| id as usize >= vocab);
        match tok.decode(&ids, skip) {
            Ok(_) if outside => panic!("decode accepted an id outside the vocabulary of {vocab}"),
            Ok(_) => {
                check_decode(&tok, &ids, skip);
                if is_gguf(name) {
                    let bytes = tok.decode_bytes(&ids, skip).expect("decode_bytes of in-vocabulary ids");
                    assert_eq!(String::from_utf8_lossy(&bytes), tok.decode(&ids, skip).unwrap());
                }
            }
            Err(e) => {
                assert!(outside, "decode refused in-vocabulary ids: {e}");
                check_text_error("decode error", &e);
            }
        }
        return;
    }
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add, parse).unwrap_or_else(|e| panic!("encode of valid UTF-8 failed: {e}"));
    assert!(ids.iter().all(|&id| (id as usize) < vocab), "an id outside the vocabulary of {vocab}");
    // BOS/EOS are added around the plain encoding, as the model's flags say.
    let plain = tok.encode(&text, false, parse).expect("encode");
    if add {
        let mut expect = Vec::new();
        expect.extend(tok.bos_id().filter(|_| tok.add_bos()));
        expect.extend_from_slice(&plain);
        expect.extend(tok.eos_id().filter(|_| tok.add_eos()));
        assert_eq!(ids, expect, "add_special adds exactly BOS/EOS");
    }
    let decoded = check_decode(&tok, &plain, skip);
    if is_gguf(name) && !skip {
        // llama.cpp's vocabularies round-trip every text whose characters each have tokens (parsed special-token
        // text decodes to itself); SentencePiece reads U+2581 as the space it stands for.
        let text = if name == "gemma3" { text.replace('\u{2581}', " ") } else { text.into_owned() };
        if !text.chars().all(|c| representable(&tok, name, c)) {
            return;
        }
        assert!(decoded == text, "decode(encode({text:?})) = {decoded:?}");
        let cont = tok.encode_continuation(&text).expect("encode_continuation");
        let back = tok.decode(&cont, false).expect("decode");
        assert!(back == text, "decode(encode_continuation({text:?})) = {back:?}");
    } else if !skip {
        // The HF tokenizer normalizes; what it decoded to encodes and decodes to itself.
        let again = tok.encode(&decoded, false, parse).expect("encode");
        assert_eq!(tok.decode(&again, false).expect("decode"), decoded, "normalized text is stable");
    }
}

/// The chat templates the target picks from (the first byte's low two bits, modulo 3).
pub const TEMPLATES: [&str; 3] = ["qwen05", "smollm2", "tiny-qwen3"];

/// A template by [`TEMPLATES`] name, compiled once.
pub fn template_named(name: &str) -> &'static ChatTemplate {
    static CELLS: [OnceLock<ChatTemplate>; 3] = [const { OnceLock::new() }; 3];
    let i = TEMPLATES.iter().position(|n| *n == name).unwrap_or_else(|| panic!("no template `{name}`"));
    CELLS[i].get_or_init(|| {
        let root = tf_testkit::repo_root();
        let source = if name == "tiny-qwen3" {
            let cfg = tf_testkit::fixture("tiny-qwen3/tokenizer_config.json");
            cfg["chat_template"].as_str().expect("chat_template").to_owned()
        } else {
            let p = root.join(format!("fixtures/chat/templates/{name}.jinja"));
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        ChatTemplate::new(&source).unwrap_or_else(|e| panic!("template {name}: {e}"))
    })
}

/// Roles the structured mode draws from: the real ones, then ones templates do not expect.
const ROLES: [&str; 8] = ["user", "assistant", "system", "tool", "developer", "", "<|im_start|>", "ipython"];

/// Messages built from bytes: parts split at 0x00; each part's first byte picks the role and the shape of
/// the message (string, null, a list of parts, tool calls, reasoning), the rest is its text.
fn structured_messages(rest: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    for part in rest.split(|&b| b == 0).take(64) {
        let Some((&sel, body)) = part.split_first() else { continue };
        let text = String::from_utf8_lossy(body).into_owned();
        let role = ROLES[(sel & 7) as usize];
        let mut m = Map::new();
        m.insert("role".into(), json!(role));
        let content = match (sel >> 3) & 7 {
            0..=2 => json!(text),
            3 => Value::Null,
            4 => json!([{"type": "text", "text": text}, {"type": "image_url"}]),
            5 => json!(42),
            6 => json!({"text": text}),
            _ => json!(""),
        };
        m.insert("content".into(), content);
        match sel >> 6 {
            1 => {
                m.insert(
                    "tool_calls".into(),
                    json!([{"id": "c1", "type": "function", "function": {"name": text, "arguments": {"a": text}}},
                           {"function": {"name": "f", "arguments": text}}]),
                );
            }
            2 => {
                m.insert("reasoning_content".into(), json!(text));
                m.insert("name".into(), json!(text));
            }
            3 => {
                m.insert("tool_call_id".into(), json!(text));
                m.insert("tool_calls".into(), json!(text));
            }
            _ => {}
        }
        out.push(Value::Object(m));
    }
    out
}

/// Bytes → a chat template render. The first byte picks the template (bits 0–1), `add_generation_prompt`
/// (bit 2), tools (bit 3), `enable_thinking` unset / false / true (bits 4–5) and the mode (bit 6): JSON (the
/// rest is a JSON value: the messages, or an object of `messages`, `tools` and further template variables) or
/// structured (see [`structured_messages`]).
pub fn chat_template(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let t = template_named(TEMPLATES[(flags & 3) as usize % 3]);
    let mut opts = ChatRenderOptions {
        add_generation_prompt: flags & 4 != 0,
        bos_token: Some("<|endoftext|>".into()),
        eos_token: Some("<|im_end|>".into()),
        enable_thinking: match (flags >> 4) & 3 {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        },
        ..Default::default()
    };
    if flags & 8 != 0 {
        opts.tools = Some(json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Weather\n\"quoted\" {{ '{%' }}", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]));
    }
    let json_mode = flags & 64 != 0;
    let messages = match serde_json::from_slice::<Value>(rest) {
        Ok(Value::Object(mut o)) if json_mode => {
            if let Some(tools) = o.remove("tools") {
                opts.tools = Some(tools);
            }
            let m = o.remove("messages").unwrap_or(Value::Null);
            opts.extra = o;
            m
        }
        Ok(v) if json_mode => v,
        _ => Value::Array(structured_messages(rest)),
    };
    match t.render(&messages, &opts) {
        Ok(text) => {
            // Every user message's text is rendered as it is.
            for m in messages.as_array().into_iter().flatten() {
                if let (Some("user"), Some(c)) = (m.get("role").and_then(Value::as_str), m.get("content")) {
                    if let Some(c) = c.as_str() {
                        assert!(text.contains(c), "the user text {c:?} is missing from {text:?}");
                    }
                }
            }
        }
        Err(e) => {
            assert!(matches!(e, TextError::Template(_) | TextError::TemplateRaised(_)), "{e:?}");
            check_text_error("template error", &e);
        }
    }
}
