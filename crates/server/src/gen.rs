//! The part every generation route shares: resolve `max_tokens` against the context, submit to the engine with
//! a sink that detokenizes and applies stop strings on the engine thread (so where a reply ends never depends
//! on timing), and turn engine results into `usage` and the `tensorfold` receipt.

use crate::error::ApiError;
use crate::params::Fields;
use crate::reply::CallEnd;
use crate::AppState;
use serde_json::{json, Value};
use std::sync::Arc;
use tf_core::ConstraintSpec;
use tf_engine::{
    EngineError, EngineEvent, FinishReason, Flow, GenOutput, GenRequest, Priority, SamplingParams, SubmitError, Ticket,
    TokenEvent,
};
use tf_text::{IncrementalDetokenizer, StopFilter, Tokenizer};
use tokio::sync::mpsc;

/// A validated generation request.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stops: Vec<String>,
    /// Report each generated token's logprob (the request's `logprobs`).
    pub logprobs: bool,
    /// Alternatives per generated token (0 = none).
    pub top_logprobs: usize,
    /// Score the prompt with this many alternatives (completions with `echo` + `logprobs`).
    pub prompt_logprobs: Option<usize>,
    pub priority: Priority,
    /// The request's `draft` field: `false` decodes serially (one row per round).
    pub draft: bool,
    /// The grammar the reply must follow (structured output, a forced tool call).
    pub constraint: Option<Arc<dyn ConstraintSpec>>,
    /// Control tokens whose text the reply shows (tool-call markers the parser reads), with that text.
    pub shown: Vec<(u32, String)>,
    /// Ends the reply at its first complete tool call (`parallel_tool_calls: false`).
    pub call_end: Option<CallEnd>,
}

/// What the engine thread sends the handler.
#[derive(Debug)]
pub enum Piece {
    /// One generated token and the text it released (after stop strings; may be empty).
    Token {
        ev: TokenEvent,
        text: String,
    },
    /// The end: the engine's output, the last released text, and whether the sink ended the reply (a stop
    /// string, or the first complete call under [`Job::call_end`]).
    Done {
        out: GenOutput,
        tail: String,
        stop_hit: bool,
    },
    Error(EngineError),
}

/// Cancels the request in the engine when dropped (client gone, handler finished): frees its KV.
pub struct CancelGuard(Ticket);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A submitted request.
pub struct Running {
    pub rx: mpsc::UnboundedReceiver<Piece>,
    pub guard: CancelGuard,
}

/// `max_tokens` (or an alias) resolved against the context: a given value that does not fit is a 400
/// `context_length_exceeded`; an absent one is the server default, cut to what is left of the context.
pub fn resolve_max_tokens(
    st: &AppState,
    f: &Fields<'_>,
    names: &[&str],
    prompt_tokens: usize,
    allow_zero: bool,
) -> Result<usize, ApiError> {
    let ctx = st.model.context;
    let mut given = None;
    for name in names {
        if let Some(v) = f.int_in(name, if allow_zero { 0 } else { 1 }, i64::MAX)? {
            given = Some((name, v as u64));
            break;
        }
    }
    match given {
        Some((_, 0)) if prompt_tokens <= ctx => Ok(0),
        Some((_, n)) if prompt_tokens < ctx && prompt_tokens as u64 + n <= ctx as u64 => Ok(n as usize),
        Some((_, n)) => Err(overflow(ctx, prompt_tokens, Some(n))),
        None if prompt_tokens < ctx => Ok(st.cfg.default_max_tokens.min(ctx - prompt_tokens)),
        None => Err(overflow(ctx, prompt_tokens, None)),
    }
}

fn overflow(ctx: usize, prompt: usize, max_tokens: Option<u64>) -> ApiError {
    let message = match max_tokens {
        Some(n) => format!(
            "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({prompt} in \
             the messages, {n} in the completion). Please reduce the length of the messages or completion.",
            prompt as u64 + n
        ),
        None => format!(
            "This model's maximum context length is {ctx} tokens. However, your messages resulted in {prompt} \
             tokens, leaving no room for a completion. Please reduce the length of the messages."
        ),
    };
    ApiError::invalid(Some("messages".into()), message).with_code("context_length_exceeded")
}

/// Submits `job`; refusals (queue full, shutting down) are errors before anything is sent to the client.
pub fn start(st: &AppState, job: &Job) -> Result<Running, ApiError> {
    let mut req = GenRequest::new(job.prompt.clone(), job.params.clone(), job.max_tokens);
    req.stop_ids = st.model.tokenizer.stop_ids().to_vec();
    req.logprobs = job.logprobs;
    req.top_logprobs = job.top_logprobs;
    req.prompt_logprobs = job.prompt_logprobs;
    req.draft = job.draft;
    req.constraint = job.constraint.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = make_sink(st.model.tokenizer.clone(), job.stops.clone(), job.shown.clone(), job.call_end, tx);
    match st.engine.submit(req, job.priority, sink) {
        Ok(ticket) => Ok(Running { rx, guard: CancelGuard(ticket) }),
        Err(e @ SubmitError::QueueFull { .. }) => Err(ApiError::busy(e.to_string())),
        Err(e @ (SubmitError::ShuttingDown | SubmitError::Failed(_))) => Err(ApiError::unavailable(e.to_string())),
    }
}

fn make_sink(
    tok: Arc<Tokenizer>,
    stops: Vec<String>,
    shown: Vec<(u32, String)>,
    call_end: Option<CallEnd>,
    tx: mpsc::UnboundedSender<Piece>,
) -> tf_engine::EventSink {
    let mut detok = IncrementalDetokenizer::new(true);
    let mut filter = StopFilter::new(stops);
    let mut broken: Option<String> = None;
    let mut watcher = call_end.map(CallEnd::watcher);
    let mut call_done = false;
    Box::new(move |ev| match ev {
        EngineEvent::Started { .. } => Flow::Continue,
        EngineEvent::Token(ev) => {
            let (text, hit) = if ev.is_stop || broken.is_some() {
                (String::new(), false)
            } else {
                let text = match shown.iter().find(|(id, _)| *id == ev.token) {
                    // A shown control token: the text before it, then its own.
                    Some((_, marker)) => detok.finish(&tok).map(|t| t + marker),
                    None => detok.push(&tok, ev.token),
                };
                match text {
                    Ok(t) => filter.push(&t),
                    Err(e) => {
                        broken = Some(e.to_string());
                        (String::new(), false)
                    }
                }
            };
            if let Some(w) = watcher.as_mut() {
                w.push(&text);
                call_done = w.ended();
            }
            let gone = tx.send(Piece::Token { ev, text }).is_err();
            if gone || hit || call_done || broken.is_some() {
                Flow::Stop
            } else {
                Flow::Continue
            }
        }
        EngineEvent::Done(out) => {
            if let Some(e) = broken.take() {
                let _ = tx.send(Piece::Error(EngineError::Model(format!("detokenizing: {e}"))));
                return Flow::Stop;
            }
            let mut tail = String::new();
            if !filter.is_hit() && !call_done {
                if let Ok(t) = detok.finish(&tok) {
                    tail = filter.push(&t).0;
                }
                if !filter.is_hit() {
                    tail.push_str(&filter.finish());
                }
            }
            let _ = tx.send(Piece::Done { out, tail, stop_hit: filter.is_hit() || call_done });
            Flow::Stop
        }
        EngineEvent::Error(e) => {
            let _ = tx.send(Piece::Error(e));
            Flow::Stop
        }
    })
}

/// An engine error as an HTTP error.
pub fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidRequest(m) => ApiError::invalid(None, m),
        EngineError::Sampling(s) => ApiError::field(s.field, s.message),
        EngineError::ContextOverflow { prompt_tokens, max_tokens, context_length } => {
            overflow(context_length, prompt_tokens, Some(max_tokens as u64))
        }
        EngineError::Pool(p) => ApiError::invalid(None, format!("the request does not fit the KV cache: {p}"))
            .with_code("context_length_exceeded"),
        EngineError::Cancelled => ApiError::unavailable("the request was cancelled (the server is shutting down)"),
        e @ (EngineError::Backend(_) | EngineError::Model(_)) => ApiError::internal(e.to_string()),
    }
}

/// The OpenAI finish reason.
pub fn finish_reason(out: &GenOutput, stop_hit: bool) -> &'static str {
    match out.finish_reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled if stop_hit => "stop",
        FinishReason::Cancelled => "abort",
    }
}

/// The `tensorfold` receipt (DESIGN.md §4).
pub fn receipt(out: &GenOutput) -> Value {
    let c = &out.counts;
    json!({
        "token_sha": out.token_sha,
        "min_rows": c.min_rows,
        "rounds": c.rounds,
        "drafted": c.drafted,
        "accepted": c.accepted,
        "drafts": c.drafts,
        "cached_tokens": out.cached_tokens,
        "prefill_s": round6(out.prefill_s),
        "decode_s": round6(out.decode_s),
        "seed": out.seed,
    })
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Chat/completions `usage`.
pub fn usage(out: &GenOutput) -> Value {
    json!({
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.tokens.len(),
        "total_tokens": out.prompt_tokens + out.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": out.cached_tokens},
    })
}

/// The text of one token for logprobs (lossy where a token is part of a UTF-8 sequence) and its bytes.
pub fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.decode_bytes(&[id], false).unwrap_or_else(|_| tok.token_to_piece(id).to_vec());
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A chat `logprobs.content` entry (`logprob` is there whenever the request asked for logprobs; null otherwise).
pub fn chat_logprob(tok: &Tokenizer, token: u32, logprob: Option<f64>, top: &[(u32, f64)]) -> Value {
    let (text, bytes) = token_text(tok, token);
    let top: Vec<Value> = top
        .iter()
        .map(|&(id, lp)| {
            let (t, b) = token_text(tok, id);
            json!({"token": t, "logprob": finite(lp), "bytes": b})
        })
        .collect();
    json!({"token": text, "logprob": logprob.map(finite), "bytes": bytes, "top_logprobs": top})
}

/// JSON cannot carry −∞ (a token masked out): −9999.0 stands in, as vLLM does.
pub fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        -9999.0
    }
}

/// Waits for the first token or the end, skipping nothing else; an engine error becomes an HTTP error (so a
/// stream never opens for a request that fails up front).
pub async fn first(run: &mut Running) -> Result<Piece, ApiError> {
    match run.rx.recv().await {
        Some(Piece::Error(e)) => Err(engine_error(e)),
        Some(p) => Ok(p),
        None => Err(ApiError::internal("the engine stopped without answering")),
    }
}

/// A `data: <json>` server-sent event.
pub fn sse_data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// Streams a reply as server-sent events: `format` turns each piece into ready-made event text and says when the
/// reply is over. The request is cancelled in the engine as soon as the client goes away.
pub fn sse<F>(mut run: Running, first: Piece, mut format: F) -> axum::response::Response
where
    F: FnMut(Piece) -> (String, bool) + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<bytes::Bytes, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        let (text, mut done) = format(first);
        if tx.send(Ok(text.into())).await.is_err() {
            return;
        }
        while !done {
            let piece = tokio::select! {
                _ = tx.closed() => return,
                p = run.rx.recv() => p,
            };
            let piece = piece.unwrap_or_else(|| Piece::Error(EngineError::Model("the engine stopped".into())));
            let (text, d) = format(piece);
            done = d;
            if !text.is_empty() && tx.send(Ok(text.into())).await.is_err() {
                return;
            }
        }
        drop(run);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    axum::response::Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "text/event-stream")
        .header(axum::http::header::CACHE_CONTROL, "no-cache")
        .body(axum::body::Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::internal("could not build the stream").into_response_inner())
}

/// Collects a whole reply (non-streamed routes).
pub async fn collect(
    mut run: Running,
    first: Piece,
) -> Result<(Vec<(TokenEvent, String)>, GenOutput, String, bool), ApiError> {
    let mut tokens = Vec::new();
    let mut piece = first;
    loop {
        match piece {
            Piece::Token { ev, text } => tokens.push((ev, text)),
            Piece::Done { out, tail, stop_hit } => return Ok((tokens, out, tail, stop_hit)),
            Piece::Error(e) => return Err(engine_error(e)),
        }
        piece = run.rx.recv().await.ok_or_else(|| ApiError::internal("the engine stopped without answering"))?;
    }
}

/// An error after a stream opened: an `error` event in the OpenAI shape, then `[DONE]`.
pub fn sse_error(e: EngineError) -> String {
    format!("{}data: [DONE]\n\n", sse_data(&engine_error(e).body()))
}

/// The end of a chat or completions stream: `finish` (the chunk with `finish_reason`), then — with
/// `include_usage` — a chunk with no choices and `usage` (`empty` builds it); the receipt rides on the last chunk
/// sent; then `[DONE]`.
pub fn sse_end(finish: Value, empty: Value, include_usage: bool, out: &GenOutput) -> String {
    sse_end_with(finish, empty, include_usage, out, usage(out))
}

/// [`sse_end`] with a given `usage` object (chat adds `completion_tokens_details`).
pub fn sse_end_with(mut finish: Value, empty: Value, include_usage: bool, out: &GenOutput, usage: Value) -> String {
    let mut s = String::new();
    let mut last = if include_usage {
        s.push_str(&sse_data(&finish));
        let mut u = empty;
        u["usage"] = usage;
        u
    } else {
        std::mem::take(&mut finish)
    };
    last["tensorfold"] = receipt(out);
    s.push_str(&sse_data(&last));
    s.push_str("data: [DONE]\n\n");
    s
}
