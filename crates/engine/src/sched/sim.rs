//! A fake engine for the policy's tests: a pool of block counts (no KV bytes), streams that accept every
//! draft, and a check of the plan invariants every round.

use super::{Phase, Priority, RoundPlan, SchedConfig, SchedError, Scheduler, StreamId, StreamSpec};
use std::collections::{BTreeMap, BTreeSet};

/// The fake engine.
pub(super) struct Sim {
    /// The policy under test.
    pub sched: Scheduler,
    /// Free blocks of the fake pool.
    pub free: usize,
    /// Blocks held per admitted stream.
    pub held: BTreeMap<StreamId, usize>,
    /// `max_tokens` per live stream.
    pub max_tokens: BTreeMap<StreamId, usize>,
    /// Round of each stream's first token.
    pub first_token: BTreeMap<StreamId, u64>,
    /// Round each stream finished (all its tokens out).
    pub done: BTreeMap<StreamId, u64>,
    /// Rows of every round so far.
    pub rows: Vec<usize>,
}

impl Sim {
    /// An empty engine around a fresh scheduler.
    pub fn new(cfg: SchedConfig) -> Sim {
        Sim {
            free: cfg.total_blocks,
            sched: Scheduler::new(cfg),
            held: BTreeMap::new(),
            max_tokens: BTreeMap::new(),
            first_token: BTreeMap::new(),
            done: BTreeMap::new(),
            rows: Vec::new(),
        }
    }

    /// Submits a stream of `prompt` tokens that generates `max_tokens` tokens, drafting up to `drafts`.
    pub fn submit(
        &mut self,
        id: u64,
        priority: Priority,
        prompt: usize,
        max_tokens: usize,
        drafts: usize,
    ) -> Result<(), SchedError> {
        let spec = StreamSpec {
            id: StreamId(id),
            priority,
            prompt_len: prompt,
            max_total: prompt + max_tokens,
            cached: 0,
            want_drafts: drafts,
        };
        self.sched.try_enqueue(spec)?;
        self.max_tokens.insert(StreamId(id), max_tokens);
        Ok(())
    }

    /// Plans one round, checks it, and plays it as an engine would.
    pub fn step(&mut self) -> RoundPlan {
        let plan = self.sched.plan(self.free);
        self.check(&plan);
        for id in plan.finished_cancelled.iter().chain(&plan.preempted) {
            self.free += self.held.remove(id).unwrap_or(0);
        }
        for id in &plan.admitted {
            let n = self.sched.stream(*id).expect("admitted stream").reserved_blocks;
            assert!(n <= self.free, "round {}: {id:?} needs {n} blocks, {} free", self.sched.round(), self.free);
            self.free -= n;
            self.held.insert(*id, n);
        }
        for c in &plan.prefill {
            if self.sched.on_prefilled(c.id, c.len).expect("prefilling") == Phase::Decoding {
                self.emit(c.id, 1);
            }
        }
        for w in &plan.decode {
            self.emit(w.id, 1 + w.drafts);
        }
        assert_eq!(self.free + self.held.values().sum::<usize>(), self.sched.config().total_blocks);
        assert_eq!(self.held.values().sum::<usize>(), self.sched.reserved_blocks());
        self.rows.push(plan.rows());
        plan
    }

    /// Steps until no stream is left (at most `max_rounds`); returns the rounds taken.
    pub fn drain(&mut self, max_rounds: usize) -> usize {
        for n in 0..max_rounds {
            if self.sched.streams().is_empty() {
                return n;
            }
            self.step();
        }
        panic!("streams left after {max_rounds} rounds: {:?}", self.sched.streams());
    }

    /// Steps until `id` is decoding (at most 100 rounds).
    pub fn until_decoding(&mut self, id: u64) {
        for _ in 0..100 {
            if self.sched.stream(StreamId(id)).is_some_and(|s| s.phase == Phase::Decoding) {
                return;
            }
            self.step();
        }
        panic!("stream {id} never decodes");
    }

    /// The engine sends `n` tokens (capped at max_tokens) and finishes the stream at its last one.
    fn emit(&mut self, id: StreamId, n: usize) {
        let max = self.max_tokens[&id];
        let generated = self.sched.stream(id).expect("live stream").generated;
        let n = n.min(max - generated);
        self.sched.on_decoded(id, n).expect("decoding");
        self.first_token.entry(id).or_insert(self.sched.round());
        if generated + n == max {
            let blocks = self.sched.on_finished(id).expect("live stream");
            assert_eq!(Some(blocks), self.held.remove(&id), "released what it held");
            self.free += blocks;
            self.max_tokens.remove(&id);
            self.done.insert(id, self.sched.round());
        }
    }

    /// The plan's invariants (see [`RoundPlan`]).
    fn check(&self, plan: &RoundPlan) {
        let cfg = self.sched.config();
        assert!(plan.rows() <= cfg.max_rows.max(plan.decode.len()), "rows {} over budget: {plan:?}", plan.rows());
        let mut seen = BTreeSet::new();
        for id in plan.decode.iter().map(|d| d.id).chain(plan.prefill.iter().map(|p| p.id)) {
            assert!(seen.insert(id), "{id:?} twice in {plan:?}");
        }
        for id in &plan.admitted {
            assert!(plan.prefill.iter().any(|p| p.id == *id), "admitted without a chunk: {plan:?}");
        }
        for id in plan.preempted.iter().chain(&plan.finished_cancelled) {
            assert!(seen.insert(*id), "{id:?} released and scheduled in {plan:?}");
        }
        for p in &plan.prefill {
            let s = self.sched.stream(p.id).expect("live stream");
            assert!(p.len > 0 && p.start + p.len <= s.target(), "{p:?} outside {s:?}");
            assert_eq!(s.phase, Phase::Prefilling { filled: p.start });
        }
        for id in &plan.preempted {
            let s = self.sched.stream(*id).expect("preempted stream");
            assert_eq!((s.priority, s.phase, s.reserved_blocks), (Priority::Background, Phase::Preempted, 0));
        }
        assert!(self.sched.reserved_blocks() <= cfg.total_blocks);
        assert!(self.sched.running_count() <= cfg.max_running);
    }
}

/// A small deterministic generator (xorshift64*) for the random load.
pub(super) struct Rng(pub u64);

impl Rng {
    /// A value in `0..n` (n ≥ 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}
