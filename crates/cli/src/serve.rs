//! `tensorfold serve`: load a model and serve it behind the OpenAI-compatible API.

use crate::drafting::DraftArgs;
use crate::facts::{human_bytes, ModelFacts};
use crate::model_ref::{self, ModelRef};
use crate::run::ModelArgs;
use crate::session::Session;
use clap::Args;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tf_engine::{EngineConfig, EngineHandle};
use tf_loader::gguf::GgufFile;
use tf_server::keys::ApiKeys;
use tf_server::params::SamplingDefaults;
use tf_server::reply::ReasoningSetting;
use tf_server::run::{ConnLimits, ServeOptions};
use tf_server::tools::ToolParserSetting;
use tf_server::{AppState, ServedModel, ServerConfig};

/// KV block size (token slots per block).
const BLOCK_SIZE: usize = 16;
/// `--context` when not given: the model's, capped here so the KV cache of a 32k-context model stays modest.
const DEFAULT_CONTEXT_CAP: usize = 8192;

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub drafting: DraftArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model id clients use (default: the file or directory name).
    #[arg(long)]
    pub name: Option<String>,
    /// Most tokens one request may hold, prompt plus reply (default: the model's context, at most 8192).
    #[arg(long)]
    pub context: Option<usize>,
    /// max_tokens for requests that give none (cut to what is left of the context).
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// Default temperature (requests override). Default: generation_config.json, else 1.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Default top-p. Default: generation_config.json, else 1 (off).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Default top-k (0 = off). Default: generation_config.json, else 0.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Default min-p (0 = off). Default: generation_config.json, else 0.
    #[arg(long)]
    pub min_p: Option<f64>,
    /// Default repetition penalty (1 = off). Default: generation_config.json, else 1.
    #[arg(long)]
    pub repetition_penalty: Option<f64>,
    /// Require the key on the API routes, as `Authorization: Bearer KEY` or `x-api-key: KEY` (/health and
    /// /metrics stay open).
    #[arg(long, env = "TENSORFOLD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Also accept every key in this file: one per line, `#` starts a comment. Re-read on SIGHUP (a file that
    /// cannot be read or holds no key leaves the keys in use as they were). Keys are never logged.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive connection stays open.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub header_timeout: u64,
    /// Seconds a request body has to arrive whole once its headers are in (408 after that).
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub body_timeout: u64,
    /// Most connections served at once; more are answered 503 and closed. Lowered to what the open-file limit
    /// allows (the soft limit is raised toward the hard one first).
    #[arg(long, default_value_t = 8192)]
    pub max_connections: usize,
    /// Requests that share each round (continuous batching: their windows and prompt chunks go into one
    /// forward). 1 runs one request at a time (with tree windows when --draft-branches > 1).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Most rows in one shared round (decode windows first, then prompt chunks). Default: the backend's, 256 on
    /// the CPU and 1024 on CUDA.
    #[arg(long)]
    pub max_rows: Option<usize>,
    /// Requests that may wait while others run; more get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Largest request body in MiB; larger ones get 413.
    #[arg(long, default_value_t = 8)]
    pub max_body_mib: usize,
    /// Most responses kept for `previous_response_id` / `GET /v1/responses/{id}` (the oldest go first).
    #[arg(long, default_value_t = 1024)]
    pub store_max_entries: usize,
    /// Most MiB of responses kept (the oldest go first).
    #[arg(long, default_value_t = 64)]
    pub store_max_mib: usize,
    /// Seconds running requests get to finish after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10)]
    pub shutdown_timeout: u64,
    /// Never draw the live status line, even on a terminal.
    #[arg(long)]
    pub no_live_line: bool,
    /// Size of the KV pool in GiB (running requests plus the prefix cache). Default: room for --parallel full
    /// contexts, capped at a quarter of the available memory, and never less than one --context.
    #[arg(long)]
    pub kv_pool_gib: Option<f64>,
    /// Do not keep KV blocks for later requests that start with the same tokens (the automatic prefix cache).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// How tool calls are taken out of chat replies: auto (from the chat template), hermes, llama3, mistral,
    /// harmony, or none (calls stay in the reply's text).
    #[arg(long, default_value = "auto", value_parser = ToolParserSetting::parse)]
    pub tool_parser: ToolParserSetting,
    /// How thinking (`<think>…</think>`, harmony's `analysis` channel) is split out of chat replies into
    /// `reasoning_content` and reasoning items: auto (from the chat template), qwen3, deepseek_r1, harmony, mistral or
    /// none (thinking stays in the content).
    #[arg(long, default_value = "auto", value_parser = ReasoningSetting::parse)]
    pub reasoning_parser: ReasoningSetting,
}

pub fn serve(args: &ServeArgs) -> Result<(), String> {
    crate::session::refuse_cuda_overrides("serve")?;
    let kv_type = args.model.kv_type;
    // (facts, session, default model id, the path the id aliases)
    let (facts, s, default_name, path) = if args.model.dummy() {
        // Random weights with the config's shapes (load tests, timing shapes one does not have): the replies are
        // noise, and every exactness property holds as with real weights.
        let p = std::path::Path::new(&args.model.model);
        let facts = ModelFacts::from_dummy(p, args.model.dummy_dtype)?;
        let dir = if p.is_dir() { p } else { p.parent().unwrap_or(std::path::Path::new(".")) };
        let name = dir.canonicalize().ok().and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
        (facts, args.model.load()?, name.unwrap_or_else(|| "model".into()), p.display().to_string())
    } else {
        let model_ref = model_ref::resolve(&args.model.model)?;
        let facts = match &model_ref {
            ModelRef::Gguf(p) => ModelFacts::from_gguf(&GgufFile::open(p).map_err(|e| e.to_string())?),
            ModelRef::HfDir(d) => ModelFacts::from_hf_dir(d)?,
        };
        let (threads, precision, arithmetic) = (args.model.threads(), args.model.precision, args.model.arithmetic);
        let s = Session::load_on_kv(&model_ref, args.model.backend, threads, precision, arithmetic, kv_type)?;
        (facts, s, default_id(&model_ref), model_ref.path().display().to_string())
    };
    let model_ctx = s.model.context_length();
    let context = match args.context {
        Some(0) => return Err("--context must be at least 1".into()),
        Some(c) if c > model_ctx => {
            return Err(format!("--context {c} is beyond the model's context of {model_ctx} tokens"));
        }
        Some(c) => c,
        None => model_ctx.min(DEFAULT_CONTEXT_CAP),
    };
    if args.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    let d = &s.defaults;
    let defaults = SamplingDefaults {
        temperature: args.temperature.or(d.temperature).unwrap_or(1.0),
        top_p: args.top_p.or(d.top_p).unwrap_or(1.0),
        top_k: args.top_k.or(d.top_k).unwrap_or(0),
        min_p: args.min_p.or(d.min_p).unwrap_or(0.0),
        repetition_penalty: args.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
    };
    let check = tf_engine::SamplingParams {
        temperature: defaults.temperature,
        top_k: defaults.top_k,
        top_p: defaults.top_p,
        min_p: defaults.min_p,
        repetition_penalty: defaults.repetition_penalty,
        ..Default::default()
    };
    check.validate().map_err(|e| format!("--{}: {}", e.field.replace('_', "-"), e.message))?;

    let id = args.name.clone().unwrap_or(default_name);
    // What the banner names: the model's path (with dummy weights, their type and seed).
    let source = s.path.clone();
    let family = s.model.family().to_string();
    // Bytes of K and V per token as the backend stores them (`--kv-type`).
    let kv_bytes_per_token = facts.kv_bytes_per_token_as(kv_type);
    let mut kv_blocks =
        default_pool_tokens(context, args.parallel, kv_bytes_per_token, mem_available()).div_ceil(BLOCK_SIZE);
    if let Some(gib) = args.kv_pool_gib {
        let per_block = kv_bytes_per_token.unwrap_or(0) * BLOCK_SIZE as u64;
        if !(gib.is_finite() && gib > 0.0) || per_block == 0 {
            return Err(format!("--kv-pool-gib {gib}: expected a positive size (and a model whose KV size is known)"));
        }
        let blocks = (gib * (1u64 << 30) as f64 / per_block as f64) as usize;
        if blocks < context.div_ceil(BLOCK_SIZE) {
            return Err(format!(
                "--kv-pool-gib {gib}: {blocks} blocks of {BLOCK_SIZE} tokens do not hold one --context of {context} \
                 tokens ({} GiB needed)",
                (context.div_ceil(BLOCK_SIZE) as u64 * per_block) as f64 / (1u64 << 30) as f64
            ));
        }
        kv_blocks = blocks;
    }
    let kv_bytes = kv_bytes_per_token.map(|b| b * (kv_blocks * BLOCK_SIZE) as u64);
    // A hybrid model's recurrent states take registers next to the KV pool.
    let state_line = s.model.state_spec().map(|spec| {
        let n = tf_engine::default_state_registers(kv_blocks, BLOCK_SIZE);
        format!(
            "\n  recurrent state: {n} registers of {} ({} in all), a snapshot every 256 tokens for the prefix cache",
            human_bytes(spec.bytes_per_register() as u64),
            human_bytes((n * spec.bytes_per_register()) as u64)
        )
    });
    let quant = facts
        .tensor_types
        .iter()
        .filter(|(t, _)| crate::facts::is_quant_name(t))
        .max_by_key(|(_, n)| **n)
        .map(|(t, _)| t.clone())
        .unwrap_or_else(|| facts.tensor_types.keys().next().cloned().unwrap_or_default());
    let precision = args.model.precision.name();
    let backend = s.backend.describe();
    let drafting = args.drafting.resolve(&s, context, BLOCK_SIZE)?;
    let token_limit = s.token_limit();
    let max_rows = args.max_rows.unwrap_or_else(|| s.backend.default_round_rows()).max(1);
    let Session { backend: be, model, tokenizer, template, .. } = s;
    let engine = EngineHandle::spawn(
        be,
        model,
        EngineConfig {
            kv_blocks,
            block_size: BLOCK_SIZE,
            max_waiting: args.max_queue,
            max_window: drafting.max_window,
            proposer: drafting.proposer,
            min_drafts: args.drafting.min_drafts,
            prefix_cache: !args.no_prefix_cache,
            run_ahead: true,
            token_limit,
            parallel: args.parallel.max(1),
            max_rows,
        },
    )
    .map_err(|e| format!("cannot start the engine: {e}"))?;
    let setup = &engine.info().drafting;
    let draft_line = match (&setup.warning, setup.enabled) {
        (Some(w), _) => format!("warning: {w}"),
        (None, true) => format!("drafting: {} (self-check passed{})", drafting.describe, cost_note(&setup.costs)),
        (None, false) => format!("drafting: {}", drafting.describe),
    };
    let served = ServedModel {
        id: id.clone(),
        aliases: vec![path.clone()],
        family: family.clone(),
        tokenizer: Arc::new(tokenizer),
        template,
        context,
    };
    let cfg = ServerConfig {
        defaults,
        default_max_tokens: args.max_tokens,
        keys: Arc::new(ApiKeys::new(args.api_key.as_deref(), args.api_key_file.as_deref())?),
        max_body_bytes: args.max_body_mib.max(1) << 20,
        body_timeout: Duration::from_secs(args.body_timeout.max(1)),
        store_max_entries: args.store_max_entries,
        store_max_bytes: args.store_max_mib << 20,
        tool_parser: args.tool_parser,
        reasoning_parser: args.reasoning_parser,
    };
    let auth = cfg.keys.required();
    let max_connections = tf_server::run::fit_connection_cap(args.max_connections.max(1));
    if max_connections < args.max_connections {
        eprintln!(
            "tensorfold: --max-connections {} lowered to {max_connections}: the open-file limit allows no more",
            args.max_connections
        );
    }
    let state = AppState::new(served, engine, cfg);
    eprintln!(
        "tensorfold: serving `{id}` from {source}\n  {family}, {quant}, {} parameters, weights {}, KV pool {} ({} \
         tokens; one request up to {context} tokens, {}), {precision} precision, {backend}{}{}",
        crate::facts::human_count(facts.parameters),
        human_bytes(facts.weight_bytes),
        kv_bytes.map(human_bytes).unwrap_or_else(|| "?".into()),
        kv_blocks * BLOCK_SIZE,
        if context < model_ctx { format!("model: {model_ctx}") } else { "the model's full context".into() },
        if state.model.template.is_none() { "; no chat template: use /v1/completions" } else { "" },
        state_line.unwrap_or_default(),
    );
    eprintln!("  {draft_line}");
    let opts = ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        live_line: !args.no_live_line,
        conn: ConnLimits { header_timeout: Duration::from_secs(args.header_timeout.max(1)), max_connections },
        on_ready: Box::new(move |addr| {
            let key = if auth { " -H \"Authorization: Bearer $TENSORFOLD_API_KEY\"" } else { "" };
            eprintln!("tensorfold: listening on http://{addr} (OpenAI API under /v1; Ctrl-C stops)");
            eprintln!(
                "try: curl -s http://{addr}/v1/chat/completions -H 'Content-Type: application/json'{key} -d \
                 '{{\"messages\":[{{\"role\":\"user\",\"content\":\"What is the capital of France? Answer in one sentence.\"}}],\"max_tokens\":64,\"temperature\":0}}'"
            );
        }),
    };
    tf_server::run::serve_blocking(state, opts)?;
    eprintln!("tensorfold: stopped");
    Ok(())
}

/// The model id: the GGUF file's stem, or the directory's name.
fn default_id(m: &ModelRef) -> String {
    let p = m.path();
    let name = match m {
        ModelRef::Gguf(_) => p.file_stem(),
        ModelRef::HfDir(_) => p.file_name(),
    };
    name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
}

/// The KV pool's default size in tokens: `parallel` full contexts, capped at a quarter of the memory available
/// now (`avail_bytes`, when known), never below one context (a request of the full context must fit).
fn default_pool_tokens(
    context: usize,
    parallel: usize,
    bytes_per_token: Option<u64>,
    avail_bytes: Option<u64>,
) -> usize {
    let want = context.saturating_mul(parallel.max(1));
    let cap = match (bytes_per_token, avail_bytes) {
        (Some(b), Some(avail)) if b > 0 => usize::try_from(avail / 4 / b).unwrap_or(usize::MAX),
        _ => want,
    };
    want.min(cap).max(context)
}

/// `MemAvailable` from /proc/meminfo, in bytes (None where there is no such file).
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// How much the widest measured window costs against one row, for the start-up line: greedy windows bring
/// back only argmaxes, others every logits row (on a GPU that copy is a visible part of a window).
fn cost_note(costs: &tf_engine::WindowCosts) -> String {
    match (costs.argmax.widest_ratio(), costs.logits.widest_ratio()) {
        (Some((w, a)), Some((_, l))) if l > a * 1.02 => {
            format!("; windows of {w} rows cost {a:.2}x one row, {l:.2}x with their logits copied to the host")
        }
        (Some((w, a)), _) => format!("; windows of {w} rows cost {a:.2}x one row"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod pool_tests {
    use super::default_pool_tokens;

    #[test]
    fn the_default_pool_holds_parallel_contexts_within_a_quarter_of_memory() {
        // Plenty of memory: one full context per parallel stream.
        assert_eq!(default_pool_tokens(8192, 4, Some(50_000), Some(64 << 30)), 4 * 8192);
        // Little memory: a quarter of it, in tokens.
        assert_eq!(default_pool_tokens(1024, 16, Some(1 << 20), Some(8 << 30)), 2048);
        // Never below one context, whatever the memory says; unknown sizes fall back to parallel contexts.
        assert_eq!(default_pool_tokens(8192, 4, Some(1 << 20), Some(1 << 20)), 8192);
        assert_eq!(default_pool_tokens(100, 3, None, Some(1 << 30)), 300);
        assert_eq!(default_pool_tokens(100, 0, Some(10), None), 100);
    }
}
