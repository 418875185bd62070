//! `tensorfold serve` driven by the official `openai` Python package (crates/cli/tests/py/openai_client.py):
//! chat (streamed == non-streamed under one seed, greedy reruns, stop strings, logprobs), legacy completions
//! (string and token-id prompts, the echo + logprobs scoring form), responses (streamed event order, chaining by
//! previous_response_id), tokenize/detokenize, /metrics, the OpenAI error shapes, and 8 concurrent streams each
//! equal to the same request served alone. A second server with `--api-key` checks authentication.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test` and exports it), else
//! `<repo>/.venv-test/bin/python`; without either the test fails and says to run scripts/test.sh.

mod support;

use support::{Server, DEFAULT_MODEL_ID};

#[test]
fn openai_python_client_end_to_end() {
    let server = Server::start(&[]);
    support::run_python(&server, "openai_client.py", DEFAULT_MODEL_ID, &["--mode", "full"]);
    server.stop_cleanly();
}

#[test]
fn api_key_is_enforced_on_v1_routes() {
    let server = Server::start(&["--api-key", "secret", "--name", "tiny-chat"]);
    support::run_python(&server, "openai_client.py", "tiny-chat", &["--mode", "auth", "--api-key", "secret"]);
    server.stop_cleanly();
}
