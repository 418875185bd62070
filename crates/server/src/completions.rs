//! `POST /v1/completions` (the legacy text API, which evaluation harnesses use to score text with
//! `echo: true, max_tokens: 0, logprobs: N`).

use crate::error::ApiError;
use crate::gen::{self, Job, Piece};
use crate::params::{kind, parse_object, sampling, Fields};
use crate::structured::{self, FormatField};
use crate::{new_id, read_body, unix_now, AppState, Shared};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tf_engine::TokenLogprob;
use tf_text::Tokenizer;

pub async fn handle(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    match run(st, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The prompt: a string (tokenized with the model's BOS rule) or token ids; a one-element list of either.
fn prompt_ids(st: &AppState, v: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let vocab = st.model.tokenizer.vocab_size();
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .enumerate()
            .map(|(i, x)| match x.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                _ => Err(ApiError::field("prompt", format!("item {i}: {x} is not a token id below {vocab}"))),
            })
            .collect()
    };
    let ids = match v {
        None => return Err(ApiError::field("prompt", "is required")),
        Some(Value::String(s)) => st.model.tokenizer.encode(s, true, true).map_err(|e| ApiError::field("prompt", e))?,
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => ids(a)?,
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => st.model.tokenizer.encode(s, true, true).map_err(|e| ApiError::field("prompt", e))?,
            Value::Array(inner) => ids(inner)?,
            v => return Err(ApiError::field("prompt", format!("expected a string or token ids, got {}", kind(v)))),
        },
        Some(Value::Array(a)) if a.is_empty() => Vec::new(),
        Some(Value::Array(_)) => {
            return Err(ApiError::field("prompt", "only one prompt per request is supported (send several requests)"))
        }
        Some(v) => return Err(ApiError::field("prompt", format!("expected a string or token ids, got {}", kind(v)))),
    };
    if ids.is_empty() {
        return Err(ApiError::field("prompt", "is empty (it must hold at least one token)"));
    }
    Ok(ids)
}

/// Legacy `logprobs` over a list of tokens: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`.
#[derive(Default)]
struct Legacy {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    offset: usize,
}

impl Legacy {
    fn push(&mut self, tok: &Tokenizer, id: u32, lp: Option<(f64, &[(u32, f64)])>) {
        let (text, _) = gen::token_text(tok, id);
        self.text_offset.push(self.offset);
        self.offset += text.len();
        self.tokens.push(Value::String(text));
        match lp {
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
            Some((lp, top)) => {
                self.token_logprobs.push(json!(gen::finite(lp)));
                let mut m = Map::new();
                for &(id, lp) in top {
                    m.entry(gen::token_text(tok, id).0).or_insert(json!(gen::finite(lp)));
                }
                self.top_logprobs.push(Value::Object(m));
            }
        }
    }

    fn json(self) -> Value {
        json!({"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
               "text_offset": self.text_offset})
    }
}

fn push_prompt(l: &mut Legacy, tok: &Tokenizer, prompt: &[u32], lps: &[Option<TokenLogprob>]) {
    for (i, &id) in prompt.iter().enumerate() {
        let lp = lps.get(i).and_then(|x| x.as_ref()).map(|x| (x.logprob, x.top.as_slice()));
        l.push(tok, id, lp);
    }
}

/// A completions request read and checked: the engine job and how the reply is shaped.
pub struct CompletionRequest {
    pub job: Job,
    /// Alternatives per token when the request asks for logprobs.
    pub logprobs: Option<usize>,
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub return_ids: bool,
    /// The prompt's text when it is echoed (empty otherwise).
    pub prompt_text: String,
}

/// The route's request → parameters step: a body into a [`CompletionRequest`] (prompt tokenized, grammar
/// compiled), or the error the route answers. Touches no engine and does no I/O.
pub fn parse(st: &AppState, body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields::new(&obj);
    st.check_model(&f)?;
    f.check_n()?;
    let output = structured::output_grammar(&f, FormatField::ResponseFormat)?;
    f.str("user")?;
    if f.int_in("best_of", 1, 1)?.is_some_and(|b| b != 1) {
        return Err(ApiError::field("best_of", "only best_of = 1 is supported"));
    }
    f.str("suffix")?.map_or(Ok(()), |_| Err(ApiError::field("suffix", "is not supported")))?;
    let prompt = prompt_ids(st, f.get("prompt"))?;
    let params = sampling(&f, &st.cfg.defaults, st.model.tokenizer.vocab_size())?;
    let logprobs = f.int_in("logprobs", 0, 5)?.map(|n| n as usize);
    let echo = f.bool("echo")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = f.include_usage()?;
    let return_ids = f.bool("return_token_ids")?.unwrap_or(false);
    // max_tokens 0 only makes sense to score the prompt (echo); OpenAI's default here is 16.
    let max_tokens = match f.get("max_tokens") {
        None => 16.min(st.model.context.saturating_sub(prompt.len())).max(1),
        Some(_) => gen::resolve_max_tokens(st, &f, &["max_tokens"], prompt.len(), echo)?,
    };
    let job = Job {
        // With echo and max_tokens 0 the engine only fills the prompt (scoring it is then nearly free).
        prompt_logprobs: if echo { logprobs.or((max_tokens == 0).then_some(0)) } else { None },
        logprobs: logprobs.is_some(),
        top_logprobs: logprobs.unwrap_or(0),
        prompt,
        params,
        max_tokens,
        stops: f.stops("stop")?,
        priority: f.priority()?,
        draft: f.bool("draft")?.unwrap_or(true),
        constraint: output.as_ref().map(|g| structured::compile(st, g)).transpose()?,
        shown: Vec::new(),
        call_end: None,
    };
    let prompt_text = if echo {
        st.model.tokenizer.decode(&job.prompt, false).map_err(|e| ApiError::field("prompt", e))?
    } else {
        String::new()
    };
    Ok(CompletionRequest { job, logprobs, echo, stream, include_usage, return_ids, prompt_text })
}

async fn run(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(&st, &headers, body).await?;
    let CompletionRequest { job, logprobs, echo, stream, include_usage, return_ids, prompt_text } = parse(&st, &body)?;
    let tok = st.model.tokenizer.clone();
    let mut running = gen::start(&st, &job)?;
    let first = gen::first(&mut running).await?;
    let id = new_id("cmpl-");
    let created = unix_now();
    let model = st.model.id.clone();
    if !stream {
        let (tokens, out, tail, stop_hit) = gen::collect(running, first).await?;
        let mut text = prompt_text;
        for (_, t) in &tokens {
            text.push_str(t);
        }
        text.push_str(&tail);
        let lp = logprobs.map(|_| {
            let mut l = Legacy::default();
            if echo {
                push_prompt(&mut l, &tok, &job.prompt, &out.prompt_logprobs);
            }
            for (ev, _) in tokens.iter().filter(|(ev, _)| !ev.is_stop) {
                l.push(&tok, ev.token, ev.logprob.map(|lp| (lp, ev.top.as_slice())));
            }
            l.json()
        });
        let mut choice = json!({"index": 0, "text": text, "logprobs": lp,
                                "finish_reason": gen::finish_reason(&out, stop_hit)});
        let mut reply = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                               "choices": [], "usage": gen::usage(&out), "tensorfold": gen::receipt(&out)});
        if return_ids {
            choice["token_ids"] = json!(out.tokens);
            reply["prompt_token_ids"] = json!(job.prompt);
        }
        reply["choices"] = json!([choice]);
        return Ok(axum::Json(reply).into_response());
    }
    let chunk = move |choices: Value| json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices});
    let mut pending_echo = echo.then_some(prompt_text);
    let prompt = job.prompt.clone();
    Ok(gen::sse(running, first, move |piece| {
        let mut s = String::new();
        match piece {
            Piece::Token { ev, text } => {
                let mut text = text;
                if let Some(p) = pending_echo.take() {
                    text.insert_str(0, &p);
                }
                let lp = logprobs.filter(|_| !ev.is_stop).map(|_| {
                    let mut l = Legacy::default();
                    l.push(&tok, ev.token, ev.logprob.map(|lp| (lp, ev.top.as_slice())));
                    l.json()
                });
                if !text.is_empty() || lp.is_some() {
                    let mut c = json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": null});
                    if return_ids {
                        c["token_ids"] = json!([ev.token]);
                    }
                    s.push_str(&gen::sse_data(&chunk(json!([c]))));
                }
                (s, false)
            }
            Piece::Done { out, tail, stop_hit } => {
                let mut text = pending_echo.take().unwrap_or_default();
                text.push_str(&tail);
                let lp = (echo && logprobs.is_some()).then(|| {
                    let mut l = Legacy::default();
                    push_prompt(&mut l, &tok, &prompt, &out.prompt_logprobs);
                    l.json()
                });
                let finish = chunk(json!([{"index": 0, "text": text, "logprobs": lp,
                                           "finish_reason": gen::finish_reason(&out, stop_hit)}]));
                s.push_str(&gen::sse_end(finish, chunk(json!([])), include_usage, &out));
                (s, true)
            }
            Piece::Error(e) => {
                s.push_str(&gen::sse_error(e));
                (s, true)
            }
        }
    }))
}
