//! [`Scheduler::plan`]: one round's rows, admissions and preemptions.

use super::{DecodeWindow, Phase, PrefillChunk, Priority, RoundPlan, Scheduler, Stream};

/// Blocks this round may still reserve. Two counts, the smaller wins: the engine's (free plus evictable cached
/// blocks, plus what this plan releases) and the scheduler's own books (pool minus reservations). The books
/// alone are safe when every block a stream holds is within its reservation; the engine's count also covers
/// blocks held outside any stream.
struct Blocks {
    /// The engine's free blocks plus blocks released by this plan.
    engine: usize,
    /// `total_blocks` minus the blocks still reserved.
    book: usize,
}

impl Blocks {
    fn avail(&self) -> usize {
        self.engine.min(self.book)
    }

    fn take(&mut self, n: usize) {
        self.engine = self.engine.saturating_sub(n);
        self.book = self.book.saturating_sub(n);
    }

    fn give(&mut self, n: usize) {
        self.engine = self.engine.saturating_add(n);
        self.book = self.book.saturating_add(n);
    }
}

/// 0 for interactive, 1 for background: sorts interactive first.
fn class(p: Priority) -> u8 {
    match p {
        Priority::Interactive => 0,
        Priority::Background => 1,
    }
}

/// Splits `budget` rows among `wants`, max-min fair: every stream gets `min(want, L)` for the largest level
/// `L` that fits, and the rows left over (fewer than the streams still short) go one each to the earliest
/// entries still short. Everyone gets their full want when the wants fit.
pub(super) fn water_fill(wants: &[usize], budget: usize) -> Vec<usize> {
    let fill = |level: usize| wants.iter().fold(0usize, |acc, &w| acc.saturating_add(w.min(level)));
    let max_want = wants.iter().copied().max().unwrap_or(0);
    if fill(max_want) <= budget {
        return wants.to_vec();
    }
    // fill(lo) <= budget < fill(hi).
    let (mut lo, mut hi) = (0, max_want);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fill(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let mut left = budget - fill(lo);
    let mut grant: Vec<usize> = wants.iter().map(|&w| w.min(lo)).collect();
    for (g, &w) in grant.iter_mut().zip(wants) {
        if left == 0 {
            break;
        }
        if w > lo {
            *g += 1;
            left -= 1;
        }
    }
    grant
}

impl Scheduler {
    /// Plans the next round, given the blocks the engine has free now (free plus evictable prefix-cache
    /// blocks, before this plan's releases). The rules, in order:
    ///
    /// 1. **Cancellation.** Cancelled streams are forgotten first (`finished_cancelled`); their blocks count as
    ///    free for the rest of the plan.
    /// 2. **Rows.** The budget is `max_rows`, raised to the number of decoding streams when that is larger (a
    ///    pending row is never refused; then nothing else runs). That only happens when `max_rows` is lowered
    ///    under running streams: a prompt completes only within the budget, so the pending rows reach at most
    ///    `max_rows` otherwise. Every decoding stream gets its pending row.
    ///    Drafts get the rows left, except `min_prefill_rows` kept for prompt chunks while any prompt needs
    ///    filling, and except that background drafts come after interactive prompts; prompt chunks then get
    ///    whatever drafts did not take, and drafts whatever chunks left.
    /// 3. **Draft split.** A stream's want is its `want_drafts`, capped so its window cannot pass its
    ///    `max_total` (no more than `max_total - target - 1` drafts). When the wants do not fit, interactive
    ///    streams split the draft rows max-min fair (everyone gets `min(want, L)` for the largest level `L`
    ///    that fits, leftover rows one each to the earliest arrivals still short); background streams split
    ///    what interactive ones left the same way.
    /// 4. **Prompt order.** Prefilling and queued streams are ordered interactive first, then by aged
    ///    remaining prompt `remaining − aging · rounds_queued` (shortest first; written as `remaining + aging ·
    ///    enqueued_round`, which orders the same), then by arrival. Each in turn gets a chunk of
    ///    `min(remaining, rows left)`; a queued stream must be admitted first.
    /// 5. **Admission.** A queued stream is admitted when its `blocks_for(max_total)` blocks fit the free blocks
    ///    now and fewer than `max_running` streams run: all its blocks are reserved up front (never
    ///    over-committed) and its chunk starts after its cached prefix (at most `target − 1`). Otherwise it
    ///    waits, and a later, smaller stream may go first, unless the blocked stream is **due** (its aging
    ///    credit covers its remaining prompt): then no later stream is admitted this round, so blocks drain
    ///    towards it. With aging ≥ 1 a stream is due after `remaining / aging` rounds, after which only streams
    ///    ordered before it (finitely many) can be admitted first: no starvation.
    /// 6. **Preemption.** An interactive stream that does not fit may preempt running background streams,
    ///    latest arrival first, skipping any admitted within the last `min_resident_rounds` rounds (no
    ///    thrash), and only if that makes it fit. A preempted stream releases its blocks, forgets its prompt
    ///    progress and cached hint, and queues again (not counted against `max_waiting`) to refill
    ///    `prompt + generated` tokens. Interactive streams are never preempted; background ones never
    ///    preempt.
    pub fn plan(&mut self, free_blocks: usize) -> RoundPlan {
        self.round += 1;
        let mut plan = RoundPlan::default();
        let mut released = 0usize;
        self.streams.retain(|s| {
            if s.cancelled {
                plan.finished_cancelled.push(s.id);
                released = released.saturating_add(s.reserved_blocks);
            }
            !s.cancelled
        });
        let book = self.cfg.total_blocks.saturating_sub(self.reserved_blocks());
        let mut blocks = Blocks { engine: free_blocks.saturating_add(released), book };

        let pending = self.streams.iter().filter(|s| s.phase == Phase::Decoding).count();
        let budget = self.cfg.max_rows.max(pending);
        let spare = budget - pending;
        let order = self.prompt_order();
        let floor = if order.is_empty() { 0 } else { self.cfg.min_prefill_rows.min(spare) };
        // Background drafts yield to interactive prompts (`order` puts interactive streams first).
        let interactive_prompt = order.first().is_some_and(|&i| self.streams[i].priority == Priority::Interactive);
        let wanted = self
            .streams
            .iter()
            .filter(|s| s.phase == Phase::Decoding && (s.priority == Priority::Interactive || !interactive_prompt))
            .fold(0usize, |acc, s| acc.saturating_add(draft_want(s)));
        let draft_cap = wanted.min(spare - floor);
        let used = self.fill_prompts(&order, spare - draft_cap, &mut blocks, &mut plan);

        // Decode windows (streams preempted above are no longer decoding).
        let mut decoding: Vec<usize> =
            (0..self.streams.len()).filter(|&i| self.streams[i].phase == Phase::Decoding).collect();
        decoding.sort_by_key(|&i| (class(self.streams[i].priority), self.streams[i].seq));
        let mut draft_rows = budget.saturating_sub(decoding.len()).saturating_sub(used);
        let split = decoding.partition_point(|&i| self.streams[i].priority == Priority::Interactive);
        for group in [&decoding[..split], &decoding[split..]] {
            let wants: Vec<usize> = group.iter().map(|&i| draft_want(&self.streams[i])).collect();
            let grants = water_fill(&wants, draft_rows);
            for (&i, drafts) in group.iter().zip(grants) {
                draft_rows -= drafts;
                plan.decode.push(DecodeWindow { id: self.streams[i].id, drafts });
            }
        }
        plan
    }

    /// Indices of streams that need prompt rows, in the order of rule 4.
    fn prompt_order(&self) -> Vec<usize> {
        let aging = self.cfg.aging_tokens_per_round as u128;
        let mut order: Vec<usize> =
            (0..self.streams.len()).filter(|&i| self.streams[i].phase != Phase::Decoding).collect();
        order.sort_by_key(|&i| {
            let s = &self.streams[i];
            (class(s.priority), remaining(s) as u128 + aging * u128::from(s.enqueued_round), s.seq)
        });
        order
    }

    /// Whether a queued stream's aging credit covers its remaining prompt (rule 5).
    fn is_due(&self, s: &Stream) -> bool {
        let aging = self.cfg.aging_tokens_per_round as u128;
        aging > 0 && remaining(s) as u128 <= aging * u128::from(self.round - s.enqueued_round)
    }

    /// Rules 4–6 with `limit` rows; returns the rows used.
    fn fill_prompts(&mut self, order: &[usize], limit: usize, blocks: &mut Blocks, plan: &mut RoundPlan) -> usize {
        let mut rows = limit;
        let mut admitting = true;
        let mut running = self.running_count();
        for &i in order {
            if rows == 0 {
                break;
            }
            let s = &self.streams[i];
            let start = match s.phase {
                Phase::Prefilling { filled } => filled,
                Phase::Waiting | Phase::Preempted if admitting && !plan.preempted.contains(&s.id) => {
                    let need = self.blocks_for(s.max_total);
                    let mut fits = need <= blocks.avail() && running < self.cfg.max_running;
                    if !fits && s.priority == Priority::Interactive {
                        fits = self.preempt_for(need, &mut running, blocks, plan);
                    }
                    if !fits {
                        admitting = !self.is_due(&self.streams[i]);
                        continue;
                    }
                    let s = &mut self.streams[i];
                    let start = s.cached.min(s.target() - 1);
                    s.phase = Phase::Prefilling { filled: start };
                    s.reserved_blocks = need;
                    s.admitted_round = self.round;
                    blocks.take(need);
                    running += 1;
                    plan.admitted.push(s.id);
                    start
                }
                _ => continue,
            };
            let s = &self.streams[i];
            let len = s.target().saturating_sub(start).min(rows);
            if len > 0 {
                plan.prefill.push(PrefillChunk { id: s.id, start, len });
                rows -= len;
            }
        }
        limit - rows
    }

    /// Preempts running background streams, latest arrival first, until `need` blocks and a running slot are
    /// free; preempts nothing and returns false when even all eligible ones would not do.
    fn preempt_for(&mut self, need: usize, running: &mut usize, blocks: &mut Blocks, plan: &mut RoundPlan) -> bool {
        let round = self.round;
        let resident = self.cfg.min_resident_rounds;
        let mut victims: Vec<usize> = (0..self.streams.len())
            .filter(|&i| {
                let s = &self.streams[i];
                s.is_running()
                    && s.priority == Priority::Background
                    && s.admitted_round < round
                    && round - s.admitted_round >= resident
            })
            .collect();
        victims.sort_by_key(|&i| std::cmp::Reverse(self.streams[i].seq));
        let fits =
            |gain: usize, n: usize| need <= blocks.avail().saturating_add(gain) && *running - n < self.cfg.max_running;
        let (mut gain, mut n) = (0usize, 0usize);
        while !fits(gain, n) && n < victims.len() {
            gain = gain.saturating_add(self.streams[victims[n]].reserved_blocks);
            n += 1;
        }
        if !fits(gain, n) {
            return false;
        }
        for &v in &victims[..n] {
            let s = &mut self.streams[v];
            blocks.give(s.reserved_blocks);
            s.reserved_blocks = 0;
            s.phase = Phase::Preempted;
            s.cached = 0;
            s.preemptions += 1;
            plan.preempted.push(s.id);
        }
        *running -= n;
        true
    }
}

/// Prompt tokens a stream still needs filled (0 when decoding).
fn remaining(s: &Stream) -> usize {
    match s.phase {
        Phase::Prefilling { filled } => s.target().saturating_sub(filled),
        Phase::Waiting | Phase::Preempted => s.target() - s.cached.min(s.target().saturating_sub(1)),
        Phase::Decoding => 0,
    }
}

/// Drafts a decoding stream may use this round: its want, capped so the window's tokens stay within
/// `max_total` (a window of `1 + d` rows yields at most `1 + d` tokens). The last token's window still gets one
/// draft when the stream wants any, so a stream that drafts verifies a draft every round (its `min_rows` ≥ 2);
/// that draft's slot, `max_total − 1`, is reserved.
fn draft_want(s: &Stream) -> usize {
    let left = s.max_total.saturating_sub(s.target());
    s.want_drafts.min(left.saturating_sub(1).max(left.min(1)))
}
