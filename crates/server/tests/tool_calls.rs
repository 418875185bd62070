//! Tool calls through the router with a scripted model over the byte tokenizer standing in for a real one.
//!
//! * `parallel_tool_calls: false` (Anthropic: `disable_parallel_tool_use`) with `tool_choice: auto`: a model that
//!   writes two Hermes calls and then text gets one call, the reply ends as soon as that call's object closes
//!   (fewer tokens generated), and streamed and non-streamed replies agree. Without the flag the same model's
//!   reply has both calls.
//! * A forced call (`tool_choice: required`) for a Mistral template that writes `[ARGS]` compiles the named
//!   syntax's grammar, and a model writing `[TOOL_CALLS]NAME[ARGS]{...}` under it gets its call parsed.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tf_core::{Backend, KvCache, KvSpec, Precision, Tensor};
use tf_engine::{EngineConfig, EngineHandle};
use tf_models::{Batch, Model};
use tf_server::tools::ToolParserSetting;
use tf_server::{AppState, ServedModel, ServerConfig, Shared};
use tf_text::{ChatTemplate, Tokenizer, ToolFormat};
use tower::ServiceExt;

const SCRIPT: &str =
    "Checking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n\
                      {\"name\": \"b\", \"arguments\": {}}\n</tool_call>\nDone, and more text after the calls.";
/// The prompt's last character (the template ends with it; the script never writes it).
const PROMPT_END: &str = "@";

/// Writes `script` token by token after a prompt that ends with [`PROMPT_END`], then repeats its last token.
struct ScriptedModel {
    vocab: usize,
    script: Vec<u32>,
    prompt_end: u32,
    next: AtomicUsize,
}

impl Model for ScriptedModel {
    fn family(&self) -> &'static str {
        "scripted"
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn context_length(&self) -> usize {
        1024
    }
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: 1, blocks, block_size, kv_heads: 1, head_dim: 1 }
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn forward(&self, _be: &dyn Backend, batch: &Batch, _kv: &mut KvCache) -> Tensor {
        let mut logits = vec![0.0; batch.logit_rows.len() * self.vocab];
        for (r, &row) in batch.logit_rows.iter().enumerate() {
            if batch.tokens[row] == self.prompt_end {
                self.next.store(0, Ordering::SeqCst);
            }
            let i = self.next.fetch_add(1, Ordering::SeqCst).min(self.script.len() - 1);
            logits[r * self.vocab + self.script[i] as usize] = 10.0;
        }
        Tensor::host(batch.logit_rows.len(), self.vocab, logits)
    }
}

fn state() -> (Shared, Arc<Tokenizer>) {
    scripted(SCRIPT, "{% for m in messages %}{{ m.content }}{% endfor %}@", ToolFormat::Hermes)
}

/// The app state over a model writing `script` after prompts rendered with `template` (which ends with
/// [`PROMPT_END`]), calls parsed in `format`.
fn scripted(script: &str, template: &str, format: ToolFormat) -> (Shared, Arc<Tokenizer>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/byte-tokenizer.json");
    let json = std::fs::read(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    // `^` (written by no script) ends a sequence, so grammars can end one.
    let plain = Tokenizer::from_hf_json(&json, None, &[]).expect("byte tokenizer");
    let eos = plain.encode("^", false, false).expect("^")[0];
    let tokenizer = Arc::new(Tokenizer::from_hf_json(&json, None, &[eos]).expect("byte tokenizer"));
    let script = tokenizer.encode(script, false, false).expect("script");
    let prompt_end = tokenizer.encode(PROMPT_END, false, false).expect("@")[0];
    assert!(!script.contains(&prompt_end));
    let model = ScriptedModel { vocab: tokenizer.vocab_size(), script, prompt_end, next: AtomicUsize::new(0) };
    let cfg = EngineConfig {
        kv_blocks: 64,
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
    let template = ChatTemplate::new(template).expect("template");
    let served = ServedModel {
        id: "scripted".into(),
        aliases: vec![],
        family: "scripted".into(),
        tokenizer: tokenizer.clone(),
        template: Some(template),
        context: 1024,
    };
    let cfg = ServerConfig { tool_parser: ToolParserSetting::Format(format), ..ServerConfig::default() };
    (AppState::new(served, engine, cfg), tokenizer)
}

/// One POST through the router: (status, body text).
async fn post(st: &Shared, path: &str, body: Value) -> (StatusCode, String) {
    let req = Request::builder().method("POST").uri(path).header("content-type", "application/json");
    let resp = tf_server::router(st.clone()).oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 22).await.expect("body");
    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

fn chat(parallel: Option<bool>, stream: bool) -> Value {
    let mut body = json!({
        "model": "scripted", "max_tokens": 400, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "Call both."}],
        "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}],
    });
    if let Some(p) = parallel {
        body["parallel_tool_calls"] = json!(p);
    }
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// (content, calls as (name, arguments), finish_reason, completion_tokens) of a chat reply, streamed or not.
fn chat_reply(body: &str, stream: bool) -> (String, Vec<(String, String)>, String, u64) {
    if !stream {
        let v: Value = serde_json::from_str(body).expect("json");
        let m = &v["choices"][0]["message"];
        let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
        let calls = calls
            .iter()
            .map(|c| {
                (c["function"]["name"].as_str().unwrap().into(), c["function"]["arguments"].as_str().unwrap().into())
            })
            .collect();
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap().to_string();
        return (
            m["content"].as_str().unwrap_or("").into(),
            calls,
            finish,
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        );
    }
    let (mut content, mut calls, mut finish, mut used) = (String::new(), Vec::<(String, String)>::new(), None, None);
    for line in body.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let v: Value = serde_json::from_str(line).expect("chunk");
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            used = Some(n);
        }
        let Some(choice) = v["choices"].get(0) else { continue };
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if let Some(name) = tc["function"]["name"].as_str() {
                assert_eq!(i, calls.len());
                calls.push((name.into(), String::new()));
            }
            calls[i].1.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (content, calls, finish.expect("a finish_reason"), used.expect("usage"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_ends_at_the_first_call_streamed_or_not() {
    let (st, tok) = state();
    let first = ("a".to_string(), "{\"x\": 1}".to_string());
    // Tokens up to the close of the first call's object (the byte tokenizer: one token per byte here).
    let close = SCRIPT.find("{\"x\": 1}}").unwrap() + "{\"x\": 1}}".len();
    let until_close = tok.encode(&SCRIPT[..close], false, false).unwrap().len() as u64;
    for stream in [false, true] {
        let (code, body) = post(&st, "/v1/chat/completions", chat(Some(false), stream)).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        let (content, calls, finish, used) = chat_reply(&body, stream);
        assert_eq!((content.as_str(), calls, finish.as_str()), ("Checking.", vec![first.clone()], "tool_calls"));
        assert_eq!(used, until_close, "stream: {stream}");

        for parallel in [None, Some(true)] {
            let (code, body) = post(&st, "/v1/chat/completions", chat(parallel, stream)).await;
            assert_eq!(code, StatusCode::OK, "{body}");
            let (content, calls, finish, used) = chat_reply(&body, stream);
            assert_eq!(calls, vec![first.clone(), ("b".into(), "{}".into())], "stream: {stream}");
            // The script's last token repeats to the token limit.
            assert!(content.starts_with("Checking.Done, and more text after the calls."), "{content:?}");
            assert_eq!((finish.as_str(), used), ("length", 400));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_end_at_the_first_call() {
    let (st, _) = state();
    let tools = json!([{"type": "function", "name": "a"}, {"type": "function", "name": "b"}]);
    let body = json!({"model": "scripted", "input": "Call both.", "max_output_tokens": 400, "temperature": 0,
                      "tools": tools, "parallel_tool_calls": false, "store": false});
    let (code, text) = post(&st, "/v1/responses", body).await;
    assert_eq!(code, StatusCode::OK, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let calls: Vec<&Value> = v["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect();
    assert_eq!(
        (calls.len(), calls[0]["name"].as_str(), v["status"].as_str()),
        (1, Some("a"), Some("completed")),
        "{v}"
    );

    let tools =
        json!([{"name": "a", "input_schema": {"type": "object"}}, {"name": "b", "input_schema": {"type": "object"}}]);
    for (disable, n) in [(true, 1), (false, 2)] {
        let body = json!({"model": "scripted", "max_tokens": 400, "temperature": 0, "tools": tools,
                          "tool_choice": {"type": "auto", "disable_parallel_tool_use": disable},
                          "messages": [{"role": "user", "content": "Call both."}]});
        let (code, text) = post(&st, "/v1/messages", body).await;
        assert_eq!(code, StatusCode::OK, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let uses = v["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").count();
        let reason = if disable { "tool_use" } else { "max_tokens" };
        assert_eq!((uses, v["stop_reason"].as_str()), (n, Some(reason)), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_named_syntax_is_forced_and_parsed() {
    let template = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}[TOOL_CALLS]\
                    {{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}@";
    let (st, _) = scripted("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", template, ToolFormat::Mistral);
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                        "additionalProperties": false});
    for stream in [false, true] {
        let body = json!({
            "model": "scripted", "max_tokens": 64, "temperature": 0, "stream": stream, "tool_choice": "required",
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": params}},
                      {"type": "function", "function": {"name": "noop"}}],
        });
        let (code, body) = post(&st, "/v1/chat/completions", body).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        let (content, calls, _, _) = chat_reply(&body, stream);
        assert_eq!(content, "", "stream: {stream}");
        assert_eq!(calls, vec![("get_weather".to_string(), "{\"city\": \"Paris\"}".to_string())], "stream: {stream}");
    }
}

/// A client sends this server's call ids (`call_…`) back; Mistral Small 3.2's template takes only ids of 9
/// letters and digits, and gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistral_template_takes_this_servers_call_ids_back() {
    let template = include_str!("../../../fixtures/chat/templates/mistral-small-3.2.jinja");
    let (st, _) = scripted("Sunny.", template, ToolFormat::Mistral);
    let id = "call_0123456789abcdef01234567_0";
    let body = |id: &str| {
        json!({
            "model": "scripted", "max_tokens": 4, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": "get_weather"}}],
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": id, "content": "22C"},
            ],
        })
    };
    let (code, text) = post(&st, "/v1/chat/completions", body(id)).await;
    assert_eq!(code, StatusCode::OK, "{text}");
    // The template itself still refuses a conversation whose calls and results do not pair up by id.
    let mut unpaired = body(id);
    unpaired["messages"][3]["tool_call_id"] = json!(42);
    let (code, text) = post(&st, "/v1/chat/completions", unpaired).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("Tool call IDs should be alphanumeric strings with length 9"), "{text}");
}
