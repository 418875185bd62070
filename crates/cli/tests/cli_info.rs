//! `tensorfold info` as a user runs it: on the four real models (facts checked against ../shared/models.md),
//! on a Hugging Face directory, on a hub id in a local HF cache, and on broken inputs (non-zero exit, one line).

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn tensorfold(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tensorfold"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run tensorfold")
}

fn info_json(model: &Path) -> Value {
    let out = tensorfold(&["info", "--json", model.to_str().unwrap()], &[]);
    assert!(out.status.success(), "info failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("info --json prints JSON")
}

/// (model, family, layers, hidden, heads, kv heads, vocab) as ../shared/models.md states them.
const FACTS: [(&str, &str, u64, u64, u64, u64, u64); 4] = [
    ("smollm2", "llama", 30, 576, 9, 3, 49_152),
    ("qwen05", "qwen2", 24, 896, 14, 2, 151_936),
    ("qwen15", "qwen2", 28, 1536, 12, 2, 151_936),
    ("gemma3", "gemma3", 18, 640, 4, 1, 262_144),
];

#[test]
fn info_on_real_models_reports_their_facts() {
    for (short, family, layers, hidden, heads, kv, vocab) in FACTS {
        let path = tf_testkit::model_path(short);
        let j = info_json(&path);
        assert_eq!(j["family"], family, "{short}");
        assert_eq!(j["format"], "GGUF v3", "{short}");
        assert_eq!(j["layers"], layers, "{short}");
        assert_eq!(j["hidden"], hidden, "{short}");
        assert_eq!(j["heads"], heads, "{short}");
        assert_eq!(j["kv_heads"], kv, "{short}");
        assert_eq!(j["vocab"], vocab, "{short}");
        assert!(j["context"].as_u64().unwrap() >= 8192, "{short}");
        // Weight bytes are the file minus its header: within 1% of the file size.
        let size = std::fs::metadata(&path).unwrap().len() as f64;
        let w = j["weight_bytes"].as_f64().unwrap();
        assert!(w <= size && w > size * 0.9, "{short}: weights {w} vs file {size}");
        assert!(j["memory_bytes"].as_u64().unwrap() > j["weight_bytes"].as_u64().unwrap());
        let n_types: u64 = j["tensor_types"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert!(n_types > 100, "{short}: tensor counts");
        assert_eq!(j["chat_template"], short != "gemma3", "{short}: the Gemma 3 base GGUF has no template");

        // KV bytes per token from the shape ../shared/models.md gives (head dim = hidden / heads, but Gemma 3's
        // is 256): f32 by default, and as `--kv-type` stores them (f16: 2 bytes a value; q8_0: 34 per 32).
        let hd = if short == "gemma3" { 256 } else { hidden / heads };
        let values = 2 * layers * kv * hd;
        assert_eq!(j["kv_type"], "f32", "{short}");
        assert_eq!(j["kv_bytes_per_token"].as_u64(), Some(4 * values), "{short}");
        for (ty, bytes) in [("f16", 2 * values), ("q8_0", values / 32 * 34)] {
            let out = tensorfold(&["info", "--json", "--kv-type", ty, path.to_str().unwrap()], &[]);
            let k: Value = serde_json::from_slice(&out.stdout).expect("info --json prints JSON");
            assert_eq!(
                (k["kv_type"].as_str(), k["kv_bytes_per_token"].as_u64()),
                (Some(ty), Some(bytes)),
                "{short} {ty}"
            );
            let ctx = k["memory_context"].as_u64().unwrap();
            assert_eq!(
                k["memory_bytes"].as_u64(),
                Some(k["weight_bytes"].as_u64().unwrap() + bytes * ctx),
                "{short} {ty}"
            );
        }
        let text = tensorfold(&["info", path.to_str().unwrap()], &[]);
        let text = String::from_utf8(text.stdout).unwrap();
        for key in ["family", "tensor types", "layers", "heads", "context", "vocab", "memory", "chat template"] {
            assert!(text.lines().any(|l| l.starts_with(key)), "{short}: text report lacks '{key}':\n{text}");
        }
    }
}

#[test]
fn info_on_corrupt_files_fails_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::read(tf_testkit::model_path("smollm2")).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.gguf", real[..real.len() / 2].to_vec(), "past the end"),
        ("header-only.gguf", real[..100].to_vec(), "truncated"),
        ("not-gguf.gguf", b"hello world, not a model".to_vec(), "not a GGUF file"),
        ("empty.gguf", Vec::new(), "not a GGUF file"),
    ];
    for (name, bytes, expect) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = tensorfold(&["info", p.to_str().unwrap()], &[]);
        assert!(!out.status.success(), "{name}: exit status must be non-zero");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{name}: one line, got:\n{err}");
        assert!(err.starts_with("error: ") && err.contains(name) && err.contains(expect), "{name}: {err}");
    }
    let out = tensorfold(&["info", "/no/such/model.gguf"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("no such file"));
}

fn hf_fixture() -> std::path::PathBuf {
    tf_testkit::repo_root().join("crates/loader/tests/fixtures/st_sharded")
}

#[test]
fn info_on_a_hugging_face_directory() {
    let j = info_json(&hf_fixture());
    assert_eq!(j["family"], "qwen2");
    assert_eq!(j["format"], "safetensors (2 shards)");
    assert_eq!(j["tensor_types"]["BF16"], 26);
    assert_eq!(j["layers"], 2);
}

#[test]
fn info_on_a_hub_id_reads_the_local_cache() {
    // A cache laid out as huggingface_hub lays it: refs/main -> commit, snapshots/<commit>/ files.
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--tiny--qwen");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for e in std::fs::read_dir(hf_fixture()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), snap.join(e.file_name())).unwrap();
    }
    let out = tensorfold(&["info", "--json", "tiny/qwen"], &[("HF_HUB_CACHE", cache.path())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["family"], "qwen2");
    assert!(j["path"].as_str().unwrap().contains(commit));

    let out = tensorfold(&["info", "tiny/other"], &[("HF_HUB_CACHE", cache.path())]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr).unwrap().contains("tensorfold pull tiny/other"));
}
