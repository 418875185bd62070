//! The tiny Qwen3 checkpoint with a real tokenizer and Qwen3's thinking chat template (`fixtures/tiny-qwen3/`,
//! written by `tools/reference/make_tiny_qwen3.py`), loaded the way `tensorfold` loads a Hugging Face directory:
//! config.json + safetensors (tied embeddings, q/k norms, a head padded past the tokenizer), tokenizer.json +
//! tokenizer_config.json (its `chat_template`), generation_config.json.
//!
//! Checked against what transformers computed: the prompts' token ids, fp32 logits within 1e-4 × max|logit| per
//! position (`--precision full`), 8 greedy ids decoded one row at a time over the KV cache, and the chat template
//! rendered with `enable_thinking` true, false and undefined, `reasoning_content`, `<think>` inside content and
//! tool calls; the reasoning parser and thinking markers the template selects.

use serde_json::Value;
use tf_backend_cuda::Arithmetic;
use tf_cli::model_ref::{classify_path, ModelRef};
use tf_cli::session::{BackendChoice, Session};
use tf_core::{AttnMeta, Precision, RowAttn};
use tf_models::Batch;
use tf_text::{ChatRenderOptions, ChatTemplate, ReasoningFormat, ReasoningParser};

const BLOCK: usize = 16;

fn session() -> Session {
    let dir = tf_testkit::repo_root().join("fixtures/tiny-qwen3");
    let model = classify_path(&dir).expect("classify");
    assert!(matches!(model, ModelRef::HfDir(_)), "{model:?}");
    Session::load_on(&model, BackendChoice::Cpu, 1, Precision::Full, Arithmetic::Portable).expect("load")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn hex_row(hex: &str) -> Vec<f32> {
    (0..hex.len() / 8).map(|i| f32::from_bits(u32::from_str_radix(&hex[8 * i..8 * i + 8], 16).unwrap())).collect()
}

/// One sequence's rows `first..first + tokens.len()` as a causal batch over the block table `0, 1, 2, …`,
/// asking logits for `logit_rows`.
fn batch(tokens: &[u32], first: usize, logit_rows: Vec<usize>) -> Batch {
    let n = first + tokens.len();
    let table: Vec<u32> = (0..n.div_ceil(BLOCK) as u32).collect();
    let pos: Vec<usize> = (first..n).collect();
    Batch {
        tokens: tokens.to_vec(),
        positions: pos.iter().map(|&p| p as u32).collect(),
        slots: pos.iter().map(|&p| p as u32).collect(),
        attn: AttnMeta {
            block_tables: vec![table],
            rows: pos.iter().map(|&p| RowAttn { pos: p as u32, seq: 0, ctx: p as u32 + 1, tree: vec![] }).collect(),
        },
        logit_rows,
        fed: None,
        states: Vec::new(),
    }
}

/// Logits at `positions` of the prompt filled in one chunk, then `n` greedy ids decoded one row at a time.
fn run(s: &Session, prompt: &[u32], positions: &[usize], n: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let be = s.backend.as_ref();
    let model = s.model.as_ref();
    let vocab = model.vocab_size();
    let blocks = (prompt.len() + n).div_ceil(BLOCK) + 1;
    let mut kv = be.alloc_kv(model.kv_spec(blocks, BLOCK)).expect("kv");
    let mut rows = positions.to_vec();
    rows.push(prompt.len() - 1);
    let host = be.to_host(&model.forward(be, &batch(prompt, 0, rows), &mut kv));
    let mut out: Vec<Vec<f32>> = host.chunks(vocab).map(<[f32]>::to_vec).collect();
    let mut last = out.pop().unwrap();
    let mut greedy = Vec::new();
    for _ in 0..n {
        let next = argmax(&last);
        greedy.push(next);
        let host = be.to_host(&model.forward(be, &batch(&[next], prompt.len() + greedy.len() - 1, vec![0]), &mut kv));
        last = host;
    }
    (out, greedy)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn loads_with_the_fixture_shapes_and_tokens() {
    let s = session();
    let r = tf_testkit::fixture("tiny-qwen3/reference.json");
    assert_eq!(s.model.vocab_size() as u64, r["vocab_size"].as_u64().unwrap());
    assert_eq!(s.tokenizer.vocab_size() as u64, r["tokenizer_size"].as_u64().unwrap());
    assert!(s.model.vocab_size() > s.tokenizer.vocab_size(), "the head is padded past the tokenizer");
    for (text, id) in r["token_ids"].as_object().unwrap() {
        assert_eq!(s.tokenizer.id_of(text), Some(id.as_u64().unwrap() as u32), "{text}");
    }
    let id = |t: &str| s.tokenizer.id_of(t).unwrap();
    assert_eq!(s.tokenizer.eos_id(), Some(id("<|im_end|>")));
    assert!(s.tokenizer.is_stop(id("<|im_end|>")) && s.tokenizer.is_stop(id("<|endoftext|>")));
    assert!(!s.tokenizer.is_stop(id("</think>")));
    // `<think>` and `</think>` are whole tokens in text (added tokens), and decode back to their text.
    let t = s.tokenizer.encode("<think>\nhm\n</think>\n\nok", false, true).unwrap();
    assert_eq!(t.first(), Some(&id("<think>")));
    assert!(t.contains(&id("</think>")));
    assert_eq!(s.tokenizer.decode(&t, false).unwrap(), "<think>\nhm\n</think>\n\nok");
    // Generation defaults from generation_config.json.
    assert_eq!(s.defaults.temperature, Some(0.6));
    assert_eq!(s.defaults.top_k, Some(20));
}

#[test]
fn logits_and_greedy_match_transformers() {
    let s = session();
    let r = tf_testkit::fixture("tiny-qwen3/reference.json");
    let mut worst_all = 0f32;
    for p in r["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["input_ids"]);
        let ours = s.tokenizer.encode(p["text"].as_str().unwrap(), false, true).unwrap();
        assert_eq!(ours, prompt, "{name}: token ids differ from transformers'");
        let positions: Vec<usize> = ids(&p["positions"]).into_iter().map(|x| x as usize).collect();
        let want: Vec<Vec<f32>> =
            p["logits_f32_hex"].as_array().unwrap().iter().map(|h| hex_row(h.as_str().unwrap())).collect();
        let greedy_want = ids(&p["greedy"]);
        let (got, greedy) = run(&s, &prompt, &positions, greedy_want.len());
        assert_eq!(got.len(), want.len());
        let argmax_want = ids(&p["argmax"]);
        let mut worst = 0f32;
        for ((row, w), &pos) in got.iter().zip(&want).zip(&positions) {
            assert_eq!(row.len(), w.len(), "{name}: vocab");
            let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = row.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs() / scale));
            assert!(err <= 1e-4, "{name} position {pos}: |ours - transformers| / max|logit| = {err:e}");
            worst = worst.max(err);
            assert_eq!(argmax(row), argmax_want[pos], "{name} position {pos}: argmax");
        }
        assert_eq!(greedy, greedy_want, "{name}: greedy ids");
        println!("{name}: {} positions checked, worst relative logit error {worst:.3e}", positions.len());
        worst_all = worst_all.max(worst);
    }
    println!("worst relative logit error over every prompt: {worst_all:.3e}");
}

#[test]
fn chat_template_renders_as_transformers_with_thinking_on_and_off() {
    let s = session();
    let c = tf_testkit::fixture("tiny-qwen3/chat.json");
    let template = s.template.as_ref().expect("the fixture has a chat template");
    assert!(template.source().contains("enable_thinking"));
    let cases = c["cases"].as_array().unwrap();
    assert!(cases.len() >= 7);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let opts = ChatRenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case.get("tools").cloned(),
            enable_thinking: case.get("enable_thinking").and_then(Value::as_bool),
            eos_token: s.tokenizer.eos_token().map(str::to_owned),
            bos_token: s.tokenizer.bos_token().map(str::to_owned),
            ..Default::default()
        };
        let want = case["rendered"].as_str().unwrap();
        let got = template.render(&case["messages"], &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}");
        assert_eq!(s.tokenizer.encode(&got, false, true).unwrap(), ids(&case["ids"]), "{name}: ids");
    }
    let by_name = |n: &str| cases.iter().find(|c| c["name"] == n).unwrap()["rendered"].as_str().unwrap();
    assert!(by_name("user_thinking_off").ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(by_name("user_thinking_on").ends_with("<|im_start|>assistant\n"));
    assert_eq!(by_name("user_thinking_on"), by_name("user_thinking_default"));
    // Rendering again after a compile from the source gives the same text (the template is self-contained).
    let again = ChatTemplate::new(s.tokenizer.chat_template().unwrap()).unwrap();
    let opts = ChatRenderOptions { add_generation_prompt: true, enable_thinking: Some(false), ..Default::default() };
    let msgs = serde_json::json!([{"role": "user", "content": "What is 2 + 2?"}]);
    assert_eq!(again.render(&msgs, &opts).unwrap(), by_name("user_thinking_off"));
}

#[test]
fn the_template_selects_the_qwen3_reasoning_parser() {
    let s = session();
    let c = tf_testkit::fixture("tiny-qwen3/chat.json");
    let src = s.tokenizer.chat_template().unwrap();
    let p = ReasoningParser::from_template(src).expect("a thinking template");
    assert_eq!(p.format(), ReasoningFormat::Qwen3);
    let rendered = |n: &str| {
        c["cases"].as_array().unwrap().iter().find(|x| x["name"] == n).unwrap()["rendered"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(!p.for_prompt(&rendered("user_thinking_on")).starts_inside());
    assert!(!p.for_prompt(&rendered("user_thinking_off")).starts_inside());
    // A reply to the thinking prompt, as the model writes it, split back into its parts.
    let r = tf_testkit::fixture("tiny-qwen3/reference.json");
    let p0 = &r["prompts"].as_array().unwrap().iter().find(|x| x["name"] == "thinking_reply").unwrap();
    let full = p0["text"].as_str().unwrap();
    let reply = full.strip_prefix(rendered("user_thinking_on").as_str()).unwrap();
    let reply = reply.strip_suffix("<|im_end|>").unwrap();
    let parsed = p.for_prompt(&rendered("user_thinking_on")).parse(reply);
    assert_eq!(parsed.reasoning, "The user asks 2 + 2.");
    assert_eq!(parsed.content, "The answer is 4.");
    // The thinking-budget markers are single tokens of this vocabulary.
    assert_eq!(s.tokenizer.encode(p.start_marker(), false, true).unwrap().len(), 1);
    assert_eq!(s.tokenizer.encode(p.end_marker(), false, true).unwrap().len(), 1);
}
