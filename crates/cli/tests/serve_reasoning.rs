//! Reasoning through `tensorfold serve` on the tiny Qwen3 checkpoint (`fixtures/tiny-qwen3`, Qwen3's thinking chat
//! template), driven by the official `openai` Python package (crates/cli/tests/py/reasoning_client.py): thinking
//! budgets forcing `</think>` after N tokens, `reasoning_content` / reasoning items split from the content,
//! streamed == non-streamed, drafted == serial (the server runs with `--min-drafts 1`, so windows really run), a
//! forced tool call after thinking, `enable_thinking` and `reasoning_effort` reaching the template, and
//! `--reasoning-parser none`.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test`), else `<repo>/.venv-test/bin/python`.

mod support;

use support::Server;

/// The id `serve` gives a Hugging Face directory: its name.
const MODEL_ID: &str = "tiny-qwen3";

/// `tensorfold serve fixtures/tiny-qwen3 --min-drafts 1` (windows run on every round) with `extra`.
fn tiny_server(extra: &[&str]) -> Server {
    let dir = tf_testkit::repo_root().join("fixtures/tiny-qwen3");
    let flags: Vec<&str> = ["--min-drafts", "1", "--no-live-line"].into_iter().chain(extra.iter().copied()).collect();
    Server::start_at(&dir, &flags)
}

/// The template's parser (Qwen3): budgets, the split, streams, drafts, a call after thinking, template controls.
#[test]
fn thinking_budget_and_split() {
    let server = tiny_server(&[]);
    assert!(server.output().contains(MODEL_ID), "the server does not name the model `{MODEL_ID}`");
    support::run_python(&server, "reasoning_client.py", MODEL_ID, &["--mode", "split"]);
    server.stop_cleanly();
}

/// `--reasoning-parser none`: thinking stays in the content; the budget still applies.
#[test]
fn parser_none_keeps_thinking_in_content() {
    let server = tiny_server(&["--reasoning-parser", "none"]);
    support::run_python(&server, "reasoning_client.py", MODEL_ID, &["--mode", "none"]);
    server.stop_cleanly();
}
