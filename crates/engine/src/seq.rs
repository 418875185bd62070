//! [`Sequence`]: everything one request carries through the engine loop. Its token sequence is
//! `prompt ++ tokens`; it fills a prefix of that (the prompt, or after a preemption the prompt and every token
//! already emitted), then decodes: each round feeds the pending token (the last emitted one, whose K/V is not
//! written yet) and a window of drafts. The scheduler decides when it runs; this type holds what it is.

use crate::draft::DraftCounts;
use crate::generate::{token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, TokenEvent, TokenLogprob};
use crate::kv_pool::BlockTable;
use crate::spec::{ClassStats, Proposer, CLASSES};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tf_core::TokenConstraint;

/// The token callback of one sequence.
pub type OnToken<'c> = Box<dyn FnMut(TokenEvent) -> Flow + 'c>;

/// One request in the engine loop.
pub struct Sequence<'c> {
    pub req: GenRequest,
    /// Its identity across rounds (indices move as sequences finish).
    pub(crate) key: u64,
    /// The key of its draws: the request's seed, or the prompt-derived one (DESIGN.md §3).
    pub(crate) seed: u64,
    /// Its KV blocks: every block it can need, reserved at admission (empty while preempted).
    pub(crate) table: BlockTable,
    /// A hybrid model's latest recurrent state: the slot (pinned in the state map) and position it was left at.
    pub(crate) state_at: Option<(u32, usize)>,
    /// Prompt tokens whose K/V came from the prefix cache.
    pub(crate) cached_tokens: usize,
    /// Positions of the sequence whose K/V is written (while filling).
    pub(crate) filled: usize,
    /// Generated tokens (the last one is pending while decoding).
    pub(crate) tokens: Vec<u32>,
    /// Prompt + emitted tokens fed so far, then the pending token while a window runs (the proposer's context).
    pub(crate) context: Vec<u32>,
    /// Its KV was released ([`crate::Generator::preempt`]); [`crate::Generator::resume`] takes blocks again.
    pub(crate) preempted: bool,
    /// Refilling `prompt ++ tokens` after a preemption.
    pub(crate) resuming: bool,
    /// Drafts for its windows (context copies or a draft model); `None`: serial, one row per round.
    pub(crate) proposer: Option<Box<dyn Proposer>>,
    /// Measured acceptance per class of guess (picks window widths).
    pub(crate) stats: ClassStats,
    /// The class its proposer named for the drafts of the running window.
    pub(crate) class: Option<usize>,
    /// Seconds the proposer spends per drafted token, by class of guess (a draft model's forwards; ~0 for context
    /// copies): a moving average over that class's own proposals, part of what a wider window of that class
    /// costs. A class not measured yet costs 0 (it is tried, then priced).
    pub(crate) propose_cost: [f64; CLASSES],
    pub(crate) proposals: [usize; CLASSES],
    /// The grammar's matcher, advanced by committed tokens only (DESIGN.md §8).
    pub(crate) constraint: Option<Box<dyn TokenConstraint>>,
    /// With `prompt_logprobs`: one entry per prompt token scored so far (`None` for the first).
    pub(crate) prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// A greedy step queued on the backend whose token the host has not taken yet (`ahead.rs`).
    pub(crate) in_flight: bool,
    pub(crate) counts: DraftCounts,
    pub(crate) started: Instant,
    pub(crate) prefill_s: f64,
    pub(crate) decode_start: Option<Instant>,
    /// Seconds from the first token to the end, set when it finishes.
    pub(crate) decode_s: f64,
    pub(crate) finish: Option<FinishReason>,
    /// Why it failed (a constraint that broke its contract); it then ends with this error.
    pub(crate) failed: Option<EngineError>,
    pub(crate) on_token: OnToken<'c>,
}

impl<'c> Sequence<'c> {
    pub fn is_done(&self) -> bool {
        self.finish.is_some() || self.failed.is_some()
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
    pub(crate) fn fill_target(&self) -> usize {
        self.req.prompt.len() + self.tokens.len()
    }

    /// Token at `pos` of `prompt ++ tokens`.
    pub(crate) fn seq_token(&self, pos: usize) -> u32 {
        let p = self.req.prompt.len();
        if pos < p {
            self.req.prompt[pos]
        } else {
            self.tokens[pos - p]
        }
    }

    /// The leading tokens whose K/V is written and final: the filled prefix while filling, the whole prompt of
    /// a scoring request that generated nothing, else the prompt and every emitted token but the pending one.
    pub(crate) fn written(&self) -> Vec<u32> {
        let n = if self.is_filling() {
            self.filled
        } else if self.tokens.is_empty() {
            self.filled.min(self.req.prompt.len())
        } else {
            self.fill_target() - 1
        };
        (0..n).map(|p| self.seq_token(p)).collect()
    }

    pub(crate) fn cancelled(&self) -> bool {
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
            self.end(FinishReason::Cancelled);
        }
    }

    pub(crate) fn end(&mut self, why: FinishReason) {
        self.finish = Some(why);
        self.decode_s = self.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    }

    /// The finished reply, or the error that ended it.
    pub fn output(&mut self) -> Result<GenOutput, EngineError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok(GenOutput {
            token_sha: token_sha(&self.tokens),
            tokens: self.tokens.clone(),
            finish_reason: self.finish.unwrap_or(FinishReason::Cancelled),
            prefill_s: self.prefill_s,
            decode_s: self.decode_s,
            prompt_tokens: self.req.prompt.len(),
            seed: self.seed,
            prompt_logprobs: std::mem::take(&mut self.prompt_logprobs),
            counts: self.counts,
            cached_tokens: self.cached_tokens,
        })
    }

    /// Emits one drawn token: advances the constraint, calls the sink and records why the reply ends, if it
    /// does.
    pub(crate) fn emit(&mut self, (token, logprob, top): (u32, Option<f64>, Vec<(u32, f64)>)) {
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.consume(token) {
                self.failed = Some(EngineError::Model(format!("a drawn token broke the request's grammar: {e}")));
                return;
            }
        }
        let position = self.req.prompt.len() + self.tokens.len();
        self.tokens.push(token);
        let is_stop = self.req.stop_ids.contains(&token);
        let flow = (self.on_token)(TokenEvent { token, index: self.tokens.len() - 1, position, logprob, is_stop, top });
        let finish = if is_stop {
            Some(FinishReason::Stop)
        } else if flow == Flow::Stop || self.cancelled() {
            Some(FinishReason::Cancelled)
        } else if self.tokens.len() == self.req.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        if let Some(why) = finish {
            self.end(why);
        }
    }
}
