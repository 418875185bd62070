//! `--load-format dummy`: a config.json alone (no weights, no tokenizer) in a temporary directory runs through
//! `bench` (serial and `--streams`) and `run` on the CPU; the output says the weights are dummy; the same
//! `--dummy-seed` gives the same token_sha and another seed a different one; `serve` on dummy weights answers as
//! `run` does.

mod support;

use std::path::Path;
use std::process::Command;

fn tensorfold(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold")).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A tiny Llama-shaped config.json (vocab 256, the byte tokenizer's).
fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "tie_word_embeddings": true, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "hidden_act": "silu", "torch_dtype": "bfloat16"}"#;
    std::fs::write(dir.path().join("config.json"), json).unwrap();
    dir
}

/// token_sha of `run` on dummy weights of `seed`, sampled with a fixed sampler seed (greedy decoding of tied
/// random weights tends to repeat the last prompt token whatever the weights), so the tokens follow the logits.
fn run_sha(dir: &Path, seed: &str) -> String {
    let d = dir.to_str().unwrap();
    let (ok, _, err) = tensorfold(&[
        "run",
        d,
        "--load-format",
        "dummy",
        "--dummy-seed",
        seed,
        "--backend",
        "cpu",
        "--threads",
        "2",
        "-p",
        "Hello there",
        "--max-tokens",
        "12",
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "--seed",
        "3",
    ]);
    assert!(ok, "run failed: {err}");
    err.split_whitespace().find_map(|w| w.strip_prefix("token_sha=")).unwrap_or_else(|| panic!("{err}")).to_owned()
}

#[test]
fn dummy_weights_bench_and_run_from_a_config_alone() {
    let dir = config_dir();
    let d = dir.path().to_str().unwrap();
    let common = ["--load-format", "dummy", "--backend", "cpu", "--threads", "2", "--prompt-tokens", "20"];
    let (ok, out, err) =
        tensorfold(&[&["bench", d][..], &common, &["--gen-tokens", "6", "--runs", "1", "--json"]].concat());
    assert!(ok, "bench failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["model"].as_str().unwrap().contains("dummy weights: random BF16, seed 0"), "{v}");
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0 && v["prefill_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v.get("window_ms_argmax").is_none(), "{v}");
    // What a decode step reads, counted from the config: per layer q, o [64, 64], k, v [32, 64] and gate, up, down
    // (128 × 64) in BF16, two norms of 64 in f32; the final norm; the tied table [256, 64] as the head, plus the
    // embedding row.
    let layer = 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 128 * 64) + 2 * 64 * 4;
    assert_eq!(v["weight_bytes_per_token"].as_u64(), Some(2 * layer + 64 * 4 + 256 * 64 * 2 + 64 * 2), "{v}");

    // --window-costs: one time per width, both ways back, the copy never making a width cheaper.
    let (ok, out, err) = tensorfold(
        &[&["bench", d][..], &common, &["--gen-tokens", "3", "--runs", "1", "--window-costs", "5", "--json"]].concat(),
    );
    assert!(ok, "bench --window-costs failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let times = |k: &str| -> Vec<f64> {
        v[k].as_array().unwrap_or_else(|| panic!("{k}: {v}")).iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (a, l) = (times("window_ms_argmax"), times("window_ms_logits"));
    assert_eq!((a.len(), l.len()), (5, 5), "{v}");
    assert!(a.iter().zip(&l).all(|(a, l)| *a > 0.0 && a <= l), "{v}");
    let (ok, _, err) = tensorfold(&[&["bench", d][..], &common, &["--streams", "2", "--window-costs", "4"]].concat());
    assert!(!ok && err.contains("--window-costs"), "{err}");

    let (ok, out, err) = tensorfold(
        &[&["bench", d][..], &common, &["--gen-tokens", "5", "--runs", "1", "--streams", "3", "--json"]].concat(),
    );
    assert!(ok, "bench --streams failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["streams"], 3, "{v}");
    assert!(v["aggregate_decode_tok_s"].as_f64().unwrap() > 0.0, "{v}");

    let a = run_sha(dir.path(), "5");
    assert_eq!(a, run_sha(dir.path(), "5"), "same seed, other tokens");
    assert_ne!(a, run_sha(dir.path(), "6"), "the seed changed nothing");

    // serve: the same weights (seed 5) and the same request give `run`'s tokens; the banner says the weights are
    // dummy.
    let server =
        support::Server::start_at(dir.path(), &["--load-format", "dummy", "--dummy-seed", "5", "--backend", "cpu"]);
    let body = serde_json::json!({"prompt": "Hello there", "max_tokens": 12, "temperature": 1, "top_k": 0,
        "top_p": 1, "min_p": 0, "seed": 3});
    let r = server.post_json("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["tensorfold"]["token_sha"].as_str(), Some(a.as_str()), "{v}");
    assert!(server.output().contains("dummy weights: random BF16, seed 5"), "{}", server.output());
    server.stop_cleanly();
    let (ok, help, _) = tensorfold(&["bench", "--help"]);
    assert!(ok && help.contains("--load-format") && help.contains("random weights"), "{help}");
}
