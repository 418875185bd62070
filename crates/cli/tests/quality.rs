//! Quality against the fp32 reference (DESIGN.md §7): on the real GGUF models, teacher-forced top-1 agreement
//! with `transformers` fp32 on the dequantized GGUF (fixtures/quality/<model>.json, made by
//! tools/reference/real_quality.py) over ≥ 2,000 positions of real text, and greedy generations of 32 tokens on
//! 8 prompts. `full` mode must agree on ≥ 99.5% of positions and reproduce every greedy generation.
//! `checkpoint` mode (int8 activation blocks, like llama.cpp's own math) must agree at least as well as
//! llama.cpp itself does on the same file and windows (fixtures/quality/<model>_llamacpp.json) less one point,
//! and never below 95%; the expectation of 97% is above what llama.cpp reaches on SmolLM2 (96.6%).
//! The numbers are printed for docs/quality.md.

use serde_json::Value;
use tf_cli::drafting::Drafting;
use tf_cli::model_ref::ModelRef;
use tf_cli::run::{complete, spawn_engine};
use tf_cli::score::score_windows;
use tf_cli::session::Session;
use tf_core::Precision;
use tf_engine::{EngineHandle, GenRequest, SamplingParams};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Top-1 agreement of `precision` with the fixture, over every scored position.
fn top1_agreement(engine: &EngineHandle, fx: &Value) -> (usize, usize) {
    let (mut agree, mut total) = (0, 0);
    for w in fx["windows"].as_array().unwrap() {
        let input = ids(&w["input"]);
        let reference = ids(&w["top1"]);
        let (_, top1, _) = score_windows(engine, &input, &[[0, input.len()]], 64).unwrap();
        // score_windows leaves out the last position (it predicts nothing within the window).
        for (ours, theirs) in top1.iter().zip(&reference) {
            agree += (ours == theirs) as usize;
            total += 1;
        }
    }
    (agree, total)
}

/// How many of the 8 greedy generations match the reference for all 32 tokens, and the first divergence of each.
fn greedy(engine: &EngineHandle, fx: &Value) -> (usize, Vec<Option<usize>>) {
    let mut same = 0;
    let mut firsts = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let reference = ids(&case["generated"]);
        let req = GenRequest::new(prompt, SamplingParams::greedy(), reference.len());
        let out = complete(engine, req).unwrap();
        let first = out.tokens.iter().zip(&reference).position(|(a, b)| a != b);
        same += first.is_none() as usize;
        firsts.push(first);
    }
    (same, firsts)
}

/// Token slots one request of the fixtures needs at most: a scored window, or a prompt and its generation.
fn kv_tokens(fx: &Value, gx: &Value) -> usize {
    let windows = fx["windows"].as_array().unwrap().iter().map(|w| ids(&w["input"]).len());
    let cases =
        gx["cases"].as_array().unwrap().iter().map(|c| ids(&c["prompt_ids"]).len() + ids(&c["generated"]).len());
    windows.chain(cases).max().unwrap()
}

fn check(short: &str) {
    let path = tf_testkit::model_path(short);
    let fx = tf_testkit::fixture(&format!("quality/{short}.json"));
    let gx = tf_testkit::fixture(&format!("quality/{short}_greedy.json"));
    let model = ModelRef::Gguf(path);
    for precision in [Precision::Full, Precision::Checkpoint] {
        let s = Session::load(&model, 2, precision).unwrap();
        let Session { backend, model: m, .. } = s;
        let engine = spawn_engine(backend, m, kv_tokens(&fx, &gx), 1, 64, Drafting::serial(), 0, true, None).unwrap();
        let (agree, total) = top1_agreement(&engine, &fx);
        let rate = agree as f64 / total as f64;
        let (same, firsts) = greedy(&engine, &gx);
        engine.shutdown();
        eprintln!(
            "quality {short} {}: top-1 {agree}/{total} = {:.2}%, greedy identical {same}/{} (first divergence {firsts:?})",
            precision.name(),
            rate * 100.0,
            firsts.len()
        );
        assert!(total >= 2000, "{short}: only {total} positions");
        match precision {
            Precision::Full => {
                assert!(rate >= 0.995, "{short} full: top-1 agreement {:.3}% < 99.5%", rate * 100.0);
                assert_eq!(same, firsts.len(), "{short} full: greedy generations differ: {firsts:?}");
            }
            Precision::Checkpoint => {
                let peer = &tf_testkit::fixture(&format!("quality/{short}_llamacpp.json"))["teacher_forced"];
                let peer_rate =
                    peer["top1_agree_with_transformers"].as_f64().unwrap() / peer["positions"].as_f64().unwrap();
                let bar = (peer_rate - 0.01).clamp(0.95, 0.97);
                eprintln!(
                    "quality {short}: llama.cpp's own top-1 agreement {:.2}%, bar {:.2}%",
                    peer_rate * 100.0,
                    bar * 100.0
                );
                assert!(rate >= bar, "{short} checkpoint: top-1 agreement {:.3}% < {:.2}%", rate * 100.0, bar * 100.0)
            }
        }
    }
}

#[test]
fn smollm2_quality() {
    check("smollm2");
}

#[test]
fn qwen05_quality() {
    check("qwen05");
}

#[test]
fn gemma3_quality() {
    check("gemma3");
}
