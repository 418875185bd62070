//! `tensorfold check`: the exactness receipt. Runs the built-in suite with drafts on and with `draft: false`
//! (one row per round), compares token ids, and prints per prompt kind: replies, tokens, equal or not,
//! acceptance, tokens per round and speedup. Exits non-zero on any mismatch, on a drafted reply that had a
//! one-row round, or when the load-time self-check turned drafting off.

use crate::check_suite::cases;
use crate::drafting::DraftArgs;
use crate::run::ModelArgs;
use clap::Args;
use serde_json::json;
use std::collections::BTreeMap;
use tf_engine::{Flow, GenOutput, GenRequest, Generator, SamplingParams};

const BLOCK_SIZE: usize = 16;

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub drafting: DraftArgs,
    /// Tokens per reply.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampled runs per prompt (seeds 1..=N, temperature 0.8, top-p 0.95, top-k 40), besides the greedy one.
    #[arg(long, default_value_t = 2)]
    pub seeds: u64,
    /// Only the first N prompts of each kind.
    #[arg(long)]
    pub per_kind: Option<usize>,
    /// Print one JSON object (every case) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One compared reply.
struct Outcome {
    kind: &'static str,
    prompt: usize,
    sampling: String,
    drafted: GenOutput,
    serial: GenOutput,
}

impl Outcome {
    fn equal(&self) -> bool {
        self.drafted.tokens == self.serial.tokens
    }
    /// A drafted reply must verify at least one draft every round.
    fn windows_ok(&self) -> bool {
        self.drafted.counts.rounds == 0 || self.drafted.counts.min_rows >= 2
    }
}

pub fn check(args: &CheckArgs) -> Result<(), String> {
    if args.max_tokens == 0 {
        return Err("--max-tokens must be at least 1".into());
    }
    if args.drafting.no_drafts || args.drafting.drafter == "none" || args.drafting.max_window < 2 {
        return Err("check compares drafted replies with serial ones: drafting must be on".into());
    }
    let s = args.model.load()?;
    let mut prompts = Vec::new();
    let mut per_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, c) in cases().into_iter().enumerate() {
        let n = per_kind.entry(c.kind).or_default();
        if args.per_kind.is_some_and(|k| *n >= k) {
            continue;
        }
        *n += 1;
        let ids = if s.template.is_some() {
            s.chat_prompt(&json!([{"role": "user", "content": c.text}]))?
        } else {
            s.plain_prompt(&c.text)?
        };
        prompts.push((i, c.kind, ids));
    }
    let longest = prompts.iter().map(|p| p.2.len()).max().unwrap_or(0);
    let context = (longest + args.max_tokens).max(64 + args.drafting.max_window);
    if longest + args.max_tokens > s.model.context_length() {
        return Err(format!(
            "the longest prompt plus --max-tokens exceeds the model's context ({})",
            s.model.context_length()
        ));
    }
    let drafting = args.drafting.resolve(&s, context, BLOCK_SIZE)?;
    let mut g = Generator::new(s.backend.as_ref(), s.model.as_ref(), context.div_ceil(BLOCK_SIZE), BLOCK_SIZE)
        .map_err(|e| e.to_string())?;
    let setup = g
        .setup_drafting(drafting.max_window, drafting.proposer, args.drafting.min_drafts.max(1))
        .map_err(|e| e.to_string())?;
    if let Some(w) = setup.warning {
        return Err(w);
    }
    let mut samplings = vec![("greedy".to_string(), SamplingParams::greedy())];
    for seed in 1..=args.seeds {
        let p = SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 40, seed: Some(seed), ..Default::default() };
        samplings.push((format!("seed {seed}"), p));
    }
    let mut outcomes = Vec::new();
    for (i, kind, ids) in &prompts {
        for (name, params) in &samplings {
            let mut req = GenRequest::new(ids.clone(), params.clone(), args.max_tokens);
            req.stop_ids = s.tokenizer.stop_ids().to_vec();
            // The drafted reply takes the engine's fast paths, as a request without `logprobs` does (greedy rows
            // get their token from the backend's argmax_rows, sampled ones skip the logprob); the serial reference
            // downloads every row's logits and computes its logprob.
            req.logprobs = false;
            let drafted = g.generate(&req, &mut |_| Flow::Continue).map_err(|e| e.to_string())?;
            req.draft = false;
            req.logprobs = true;
            let serial = g.generate(&req, &mut |_| Flow::Continue).map_err(|e| e.to_string())?;
            let o = Outcome { kind, prompt: *i, sampling: name.clone(), drafted, serial };
            if !args.json && (!o.equal() || !o.windows_ok()) {
                eprintln!(
                    "MISMATCH prompt {} ({kind}, {name}): drafted {} vs serial {}, min_rows {}",
                    i, o.drafted.token_sha, o.serial.token_sha, o.drafted.counts.min_rows
                );
            }
            outcomes.push(o);
        }
    }
    let bad = outcomes.iter().filter(|o| !o.equal() || !o.windows_ok()).count();
    if args.json {
        let cases: Vec<_> = outcomes
            .iter()
            .map(|o| {
                json!({"kind": o.kind, "prompt": o.prompt, "sampling": o.sampling, "equal": o.equal(),
                       "tokens": o.drafted.tokens.len(), "token_sha": o.drafted.token_sha,
                       "serial_token_sha": o.serial.token_sha, "rounds": o.drafted.counts.rounds,
                       "drafted": o.drafted.counts.drafted, "accepted": o.drafted.counts.accepted,
                       "min_rows": o.drafted.counts.min_rows, "drafted_decode_s": o.drafted.decode_s,
                       "serial_decode_s": o.serial.decode_s})
            })
            .collect();
        println!("{}", json!({"model": s.path, "drafter": drafting.describe, "mismatches": bad, "cases": cases}));
    } else {
        print_table(&outcomes, &drafting.describe, &s.path);
    }
    if bad > 0 {
        return Err(format!(
            "{bad} of {} replies differ from serial decoding (or ran a one-row round)",
            outcomes.len()
        ));
    }
    Ok(())
}

fn print_table(outcomes: &[Outcome], drafter: &str, model: &str) {
    println!("tensorfold check: {model}\ndrafter: {drafter}\n");
    println!(
        "{:<13} {:>7} {:>7} {:>9} {:>10} {:>12} {:>8}",
        "kind", "replies", "tokens", "equal", "accepted", "tokens/round", "speedup"
    );
    let mut kinds: Vec<&str> = outcomes.iter().map(|o| o.kind).collect();
    kinds.dedup();
    kinds.push("all");
    for kind in kinds {
        let os: Vec<&Outcome> = outcomes.iter().filter(|o| kind == "all" || o.kind == kind).collect();
        let tokens: usize = os.iter().map(|o| o.drafted.tokens.len()).sum();
        let equal = os.iter().filter(|o| o.equal() && o.windows_ok()).count();
        let drafted: usize = os.iter().map(|o| o.drafted.counts.drafted).sum();
        let accepted: usize = os.iter().map(|o| o.drafted.counts.accepted).sum();
        let rounds: usize = os.iter().map(|o| o.drafted.counts.rounds).sum();
        // Decode tokens after the first (which comes from the prompt's last row) per round.
        let decoded: usize = os.iter().map(|o| o.drafted.tokens.len().saturating_sub(1)).sum();
        let t_d: f64 = os.iter().map(|o| o.drafted.decode_s).sum();
        let t_s: f64 = os.iter().map(|o| o.serial.decode_s).sum();
        println!(
            "{:<13} {:>7} {:>7} {:>9} {:>9.0}% {:>12.2} {:>7.2}x",
            kind,
            os.len(),
            tokens,
            format!("{equal}/{}", os.len()),
            100.0 * accepted as f64 / drafted.max(1) as f64,
            decoded as f64 / rounds.max(1) as f64,
            t_s / t_d.max(1e-9),
        );
    }
}
