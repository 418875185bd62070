//! `tensorfold run`: generate from a prompt, streaming text to stdout; the receipt (token_sha, speeds) goes to
//! stderr.

use crate::drafting::Drafting;
use crate::model_ref;
use crate::session::{BackendChoice, Session};
use clap::Args;
use std::io::Write;
use std::sync::{mpsc, Arc};
use tf_backend_cpu::KvType;
use tf_backend_cuda::Arithmetic;
use tf_core::{Backend, DType, Precision};
use tf_engine::{
    EngineConfig, EngineError, EngineEvent, EngineHandle, EventSink, Flow, GenOutput, GenRequest, Priority,
    SamplingParams,
};
use tf_models::Model;
use tf_text::{IncrementalDetokenizer, StopFilter, Tokenizer};

/// KV block size (token slots per block) of the pool of `run`, `check`, `perplexity` and `bench`.
pub(crate) const BLOCK_SIZE: usize = 16;

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy. Default: the model's generation_config.json, else 0.8.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Keep the K likeliest tokens (0 = all). Default: generation_config.json, else 40.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass (1 = off). Default: generation_config.json, else 0.95.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Drop tokens less likely than MIN_P × the likeliest (0 = off). Default: generation_config.json, else 0.05.
    #[arg(long)]
    pub min_p: Option<f64>,
    /// Repetition penalty (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f64>,
    /// Presence penalty, OpenAI rule (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f64,
    /// Frequency penalty, OpenAI rule (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f64,
    /// Seed of the keyed sampler; without it the seed is derived from the prompt, so reruns repeat.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Add BIAS (−100 to 100) to token ID's logit at every position, as OpenAI's `logit_bias` (repeatable;
    /// −100 all but bans a token, 100 all but forces it).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f64)>,
}

fn parse_logit_bias(s: &str) -> Result<(u32, f64), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected ID=BIAS, e.g. 13=-100"))?;
    let id = id.trim().parse::<u32>().map_err(|_| format!("{s:?}: {id:?} is not a token id"))?;
    let bias = bias.trim().parse::<f64>().ok().filter(|b| (-100.0..=100.0).contains(b));
    Ok((id, bias.ok_or_else(|| format!("{s:?}: the bias must be a number in [-100, 100]"))?))
}

impl SamplingArgs {
    pub fn params(&self, s: &Session) -> SamplingParams {
        let d = &s.defaults;
        SamplingParams {
            temperature: self.temperature.or(d.temperature).unwrap_or(0.8),
            top_k: self.top_k.or(d.top_k).unwrap_or(40),
            top_p: self.top_p.or(d.top_p).unwrap_or(0.95),
            min_p: self.min_p.or(d.min_p).unwrap_or(0.05),
            repetition_penalty: self.repetition_penalty.or(d.repetition_penalty).unwrap_or(1.0),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            logit_bias: {
                // Ascending ids; a repeated id stays repeated and is refused when the request is checked.
                let mut b = self.logit_bias.clone();
                b.sort_by_key(|&(id, _)| id);
                b
            },
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A .gguf file, a Hugging Face-style directory, or a hub id (org/name[@rev][:file]) in the local HF cache.
    pub model: String,
    /// Arithmetic of the matmuls: `checkpoint` (int8 activations × the checkpoint's integer blocks) or `full`
    /// (f32 activations × dequantized weights). Each is exact with itself.
    #[arg(long, default_value = "checkpoint", value_parser = parse_precision)]
    pub precision: Precision,
    /// Worker threads (default: one per physical core). Any count gives the same bits.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Backend: `auto` (CUDA when built with it and a GPU is found, else CPU), `cpu` or `cuda`.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// Arithmetic of the CUDA backend: `portable` (every op in the CPU's order: the CPU's bits) or `tensor`
    /// (BF16/F16 weight matmuls on tensor cores: row-exact, but not the CPU's bits). The CPU has only `portable`.
    #[arg(long, default_value = "portable", value_parser = parse_arithmetic)]
    pub arithmetic: Arithmetic,
    /// How the KV cache stores K and V: `f32`, `f16` (half the bytes) or `q8_0` (blocks of 32 values as 8-bit
    /// integers with an f16 scale: 34 bytes per 32 values, about a quarter). f16 and q8_0 round each value when it
    /// is written: each is its own arithmetic, so replies differ from f32 KV, while drafted == serial, concurrent
    /// == solo and chunked == whole hold within one type. CPU backend only; q8_0 needs a head dim that is a
    /// multiple of 32.
    #[arg(long, default_value = "f32", value_parser = parse_kv_type)]
    pub kv_type: KvType,
    /// `auto` (the MODEL's files) or `dummy`: random weights with the shapes of MODEL's config.json (a directory
    /// or the file itself; no weight files are read), for timing real shapes such as Qwen2.5-7B without their
    /// weights, or load tests of `serve`. Families llama, mistral, qwen2, qwen3, qwen3_moe, nemotron_h. The output
    /// is noise; the speed and every exactness property are real.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dummy"])]
    pub load_format: String,
    /// Seed of the dummy weights (the same seed gives the same bits).
    #[arg(long, default_value_t = 0)]
    pub dummy_seed: u64,
    /// Matrix type of the dummy weights: bf16, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k,
    /// q6_k, iq4_nl, iq4_xs, iq2_xxs, iq2_xs, iq2_s (default: the config's torch_dtype).
    #[arg(long, value_parser = parse_dummy_dtype)]
    pub dummy_dtype: Option<DType>,
}

fn parse_dummy_dtype(s: &str) -> Result<DType, String> {
    tf_loader::dummy::DUMMY_DTYPES.into_iter().find(|d| d.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
        let names: Vec<String> = tf_loader::dummy::DUMMY_DTYPES.iter().map(|d| d.name().to_lowercase()).collect();
        format!("'{s}' is not a dummy weight type ({})", names.join(", "))
    })
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    BackendChoice::parse(s).ok_or_else(|| format!("'{s}' is not a backend (auto, cpu, cuda)"))
}

fn parse_arithmetic(s: &str) -> Result<Arithmetic, String> {
    Arithmetic::parse(s).ok_or_else(|| format!("'{s}' is not an arithmetic (portable, tensor)"))
}

/// `--kv-type`: `f32`, `f16` or `q8_0`.
pub fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| format!("'{s}' is not a KV type (f32, f16, q8_0)"))
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::parse(s).ok_or_else(|| format!("'{s}' is not a precision mode (checkpoint, full)"))
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(tf_backend_cpu::pool::default_threads).max(1)
    }

    /// Whether `--load-format dummy` asks for random weights.
    pub fn dummy(&self) -> bool {
        self.load_format == "dummy"
    }

    pub fn load(&self) -> Result<Session, String> {
        if self.dummy() {
            let (seed, dtype) = (self.dummy_seed, self.dummy_dtype);
            let p = std::path::Path::new(&self.model);
            let (be, threads) = (self.backend, self.threads());
            return Session::load_dummy(p, dtype, seed, be, threads, self.precision, self.arithmetic, self.kv_type);
        }
        let m = model_ref::resolve(&self.model)?;
        Session::load_on_kv(&m, self.backend, self.threads(), self.precision, self.arithmetic, self.kv_type)
    }
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (with --chat: the user message).
    #[arg(long, short)]
    pub prompt: String,
    /// Render the prompt as a user turn through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Stop when the output contains this text (repeatable); the stop text is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompt rows per forward call while filling the prompt (any value gives the same bits).
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    #[command(flatten)]
    pub drafting: crate::drafting::DraftArgs,
}

/// Starts the engine thread of one command on `backend` and `model`: a KV pool of at least `kv_tokens` token
/// slots, `parallel` sequences sharing each round, at most `max_rows` rows per round, no prefix cache, and
/// drafting as `drafting` says (`min_drafts` per drafted round). The load-time self-check's warning, if any, is
/// in `info().drafting.warning`. `token_limit`: [`Session::token_limit`].
#[allow(clippy::too_many_arguments)]
pub fn spawn_engine(
    backend: Arc<dyn Backend>,
    model: Box<dyn Model>,
    kv_tokens: usize,
    parallel: usize,
    max_rows: usize,
    drafting: Drafting,
    min_drafts: usize,
    run_ahead: bool,
    token_limit: Option<usize>,
) -> Result<EngineHandle, String> {
    let parallel = parallel.max(1);
    EngineHandle::spawn(
        backend,
        model,
        EngineConfig {
            kv_blocks: kv_tokens.div_ceil(BLOCK_SIZE).max(1),
            block_size: BLOCK_SIZE,
            max_waiting: parallel,
            max_window: drafting.max_window,
            proposer: drafting.proposer,
            min_drafts,
            prefix_cache: false,
            run_ahead,
            token_limit,
            parallel,
            max_rows: max_rows.max(1),
        },
    )
    .map_err(|e| format!("cannot start the engine: {e}"))
}

/// Submits `req` and waits for its end: the reply, or the engine's error as text.
pub fn complete(engine: &EngineHandle, req: GenRequest) -> Result<GenOutput, String> {
    let (tx, rx) = mpsc::channel();
    let sink: EventSink = Box::new(move |ev| {
        match ev {
            EngineEvent::Done(out) => drop(tx.send(Ok(out))),
            EngineEvent::Error(e) => drop(tx.send(Err(e.to_string()))),
            EngineEvent::Started { .. } | EngineEvent::Token(_) => {}
        }
        Flow::Continue
    });
    engine.submit(req, Priority::Interactive, sink).map_err(|e| e.to_string())?;
    rx.recv().map_err(|_| "the engine ended without a reply".to_string())?
}

/// What `run`'s token sink sends to the main thread.
enum Printed {
    /// Text to print now.
    Text(String),
    /// The reply ended: the rest of the text (held back by the detokenizer or the stop filter) and the reply.
    Done(String, GenOutput),
    Error(String),
}

/// The sink of `run`: detokenizes on the engine thread, applies the stop strings (a match ends the reply
/// exactly after the token that completed it) and sends the printable text to `tx`.
fn printing_sink(tokenizer: Arc<Tokenizer>, stops: Vec<String>, tx: mpsc::Sender<Printed>) -> EventSink {
    let mut detok = IncrementalDetokenizer::new(true);
    let mut stops = StopFilter::new(stops);
    let mut failed = false;
    Box::new(move |ev| match ev {
        EngineEvent::Started { .. } => Flow::Continue,
        EngineEvent::Token(ev) => {
            if failed {
                return Flow::Stop;
            }
            let text = match detok.push(&tokenizer, ev.token) {
                Ok(t) => t,
                Err(e) => {
                    failed = true;
                    let _ = tx.send(Printed::Error(e.to_string()));
                    return Flow::Stop;
                }
            };
            let (print, hit) = stops.push(&text);
            let gone = !print.is_empty() && tx.send(Printed::Text(print)).is_err();
            if hit || gone {
                Flow::Stop
            } else {
                Flow::Continue
            }
        }
        EngineEvent::Done(out) => {
            if failed {
                return Flow::Stop;
            }
            let msg = match detok.finish(&tokenizer) {
                Ok(tail) => {
                    let (mut rest, hit) = stops.push(&tail);
                    if !hit {
                        rest.push_str(&stops.finish());
                    }
                    Printed::Done(rest, out)
                }
                Err(e) => Printed::Error(e.to_string()),
            };
            let _ = tx.send(msg);
            Flow::Stop
        }
        EngineEvent::Error(e) => {
            let _ = tx.send(Printed::Error(e.to_string()));
            Flow::Stop
        }
    })
}

pub fn run(args: &RunArgs) -> Result<(), String> {
    crate::session::refuse_cuda_overrides("run")?;
    if args.stop.iter().any(String::is_empty) {
        return Err("--stop: an empty stop string would end every reply at once".into());
    }
    let s = args.model.load()?;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(sys) = &args.system {
            messages.push(serde_json::json!({"role": "system", "content": sys}));
        }
        messages.push(serde_json::json!({"role": "user", "content": args.prompt}));
        s.chat_prompt(&serde_json::Value::Array(messages))?
    } else {
        s.plain_prompt(&args.prompt)?
    };
    let mut req = GenRequest::new(prompt, args.sampling.params(&s), args.max_tokens);
    req.stop_ids = s.tokenizer.stop_ids().to_vec();
    req.prefill_chunk = args.prefill_chunk;
    req.logprobs = false; // not printed
    let total = req.prompt.len().saturating_add(args.max_tokens);
    let context_length = s.model.context_length();
    if total > context_length {
        let e = EngineError::ContextOverflow {
            prompt_tokens: req.prompt.len(),
            max_tokens: args.max_tokens,
            context_length,
        };
        return Err(e.to_string());
    }
    let drafting = args.drafting.resolve(&s, total, BLOCK_SIZE)?;
    let describe = s.backend.describe();
    let max_rows = args.prefill_chunk.max(drafting.max_window);
    let limit = s.token_limit();
    let Session { backend, model, tokenizer, .. } = s;
    let kv_tokens = total.max(64 + args.drafting.max_window);
    let engine = spawn_engine(backend, model, kv_tokens, 1, max_rows, drafting, args.drafting.min_drafts, true, limit)?;
    if let Some(w) = &engine.info().drafting.warning {
        eprintln!("warning: {w}");
    }

    let (tx, rx) = mpsc::channel();
    let sink = printing_sink(Arc::new(tokenizer), args.stop.clone(), tx);
    let ticket = engine.submit(req, Priority::Interactive, sink).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let result = loop {
        match rx.recv() {
            Ok(Printed::Text(t)) => {
                if let Err(e) = out.write_all(t.as_bytes()).and_then(|_| out.flush()) {
                    ticket.cancel();
                    return Err(format!("stdout: {e}"));
                }
            }
            Ok(Printed::Done(rest, result)) => {
                let _ = writeln!(out, "{rest}").and_then(|_| out.flush());
                break result;
            }
            Ok(Printed::Error(e)) => return Err(e),
            Err(_) => return Err("the engine ended without a reply".into()),
        }
    };
    engine.shutdown();
    let n = result.tokens.len();
    let prefill_tps = result.prompt_tokens as f64 / result.prefill_s.max(1e-9);
    let decode_tps = n.saturating_sub(1) as f64 / result.decode_s.max(1e-9);
    eprintln!(
        "token_sha={} tokens={} prompt_tokens={} finish={:?} seed={} prefill={:.1} tok/s decode={:.1} tok/s \
         rounds={} drafted={} accepted={} ({}, {})",
        result.token_sha,
        n,
        result.prompt_tokens,
        result.finish_reason,
        result.seed,
        prefill_tps,
        decode_tps,
        result.counts.rounds,
        result.counts.drafted,
        result.counts.accepted,
        describe,
        args.model.precision.name(),
    );
    Ok(())
}
