//! Tool calls through `tensorfold serve` on Qwen2.5-Coder-0.5B, driven by the official `openai` JavaScript SDK
//! (crates/cli/tests/js/tools_client.mjs, the version pinned in crates/cli/tests/js/package.json): a streamed chat
//! with `tools` and `tool_choice: "required"` whose argument deltas add up to the non-streamed call with the same
//! `token_sha`, and the SDK's tool-running helper `chat.completions.runTools` (named and required tool_choice,
//! non-streamed and streamed) calling a JS function on the parsed arguments and sending its result back.
//!
//! Needs `node` on PATH and crates/cli/tests/js/node_modules (scripts/test.sh runs `npm ci` there).

mod support;

use std::process::Command;
use std::time::Instant;
use support::Server;

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

#[test]
fn openai_js_sdk_streams_tool_calls_and_runs_tools() {
    let dir = tf_testkit::repo_root().join("crates/cli/tests/js");
    assert!(
        dir.join("node_modules/openai/package.json").is_file(),
        "crates/cli/tests/js/node_modules has no `openai` package: run scripts/test.sh (it runs \
         `npm ci --prefix crates/cli/tests/js --no-audit --no-fund`)"
    );
    let server = Server::start_model("qwen05", &["--context", "2048"]);
    let script = dir.join("tools_client.mjs");
    let started = Instant::now();
    let out = Command::new("node")
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", MODEL_ID])
        .output()
        .unwrap_or_else(|e| panic!("run `node` (Node.js 20 or later on PATH): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {} ({:.1} s)\n{stdout}", script.display(), started.elapsed().as_secs_f64());
    if !stderr.is_empty() {
        println!("--- node stderr\n{stderr}");
    }
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "the JS tools client failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
    server.stop_cleanly();
}
