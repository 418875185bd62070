//! Reasoning through `tensorfold serve` on the tiny Qwen3 checkpoint (`fixtures/tiny-qwen3`, Qwen3's thinking chat
//! template), driven by the official `openai` Python package (crates/cli/tests/py/reasoning_client.py): thinking
//! budgets forcing `</think>` after N tokens, `reasoning_content` / reasoning items split from the content,
//! streamed == non-streamed, drafted == serial (the server runs with `--min-drafts 1`, so windows really run), a
//! forced tool call after thinking, `enable_thinking` and `reasoning_effort` reaching the template, and
//! `--reasoning-parser none`.
//!
//! The Python comes from `$TF_TEST_PYTHON` (scripts/test.sh makes `.venv-test`), else `<repo>/.venv-test/bin/python`.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The id `serve` gives a Hugging Face directory: its name.
const MODEL_ID: &str = "tiny-qwen3";

/// `tensorfold serve fixtures/tiny-qwen3` on a free port; SIGTERM and a bounded wait on drop.
struct TinyServer {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl TinyServer {
    fn start(extra: &[&str]) -> TinyServer {
        let dir = tf_testkit::repo_root().join("fixtures/tiny-qwen3");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
            .arg("serve")
            .arg(&dir)
            .args(["--host", "127.0.0.1", "--port", "0", "--threads", "2", "--min-drafts", "1", "--no-live-line"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tensorfold serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[server] {line}");
                log2.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let marker = "listening on http://127.0.0.1:";
        let deadline = Instant::now() + support::START_BOUND;
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(marker) {
                        let digits: String =
                            line[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
                        break digits.parse::<u16>().expect("port");
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("serve {extra:?} did not start ({e}):\n{}", log.lock().unwrap().join("\n"));
                }
            }
        };
        TinyServer { child, port, log }
    }

    fn output(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, then the exit status within the stop bound.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
        let deadline = Instant::now() + support::STOP_BOUND;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "serve exited with {status}:\n{}", self.output());
                return;
            }
            assert!(Instant::now() < deadline, "serve did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TinyServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run_client(server: &TinyServer, mode: &str) {
    let py = support::test_python();
    let script = tf_testkit::repo_root().join("crates/cli/tests/py/reasoning_client.py");
    let started = Instant::now();
    let out = Command::new(&py)
        .arg(&script)
        .args(["--base-url", &format!("http://127.0.0.1:{}/v1", server.port), "--model", MODEL_ID, "--mode", mode])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- reasoning_client.py {mode} ({:.1} s)\n{stdout}", started.elapsed().as_secs_f64());
    if !stderr.is_empty() {
        println!("--- python stderr\n{stderr}");
    }
    assert!(
        out.status.success(),
        "the reasoning client failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
    assert!(stdout.contains("ALL OK"), "the script did not reach its end:\n{stdout}");
}

/// The template's parser (Qwen3): budgets, the split, streams, drafts, a call after thinking, template controls.
#[test]
fn thinking_budget_and_split() {
    let server = TinyServer::start(&[]);
    assert!(server.output().contains(MODEL_ID), "the server does not name the model `{MODEL_ID}`");
    run_client(&server, "split");
    server.stop();
}

/// `--reasoning-parser none`: thinking stays in the content; the budget still applies.
#[test]
fn parser_none_keeps_thinking_in_content() {
    let server = TinyServer::start(&["--reasoning-parser", "none"]);
    run_client(&server, "none");
    server.stop();
}
