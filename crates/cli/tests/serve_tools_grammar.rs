//! Grammar-enforced replies through `tensorfold serve` on Qwen2.5-Coder-0.5B (crates/cli/tests/py/
//! tools_grammar_client.py, official `openai` package + `jsonschema`): `tool_choice` required / named (with and
//! without `parallel_tool_calls`) always yields valid calls in the template's format, `response_format`
//! json_object / json_schema, `text.format`, `guided_choice` and `guided_regex` replies hold, each drafted ==
//! serial and streamed == non-streamed by token ids, and concurrent == solo.

mod support;

use std::process::Command;
use std::time::Instant;
use support::Server;

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

#[test]
fn forced_calls_and_structured_output_hold_under_drafts() {
    let server = Server::start_model("qwen05", &["--context", "2048"]);
    run_client(&server, &[]);
    server.stop_cleanly();
}

/// The same checks with a draft model (the 0.5B drafting for itself, so its drafts are often right) and tree
/// windows of context copies (3 candidates), every round verifying a draft.
#[test]
fn forced_calls_and_structured_output_hold_with_a_draft_model_and_trees() {
    let drafter = tf_testkit::model_path("qwen05");
    let drafter = drafter.to_str().expect("a UTF-8 path");
    let extra = ["--context", "2048", "--drafter", drafter, "--min-drafts", "1", "--draft-branches", "3"];
    let server = Server::start_model("qwen05", &extra);
    run_client(&server, &["--only", "t_required_one_call,t_named,t_json_schema,t_concurrent_equals_solo"]);
    server.stop_cleanly();
}

/// Runs the grammar client against `server` with `args`; asserts it reached "ALL OK".
fn run_client(server: &Server, args: &[&str]) {
    let py = support::test_python();
    let script = tf_testkit::repo_root().join("crates/cli/tests/py/tools_grammar_client.py");
    let started = Instant::now();
    let out = Command::new(&py)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", MODEL_ID])
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {} ({:.1} s)\n{stdout}", script.display(), started.elapsed().as_secs_f64());
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "the grammar client failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
}
