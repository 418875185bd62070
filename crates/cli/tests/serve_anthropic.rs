//! Anthropic's Messages API through `tensorfold serve`, driven by the official `anthropic` Python package
//! (crates/cli/tests/py/anthropic_client.py) on Qwen2.5-Coder-0.5B: create, stream (text_stream and raw event
//! order), stop sequences, forced tool_use (any / tool) valid under input_schema, a tool round trip,
//! count_tokens, drafted == serial, and the SDK's error classes for 400, 401, 404, 413 and 429; plus the raw SSE
//! framing (an `event:` line naming each event's type) and `x-api-key` on every route. A thinking budget runs on
//! the tiny Qwen3 fixture (`fixtures/tiny-qwen3`).
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test`), else `<repo>/.venv-test/bin/python`.

mod support;

use serde_json::{json, Value};
use support::{http, Server};

const MODEL_ID: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const KEY: &str = "sk-test-anthropic";

/// The server flags the client's 401, 413 and 429 checks rely on.
const FLAGS: [&str; 10] =
    ["--context", "2048", "--api-key", KEY, "--parallel", "1", "--max-queue", "1", "--max-body-mib", "1"];

#[test]
fn messages_api_through_the_anthropic_sdk() {
    let server = Server::start_model("qwen05", &FLAGS);
    raw_sse_and_keys(server.port);
    support::run_python(&server, "anthropic_client.py", MODEL_ID, &["--api-key", KEY]);
    server.stop_cleanly();
}

/// A thinking budget of 4 tokens on the tiny Qwen3 (Qwen3's thinking template).
#[test]
fn thinking_budget_on_tiny_qwen3() {
    let dir = tf_testkit::repo_root().join("fixtures/tiny-qwen3");
    let server = Server::start_at(&dir, &["--min-drafts", "1", "--no-live-line", "--api-key", KEY]);
    support::run_python(
        &server,
        "anthropic_client.py",
        "tiny-qwen3",
        &["--api-key", KEY, "--only", "t_thinking_budget"],
    );
    server.stop_cleanly();
}

/// The SSE framing (each event an `event:` line with its type, then a `data:` line), the key as `x-api-key` or a
/// bearer token on both API families, each family's error shape, and `anthropic-version` accepted.
fn raw_sse_and_keys(port: u16) {
    let body = json!({"model": MODEL_ID, "max_tokens": 8, "temperature": 0, "stream": true,
                      "messages": [{"role": "user", "content": "Say hi."}]})
    .to_string();
    let headers = [("Content-Type", "application/json"), ("x-api-key", KEY), ("anthropic-version", "2023-06-01")];
    let r = http(port, "POST", "/v1/messages", &headers, body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.text();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut lines = e.lines();
            let ev =
                lines.next().and_then(|l| l.strip_prefix("event: ")).unwrap_or_else(|| panic!("no event line: {e:?}"));
            let data =
                lines.next().and_then(|l| l.strip_prefix("data: ")).unwrap_or_else(|| panic!("no data line: {e:?}"));
            assert!(lines.next().is_none(), "more than two lines: {e:?}");
            (ev.to_string(), serde_json::from_str(data).expect("data is JSON"))
        })
        .collect();
    for (ev, data) in &events {
        assert_eq!(data["type"], ev.as_str(), "event line and data type differ");
    }
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["usage"]["output_tokens"], 8, "{delta}");
    assert_eq!(delta["tensorfold"]["token_sha"].as_str().map(str::len), Some(12), "{delta}");

    let plain =
        json!({"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}).to_string();
    let chat = json!({"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}).to_string();
    let json_ct = ("Content-Type", "application/json");
    let bearer = format!("Bearer {KEY}");
    for (path, body) in [("/v1/messages/count_tokens", &plain), ("/v1/chat/completions", &chat)] {
        for auth in [("x-api-key", KEY), ("Authorization", bearer.as_str())] {
            let r = http(port, "POST", path, &[json_ct, auth], body.as_bytes());
            assert_eq!(r.status, 200, "{path} with {}: {}", auth.0, r.text());
        }
        let r = http(port, "POST", path, &[json_ct, ("x-api-key", "nope")], body.as_bytes());
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        let e = r.json();
        if path.starts_with("/v1/messages") {
            assert_eq!((&e["type"], &e["error"]["type"]), (&json!("error"), &json!("authentication_error")), "{e}");
        } else {
            assert_eq!(e["error"]["type"], "authentication_error", "{e}");
            assert!(e.get("type").is_none() && e["error"].get("code").is_some(), "OpenAI shape: {e}");
        }
    }
    // Unknown routes under /v1/messages answer in Anthropic's shape.
    let r = http(port, "POST", "/v1/messages/batches", &[json_ct, ("x-api-key", KEY)], b"{}");
    assert_eq!((r.status, r.json()["error"]["type"].clone()), (404, json!("not_found_error")), "{}", r.text());
}
