//! `POST /v1/chat/completions`.

use crate::error::ApiError;
use crate::gen::{self, Job, Piece};
use crate::params::{kind, parse_object, sampling, Fields};
use crate::reply::{self, EffortField, ReplyEvent, ReplySetup};
use crate::structured::{self, FormatField, OutputGrammar};
use crate::tools;
use crate::{new_id, read_body, unix_now, AppState, Shared};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tf_core::ConstraintSpec;
use tf_text::ChatRenderOptions;

pub async fn handle(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    match run(st, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Turns OpenAI messages into what chat templates expect: string content (text parts joined), `developer` as
/// `system`, tool fields passed through.
pub fn normalize_messages(v: Option<&Value>, field: &str) -> Result<Vec<Value>, ApiError> {
    let Some(v) = v else { return Err(ApiError::field(field, "is required")) };
    let Value::Array(items) = v else {
        return Err(ApiError::field(field, format!("expected an array of messages, got {}", kind(v))));
    };
    if items.is_empty() {
        return Err(ApiError::field(field, "must hold at least one message"));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Value::Object(m) = m else {
            return Err(ApiError::field(&at, format!("expected an object, got {}", kind(m))));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            Some(v) => {
                return Err(ApiError::field(&format!("{at}.role"), format!("expected a string, got {}", kind(v))))
            }
            None => return Err(ApiError::field(&format!("{at}.role"), "is required")),
        };
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            "developer" => "system",
            other => {
                return Err(ApiError::field(
                    &format!("{at}.role"),
                    format!("unknown role `{other}` (expected system, developer, user, assistant or tool)"),
                ))
            }
        };
        let content = content_text(m.get("content"), &format!("{at}.content"))?;
        if content.is_none() && !(role == "assistant" && m.get("tool_calls").is_some_and(|t| !t.is_null())) {
            return Err(ApiError::field(&format!("{at}.content"), "is required"));
        }
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(role.into()));
        msg.insert("content".into(), content.map(Value::String).unwrap_or(Value::Null));
        for key in ["name", "tool_calls", "tool_call_id", "reasoning_content"] {
            if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
                msg.insert(key.into(), v.clone());
            }
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// Message content: a string, or an array of text parts (`text`, `input_text`, `output_text`) joined.
pub fn content_text(v: Option<&Value>, field: &str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                let at = format!("{field}[{i}]");
                match p {
                    Value::String(s) => text.push_str(s),
                    Value::Object(o) => {
                        let t = o.get("type").and_then(Value::as_str).unwrap_or("text");
                        if !matches!(t, "text" | "input_text" | "output_text") {
                            return Err(ApiError::field(
                                &at,
                                format!("content parts of type `{t}` are not supported (text only)"),
                            ));
                        }
                        match o.get("text") {
                            Some(Value::String(s)) => text.push_str(s),
                            _ => return Err(ApiError::field(&format!("{at}.text"), "expected a string")),
                        }
                    }
                    v => return Err(ApiError::field(&at, format!("expected a content part, got {}", kind(v)))),
                }
            }
            Ok(Some(text))
        }
        Some(v) => Err(ApiError::field(field, format!("expected a string or an array of parts, got {}", kind(v)))),
    }
}

/// Renders messages with the model's chat template and tokenizes the result. Earlier tool calls' `arguments`
/// reach the template as objects ([`tools::arguments_as_objects`]), and their ids as the template takes them
/// ([`tools::call_ids_for_template`]).
pub fn chat_prompt(
    st: &AppState,
    messages: Vec<Value>,
    tools: Option<Value>,
    extra: Map<String, Value>,
) -> Result<Vec<u32>, ApiError> {
    render_prompt(st, messages, tools, extra).map(|(_, ids)| ids)
}

/// [`chat_prompt`], also returning the rendered text (its end says whether the reply starts inside thinking:
/// [`ReplySetup::new`]).
pub fn render_prompt(
    st: &AppState,
    mut messages: Vec<Value>,
    tools: Option<Value>,
    extra: Map<String, Value>,
) -> Result<(String, Vec<u32>), ApiError> {
    let Some(template) = &st.model.template else {
        return Err(ApiError::invalid(
            Some("messages".into()),
            format!("the model `{}` has no chat template; use /v1/completions with a plain prompt", st.model.id),
        ));
    };
    tools::arguments_as_objects(&mut messages);
    tools::call_ids_for_template(template.source(), &mut messages);
    let tok = &st.model.tokenizer;
    let opts = ChatRenderOptions {
        add_generation_prompt: true,
        tools,
        bos_token: tok.bos_token().map(str::to_owned),
        eos_token: tok.eos_token().map(str::to_owned),
        extra,
        ..Default::default()
    };
    let text = template.render(&Value::Array(messages), &opts).map_err(|e| {
        ApiError::invalid(Some("messages".into()), format!("the chat template refused the messages: {e}"))
    })?;
    let ids = tok.encode(&text, false, true).map_err(|e| ApiError::invalid(Some("messages".into()), e.to_string()))?;
    Ok((text, ids))
}

/// A chat request read and checked: the engine job and how the reply is shaped.
pub struct ChatRequest {
    pub job: Job,
    pub stream: bool,
    pub include_usage: bool,
    pub return_ids: bool,
    pub setup: ReplySetup,
    /// The tool-call format replies are parsed with (`None`: calls are not parsed).
    pub tool_format: Option<tf_text::ToolFormat>,
}

/// The route's request → parameters step: a body into a [`ChatRequest`] (template rendered, prompt tokenized,
/// grammars compiled), or the error the route answers. Touches no engine and does no I/O.
pub fn parse(st: &AppState, body: &[u8]) -> Result<ChatRequest, ApiError> {
    let obj = parse_object(body)?;
    let f = Fields::new(&obj);
    st.check_model(&f)?;
    f.check_n()?;
    let output = structured::output_grammar(&f, FormatField::ResponseFormat)?;
    f.str("user")?;
    let messages = normalize_messages(f.get("messages"), "messages")?;
    let tool_req = tools::read(&f, tools::Shape::Chat)?;
    let plan = tools::plan(st, tool_req.as_ref())?;
    let answer = constrain(st, output, plan.forced)?;
    let thinking = reply::read_thinking(&f, EffortField::ReasoningEffort)?;
    let extra = thinking.template_vars(reply::template_kwargs(&f)?);
    let params = sampling(&f, &st.cfg.defaults, st.model.tokenizer.vocab_size())?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.int_in("top_logprobs", 0, 20)?;
    if top.is_some_and(|t| t > 0) && !logprobs {
        return Err(ApiError::field("top_logprobs", "needs `logprobs: true`"));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = f.include_usage()?;
    let return_ids = f.bool("return_token_ids")?.unwrap_or(false);
    let stops = f.stops("stop")?;
    let priority = f.priority()?;
    let draft = f.bool("draft")?.unwrap_or(true);
    let (rendered, prompt) = render_prompt(st, messages, tool_req.map(|t| t.rendered), extra)?;
    let mut setup = ReplySetup::new(st, &rendered, &thinking, answer)?;
    setup.first_call_only = plan.first_only;
    let mut shown = tools::shown_markers(st, plan.format);
    shown.extend(reply::shown_markers(st));
    let max_tokens = gen::resolve_max_tokens(st, &f, &["max_completion_tokens", "max_tokens"], prompt.len(), false)?;
    let job = Job {
        prompt,
        params,
        max_tokens,
        stops,
        logprobs,
        top_logprobs: if logprobs { top.unwrap_or(0) as usize } else { 0 },
        prompt_logprobs: None,
        priority,
        draft,
        constraint: setup.constraint.clone(),
        shown,
        call_end: setup.call_end(plan.format),
    };
    Ok(ChatRequest { job, stream, include_usage, return_ids, setup, tool_format: plan.format })
}

async fn run(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(&st, &headers, body).await?;
    let ChatRequest { job, stream, include_usage, return_ids, setup, tool_format } = parse(&st, &body)?;
    let logprobs = job.logprobs;
    let mut running = gen::start(&st, &job)?;
    let first = gen::first(&mut running).await?;
    let id = new_id("chatcmpl-");
    let created = unix_now();
    let model = st.model.id.clone();
    if !stream {
        let (tokens, out, tail, stop_hit) = gen::collect(running, first).await?;
        let mut text: String = tokens.iter().map(|(_, t)| t.as_str()).collect();
        text.push_str(&tail);
        let lp = logprobs.then(|| {
            let content: Vec<Value> = tokens
                .iter()
                .filter(|(ev, _)| !ev.is_stop)
                .map(|(ev, _)| gen::chat_logprob(&st.model.tokenizer, ev.token, ev.logprob, &ev.top))
                .collect();
            json!({"content": content})
        });
        let mut finish = gen::finish_reason(&out, stop_hit);
        let end = setup.split(tool_format, &text);
        let has_calls = !end.calls.is_empty();
        let content =
            if end.content.is_empty() && has_calls { Value::Null } else { Value::String(end.content.clone()) };
        let mut message = json!({"role": "assistant", "content": content});
        if let Some(r) = &end.reasoning {
            message["reasoning_content"] = Value::String(r.clone());
        }
        if has_calls {
            message["tool_calls"] = tools::chat_calls(&end.calls);
            finish = if finish == "length" { finish } else { "tool_calls" };
        }
        let mut usage = gen::usage(&out);
        if setup.parser.is_some() {
            let n = reply::reasoning_tokens(&out.tokens, setup.think_end, &end, st.model.tokenizer.stop_ids());
            usage["completion_tokens_details"] = json!({"reasoning_tokens": n});
        }
        let mut choice = json!({"index": 0, "message": message, "logprobs": lp, "finish_reason": finish});
        let mut reply = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fingerprint(&st),
            "choices": [], "usage": usage, "tensorfold": gen::receipt(&out),
        });
        if return_ids {
            choice["token_ids"] = json!(out.tokens);
            reply["prompt_token_ids"] = json!(job.prompt);
        }
        reply["choices"] = json!([choice]);
        return Ok(axum::Json(reply).into_response());
    }
    let tok = st.model.tokenizer.clone();
    let fp = fingerprint(&st);
    let chunk = move |choices: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "system_fingerprint": fp, "choices": choices})
    };
    let mut started = false;
    let prompt_ids = job.prompt.clone();
    let mut splitter = setup.splitter(tool_format);
    let parses_reasoning = setup.parser.is_some();
    let think_end = setup.think_end;
    let stop_ids = st.model.tokenizer.stop_ids().to_vec();
    Ok(gen::sse(running, first, move |piece| {
        let mut out = String::new();
        if !started {
            started = true;
            let mut c = chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                                       "finish_reason": null}]));
            if return_ids {
                c["prompt_token_ids"] = json!(prompt_ids);
            }
            out.push_str(&gen::sse_data(&c));
        }
        match piece {
            Piece::Token { ev, text } => {
                let lp = (logprobs && !ev.is_stop)
                    .then(|| json!({"content": [gen::chat_logprob(&tok, ev.token, ev.logprob, &ev.top)]}));
                let deltas: Vec<Value> = splitter.push(&text).iter().map(tools::chat_delta).collect();
                let mut extra = (lp, return_ids.then(|| json!([ev.token])));
                if deltas.is_empty() && (extra.0.is_some() || extra.1.is_some()) {
                    out.push_str(&gen::sse_data(&chunk(delta_choice(json!({"content": ""}), &mut extra))));
                }
                for d in deltas {
                    out.push_str(&gen::sse_data(&chunk(delta_choice(d, &mut extra))));
                }
                (out, false)
            }
            Piece::Done { out: res, tail, stop_hit } => {
                let mut finish_reason = gen::finish_reason(&res, stop_hit);
                let mut events = splitter.push(&tail);
                let mut end = splitter.finish();
                events.append(&mut end.events);
                // The last text rides on the finish chunk when it is content; anything else goes before it.
                let delta = match events.last() {
                    Some(ReplyEvent::Content(t)) if events.len() == 1 && !splitter.parses_tools() => {
                        json!({"content": t})
                    }
                    _ => {
                        for ev in &events {
                            out.push_str(&gen::sse_data(&chunk(delta_choice(
                                tools::chat_delta(ev),
                                &mut (None, None),
                            ))));
                        }
                        json!({})
                    }
                };
                if !end.calls.is_empty() && finish_reason != "length" {
                    finish_reason = "tool_calls";
                }
                let finish = chunk(json!([{"index": 0, "delta": delta, "logprobs": null,
                                           "finish_reason": finish_reason}]));
                let mut usage = gen::usage(&res);
                if parses_reasoning {
                    let n = reply::reasoning_tokens(&res.tokens, think_end, &end, &stop_ids);
                    usage["completion_tokens_details"] = json!({"reasoning_tokens": n});
                }
                out.push_str(&gen::sse_end_with(finish, chunk(json!([])), include_usage, &res, usage));
                (out, true)
            }
            Piece::Error(e) => {
                out.push_str(&gen::sse_error(e));
                (out, true)
            }
        }
    }))
}

/// One stream choice with `delta`, taking the token's logprobs and ids (they ride on its first chunk).
fn delta_choice(delta: Value, extra: &mut (Option<Value>, Option<Value>)) -> Value {
    let mut choice = json!({"index": 0, "delta": delta, "logprobs": extra.0.take(), "finish_reason": null});
    if let Some(ids) = extra.1.take() {
        choice["token_ids"] = ids;
    }
    json!([choice])
}

/// The reply's constraint: a structured-output grammar or a forced tool call (not both).
pub fn constrain(
    st: &AppState,
    output: Option<OutputGrammar>,
    forced: Option<OutputGrammar>,
) -> Result<Option<Arc<dyn ConstraintSpec>>, ApiError> {
    match (output, forced) {
        (Some(o), Some(_)) => Err(ApiError::field(
            &o.param,
            "cannot be combined with a forced tool call (`tool_choice` \"required\" or a named function)",
        )),
        (Some(g), None) | (None, Some(g)) => structured::compile(st, &g).map(Some),
        (None, None) => Ok(None),
    }
}

/// `system_fingerprint`: the model id and the engine's arithmetic (same fingerprint ⇒ same bits).
pub fn fingerprint(st: &AppState) -> String {
    format!("tensorfold-{}-{}", env!("CARGO_PKG_VERSION"), st.model.family)
}
