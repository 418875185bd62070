//! `POST /v1/responses` (text in, text out) and `GET /v1/responses/{id}`, with an in-memory store bounded in
//! entries and bytes for `previous_response_id`.

use crate::chat::{constrain, content_text, render_prompt};
use crate::error::ApiError;
use crate::gen::{self, Job, Piece};
use crate::params::{kind, parse_object, sampling, Fields};
use crate::reply::{self, EffortField, ReplySetup, ReplySplitter};
use crate::resp_items::{Emit, Items};
use crate::structured::{self, FormatField};
use crate::tools;
use crate::{new_id, read_body, unix_now, AppState, Shared};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use tf_engine::GenOutput;

/// Stored responses, oldest evicted first when either bound is passed.
pub struct Store {
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    order: VecDeque<String>,
    /// id → (the conversation including this response's output, the response object, size in bytes).
    items: HashMap<String, (Vec<Value>, Value, usize)>,
}

impl Store {
    pub fn new(max_entries: usize, max_bytes: usize) -> Store {
        Store { max_entries, max_bytes, bytes: 0, order: VecDeque::new(), items: HashMap::new() }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps a response; one larger than the byte bound is not kept.
    pub fn put(&mut self, id: String, conversation: Vec<Value>, response: Value) {
        let size =
            id.len() + conversation.iter().map(|m| m.to_string().len()).sum::<usize>() + response.to_string().len();
        if size > self.max_bytes || self.max_entries == 0 {
            return;
        }
        while !self.order.is_empty() && (self.items.len() >= self.max_entries || self.bytes + size > self.max_bytes) {
            if let Some(old) = self.order.pop_front() {
                if let Some((_, _, s)) = self.items.remove(&old) {
                    self.bytes -= s;
                }
            }
        }
        self.bytes += size;
        self.order.push_back(id.clone());
        self.items.insert(id, (conversation, response, size));
    }

    pub fn conversation(&self, id: &str) -> Option<&Vec<Value>> {
        self.items.get(id).map(|x| &x.0)
    }

    pub fn response(&self, id: &str) -> Option<&Value> {
        self.items.get(id).map(|x| &x.1)
    }
}

pub async fn handle(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    match run(st, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub async fn get_stored(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    let store = st.store.lock().unwrap_or_else(|p| p.into_inner());
    match store.response(&id) {
        Some(r) => axum::Json(r.clone()).into_response(),
        None => ApiError::not_found(format!("no stored response with id `{id}`")).into_response(),
    }
}

/// `input` as chat messages.
fn input_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match v {
        None => Err(ApiError::field("input", "is required")),
        Some(Value::String(s)) => Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, it) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let Value::Object(o) = it else {
                    return Err(ApiError::field(&at, format!("expected an item object, got {}", kind(it))));
                };
                let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
                match ty {
                    "message" => {}
                    "function_call" => {
                        function_call_item(o, &at, &mut out)?;
                        continue;
                    }
                    "reasoning" => {
                        reasoning_item(o, &at, &mut out)?;
                        continue;
                    }
                    "function_call_output" => {
                        let call_id = item_str(o, "call_id", &at)?;
                        let output = match o.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            v @ Some(Value::Array(_)) => content_text(v, &format!("{at}.output"))?.unwrap_or_default(),
                            _ => return Err(ApiError::field(&format!("{at}.output"), "expected a string")),
                        };
                        out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                        continue;
                    }
                    _ => return Err(ApiError::field(&at, format!("input items of type `{ty}` are not supported"))),
                }
                let role = match o.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    Some("developer") => "system",
                    _ => {
                        return Err(ApiError::field(
                            &format!("{at}.role"),
                            "expected user, assistant, system or developer",
                        ))
                    }
                };
                let text = content_text(o.get("content"), &format!("{at}.content"))?
                    .ok_or_else(|| ApiError::field(&format!("{at}.content"), "is required"))?;
                // An assistant message after a reasoning item completes the turn that item began.
                match out.last_mut() {
                    Some(m) if role == "assistant" && m["role"] == "assistant" && m["content"].is_null() => {
                        m["content"] = Value::String(text)
                    }
                    _ => out.push(json!({"role": role, "content": text})),
                }
            }
            if out.is_empty() {
                return Err(ApiError::field("input", "must hold at least one item"));
            }
            Ok(out)
        }
        Some(v) => Err(ApiError::field("input", format!("expected a string or an array of items, got {}", kind(v)))),
    }
}

/// A string field of an input item.
fn item_str(o: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match o.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(ApiError::field(&format!("{at}.{key}"), "expected a non-empty string")),
    }
}

/// A `reasoning` input item (an earlier reply's thinking: `content` of `reasoning_text` parts, else `summary`
/// text) begins an assistant turn with `reasoning_content`; the message or calls after it join that turn.
fn reasoning_item(o: &Map<String, Value>, at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut text = String::new();
    for key in ["content", "summary"] {
        match o.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(parts)) => {
                for (i, p) in parts.iter().enumerate() {
                    match p.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => return Err(ApiError::field(&format!("{at}.{key}[{i}].text"), "expected a string")),
                    }
                }
            }
            Some(v) => {
                return Err(ApiError::field(&format!("{at}.{key}"), format!("expected an array, got {}", kind(v))))
            }
        }
        if !text.is_empty() {
            break;
        }
    }
    out.push(json!({"role": "assistant", "content": null, "reasoning_content": text}));
    Ok(())
}

/// A `function_call` input item joins the assistant message before it (or starts one) as a chat `tool_calls`
/// entry.
fn function_call_item(o: &Map<String, Value>, at: &str, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let call_id = item_str(o, "call_id", at)?;
    let name = item_str(o, "name", at)?;
    let arguments = match o.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(ApiError::field(&format!("{at}.arguments"), "expected a string (JSON text)")),
    };
    let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
    match out.last_mut() {
        Some(m) if m["role"] == "assistant" => match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => m["tool_calls"] = json!([call]),
        },
        _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
    }
    Ok(())
}

/// What a response object says besides its output.
pub struct Meta {
    id: String,
    msg_id: String,
    created: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: f64,
    top_p: f64,
    previous: Option<String>,
    store: bool,
    metadata: Value,
    /// The request's `tools`, `tool_choice`, `parallel_tool_calls` and `text`, echoed.
    tools: Value,
    tool_choice: Value,
    parallel_tool_calls: bool,
    text: Value,
}

impl Meta {
    /// The response object; `items` (none while in progress) give the output, whose message items end as the
    /// response does (cut by max_output_tokens, both are "incomplete").
    fn object(&self, status: &str, items: Option<&Items>, out: Option<&GenOutput>, stop_hit: bool) -> Value {
        let output = match items {
            None => json!([]),
            Some(it) => json!(it.output(if status == "incomplete" { status } else { "completed" })),
        };
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "previous_response_id": self.previous, "store": self.store, "metadata": self.metadata,
            "parallel_tool_calls": self.parallel_tool_calls, "tool_choice": self.tool_choice, "tools": self.tools,
            "text": self.text,
            "truncation": "disabled", "error": null, "incomplete_details": null, "usage": null,
        });
        if let Some(o) = out {
            r["usage"] = json!({
                "input_tokens": o.prompt_tokens,
                "input_tokens_details": {"cached_tokens": o.cached_tokens},
                "output_tokens": o.tokens.len(),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": o.prompt_tokens + o.tokens.len(),
            });
            r["tensorfold"] = gen::receipt(o);
            if gen::finish_reason(o, stop_hit) == "length" {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
        }
        r
    }
}

/// A message output item (`text` None: no content yet).
pub fn message(id: &str, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        None => json!([]),
        Some(t) => json!([{"type": "output_text", "text": t, "annotations": [], "logprobs": []}]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// A Responses request read and checked: the engine job, the conversation it continues and the response's
/// echoed fields.
pub struct ResponsesRequest {
    pub job: Job,
    pub stream: bool,
    pub setup: ReplySetup,
    /// The tool-call format replies are parsed with (`None`: calls are not parsed).
    pub tool_format: Option<tf_text::ToolFormat>,
    /// The conversation so far (the stored one of `previous_response_id`, then `input`), kept with the reply.
    pub messages: Vec<Value>,
    pub meta: Meta,
}

/// The route's request → parameters step: a body into a [`ResponsesRequest`] (a stored conversation looked up,
/// template rendered, prompt tokenized, grammars compiled), or the error the route answers. Touches no engine
/// and does no I/O.
pub fn parse(st: &AppState, body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields::new(&obj);
    st.check_model(&f)?;
    let output = structured::output_grammar(&f, FormatField::TextFormat)?;
    let tool_req = tools::read(&f, tools::Shape::Responses)?;
    let plan = tools::plan(st, tool_req.as_ref())?;
    let answer = constrain(st, output, plan.forced)?;
    let thinking = reply::read_thinking(&f, EffortField::Reasoning)?;
    let extra = thinking.template_vars(reply::template_kwargs(&f)?);
    let mut messages = Vec::new();
    let previous = f.str("previous_response_id")?.map(str::to_owned);
    if let Some(p) = &previous {
        let store = st.store.lock().unwrap_or_else(|p| p.into_inner());
        match store.conversation(p) {
            Some(c) => messages.extend(c.iter().cloned()),
            None => {
                return Err(ApiError::field("previous_response_id", format!("no stored response with id `{p}`"))
                    .with_code("previous_response_not_found"))
            }
        }
    }
    let input = input_messages(f.get("input"))?;
    messages.extend(input);
    let instructions = f.str("instructions")?.map(str::to_owned);
    let mut rendered = Vec::new();
    if let Some(i) = &instructions {
        rendered.push(json!({"role": "system", "content": i}));
    }
    rendered.extend(messages.iter().cloned());
    let params = sampling(&f, &st.cfg.defaults, st.model.tokenizer.vocab_size())?;
    let stream = f.bool("stream")?.unwrap_or(false);
    let store = f.bool("store")?.unwrap_or(true);
    let metadata = match f.get("metadata") {
        None => json!({}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(v) => return Err(ApiError::field("metadata", format!("expected an object, got {}", kind(v)))),
    };
    let echoed_tools = f.get("tools").cloned().unwrap_or_else(|| json!([]));
    let tool_choice = f.get("tool_choice").cloned().unwrap_or_else(|| json!("auto"));
    let parallel_tool_calls = tool_req.as_ref().map_or(f.bool("parallel_tool_calls")?.unwrap_or(true), |t| t.parallel);
    let text_echo = match f.get("text") {
        Some(t @ Value::Object(o)) if o.get("format").is_some_and(|v| !v.is_null()) => t.clone(),
        _ => json!({"format": {"type": "text"}}),
    };
    let (text, prompt) = render_prompt(st, rendered, tool_req.map(|t| t.rendered), extra)?;
    let mut setup = ReplySetup::new(st, &text, &thinking, answer)?;
    setup.first_call_only = plan.first_only;
    let mut shown = tools::shown_markers(st, plan.format);
    shown.extend(reply::shown_markers(st));
    let max_tokens = gen::resolve_max_tokens(st, &f, &["max_output_tokens"], prompt.len(), false)?;
    let meta = Meta {
        id: new_id("resp_"),
        msg_id: new_id("msg_"),
        created: unix_now(),
        model: st.model.id.clone(),
        instructions,
        max_output_tokens: f.int_in("max_output_tokens", 1, i64::MAX)?,
        temperature: params.temperature,
        top_p: params.top_p,
        previous,
        store,
        metadata,
        tools: echoed_tools,
        tool_choice,
        parallel_tool_calls,
        text: text_echo,
    };
    let job = Job {
        prompt,
        params,
        max_tokens,
        stops: Vec::new(),
        logprobs: false,
        top_logprobs: 0,
        prompt_logprobs: None,
        priority: f.priority()?,
        draft: f.bool("draft")?.unwrap_or(true),
        constraint: setup.constraint.clone(),
        shown,
        call_end: setup.call_end(plan.format),
    };
    Ok(ResponsesRequest { job, stream, setup, tool_format: plan.format, messages, meta })
}

async fn run(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(&st, &headers, body).await?;
    let ResponsesRequest { job, stream, setup, tool_format, messages, meta } = parse(&st, &body)?;
    let mut running = gen::start(&st, &job)?;
    let first = gen::first(&mut running).await?;
    let keep = move |st: &AppState, meta: &Meta, items: &Items, obj: &Value| {
        if meta.store {
            let mut conv = messages.clone();
            conv.push(items.assistant_message());
            st.store.lock().unwrap_or_else(|p| p.into_inner()).put(meta.id.clone(), conv, obj.clone());
        }
    };
    let mut items = Items::new(meta.msg_id.clone());
    let mut splitter = setup.splitter(tool_format);
    let stop_ids = st.model.tokenizer.stop_ids().to_vec();
    let think_end = setup.think_end;
    let reasoning_tokens =
        move |out: &GenOutput, end: &reply::ReplyEnd| reply::reasoning_tokens(&out.tokens, think_end, end, &stop_ids);
    if !stream {
        let (tokens, out, tail, stop_hit) = gen::collect(running, first).await?;
        let mut text: String = tokens.iter().map(|(_, t)| t.as_str()).collect();
        text.push_str(&tail);
        let status = if gen::finish_reason(&out, stop_hit) == "length" { "incomplete" } else { "completed" };
        let mut none = |_: &str, _: Value| {};
        let end = feed(&mut items, &mut splitter, &text, true, status, &mut none);
        let mut obj = meta.object(status, Some(&items), Some(&out), stop_hit);
        if let Some(end) = &end {
            obj["usage"]["output_tokens_details"]["reasoning_tokens"] = json!(reasoning_tokens(&out, end));
        }
        keep(&st, &meta, &items, &obj);
        return Ok(axum::Json(obj).into_response());
    }
    let mut seq = 0u64;
    let mut opened = false;
    let st2 = st.clone();
    Ok(gen::sse(running, first, move |piece| {
        let mut s = String::new();
        let mut ev = |ty: &str, mut v: Value| {
            v["type"] = json!(ty);
            v["sequence_number"] = json!(seq);
            seq += 1;
            s.push_str(&format!("event: {ty}\ndata: {v}\n\n"));
        };
        if !opened {
            opened = true;
            ev("response.created", json!({"response": meta.object("in_progress", None, None, false)}));
            ev("response.in_progress", json!({"response": meta.object("in_progress", None, None, false)}));
            // Without parsing the reply is one message, opened at once.
            if !splitter.parses_tools() && !splitter.parses_reasoning() {
                items.open_message(&mut ev);
            }
        }
        match piece {
            Piece::Token { text: t, .. } => {
                feed(&mut items, &mut splitter, &t, false, "", &mut ev);
                (s, false)
            }
            Piece::Done { out, tail, stop_hit } => {
                let incomplete = gen::finish_reason(&out, stop_hit) == "length";
                let status = if incomplete { "incomplete" } else { "completed" };
                let end = feed(&mut items, &mut splitter, &tail, true, status, &mut ev);
                let mut obj = meta.object(status, Some(&items), Some(&out), stop_hit);
                if let Some(end) = &end {
                    obj["usage"]["output_tokens_details"]["reasoning_tokens"] = json!(reasoning_tokens(&out, end));
                }
                keep(&st2, &meta, &items, &obj);
                ev(if incomplete { "response.incomplete" } else { "response.completed" }, json!({"response": obj}));
                (s, true)
            }
            Piece::Error(e) => {
                let err = gen::engine_error(e);
                ev("error", json!({"code": err.code, "message": err.message, "param": err.param}));
                (s, true)
            }
        }
    }))
}

/// Feeds reply text to the items through the splitter; `end` finishes them with the message `status` and
/// returns the splitter's end.
fn feed(
    items: &mut Items,
    splitter: &mut ReplySplitter,
    text: &str,
    end: bool,
    status: &str,
    emit: Emit<'_>,
) -> Option<reply::ReplyEnd> {
    for e in splitter.push(text) {
        items.event(e, emit);
    }
    if !end {
        return None;
    }
    let mut fin = splitter.finish();
    for e in std::mem::take(&mut fin.events) {
        items.event(e, emit);
    }
    items.finish(&fin.calls, status, emit);
    Some(fin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_is_bounded_in_entries_and_bytes() {
        let mut s = Store::new(3, 10_000);
        for i in 0..5 {
            s.put(format!("r{i}"), vec![json!({"role": "user", "content": "hi"})], json!({"id": i}));
        }
        assert_eq!(s.len(), 3);
        assert!(s.conversation("r0").is_none() && s.conversation("r1").is_none());
        assert!(s.conversation("r4").is_some());
        let mut s = Store::new(100, 300);
        let big = "x".repeat(120);
        for i in 0..5 {
            s.put(format!("r{i}"), vec![json!({"content": big})], json!({}));
            assert!(s.bytes() <= 300, "{}", s.bytes());
        }
        assert!(s.len() < 5 && s.conversation("r4").is_some());
        // Larger than the whole bound: not kept, nothing evicted for it.
        let before = s.len();
        s.put("huge".into(), vec![json!({"content": "y".repeat(1000)})], json!({}));
        assert!(s.conversation("huge").is_none());
        assert_eq!(s.len(), before);
    }

    #[test]
    fn input_forms() {
        assert_eq!(input_messages(Some(&json!("hi"))).unwrap(), vec![json!({"role": "user", "content": "hi"})]);
        let items = json!([{"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
                           {"type": "message", "role": "user", "content": "hi"}]);
        let m = input_messages(Some(&items)).unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert!(input_messages(Some(&json!([{"type": "function_call_output"}]))).is_err());
        let items = json!([{"role": "user", "content": "weather?"},
                           {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\": \"Oslo\"}"},
                           {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
                           {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]);
        let m = input_messages(Some(&items)).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[1]["tool_calls"][1]["id"], "c2");
        assert_eq!(m[1]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
        assert_eq!(m[2], json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}));
        assert!(input_messages(Some(&json!([{"type": "function_call", "call_id": "c", "name": "w"}]))).is_err());
        assert!(input_messages(Some(&json!([{"type": "web_search_call"}]))).is_err());
        assert!(input_messages(Some(&json!(5))).is_err());
        assert!(input_messages(Some(&json!([]))).is_err());
        assert!(input_messages(None).is_err());
    }
}
