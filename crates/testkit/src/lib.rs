//! Test helpers shared by the crates' integration tests: the real models fetched by
//! `scripts/fetch-models.sh`, the reference fixtures under `fixtures/`, and random op inputs ([`rows`]).

pub mod alloc;
pub mod rows;

use std::path::PathBuf;

/// The real GGUF models: (short name used by fixtures and the fetch script, file name under `models/`).
pub const MODELS: [(&str, &str); 4] = [
    ("smollm2", "smollm2-135m-instruct-q4_1.gguf"),
    ("qwen05", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ("qwen15", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    ("gemma3", "gemma-3-270m-q4_k_m.gguf"),
];

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The path of a real model by short name. Panics with the command that fetches it when it is missing:
/// a test that needs a model must not pass without it.
pub fn model_path(short: &str) -> PathBuf {
    let file = MODELS.iter().find(|(s, _)| *s == short).unwrap_or_else(|| panic!("unknown model '{short}'")).1;
    let dir =
        std::env::var_os("TENSORFOLD_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models.sh all` (the test suite, scripts/test.sh, does this first)",
        path.display()
    );
    path
}

/// A fixture file under `fixtures/`, parsed as JSON.
pub fn fixture(rel: &str) -> serde_json::Value {
    let path = repo_root().join("fixtures").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
