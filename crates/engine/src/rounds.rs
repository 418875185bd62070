//! Shared rounds (DESIGN.md §5): several streams advance in one forward per round — each decoding stream's
//! window (pending token + drafts) and prompt chunks of streams still filling, packed under a row budget. Every
//! row is row-exact and attends only to its own stream's blocks (one block table per stream), so each stream's
//! tokens are exactly those of its solo, serial run, whatever shares the round.
//!
//! Windows here are chains (a proposer's tree is cut to its first path); tree windows run in solo decoding.

use crate::draft::{fallback_guess, first_path, DraftCounts};
use crate::generate::{token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent};
use crate::kv_pool::BlockTable;
use crate::sampler::{penalized, sample, top_logprobs};
use crate::spec::{truncate_after, verify, AcceptStats, DraftTree, Proposer};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tf_core::{AttnMeta, RowAttn};
use tf_models::Batch;

/// The token callback of one stream.
pub type OnToken<'c> = Box<dyn FnMut(TokenEvent) -> Flow + 'c>;

/// One stream in shared rounds.
pub struct Stream<'c> {
    pub req: GenRequest,
    seed: u64,
    table: BlockTable,
    cached_tokens: usize,
    /// Prompt positions whose K/V is written.
    filled: usize,
    tokens: Vec<u32>,
    /// Prompt + emitted tokens (the pending token last while decoding).
    context: Vec<u32>,
    proposer: Option<Box<dyn Proposer>>,
    stats: AcceptStats,
    counts: DraftCounts,
    started: Instant,
    prefill_s: f64,
    decode_start: Option<Instant>,
    /// Seconds from the first token to the end, set when the stream finishes.
    decode_s: f64,
    finish: Option<FinishReason>,
    on_token: OnToken<'c>,
}

impl<'c> Stream<'c> {
    pub fn is_done(&self) -> bool {
        self.finish.is_some()
    }

    fn cancelled(&self) -> bool {
        self.req.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// The finished reply.
    pub fn output(&self) -> GenOutput {
        GenOutput {
            token_sha: token_sha(&self.tokens),
            tokens: self.tokens.clone(),
            finish_reason: self.finish.unwrap_or(FinishReason::Cancelled),
            prefill_s: self.prefill_s,
            decode_s: self.decode_s,
            prompt_tokens: self.req.prompt.len(),
            seed: self.seed,
            prompt_logprobs: Vec::new(),
            counts: self.counts,
            cached_tokens: self.cached_tokens,
        }
    }
}

/// What one stream contributes to a round.
enum Part {
    /// Prompt rows `start..start + len`.
    Fill { start: usize, len: usize },
    /// The pending token and a chain of drafts.
    Window { drafts: Vec<u32> },
}

impl<'a> Generator<'a> {
    /// Admits a request for shared rounds: checks it, takes cached prefix blocks and reserves every other block
    /// it can need (all or nothing).
    pub fn admit_stream<'c>(&mut self, req: GenRequest, on_token: OnToken<'c>) -> Result<Stream<'c>, EngineError> {
        if req.prompt_logprobs.is_some() {
            return Err(EngineError::InvalidRequest("prompt logprobs run in solo generation".into()));
        }
        let seed = self.admit(&req)?;
        let (table, cached_tokens) = self.reserve(&req)?;
        let proposer = self.drafting.as_ref().filter(|c| req.draft && c.max_window >= 2).map(|c| match &c.proposer {
            Some(make) => make(&req),
            None => crate::draft::default_proposer(),
        });
        Ok(Stream {
            seed,
            table,
            cached_tokens,
            filled: cached_tokens,
            tokens: Vec::new(),
            context: req.prompt.clone(),
            counts: DraftCounts { drafts: proposer.is_some(), ..DraftCounts::default() },
            proposer,
            stats: AcceptStats::default(),
            started: Instant::now(),
            prefill_s: 0.0,
            decode_start: None,
            decode_s: 0.0,
            finish: None,
            on_token,
            req,
        })
    }

    /// One shared round over `streams` (finished ones are skipped) with at most `max_rows` rows (every decoding
    /// stream gets at least its pending row). Returns the rows run (0 when every stream is done).
    pub fn round(&mut self, streams: &mut [Stream<'_>], max_rows: usize) -> Result<usize, EngineError> {
        let vocab = self.model.vocab_size();
        let mut parts: Vec<(usize, Part)> = Vec::new();
        let decoding: Vec<usize> =
            (0..streams.len()).filter(|&i| !streams[i].is_done() && !streams[i].tokens.is_empty()).collect();
        let mut budget = max_rows.max(decoding.len());
        // Cancellations end a stream before it takes rows.
        for s in streams.iter_mut().filter(|s| !s.is_done() && s.cancelled()) {
            s.finish = Some(FinishReason::Cancelled);
        }
        // Pending rows first, then drafts shared in turn, then prompt chunks.
        budget -= decoding.iter().filter(|&&i| !streams[i].is_done()).count();
        let config = self.drafting.clone();
        for &i in &decoding {
            let s = &mut streams[i];
            if s.is_done() {
                continue;
            }
            let pending = *s.tokens.last().expect("decoding");
            s.context.push(pending);
            let remaining = s.req.max_tokens - s.tokens.len();
            let mut drafts = Vec::new();
            if let (Some(c), Some(prop)) = (&config, s.proposer.as_mut()) {
                let k = s.stats.best_width(&c.costs, c.max_window - 1).max(c.min_drafts).min(c.max_window - 1);
                let k = k.min(remaining).min(budget);
                if k > 0 {
                    let t = prop.propose(&s.context, k);
                    drafts = first_path(&t);
                    if drafts.is_empty() && c.min_drafts > 0 {
                        drafts.push(fallback_guess(&s.context));
                    }
                }
            }
            budget -= drafts.len();
            parts.push((i, Part::Window { drafts }));
        }
        let mut filling: Vec<usize> =
            (0..streams.len()).filter(|&i| !streams[i].is_done() && streams[i].tokens.is_empty()).collect();
        // Shortest remaining prompt first.
        filling.sort_by_key(|&i| streams[i].req.prompt.len() - streams[i].filled);
        for i in filling {
            if budget == 0 {
                break;
            }
            let s = &streams[i];
            let len = (s.req.prompt.len() - s.filled).min(s.req.prefill_chunk).min(budget);
            budget -= len;
            parts.push((i, Part::Fill { start: s.filled, len }));
        }
        if parts.is_empty() {
            return Ok(0);
        }
        // One batch: a block table per stream, rows in part order.
        let mut batch = Batch {
            tokens: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            attn: AttnMeta { block_tables: Vec::new(), rows: Vec::new() },
            logit_rows: Vec::new(),
        };
        let mut first_row = Vec::with_capacity(parts.len());
        for (seq, (i, part)) in parts.iter().enumerate() {
            let s = &streams[*i];
            batch.attn.block_tables.push(s.table.ids());
            first_row.push(batch.tokens.len());
            let (toks, start): (Vec<u32>, usize) = match part {
                Part::Fill { start, len } => (s.req.prompt[*start..start + len].to_vec(), *start),
                Part::Window { drafts } => {
                    let mut t = vec![*s.tokens.last().expect("decoding")];
                    t.extend_from_slice(drafts);
                    (t, s.req.prompt.len() + s.tokens.len() - 1)
                }
            };
            let wants_logits = match part {
                Part::Fill { start, len } => start + len == s.req.prompt.len(),
                Part::Window { .. } => true,
            };
            for (j, &t) in toks.iter().enumerate() {
                let pos = (start + j) as u32;
                let last = j + 1 == toks.len();
                if matches!(part, Part::Window { .. }) || (wants_logits && last) {
                    batch.logit_rows.push(batch.tokens.len());
                }
                batch.tokens.push(t);
                batch.positions.push(pos);
                batch.slots.push(s.table.slot(start + j));
                batch.attn.rows.push(RowAttn { pos, seq, ctx: pos + 1, tree: Vec::new() });
            }
        }
        let rows = batch.tokens.len();
        let out = self.model.forward(self.be, &batch, &mut self.kv);
        let want = batch.logit_rows.len();
        if out.rows != want || out.cols != vocab {
            return Err(EngineError::Model(format!("logits are {}×{}, expected {want}×{vocab}", out.rows, out.cols)));
        }
        let logits = self.be.to_host(&out);
        // Hand each stream its logits rows, in part order.
        let mut at = 0;
        for (i, part) in parts {
            let s = &mut streams[i];
            match part {
                Part::Fill { start, len } => {
                    s.filled = start + len;
                    if s.filled == s.req.prompt.len() {
                        s.prefill_s = s.started.elapsed().as_secs_f64();
                        s.decode_start = Some(Instant::now());
                        let row = &logits[at * vocab..(at + 1) * vocab];
                        at += 1;
                        let p = s.req.prompt.len();
                        let d = drawn(&s.req, row, s.seed, p, &[]);
                        emit(s, d);
                    }
                }
                Part::Window { drafts } => {
                    let n = drafts.len() + 1;
                    let window = &logits[at * vocab..(at + n) * vocab];
                    at += n;
                    let p = s.req.prompt.len() + s.tokens.len() - 1;
                    let tree = DraftTree::from_chain(&drafts);
                    let mut ds = Vec::new();
                    let tokens = s.tokens.clone();
                    let (req, seed) = (&s.req, s.seed);
                    let verdict = verify(&tree, &mut |row, path| {
                        let mut reply = tokens.clone();
                        reply.extend_from_slice(path);
                        let d = drawn(req, &window[row * vocab..(row + 1) * vocab], seed, p + row + 1, &reply);
                        let t = d.0;
                        ds.push(d);
                        t
                    });
                    let remaining = s.req.max_tokens - s.tokens.len();
                    let verdict = truncate_after(verdict, remaining, &|t| s.req.stop_ids.contains(&t));
                    s.counts.rounds += 1;
                    s.counts.drafted += drafts.len();
                    s.counts.min_rows = if s.counts.rounds == 1 { n } else { s.counts.min_rows.min(n) };
                    if let Some(prop) = s.proposer.as_mut() {
                        prop.observe(drafts.len(), verdict.accepted());
                        s.stats.observe(drafts.len(), verdict.accepted());
                    }
                    let m = verdict.tokens.len();
                    for (j, d) in ds.into_iter().take(m).enumerate() {
                        if j > 0 {
                            let last = *s.tokens.last().expect("emitted");
                            s.context.push(last);
                        }
                        if j + 1 < m || !verdict.has_bonus() {
                            s.counts.accepted += 1;
                        }
                        emit(s, d);
                        if s.is_done() {
                            break;
                        }
                    }
                }
            }
            if s.is_done() {
                if let Some(cache) = self.cache.as_mut() {
                    let mut fed = s.req.prompt.clone();
                    fed.extend_from_slice(&s.tokens[..s.tokens.len().saturating_sub(1)]);
                    if s.filled == s.req.prompt.len() {
                        cache.insert(&fed, &s.table);
                    }
                }
            }
        }
        Ok(rows)
    }

    /// Runs every request to the end in shared rounds of at most `max_rows` rows; replies in request order.
    pub fn generate_many<'c>(
        &mut self,
        reqs: Vec<(GenRequest, OnToken<'c>)>,
        max_rows: usize,
    ) -> Vec<Result<GenOutput, EngineError>> {
        let mut streams = Vec::new();
        let mut slots = Vec::new();
        let mut results: Vec<Option<Result<GenOutput, EngineError>>> = Vec::new();
        for (req, cb) in reqs {
            match self.admit_stream(req, cb) {
                Ok(s) => {
                    slots.push(Some(streams.len()));
                    streams.push(s);
                    results.push(None);
                }
                Err(e) => {
                    slots.push(None);
                    results.push(Some(Err(e)));
                }
            }
        }
        loop {
            match self.round(&mut streams, max_rows) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    for (r, s) in results.iter_mut().zip(&slots) {
                        if s.is_some() && r.is_none() {
                            *r = Some(Err(e.clone()));
                        }
                    }
                    break;
                }
            }
            if streams.iter().all(Stream::is_done) {
                break;
            }
        }
        for (r, s) in results.iter_mut().zip(&slots) {
            if let (None, Some(i)) = (&r, s) {
                *r = Some(Ok(streams[*i].output()));
            }
        }
        results.into_iter().map(|r| r.expect("every request answered")).collect()
    }
}

/// The keyed draw of a row: (token, logprob, alternatives).
fn drawn(req: &GenRequest, logits: &[f32], seed: u64, position: usize, reply: &[u32]) -> (u32, f64, Vec<(u32, f64)>) {
    let d = sample(logits, &req.params, seed, position as u64, reply);
    let top = if req.top_logprobs > 0 {
        top_logprobs(&penalized(logits, &req.params, reply), req.top_logprobs)
    } else {
        Vec::new()
    };
    (d.token, d.logprob, top)
}

/// Emits one token to its stream and records why it ends, if it does.
fn emit(s: &mut Stream<'_>, (token, logprob, top): (u32, f64, Vec<(u32, f64)>)) {
    let position = s.req.prompt.len() + s.tokens.len();
    s.tokens.push(token);
    let is_stop = s.req.stop_ids.contains(&token);
    let flow = (s.on_token)(TokenEvent { token, index: s.tokens.len() - 1, position, logprob, is_stop, top });
    s.finish = if is_stop {
        Some(FinishReason::Stop)
    } else if flow == Flow::Stop || s.cancelled() {
        Some(FinishReason::Cancelled)
    } else if s.tokens.len() == s.req.max_tokens {
        Some(FinishReason::Length)
    } else {
        None
    };
    if s.finish.is_some() {
        s.decode_s = s.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    }
}
