//! The `curl` examples in README.md work as written: each ```sh block that starts with `curl` is run by bash
//! against a real server (the only change: the README's port 8080 becomes the test server's free port), and
//! must exit 0 with a JSON reply (or an SSE stream ending in `[DONE]`) that is not an error. A second turn of the
//! chat example then shows the prefix cache reporting cached prompt tokens.

mod support;

use std::process::Command;
use support::Server;

/// The README's curl commands, in order.
fn readme_curls() -> Vec<String> {
    let readme = std::fs::read_to_string(tf_testkit::repo_root().join("README.md")).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        if line.trim_start().starts_with("```sh") {
            in_sh = true;
        } else if line.trim_start().starts_with("```") {
            in_sh = false;
        } else if in_sh && line.trim_start().starts_with("curl ") {
            out.push(line.trim().to_string());
        }
    }
    out
}

#[test]
fn readme_curl_examples_work_as_written() {
    let curls = readme_curls();
    assert!(curls.len() >= 5, "README curl examples: {curls:?}");
    let server = Server::start(&[]);
    let base = server.base();
    let port = base.rsplit(':').next().unwrap().to_string();
    for cmd in &curls {
        assert!(cmd.contains("127.0.0.1:8080"), "the README example names the default address: {cmd}");
        let cmd = cmd.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
        let out =
            Command::new("bash").args(["-c", &format!("{cmd} --fail-with-body --max-time 120")]).output().unwrap();
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd}\nexit {:?}\n{body}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        if body.starts_with("data: ") {
            assert!(body.trim_end().ends_with("data: [DONE]"), "{cmd}: {body}");
            assert!(!body.contains("\"error\""), "{cmd}: {body}");
        } else {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{cmd}: {e}: {body}"));
            assert!(v.get("error").is_none_or(serde_json::Value::is_null), "{cmd}: {v}");
        }
    }
    // The first example again: its prompt's full blocks now come from the prefix cache.
    let first = curls[0].replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"));
    let out = Command::new("bash").args(["-c", &first]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached == v["tensorfold"]["cached_tokens"].as_u64().unwrap(), "{v}");
    server.stop_cleanly();
}
