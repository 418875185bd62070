//! Structured output on the real Qwen2.5-Coder-0.5B through `tensorfold serve` and the official `openai` Python
//! package (crates/cli/tests/py/schemas_client.py): 200 generated JSON schemas, half greedy and half sampled,
//! every finished reply parsed and validated with `jsonschema` (at most 5% may be cut at max_tokens: a small model
//! can repeat a number's digits until cut); drafted == serial (token_sha) on a dozen of them.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test` and exports it).

mod support;

use support::Server;

#[test]
fn generated_schemas_validate_greedy_and_sampled() {
    let server = Server::start_model("qwen05", &["--parallel", "8"]);
    let args = ["--count", "200", "--exact", "12"];
    support::run_python(&server, "schemas_client.py", "qwen2.5-coder-0.5b-instruct-q4_k_m", &args);
    server.stop_cleanly();
}
