//! Shared rounds (DESIGN.md §5): several streams advance in one forward per round — each decoding stream's
//! window (pending token + drafts) and prompt chunks of streams still filling, packed under a row budget. Every
//! row is row-exact and attends only to its own stream's blocks (one block table per stream), so each stream's
//! tokens are exactly those of its solo, serial run, whatever shares the round.
//!
//! Windows here are chains (a proposer's tree is cut to its first path); tree windows run in solo decoding.
//! What runs in a round is either the simple policy of [`Generator::round`] or a scheduler's [`Grant`]s
//! ([`Generator::run_round`], see `sched`); a stream can be preempted (KV released) and resumed later.

use crate::draft::{fallback_guess, first_path, DraftConfig, DraftCounts};
use crate::generate::{token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent};
use crate::kv_pool::BlockTable;
use crate::logits::{draw_row, fetch, greedy_on_device, window_on_device};
use crate::spec::{truncate_after, verify, ClassStats, CostTable, DraftTree, Proposer};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tf_core::{AttnMeta, RowAttn};
use tf_models::Batch;

/// The token callback of one stream.
pub type OnToken<'c> = Box<dyn FnMut(TokenEvent) -> Flow + 'c>;

/// One stream in shared rounds. Its sequence is `prompt ++ tokens`; it fills a prefix of that sequence (the
/// prompt, or after a preemption the prompt and every token already emitted), then decodes: each round feeds
/// the pending token (the last emitted, whose K/V is not written yet) and a chain of drafts.
pub struct Stream<'c> {
    pub req: GenRequest,
    seed: u64,
    table: BlockTable,
    cached_tokens: usize,
    /// Positions of the sequence whose K/V is written (while filling).
    filled: usize,
    tokens: Vec<u32>,
    /// Prompt + emitted tokens fed so far, then the pending token while a window runs (the proposer's context).
    context: Vec<u32>,
    /// Its KV was released ([`Generator::preempt`]); [`Generator::resume`] takes blocks again.
    preempted: bool,
    /// Refilling `prompt ++ tokens` after a preemption.
    resuming: bool,
    proposer: Option<Box<dyn Proposer>>,
    stats: ClassStats,
    /// The class its proposer named for the drafts of the running window (see [`Proposer::propose_by_class`]).
    class: Option<usize>,
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

    /// Whether its KV is released (waiting to resume).
    pub fn is_preempted(&self) -> bool {
        self.preempted
    }

    /// Whether it has sequence positions to fill before it can decode.
    pub fn is_filling(&self) -> bool {
        !self.is_done() && !self.preempted && (self.tokens.is_empty() || self.resuming)
    }

    /// Whether its next rows are a decode window.
    pub fn is_decoding(&self) -> bool {
        !self.is_done() && !self.preempted && !self.tokens.is_empty() && !self.resuming
    }

    /// Positions filled so far (meaningful while filling).
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Tokens emitted so far.
    pub fn emitted(&self) -> usize {
        self.tokens.len()
    }

    /// Positions a fill must write: the prompt, plus every emitted token when it resumes.
    fn fill_target(&self) -> usize {
        self.req.prompt.len() + self.tokens.len()
    }

    /// Token at `pos` of `prompt ++ tokens`.
    fn seq_token(&self, pos: usize) -> u32 {
        let p = self.req.prompt.len();
        if pos < p {
            self.req.prompt[pos]
        } else {
            self.tokens[pos - p]
        }
    }

    /// The leading tokens whose K/V is written and final: the filled prefix while filling, else the prompt and
    /// every emitted token but the pending one.
    fn written(&self) -> Vec<u32> {
        let n = if self.is_filling() { self.filled } else { self.fill_target().saturating_sub(1) };
        (0..n).map(|p| self.seq_token(p)).collect()
    }

    fn cancelled(&self) -> bool {
        self.req.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Ends it as cancelled if its cancel flag is set (also while preempted, when no round runs it).
    pub fn cancel_if_flagged(&mut self) {
        if self.cancelled() {
            self.cancel();
        }
    }

    /// `prompt ++ tokens`: what a resume refills (and looks up in the prefix cache).
    pub fn sequence(&self) -> Vec<u32> {
        (0..self.fill_target()).map(|p| self.seq_token(p)).collect()
    }

    /// Ends it now as cancelled (its blocks go when it drops).
    pub fn cancel(&mut self) {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Cancelled);
            self.decode_s = self.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
        }
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

/// What a stream may run in one round (a scheduler's decision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// A decode window: the pending row and at most `max_drafts` drafts.
    Window { max_drafts: usize },
    /// At most `max_len` positions of its fill (also capped by the request's `prefill_chunk`).
    Fill { max_len: usize },
}

/// What one stream contributes to a round.
enum Part {
    /// Sequence rows `start..start + len`.
    Fill { start: usize, len: usize },
    /// The pending token and a chain of drafts.
    Window { drafts: Vec<u32> },
}

/// [`Generator::want_drafts`] with the stream's window costs already priced.
fn want_drafts_priced(c: &DraftConfig, s: &Stream<'_>, costs: &CostTable) -> usize {
    if s.proposer.is_none() {
        return 0;
    }
    let k = s.stats.widest(costs, c.max_window - 1).max(c.min_drafts).min(c.max_window - 1);
    k.min(s.req.max_tokens.saturating_sub(s.tokens.len()))
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
            preempted: false,
            resuming: false,
            counts: DraftCounts { drafts: proposer.is_some(), ..DraftCounts::default() },
            proposer,
            stats: ClassStats::default(),
            class: None,
            started: Instant::now(),
            prefill_s: 0.0,
            decode_start: None,
            decode_s: 0.0,
            finish: None,
            on_token,
            req,
        })
    }

    /// Releases a running stream's KV: its written full blocks go to the prefix cache (if on), where a resume
    /// finds them unless they were evicted meanwhile. Its tokens, proposer and counters stay.
    pub fn preempt(&mut self, s: &mut Stream<'_>) {
        if s.preempted || s.is_done() {
            return;
        }
        if let Some(cache) = self.cache.as_mut() {
            cache.insert(&s.written(), &s.table);
        }
        s.table = BlockTable::new(&self.pool);
        s.filled = 0;
        s.preempted = true;
    }

    /// Takes blocks again for a preempted stream: its cached prefix, then every block it can still need (all
    /// or nothing; on refusal it stays preempted). It then refills `prompt ++ tokens`; the last row's logits
    /// give its next token, exactly as its decode window would have.
    pub fn resume(&mut self, s: &mut Stream<'_>) -> Result<(), EngineError> {
        if !s.preempted {
            return Ok(());
        }
        let seq = s.sequence();
        let (table, cached) = self.reserve_seq(&seq, s.req.prompt.len() + s.req.max_tokens, true)?;
        s.table = table;
        s.filled = cached;
        s.preempted = false;
        // Preempted before its first token it simply fills its prompt again.
        s.resuming = !s.tokens.is_empty();
        Ok(())
    }

    /// Drafts a decoding stream may verify in its next window (0 without drafting): the widest width its
    /// measured acceptance (of any class of guess) and the measured window costs favour, within `max_window`
    /// and `max_tokens`. The proposer's class of guess picks the width within this when the window runs.
    pub fn want_drafts(&self, s: &Stream<'_>) -> usize {
        let Some(c) = &self.drafting else { return 0 };
        want_drafts_priced(c, s, &self.stream_costs(c, s))
    }

    /// The window costs `s` is priced with: as its own rows would come back (argmaxes for a greedy stream when
    /// the backend draws them). A round brings back only argmaxes when all its streams are greedy, so with
    /// sampled streams beside it a greedy stream's windows cost a little more than priced.
    fn stream_costs(&self, c: &DraftConfig, s: &Stream<'_>) -> CostTable {
        let device = self.device_argmax;
        c.round_costs(
            device && greedy_on_device(&s.req, &s.tokens),
            device && window_on_device(&s.req, &s.tokens, true),
        )
    }

    /// One shared round over `streams` (finished ones are skipped) with at most `max_rows` rows (every decoding
    /// stream gets at least its pending row): drafts in stream order, then prompt chunks shortest remaining
    /// first. Returns the rows run (0 when nothing is left to run).
    pub fn round(&mut self, streams: &mut [Stream<'_>], max_rows: usize) -> Result<usize, EngineError> {
        for s in streams.iter_mut() {
            s.cancel_if_flagged();
        }
        let decoding: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].is_decoding()).collect();
        let mut budget = max_rows.max(decoding.len()) - decoding.len();
        let mut grants = Vec::new();
        for &i in &decoding {
            let k = self.want_drafts(&streams[i]).min(budget);
            budget -= k;
            grants.push((i, Grant::Window { max_drafts: k }));
        }
        let mut filling: Vec<usize> = (0..streams.len()).filter(|&i| streams[i].is_filling()).collect();
        filling.sort_by_key(|&i| streams[i].fill_target() - streams[i].filled);
        for i in filling {
            let len = (streams[i].fill_target() - streams[i].filled).min(streams[i].req.prefill_chunk).min(budget);
            if len > 0 {
                budget -= len;
                grants.push((i, Grant::Fill { max_len: len }));
            }
        }
        self.run_round(streams, &grants)
    }

    /// Runs one round of `grants` (stream index, what it may run) as one forward; cancelled streams end first
    /// and take no rows. Returns the rows run.
    pub fn run_round(&mut self, streams: &mut [Stream<'_>], grants: &[(usize, Grant)]) -> Result<usize, EngineError> {
        let vocab = self.model.vocab_size();
        for s in streams.iter_mut() {
            s.cancel_if_flagged();
        }
        let mut parts: Vec<(usize, Part)> = Vec::new();
        let config = self.drafting.clone();
        for &(i, grant) in grants {
            match grant {
                Grant::Window { max_drafts } if streams[i].is_decoding() => {
                    let priced = config.as_ref().map(|c| self.stream_costs(c, &streams[i])).unwrap_or_default();
                    let k = config.as_ref().map_or(0, |c| want_drafts_priced(c, &streams[i], &priced)).min(max_drafts);
                    let s = &mut streams[i];
                    let pending = *s.tokens.last().expect("decoding");
                    s.context.push(pending);
                    let mut drafts = Vec::new();
                    s.class = None;
                    if let (Some(c), Some(prop), true) = (&config, s.proposer.as_mut(), k > 0) {
                        let stats = &s.stats;
                        let width =
                            &mut |cl: usize| stats.best_width(cl, &priced, c.max_window - 1).max(c.min_drafts).min(k);
                        let (tree, class) = prop.propose_by_class(&s.context, width);
                        drafts = first_path(&tree);
                        s.class = class;
                        if drafts.is_empty() && c.min_drafts > 0 {
                            drafts.push(fallback_guess(&s.context));
                        }
                    } else if s.proposer.is_some() {
                        // No class was asked: let them all relax, so a stream that stopped drafting probes again.
                        s.stats.relax_all();
                    }
                    parts.push((i, Part::Window { drafts }));
                }
                Grant::Fill { max_len } if streams[i].is_filling() => {
                    let s = &streams[i];
                    let len = (s.fill_target() - s.filled).min(s.req.prefill_chunk).min(max_len);
                    if len > 0 {
                        parts.push((i, Part::Fill { start: s.filled, len }));
                    }
                }
                _ => {}
            }
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
            fed: None,
        };
        for (seq, (i, part)) in parts.iter().enumerate() {
            let s = &streams[*i];
            batch.attn.block_tables.push(s.table.ids());
            let (toks, start): (Vec<u32>, usize) = match part {
                Part::Fill { start, len } => ((*start..start + len).map(|p| s.seq_token(p)).collect(), *start),
                Part::Window { drafts } => {
                    let mut t = vec![*s.tokens.last().expect("decoding")];
                    t.extend_from_slice(drafts);
                    (t, s.fill_target() - 1)
                }
            };
            let wants_logits = match part {
                Part::Fill { start, len } => start + len == s.fill_target(),
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
        // Only the argmaxes cross to the host when every logits row of the round is a plain greedy draw: a fill's
        // last row follows the stream's reply so far, a window's rows the reply and their drafts.
        let argmax = self.device_argmax
            && parts.iter().all(|(i, part)| {
                let s = &streams[*i];
                match part {
                    Part::Fill { start, len } => start + len < s.fill_target() || greedy_on_device(&s.req, &s.tokens),
                    Part::Window { drafts } => window_on_device(&s.req, &s.tokens, !drafts.is_empty()),
                }
            });
        let rows = batch.tokens.len();
        let out = self.model.forward(self.be, &batch, &mut self.kv);
        let logits = fetch(self.be, &out, batch.logit_rows.len(), vocab, argmax)?;
        // Hand each stream its logits rows, in part order.
        let mut at = 0;
        for (i, part) in parts {
            let s = &mut streams[i];
            match part {
                Part::Fill { start, len } => {
                    s.filled = start + len;
                    if s.filled == s.fill_target() {
                        let d = draw_row(&s.req, logits.row(at), s.seed, s.fill_target(), &s.tokens);
                        at += 1;
                        if s.resuming {
                            // The old pending token is fed now; the draw is the window it would have run.
                            s.resuming = false;
                            s.context.push(*s.tokens.last().expect("resumed after a token"));
                        } else {
                            s.prefill_s = s.started.elapsed().as_secs_f64();
                            s.decode_start = Some(Instant::now());
                        }
                        emit(s, d);
                    }
                }
                Part::Window { drafts } => {
                    let n = drafts.len() + 1;
                    let first = at;
                    at += n;
                    let p = s.fill_target() - 1;
                    let tree = DraftTree::from_chain(&drafts);
                    let mut ds = Vec::new();
                    let tokens = s.tokens.clone();
                    let (req, seed) = (&s.req, s.seed);
                    let verdict = verify(&tree, &mut |row, path| {
                        let mut reply = tokens.clone();
                        reply.extend_from_slice(path);
                        let d = draw_row(req, logits.row(first + row), seed, p + row + 1, &reply);
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
                        if let Some(cl) = s.class {
                            s.stats.observe(cl, drafts.len(), verdict.accepted());
                        }
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
            // A finished stream's written blocks stay for later requests that start the same way.
            if s.is_done() && !s.tokens.is_empty() && !s.resuming {
                if let Some(cache) = self.cache.as_mut() {
                    cache.insert(&s.written(), &s.table);
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

/// Emits one token to its stream and records why it ends, if it does.
fn emit(s: &mut Stream<'_>, (token, logprob, top): (u32, Option<f64>, Vec<(u32, f64)>)) {
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
