//! Request bodies → parameters, for every route. The generation routes and `count_tokens` call the route's
//! `parse` (what the handler runs before it submits to the engine); `/tokenize` and `/detokenize` go through the
//! router (they never reach the engine). The server is the `fixtures/tiny-qwen3` tokenizer and Qwen3 chat
//! template (thinking, tools) over an engine whose model is never run, with a 1024-token context and one stored
//! response, `resp_fuzz`, for `previous_response_id`.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use tf_core::{Backend, KvCache, KvSpec, Precision, Tensor};
use tf_engine::{EngineConfig, EngineHandle};
use tf_models::{Batch, Model};
use tf_server::error::ApiError;
use tf_server::gen::Job;
use tf_server::{AppState, ServedModel, ServerConfig, Shared};
use tf_text::{ChatTemplate, Tokenizer};
use tower::ServiceExt;

/// The context of the fuzzed server, in tokens (small, so requests overflow it).
pub const CONTEXT: usize = 1024;

/// A model the parse step never runs: the engine needs one to exist.
struct Idle {
    vocab: usize,
}

impl Model for Idle {
    fn family(&self) -> &'static str {
        "fuzz"
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn context_length(&self) -> usize {
        CONTEXT
    }
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: 1, blocks, block_size, kv_heads: 1, head_dim: 1 }
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn forward(&self, _be: &dyn Backend, batch: &Batch, _kv: &mut KvCache) -> Tensor {
        Tensor::host(batch.logit_rows.len(), self.vocab, vec![0.0; batch.logit_rows.len() * self.vocab])
    }
}

/// The server state, built once.
pub fn state() -> &'static Shared {
    static STATE: OnceLock<Shared> = OnceLock::new();
    STATE.get_or_init(|| {
        let dir = tf_testkit::repo_root().join("fixtures/tiny-qwen3");
        let tokenizer = Arc::new(Tokenizer::from_hf_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())));
        let template = ChatTemplate::new(tokenizer.chat_template().expect("tiny-qwen3 has a chat template"))
            .unwrap_or_else(|e| panic!("chat template: {e}"));
        let cfg = EngineConfig {
            kv_blocks: 32,
            block_size: 16,
            max_waiting: 8,
            max_window: 1,
            proposer: None,
            min_drafts: 1,
            prefix_cache: false,
            run_ahead: false,
            token_limit: None,
            parallel: 1,
            max_rows: 32,
        };
        let backend = Arc::new(tf_backend_cpu::CpuBackend::new(1, Precision::Checkpoint));
        let model = Idle { vocab: tokenizer.vocab_size() };
        let engine = EngineHandle::spawn(backend, Box::new(model), cfg).expect("engine");
        let served = ServedModel {
            id: "fuzz".into(),
            aliases: vec!["tiny-qwen3".into()],
            family: "qwen3".into(),
            tokenizer,
            template: Some(template),
            context: CONTEXT,
        };
        let st = AppState::new(served, engine, ServerConfig::default());
        let conversation =
            vec![json!({"role": "user", "content": "Hi"}), json!({"role": "assistant", "content": "Hello"})];
        st.store.lock().unwrap().put("resp_fuzz".into(), conversation, json!({"id": "resp_fuzz"}));
        st
    })
}

/// An error reply: a 4xx in the OpenAI shape (and the Anthropic one), with a message.
pub fn check_api_error(e: &ApiError) {
    assert!(e.status.is_client_error(), "a request error answered {}: {e:?}", e.status);
    assert!(!e.message.trim().is_empty() && !e.kind.is_empty(), "{e:?}");
    check_error_body(&e.body());
    let a = e.anthropic_body();
    assert_eq!(a["type"], "error");
    assert!(a["error"]["type"].as_str().is_some_and(|t| t.ends_with("_error")) && a["error"]["message"].is_string());
}

fn check_error_body(b: &Value) {
    let err = &b["error"];
    assert!(err["message"].as_str().is_some_and(|m| !m.trim().is_empty()), "error body {b}");
    assert!(err["type"].as_str().is_some_and(|t| !t.is_empty()), "error body {b}");
    assert!(err["param"].is_null() || err["param"].is_string(), "error body {b}");
    assert!(err["code"].is_null() || err["code"].is_string(), "error body {b}");
}

/// A job the route accepted is one the engine admits: a prompt inside the vocabulary that fits the context with
/// its `max_tokens`, valid sampling, at most 16 non-empty stop strings.
pub fn check_job(st: &AppState, job: &Job, max_top_logprobs: usize) {
    let vocab = st.model.tokenizer.vocab_size();
    assert!(!job.prompt.is_empty(), "an empty prompt was accepted");
    assert!(job.prompt.iter().all(|&id| (id as usize) < vocab), "a prompt id outside the vocabulary");
    assert!(job.max_tokens >= 1 || job.prompt_logprobs.is_some(), "max_tokens 0 without scoring the prompt");
    assert!(job.prompt.len() + job.max_tokens <= st.model.context, "{} + {} tokens", job.prompt.len(), job.max_tokens);
    job.params.validate().unwrap_or_else(|e| panic!("accepted sampling parameters are invalid: {e:?}"));
    let ids: Vec<u32> = job.params.logit_bias.iter().map(|&(id, _)| id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids.iter().all(|&id| (id as usize) < vocab), "logit_bias {ids:?}");
    assert!(job.stops.len() <= 16 && job.stops.iter().all(|s| !s.is_empty()), "stops {:?}", job.stops);
    assert!(job.top_logprobs <= max_top_logprobs, "top_logprobs {}", job.top_logprobs);
    assert!(job.shown.iter().all(|&(id, _)| (id as usize) < vocab));
}

/// `POST /v1/chat/completions`.
pub fn chat(data: &[u8]) {
    let st = state();
    match tf_server::chat::parse(st, data) {
        Ok(r) => check_job(st, &r.job, 20),
        Err(e) => check_api_error(&e),
    }
}

/// `POST /v1/completions`.
pub fn completions(data: &[u8]) {
    let st = state();
    match tf_server::completions::parse(st, data) {
        Ok(r) => {
            check_job(st, &r.job, 5);
            assert_eq!(r.job.top_logprobs, r.logprobs.unwrap_or(0));
            assert!(r.echo || r.prompt_text.is_empty());
        }
        Err(e) => check_api_error(&e),
    }
}

/// `POST /v1/responses`.
pub fn responses(data: &[u8]) {
    let st = state();
    match tf_server::responses::parse(st, data) {
        Ok(r) => {
            check_job(st, &r.job, 0);
            assert!(!r.messages.is_empty(), "a response to no input");
        }
        Err(e) => check_api_error(&e),
    }
}

/// `POST /v1/messages`.
pub fn messages(data: &[u8]) {
    let st = state();
    match tf_server::messages::parse(st, data) {
        Ok(r) => check_job(st, &r.job, 0),
        Err(e) => check_api_error(&e),
    }
}

/// `POST /v1/messages/count_tokens`.
pub fn count_tokens(data: &[u8]) {
    let st = state();
    match tf_server::messages::parse_count_tokens(st, data) {
        Ok(n) => assert!(n > 0, "a rendered conversation of no tokens"),
        Err(e) => check_api_error(&e),
    }
}

/// One POST through the router: (status, JSON body).
fn post(path: &str, body: &[u8]) -> (StatusCode, Value) {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static ROUTER: OnceLock<axum::Router> = OnceLock::new();
    let rt = RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"));
    let router = ROUTER.get_or_init(|| tf_server::router(state().clone())).clone();
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    rt.block_on(async move {
        let resp = router.oneshot(req).await.expect("the router is infallible");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
        let v =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{path} answered {status} with non-JSON: {e}"));
        (status, v)
    })
}

/// A non-200 reply of a route: a 4xx with an OpenAI error body.
fn check_refusal(path: &str, status: StatusCode, body: &Value) {
    assert!(status.is_client_error(), "{path} answered {status}: {body}");
    check_error_body(body);
}

/// `POST /tokenize`.
pub fn tokenize(data: &[u8]) {
    let (status, body) = post("/tokenize", data);
    if status != StatusCode::OK {
        return check_refusal("/tokenize", status, &body);
    }
    let vocab = state().model.tokenizer.vocab_size() as u64;
    let tokens = body["tokens"].as_array().expect("tokens");
    assert!(tokens.iter().all(|t| t.as_u64().is_some_and(|id| id < vocab)), "{body}");
    assert_eq!(body["count"].as_u64(), Some(tokens.len() as u64));
    if let Some(strs) = body.get("token_strs") {
        assert_eq!(strs.as_array().map(Vec::len), Some(tokens.len()));
    }
}

/// `POST /detokenize`.
pub fn detokenize(data: &[u8]) {
    let (status, body) = post("/detokenize", data);
    if status != StatusCode::OK {
        return check_refusal("/detokenize", status, &body);
    }
    assert!(body["prompt"].is_string(), "{body}");
}
