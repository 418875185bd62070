//! `tensorfold bench --streams N`: aggregate decode throughput of N concurrent requests through the engine
//! thread's shared rounds (what `serve --parallel N` runs), without HTTP.

use crate::score::{median, BenchArgs};
use crate::session::Session;
use serde::Serialize;
use std::sync::mpsc;
use std::time::Instant;
use tf_engine::{EngineConfig, EngineEvent, EngineHandle, Flow, GenRequest, Priority, SamplingParams};

const BLOCK_SIZE: usize = 16;

#[derive(Serialize)]
struct StreamsResult {
    model: String,
    backend: String,
    precision: String,
    streams: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    runs: usize,
    /// Tokens per second summed over streams, from the moment every stream has its first token to the last
    /// token (pure decode rounds).
    aggregate_decode_tok_s: f64,
    /// All generated tokens over the wall time from submitting to the last token (prompts included).
    aggregate_total_tok_s: f64,
    aggregate_decode_tok_s_runs: Vec<f64>,
}

/// One event as the main thread sees it: (stream, when, what).
enum Seen {
    Token,
    Done,
    Error(String),
}

/// Runs one warm-up and `args.runs` measured rounds of `n` concurrent requests; prints the medians.
pub fn bench_streams(s: Session, args: &BenchArgs, n: usize, prompt: Vec<u32>) -> Result<(), String> {
    let per_stream = (args.prompt_tokens + args.gen_tokens).div_ceil(BLOCK_SIZE) + 1;
    let (model_name, backend) = (s.path.clone(), s.backend.describe());
    let Session { backend: be, model, .. } = s;
    let engine = EngineHandle::spawn(
        be,
        model,
        EngineConfig {
            kv_blocks: n * per_stream,
            block_size: BLOCK_SIZE,
            max_waiting: n,
            max_window: 1,
            proposer: None,
            min_drafts: 1,
            prefix_cache: false,
            run_ahead: true,
            token_limit: None,
            parallel: n,
            max_rows: 256.max(n),
        },
    )
    .map_err(|e| format!("cannot start the engine: {e}"))?;
    let (mut dec, mut tot) = (Vec::new(), Vec::new());
    for run in 0..=args.runs {
        let (tx, rx) = mpsc::channel::<(usize, Instant, Seen)>();
        let t0 = Instant::now();
        for i in 0..n {
            // Each stream its own prompt (rotated), so no two requests are the same sequence.
            let mut p = prompt.clone();
            let k = i % p.len().max(1);
            p.rotate_left(k);
            let mut req = GenRequest::new(p, SamplingParams::greedy(), args.gen_tokens);
            req.prefill_chunk = args.prefill_chunk;
            req.draft = false;
            req.logprobs = false;
            let tx = tx.clone();
            let sink = Box::new(move |ev: EngineEvent| {
                let seen = match ev {
                    EngineEvent::Token(_) => Some(Seen::Token),
                    EngineEvent::Done(_) => Some(Seen::Done),
                    EngineEvent::Error(e) => Some(Seen::Error(e.to_string())),
                    EngineEvent::Started { .. } => None,
                };
                if let Some(seen) = seen {
                    let _ = tx.send((i, Instant::now(), seen));
                }
                Flow::Continue
            });
            engine.submit(req, Priority::Interactive, sink).map_err(|e| e.to_string())?;
        }
        drop(tx);
        let mut first = vec![None::<Instant>; n];
        let mut tokens: Vec<Instant> = Vec::new();
        let mut done = 0;
        for (i, at, seen) in rx.iter() {
            match seen {
                Seen::Token => {
                    first[i].get_or_insert(at);
                    tokens.push(at);
                }
                Seen::Done => done += 1,
                Seen::Error(e) => return Err(format!("stream {i}: {e}")),
            }
        }
        if done != n || first.iter().any(Option::is_none) {
            return Err(format!("{done} of {n} streams finished"));
        }
        let all_started = first.iter().flatten().max().copied().expect("n ≥ 1");
        let end = tokens.iter().max().copied().expect("tokens");
        let decoded = tokens.iter().filter(|&&t| t > all_started).count();
        if run > 0 {
            dec.push(decoded as f64 / (end - all_started).as_secs_f64().max(1e-9));
            tot.push(tokens.len() as f64 / (end - t0).as_secs_f64().max(1e-9));
        }
    }
    engine.shutdown();
    let r = StreamsResult {
        model: model_name,
        backend,
        precision: args.model.precision.name().into(),
        streams: n,
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        runs: args.runs,
        aggregate_decode_tok_s: median(&dec),
        aggregate_total_tok_s: median(&tot),
        aggregate_decode_tok_s_runs: dec,
    };
    if args.json {
        println!("{}", serde_json::to_string(&r).expect("serializes"));
    } else {
        println!(
            "{}: {} streams, aggregate decode {:.1} tok/s ({:.1} tok/s per stream), {:.1} tok/s with prompts \
             ({} prompt + {} generated tokens each); medians of {} runs; {}, {}",
            r.model,
            n,
            r.aggregate_decode_tok_s,
            r.aggregate_decode_tok_s / n as f64,
            r.aggregate_total_tok_s,
            r.prompt_tokens,
            r.gen_tokens,
            r.runs,
            r.backend,
            r.precision
        );
    }
    Ok(())
}
