//! Tool calls through `tensorfold serve` on Qwen2.5-Coder-0.5B, driven by the official `openai` Python package
//! (crates/cli/tests/py/tools_client.py): earlier calls and tool results through the chat template, calls parsed
//! out of chat replies and streams (streamed argument deltas add up to the non-streamed arguments, from the same
//! tokens), `tool_choice: none`, a reply cut inside its call, the Responses API's function_call items, events
//! and round trip, and 400s for bad tools, tool_choice and schemas.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test`), else `<repo>/.venv-test/bin/python`.

mod support;

use std::process::Command;
use std::time::Instant;
use support::Server;

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

fn run_client(server: &Server, mode: &str) {
    let py = support::test_python();
    let script = tf_testkit::repo_root().join("crates/cli/tests/py/tools_client.py");
    let started = Instant::now();
    let out = Command::new(&py)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", MODEL_ID, "--mode", mode])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {} {mode} ({:.1} s)\n{stdout}", script.display(), started.elapsed().as_secs_f64());
    if !stderr.is_empty() {
        println!("--- python stderr\n{stderr}");
    }
    assert!(
        out.status.success(),
        "the tools client failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
    assert!(stdout.contains("ALL OK"), "the script did not reach its end:\n{stdout}");
}

/// The template's format (Hermes, detected): rendering, no invented calls, errors.
#[test]
fn hermes_template_tools() {
    let server = Server::start_model("qwen05", &["--context", "2048"]);
    run_client(&server, "hermes");
    server.stop_cleanly();
}

/// `--tool-parser llama3`: a reply that is a JSON object naming a function is a call.
#[test]
fn json_reply_calls_in_chat_and_responses() {
    let server = Server::start_model("qwen05", &["--context", "2048", "--tool-parser", "llama3"]);
    run_client(&server, "json");
    server.stop_cleanly();
}
