//! The scheduling policy of shared rounds (issue 6, DESIGN.md §5): pure bookkeeping, no model, no backend, no
//! KV bytes. The engine keeps one [`Scheduler`], tells it about streams ([`Scheduler::try_enqueue`],
//! [`Scheduler::cancel`]), asks it once per round what to run ([`Scheduler::plan`]) and reports back what
//! happened ([`Scheduler::on_prefilled`], [`Scheduler::on_decoded`], [`Scheduler::on_finished`]).
//!
//! A stream's life: `Waiting` → (admitted: blocks reserved) `Prefilling` → `Decoding` → finished; a running
//! background stream may be preempted (`Preempted`: blocks released) and is admitted again later to refill its
//! prompt plus the tokens it already generated, then decodes on. Because every row is row-exact (DESIGN.md §2),
//! none of these choices changes a bit of any reply; they only move time around.
//!
//! The rules a plan follows are listed on [`Scheduler::plan`]; the constants are the fields of [`SchedConfig`].

mod policy;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use crate::Priority;

/// Default row budget of one round.
pub const DEFAULT_MAX_ROWS: usize = 512;
/// Default number of admitted streams (prefilling + decoding) at once (`--parallel`).
pub const DEFAULT_MAX_RUNNING: usize = 16;
/// Default bound of the waiting queue (beyond it [`Scheduler::try_enqueue`] refuses: HTTP 429).
pub const DEFAULT_MAX_WAITING: usize = 64;
/// Default rows kept for prompt chunks when drafts compete for rows.
pub const DEFAULT_MIN_PREFILL_ROWS: usize = 64;
/// Default aging: each round a stream has been queued counts as this many prompt tokens already filled.
pub const DEFAULT_AGING_TOKENS_PER_ROUND: usize = 128;
/// Default rounds an admitted (or resumed) stream is safe from preemption.
pub const DEFAULT_MIN_RESIDENT_ROUNDS: u64 = 8;

/// A stream's id, chosen by the engine (unique among the streams the scheduler knows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

/// The policy's constants. Zero row, stream and block sizes are treated as 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Token slots per KV block.
    pub block_size: usize,
    /// Blocks in the whole pool.
    pub total_blocks: usize,
    /// Rows of one round (pending rows + drafts + prompt chunks), unless the pending rows alone exceed it.
    pub max_rows: usize,
    /// Streams admitted at once (prefilling or decoding).
    pub max_running: usize,
    /// Streams allowed to wait for admission (preempted streams not counted).
    pub max_waiting: usize,
    /// Rows drafts leave for prompt chunks while any prompt needs filling.
    pub min_prefill_rows: usize,
    /// Aging of the prompt order: a queued stream's remaining prompt counts this many tokens less per round
    /// since it was enqueued (0: pure shortest-remaining-first, which can starve a long prompt).
    pub aging_tokens_per_round: usize,
    /// An admission (fresh or resumed) is not preempted within this many rounds (anti-thrash).
    pub min_resident_rounds: u64,
}

impl SchedConfig {
    /// A pool of `total_blocks` blocks of `block_size` slots with the default limits.
    pub fn new(block_size: usize, total_blocks: usize) -> SchedConfig {
        SchedConfig {
            block_size,
            total_blocks,
            max_rows: DEFAULT_MAX_ROWS,
            max_running: DEFAULT_MAX_RUNNING,
            max_waiting: DEFAULT_MAX_WAITING,
            min_prefill_rows: DEFAULT_MIN_PREFILL_ROWS,
            aging_tokens_per_round: DEFAULT_AGING_TOKENS_PER_ROUND,
            min_resident_rounds: DEFAULT_MIN_RESIDENT_ROUNDS,
        }
    }
}

/// A new stream, as the engine enqueues it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    /// The engine's id for it.
    pub id: StreamId,
    /// Interactive streams go first and are never preempted.
    pub priority: Priority,
    /// Prompt tokens (at least 1).
    pub prompt_len: usize,
    /// KV slots it may ever need: prompt + max_tokens (reserved in full at admission).
    pub max_total: usize,
    /// Prompt tokens the prefix cache holds now (see [`Scheduler::set_cached`]).
    pub cached: usize,
    /// Drafts it would like per decode round (see [`Scheduler::set_want_drafts`]).
    pub want_drafts: usize,
}

/// Where a stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not admitted yet; holds no blocks.
    Waiting,
    /// Admitted, blocks reserved; positions `0..filled` of its [`Stream::target`] tokens have KV.
    Prefilling {
        /// Positions with KV (cached prefix included).
        filled: usize,
    },
    /// Its prompt is filled; each round it runs its pending token plus drafts.
    Decoding,
    /// Was running, its KV was released; waits to be admitted again and refill `prompt + generated` tokens.
    Preempted,
}

/// What the scheduler knows of one stream (read-only for the engine).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    /// The engine's id.
    pub id: StreamId,
    /// Scheduling class.
    pub priority: Priority,
    /// Arrival order (unique, increasing).
    pub seq: u64,
    /// The round counter when it was enqueued (its aging starts there; never reset, not even by preemption).
    pub enqueued_round: u64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// KV slots reserved at admission: prompt + max_tokens.
    pub max_total: usize,
    /// Tokens sent to the client so far (each was fed back or is the pending token).
    pub generated: usize,
    /// Leading tokens of its sequence the prefix cache holds (used at admission).
    pub cached: usize,
    /// Drafts it would like per decode round.
    pub want_drafts: usize,
    /// Its state.
    pub phase: Phase,
    /// Blocks reserved for it (0 unless prefilling or decoding).
    pub reserved_blocks: usize,
    /// The round of its last admission.
    pub admitted_round: u64,
    /// Set by [`Scheduler::cancel`]; removed at the next plan.
    pub cancelled: bool,
    /// Times it was preempted.
    pub preemptions: u32,
}

impl Stream {
    /// Tokens a prefill fills: the prompt, or after a preemption the prompt plus the tokens already generated
    /// (`resume_len`; the client is not sent them again, they are fed as a prompt).
    pub fn target(&self) -> usize {
        self.prompt_len + self.generated
    }

    /// Whether it is admitted (holds blocks).
    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Prefilling { .. } | Phase::Decoding)
    }

    /// Whether it waits for admission (fresh or preempted).
    pub fn is_queued(&self) -> bool {
        matches!(self.phase, Phase::Waiting | Phase::Preempted)
    }
}

/// Why the scheduler refused a call. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedError {
    /// The stream needs more KV than the whole pool holds: no amount of waiting helps.
    TooLarge {
        /// KV slots it needs.
        tokens: usize,
        /// Slots in the whole pool.
        capacity_tokens: usize,
    },
    /// `max_waiting` streams wait already (HTTP 429).
    QueueFull {
        /// The bound.
        max_waiting: usize,
    },
    /// A malformed stream: empty prompt, `max_total` below the prompt, or an id already in use.
    Invalid(&'static str),
    /// No stream has this id.
    Unknown(StreamId),
    /// The call does not apply to the stream in its current phase.
    WrongPhase(StreamId, Phase),
}

impl std::fmt::Display for SchedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchedError::TooLarge { tokens, capacity_tokens } => write!(
                f,
                "the request needs KV for {tokens} tokens but the KV pool holds only {capacity_tokens} \
                 (raise the pool size or lower the prompt + max_tokens)"
            ),
            SchedError::QueueFull { max_waiting } => {
                write!(f, "the server is busy: {max_waiting} requests are already waiting; retry later")
            }
            SchedError::Invalid(why) => write!(f, "invalid stream: {why}"),
            SchedError::Unknown(id) => write!(f, "no stream {}", id.0),
            SchedError::WrongPhase(id, phase) => write!(f, "stream {} is {phase:?}", id.0),
        }
    }
}

impl std::error::Error for SchedError {}

/// A decode window granted for one round: the pending token plus `drafts` draft rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeWindow {
    /// The stream.
    pub id: StreamId,
    /// Draft rows after the pending row (the window has `1 + drafts` rows).
    pub drafts: usize,
}

/// A prompt chunk granted for one round: positions `start..start + len` of the stream's sequence
/// (prompt, then generated tokens when it resumes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChunk {
    /// The stream.
    pub id: StreamId,
    /// First position fed (positions before it have KV, from earlier chunks or the prefix cache).
    pub start: usize,
    /// Rows fed (at least 1).
    pub len: usize,
}

/// One round's decisions. Apply in this order: drop `finished_cancelled` and release `preempted` (their
/// blocks return to the pool), then reserve the blocks of `admitted`, then run the rows of `decode` and
/// `prefill` in one forward.
///
/// Invariants: a stream appears at most once in `decode` ∪ `prefill`, `admitted` ⊆ `prefill`, and
/// `preempted` and `finished_cancelled` are disjoint from each other and from the rest;
/// [`RoundPlan::rows`] ≤ max(`max_rows`, `decode.len()`); reserved blocks never exceed the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundPlan {
    /// Every decoding stream's window, interactive first, then by arrival.
    pub decode: Vec<DecodeWindow>,
    /// Prompt chunks in the order they were chosen.
    pub prefill: Vec<PrefillChunk>,
    /// Streams admitted this round (fresh or resumed): reserve [`Stream::reserved_blocks`] for each, adopting
    /// its [`Stream::cached`] prefix from the prefix cache before evicting anything.
    pub admitted: Vec<StreamId>,
    /// Background streams preempted this round: release their KV (their tokens stay with the engine).
    pub preempted: Vec<StreamId>,
    /// Streams cancelled and now forgotten: release their KV and end them.
    pub finished_cancelled: Vec<StreamId>,
}

impl RoundPlan {
    /// Rows of the forward: each window's `1 + drafts` plus every chunk's length.
    pub fn rows(&self) -> usize {
        self.decode.iter().map(|d| 1 + d.drafts).sum::<usize>() + self.prefill.iter().map(|p| p.len).sum::<usize>()
    }

    /// Whether there is nothing to run (releases may still be listed).
    pub fn is_idle(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }
}

/// The scheduling policy's state: every stream from enqueue to finish.
#[derive(Clone, Debug)]
pub struct Scheduler {
    /// The constants (zero sizes raised to 1).
    cfg: SchedConfig,
    /// Known streams in arrival order.
    streams: Vec<Stream>,
    /// Next arrival number.
    next_seq: u64,
    /// Rounds planned so far.
    round: u64,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(mut cfg: SchedConfig) -> Scheduler {
        cfg.block_size = cfg.block_size.max(1);
        cfg.max_rows = cfg.max_rows.max(1);
        cfg.max_running = cfg.max_running.max(1);
        Scheduler { cfg, streams: Vec::new(), next_seq: 0, round: 0 }
    }

    /// The constants in use.
    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Blocks holding `tokens` slots.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.block_size)
    }

    /// Queues a new stream. Refuses a stream that can never fit the pool ([`SchedError::TooLarge`]), a full
    /// queue ([`SchedError::QueueFull`]) and malformed specs; a stream that fits the pool but not the blocks
    /// free now is queued (it waits).
    pub fn try_enqueue(&mut self, spec: StreamSpec) -> Result<(), SchedError> {
        if spec.prompt_len == 0 {
            return Err(SchedError::Invalid("empty prompt"));
        }
        if spec.max_total < spec.prompt_len {
            return Err(SchedError::Invalid("max_total is below the prompt length"));
        }
        if self.index(spec.id).is_some() {
            return Err(SchedError::Invalid("the id is already in use"));
        }
        if self.blocks_for(spec.max_total) > self.cfg.total_blocks {
            let capacity_tokens = self.cfg.total_blocks.saturating_mul(self.cfg.block_size);
            return Err(SchedError::TooLarge { tokens: spec.max_total, capacity_tokens });
        }
        if self.waiting_count() >= self.cfg.max_waiting {
            return Err(SchedError::QueueFull { max_waiting: self.cfg.max_waiting });
        }
        self.streams.push(Stream {
            id: spec.id,
            priority: spec.priority,
            seq: self.next_seq,
            enqueued_round: self.round,
            prompt_len: spec.prompt_len,
            max_total: spec.max_total,
            generated: 0,
            cached: spec.cached,
            want_drafts: spec.want_drafts,
            phase: Phase::Waiting,
            reserved_blocks: 0,
            admitted_round: 0,
            cancelled: false,
            preemptions: 0,
        });
        self.next_seq += 1;
        Ok(())
    }

    /// Marks a stream cancelled; the next [`Scheduler::plan`] forgets it and lists it in `finished_cancelled`
    /// (its blocks are released then). Cancelling twice is harmless.
    pub fn cancel(&mut self, id: StreamId) -> Result<(), SchedError> {
        self.get_mut(id)?.cancelled = true;
        Ok(())
    }

    /// Updates the prefix-cache hit of a queued stream (tokens of its sequence the cache holds now). Call it
    /// before [`Scheduler::plan`]; at admission the chunk starts there (capped to leave one token to feed).
    pub fn set_cached(&mut self, id: StreamId, cached: usize) -> Result<(), SchedError> {
        let s = self.get_mut(id)?;
        if !s.is_queued() {
            return Err(SchedError::WrongPhase(id, s.phase));
        }
        s.cached = cached;
        Ok(())
    }

    /// Sets how many drafts a stream would like per decode round (its proposer's offer; 0 = no drafting).
    pub fn set_want_drafts(&mut self, id: StreamId, want: usize) -> Result<(), SchedError> {
        self.get_mut(id)?.want_drafts = want;
        Ok(())
    }

    /// Sets where a just-admitted stream's fill stands (the engine adopted `filled` positions from the prefix
    /// cache, which may differ from the hint the plan used). Returns the new phase.
    pub fn set_filled(&mut self, id: StreamId, filled: usize) -> Result<Phase, SchedError> {
        let s = self.get_mut(id)?;
        let Phase::Prefilling { .. } = s.phase else {
            return Err(SchedError::WrongPhase(id, s.phase));
        };
        let filled = filled.min(s.target());
        s.phase = if filled == s.target() { Phase::Decoding } else { Phase::Prefilling { filled } };
        Ok(s.phase)
    }

    /// Undoes an admission the engine could not carry out (its blocks could not be taken after all): the
    /// stream queues again as it was (a resumed stream stays preempted) and its reservation is dropped.
    pub fn unadmit(&mut self, id: StreamId) -> Result<(), SchedError> {
        let s = self.get_mut(id)?;
        let Phase::Prefilling { .. } = s.phase else {
            return Err(SchedError::WrongPhase(id, s.phase));
        };
        s.phase = if s.preemptions > 0 { Phase::Preempted } else { Phase::Waiting };
        s.reserved_blocks = 0;
        Ok(())
    }

    /// Reports `n` prompt rows filled for a prefilling stream; returns its new phase (`Decoding` once its
    /// whole [`Stream::target`] has KV: the last row's logits give its next token, report it with
    /// [`Scheduler::on_decoded`]).
    pub fn on_prefilled(&mut self, id: StreamId, n: usize) -> Result<Phase, SchedError> {
        let s = self.get_mut(id)?;
        let Phase::Prefilling { filled } = s.phase else {
            return Err(SchedError::WrongPhase(id, s.phase));
        };
        let filled = filled.saturating_add(n).min(s.target());
        s.phase = if filled == s.target() { Phase::Decoding } else { Phase::Prefilling { filled } };
        Ok(s.phase)
    }

    /// Reports `emitted` new tokens sent to the client by a decoding stream.
    pub fn on_decoded(&mut self, id: StreamId, emitted: usize) -> Result<(), SchedError> {
        let s = self.get_mut(id)?;
        if s.phase != Phase::Decoding {
            return Err(SchedError::WrongPhase(id, s.phase));
        }
        s.generated = s.generated.saturating_add(emitted);
        Ok(())
    }

    /// Forgets a stream that ended (stop, length, error) in any phase; returns the blocks it held, which the
    /// engine releases.
    pub fn on_finished(&mut self, id: StreamId) -> Result<usize, SchedError> {
        let i = self.index(id).ok_or(SchedError::Unknown(id))?;
        Ok(self.streams.remove(i).reserved_blocks)
    }

    /// One stream's state.
    pub fn stream(&self, id: StreamId) -> Option<&Stream> {
        self.streams.iter().find(|s| s.id == id)
    }

    /// Every stream, in arrival order.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// Streams counted against `max_waiting`: fresh, not cancelled, not admitted.
    pub fn waiting_count(&self) -> usize {
        self.streams.iter().filter(|s| s.phase == Phase::Waiting && !s.cancelled).count()
    }

    /// Streams admitted (prefilling or decoding).
    pub fn running_count(&self) -> usize {
        self.streams.iter().filter(|s| s.is_running()).count()
    }

    /// Blocks reserved by admitted streams.
    pub fn reserved_blocks(&self) -> usize {
        self.streams.iter().map(|s| s.reserved_blocks).sum()
    }

    /// Rounds planned so far.
    pub fn round(&self) -> u64 {
        self.round
    }

    fn index(&self, id: StreamId) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    fn get_mut(&mut self, id: StreamId) -> Result<&mut Stream, SchedError> {
        self.streams.iter_mut().find(|s| s.id == id).ok_or(SchedError::Unknown(id))
    }
}
