//! TensorFold's OpenAI-compatible HTTP server (DESIGN.md §4–§5): axum routes in front of an [`EngineHandle`].
//! The server never touches tensors: it validates, renders chat templates, tokenizes, submits, and turns engine
//! events into OpenAI replies (JSON or SSE), each carrying the `tensorfold` receipt and `usage`.

pub mod body_guard;
pub mod chat;
pub mod completions;
pub mod error;
pub mod gen;
pub mod keys;
pub mod messages;
pub mod messages_types;
pub mod misc;
pub mod params;
pub mod reply;
pub mod resp_items;
pub mod responses;
pub mod run;
pub mod structured;
pub mod tools;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use params::SamplingDefaults;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tf_engine::EngineHandle;
use tf_text::{ChatTemplate, Tokenizer, ToolFormat};

/// The model being served, as the server sees it (no tensors).
pub struct ServedModel {
    /// The id clients name in `model` (also accepted: the file name it came from).
    pub id: String,
    /// Other names accepted in `model` (e.g. the path it was loaded from).
    pub aliases: Vec<String>,
    pub family: String,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// Most tokens one request may hold (prompt + generated): `--context`, at most the model's.
    pub context: usize,
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub defaults: SamplingDefaults,
    /// `max_tokens` when a request gives none: this, or what is left of the context if less.
    pub default_max_tokens: usize,
    /// Keys the API routes accept (`Authorization: Bearer` or `x-api-key`); none: the routes are open.
    pub keys: Arc<keys::ApiKeys>,
    /// Largest request body in bytes.
    pub max_body_bytes: usize,
    /// A request body must arrive whole within this long of the handler starting to read it (408 otherwise).
    pub body_timeout: std::time::Duration,
    /// Stored responses for `previous_response_id`: most entries and most bytes.
    pub store_max_entries: usize,
    pub store_max_bytes: usize,
    /// Which tool-call format replies are parsed with (`--tool-parser`).
    pub tool_parser: tools::ToolParserSetting,
    /// How thinking is split out of replies (`--reasoning-parser`).
    pub reasoning_parser: reply::ReasoningSetting,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            defaults: SamplingDefaults::default(),
            default_max_tokens: 2048,
            keys: Arc::new(keys::ApiKeys::open()),
            max_body_bytes: 8 << 20,
            body_timeout: std::time::Duration::from_secs(30),
            store_max_entries: 1024,
            store_max_bytes: 64 << 20,
            tool_parser: tools::ToolParserSetting::Auto,
            reasoning_parser: reply::ReasoningSetting::Auto,
        }
    }
}

/// Everything a handler needs.
pub struct AppState {
    pub model: ServedModel,
    pub engine: EngineHandle,
    pub cfg: ServerConfig,
    pub store: Mutex<responses::Store>,
    pub started: Instant,
    /// Unix seconds at start (the model's `created`).
    pub created: u64,
    /// HTTP requests refused before reaching the engine, by status class (for /metrics).
    pub rejected: std::sync::atomic::AtomicU64,
    /// Connections being served now, and those refused with 503 because `--max-connections` were open.
    pub connections_open: std::sync::atomic::AtomicU64,
    pub connections_refused: std::sync::atomic::AtomicU64,
    /// The tool-call format of replies (from the chat template, or `--tool-parser`); `None`: calls are not parsed.
    pub tool_format: Option<ToolFormat>,
    /// Grammars compile against this (built once from the tokenizer and the stop ids); why not, when it could
    /// not be built.
    pub grammar: Result<tf_grammar::GrammarEnv, String>,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(model: ServedModel, engine: EngineHandle, cfg: ServerConfig) -> Shared {
        let store = responses::Store::new(cfg.store_max_entries, cfg.store_max_bytes);
        let tool_format = cfg.tool_parser.resolve(model.template.as_ref().map(ChatTemplate::source), &model.tokenizer);
        let grammar = structured::build_env(&model.tokenizer);
        Arc::new(AppState {
            model,
            engine,
            cfg,
            store: Mutex::new(store),
            started: Instant::now(),
            created: unix_now(),
            rejected: Default::default(),
            connections_open: Default::default(),
            connections_refused: Default::default(),
            tool_format,
            grammar,
        })
    }

    /// Checks the request's `model` field: absent, the served id, or an alias.
    pub fn check_model(&self, f: &params::Fields<'_>) -> Result<(), ApiError> {
        match f.str("model")? {
            None => Ok(()),
            Some(m) if m == self.model.id || self.model.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError {
                status: axum::http::StatusCode::NOT_FOUND,
                message: format!("the model `{m}` does not exist; this server serves `{}`", self.model.id),
                kind: "invalid_request_error",
                param: Some("model".into()),
                code: Some("model_not_found"),
            }),
        }
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A short random-looking id: `prefix` + 24 hex chars from the time and a counter (not secret).
pub fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let x = splitmix(t ^ splitmix(n));
    format!("{prefix}{x:016x}{n:08x}")
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The routes.
pub fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/models", get(misc::models))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/responses", post(responses::handle))
        .route("/v1/responses/{id}", get(responses::get_stored))
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/openapi.json", get(misc::openapi))
        .merge(api)
        .fallback(|req: Request| async move {
            let e = ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path()));
            error_for(req.uri().path(), e)
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(body_guard::close_unless_body_read))
        .with_state(state)
}

/// An error in the shape of the route family: Anthropic's under `/v1/messages`, OpenAI's elsewhere.
pub(crate) fn error_for(path: &str, e: ApiError) -> Response {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        e.into_anthropic()
    } else {
        e.into_response_inner()
    }
}

/// `--api-key` / `--api-key-file`: every API route takes a key as `Authorization: Bearer <key>` (OpenAI clients)
/// or `x-api-key: <key>` (Anthropic clients); either one matching is enough.
async fn auth(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let keys = &st.cfg.keys;
    if keys.required() {
        let h = req.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        let x_api_key = h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        let ok = |g: Option<&str>| g.is_some_and(|g| keys.accepts(g));
        if !ok(bearer) && !ok(x_api_key) {
            return error_for(req.uri().path(), ApiError::unauthorized());
        }
    }
    next.run(req).await
}

/// Reads a body up to the server's limit (413 beyond it, before reading it all when Content-Length says so).
pub async fn read_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = tokio::time::timeout(st.cfg.body_timeout, axum::body::to_bytes(body, limit)).await;
    let Ok(read) = read else {
        return Err(ApiError::body_timeout(st.cfg.body_timeout));
    };
    match read {
        Ok(b) => Ok(b),
        Err(e) => {
            // The only errors are the limit and the connection failing mid-body.
            let mut src: Option<&dyn std::error::Error> = Some(&e);
            while let Some(x) = src {
                if x.to_string().contains("length limit") {
                    return Err(ApiError::too_large(limit));
                }
                src = x.source();
            }
            Err(ApiError::invalid(None, format!("could not read the request body: {e}")))
        }
    }
}
