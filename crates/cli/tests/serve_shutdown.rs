//! `tensorfold serve` stopping under load: after SIGTERM it takes no new connection, the streams already running
//! finish whole (the drain) and it exits 0; a second SIGTERM cancels what still runs at once (finish_reason
//! "abort", then `[DONE]`) instead of waiting out `--shutdown-timeout`.

mod support;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{build_request, Server, DEFAULT_MODEL_ID, IO_BOUND};

/// A streamed chat request on its own connection, read from a thread: sends `()` on `first` once the first
/// event arrived, and returns every `data:` payload.
fn stream(port: u16, max_tokens: usize, salt: usize, first: mpsc::Sender<()>) -> std::thread::JoinHandle<Vec<String>> {
    let body = json!({"model": DEFAULT_MODEL_ID, "stream": true, "max_tokens": max_tokens, "temperature": 0,
                      "messages": [{"role": "user", "content": format!("Count slowly from {salt} onward.")}]});
    let req = build_request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(IO_BOUND)).unwrap();
        s.write_all(&req).unwrap();
        let mut data = Vec::new();
        let mut signalled = false;
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { break };
            if let Some(d) = line.strip_prefix("data: ") {
                data.push(d.to_owned());
                if !signalled {
                    let _ = first.send(());
                    signalled = true;
                }
                if d == "[DONE]" {
                    break;
                }
            }
        }
        data
    })
}

/// The finish_reason of a stream's events, and how many content pieces it carried.
fn finish(events: &[String]) -> (Option<String>, usize) {
    let mut reason = None;
    let mut pieces = 0;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("event {e:?}: {err}"));
        if let Some(c) = v["choices"].get(0) {
            if c["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()) {
                pieces += 1;
            }
            if let Some(r) = c["finish_reason"].as_str() {
                reason = Some(r.to_owned());
            }
        }
    }
    (reason, pieces)
}

#[test]
fn sigterm_drains_running_streams_and_refuses_new_connections() {
    let mut server = Server::start(&["--shutdown-timeout", "60", "--parallel", "4"]);
    let port = server.port;
    let (tx, rx) = mpsc::channel();
    let streams: Vec<_> = (0..4).map(|i| stream(port, 48, i, tx.clone())).collect();
    for _ in 0..4 {
        rx.recv_timeout(IO_BOUND).expect("every stream started");
    }
    server.signal("TERM");
    server.wait_output("shutting down", 1, Duration::from_secs(20));
    // No new connection is served once the listener is closed (refused, or closed without an answer).
    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
        s.set_read_timeout(Some(IO_BOUND)).unwrap();
        let _ = s.write_all(&build_request("GET", "/health", &[], b""));
        let mut got = String::new();
        let _ = BufReader::new(s).read_line(&mut got);
        assert!(!got.contains(" 200 "), "a new connection was served after SIGTERM: {got:?}");
    }
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        let (reason, pieces) = finish(&events);
        assert_eq!(reason.as_deref(), Some("length"), "stream {i} did not finish whole: {events:?}");
        assert!(pieces > 0 && events.last().map(String::as_str) == Some("[DONE]"), "stream {i}: {events:?}");
    }
    let status = server.wait_exit();
    assert!(status.success(), "exit after the drain: {status}\n{}", server.output());
}

#[test]
fn a_second_sigterm_cancels_the_running_streams_at_once() {
    let mut server = Server::start(&["--shutdown-timeout", "600", "--parallel", "2", "--context", "8192"]);
    let port = server.port;
    let (tx, rx) = mpsc::channel();
    let streams: Vec<_> = (0..2).map(|i| stream(port, 8000, i, tx.clone())).collect();
    for _ in 0..2 {
        rx.recv_timeout(IO_BOUND).expect("every stream started");
    }
    server.signal("TERM");
    server.wait_output("shutting down", 1, Duration::from_secs(20));
    let second = Instant::now();
    server.signal("TERM");
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        let (reason, _) = finish(&events);
        assert_eq!(reason.as_deref(), Some("abort"), "stream {i}: {:?}", events.last());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "stream {i}");
    }
    let status = server.wait_exit();
    // 8000 tokens take minutes here and the timeout is 600 s: an exit this soon is the second signal's doing.
    assert!(second.elapsed() < Duration::from_secs(60), "exit took {:?}", second.elapsed());
    assert!(status.success(), "exit after the second SIGTERM: {status}\n{}", server.output());
}
