//! `tensorfold serve` against slow and stalled clients, the connection cap and API key files: half-open
//! connections (part of a header, then nothing) and bodies trickled a byte at a time are closed once
//! `--header-timeout` / `--body-timeout` pass, while `/health` and a chat request are answered; past
//! `--max-connections` a connection gets a 503 in its route's error shape; `--api-key-file` keys are accepted,
//! reloaded on SIGHUP (an unreadable or empty file keeps the keys in use) and never printed; a refused key's
//! answer says the connection closes.

mod support;

use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{build_request, exchange, http, parse_response, Server, DEFAULT_MODEL_ID};

const HALF_HEADER: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-";

/// A connection that sent `bytes` and then stalls.
fn stalled(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(bytes).expect("write");
    s
}

/// Reads until the server closes the connection (EOF or reset), at most `bound`: what it sent, and when it closed.
fn read_until_closed(mut s: TcpStream, bound: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    s.set_read_timeout(Some(bound)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the connection was still open after {:?} ({e})", start.elapsed()),
        }
    }
    (got, start.elapsed())
}

fn chat_body() -> Vec<u8> {
    json!({"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
           "temperature": 0})
    .to_string()
    .into_bytes()
}

#[test]
fn stalled_and_trickling_clients_are_closed_while_others_are_served() {
    let server = Server::start(&["--header-timeout", "2", "--body-timeout", "3", "--max-connections", "256"]);
    let port = server.port;
    let half_open: Vec<TcpStream> = (0..100).map(|_| stalled(port, HALF_HEADER)).collect();
    // Complete headers announcing 64 body bytes, then one byte now and then from a feeder thread.
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Content-Length: 64\r\n\r\n{";
    let trickling: Vec<TcpStream> = (0..20).map(|_| stalled(port, head)).collect();
    let feeds: Vec<TcpStream> = trickling.iter().map(|s| s.try_clone().unwrap()).collect();
    let feeder = std::thread::spawn(move || {
        for _ in 0..40 {
            for mut f in &feeds {
                let _ = f.write_all(b" ");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });

    // Served meanwhile.
    let h = http(port, "GET", "/health", &[], b"");
    assert_eq!(h.status, 200, "{}", h.text());
    let r = http(port, "POST", "/v1/chat/completions", &[("Content-Type", "application/json")], &chat_body());
    assert_eq!(r.status, 200, "{}", r.text());

    // Every stalled connection is closed by the server: the half-open ones after the header timeout, the
    // trickling ones with a 408 after the body timeout (the bound leaves room for a loaded machine).
    let bound = Duration::from_secs(20);
    for s in half_open {
        let (got, _) = read_until_closed(s, bound);
        if !got.is_empty() {
            let resp = parse_response(&got).expect("an HTTP response");
            assert!(resp.status < 500 && resp.status >= 400, "half-open connection answered {}", resp.status);
        }
    }
    for s in trickling {
        let (got, _) = read_until_closed(s, bound);
        let resp = parse_response(&got).expect("a 408 response before the close");
        assert_eq!(resp.status, 408, "{}", resp.text());
        let e = &resp.json()["error"];
        assert_eq!(e["code"], "request_timeout", "{}", resp.text());
        assert_eq!(e["type"], "invalid_request_error");
    }
    feeder.join().unwrap();
    let h = http(port, "GET", "/health", &[], b"");
    assert_eq!(h.status, 200);
    server.stop_cleanly();
}

#[test]
fn past_the_connection_cap_a_connection_gets_503_in_its_routes_error_shape() {
    let server = Server::start(&["--header-timeout", "3", "--max-connections", "8"]);
    let port = server.port;
    let held: Vec<TcpStream> = (0..8).map(|_| stalled(port, HALF_HEADER)).collect();
    // A full request on a ninth connection: 503 (the listener's queue hands connections over in the order
    // they were made, so the eight held ones hold the slots).
    let over = |path: &str| {
        let r = exchange(port, build_request("POST", path, &[("Content-Type", "application/json")], &chat_body()))
            .expect("a response");
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        r.json()
    };
    let openai = over("/v1/chat/completions");
    assert_eq!(openai["error"]["code"], "too_many_connections", "{openai}");
    assert!(openai["error"]["message"].as_str().unwrap().contains("8 connections"), "{openai}");
    let anthropic = over("/v1/messages");
    assert_eq!(anthropic["type"], "error", "{anthropic}");
    assert_eq!(anthropic["error"]["type"], "overloaded_error", "{anthropic}");

    // Once the header timeout closes the held connections, requests are served again.
    for s in held {
        read_until_closed(s, Duration::from_secs(20));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http(port, "GET", "/health", &[], b"");
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused after the held connections closed: {}", r.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = server.metric("tensorfold:http_connections_refused_total").expect("refused counter");
    assert!(refused >= 2.0, "refused {refused}");
    server.stop_cleanly();
}

fn status_with_key(port: u16, key: &str) -> u16 {
    let auth = format!("Bearer {key}");
    http(port, "GET", "/v1/models", &[("Authorization", &auth)], b"").status
}

#[test]
fn key_files_are_reloaded_on_sighup_and_keys_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# clients\nkey-alpha-0001\nkey-beta-0002\n").unwrap();
    let server = Server::start(&["--api-key-file", file.to_str().unwrap(), "--api-key", "key-flag-0003"]);
    let port = server.port;
    for k in ["key-alpha-0001", "key-beta-0002", "key-flag-0003"] {
        assert_eq!(status_with_key(port, k), 200, "{k}");
    }
    assert_eq!(status_with_key(port, "key-gamma-0004"), 401);
    let r = http(port, "GET", "/v1/models", &[("x-api-key", "key-beta-0002")], b"");
    assert_eq!(r.status, 200);
    // A refused key is answered before the body is read; the answer says the connection closes, so no client
    // sends its next request on a connection the server is about to drop.
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer key-wrong\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    let (got, _) = read_until_closed(stalled(port, head), Duration::from_secs(30));
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 401") && text.contains("\r\nconnection: close\r\n"), "{text}");

    std::fs::write(&file, "key-gamma-0004\n").unwrap();
    server.signal("HUP");
    server.wait_output("SIGHUP: 1 API keys loaded", 1, Duration::from_secs(20));
    assert_eq!(status_with_key(port, "key-gamma-0004"), 200);
    assert_eq!(status_with_key(port, "key-alpha-0001"), 401);
    assert_eq!(status_with_key(port, "key-flag-0003"), 200, "--api-key stays");

    // An emptied file is refused on reload; the keys in use stay.
    std::fs::write(&file, "# rotating\n").unwrap();
    server.signal("HUP");
    server.wait_output("the keys in use are kept", 1, Duration::from_secs(20));
    assert_eq!(status_with_key(port, "key-gamma-0004"), 200);

    let out = server.output();
    for k in ["key-alpha", "key-beta", "key-gamma", "key-flag"] {
        assert!(!out.contains(k), "the server printed a key ({k}):\n{out}");
    }
    server.stop_cleanly();
}

#[test]
fn an_empty_key_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "\n# none yet\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(["serve", tf_testkit::model_path("smollm2").to_str().unwrap(), "--port", "0", "--api-key-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no key"), "{err}");
}
