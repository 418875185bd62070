//! GET /openapi.json describes the API truthfully: schemathesis (crates/cli/tests/py/requirements.txt) generates
//! requests from it for every operation — valid ones and ones that break the schema — and checks that no answer
//! is a 5xx, that every status, content type and body (errors included: OpenAI's shape, Anthropic's under
//! /v1/messages; streamed events too) is one the document declares. The tiny Qwen3 checkpoint (fixtures/) keeps
//! each generated request cheap; the seed is fixed so a failure replays.

mod support;

use std::process::Command;
use support::{test_python, Server};

#[test]
fn schemathesis_finds_no_5xx_and_no_undocumented_answer() {
    let server = Server::start_at(&tf_testkit::repo_root().join("fixtures/tiny-qwen3"), &["--max-tokens", "16"]);
    let doc = server.get_json("/openapi.json");
    assert_eq!(doc["openapi"], "3.1.0");
    let bin = test_python().parent().expect("the python's directory").join("schemathesis");
    let reports = tempfile::tempdir().unwrap();
    let out = Command::new(&bin)
        .args(["run", &format!("{}/openapi.json", server.base())])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        .args(["--max-examples", "30", "--seed", "1", "--request-timeout", "60"])
        .arg("--report-dir")
        .arg(reports.path())
        .current_dir(reports.path())
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "schemathesis found failures ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("passed") && !stdout.contains("failures,"), "{stdout}");
    server.stop_cleanly();
}
