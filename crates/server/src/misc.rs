//! `GET /v1/models`, `GET /health`, `GET /metrics`, `POST /tokenize`, `POST /detokenize`.

use crate::chat::{chat_prompt, normalize_messages};
use crate::error::ApiError;
use crate::params::{kind, parse_object, Fields};
use crate::{read_body, Shared};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use std::fmt::Write;
use std::sync::atomic::Ordering;
use tf_engine::TTFT_BUCKETS;

pub async fn models(State(st): State<Shared>) -> Response {
    axum::Json(json!({"object": "list", "data": [{
        "id": st.model.id, "object": "model", "created": st.created, "owned_by": "tensorfold",
        "root": st.model.id, "parent": null, "max_model_len": st.model.context,
    }]}))
    .into_response()
}

/// The OpenAPI 3.1 document of every route (GET /openapi.json).
pub const OPENAPI: &str = include_str!("openapi.json");

/// The document with every request's `model` narrowed to the names this server answers to (any other is a 404).
pub async fn openapi(State(st): State<Shared>) -> Response {
    let mut doc: Value = serde_json::from_str(OPENAPI).expect("openapi.json is valid JSON (a unit test checks)");
    let names: Vec<&str> =
        std::iter::once(st.model.id.as_str()).chain(st.model.aliases.iter().map(String::as_str)).collect();
    narrow_model(&mut doc, &json!({"type": "string", "enum": names}));
    axum::Json(doc).into_response()
}

/// Replaces the schema of every `model` property under `v` with `schema`.
fn narrow_model(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(props)) = m.get_mut("properties") {
                if props.contains_key("model") {
                    props.insert("model".into(), schema.clone());
                }
            }
            m.values_mut().for_each(|x| narrow_model(x, schema));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| narrow_model(x, schema)),
        _ => {}
    }
}

pub async fn health(State(st): State<Shared>) -> Response {
    let s = st.engine.stats();
    let load = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
    let failure = st.engine.failure();
    let status = match (&failure, st.engine.is_accepting()) {
        (Some(_), _) => "failed",
        (None, true) => "ok",
        (None, false) => "shutting_down",
    };
    let mut body = json!({
        "status": status,
        "model": st.model.id,
        "uptime_s": st.started.elapsed().as_secs(),
        "requests_running": load(&s.running),
        "requests_waiting": load(&s.waiting),
        "requests_finished": s.finished_total(),
        "kv_blocks_used": load(&s.kv_blocks_used),
        "kv_blocks_cached": load(&s.kv_blocks_cached),
        "kv_blocks_total": load(&s.kv_blocks_total),
        "prompt_tokens_total": s.prompt_tokens.load(Ordering::Relaxed),
        "generation_tokens_total": s.generation_tokens.load(Ordering::Relaxed),
        "decode_tokens_per_s": s.live_decode_milli_tps.load(Ordering::Relaxed) as f64 / 1000.0,
        "stored_responses": st.store.lock().unwrap_or_else(|p| p.into_inner()).len(),
        "stored_response_bytes": st.store.lock().unwrap_or_else(|p| p.into_inner()).bytes(),
    });
    if let Some(why) = failure {
        body["error"] = json!(why);
    }
    let code = if status == "ok" { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
    (code, axum::Json(body)).into_response()
}

/// Prometheus text, with vLLM's metric names where one exists (so vLLM dashboards work unchanged).
pub async fn metrics(State(st): State<Shared>) -> Response {
    let s = st.engine.stats();
    let label = format!("model_name=\"{}\"", st.model.id.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, ty: &str, v: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}\n{name}{{{label}}} {v}");
    };
    let u = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as f64;
    let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    gauge("vllm:num_requests_running", "Requests in model execution.", "gauge", u(&s.running));
    gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", "gauge", u(&s.waiting));
    let total = u(&s.kv_blocks_total).max(1.0);
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        "gauge",
        u(&s.kv_blocks_used) / total,
    );
    gauge("vllm:prompt_tokens_total", "Prefill tokens processed.", "counter", c(&s.prompt_tokens));
    gauge("vllm:generation_tokens_total", "Generation tokens processed.", "counter", c(&s.generation_tokens));
    gauge(
        "vllm:prefix_cache_queries_total",
        "Prompt tokens looked up in the prefix cache.",
        "counter",
        c(&s.prefix_query_tokens),
    );
    gauge(
        "vllm:prefix_cache_hits_total",
        "Prompt tokens served from the prefix cache.",
        "counter",
        c(&s.prefix_hit_tokens),
    );
    gauge(
        "vllm:num_preemptions_total",
        "Background requests preempted (KV released, resumed later) for interactive ones.",
        "counter",
        c(&s.preemptions),
    );
    gauge("vllm:spec_decode_num_draft_tokens_total", "Draft tokens proposed.", "counter", c(&s.drafted_tokens));
    gauge("vllm:spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", "counter", c(&s.accepted_tokens));
    gauge("tensorfold:prefill_seconds_total", "Seconds spent filling prompts.", "counter", c(&s.prefill_us) / 1e6);
    gauge("tensorfold:decode_seconds_total", "Seconds spent decoding.", "counter", c(&s.decode_us) / 1e6);
    gauge("tensorfold:queue_seconds_total", "Seconds requests spent waiting.", "counter", c(&s.queue_us) / 1e6);
    gauge(
        "tensorfold:http_requests_rejected_total",
        "Requests refused before the engine.",
        "counter",
        st.rejected.load(Ordering::Relaxed) as f64,
    );
    gauge("tensorfold:http_connections_open", "Connections being served.", "gauge", c(&st.connections_open));
    gauge(
        "tensorfold:http_connections_refused_total",
        "Connections answered 503 (or closed) because --max-connections were open.",
        "counter",
        c(&st.connections_refused),
    );
    let _ = writeln!(out, "# HELP vllm:request_success_total Finished requests by finish reason.");
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    for (reason, a) in [
        ("stop", &s.finished_stop),
        ("length", &s.finished_length),
        ("abort", &s.finished_cancelled),
        ("error", &s.finished_error),
    ] {
        let _ = writeln!(out, "vllm:request_success_total{{{label},finished_reason=\"{reason}\"}} {}", c(a));
    }
    let name = "vllm:time_to_first_token_seconds";
    let _ = writeln!(out, "# HELP {name} Time to first token in seconds.\n# TYPE {name} histogram");
    let mut cum = 0.0;
    for (i, b) in TTFT_BUCKETS.iter().enumerate() {
        cum += c(&s.ttft_buckets[i]);
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b}\"}} {cum}");
    }
    cum += c(&s.ttft_buckets[TTFT_BUCKETS.len()]);
    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {cum}");
    let _ = writeln!(out, "{name}_sum{{{label}}} {}", c(&s.ttft_sum_us) / 1e6);
    let _ = writeln!(out, "{name}_count{{{label}}} {cum}");
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

pub async fn tokenize(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    tokenize_inner(st, headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn tokenize_inner(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(&st, &headers, body).await?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj);
    st.check_model(&f)?;
    let tok = &st.model.tokenizer;
    let tokens = if f.get("messages").is_some() {
        let messages = normalize_messages(f.get("messages"), "messages")?;
        let tools = crate::tools::read(&f, crate::tools::Shape::Chat)?.map(|t| t.rendered);
        chat_prompt(&st, messages, tools, Map::new())?
    } else {
        let prompt = f.str("prompt")?.ok_or_else(|| ApiError::field("prompt", "is required (or give messages)"))?;
        let special = f.bool("add_special_tokens")?.unwrap_or(true);
        tok.encode(prompt, special, true).map_err(|e| ApiError::field("prompt", e))?
    };
    let mut reply = json!({"count": tokens.len(), "max_model_len": st.model.context, "tokens": tokens});
    if f.bool("return_token_strs")?.unwrap_or(false) {
        let strs: Vec<String> = tokens.iter().map(|&id| crate::gen::token_text(tok, id).0).collect();
        reply["token_strs"] = json!(strs);
    }
    Ok(axum::Json(reply).into_response())
}

pub async fn detokenize(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    detokenize_inner(st, headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn detokenize_inner(st: Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let body = read_body(&st, &headers, body).await?;
    let obj = parse_object(&body)?;
    let f = Fields::new(&obj);
    st.check_model(&f)?;
    let vocab = st.model.tokenizer.vocab_size();
    let ids: Vec<u32> = match f.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                _ => Err(ApiError::field("tokens", format!("item {i}: {x} is not a token id below {vocab}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(ApiError::field("tokens", format!("expected an array of token ids, got {}", kind(v)))),
        None => return Err(ApiError::field("tokens", "is required")),
    };
    let text = st.model.tokenizer.decode(&ids, false).map_err(|e| ApiError::field("tokens", e))?;
    Ok(axum::Json(json!({"prompt": text})).into_response())
}

#[cfg(test)]
mod openapi_tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route_and_error_shapes() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/responses/{response_id}",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/models",
            "/tokenize",
            "/detokenize",
            "/health",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(paths.contains(&p), "{p} is not documented");
        }
        let err = &doc["paths"]["/v1/messages"]["post"]["responses"]["400"]["content"]["application/json"]["schema"];
        assert_eq!(err["$ref"], "#/components/schemas/AnthropicError");
        let err = &doc["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]["application/json"];
        assert_eq!(err["schema"]["$ref"], "#/components/schemas/Error");
        let mut d = doc.clone();
        narrow_model(&mut d, &json!({"enum": ["m"]}));
        let chat = &d["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"];
        assert_eq!(chat["schema"]["properties"]["model"]["enum"][0], "m");
    }
}
