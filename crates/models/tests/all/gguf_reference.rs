//! The real GGUF models against reference logits (`tests/data/gguf_reference.json`, made by
//! `make_gguf_reference.py`): transformers in fp32 on the same dequantized weights, and llama.cpp.
//!
//! This is what pins the per-format facts: the RoPE pair layout (GGUF llama = adjacent pairs, qwen2/gemma3 =
//! half split), Gemma's folded `1 + w` norms, sliding windows, the embedding scale. A wrong choice moves the logits
//! by whole units, far outside the tolerances here.

use crate::common::{argmax, gguf_model, run_one_chunk};
use crate::naive::Naive;
use serde_json::Value;
use tf_backend_cpu::CpuBackend;
use tf_core::{Backend, Precision};

fn reference() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("gguf_reference.json")).expect("json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Which reference a backend's arithmetic should be close to, and how close (relative to max|logit|).
pub enum Against {
    /// transformers fp32 on the dequantized weights.
    Transformers(f32),
    /// llama.cpp's own quantized arithmetic.
    LlamaCpp(f32),
}

/// Runs the reference prompt as one chunk and compares every position. Returns the worst relative error.
pub fn check(be: &dyn Backend, case: &str, against: Against) -> f32 {
    let r = reference();
    let m = &r["models"][case];
    let short = case.strip_suffix("_long").unwrap_or(case);
    let ids: Vec<u32> = m["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let probes: Vec<usize> = r["probes"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let rows = m["positions"].as_array().unwrap();
    let positions: Vec<usize> =
        rows.iter().enumerate().map(|(i, row)| row["position"].as_u64().map_or(i, |p| p as usize)).collect();
    let model = gguf_model(be, short);
    let logits = run_one_chunk(be, model.as_ref(), &ids, &positions);
    let (tol, key) = match against {
        Against::Transformers(t) => (t, "hf_top"),
        Against::LlamaCpp(t) => (t, "llama_cpp_top"),
    };
    let mut worst = 0f32;
    let mut argmax_agree = 0;
    for (p, row) in rows.iter().enumerate() {
        let top: Vec<usize> = row["top"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let mut pairs: Vec<(usize, f32)> = top.iter().copied().zip(floats(&row[key])).collect();
        if matches!(against, Against::Transformers(_)) {
            pairs.extend(probes.iter().copied().zip(floats(&row["hf_probes"])).filter(|(i, _)| *i < logits[p].len()));
        }
        let scale = row["hf_max_abs"].as_f64().unwrap() as f32;
        for (id, want) in pairs {
            let err = (logits[p][id] - want).abs() / scale;
            worst = worst.max(err);
            let pos = positions[p];
            let got = logits[p][id];
            assert!(
                err <= tol,
                "{case} ({}) position {pos} token {id}: {got} vs {want} (rel {err:.2e})",
                be.describe()
            );
        }
        let want_top = match against {
            Against::Transformers(_) => top[0],
            Against::LlamaCpp(_) => row["llama_cpp_argmax"].as_u64().unwrap() as usize,
        };
        argmax_agree += usize::from(argmax(&logits[p]) == want_top);
    }
    let n = rows.len();
    eprintln!("{case} on {}: worst relative logit error {worst:.2e}, argmax agrees {argmax_agree}/{n}", be.describe());
    assert!(argmax_agree * 10 >= n * 9, "{case}: argmax agrees only at {argmax_agree}/{n} positions");
    worst
}

#[test]
fn naive_smollm2_matches_transformers() {
    check(&Naive, "smollm2", Against::Transformers(1e-4));
}

#[test]
fn naive_qwen05_matches_transformers() {
    check(&Naive, "qwen05", Against::Transformers(1e-4));
}

#[test]
fn naive_gemma3_matches_transformers() {
    check(&Naive, "gemma3", Against::Transformers(1e-4));
}

#[test]
fn naive_gemma3_long_matches_transformers() {
    check(&Naive, "gemma3_long", Against::Transformers(1e-4));
}

fn cpu(precision: Precision) -> CpuBackend {
    CpuBackend::new(2, precision)
}

#[test]
fn cpu_full_matches_transformers() {
    for case in ["smollm2", "qwen05", "gemma3", "gemma3_long"] {
        check(&cpu(Precision::Full), case, Against::Transformers(1e-4));
    }
}

/// `checkpoint` quantizes activations to int8 blocks as llama.cpp does, so it is compared with llama.cpp.
#[test]
fn cpu_checkpoint_close_to_llama_cpp() {
    for case in ["smollm2", "qwen05", "gemma3", "gemma3_long"] {
        check(&cpu(Precision::Checkpoint), case, Against::LlamaCpp(5e-2));
    }
}
