//! Family goldens: tiny random Hugging Face checkpoints (`fixtures/tiny/<family>/`, written by
//! `tools/reference/tiny_models.py`) against the fp32 logits transformers computed for them. Loads through
//! `config.json` + safetensors, i.e. the HF tensor names, HF RoPE layout and Gemma's unfolded `1 + w` norms.
//!
//! Per family: logits at every position within 1e-4 × max|logit| (`full` precision), the 8 greedy tokens exactly
//! (decoded one row at a time), the transformers-4 spelling of the config giving the same bits, and the
//! chunked == whole exactness (the tiny Gemma 3 has a sliding window of 8 and gpt-oss one of 4, so windows bite
//! there).

use crate::common::{alloc_kv, argmax, batch, first_bit_difference, hf_model, run_chunked, Row, Seq};
use crate::naive::Naive;
use serde_json::Value;
use std::path::PathBuf;
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision};
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Model};

pub(crate) struct Golden {
    pub(crate) dir: PathBuf,
    pub(crate) ids: Vec<u32>,
    /// `[positions][vocab]`.
    pub(crate) logits: Vec<Vec<f32>>,
    pub(crate) greedy: Vec<u32>,
    pub(crate) v4_config: Value,
}

pub(crate) fn golden(family: &str) -> Golden {
    let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
    let r = tf_testkit::fixture(&format!("tiny/{family}/reference.json"));
    let ids_of = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let logits = r["logits_f32_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let hex = row.as_str().unwrap();
            (0..hex.len() / 8)
                .map(|i| f32::from_bits(u32::from_str_radix(&hex[8 * i..8 * i + 8], 16).unwrap()))
                .collect()
        })
        .collect();
    Golden {
        dir,
        ids: ids_of(&r["input_ids"]),
        logits,
        greedy: ids_of(&r["greedy"]),
        v4_config: r["config_v4_style"].clone(),
    }
}

/// Worst |ours − reference| / max|reference| over every logit of every position.
fn worst_error(ours: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    let mut worst = 0f32;
    for (a, b) in ours.iter().zip(want) {
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    worst
}

/// Greedy ids after the prompt: prompt in one chunk, then one row per step.
fn greedy(be: &dyn Backend, model: &dyn Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let seq = Seq::new(prompt.len() + n, 1, 1);
    let mut kv = alloc_kv(be, model, seq.max_block() as usize + 1);
    let mut rows: Vec<Row> = prompt.iter().enumerate().map(|(p, &t)| Row { seq: 0, pos: p, token: t }).collect();
    let mut out = Vec::new();
    for _ in 0..n {
        let mut b = batch(&[&seq], &rows);
        b.logit_rows = vec![rows.len() - 1];
        let next = argmax(&be.to_host(&model.forward(be, &b, &mut kv))) as u32;
        rows = vec![Row { seq: 0, pos: prompt.len() + out.len(), token: next }];
        out.push(next);
    }
    out
}

fn check_family(family: &str) {
    let g = golden(family);
    let full = CpuBackend::new(2, Precision::Full);
    let backends: [(&dyn Backend, &str); 2] = [(&full, "cpu full"), (&Naive, "naive")];
    for (be, name) in backends {
        let model = hf_model(be, &g.dir);
        assert_eq!(model.family(), if matches!(family, "llama3" | "mixtral" | "mistral") { "llama" } else { family });
        let ours = run_chunked(be, model.as_ref(), &g.ids, &[g.ids.len()]);
        let err = worst_error(&ours, &g.logits);
        eprintln!("{family} ({name}): worst logit error {err:.2e} × max|logit|");
        assert!(err <= 1e-4, "{family} ({name}): logits off by {err:.2e} × max|logit|");
        for (p, (a, b)) in ours.iter().zip(&g.logits).enumerate() {
            assert_eq!(argmax(a), argmax(b), "{family} ({name}): argmax at position {p}");
        }
        assert_eq!(greedy(be, model.as_ref(), &g.ids, g.greedy.len()), g.greedy, "{family} ({name}): greedy tokens");
    }

    // The transformers-4 spelling of the same config loads to the same bits.
    let st = SafetensorsModel::open_dir(&g.dir).unwrap();
    let v4 = HfConfig::from_value(g.v4_config.clone(), "config_v4_style").unwrap();
    let v4_model = load_model(&full, &st, &v4).unwrap_or_else(|e| panic!("{family} v4 config: {e}"));
    let model = hf_model(&full, &g.dir);
    let whole = run_chunked(&full, model.as_ref(), &g.ids, &[g.ids.len()]);
    let v4_logits = run_chunked(&full, v4_model.as_ref(), &g.ids, &[g.ids.len()]);
    assert_eq!(first_bit_difference(&v4_logits, &whole), None, "{family}: v4-style config changes the logits");

    // Exactness in both precisions (float weights: both take the f32 path, but each must agree with itself).
    for precision in [Precision::Full, Precision::Checkpoint] {
        let be = CpuBackend::new(2, precision);
        let model = hf_model(&be, &g.dir);
        let whole = run_chunked(&be, model.as_ref(), &g.ids, &[g.ids.len()]);
        for chunks in [&[1][..], &[5], &[3, 1, 7]] {
            let got = run_chunked(&be, model.as_ref(), &g.ids, chunks);
            assert_eq!(first_bit_difference(&got, &whole), None, "{family} {}: chunks {chunks:?}", precision.name());
        }
    }
}

#[test]
fn llama() {
    check_family("llama");
}

#[test]
fn llama3_rope_scaling() {
    check_family("llama3");
}

#[test]
fn qwen2() {
    check_family("qwen2");
}

#[test]
fn qwen3() {
    check_family("qwen3");
}

#[test]
fn qwen3moe() {
    check_family("qwen3moe");
}

#[test]
fn mixtral() {
    check_family("mixtral");
}

/// Mistral: the llama family with a sliding window (8) on every layer, shorter than the 24-token prompt.
#[test]
fn mistral_sliding_window() {
    check_family("mistral");
}

#[test]
fn gemma3() {
    check_family("gemma3");
}

/// gpt-oss: attention sinks, biases everywhere, sliding window 4 on layers 0 and 2, YaRN, biased experts with the
/// clamped SwiGLU (the fixture scales the experts' gate/up weights so that the clamps take effect).
#[test]
fn gpt_oss() {
    check_family("gpt_oss");
}
