//! `tensorfold check`: the exactness receipt. Runs the built-in suite through one engine thread, each reply with
//! drafts on and with `draft: false` (one row per round), compares token ids, and prints per prompt kind:
//! replies, tokens, equal or not, acceptance, tokens per round and speedup. The `constrained` kind's requests
//! carry a JSON-schema grammar: their replies must also parse as JSON that follows the schema. Exits non-zero on
//! any mismatch, on a drafted reply that had a one-row round (outside the constrained kind, where the grammar
//! cuts drafts it rejects), on a constrained reply that ended and is not valid under its schema, or when the
//! load-time self-check turned drafting off.

use crate::check_suite::{cases, schema_violation};
use crate::drafting::DraftArgs;
use crate::run::{complete, spawn_engine, ModelArgs, BLOCK_SIZE};
use crate::session::Session;
use clap::Args;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use tf_core::ConstraintSpec;
use tf_engine::{FinishReason, GenOutput, GenRequest, SamplingParams};
use tf_grammar::{compile, Grammar, GrammarEnv};

/// Tokens a constrained reply gets at least, so that a whole object fits.
const CONSTRAINED_MIN_TOKENS: usize = 128;

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
    /// Constrained replies: `Ok(true)` when it ended and follows its schema, `Ok(false)` when it was cut at the
    /// token limit (nothing to parse), `Err` why it does not follow the schema.
    json: Option<Result<bool, String>>,
}

impl Outcome {
    fn equal(&self) -> bool {
        self.drafted.tokens == self.serial.tokens
    }
    /// A drafted reply must verify at least one draft every round; a grammar cuts the drafts it rejects, so a
    /// constrained round may be one row.
    fn windows_ok(&self) -> bool {
        self.json.is_some() || self.drafted.counts.rounds == 0 || self.drafted.counts.min_rows >= 2
    }
    fn json_ok(&self) -> bool {
        !matches!(self.json, Some(Err(_)))
    }
    fn ok(&self) -> bool {
        self.equal() && self.windows_ok() && self.json_ok()
    }
}

/// A suite prompt ready to run: its index in the suite, kind, token ids, and the schema of a constrained one with
/// its compiled grammar.
struct Prompt {
    index: usize,
    kind: &'static str,
    ids: Vec<u32>,
    schema: Option<Value>,
    constraint: Option<Arc<dyn ConstraintSpec>>,
}

/// Whether a constrained reply's text follows `schema` (see [`Outcome::json`]).
fn judge_json(tokenizer: &tf_text::Tokenizer, out: &GenOutput, schema: &Value) -> Result<bool, String> {
    if out.finish_reason != FinishReason::Stop {
        return Ok(false);
    }
    let text = tokenizer.decode(&out.tokens, true).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e}): {text:?}"))?;
    match schema_violation(&v, schema) {
        None => Ok(true),
        Some(why) => Err(format!("{why}: {text:?}")),
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
        prompts.push(Prompt { index: i, kind: c.kind, ids, schema: c.schema, constraint: None });
    }
    let max_tokens = |p: &Prompt| match p.schema {
        Some(_) => args.max_tokens.max(CONSTRAINED_MIN_TOKENS),
        None => args.max_tokens,
    };
    let longest = prompts.iter().map(|p| p.ids.len() + max_tokens(p)).max().unwrap_or(0);
    let context = longest.max(64 + args.drafting.max_window);
    if longest > s.model.context_length() {
        return Err(format!(
            "the longest prompt plus --max-tokens exceeds the model's context ({})",
            s.model.context_length()
        ));
    }
    let drafting = args.drafting.resolve(&s, context, BLOCK_SIZE)?;
    let describe = drafting.describe.clone();
    let path = s.path.clone();
    let stop_ids = s.tokenizer.stop_ids().to_vec();
    let limit = s.token_limit();
    let Session { backend, model, tokenizer, .. } = s;
    let tokenizer = Arc::new(tokenizer);
    // The grammar environment of the model's vocabulary; without end-of-sequence ids a grammar has no way to
    // end, and the constrained prompts are left out.
    match GrammarEnv::new(tokenizer.clone(), &stop_ids) {
        Ok(env) => {
            let mut grammars: Vec<(&Value, Arc<dyn ConstraintSpec>)> = Vec::new();
            for p in &mut prompts {
                let Some(schema) = &p.schema else { continue };
                let spec = match grammars.iter().find(|(s, _)| *s == schema) {
                    Some((_, spec)) => spec.clone(),
                    None => {
                        let g = Grammar::JsonSchema { schema: schema.clone(), strict: true };
                        let spec = compile(&env, &g).map_err(|e| format!("the schema of prompt {}: {e}", p.index))?;
                        grammars.push((schema, spec.clone()));
                        spec
                    }
                };
                p.constraint = Some(spec);
            }
        }
        Err(e) => {
            if !args.json {
                eprintln!("constrained prompts left out: {e}");
            }
            prompts.retain(|p| p.schema.is_none());
        }
    }
    // One request at a time: each reply's decode time is its own, for the speedup column.
    let max_rows = 64.max(drafting.max_window);
    let min_drafts = args.drafting.min_drafts.max(1);
    let engine = spawn_engine(backend, model, context, 1, max_rows, drafting, min_drafts, true, limit)?;
    if let Some(w) = &engine.info().drafting.warning {
        return Err(w.clone());
    }
    let mut samplings = vec![("greedy".to_string(), SamplingParams::greedy())];
    for seed in 1..=args.seeds {
        let p = SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 40, seed: Some(seed), ..Default::default() };
        samplings.push((format!("seed {seed}"), p));
    }
    let mut outcomes = Vec::new();
    for p in &prompts {
        let kind = p.kind;
        for (name, params) in &samplings {
            let mut req = GenRequest::new(p.ids.clone(), params.clone(), max_tokens(p));
            req.stop_ids = stop_ids.clone();
            req.constraint = p.constraint.clone();
            // The drafted reply takes the engine's fast paths, as a request without `logprobs` does (greedy rows
            // get their token from the backend's argmax_rows, sampled ones skip the logprob); the serial reference
            // downloads every row's logits and computes its logprob.
            req.logprobs = false;
            let drafted = complete(&engine, req.clone())?;
            req.draft = false;
            req.logprobs = true;
            let serial = complete(&engine, req)?;
            let json = p.schema.as_ref().map(|schema| judge_json(&tokenizer, &serial, schema));
            let o = Outcome { kind, prompt: p.index, sampling: name.clone(), drafted, serial, json };
            if !args.json && (!o.equal() || !o.windows_ok()) {
                eprintln!(
                    "MISMATCH prompt {} ({kind}, {name}): drafted {} vs serial {}, min_rows {}",
                    p.index, o.drafted.token_sha, o.serial.token_sha, o.drafted.counts.min_rows
                );
            }
            if let (Some(Err(why)), false) = (&o.json, args.json) {
                eprintln!("INVALID JSON prompt {} ({kind}, {name}): {why}", p.index);
            }
            outcomes.push(o);
        }
    }
    engine.shutdown();
    let bad = outcomes.iter().filter(|o| !o.ok()).count();
    if args.json {
        let cases: Vec<_> = outcomes
            .iter()
            .map(|o| {
                json!({"kind": o.kind, "prompt": o.prompt, "sampling": o.sampling, "equal": o.equal(),
                "tokens": o.drafted.tokens.len(), "token_sha": o.drafted.token_sha,
                "serial_token_sha": o.serial.token_sha, "rounds": o.drafted.counts.rounds,
                "drafted": o.drafted.counts.drafted, "accepted": o.drafted.counts.accepted,
                "min_rows": o.drafted.counts.min_rows, "drafted_decode_s": o.drafted.decode_s,
                "serial_decode_s": o.serial.decode_s, "json": match &o.json {
                    None => Value::Null,
                    Some(Ok(done)) => json!(if *done { "valid" } else { "cut" }),
                    Some(Err(why)) => json!(format!("invalid: {why}")),
                }})
            })
            .collect();
        println!("{}", json!({"model": path, "drafter": describe, "mismatches": bad, "cases": cases}));
    } else {
        print_table(&outcomes, &describe, &path);
    }
    if bad > 0 {
        return Err(format!(
            "{bad} of {} replies differ from serial decoding (or ran a one-row round, or are not valid under their \
             schema)",
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
        let equal = os.iter().filter(|o| o.ok()).count();
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
    let judged: Vec<&Result<bool, String>> = outcomes.iter().filter_map(|o| o.json.as_ref()).collect();
    if !judged.is_empty() {
        let valid = judged.iter().filter(|j| matches!(j, Ok(true))).count();
        let cut = judged.iter().filter(|j| matches!(j, Ok(false))).count();
        println!(
            "\nconstrained: {valid} of {} replies are valid JSON under their schema, {cut} cut at the token limit",
            judged.len()
        );
    }
}
