//! Shared by the grammar tests: the real GGUF tokenizers, random walks over masks, and a validator for the
//! JSON-schema subset the tests use.

#![allow(dead_code)]

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;
use tf_core::{mask_allows, TokenConstraint};
use tf_loader::gguf::GgufFile;
use tf_text::{GgufVocab, Tokenizer};

/// The tokenizer of a real model (`tf_testkit::MODELS` short name), read from its GGUF metadata.
pub fn tokenizer(short: &str) -> Arc<Tokenizer> {
    let path = tf_testkit::model_path(short);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let md = file.metadata();
    let k = |name: &str| format!("tokenizer.ggml.{name}");
    let id = |name: &str| md.get_u64(&k(name)).map(|v| v as u32);
    let vocab = GgufVocab {
        model: md.get_str(&k("model")).expect("tokenizer.ggml.model").to_string(),
        pre: md.get_str(&k("pre")).map(str::to_string),
        tokens: md.get_str_array(&k("tokens")).expect("tokenizer.ggml.tokens").to_vec(),
        scores: md.get_f32_array(&k("scores")).map(<[f32]>::to_vec),
        token_type: md.get_i32_array(&k("token_type")).map(<[i32]>::to_vec),
        merges: md.get_str_array(&k("merges")).map(<[String]>::to_vec),
        bos: id("bos_token_id"),
        eos: id("eos_token_id"),
        eot: id("eot_token_id"),
        eom: id("eom_token_id"),
        unk: id("unknown_token_id"),
        pad: id("padding_token_id"),
        add_bos: md.get_bool(&k("add_bos_token")),
        add_eos: md.get_bool(&k("add_eos_token")),
        add_space_prefix: md.get_bool(&k("add_space_prefix")),
        ..GgufVocab::default()
    };
    Arc::new(Tokenizer::from_gguf_vocab(vocab).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The allowed ids of a mask, ascending.
pub fn allowed(mask: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, &bits) in mask.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let i = b.trailing_zeros();
            out.push(w as u32 * 32 + i);
            b &= b - 1;
        }
    }
    out
}

/// A fresh mask of `width` ids, filled by `c`.
pub fn mask_of(c: &mut dyn TokenConstraint, width: usize) -> Vec<u32> {
    let mut m = vec![u32::MAX; width.div_ceil(32)];
    c.fill_mask(&mut m).expect("fill_mask");
    m
}

/// The end of one random walk.
pub struct Walk {
    /// Consumed tokens, the final end-of-sequence id excluded.
    pub tokens: Vec<u32>,
    /// Whether it ended with an end-of-sequence id (else the grammar stopped on its own).
    pub eos: bool,
}

/// Walks `c` from its current state: each step draws a uniformly random allowed id (an end-of-sequence id when
/// drawn ends the walk) and consumes it; checks on every state that the end-of-sequence ids are allowed exactly
/// when the constraint is accepting, that no id at or past `vocab` and no other special id is allowed.
/// Panics after `max_steps`.
pub fn random_walk(
    c: &mut dyn TokenConstraint,
    tok: &Tokenizer,
    eos: &[u32],
    rng: &mut StdRng,
    max_steps: usize,
    what: &str,
) -> Walk {
    let vocab = tok.vocab_size();
    let width = vocab + 77;
    let mut tokens = Vec::new();
    for _ in 0..max_steps {
        let mask = mask_of(c, width);
        let ids = allowed(&mask);
        assert!(!ids.is_empty(), "{what}: empty mask after {} tokens", tokens.len());
        assert!(ids.iter().all(|&t| (t as usize) < vocab), "{what}: an id past the vocabulary is allowed");
        let accepting = c.is_accepting();
        for &e in eos {
            assert_eq!(mask_allows(&mask, e), accepting, "{what}: EOS {e} vs accepting={accepting}");
        }
        if let Some(&s) = ids.iter().find(|&&t| tok.token_kind(t).is_some_and(|k| k.is_special()) && !eos.contains(&t))
        {
            panic!("{what}: special id {s} ({:?}) allowed", tok.id_to_token(s));
        }
        if c.is_stopped() {
            assert!(ids.iter().all(|t| eos.contains(t)), "{what}: a stopped grammar allows more than EOS");
            return Walk { tokens, eos: false };
        }
        let t = ids[rng.gen_range(0..ids.len())];
        if eos.contains(&t) {
            c.consume(t).unwrap_or_else(|e| panic!("{what}: consume EOS {t}: {e}"));
            assert!(c.is_stopped(), "{what}: not stopped after EOS");
            return Walk { tokens, eos: true };
        }
        c.consume(t).unwrap_or_else(|e| panic!("{what}: consume allowed {t}: {e}"));
        tokens.push(t);
    }
    let text = String::from_utf8_lossy(&spell(tok, &tokens)).chars().take(300).collect::<String>();
    panic!("{what}: no end after {max_steps} tokens: {text:?}…");
}

/// The bytes the tokens stand for (special tokens as their text).
pub fn spell(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter().flat_map(|&t| tok.token_to_piece(t).to_vec()).collect()
}

/// Checks `v` against `schema` for the keywords the tests use: type, enum, const, properties, required,
/// additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, maximum.
pub fn validate(v: &Value, schema: &Value, at: &str) -> Result<(), String> {
    let fail = |m: String| Err(format!("{at}: {m} (value {v})"));
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(v) {
            return fail("not one of the enum".into());
        }
    }
    if let Some(c) = schema.get("const") {
        if c != v {
            return fail(format!("not the const {c}"));
        }
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            other => return fail(format!("validator does not know type {other}")),
        };
        if !ok {
            return fail(format!("not of type {t}"));
        }
    }
    if let Some(s) = v.as_str() {
        let n = s.chars().count() as u64;
        if schema.get("minLength").and_then(Value::as_u64).is_some_and(|m| n < m) {
            return fail("shorter than minLength".into());
        }
        if schema.get("maxLength").and_then(Value::as_u64).is_some_and(|m| n > m) {
            return fail("longer than maxLength".into());
        }
    }
    if let Some(x) = v.as_f64() {
        if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| x < m) {
            return fail("below minimum".into());
        }
        if schema.get("maximum").and_then(Value::as_f64).is_some_and(|m| x > m) {
            return fail("above maximum".into());
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as u64;
        if schema.get("minItems").and_then(Value::as_u64).is_some_and(|m| n < m) {
            return fail("fewer than minItems".into());
        }
        if schema.get("maxItems").and_then(Value::as_u64).is_some_and(|m| n > m) {
            return fail("more than maxItems".into());
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                validate(item, item_schema, &format!("{at}/{i}"))?;
            }
        }
    }
    if let Some(obj) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for r in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            let r = r.as_str().expect("required names");
            if !obj.contains_key(r) {
                return fail(format!("missing required '{r}'"));
            }
        }
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(val, s, &format!("{at}/{k}"))?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => return fail(format!("additional property '{k}'")),
                    Some(s @ Value::Object(_)) => validate(val, s, &format!("{at}/{k}"))?,
                    _ => {}
                },
            }
        }
    }
    Ok(())
}

/// The seed of test runs: `TF_GRAMMAR_SEED` when set, else a fixed one.
pub fn base_seed() -> u64 {
    std::env::var("TF_GRAMMAR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x7f4a_7c15_9e37_79b9)
}
