//! `tensorfold check`, the exactness receipt, as CI runs it: on SmolLM2 with context copies and on a tiny
//! synthetic target/draft pair (two random 2-layer checkpoints sharing a 256-token byte-level vocabulary) and the
//! tiny hybrid (recurrent-state) checkpoint with context copies.
//! Every reply drafted must equal the serial reply by token ids, greedy and sampled, and every drafted round
//! must verify at least one draft (`min_rows` ≥ 2) except in constrained replies, where the grammar cuts the drafts
//! it rejects. On SmolLM2 the constrained kind (a JSON-schema grammar per request) runs too and its replies are
//! valid JSON under their schema; the byte-level tokenizer of the tiny pair has no end-of-sequence id, so no
//! grammar can end there and that kind is left out.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn check(model: &Path, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(["check", model.to_str().unwrap(), "--json", "--threads", "2"])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "check failed:\n{stderr}\n{stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn assert_exact(report: &Value, min_cases: usize, kinds_expected: usize) {
    assert_eq!(report["mismatches"], 0, "{report}");
    let cases = report["cases"].as_array().unwrap();
    assert!(cases.len() >= min_cases, "{} cases", cases.len());
    let (mut drafted, mut accepted) = (0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    let mut samplings = std::collections::BTreeSet::new();
    for c in cases {
        assert_eq!(c["equal"], true, "{c}");
        assert_eq!(c["token_sha"], c["serial_token_sha"], "{c}");
        if c["kind"] == "constrained" {
            assert_eq!(c["json"], "valid", "{c}");
        } else {
            assert_eq!(c["json"], Value::Null, "{c}");
            if c["rounds"].as_u64().unwrap() > 0 {
                assert!(c["min_rows"].as_u64().unwrap() >= 2, "a drafted reply ran a one-row round: {c}");
            }
        }
        drafted += c["drafted"].as_u64().unwrap();
        accepted += c["accepted"].as_u64().unwrap();
        kinds.insert(c["kind"].as_str().unwrap().to_string());
        samplings.insert(c["sampling"].as_str().unwrap().to_string());
    }
    assert_eq!(kinds.len(), kinds_expected, "{kinds:?}");
    assert!(samplings.contains("greedy") && samplings.len() >= 2, "{samplings:?}");
    assert!(drafted > 0 && accepted > 0, "drafted {drafted}, accepted {accepted}");
}

#[test]
fn smollm2_with_context_copies_equals_serial() {
    let model = tf_testkit::model_path("smollm2");
    let report = check(&model, &["--per-kind", "1", "--seeds", "1", "--max-tokens", "32"]);
    assert_exact(&report, 12, 6);
    let constrained = report["cases"].as_array().unwrap().iter().filter(|c| c["kind"] == "constrained").count();
    assert_eq!(constrained, 2, "{report}");
}

/// A model directory from a tiny fixture checkpoint plus the byte-level tokenizer; its context is raised from
/// 128 to 2048 positions (the suite's prompts are long in bytes; the weights are random either way).
fn tiny_model(dir: &Path, fixture: &str) {
    let root = tf_testkit::repo_root();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(root.join("fixtures/tiny").join(fixture).join("model.safetensors"), dir.join("model.safetensors"))
        .unwrap();
    let cfg = std::fs::read_to_string(root.join("fixtures/tiny").join(fixture).join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&cfg).unwrap();
    cfg["max_position_embeddings"] = 2048.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(root.join("fixtures/tiny/byte-tokenizer.json"), dir.join("tokenizer.json")).unwrap();
}

#[test]
fn tiny_target_with_a_tiny_draft_model_equals_serial() {
    let tmp = tempfile::tempdir().unwrap();
    let (target, draft) = (tmp.path().join("target"), tmp.path().join("draft"));
    tiny_model(&target, "llama");
    tiny_model(&draft, "llama3");
    let report = check(&target, &["--drafter", draft.to_str().unwrap(), "--seeds", "2", "--max-tokens", "48"]);
    assert!(report["drafter"].as_str().unwrap().contains("draft model"), "{report}");
    assert_exact(&report, 90, 5);
}

/// The hybrid family (Mamba-2 layers whose recurrent state rolls back on every rejected draft): the suite's
/// replies drafted by context copies equal their serial replies. Random weights make most drafts wrong, so windows
/// end rejected at every depth.
#[test]
fn tiny_hybrid_with_context_copies_equals_serial() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("hybrid");
    tiny_model(&target, "nemotron_h");
    let report = check(&target, &["--seeds", "1", "--max-tokens", "32"]);
    assert_exact(&report, 50, 5);
}
