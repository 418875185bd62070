//! Anthropic's Messages API: `POST /v1/messages` (JSON or SSE) and `POST /v1/messages/count_tokens`.
//!
//! A request is read into chat messages, tools and thinking controls ([`crate::messages_types`]), rendered with
//! the model's chat template and run like a chat completion: tools on the same grammar machinery
//! (`tool_choice` `any` forces at least one call, `tool` a named one), a thinking budget through
//! [`ReplySetup`], the reply split by the shared [`ReplySplitter`] into `thinking`, `text` and `tool_use` blocks.
//! Streams send Anthropic's events: `message_start`, `ping`, then per block `content_block_start`,
//! `content_block_delta`s (`thinking_delta` then `signature_delta`, `text_delta`, `input_json_delta`) and
//! `content_block_stop`, then `message_delta` (stop reason, usage, the `tensorfold` receipt) and `message_stop`.
//! Errors use Anthropic's shape ([`AnthropicError`]).

use crate::error::{AnthropicError, ApiError};
use crate::gen::{self, Job, Piece};
use crate::messages_types::{read_conversation, read_thinking, read_tools};
use crate::params::{kind, parse_object, sampling, Fields};
use crate::reply::{self, ReplyEnd, ReplyEvent, ReplySetup, ReplySplitter, ThinkingRequest};
use crate::structured;
use crate::tools::{self, ToolRequest};
use crate::{new_id, read_body, AppState, Shared};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tf_engine::{EngineError, GenOutput};
use tf_text::{ChatRenderOptions, ToolFormat, ToolParser};

pub async fn create(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    match run(st, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub async fn count_tokens(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let counted = async {
        let body = read_body(&st, &headers, body).await?;
        let n = parse_count_tokens(&st, &body)?;
        Ok::<_, AnthropicError>(axum::Json(json!({"input_tokens": n})).into_response())
    };
    match counted.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `count_tokens`' request → parameters step: a body into the number of prompt tokens it renders to, or the
/// error the route answers. Touches no engine and does no I/O.
pub fn parse_count_tokens(st: &AppState, body: &[u8]) -> Result<usize, ApiError> {
    let obj = parse_object(body)?;
    Ok(render(st, &Fields::new(&obj))?.prompt.len())
}

/// A request rendered to its prompt.
struct Rendered {
    prompt: Vec<u32>,
    text: String,
    tools: Option<ToolRequest>,
    thinking: ThinkingRequest,
}

/// Reads the conversation, tools and thinking controls and renders them with the chat template (a prefill is
/// appended after the generation prompt); the same for `/v1/messages` and `count_tokens`.
fn render(st: &AppState, f: &Fields<'_>) -> Result<Rendered, ApiError> {
    st.check_model(f)?;
    let conv = read_conversation(f)?;
    let tools = read_tools(f)?;
    let thinking = read_thinking(f)?;
    let kwargs = reply::template_kwargs(f)?;
    let Some(template) = &st.model.template else {
        return Err(ApiError::invalid(
            Some("messages".into()),
            format!("the model `{}` has no chat template; use /v1/completions with a plain prompt", st.model.id),
        ));
    };
    let tok = &st.model.tokenizer;
    let opts = ChatRenderOptions {
        add_generation_prompt: true,
        tools: tools.as_ref().map(|t| t.rendered.clone()),
        bos_token: tok.bos_token().map(str::to_owned),
        eos_token: tok.eos_token().map(str::to_owned),
        extra: thinking.template_vars(kwargs),
        ..Default::default()
    };
    let mut messages = conv.messages;
    crate::tools::call_ids_for_template(template.source(), &mut messages);
    let mut text = template.render(&Value::Array(messages), &opts).map_err(|e| {
        ApiError::invalid(Some("messages".into()), format!("the chat template refused the messages: {e}"))
    })?;
    if let Some(p) = conv.prefill {
        text.push_str(&p);
    }
    let prompt =
        tok.encode(&text, false, true).map_err(|e| ApiError::invalid(Some("messages".into()), e.to_string()))?;
    Ok(Rendered { prompt, text, tools, thinking })
}

/// The splitter of one reply: thinking (per `setup`) and calls in `format`, with `toolu_` call ids.
fn splitter(setup: &ReplySetup, format: Option<ToolFormat>) -> ReplySplitter {
    let prefix = format!("{}_", new_id("toolu_"));
    ReplySplitter::new(setup.parser, format.map(|f| setup.tool_parser(ToolParser::new(f, &prefix))))
}

/// A Messages request read and checked: the engine job and how the reply is shaped.
pub struct MessagesRequest {
    pub job: Job,
    pub stream: bool,
    pub return_ids: bool,
    pub setup: ReplySetup,
    /// The tool-call format replies are parsed with (`None`: calls are not parsed).
    pub tool_format: Option<ToolFormat>,
}

/// The route's request → parameters step: a body into a [`MessagesRequest`] (template rendered, prompt
/// tokenized, grammars compiled), or the error the route answers (in Anthropic's shape, by the handler).
/// Touches no engine and does no I/O.
pub fn parse(st: &AppState, body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields::new(&obj);
    let r = render(st, &f)?;
    match f.get("metadata") {
        None | Some(Value::Object(_)) => {}
        Some(v) => return Err(ApiError::field("metadata", format!("expected an object, got {}", kind(v)))),
    }
    let plan = tools::plan(st, r.tools.as_ref())?;
    let answer = match &plan.forced {
        Some(g) => Some(structured::compile(st, g)?),
        None => None,
    };
    let mut setup = ReplySetup::new(st, &r.text, &r.thinking, answer)?;
    setup.first_call_only = plan.first_only;
    let params = sampling(&f, &st.cfg.defaults, st.model.tokenizer.vocab_size())?;
    let stops = f.stops("stop_sequences")?;
    if f.get("max_tokens").is_none() {
        return Err(ApiError::field("max_tokens", "is required"));
    }
    let max_tokens = gen::resolve_max_tokens(st, &f, &["max_tokens"], r.prompt.len(), false)?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let draft = f.bool("draft")?.unwrap_or(true);
    let priority = f.priority()?;
    let return_ids = f.bool("return_token_ids")?.unwrap_or(false);
    let mut shown = tools::shown_markers(st, plan.format);
    shown.extend(reply::shown_markers(st));
    let job = Job {
        prompt: r.prompt,
        params,
        max_tokens,
        stops,
        logprobs: false,
        top_logprobs: 0,
        prompt_logprobs: None,
        priority,
        draft,
        constraint: setup.constraint.clone(),
        shown,
        call_end: setup.call_end(plan.format),
    };
    Ok(MessagesRequest { job, stream, return_ids, setup, tool_format: plan.format })
}

async fn run(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, AnthropicError> {
    let body = read_body(&st, &headers, body).await?;
    let MessagesRequest { job, stream, return_ids, setup, tool_format } = parse(&st, &body)?;
    let stops = job.stops.clone();
    let mut running = gen::start(&st, &job)?;
    let first = gen::first(&mut running).await?;
    let id = new_id("msg_");
    let model = st.model.id.clone();
    let mut split = splitter(&setup, tool_format);
    if !stream {
        let (tokens, out, tail, stop_hit) = gen::collect(running, first).await?;
        let mut text: String = tokens.iter().map(|(_, t)| t.as_str()).collect();
        text.push_str(&tail);
        let mut blocks = Blocks::new(false);
        for ev in split.push(&text) {
            blocks.push(ev);
        }
        let end = split.finish();
        let ending = Ending::of(&st, &out, stop_hit, &end, &stops)?;
        for ev in end.events.iter().cloned() {
            blocks.push(ev);
        }
        let mut reply = json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": blocks.finished(&end), "stop_reason": ending.reason, "stop_sequence": ending.sequence,
            "usage": usage(&out), "tensorfold": gen::receipt(&out),
        });
        if return_ids {
            reply["token_ids"] = json!(out.tokens);
        }
        return Ok(axum::Json(reply).into_response());
    }
    let mut blocks = Blocks::new(true);
    let mut started = false;
    let prompt_tokens = job.prompt.len();
    let st2 = st.clone();
    Ok(gen::sse(running, first, move |piece| {
        if !started {
            started = true;
            let message = json!({
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_read_input_tokens": 0,
                          "cache_creation_input_tokens": 0},
            });
            blocks.event("message_start", json!({"type": "message_start", "message": message}));
            blocks.event("ping", json!({"type": "ping"}));
        }
        match piece {
            Piece::Token { text, .. } => {
                for ev in split.push(&text) {
                    blocks.push(ev);
                }
                (blocks.take_events(), false)
            }
            Piece::Done { out, tail, stop_hit } => {
                for ev in split.push(&tail) {
                    blocks.push(ev);
                }
                let end = split.finish();
                for ev in end.events.iter().cloned() {
                    blocks.push(ev);
                }
                blocks.close();
                match Ending::of(&st2, &out, stop_hit, &end, &stops) {
                    Ok(e) => {
                        blocks.event(
                            "message_delta",
                            json!({"type": "message_delta",
                                   "delta": {"stop_reason": e.reason, "stop_sequence": e.sequence},
                                   "usage": usage(&out), "tensorfold": gen::receipt(&out)}),
                        );
                        blocks.event("message_stop", json!({"type": "message_stop"}));
                    }
                    Err(e) => blocks.event("error", e.anthropic_body()),
                }
                (blocks.take_events(), true)
            }
            Piece::Error(e) => {
                blocks.event("error", gen::engine_error(e).anthropic_body());
                (blocks.take_events(), true)
            }
        }
    }))
}

/// Anthropic `usage`: `input_tokens` are the prompt tokens not read from the prefix cache,
/// `cache_read_input_tokens` those that were (their sum is the prompt, as `count_tokens` reports it).
fn usage(out: &GenOutput) -> Value {
    json!({
        "input_tokens": out.prompt_tokens.saturating_sub(out.cached_tokens),
        "output_tokens": out.tokens.len(),
        "cache_read_input_tokens": out.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// How a reply ended: `stop_reason` and `stop_sequence`.
struct Ending {
    reason: &'static str,
    sequence: Option<String>,
}

impl Ending {
    /// `max_tokens` (the token limit), `tool_use` (the reply made calls), `stop_sequence` (one of `stops`,
    /// named), `end_turn`; a reply cancelled by a shutdown is an error.
    fn of(
        st: &AppState,
        out: &GenOutput,
        stop_hit: bool,
        end: &ReplyEnd,
        stops: &[String],
    ) -> Result<Ending, ApiError> {
        let reason = match gen::finish_reason(out, stop_hit) {
            "length" => "max_tokens",
            "abort" => return Err(gen::engine_error(EngineError::Cancelled)),
            _ if !end.calls.is_empty() => "tool_use",
            _ if stop_hit => "stop_sequence",
            _ => "end_turn",
        };
        let sequence = (reason == "stop_sequence").then(|| matched_stop(st, &out.tokens, stops)).flatten();
        Ok(Ending { reason, sequence })
    }
}

/// The stop string that ended a reply: in the reply's text, the one that ends first (the stop filter cuts
/// where a stop string is first complete).
fn matched_stop(st: &AppState, tokens: &[u32], stops: &[String]) -> Option<String> {
    let text = st.model.tokenizer.decode(tokens, true).ok()?;
    stops.iter().filter_map(|s| text.find(s.as_str()).map(|at| (at + s.len(), at, s))).min().map(|(_, _, s)| s.clone())
}

/// The content blocks of one reply, built from the splitter's events in order; for a stream, also the SSE
/// events that announce them.
struct Blocks {
    blocks: Vec<Value>,
    /// Whether the last block is still open.
    open: bool,
    /// Stream events not yet sent (`None`: not streaming).
    events: Option<String>,
}

impl Blocks {
    fn new(stream: bool) -> Blocks {
        Blocks { blocks: Vec::new(), open: false, events: stream.then(String::new) }
    }

    /// Queues one SSE event: an `event:` line with its type and a `data:` line.
    fn event(&mut self, kind: &str, data: Value) {
        if let Some(s) = &mut self.events {
            s.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
        }
    }

    fn take_events(&mut self) -> String {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn delta(&mut self, delta: Value) {
        let index = self.blocks.len() - 1;
        self.event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    /// Opens a block (closing the open one).
    fn start(&mut self, block: Value) {
        self.close();
        let index = self.blocks.len();
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        self.blocks.push(block);
        self.open = true;
    }

    /// Closes the open block; a thinking block gets its signature first.
    fn close(&mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        let index = self.blocks.len() - 1;
        if self.blocks[index]["type"] == "thinking" {
            self.delta(json!({"type": "signature_delta", "signature": ""}));
        }
        self.event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
    }

    /// Whether the open block is of type `kind`.
    fn open_is(&self, kind: &str) -> bool {
        self.open && self.blocks.last().is_some_and(|b| b["type"] == kind)
    }

    /// Appends `s` to the open block's `field` (a string).
    fn append(&mut self, field: &str, s: &str) {
        if let Some(Value::String(t)) = self.blocks.last_mut().and_then(|b| b.get_mut(field)) {
            t.push_str(s);
        }
    }

    fn push(&mut self, ev: ReplyEvent) {
        match ev {
            ReplyEvent::Reasoning(s) => {
                if !self.open_is("thinking") {
                    self.start(json!({"type": "thinking", "thinking": "", "signature": ""}));
                }
                self.append("thinking", &s);
                self.delta(json!({"type": "thinking_delta", "thinking": s}));
            }
            ReplyEvent::Content(s) => {
                if !self.open_is("text") {
                    self.start(json!({"type": "text", "text": ""}));
                }
                self.append("text", &s);
                self.delta(json!({"type": "text_delta", "text": s}));
            }
            ReplyEvent::CallStart { id, name, .. } => {
                self.start(json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
            }
            ReplyEvent::CallArgs { delta, .. } => {
                if self.open_is("tool_use") {
                    self.delta(json!({"type": "input_json_delta", "partial_json": delta}));
                }
            }
        }
    }

    /// The blocks of a whole reply: each `tool_use` takes its `input` from the finished call with its id (a call
    /// cut by the token limit is left out).
    fn finished(self, end: &ReplyEnd) -> Value {
        let mut out = Vec::with_capacity(self.blocks.len());
        for mut b in self.blocks {
            if b["type"] == "tool_use" {
                let Some(call) = end.calls.iter().find(|c| b["id"] == c.id.as_str()) else { continue };
                b["input"] = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
            }
            out.push(b);
        }
        Value::Array(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(s: &str) -> Vec<(String, Value)> {
        s.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (ev, data) = e.split_once('\n').unwrap();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (ev.strip_prefix("event: ").unwrap().to_string(), data)
            })
            .collect()
    }

    #[test]
    fn blocks_and_events_follow_the_reply() {
        let mut b = Blocks::new(true);
        for ev in [
            ReplyEvent::Reasoning("hm".into()),
            ReplyEvent::Reasoning(" ok".into()),
            ReplyEvent::Content("Checking.".into()),
            ReplyEvent::CallStart { index: 0, id: "toolu_a".into(), name: "w".into() },
            ReplyEvent::CallArgs { index: 0, delta: "{\"city\": ".into() },
            ReplyEvent::CallArgs { index: 0, delta: "\"Oslo\"}".into() },
            ReplyEvent::CallStart { index: 1, id: "toolu_b".into(), name: "w".into() },
            ReplyEvent::CallArgs { index: 1, delta: "{\"ci".into() },
        ] {
            b.push(ev);
        }
        b.close();
        let evs = events(&b.take_events());
        for (ev, data) in &evs {
            assert_eq!(data["type"], ev.as_str());
        }
        let kinds: Vec<String> = evs
            .iter()
            .map(|(e, d)| match d["delta"]["type"].as_str().or(d["content_block"]["type"].as_str()) {
                Some(t) => format!("{e}:{t}:{}", d["index"]),
                None => format!("{e}:{}", d["index"]),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start:thinking:0",
                "content_block_delta:thinking_delta:0",
                "content_block_delta:thinking_delta:0",
                "content_block_delta:signature_delta:0",
                "content_block_stop:0",
                "content_block_start:text:1",
                "content_block_delta:text_delta:1",
                "content_block_stop:1",
                "content_block_start:tool_use:2",
                "content_block_delta:input_json_delta:2",
                "content_block_delta:input_json_delta:2",
                "content_block_stop:2",
                "content_block_start:tool_use:3",
                "content_block_delta:input_json_delta:3",
                "content_block_stop:3",
            ]
        );
        let calls = vec![tf_text::ToolCall {
            id: "toolu_a".into(),
            name: "w".into(),
            arguments: "{\"city\": \"Oslo\"}".into(),
        }];
        let end = ReplyEnd { calls, cut: true, ..Default::default() };
        assert_eq!(
            b.finished(&end),
            json!([
                {"type": "thinking", "thinking": "hm ok", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_a", "name": "w", "input": {"city": "Oslo"}},
            ])
        );
    }
}
