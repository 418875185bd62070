//! The engine loop (DESIGN.md §5), the one path every request takes. [`Core`] keeps the [`Scheduler`] and the
//! admitted [`Sequence`]s; each [`Core::step`] asks the scheduler what to run (each decoding sequence's window
//! with its share of the draft rows, prompt chunks shortest-remaining-first with aging, admissions that never
//! over-commit the KV pool, preemption of background sequences for interactive ones), carries it out on the
//! [`Generator`] as one forward ([`Generator::run_round`]) and reports back what happened. A preempted sequence
//! keeps its tokens (the client already has them): its written blocks go to the prefix cache and it refills
//! `prompt ++ tokens` when it is admitted again.
//!
//! The engine thread (`handle.rs`) drives a `Core` from its command channel; [`Generator::generate`] and
//! [`Generator::generate_many`] drive one on the caller's thread until their requests end. `--parallel 1` is this
//! loop with one running sequence.

use crate::generate::{EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, TokenEvent};
use crate::handle::{micros, EngineEvent, EngineStats, Priority};
use crate::kv_pool::PoolError;
use crate::round::Grant;
use crate::sched::{Phase, SchedConfig, SchedError, Scheduler, StreamId, StreamSpec, DEFAULT_MAX_ROWS};
use crate::seq::{OnToken, Sequence};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where a request's events go, on the engine's thread.
pub(crate) type Sink<'s> = Box<dyn FnMut(EngineEvent) -> Flow + 's>;

/// A request handed to the loop.
pub(crate) struct Entry<'s> {
    pub(crate) id: u64,
    pub(crate) req: GenRequest,
    pub(crate) priority: Priority,
    pub(crate) sink: Sink<'s>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) queued_at: Instant,
}

/// The loop's state between rounds.
pub(crate) struct Core<'s> {
    sched: Scheduler,
    /// Queued in the scheduler, not admitted yet, by id.
    waiting: HashMap<u64, Entry<'s>>,
    /// Admitted sequences (running or preempted), with their ids and sinks, index-aligned.
    seqs: Vec<Sequence<'s>>,
    actives: Vec<(u64, Rc<RefCell<Sink<'s>>>)>,
    stats: &'s EngineStats,
    /// Called with the id of every request that ended (the handle's list of live cancel flags).
    forget: &'s dyn Fn(u64),
}

impl<'s> Core<'s> {
    /// A loop over `g`'s pool with at most `max_running` admitted sequences and `max_rows` rows per round.
    pub(crate) fn new(
        g: &Generator<'_>,
        stats: &'s EngineStats,
        forget: &'s dyn Fn(u64),
        max_running: usize,
        max_rows: usize,
    ) -> Core<'s> {
        let cfg = SchedConfig {
            max_rows,
            max_running: max_running.max(1),
            // The handle bounds the waiting requests (429) before they reach the loop.
            max_waiting: usize::MAX,
            ..SchedConfig::new(g.pool().block_size(), g.pool().total_blocks())
        };
        Core {
            sched: Scheduler::new(cfg),
            waiting: HashMap::new(),
            seqs: Vec::new(),
            actives: Vec::new(),
            stats,
            forget,
        }
    }

    /// Whether nothing is queued or running.
    pub(crate) fn is_idle(&self) -> bool {
        self.sched.streams().is_empty()
    }

    fn index(&self, id: u64) -> Option<usize> {
        self.actives.iter().position(|a| a.0 == id)
    }

    /// Validates a new request and queues it in the scheduler. A request that can never run (invalid, longer
    /// than the context, more KV than the pool) gets its error at once; one that only has to wait queues.
    pub(crate) fn submit(&mut self, g: &Generator<'_>, mut e: Entry<'s>) {
        let refused = match g.admit(&e.req) {
            Ok(_) | Err(EngineError::Pool(PoolError::Exhausted { .. })) => {
                let spec = StreamSpec {
                    id: StreamId(e.id),
                    priority: e.priority,
                    prompt_len: e.req.prompt.len(),
                    max_total: e.req.prompt.len() + e.req.max_tokens,
                    cached: 0,
                    want_drafts: 0,
                };
                match self.sched.try_enqueue(spec) {
                    Ok(()) => None,
                    Err(SchedError::TooLarge { tokens, capacity_tokens }) => {
                        Some(PoolError::TooLarge { tokens, capacity_tokens }.into())
                    }
                    Err(err) => Some(EngineError::InvalidRequest(err.to_string())),
                }
            }
            Err(err) => Some(err),
        };
        match refused {
            None => {
                self.waiting.insert(e.id, e);
            }
            Some(err) => {
                self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                self.stats.finished_error.fetch_add(1, Ordering::Relaxed);
                let _ = (e.sink)(EngineEvent::Error(err));
                (self.forget)(e.id);
            }
        }
    }

    /// One turn of the loop: cancels, one planned round, and the replies that ended.
    pub(crate) fn step(&mut self, g: &mut Generator<'_>) {
        for (&id, e) in &self.waiting {
            if e.cancel.load(Ordering::Relaxed) {
                let _ = self.sched.cancel(StreamId(id));
            }
        }
        for s in self.seqs.iter_mut() {
            s.cancel_if_flagged();
        }
        self.finish(g);
        let grants = self.plan(g);
        self.stats.running.store(self.sched.running_count(), Ordering::SeqCst);
        publish_kv(g, self.stats);
        if grants.is_empty() {
            if let Err(e) = g.land(&mut self.seqs) {
                self.fail_all(e);
            }
        } else {
            let before: Vec<(usize, usize)> = self.seqs.iter().map(|s| (s.filled(), s.emitted())).collect();
            match g.run_round(&mut self.seqs, &grants) {
                Err(e) => self.fail_all(e),
                Ok(_) => self.report(&grants, &before),
            }
        }
        self.finish(g);
        self.stats.running.store(self.sched.running_count(), Ordering::SeqCst);
        publish_kv(g, self.stats);
        if self.seqs.is_empty() {
            self.stats.live_decode_milli_tps.store(0, Ordering::Relaxed);
        }
    }

    /// A failed forward ends every admitted sequence with its error.
    fn fail_all(&mut self, e: EngineError) {
        for (id, sink) in self.actives.drain(..) {
            let _ = self.sched.on_finished(StreamId(id));
            self.stats.finished_error.fetch_add(1, Ordering::Relaxed);
            let _ = (sink.borrow_mut())(EngineEvent::Error(e.clone()));
            (self.forget)(id);
        }
        self.seqs.clear();
    }

    /// Tells the scheduler what the round did: positions filled, tokens emitted (also by a round that landed
    /// ahead-queued tokens of sequences it did not grant).
    fn report(&mut self, grants: &[(usize, Grant)], before: &[(usize, usize)]) {
        for &(i, grant) in grants {
            let s = &self.seqs[i];
            if matches!(grant, Grant::Fill { .. }) && s.filled() > before[i].0 {
                let fed = if s.is_filling() { s.filled() - before[i].0 } else { usize::MAX };
                let phase = self.sched.on_prefilled(StreamId(self.actives[i].0), fed);
                debug_assert!(phase.is_ok(), "{phase:?}");
            }
        }
        for (i, s) in self.seqs.iter().enumerate() {
            let emitted = s.emitted() - before[i].1;
            if emitted > 0 && !s.is_filling() {
                let r = self.sched.on_decoded(StreamId(self.actives[i].0), emitted);
                debug_assert!(r.is_ok(), "{r:?}");
            }
        }
    }

    /// Plans the next round and carries out its releases and admissions; returns the grants to run.
    fn plan(&mut self, g: &mut Generator<'_>) -> Vec<(usize, Grant)> {
        // What the policy plans with: cached prefixes of queued sequences, drafts wanted by decoding ones.
        let mut hints = Vec::new();
        for s in self.sched.streams() {
            match s.phase {
                Phase::Waiting | Phase::Preempted => {
                    let seq = match (self.waiting.get(&s.id.0), self.index(s.id.0)) {
                        (Some(e), _) if e.req.prompt_logprobs.is_none() => e.req.prompt.clone(),
                        (None, Some(i)) if self.seqs[i].req.prompt_logprobs.is_none() => self.seqs[i].sequence(),
                        _ => continue,
                    };
                    let cached = g.prefix_cache().map_or(0, |c| c.peek(&seq, seq.len() - 1));
                    hints.push((s.id, Some(cached), None));
                }
                Phase::Decoding => {
                    if let Some(i) = self.index(s.id.0) {
                        hints.push((s.id, None, Some(g.want_drafts(&self.seqs[i]))));
                    }
                }
                Phase::Prefilling { .. } => {}
            }
        }
        for (id, cached, want) in hints {
            if let Some(c) = cached {
                let _ = self.sched.set_cached(id, c);
            }
            if let Some(w) = want {
                let _ = self.sched.set_want_drafts(id, w);
            }
        }
        let free = g.pool().free_blocks() + g.prefix_cache().map_or(0, |c| c.idle_blocks(g.pool()));
        let plan = self.sched.plan(free);
        if !plan.preempted.is_empty() {
            // A preempted sequence gives its blocks back: every queued step must have landed first.
            if let Err(e) = g.land(&mut self.seqs) {
                self.fail_all(e);
            }
        }
        for id in &plan.finished_cancelled {
            if let Some(mut e) = self.waiting.remove(&id.0) {
                self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                self.stats.finished_cancelled.fetch_add(1, Ordering::Relaxed);
                let _ = (e.sink)(EngineEvent::Error(EngineError::Cancelled));
                (self.forget)(id.0);
            } else if let Some(i) = self.index(id.0) {
                self.seqs[i].cancel();
            }
        }
        for id in &plan.preempted {
            if let Some(i) = self.index(id.0) {
                g.preempt(&mut self.seqs[i]);
                self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
            }
        }
        for &id in &plan.admitted {
            self.admit(g, id);
        }
        let mut grants = Vec::new();
        for d in &plan.decode {
            if let Some(i) = self.index(d.id.0) {
                grants.push((i, Grant::Window { max_drafts: d.drafts }));
            }
        }
        for c in &plan.prefill {
            if let Some(i) = self.index(c.id.0) {
                grants.push((i, Grant::Fill { max_len: c.len }));
            }
        }
        grants
    }

    /// Carries out one admission of the plan: a fresh request becomes a sequence, a preempted one takes blocks
    /// again.
    fn admit(&mut self, g: &mut Generator<'_>, id: StreamId) {
        let result = if let Some(mut e) = self.waiting.remove(&id.0) {
            match self.start(g, &mut e) {
                Ok((seq, sink)) => {
                    self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                    self.seqs.push(seq);
                    self.actives.push((id.0, sink));
                    Ok(())
                }
                Err(err) => {
                    if matches!(err, EngineError::Pool(PoolError::Exhausted { .. })) {
                        self.waiting.insert(id.0, e);
                    } else {
                        self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
                        self.stats.finished_error.fetch_add(1, Ordering::Relaxed);
                        let _ = (e.sink)(EngineEvent::Error(err.clone()));
                        (self.forget)(id.0);
                    }
                    Err(err)
                }
            }
        } else if let Some(i) = self.index(id.0) {
            g.resume(&mut self.seqs[i])
        } else {
            return;
        };
        match result {
            Ok(()) => {
                let i = self.index(id.0).expect("admitted");
                let _ = self.sched.set_filled(id, self.seqs[i].filled());
            }
            // Blocks the plan counted on were not there after all: it waits again.
            Err(EngineError::Pool(PoolError::Exhausted { .. })) => {
                let _ = self.sched.unadmit(id);
            }
            Err(err) => {
                // A fresh request already got its error above; a resumed sequence ends with it.
                if let Some(i) = self.index(id.0) {
                    let (_, sink) = self.actives.swap_remove(i);
                    self.seqs.swap_remove(i);
                    self.stats.finished_error.fetch_add(1, Ordering::Relaxed);
                    let _ = (sink.borrow_mut())(EngineEvent::Error(err));
                    (self.forget)(id.0);
                }
                let _ = self.sched.on_finished(id);
            }
        }
    }

    /// Makes the sequence of `e`, whose token callback feeds its sink and the live counters. On refusal the
    /// entry keeps its sink (nothing was sent).
    fn start(
        &self,
        g: &mut Generator<'_>,
        e: &mut Entry<'s>,
    ) -> Result<(Sequence<'s>, Rc<RefCell<Sink<'s>>>), EngineError> {
        let queued_s = e.queued_at.elapsed().as_secs_f64();
        let sink: Rc<RefCell<Sink<'s>>> =
            Rc::new(RefCell::new(std::mem::replace(&mut e.sink, Box::new(|_| Flow::Continue))));
        let started = Instant::now();
        let first = Cell::new(None);
        let cb_sink = sink.clone();
        let stats = self.stats;
        let on_token: OnToken<'s> = Box::new(move |ev: TokenEvent| {
            match first.get() {
                None => {
                    stats.observe_ttft(started.elapsed().as_secs_f64() + queued_s);
                    first.set(Some(Instant::now()));
                }
                Some(t) => {
                    let s = t.elapsed().as_secs_f64();
                    if s > 0.0 {
                        stats.live_decode_milli_tps.store((ev.index as f64 / s * 1000.0) as u64, Ordering::Relaxed);
                    }
                }
            }
            stats.generation_tokens.fetch_add(1, Ordering::Relaxed);
            (cb_sink.borrow_mut())(EngineEvent::Token(ev))
        });
        let mut req = e.req.clone();
        req.cancel = Some(e.cancel.clone());
        match g.admit_seq(req, on_token) {
            Ok(seq) => {
                self.stats.queue_us.fetch_add(micros(queued_s), Ordering::Relaxed);
                let _ = (sink.borrow_mut())(EngineEvent::Started { queued_s });
                Ok((seq, sink))
            }
            Err(err) => {
                // The callback (and its clone of the sink) is gone with the refused sequence.
                if let Ok(cell) = Rc::try_unwrap(sink) {
                    e.sink = cell.into_inner();
                }
                Err(err)
            }
        }
    }

    /// Finished sequences leave (their blocks return first, so the counters are current when they report).
    fn finish(&mut self, g: &Generator<'_>) {
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.seqs.len() {
            if self.seqs[i].is_done() && !self.seqs[i].in_flight {
                let out = self.seqs.swap_remove(i).output();
                let (id, sink) = self.actives.swap_remove(i);
                let _ = self.sched.on_finished(StreamId(id));
                finished.push((out, id, sink));
            } else {
                i += 1;
            }
        }
        if finished.is_empty() {
            return;
        }
        self.stats.running.store(self.sched.running_count(), Ordering::SeqCst);
        publish_kv(g, self.stats);
        for (out, id, sink) in finished {
            (self.forget)(id);
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    self.stats.finished_error.fetch_add(1, Ordering::Relaxed);
                    let _ = (sink.borrow_mut())(EngineEvent::Error(e));
                    continue;
                }
            };
            let stats = self.stats;
            stats.prompt_tokens.fetch_add(out.prompt_tokens as u64, Ordering::Relaxed);
            stats.prefill_us.fetch_add(micros(out.prefill_s), Ordering::Relaxed);
            stats.decode_us.fetch_add(micros(out.decode_s), Ordering::Relaxed);
            stats.drafted_tokens.fetch_add(out.counts.drafted as u64, Ordering::Relaxed);
            stats.accepted_tokens.fetch_add(out.counts.accepted as u64, Ordering::Relaxed);
            if g.prefix_cache().is_some() {
                stats.prefix_query_tokens.fetch_add(out.prompt_tokens as u64, Ordering::Relaxed);
                stats.prefix_hit_tokens.fetch_add(out.cached_tokens as u64, Ordering::Relaxed);
            }
            let counter = match out.finish_reason {
                FinishReason::Stop => &stats.finished_stop,
                FinishReason::Length => &stats.finished_length,
                FinishReason::Cancelled => &stats.finished_cancelled,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let _ = (sink.borrow_mut())(EngineEvent::Done(out));
        }
    }
}

/// Publishes the KV counters: blocks held by requests, and blocks only the prefix cache holds.
fn publish_kv(g: &Generator<'_>, stats: &EngineStats) {
    let total = g.pool().total_blocks();
    let cached = g.prefix_cache().map_or(0, |c| c.idle_blocks(g.pool()));
    stats.kv_blocks_cached.store(cached, Ordering::Relaxed);
    stats.kv_blocks_used.store(total.saturating_sub(g.pool().free_blocks() + cached), Ordering::Relaxed);
}

impl<'a> Generator<'a> {
    /// Generates a reply to `req` on the caller's thread through the engine loop (one running sequence),
    /// calling `on_token` for every token as it is drawn.
    pub fn generate(
        &mut self,
        req: &GenRequest,
        on_token: &mut dyn FnMut(TokenEvent) -> Flow,
    ) -> Result<GenOutput, EngineError> {
        let cb: OnToken<'_> = Box::new(on_token);
        self.generate_many(vec![(req.clone(), cb)], DEFAULT_MAX_ROWS).pop().expect("one reply")
    }

    /// Runs every request to the end through the engine loop on the caller's thread, all of them admitted at
    /// once (as far as the pool allows) in rounds of at most `max_rows` rows; replies in request order.
    pub fn generate_many<'c>(
        &mut self,
        reqs: Vec<(GenRequest, OnToken<'c>)>,
        max_rows: usize,
    ) -> Vec<Result<GenOutput, EngineError>> {
        let n = reqs.len();
        let stats = EngineStats::default();
        let forget = |_: u64| {};
        let results: RefCell<Vec<Option<Result<GenOutput, EngineError>>>> = RefCell::new(vec![None; n]);
        {
            let mut core = Core::new(self, &stats, &forget, n, max_rows);
            for (i, (req, mut cb)) in reqs.into_iter().enumerate() {
                let results = &results;
                let sink: Sink<'_> = Box::new(move |ev| match ev {
                    EngineEvent::Token(t) => cb(t),
                    EngineEvent::Done(out) => {
                        results.borrow_mut()[i] = Some(Ok(out));
                        Flow::Continue
                    }
                    EngineEvent::Error(e) => {
                        results.borrow_mut()[i] = Some(Err(e));
                        Flow::Continue
                    }
                    EngineEvent::Started { .. } => Flow::Continue,
                });
                stats.waiting.fetch_add(1, Ordering::SeqCst);
                let cancel = req.cancel.clone().unwrap_or_default();
                let entry = Entry {
                    id: i as u64 + 1,
                    req,
                    priority: Priority::Interactive,
                    sink,
                    cancel,
                    queued_at: Instant::now(),
                };
                core.submit(self, entry);
            }
            while !core.is_idle() {
                core.step(self);
            }
        }
        results.into_inner().into_iter().map(|r| r.expect("every request answered")).collect()
    }
}
