//! The server when its engine fails (the engine thread panics, as a CUDA allocation or driver error in the middle
//! of a forward would make it): the request that was running gets a 500 saying so, `/health` turns 503 with
//! status "failed" and the reason, later requests get a 503 with the reason, and `serve_blocking` stops on its
//! own with an error (so `tensorfold serve` exits non-zero for a supervisor to restart it). A model that panics on
//! demand stands in for the device; the CPU backend only holds its KV cache. A stream already open when the engine
//! fails ends with an error event, then `[DONE]`.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tf_core::{Backend, KvCache, KvSpec, Precision, Tensor};
use tf_engine::{EngineConfig, EngineHandle};
use tf_models::{Batch, Model};
use tf_server::run::{serve_blocking, ServeOptions};
use tf_server::{AppState, ServedModel, ServerConfig, Shared};
use tf_text::Tokenizer;
use tower::ServiceExt;

const WAIT: Duration = Duration::from_secs(30);

/// Uniform logits (greedy takes id 0, never a stop) until `fail` is set, or until `forwards_left` (when not
/// `usize::MAX`) runs out; then every forward panics.
struct FailingModel {
    vocab: usize,
    fail: Arc<AtomicBool>,
    forwards_left: Arc<AtomicUsize>,
}

impl Model for FailingModel {
    fn family(&self) -> &'static str {
        "failing"
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn context_length(&self) -> usize {
        512
    }
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: 1, blocks, block_size, kv_heads: 1, head_dim: 1 }
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0 // no weights
    }
    fn forward(&self, _be: &dyn Backend, batch: &Batch, _kv: &mut KvCache) -> Tensor {
        let left = self.forwards_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            usize::MAX => Some(n),
            _ => Some(n.saturating_sub(1)),
        });
        if left == Ok(0) {
            self.fail.store(true, Ordering::SeqCst);
        }
        assert!(!self.fail.load(Ordering::SeqCst), "simulated device error: out of memory in the middle of a forward");
        Tensor::host(batch.logit_rows.len(), self.vocab, vec![0.0; batch.logit_rows.len() * self.vocab])
    }
}

/// The app state over a failing model, its switch and its forward budget (unlimited: `usize::MAX`).
fn state() -> (Shared, Arc<AtomicBool>, Arc<AtomicUsize>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/byte-tokenizer.json");
    let json = std::fs::read(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let tokenizer = Arc::new(Tokenizer::from_hf_json(&json, None, &[]).expect("byte tokenizer"));
    let fail = Arc::new(AtomicBool::new(false));
    let forwards_left = Arc::new(AtomicUsize::new(usize::MAX));
    let model =
        FailingModel { vocab: tokenizer.vocab_size(), fail: fail.clone(), forwards_left: forwards_left.clone() };
    let cfg = EngineConfig {
        kv_blocks: 32,
        block_size: 16,
        max_waiting: 8,
        max_window: 1,
        proposer: None,
        min_drafts: 1,
        prefix_cache: false,
        run_ahead: true,
        token_limit: None,
        parallel: 1,
        max_rows: 32,
    };
    let backend = Arc::new(tf_backend_cpu::CpuBackend::new(1, Precision::Checkpoint));
    let engine = EngineHandle::spawn(backend, Box::new(model), cfg).expect("engine");
    let served = ServedModel {
        id: "failing".into(),
        aliases: vec![],
        family: "failing".into(),
        tokenizer,
        template: None,
        context: 512,
    };
    (AppState::new(served, engine, ServerConfig::default()), fail, forwards_left)
}

/// One request through the router; (status, JSON body).
async fn call(st: &Shared, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder().method(method).uri(path).header("content-type", "application/json");
    let req = req.body(body.map_or_else(Body::empty, |b| Body::from(b.to_string()))).unwrap();
    let resp = tf_server::router(st.clone()).oneshot(req).await.expect("router");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn completion() -> Value {
    json!({"model": "failing", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
}

/// `h.wait_end()`, bounded.
fn wait_end(st: &Shared) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    let engine = st.engine.clone();
    std::thread::spawn(move || tx.send(engine.wait_end()));
    rx.recv_timeout(WAIT).expect("the engine's end is recorded")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_answers_500_then_503_and_health_says_why() {
    let (st, fail, _) = state();
    let (code, body) = call(&st, "GET", "/health", None).await;
    assert_eq!((code, body["status"].as_str()), (StatusCode::OK, Some("ok")), "{body}");
    let (code, body) = call(&st, "POST", "/v1/completions", Some(completion())).await;
    assert_eq!(code, StatusCode::OK, "before the failure: {body}");

    fail.store(true, Ordering::SeqCst);
    let (code, body) = call(&st, "POST", "/v1/completions", Some(completion())).await;
    assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("the engine failed"), "{body}");

    let why = tokio::task::block_in_place(|| wait_end(&st)).expect("a failure");
    assert!(why.contains("simulated device error"), "{why}");
    let (code, body) = call(&st, "GET", "/health", None).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("simulated device error"), "{body}");
    for stream in [false, true] {
        let mut req = completion();
        req["stream"] = json!(stream);
        let (code, body) = call(&st, "POST", "/v1/completions", Some(req)).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "stream {stream}: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("the engine failed") && msg.contains("simulated device error"), "{body}");
    }
    st.engine.shutdown();
}

/// A raw HTTP/1.1 exchange (Connection: close); the status code.
fn post_status(addr: std::net::SocketAddr, path: &str, body: &Value) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn serve_stops_with_an_error_when_its_engine_fails() {
    let (st, fail, _) = state();
    let (addr_tx, addr_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let opts = ServeOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        shutdown_timeout: Duration::from_secs(5),
        on_ready: Box::new(move |a| {
            let _ = addr_tx.send(a);
        }),
        live_line: false,
        conn: Default::default(),
    };
    std::thread::spawn(move || done_tx.send(serve_blocking(st, opts)));
    let addr = addr_rx.recv_timeout(WAIT).expect("listening");
    assert_eq!(post_status(addr, "/v1/completions", &completion()), 200);
    fail.store(true, Ordering::SeqCst);
    assert_eq!(post_status(addr, "/v1/completions", &completion()), 500);
    let result = done_rx.recv_timeout(WAIT).expect("serve_blocking returned on its own");
    let err = result.expect_err("an engine failure is an error");
    assert!(err.contains("the engine failed") && err.contains("simulated device error"), "{err}");
}

/// The whole body of a response, as text.
async fn call_text(st: &Shared, path: &str, body: Value) -> (StatusCode, String) {
    let req = Request::builder().method("POST").uri(path).header("content-type", "application/json");
    let resp = tf_server::router(st.clone()).oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_open_when_the_engine_fails_ends_with_an_error_event() {
    let (st, _, forwards_left) = state();
    // The prompt's forward and two decode steps succeed: the stream opens with tokens, then the engine fails.
    forwards_left.store(3, Ordering::SeqCst);
    let mut req = completion();
    req["stream"] = json!(true);
    req["max_tokens"] = json!(8);
    let (code, text) = call_text(&st, "/v1/completions", req).await;
    assert_eq!(code, StatusCode::OK, "{text}");
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    let tokens = events.iter().filter(|e| e["choices"][0]["text"].is_string()).count();
    assert!(tokens >= 1, "tokens before the failure: {text}");
    let last = events.last().expect("events");
    let msg = last["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("the engine failed"), "the last event: {last}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    st.engine.shutdown();
}
