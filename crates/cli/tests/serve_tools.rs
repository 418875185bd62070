//! Tool calls through `tensorfold serve` on Qwen2.5-Coder-0.5B, driven by the official `openai` Python package
//! (crates/cli/tests/py/tools_client.py): earlier calls and tool results through the chat template, calls parsed
//! out of chat replies and streams (streamed argument deltas add up to the non-streamed arguments, from the same
//! tokens), `tool_choice: none`, a reply cut inside its call, the Responses API's function_call items, events
//! and round trip, and 400s for bad tools, tool_choice and schemas.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test`), else `<repo>/.venv-test/bin/python`.

mod support;

use support::Server;

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

/// The template's format (Hermes, detected): rendering, no invented calls, errors.
#[test]
fn hermes_template_tools() {
    let server = Server::start_model("qwen05", &["--context", "2048"]);
    support::run_python(&server, "tools_client.py", MODEL_ID, &["--mode", "hermes"]);
    server.stop_cleanly();
}

/// `--tool-parser llama3`: a reply that is a JSON object naming a function is a call.
#[test]
fn json_reply_calls_in_chat_and_responses() {
    let server = Server::start_model("qwen05", &["--context", "2048", "--tool-parser", "llama3"]);
    support::run_python(&server, "tools_client.py", MODEL_ID, &["--mode", "json"]);
    server.stop_cleanly();
}
