//! Grammar-enforced replies through `tensorfold serve` on Qwen2.5-Coder-0.5B (crates/cli/tests/py/
//! tools_grammar_client.py, official `openai` package + `jsonschema`): `tool_choice` required / named (with and
//! without `parallel_tool_calls`) always yields valid calls in the template's format, `response_format`
//! json_object / json_schema, `text.format`, `guided_choice` and `guided_regex` replies hold, each drafted ==
//! serial and streamed == non-streamed by token ids, and concurrent == solo.

mod support;

use support::Server;

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

#[test]
fn forced_calls_and_structured_output_hold_under_drafts() {
    let server = Server::start_model("qwen05", &["--context", "2048"]);
    support::run_python(&server, "tools_grammar_client.py", MODEL_ID, &[]);
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
    support::run_python(
        &server,
        "tools_grammar_client.py",
        MODEL_ID,
        &["--only", "t_required_one_call,t_named,t_json_schema,t_concurrent_equals_solo"],
    );
    server.stop_cleanly();
}
