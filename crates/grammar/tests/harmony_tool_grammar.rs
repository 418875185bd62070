//! The grammar that forces a harmony (gpt-oss) tool call, compiled by llguidance over a byte-level vocabulary
//! that has harmony's markers as special tokens: it accepts a call of an offered tool (after an optional
//! analysis message) and refuses other tools, arguments off the schema, a final answer and a second call; the
//! text of every accepted walk parses back, through the harmony reasoning and tool-call parsers, to exactly one
//! call of an offered tool with arguments valid under its schema.

mod support;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use support::{allowed, base_seed, mask_of, spell, validate};
use tf_core::mask_allows;
use tf_grammar::{compile, Grammar, GrammarEnv};
use tf_text::{
    tool_call_grammar, ReasoningEvent, ReasoningFormat, ReasoningParser, Tokenizer, ToolEvent, ToolFormat, ToolParser,
    ToolSpec,
};

const MARKERS: [&str; 8] =
    ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|endoftext|>"];

/// The 256-byte BPE fixture with harmony's markers added as special tokens (ids 256…); `<|return|>`, `<|call|>`
/// and `<|endoftext|>` end generation, as in gpt-oss's generation config.
fn harmony_tokenizer() -> Arc<Tokenizer> {
    byte_tokenizer(true)
}

/// The 256-byte BPE fixture, with harmony's markers as special tokens when `markers`.
fn byte_tokenizer(markers: bool) -> Arc<Tokenizer> {
    let path = tf_testkit::repo_root().join("fixtures/tiny/byte-tokenizer.json");
    let mut j: Value = serde_json::from_slice(&std::fs::read(&path).expect("byte tokenizer")).unwrap();
    let added: Vec<Value> = MARKERS
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({"id": 256 + i, "content": m, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    if !markers {
        return Arc::new(Tokenizer::from_hf_json(&serde_json::to_vec(&j).unwrap(), None, &[]).expect("tokenizer"));
    }
    j["added_tokens"] = Value::Array(added);
    let eos = [262, 261, 263];
    Arc::new(Tokenizer::from_hf_json(&serde_json::to_vec(&j).unwrap(), None, &eos).expect("tokenizer"))
}

fn weather_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
           "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false})
}

struct Setup {
    tok: Arc<Tokenizer>,
    spec: Arc<dyn tf_core::ConstraintSpec>,
    eos: Vec<u32>,
}

/// The grammar forcing a call of `get_weather` (with `schema`), or of `now` too (with `now`, `None`: any object)
/// unless `named`.
fn setup(schema: &Value, now: Option<&Value>, named: bool) -> Setup {
    setup_on(harmony_tokenizer(), schema, now, named)
}

fn setup_on(tok: Arc<Tokenizer>, schema: &Value, now: Option<&Value>, named: bool) -> Setup {
    let mut eos = tok.stop_ids().to_vec();
    if eos.is_empty() {
        // No end-of-sequence token in the plain byte vocabulary: the last byte stands for one.
        eos.push(255);
    }
    let env = GrammarEnv::new(tok.clone(), &eos).expect("env");
    let mut tools = vec![ToolSpec { name: "get_weather", parameters: Some(schema) }];
    if !named {
        tools.push(ToolSpec { name: "now", parameters: now });
    }
    let special = |m: &str| tok.id_of(m).filter(|&id| tok.token_kind(id).is_some_and(|k| k.is_special()));
    let lark = tool_call_grammar(ToolFormat::Harmony, &tools, true, &special);
    let spec = compile(&env, &Grammar::Lark(lark.clone())).unwrap_or_else(|e| panic!("{e}\n{lark}"));
    Setup { tok, spec, eos }
}

/// Whether the grammar takes `text` (markers as special tokens) and then allows an end of sequence.
fn accepts(s: &Setup, text: &str) -> bool {
    let ids = s.tok.encode(text, false, true).expect("encode");
    let mut m = s.spec.start().expect("start");
    for &t in &ids {
        if m.consume(t).is_err() {
            return false;
        }
    }
    let mask = mask_of(m.as_mut(), s.tok.vocab_size());
    m.is_accepting() && s.eos.iter().all(|&e| mask_allows(&mask, e))
}

const CALL: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";

#[test]
fn accepts_a_call_and_refuses_the_rest() {
    let s = setup(&weather_schema(), None, false);
    let good = [
        format!("{CALL}{{\"city\": \"Oslo\"}}"),
        format!("{CALL}{{\"city\": \"Oslo\", \"unit\": \"c\"}}"),
        format!(
            "<|channel|>analysis<|message|>Need {{weather}}\n<x>.<|end|><|start|>assistant{CALL}{{\"city\": \"\"}}"
        ),
        "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}".to_string(),
    ];
    for text in &good {
        assert!(accepts(&s, text), "refused {text:?}");
    }
    let bad = [
        format!("{CALL}{{}}"),                                               // a required argument missing
        format!("{CALL}{{\"city\": 3}}"),                                    // of the wrong type
        format!("{CALL}{{\"city\": \"Oslo\", \"x\": 1}}"),                   // an argument the schema does not have
        format!("{CALL}{{\"city\": \"Oslo\"}}{CALL}{{\"city\": \"Rome\"}}"), // a second call
        format!("{CALL}{{\"city\": \"Oslo\"}}<|end|>"),                      // anything after the arguments
        "<|channel|>commentary to=functions.other <|constrain|>json<|message|>{}".to_string(),
        "<|channel|>final<|message|>It is cold.".to_string(),
        "<|channel|>analysis<|message|>only thinking<|end|>".to_string(),
        format!(
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>\
                 <|start|>assistant{CALL}{{\"city\": \"Oslo\"}}"
        ),
        "{\"city\": \"Oslo\"}".to_string(),
    ];
    for text in &bad {
        assert!(!accepts(&s, text), "accepted {text:?}");
    }
    // A named function: the other tool is not offered.
    let named = setup(&weather_schema(), None, true);
    assert!(accepts(&named, &good[0]));
    assert!(!accepts(&named, &good[3]));
    // A vocabulary without the markers: they are text, and thinking runs to the first `<|end|>`.
    let plain = setup_on(byte_tokenizer(false), &weather_schema(), None, false);
    for text in &good {
        assert!(accepts(&plain, text), "refused {text:?} as text");
    }
    for text in &bad {
        assert!(!accepts(&plain, text), "accepted {text:?} as text");
    }
}

/// One call, parsed as the server parses a reply: the harmony reasoning split, then the harmony tool parser on
/// its content. Returns (reasoning, content, calls as (name, arguments), cut).
fn parse_reply(text: &str) -> (String, String, Vec<(String, String)>, bool) {
    let mut r = ReasoningParser::new(ReasoningFormat::Harmony).stream();
    let mut t = ToolParser::new(ToolFormat::Harmony, "call_");
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut events = r.push(text);
    events.extend(r.finish());
    let mut tool_events = Vec::new();
    for e in events {
        match e {
            ReasoningEvent::Reasoning(x) => reasoning.push_str(&x),
            ReasoningEvent::Content(x) => tool_events.extend(t.push(&x)),
        }
    }
    let end = t.finish();
    tool_events.extend(end.events);
    for e in tool_events {
        if let ToolEvent::Content(x) = e {
            content.push_str(&x);
        }
    }
    (reasoning, content, end.calls.into_iter().map(|c| (c.name, c.arguments)).collect(), end.cut)
}

#[test]
fn random_forced_calls_parse_back_to_one_valid_call() {
    let schema = weather_schema();
    // Closed schemas, so that walks end.
    let now = json!({"type": "object", "properties": {"tz": {"enum": ["utc", "cet"]}}, "additionalProperties": false});
    let s = setup(&schema, Some(&now), false);
    let vocab = s.tok.vocab_size();
    let end_id = s.tok.id_of("<|end|>").unwrap();
    let (mut thought, mut names) = (0, std::collections::BTreeSet::new());
    for walk in 0..40u64 {
        let seed = base_seed() ^ walk;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut m = s.spec.start().expect("start");
        let mut tokens = Vec::new();
        let mut stopped = false;
        for _ in 0..400 {
            let ids = allowed(&mask_of(m.as_mut(), vocab));
            assert!(!ids.is_empty(), "seed {seed}: empty mask after {tokens:?}");
            // Thinking ends soon: `<|end|>` is taken when allowed, a third of the time.
            let t = if ids.contains(&end_id) && rng.gen_bool(0.3) { end_id } else { ids[rng.gen_range(0..ids.len())] };
            if s.eos.contains(&t) {
                assert!(m.is_accepting(), "seed {seed}: EOS allowed before the call is complete");
                stopped = true;
                break;
            }
            m.consume(t).unwrap_or_else(|e| panic!("seed {seed}: {t} allowed but {e}"));
            tokens.push(t);
        }
        assert!(
            stopped,
            "seed {seed}: no end after 400 tokens: {:?}",
            String::from_utf8_lossy(&spell(&s.tok, &tokens))
        );
        let text = String::from_utf8(spell(&s.tok, &tokens)).expect("UTF-8");
        let (reasoning, content, calls, cut) = parse_reply(&text);
        thought += usize::from(text.starts_with("<|channel|>analysis<|message|>"));
        assert_eq!(
            reasoning.is_empty(),
            !text.starts_with("<|channel|>analysis<|message|>")
                || text.starts_with("<|channel|>analysis<|message|><|end|>"),
            "seed {seed}: {text:?}"
        );
        assert!(!cut && content.is_empty(), "seed {seed}: {text:?} gave content {content:?}");
        assert_eq!(calls.len(), 1, "seed {seed}: {text:?}");
        let args: Value = serde_json::from_str(&calls[0].1).unwrap_or_else(|e| panic!("seed {seed}: {text:?}: {e}"));
        match calls[0].0.as_str() {
            "get_weather" => validate(&args, &schema, "args").unwrap_or_else(|e| panic!("seed {seed}: {e}")),
            "now" => validate(&args, &now, "args").unwrap_or_else(|e| panic!("seed {seed}: {e}")),
            other => panic!("seed {seed}: a call of {other}"),
        }
        names.insert(calls[0].0.clone());
    }
    assert!(thought > 0 && thought < 40, "{thought} of 40 walks began with thinking");
    assert_eq!(names.len(), 2, "{names:?}");
}
