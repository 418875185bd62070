//! Structured output on the real Qwen2.5-Coder-0.5B through `tensorfold serve` and the official `openai` Python
//! package (crates/cli/tests/py/schemas_client.py): 200 generated JSON schemas, half greedy and half sampled,
//! every reply parsed and validated with `jsonschema`; drafted == serial (token_sha) on a dozen of them.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test` and exports it).

mod support;

use std::process::Command;
use std::time::Instant;
use support::Server;

#[test]
fn generated_schemas_validate_greedy_and_sampled() {
    let server = Server::start_model("qwen05", &["--parallel", "8"]);
    let py = support::test_python();
    let script = tf_testkit::repo_root().join("crates/cli/tests/py/schemas_client.py");
    let started = Instant::now();
    let out = Command::new(&py)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", "qwen2.5-coder-0.5b-instruct-q4_k_m"])
        .args(["--count", "200", "--exact", "12"])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- schemas_client.py ({:.1} s)\n{stdout}\n{stderr}", started.elapsed().as_secs_f64());
    assert!(out.status.success() && stdout.contains("ALL OK"), "{stdout}\n{stderr}\n--- server\n{}", server.output());
    server.stop_cleanly();
}
