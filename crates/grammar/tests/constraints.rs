//! tf-grammar on the real tokenizers (SmolLM2's 49k and Qwen2.5's 152k BPE vocabularies, Gemma 3's
//! SentencePiece): random walks over the masks produce text valid under the grammar; rollback, rejected tokens,
//! forced tokens, compile errors and masks wider than the vocabulary. A missing model file fails the test (run
//! `scripts/fetch-models.sh all`).
//! Walks are seeded: the seed is in every failure message, and `TF_GRAMMAR_SEED` replaces the base seed.

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use support::{allowed, base_seed, mask_of, random_walk, spell, tokenizer, validate};
use tf_core::{mask_allows, ConstraintSpec, TokenConstraint};
use tf_grammar::{compile, Grammar, GrammarEnv};
use tf_text::Tokenizer;

struct Model {
    tok: Arc<Tokenizer>,
    env: GrammarEnv,
}

fn model(short: &'static str) -> &'static Model {
    static SMOL: OnceLock<Model> = OnceLock::new();
    static QWEN: OnceLock<Model> = OnceLock::new();
    let cell = match short {
        "smollm2" => &SMOL,
        "qwen05" => &QWEN,
        other => panic!("no test model {other}"),
    };
    cell.get_or_init(|| {
        let tok = tokenizer(short);
        let t0 = Instant::now();
        let env = GrammarEnv::new(tok.clone(), tok.stop_ids()).expect("grammar env");
        eprintln!(
            "{short}: GrammarEnv over {} ids built in {:.0} ms (forces tokens: {})",
            tok.vocab_size(),
            t0.elapsed().as_secs_f64() * 1e3,
            env.forces_tokens()
        );
        Model { tok, env }
    })
}

const MODELS: [&str; 2] = ["smollm2", "qwen05"];

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b c", "d\"e"]}, "maxItems": 3},
            "kind": {"enum": ["x", "y", 3, null]},
            "inner": {
                "type": "object",
                "properties": {"v": {"type": "null"}, "w": {"const": "k"}},
                "required": ["v"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": false
    })
}

fn start(spec: &Arc<dyn ConstraintSpec>) -> Box<dyn TokenConstraint> {
    spec.start().expect("start")
}

/// A fresh matcher fed `prefix`: the serial reference of a state.
fn replayed(spec: &Arc<dyn ConstraintSpec>, prefix: &[u32]) -> Box<dyn TokenConstraint> {
    let mut c = start(spec);
    for &t in prefix {
        c.consume(t).expect("replay");
    }
    c
}

fn text_of(tok: &Tokenizer, ids: &[u32]) -> String {
    String::from_utf8(spell(tok, ids)).unwrap_or_else(|e| panic!("not UTF-8: {e}"))
}

#[test]
fn random_walks_satisfy_the_schema() {
    let schema = person_schema();
    for short in MODELS {
        let m = model(short);
        let spec = compile(&m.env, &Grammar::JsonSchema { schema: schema.clone(), strict: true }).unwrap();
        for i in 0..12u64 {
            let seed = base_seed() ^ (i * 0x9E37_79B9) ^ short.len() as u64;
            let what = format!("{short} seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed);
            let mut c = start(&spec);
            let walk = random_walk(c.as_mut(), &m.tok, m.env.eos_ids(), &mut rng, 3000, &what);
            let text = text_of(&m.tok, &walk.tokens);
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
            validate(&v, &schema, "").unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
            if i < 2 {
                eprintln!("{what}: {} tokens: {text}", walk.tokens.len());
            }
        }
    }
}

/// `json_object`: real texts tokenized by the model's tokenizer are accepted token by token exactly when they are
/// JSON objects laid out as `JSON_LAYOUT` says (a random walk would not end: object keys and strings are unbounded).
#[test]
fn json_object_accepts_objects_only() {
    let objects = [
        "{}",
        "{\"a\": 1, \"b\": [true, null, -2.5e3], \"c\": {\"d\": \"x\\\"y\\u00e9\"}}",
        "{\"key\": \"value with spaces\", \"n\": 0}",
        "{\"emoji\": \"😀 ü 中文\"}",
    ];
    // JSON_LAYOUT: `", "` and `": "` only, so indented or tight objects are outside the grammar too.
    let not_objects = [
        "[1, 2]",
        "\"text\"",
        "42",
        "{\"a\" 1}",
        "{\"a\": 1,}",
        "{'a': 1}",
        "{\"a\": tru}",
        "{\n  \"key\": \"value\"\n}",
        "{\"a\":1}",
    ];
    for short in MODELS {
        let m = model(short);
        let spec = compile(&m.env, &Grammar::JsonObject).unwrap();
        let feed = |text: &str| -> (bool, usize) {
            let ids = m.tok.encode_continuation(text).unwrap();
            assert_eq!(spell(&m.tok, &ids), text.as_bytes(), "{short}: {text:?} round trip");
            let mut c = start(&spec);
            for (i, &t) in ids.iter().enumerate() {
                if c.consume(t).is_err() {
                    return (false, i);
                }
            }
            (c.is_accepting(), ids.len())
        };
        for text in objects {
            let (ok, at) = feed(text);
            assert!(ok, "{short}: {text:?} rejected at token {at}");
        }
        for text in not_objects {
            let (ok, _) = feed(text);
            assert!(!ok, "{short}: {text:?} accepted as a JSON object");
        }
    }
}

/// A tool-call grammar: Lark with an embedded `%json` schema between literal tags.
#[test]
fn random_walks_lark_tool_call() {
    let args = json!({
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city"],
            "additionalProperties": false
        }},
        "required": ["name", "arguments"],
        "additionalProperties": false
    });
    let lark = format!("start: \"<tool_call>\\n\" %json{} \"\\n</tool_call>\"", args);
    for short in MODELS {
        let m = model(short);
        let tool = compile(&m.env, &Grammar::Lark(lark.clone())).unwrap();
        for i in 0..8u64 {
            let seed = base_seed().wrapping_add(1000 + i);
            let mut rng = StdRng::seed_from_u64(seed);
            let what = format!("{short} tool call seed {seed}");
            let mut c = start(&tool);
            let walk = random_walk(c.as_mut(), &m.tok, m.env.eos_ids(), &mut rng, 3000, &what);
            let text = text_of(&m.tok, &walk.tokens);
            let body = text
                .strip_prefix("<tool_call>\n")
                .and_then(|t| t.strip_suffix("\n</tool_call>"))
                .unwrap_or_else(|| panic!("{what}: not wrapped: {text:?}"));
            let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
            validate(&v, &args, "").unwrap_or_else(|e| panic!("{what}: {e}: {text:?}"));
        }
    }
}

#[test]
fn random_walks_regex_and_choice() {
    let rx = r"(ab|c[0-9]{1,3})+-[xyz]{2}";
    let re_check = |s: &str| -> bool {
        // The language of `rx`, checked by hand: groups of "ab" or "c" + 1..3 digits, then '-' and 2 of xyz.
        let Some((head, tail)) = s.rsplit_once('-') else { return false };
        if tail.len() != 2 || !tail.chars().all(|c| "xyz".contains(c)) || head.is_empty() {
            return false;
        }
        let b = head.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i..].starts_with(b"ab") {
                i += 2;
            } else if b[i] == b'c' {
                let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                if !(1..=3).contains(&n) {
                    return false;
                }
                i += 1 + n;
            } else {
                return false;
            }
        }
        true
    };
    let options: Vec<String> = ["yes", "no", "no way", "\"quoted\" \\ and\nnewline"].map(String::from).to_vec();
    for short in MODELS {
        let m = model(short);
        let spec = compile(&m.env, &Grammar::Regex(rx.into())).unwrap();
        let choice = compile(&m.env, &Grammar::Choice(options.clone())).unwrap();
        for i in 0..10u64 {
            let seed = base_seed().wrapping_add(2000 + i);
            let mut rng = StdRng::seed_from_u64(seed);
            let what = format!("{short} regex seed {seed}");
            let mut c = start(&spec);
            let walk = random_walk(c.as_mut(), &m.tok, m.env.eos_ids(), &mut rng, 500, &what);
            let text = text_of(&m.tok, &walk.tokens);
            assert!(re_check(&text), "{what}: {text:?} does not match {rx}");

            let what = format!("{short} choice seed {seed}");
            let mut c = start(&choice);
            let walk = random_walk(c.as_mut(), &m.tok, m.env.eos_ids(), &mut rng, 100, &what);
            let text = text_of(&m.tok, &walk.tokens);
            assert!(options.contains(&text), "{what}: {text:?} is not a choice");
        }
    }
}

/// Rollback is exact: after consuming k tokens and rolling back k, the mask is bitwise the one before; and the
/// state really is the earlier one: a different continuation then gives the masks, acceptance and forced
/// tokens of a fresh matcher fed the same path (the serial reference).
#[test]
fn rollback_restores_the_state() {
    let schema = person_schema();
    for short in MODELS {
        let m = model(short);
        let width = m.tok.vocab_size();
        let spec = compile(&m.env, &Grammar::JsonSchema { schema: schema.clone(), strict: true }).unwrap();
        for i in 0..4u64 {
            let seed = base_seed().wrapping_add(3000 + i);
            let what = format!("{short} seed {seed}");
            let mut rng = StdRng::seed_from_u64(seed);
            let mut c = start(&spec);
            let mut path: Vec<u32> = Vec::new();
            while !c.is_stopped() && path.len() < 120 {
                let before = mask_of(c.as_mut(), width);
                let k = rng.gen_range(1..=24);
                let mut went = 0;
                for _ in 0..k {
                    let ids: Vec<u32> = allowed(&mask_of(c.as_mut(), width))
                        .into_iter()
                        .filter(|t| !m.env.eos_ids().contains(t))
                        .collect();
                    if ids.is_empty() || c.is_stopped() {
                        break;
                    }
                    c.consume(ids[rng.gen_range(0..ids.len())]).unwrap();
                    went += 1;
                }
                c.rollback(went).unwrap();
                assert_eq!(mask_of(c.as_mut(), width), before, "{what}: mask after consume {went} / rollback {went}");
                assert!(c.rollback(path.len() + 1).is_err(), "{what}: rollback past the start");

                // One step onward, checked against the serial reference.
                let ids: Vec<u32> = allowed(&before).into_iter().filter(|t| !m.env.eos_ids().contains(t)).collect();
                if ids.is_empty() {
                    break;
                }
                let t = ids[rng.gen_range(0..ids.len())];
                c.consume(t).unwrap();
                path.push(t);
                let mut r = replayed(&spec, &path);
                assert_eq!(mask_of(c.as_mut(), width), mask_of(r.as_mut(), width), "{what}: mask after {path:?}");
                assert_eq!(c.is_accepting(), r.is_accepting(), "{what}: accepting after {path:?}");
                assert_eq!(c.is_stopped(), r.is_stopped(), "{what}: stopped after {path:?}");
                assert_eq!(c.forced(), r.forced(), "{what}: forced after {path:?}");
            }
            // Back to the start in one step.
            let n = path.len();
            c.rollback(n).unwrap();
            let mut fresh = start(&spec);
            assert_eq!(mask_of(c.as_mut(), width), mask_of(fresh.as_mut(), width), "{what}: rollback({n}) to start");
        }
    }
}

/// Rollback over an end-of-sequence id and over the grammar's own stop.
#[test]
fn rollback_over_eos_and_stop() {
    let m = model("qwen05");
    let width = m.tok.vocab_size();
    let spec = compile(&m.env, &Grammar::Choice(vec!["yes".into(), "yes sir".into()])).unwrap();
    let mut c = start(&spec);
    let yes = m.tok.encode_continuation("yes").unwrap();
    for &t in &yes {
        c.consume(t).unwrap();
    }
    assert!(c.is_accepting() && !c.is_stopped());
    let at_yes = mask_of(c.as_mut(), width);
    let eos = m.env.eos_ids()[0];
    assert!(mask_allows(&at_yes, eos));
    c.consume(eos).unwrap();
    assert!(c.is_stopped());
    c.rollback(1).unwrap();
    assert!(!c.is_stopped());
    let sir = m.tok.encode_continuation(" sir").unwrap();
    for &t in &sir {
        c.consume(t).unwrap();
    }
    assert!(c.is_stopped() && c.is_accepting(), "the only choice is complete");
    let end = mask_of(c.as_mut(), width);
    assert_eq!(allowed(&end), m.env.eos_ids(), "a stopped grammar allows the EOS ids only");
    c.consume(eos).unwrap();
    c.rollback(1 + sir.len()).unwrap();
    assert_eq!(mask_of(c.as_mut(), width), at_yes);
}

#[test]
fn rejected_token_leaves_the_state() {
    let schema = person_schema();
    for short in MODELS {
        let m = model(short);
        let width = m.tok.vocab_size() + 40;
        let spec = compile(&m.env, &Grammar::JsonSchema { schema: schema.clone(), strict: true }).unwrap();
        let seed = base_seed().wrapping_add(4000);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = start(&spec);
        let mut path = Vec::new();
        for step in 0..40 {
            let before = mask_of(c.as_mut(), width);
            let ids = allowed(&before);
            let disallowed: Vec<u32> = (0..m.tok.vocab_size() as u32).filter(|&t| !mask_allows(&before, t)).collect();
            let bad = disallowed[rng.gen_range(0..disallowed.len())];
            assert!(c.consume(bad).is_err(), "{short} seed {seed} step {step}: disallowed {bad} consumed");
            assert!(c.consume(m.tok.vocab_size() as u32 + 3).is_err(), "{short}: an id past the vocabulary");
            assert_eq!(mask_of(c.as_mut(), width), before, "{short} seed {seed} step {step}: mask changed");
            let good: Vec<u32> = ids.into_iter().filter(|t| !m.env.eos_ids().contains(t)).collect();
            if good.is_empty() || c.is_stopped() {
                break;
            }
            let t = good[rng.gen_range(0..good.len())];
            c.consume(t).unwrap();
            path.push(t);
            let mut r = replayed(&spec, &path);
            assert_eq!(mask_of(c.as_mut(), width), mask_of(r.as_mut(), width), "{short} seed {seed}: after reject");
        }
    }
}

#[test]
fn forced_tokens_spell_a_single_choice() {
    let option = "The answer is: 42, \"final\".";
    for short in MODELS {
        let m = model(short);
        let width = m.tok.vocab_size();
        let spec = compile(&m.env, &Grammar::Choice(vec![option.into()])).unwrap();
        let mut c = start(&spec);
        let forced = c.forced();
        assert!(!forced.is_empty(), "{short}: nothing forced");
        assert_eq!(text_of(&m.tok, &forced), option, "{short}: forced tokens {forced:?}");
        // Each forced token is the whole mask at its state.
        for &t in &forced {
            assert_eq!(allowed(&mask_of(c.as_mut(), width)), vec![t], "{short}: mask at forced {t}");
            c.consume(t).unwrap();
        }
        assert!(c.is_accepting() && c.is_stopped(), "{short}: complete after the forced tokens");
        assert!(c.forced().is_empty());
        assert_eq!(allowed(&mask_of(c.as_mut(), width)), m.env.eos_ids());
    }
}

#[test]
fn bad_grammars_name_the_problem() {
    let m = model("smollm2");
    let bad_keyword = json!({
        "type": "object",
        "properties": {"x": {"type": "array", "uniqueItems": true}}
    });
    let e = compile(&m.env, &Grammar::JsonSchema { schema: bad_keyword.clone(), strict: true }).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("response_format.json_schema: "), "{msg}");
    eprintln!("{msg}");
    assert!(msg.contains("uniqueItems") && msg.contains("/properties/x"), "{msg}");
    // Not strict: unknown keywords are ignored.
    compile(&m.env, &Grammar::JsonSchema { schema: bad_keyword, strict: false }).unwrap();

    let cases: Vec<(Grammar, &str, &str)> = vec![
        (
            Grammar::JsonSchema { schema: json!({"type": "strin"}), strict: true },
            "response_format.json_schema",
            "strin",
        ),
        (Grammar::JsonSchema { schema: json!([1]), strict: true }, "response_format.json_schema", "array"),
        (
            Grammar::JsonSchema { schema: json!({"$ref": "#/$defs/missing"}), strict: true },
            "response_format.json_schema",
            "missing",
        ),
        (Grammar::Regex("(ab".into()), "regex", "invalid regex: unclosed group"),
        (Grammar::Lark("start: /[a-/".into()), "grammar", "invalid regex"),
        (Grammar::Choice(vec![]), "choice", "at least one"),
        (Grammar::Lark("start: foo_undefined".into()), "grammar", "foo_undefined"),
        (Grammar::Lark("   ".into()), "grammar", "empty"),
    ];
    for (g, ctx, needle) in cases {
        let msg = compile(&m.env, &g).map(|_| ()).unwrap_err().to_string();
        eprintln!("{msg}");
        assert!(msg.starts_with(&format!("{ctx}: ")), "{g:?}: {msg}");
        assert!(msg.to_lowercase().contains(needle), "{g:?}: {msg:?} does not name {needle:?}");
        assert!(!msg.contains('\n'), "{g:?}: multi-line message {msg:?}");
    }
}

/// A head wider than the vocabulary: ids past it are never allowed, whatever the mask held before.
#[test]
fn wide_masks_never_allow_padding_ids() {
    for short in MODELS {
        let m = model(short);
        let vocab = m.tok.vocab_size();
        let spec = compile(&m.env, &Grammar::Regex(r"(?s:.*)".into())).unwrap();
        let mut c = start(&spec);
        for width in [vocab, vocab + 1, vocab + 31, vocab + 32, vocab.next_multiple_of(128) + 256] {
            let mask = mask_of(c.as_mut(), width);
            assert_eq!(mask.len(), width.div_ceil(32));
            let ids = allowed(&mask);
            assert!(ids.iter().all(|&t| (t as usize) < vocab), "{short} width {width}");
            assert!(ids.len() > vocab / 2, "{short}: an any-text grammar allows most ids ({})", ids.len());
        }
        // And a mask narrower than the vocabulary gets the allowed ids that fit.
        let mut narrow = vec![0u32; 3];
        c.fill_mask(&mut narrow).unwrap();
        assert_eq!(
            allowed(&narrow),
            allowed(&mask_of(c.as_mut(), vocab)).into_iter().filter(|&t| t < 96).collect::<Vec<_>>()
        );
    }
}

/// Compiling is per grammar, not per vocabulary: many grammars compile against one environment.
#[test]
fn many_grammars_share_one_env() {
    let m = model("qwen05");
    let t0 = Instant::now();
    let n = 50;
    for i in 0..n {
        let schema = json!({
            "type": "object",
            "properties": {format!("k{i}"): {"type": "integer"}},
            "required": [format!("k{i}")],
            "x-guidance": {"whitespace_flexible": false}
        });
        let spec = compile(&m.env, &Grammar::JsonSchema { schema, strict: true }).unwrap();
        let mut c = start(&spec);
        let forced = c.forced();
        let text = text_of(&m.tok, &forced);
        assert!(format!("{{\"k{i}\":").starts_with(&text) && text.len() > 3, "{i}: forced {text:?}");
    }
    eprintln!("qwen05: {n} schemas compiled and started in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
}

/// A SentencePiece vocabulary (Gemma 3): text continued mid-sequence gets no prefix space, so forced bytes
/// become forced tokens that spell them.
#[test]
fn sentencepiece_vocab_forces_tokens() {
    let tok = tokenizer("gemma3");
    let env = GrammarEnv::new(tok.clone(), tok.stop_ids()).expect("grammar env");
    assert!(env.forces_tokens(), "gemma3: continuation encoding does not reproduce text");
    let option = "Hello there, 42 times.";
    let spec = compile(&env, &Grammar::Choice(vec![option.into()])).unwrap();
    let mut c = start(&spec);
    let forced = c.forced();
    assert_eq!(text_of(&tok, &forced), option, "gemma3: forced {forced:?}");
    for &t in &forced {
        c.consume(t).unwrap();
    }
    assert!(c.is_stopped() && c.is_accepting());
}

/// Strict schemas read a missing `additionalProperties` as `false` (OpenAI's strict mode), at every level; a
/// property named like a keyword stays a property; without `strict` other properties are allowed.
#[test]
fn strict_schemas_allow_no_other_properties() {
    let m = model("smollm2");
    let schema = json!({
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"a": {"type": "boolean"}}}},
        "required": ["properties"]
    });
    let accepts = |strict: bool, text: &str| -> bool {
        let spec = compile(&m.env, &Grammar::JsonSchema { schema: schema.clone(), strict }).unwrap();
        let mut c = start(&spec);
        let ids = m.tok.encode_continuation(text).unwrap();
        ids.iter().all(|&t| c.consume(t).is_ok()) && c.is_accepting()
    };
    assert!(accepts(true, r#"{"properties": {"a": true}}"#));
    assert!(!accepts(true, r#"{"properties": {"a": true, "b": 1}}"#), "nested extra property");
    assert!(!accepts(true, r#"{"properties": {}, "x": 1}"#), "top-level extra property");
    assert!(accepts(false, r#"{"properties": {"a": true, "b": 1}}"#), "not strict: extra properties allowed");
}
