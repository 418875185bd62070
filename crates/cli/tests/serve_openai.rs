//! `tensorfold serve` driven by the official `openai` Python package (crates/cli/tests/py/openai_client.py):
//! chat (streamed == non-streamed under one seed, greedy reruns, stop strings, logprobs), legacy completions
//! (string and token-id prompts, the echo + logprobs scoring form), responses (streamed event order, chaining by
//! previous_response_id), tokenize/detokenize, /metrics, the OpenAI error shapes, and 8 concurrent streams each
//! equal to the same request served alone. A second server with `--api-key` checks authentication.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test` and exports it), else
//! `<repo>/.venv-test/bin/python`; without either the test fails and says to run scripts/test.sh.

mod support;

use std::process::Command;
use std::time::Instant;
use support::{Server, DEFAULT_MODEL_ID};

/// Runs the client script against `server` with `args`, echoing its output; asserts it exits 0.
fn run_client(server: &Server, model: &str, args: &[&str]) {
    let py = support::test_python();
    let script = tf_testkit::repo_root().join("crates/cli/tests/py/openai_client.py");
    let started = Instant::now();
    let out = Command::new(&py)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", model])
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {} {args:?} ({:.1} s)\n{stdout}", script.display(), started.elapsed().as_secs_f64());
    if !stderr.is_empty() {
        println!("--- python stderr\n{stderr}");
    }
    assert!(
        out.status.success(),
        "the openai client script failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
    assert!(stdout.contains("ALL OK"), "the script did not reach its end:\n{stdout}");
}

#[test]
fn openai_python_client_end_to_end() {
    let server = Server::start(&[]);
    run_client(&server, DEFAULT_MODEL_ID, &["--mode", "full"]);
    server.stop_cleanly();
}

#[test]
fn api_key_is_enforced_on_v1_routes() {
    let server = Server::start(&["--api-key", "secret", "--name", "tiny-chat"]);
    run_client(&server, "tiny-chat", &["--mode", "auth", "--api-key", "secret"]);
    server.stop_cleanly();
}
