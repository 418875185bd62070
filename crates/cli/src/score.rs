//! `tensorfold perplexity` (teacher-forced scoring of a text file) and `tensorfold bench` (prefill and serial
//! decode speed, in-process).

use crate::drafting::Drafting;
use crate::run::{complete, spawn_engine, ModelArgs};
use crate::session::Session;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tf_engine::{EngineHandle, GenRequest, SamplingParams};

#[derive(Args, Debug, Clone)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A UTF-8 text file.
    pub file: PathBuf,
    /// Tokens per window; every window is scored from a fresh context.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many tokens of the file.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Write the token ids, windows, teacher-forced argmax and per-position NLL as JSON to this file.
    #[arg(long)]
    pub dump_top1: Option<PathBuf>,
    /// Rows per forward call (any value gives the same bits).
    #[arg(long, default_value_t = 64)]
    pub chunk: usize,
}

/// What `--dump-top1` writes. `top1[i]` and `nll[i]` belong to `ids[i]`'s prediction of `ids[i + 1]` within
/// its window; the last position of each window predicts nothing and is left out.
#[derive(Serialize)]
pub struct ScoreDump {
    pub model: String,
    pub precision: String,
    pub ids: Vec<u32>,
    /// `[start, end)` of each window in `ids`.
    pub windows: Vec<[usize; 2]>,
    /// Teacher-forced argmax (ties to the lower id) at every scored position, keyed by its index in `ids`.
    pub positions: Vec<usize>,
    pub top1: Vec<u32>,
    pub nll: Vec<f64>,
    pub perplexity: f64,
}

/// Per scored position: its index in `ids`, the teacher-forced argmax, and the NLL of the next token.
pub type Scores = (Vec<usize>, Vec<u32>, Vec<f64>);

/// Starts an engine thread for scoring windows of up to `longest` tokens, `chunk` prompt rows per forward.
pub fn scoring_engine(s: Session, longest: usize, chunk: usize) -> Result<EngineHandle, String> {
    let limit = s.token_limit();
    let Session { backend, model, .. } = s;
    spawn_engine(backend, model, longest, 1, chunk, Drafting::serial(), 0, true, limit)
}

/// Scores `windows` of `ids` and returns (positions, top1, nll) for every position that predicts a next token.
/// Each window is one request with `prompt_logprobs` and no reply: ln P of every token after the first, and the
/// likeliest id (ties to the lower id), from the raw logits in f64; the NLL is −ln P.
pub fn score_windows(
    engine: &EngineHandle,
    ids: &[u32],
    windows: &[[usize; 2]],
    chunk: usize,
) -> Result<Scores, String> {
    let (mut positions, mut top1, mut nll) = (Vec::new(), Vec::new(), Vec::new());
    for w in windows {
        let mut req = GenRequest::new(ids[w[0]..w[1]].to_vec(), SamplingParams::greedy(), 0);
        req.prompt_logprobs = Some(1);
        req.prefill_chunk = chunk;
        req.draft = false;
        req.logprobs = false;
        let out = complete(engine, req)?;
        for (p, lp) in out.prompt_logprobs.iter().enumerate().skip(1) {
            let lp = lp.as_ref().ok_or_else(|| format!("no logprob for position {p} of window {w:?}"))?;
            let &(best, _) = lp.top.first().ok_or_else(|| format!("no argmax for position {p} of window {w:?}"))?;
            positions.push(w[0] + p - 1);
            top1.push(best);
            nll.push(-lp.logprob);
        }
    }
    Ok((positions, top1, nll))
}

pub fn perplexity(args: &PerplexityArgs) -> Result<(), String> {
    if args.ctx < 2 {
        return Err("--ctx must be at least 2".into());
    }
    let text = std::fs::read_to_string(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let s = args.model.load()?;
    // The text is tokenized once without special tokens; each window starts with BOS when the model wants one.
    let body = s.tokenizer.encode(&text, false, false).map_err(|e| e.to_string())?;
    let body = &body[..args.limit.unwrap_or(usize::MAX).min(body.len())];
    let bos = if s.tokenizer.add_bos() { s.tokenizer.bos_id() } else { None };
    let per_window = args.ctx - bos.is_some() as usize;
    let mut ids = Vec::new();
    let mut windows = Vec::new();
    for piece in body.chunks(per_window) {
        let start = ids.len();
        ids.extend(bos);
        ids.extend_from_slice(piece);
        windows.push([start, ids.len()]);
    }
    if windows.is_empty() {
        return Err(format!("{}: no tokens to score", args.file.display()));
    }
    let longest = windows.iter().map(|w| w[1] - w[0]).max().unwrap_or(0);
    let (model, precision, describe) = (s.path.clone(), args.model.precision.name(), s.backend.describe());
    let engine = scoring_engine(s, longest, args.chunk)?;
    let t0 = Instant::now();
    let (positions, top1, nll) = score_windows(&engine, &ids, &windows, args.chunk)?;
    engine.shutdown();
    let secs = t0.elapsed().as_secs_f64();
    let mean = nll.iter().sum::<f64>() / nll.len().max(1) as f64;
    let ppl = mean.exp();
    println!(
        "perplexity {ppl:.4} over {} predicted tokens in {} windows of ≤ {} ({:.1} tok/s, {}, {})",
        nll.len(),
        windows.len(),
        args.ctx,
        ids.len() as f64 / secs,
        describe,
        precision
    );
    if let Some(path) = &args.dump_top1 {
        let dump =
            ScoreDump { model, precision: precision.into(), ids, windows, positions, top1, nll, perplexity: ppl };
        let json = serde_json::to_string(&dump).expect("dump serializes");
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens filled per run.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens decoded serially per run (greedy, stop tokens ignored).
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Measured runs after one warm-up run; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Prompt rows per forward call while filling the prompt (any value gives the same bits).
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Aggregate throughput instead: N requests (prompts of --prompt-tokens, --gen-tokens each, greedy, no
    /// drafts) submitted at once to the engine thread, sharing rounds as `serve --parallel N` does; reports
    /// decode tok/s summed over streams once all of them are decoding.
    #[arg(long)]
    pub streams: Option<usize>,
    /// Also time one forward of every width 1..=N after a 64-token prefix, as drafting measures it when the engine
    /// starts (median of 3, after the load-time self-check): with only each row's argmax brought back, and with
    /// every logits row copied to the host.
    #[arg(long, value_name = "N")]
    pub window_costs: Option<usize>,
    /// Decode without running ahead. The engine queues serial greedy steps before the host has the previous
    /// step's token (fed on the device) on a backend that queues its work (a GPU), and has no switch for it: there
    /// the flag is refused; elsewhere steps never run ahead.
    #[arg(long)]
    pub no_run_ahead: bool,
}

#[derive(Serialize)]
struct BenchResult {
    model: String,
    backend: String,
    precision: String,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    runs: usize,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    prefill_tok_s_runs: Vec<f64>,
    decode_tok_s_runs: Vec<f64>,
    /// Bytes of weights one decode step reads (`Model::weight_bytes_per_token`): a device's copy bandwidth over
    /// this is the memory-bandwidth floor of serial decode.
    weight_bytes_per_token: u64,
    /// Whether serial decode steps ran ahead of the host (on a backend that queues its work).
    run_ahead: bool,
    /// Milliseconds of one forward of width 1, 2, … (`--window-costs`), argmaxes only / logits copied.
    #[serde(skip_serializing_if = "Option::is_none")]
    window_ms_argmax: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_ms_logits: Option<Vec<f64>>,
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A fixed English passage, repeated to the requested prompt length.
const BENCH_TEXT: &str = "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly \
report, which describes how the new bridge was designed, financed and built over three years by engineers \
from several countries. ";

pub fn bench(args: &BenchArgs) -> Result<(), String> {
    crate::session::use_cuda_env_tuning()?;
    if args.prompt_tokens == 0 || args.gen_tokens < 2 || args.runs == 0 {
        return Err("--prompt-tokens must be ≥ 1, --gen-tokens ≥ 2 and --runs ≥ 1".into());
    }
    if args.prefill_chunk == 0 || args.streams == Some(0) || args.window_costs == Some(0) {
        return Err("--prefill-chunk, --streams and --window-costs must be ≥ 1".into());
    }
    if args.streams.is_some() && args.window_costs.is_some() {
        return Err("--window-costs times one sequence's forwards: leave out --streams".into());
    }
    let s = args.model.load()?;
    let unit = s.tokenizer.encode(BENCH_TEXT, false, false).map_err(|e| e.to_string())?;
    let prompt: Vec<u32> = unit.iter().copied().cycle().take(args.prompt_tokens).collect();
    if let Some(n) = args.streams {
        return crate::bench_streams::bench_streams(s, args, n, prompt);
    }
    let total = (args.prompt_tokens + args.gen_tokens).max(64 + args.window_costs.unwrap_or(0));
    let (model_name, backend, queues_ids) = (s.path.clone(), s.backend.describe(), s.backend.queues_ids());
    let weight_bytes_per_token = s.model.weight_bytes_per_token();
    // With --window-costs the engine measures every width up to N at start, as drafting does (its window costs
    // need at least 2 rows); the requests below never draft.
    let drafting = match args.window_costs {
        Some(n) => Drafting { max_window: n.max(2), proposer: None, describe: String::new() },
        None => Drafting::serial(),
    };
    let limit = s.token_limit();
    let Session { backend: be, model, .. } = s;
    let engine = spawn_engine(be, model, total, 1, args.prefill_chunk, drafting, 0, !args.no_run_ahead, limit)?;
    let mut req = GenRequest::new(prompt, SamplingParams::greedy(), args.gen_tokens);
    req.prefill_chunk = args.prefill_chunk;
    req.draft = false;
    // What a client that asks for no logprobs gets (the server computes them only when asked).
    req.logprobs = false;
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for run in 0..=args.runs {
        let out = complete(&engine, req.clone())?;
        if run > 0 {
            pre.push(args.prompt_tokens as f64 / out.prefill_s);
            // decode_s covers gen_tokens draws and gen_tokens - 1 one-row forwards.
            dec.push((args.gen_tokens - 1) as f64 / out.decode_s);
        }
    }
    let windows = match args.window_costs {
        None => None,
        Some(n) => {
            let setup = &engine.info().drafting;
            if let Some(w) = &setup.warning {
                return Err(format!("--window-costs: {w}"));
            }
            let c = &setup.costs;
            let ms = |t: &tf_engine::CostTable| (1..=n).map(|w| t.get(w).unwrap_or(f64::NAN) * 1e3).collect();
            Some((ms(&c.argmax), ms(&c.logits)))
        }
    };
    engine.shutdown();
    let (window_ms_argmax, window_ms_logits) = windows.unzip();
    let r = BenchResult {
        model: model_name,
        backend,
        precision: args.model.precision.name().into(),
        threads: args.model.threads(),
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        runs: args.runs,
        prefill_tok_s: median(&pre),
        decode_tok_s: median(&dec),
        prefill_tok_s_runs: pre,
        decode_tok_s_runs: dec,
        weight_bytes_per_token,
        run_ahead: queues_ids,
        window_ms_argmax,
        window_ms_logits,
    };
    if args.json {
        println!("{}", serde_json::to_string(&r).expect("serializes"));
    } else {
        println!(
            "{}: prefill {:.1} tok/s ({} tokens), decode {:.1} tok/s ({} tokens); medians of {} runs; {}, {}",
            r.model, r.prefill_tok_s, r.prompt_tokens, r.decode_tok_s, r.gen_tokens, r.runs, r.backend, r.precision
        );
        let gb = r.weight_bytes_per_token as f64 / 1e9;
        println!(
            "a decode step reads {gb:.3} GB of weights: {:.1} GB/s of weights at this decode speed",
            gb * r.decode_tok_s
        );
        if let (Some(a), Some(l)) = (&r.window_ms_argmax, &r.window_ms_logits) {
            let list = |v: &[f64]| v.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" ");
            println!("forward ms by width 1..={}, argmaxes back: {}", a.len(), list(a));
            println!("forward ms by width 1..={}, logits back:  {}", l.len(), list(l));
            println!(
                "widest / one row: {:.2}x (argmaxes), {:.2}x (logits)",
                a[a.len() - 1] / a[0],
                l[l.len() - 1] / l[0]
            );
        }
    }
    Ok(())
}
