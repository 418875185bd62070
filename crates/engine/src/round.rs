//! One round of the engine loop (DESIGN.md §5): every sequence the scheduler granted rows advances in one
//! forward — prompt chunks, one-row steps, chain windows and tree windows of any mix of sequences. Every row is
//! row-exact and attends only to its own sequence's blocks (one block table per sequence, plus a tree row's own
//! path), so each sequence's tokens are exactly those of its solo, serial run, whatever shares the round.
//!
//! The steps of a round, each written once: proposal and width (`window.rs`), the batch, the forward, the
//! keyed draws and verify with the grammar's mask per row (`window.rs`), commit and emit ([`Sequence::emit`]),
//! the prefix-cache insert of finished sequences. A round of greedy one-row steps may instead be queued ahead
//! of the host (`ahead.rs`).

use crate::draft::DraftCounts;
use crate::generate::{EngineError, GenRequest, Generator, TokenLogprob};
use crate::kv_pool::BlockTable;
use crate::logits::{draw_row, fetch, greedy_on_device, window_on_device};
use crate::sampler::{log_softmax_at, penalized, top_logprobs};
use crate::seq::{OnToken, Sequence};
use crate::spec::{ClassStats, DraftTree};
use std::time::Instant;
use tf_core::{AttnMeta, RowAttn};
use tf_models::Batch;

/// What a sequence may run in one round (the scheduler's decision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// A decode window: the pending row and at most `max_drafts` draft rows.
    Window { max_drafts: usize },
    /// At most `max_len` positions of its fill (also capped by the request's `prefill_chunk`).
    Fill { max_len: usize },
}

/// What one sequence contributes to a round.
pub(crate) enum Part {
    /// Sequence rows `start..start + len`.
    Fill { start: usize, len: usize },
    /// The pending token and a tree of drafts (a chain in the common case). A chain writes its rows straight into
    /// the sequence's slots; a tree's rows (several may share a position) go to `scratch`, and the accepted path
    /// is copied into place afterwards.
    Window { tree: DraftTree, scratch: Option<BlockTable> },
}

impl Part {
    /// Rows of this part whose logits the round fetches.
    fn logit_rows(&self, s: &Sequence<'_>) -> usize {
        match self {
            Part::Fill { start, len } if s.req.prompt_logprobs.is_some() => *len.min(&(s.fill_target() - start)),
            Part::Fill { start, len } => usize::from(start + len == s.fill_target()),
            Part::Window { tree, .. } => tree.len() + 1,
        }
    }
}

impl<'a> Generator<'a> {
    /// Admits a request: checks it, takes cached prefix blocks and reserves every other block it can need (all
    /// or nothing).
    pub fn admit_seq<'c>(&mut self, req: GenRequest, on_token: OnToken<'c>) -> Result<Sequence<'c>, EngineError> {
        let seed = self.admit(&req)?;
        let constraint = match &req.constraint {
            Some(spec) => Some(spec.start().map_err(|e| EngineError::InvalidRequest(e.to_string()))?),
            None => None,
        };
        let (table, cached_tokens) = self.reserve(&req)?;
        let proposer = self.drafting.as_ref().filter(|c| req.draft && c.max_window >= 2).map(|c| match &c.proposer {
            Some(make) => make(&req),
            None => crate::draft::default_proposer(),
        });
        self.next_key += 1;
        let mut s = Sequence {
            key: self.next_key,
            seed,
            state_at: None,
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
            propose_cost: [0.0; crate::spec::CLASSES],
            proposals: [0; crate::spec::CLASSES],
            constraint,
            prompt_logprobs: if req.prompt_logprobs.is_some() { vec![None] } else { Vec::new() },
            in_flight: false,
            started: Instant::now(),
            prefill_s: 0.0,
            decode_start: None,
            decode_s: 0.0,
            finish: None,
            failed: None,
            on_token,
            req,
        };
        if cached_tokens > 0 {
            self.settle_state(&mut s, Some(cached_tokens - 1), &[]);
        }
        Ok(s)
    }

    /// Releases a running sequence's KV: its written full blocks go to the prefix cache (if on), where a resume
    /// finds them unless they were evicted meanwhile. Its tokens, proposer, grammar state and counters stay. A
    /// step queued ahead for it must have landed ([`Generator::land`]).
    pub fn preempt(&mut self, s: &mut Sequence<'_>) {
        if s.preempted || s.is_done() {
            return;
        }
        debug_assert!(!s.in_flight, "preempted with a step in flight");
        if let Some(cache) = self.cache.as_mut() {
            cache.insert(&s.written(), &s.table);
        }
        self.settle_state(s, None, &[]);
        s.table = BlockTable::new(&self.pool);
        s.filled = 0;
        s.preempted = true;
    }

    /// Takes blocks again for a preempted sequence: its cached prefix, then every block it can still need (all
    /// or nothing; on refusal it stays preempted). It then refills `prompt ++ tokens`; the last row's logits
    /// give its next token, exactly as its decode window would have.
    pub fn resume(&mut self, s: &mut Sequence<'_>) -> Result<(), EngineError> {
        if !s.preempted {
            return Ok(());
        }
        let seq = s.sequence();
        // A scoring request fills every prompt row itself (no cached prefix skips its logprobs).
        let use_cache = s.req.prompt_logprobs.is_none();
        let (table, cached) = self.reserve_seq(&seq, s.req.prompt.len() + s.req.max_tokens, use_cache)?;
        s.table = table;
        s.filled = cached;
        s.preempted = false;
        if cached > 0 {
            self.settle_state(s, Some(cached - 1), &[]);
        }
        // Preempted before its first token it simply fills its prompt again.
        s.resuming = !s.tokens.is_empty();
        Ok(())
    }

    /// Runs one round of `grants` (sequence index, what it may run) as one forward; cancelled sequences end
    /// first and take no rows. Returns the rows run.
    pub fn run_round(&mut self, seqs: &mut [Sequence<'_>], grants: &[(usize, Grant)]) -> Result<usize, EngineError> {
        for s in seqs.iter_mut() {
            s.cancel_if_flagged();
        }
        if let Some(rows) = self.run_ahead_round(seqs, grants)? {
            return Ok(rows);
        }
        let mut parts: Vec<(usize, Part)> = Vec::new();
        for &(i, grant) in grants {
            let s = &mut seqs[i];
            match grant {
                Grant::Window { max_drafts } if s.is_decoding() => {
                    let part = self.window_part(s, max_drafts);
                    parts.push((i, part));
                }
                Grant::Fill { max_len } if s.is_filling() => {
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
        let mut batch = round_batch(seqs, &parts);
        // Only the argmaxes cross to the host when every logits row of the round is a plain greedy draw: a fill's
        // last row follows the sequence's reply so far, a window's rows the reply and their drafts.
        let argmax = self.device_argmax
            && parts.iter().all(|(i, part)| {
                let s = &seqs[*i];
                match part {
                    Part::Fill { .. } if s.req.prompt_logprobs.is_some() => false,
                    Part::Fill { start, len } => start + len < s.fill_target() || greedy_on_device(&s.req, &s.tokens),
                    Part::Window { tree, .. } => window_on_device(&s.req, &s.tokens, !tree.is_empty()),
                }
            });
        let rows = batch.tokens.len();
        let vocab = self.model.vocab_size();
        let window_rows: Vec<bool> = parts
            .iter()
            .flat_map(|(_, part)| match part {
                Part::Fill { len, .. } => vec![false; *len],
                Part::Window { tree, .. } => vec![true; tree.len() + 1],
            })
            .collect();
        let out = self.run_model(&mut batch, &window_rows)?;
        let logits = fetch(self.be, &out, batch.logit_rows.len(), vocab, argmax)?;
        // Hand each sequence its logits rows, in part order.
        let (mut at, mut row) = (0, 0);
        for (i, part) in parts {
            let s = &mut seqs[i];
            let n = part.logit_rows(s);
            let part_rows = match &part {
                Part::Fill { len, .. } => *len,
                Part::Window { tree, .. } => tree.len() + 1,
            };
            let rows_here: Vec<(u32, usize)> =
                (row..row + part_rows).map(|r| (batch.slots[r], batch.positions[r] as usize)).collect();
            row += part_rows;
            match part {
                Part::Fill { start, len } => {
                    s.filled = start + len;
                    if let Some(k) = s.req.prompt_logprobs {
                        score_prompt_rows(s, &logits, at, start, n, k);
                    }
                    if s.filled == s.fill_target() {
                        self.fill_done(s, logits.row(at + n - 1));
                    }
                }
                Part::Window { tree, scratch } => {
                    self.verify_window(s, &tree, scratch.as_ref(), &logits, at);
                }
            }
            at += n;
            // The sequence's latest recurrent state (hybrid models): the last position whose K/V is final.
            let latest = match s.is_done() || s.preempted {
                true => None,
                false => (if s.is_filling() { s.filled } else { s.fill_target() - 1 }).checked_sub(1),
            };
            self.settle_state(s, latest, &rows_here);
            // A finished sequence's written blocks stay for later requests that start the same way.
            if s.is_done() && !s.resuming && (!s.tokens.is_empty() || s.req.max_tokens == 0) {
                if let Some(cache) = self.cache.as_mut() {
                    cache.insert(&s.written(), &s.table);
                }
            }
        }
        Ok(rows)
    }

    /// A fill reached the end of the sequence: its last row gives the next token (none for a scoring request
    /// with `max_tokens` 0).
    fn fill_done(&mut self, s: &mut Sequence<'_>, last: crate::logits::Row<'_>) {
        if s.req.max_tokens == 0 {
            s.prefill_s = s.started.elapsed().as_secs_f64();
            s.end(crate::FinishReason::Length);
            return;
        }
        let vocab = self.model.vocab_size();
        let mask = match self.mask_here(s, vocab) {
            Ok(m) => m,
            Err(e) => {
                s.failed = Some(e);
                return;
            }
        };
        let d = draw_row(&s.req, last, s.seed, s.fill_target(), &s.tokens, mask.as_deref());
        if s.resuming {
            // The old pending token is fed now; the draw is the window it would have run.
            s.resuming = false;
            s.context.push(*s.tokens.last().expect("resumed after a token"));
        } else {
            // A draft model reads the prompt now, as part of its processing, not on its first proposal.
            if let Some(p) = s.proposer.as_mut() {
                p.prepare(&s.context);
            }
            s.prefill_s = s.started.elapsed().as_secs_f64();
            s.decode_start = Some(Instant::now());
        }
        s.emit(d);
    }
}

/// Prompt logprobs of one chunk: row `r` (position `start + r`) predicts the prompt token after it. Rows whose
/// entry was recorded before (a resumed sequence refilling) are skipped.
fn score_prompt_rows(
    s: &mut Sequence<'_>,
    logits: &crate::logits::Logits,
    at: usize,
    start: usize,
    n: usize,
    k: usize,
) {
    for r in 0..n {
        let pos = start + r;
        let Some(&next) = s.req.prompt.get(pos + 1) else { break };
        if s.prompt_logprobs.len() != pos + 1 {
            continue;
        }
        let crate::logits::Row::Values(row) = logits.row(at + r) else { unreachable!("prompt rows fetch values") };
        let values = penalized(row, &s.req.params, &[]);
        s.prompt_logprobs.push(Some(TokenLogprob {
            token: next,
            logprob: log_softmax_at(&values, next),
            top: top_logprobs(&values, k),
        }));
    }
}

/// One batch for the round: a block table per sequence, rows in part order. A tree row attends to the committed
/// prefix and to its own path through the scratch slots.
fn round_batch(seqs: &[Sequence<'_>], parts: &[(usize, Part)]) -> Batch {
    let mut batch = Batch {
        tokens: Vec::new(),
        positions: Vec::new(),
        slots: Vec::new(),
        attn: AttnMeta { block_tables: Vec::new(), rows: Vec::new() },
        logit_rows: Vec::new(),
        fed: None,
        states: Vec::new(),
    };
    for (seq, (i, part)) in parts.iter().enumerate() {
        let s = &seqs[*i];
        batch.attn.block_tables.push(s.table.ids());
        match part {
            Part::Fill { start, len } => {
                let wanted = part.logit_rows(s);
                for j in 0..*len {
                    let pos = (start + j) as u32;
                    if j + wanted >= *len {
                        batch.logit_rows.push(batch.tokens.len());
                    }
                    batch.tokens.push(s.seq_token(start + j));
                    batch.positions.push(pos);
                    batch.slots.push(s.table.slot(start + j));
                    batch.attn.rows.push(RowAttn { pos, seq, ctx: pos + 1, tree: Vec::new() });
                }
            }
            Part::Window { tree, scratch } => {
                let pending = *s.tokens.last().expect("decoding");
                push_window(&mut batch, seq, &s.table, scratch.as_ref(), tree, pending, s.fill_target() - 1);
            }
        }
    }
    batch
}

/// Appends the rows of one window of sequence `seq` to `batch`, every row wanting logits: row 0 (the pending
/// token at `p`) in its own slot, then each draft node at `p + depth`: a chain's in the sequence's slots, a tree's
/// in its scratch slot, attending to the committed prefix `0..=p` and its own path.
pub(crate) fn push_window(
    batch: &mut Batch,
    seq: usize,
    table: &BlockTable,
    scratch: Option<&BlockTable>,
    tree: &DraftTree,
    pending: u32,
    p: usize,
) {
    let positions = tree.row_positions(p);
    for (row, &t) in tree.row_tokens(pending).iter().enumerate() {
        let pos = positions[row] as u32;
        batch.logit_rows.push(batch.tokens.len());
        batch.tokens.push(t);
        batch.positions.push(pos);
        match (row, scratch) {
            (0, _) | (_, None) => {
                batch.slots.push(table.slot(positions[row]));
                batch.attn.rows.push(RowAttn { pos, seq, ctx: pos + 1, tree: Vec::new() });
            }
            (_, Some(sc)) => {
                let node = row - 1;
                let mut path = tree.ancestors(node);
                path.push(node);
                let pairs = path.iter().map(|&a| ((p + tree.depth(a)) as u32, sc.slot(a))).collect();
                batch.slots.push(sc.slot(node));
                batch.attn.rows.push(RowAttn { pos, seq, ctx: p as u32 + 1, tree: pairs });
            }
        }
    }
}
