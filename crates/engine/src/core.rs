//! The engine thread with shared rounds (`parallel > 1`), driven by the scheduling policy of [`crate::sched`]:
//! every round it asks the [`Scheduler`] what to run (each decoding stream's window with its share of the draft
//! rows, prompt chunks shortest-remaining-first with aging, admissions that never over-commit the KV pool,
//! preemption of background streams for interactive ones), carries that out on the [`Generator`] as one
//! forward ([`Generator::run_round`]) and reports back what happened. A preempted stream keeps its tokens (the
//! client already has them): its written blocks go to the prefix cache and it refills `prompt ++ tokens` when
//! it is admitted again. Requests that score their prompt (prompt logprobs) run solo when nothing else is.

use crate::generate::{EngineError, FinishReason, Flow, Generator};
use crate::handle::{drain, micros, run_job, Command, EngineEvent, EngineStats, EventSink, Job, LiveList, Queue};
use crate::kv_pool::PoolError;
use crate::rounds::{Grant, OnToken, Stream};
use crate::sched::{Phase, SchedConfig, SchedError, Scheduler, StreamId, StreamSpec};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

/// The engine-side state of an admitted request besides its [`Stream`].
struct Active {
    id: u64,
    sink: Rc<RefCell<EventSink>>,
}

/// Everything the loop owns between rounds.
struct State<'s> {
    sched: Scheduler,
    /// Queued in the scheduler, not admitted yet, by id.
    waiting: HashMap<u64, Box<Job>>,
    /// Admitted streams (running or preempted) and their sinks, index-aligned.
    streams: Vec<Stream<'s>>,
    actives: Vec<Active>,
}

impl State<'_> {
    fn index(&self, id: u64) -> Option<usize> {
        self.actives.iter().position(|a| a.id == id)
    }
}

pub(crate) fn shared_loop(
    g: &mut Generator<'_>,
    rx: &mpsc::Receiver<Command>,
    stats: &EngineStats,
    live: &LiveList,
    parallel: usize,
    max_rows: usize,
) {
    let cfg = SchedConfig {
        max_rows,
        max_running: parallel,
        // The handle bounds the waiting requests (429) before they reach this thread.
        max_waiting: usize::MAX,
        ..SchedConfig::new(g.pool().block_size(), g.pool().total_blocks())
    };
    let mut st =
        State { sched: Scheduler::new(cfg), waiting: HashMap::new(), streams: Vec::new(), actives: Vec::new() };
    let mut inbox = Queue::default();
    let mut solo: VecDeque<Box<Job>> = VecDeque::new();
    let mut shutting_down = false;
    let forget = |id: u64| live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    loop {
        let idle = st.sched.streams().is_empty() && inbox.is_empty() && solo.is_empty();
        let block = idle && !shutting_down;
        if !drain(rx, &mut inbox, &mut shutting_down, block) && idle {
            return;
        }
        // New requests join the scheduler (interactive first, then by arrival), until a scoring request waits:
        // later arrivals stay behind it.
        while solo.is_empty() {
            let Some(job) = inbox.pop() else { break };
            if job.req.prompt_logprobs.is_some() {
                solo.push_back(job);
                break;
            }
            if let Err(e) = enqueue(g, &mut st, job) {
                let (id, mut job, e) = *e;
                stats.waiting.fetch_sub(1, Ordering::SeqCst);
                stats.finished_error.fetch_add(1, Ordering::Relaxed);
                let _ = (job.sink)(EngineEvent::Error(e));
                forget(id);
            }
        }
        for (&id, job) in &st.waiting {
            if job.cancel.load(Ordering::Relaxed) {
                let _ = st.sched.cancel(StreamId(id));
            }
        }
        for s in st.streams.iter_mut() {
            s.cancel_if_flagged();
        }
        finish_streams(g, &mut st, stats, &forget);
        if st.sched.streams().is_empty() {
            if let Some(mut job) = solo.pop_front() {
                stats.waiting.fetch_sub(1, Ordering::SeqCst);
                run_job(g, &mut job, stats);
                forget(job.id);
            } else if shutting_down && inbox.is_empty() {
                return;
            }
            continue;
        }
        let grants = plan_round(g, &mut st, stats, &forget);
        stats.running.store(st.sched.running_count(), Ordering::SeqCst);
        publish_kv(g, stats);
        if grants.is_empty() {
            continue;
        }
        let before: Vec<(usize, usize)> = st.streams.iter().map(|s| (s.filled(), s.emitted())).collect();
        if let Err(e) = g.run_round(&mut st.streams, &grants) {
            for a in st.actives.drain(..) {
                let _ = st.sched.on_finished(StreamId(a.id));
                stats.finished_error.fetch_add(1, Ordering::Relaxed);
                let _ = (a.sink.borrow_mut())(EngineEvent::Error(e.clone()));
                forget(a.id);
            }
            st.streams.clear();
        } else {
            for &(i, grant) in &grants {
                let id = StreamId(st.actives[i].id);
                let s = &st.streams[i];
                if matches!(grant, Grant::Fill { .. }) && s.filled() > before[i].0 {
                    let fed = if s.is_filling() { s.filled() - before[i].0 } else { usize::MAX };
                    let phase = st.sched.on_prefilled(id, fed);
                    debug_assert!(phase.is_ok(), "{phase:?}");
                }
                let emitted = s.emitted() - before[i].1;
                if emitted > 0 {
                    let r = st.sched.on_decoded(id, emitted);
                    debug_assert!(r.is_ok(), "{r:?}");
                }
            }
        }
        finish_streams(g, &mut st, stats, &forget);
        stats.running.store(st.sched.running_count(), Ordering::SeqCst);
        publish_kv(g, stats);
        if st.streams.is_empty() {
            stats.live_decode_milli_tps.store(0, Ordering::Relaxed);
        }
    }
}

/// Validates a new request and queues it in the scheduler. A request that can never run (invalid, longer
/// than the context, more KV than the pool) is handed back with its error; one that only has to wait queues.
#[allow(clippy::type_complexity)]
fn enqueue(g: &Generator<'_>, st: &mut State<'_>, job: Box<Job>) -> Result<(), Box<(u64, Box<Job>, EngineError)>> {
    match g.admit(&job.req) {
        Ok(_) | Err(EngineError::Pool(PoolError::Exhausted { .. })) => {}
        Err(e) => return Err(Box::new((job.id, job, e))),
    }
    let spec = StreamSpec {
        id: StreamId(job.id),
        priority: job.priority,
        prompt_len: job.req.prompt.len(),
        max_total: job.req.prompt.len() + job.req.max_tokens,
        cached: 0,
        want_drafts: 0,
    };
    match st.sched.try_enqueue(spec) {
        Ok(()) => {
            st.waiting.insert(job.id, job);
            Ok(())
        }
        Err(SchedError::TooLarge { tokens, capacity_tokens }) => {
            Err(Box::new((job.id, job, PoolError::TooLarge { tokens, capacity_tokens }.into())))
        }
        Err(e) => Err(Box::new((job.id, job, EngineError::InvalidRequest(e.to_string())))),
    }
}

/// Plans the next round and carries out its releases and admissions; returns the grants to run.
fn plan_round<'s>(
    g: &mut Generator<'_>,
    st: &mut State<'s>,
    stats: &'s EngineStats,
    forget: &dyn Fn(u64),
) -> Vec<(usize, Grant)> {
    // What the policy plans with: cached prefixes of queued streams, drafts wanted by decoding ones.
    let mut hints = Vec::new();
    for s in st.sched.streams() {
        match s.phase {
            Phase::Waiting | Phase::Preempted => {
                let seq = match (st.waiting.get(&s.id.0), st.index(s.id.0)) {
                    (Some(job), _) => job.req.prompt.clone(),
                    (None, Some(i)) => st.streams[i].sequence(),
                    (None, None) => continue,
                };
                let cached = g.prefix_cache().map_or(0, |c| c.peek(&seq, seq.len() - 1));
                hints.push((s.id, Some(cached), None));
            }
            Phase::Decoding => {
                if let Some(i) = st.index(s.id.0) {
                    hints.push((s.id, None, Some(g.want_drafts(&st.streams[i]))));
                }
            }
            Phase::Prefilling { .. } => {}
        }
    }
    for (id, cached, want) in hints {
        if let Some(c) = cached {
            let _ = st.sched.set_cached(id, c);
        }
        if let Some(w) = want {
            let _ = st.sched.set_want_drafts(id, w);
        }
    }
    let free = g.pool().free_blocks() + g.prefix_cache().map_or(0, |c| c.idle_blocks(g.pool()));
    let plan = st.sched.plan(free);
    for id in &plan.finished_cancelled {
        if let Some(mut job) = st.waiting.remove(&id.0) {
            stats.waiting.fetch_sub(1, Ordering::SeqCst);
            stats.finished_cancelled.fetch_add(1, Ordering::Relaxed);
            let _ = (job.sink)(EngineEvent::Error(EngineError::Cancelled));
            forget(id.0);
        } else if let Some(i) = st.index(id.0) {
            st.streams[i].cancel();
        }
    }
    for id in &plan.preempted {
        if let Some(i) = st.index(id.0) {
            g.preempt(&mut st.streams[i]);
            stats.preemptions.fetch_add(1, Ordering::Relaxed);
        }
    }
    for &id in &plan.admitted {
        let result = if let Some(mut job) = st.waiting.remove(&id.0) {
            match admit(g, &mut job, stats) {
                Ok((stream, sink)) => {
                    stats.waiting.fetch_sub(1, Ordering::SeqCst);
                    st.streams.push(stream);
                    st.actives.push(Active { id: id.0, sink });
                    Ok(())
                }
                Err(e) => {
                    if matches!(e, EngineError::Pool(PoolError::Exhausted { .. })) {
                        st.waiting.insert(id.0, job);
                    } else {
                        stats.waiting.fetch_sub(1, Ordering::SeqCst);
                        stats.finished_error.fetch_add(1, Ordering::Relaxed);
                        let _ = (job.sink)(EngineEvent::Error(e.clone()));
                        forget(id.0);
                    }
                    Err(e)
                }
            }
        } else if let Some(i) = st.index(id.0) {
            g.resume(&mut st.streams[i])
        } else {
            continue;
        };
        match result {
            Ok(()) => {
                let i = st.index(id.0).expect("admitted");
                let _ = st.sched.set_filled(id, st.streams[i].filled());
            }
            // Blocks the plan counted on were not there after all: it waits again.
            Err(EngineError::Pool(PoolError::Exhausted { .. })) => {
                let _ = st.sched.unadmit(id);
            }
            Err(e) => {
                // A fresh request already got its error above; a resumed stream ends with it.
                if let Some(i) = st.index(id.0) {
                    let a = st.actives.swap_remove(i);
                    st.streams.swap_remove(i);
                    stats.finished_error.fetch_add(1, Ordering::Relaxed);
                    let _ = (a.sink.borrow_mut())(EngineEvent::Error(e));
                    forget(id.0);
                }
                let _ = st.sched.on_finished(id);
            }
        }
    }
    let mut grants = Vec::new();
    for d in &plan.decode {
        if let Some(i) = st.index(d.id.0) {
            grants.push((i, Grant::Window { max_drafts: d.drafts }));
        }
    }
    for c in &plan.prefill {
        if let Some(i) = st.index(c.id.0) {
            grants.push((i, Grant::Fill { max_len: c.len }));
        }
    }
    grants
}

/// Finished streams leave (their blocks return first, so the counters are current when they report).
fn finish_streams(g: &Generator<'_>, st: &mut State<'_>, stats: &EngineStats, forget: &dyn Fn(u64)) {
    let mut finished = Vec::new();
    let mut i = 0;
    while i < st.streams.len() {
        if st.streams[i].is_done() {
            let out = st.streams.swap_remove(i).output();
            let a = st.actives.swap_remove(i);
            let _ = st.sched.on_finished(StreamId(a.id));
            finished.push((out, a));
        } else {
            i += 1;
        }
    }
    if finished.is_empty() {
        return;
    }
    stats.running.store(st.sched.running_count(), Ordering::SeqCst);
    publish_kv(g, stats);
    for (out, a) in finished {
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
        forget(a.id);
        let _ = (a.sink.borrow_mut())(EngineEvent::Done(out));
    }
}

/// Publishes the KV counters: blocks held by requests, and blocks only the prefix cache holds.
fn publish_kv(g: &Generator<'_>, stats: &EngineStats) {
    let total = g.pool().total_blocks();
    let cached = g.prefix_cache().map_or(0, |c| c.idle_blocks(g.pool()));
    stats.kv_blocks_cached.store(cached, Ordering::Relaxed);
    stats.kv_blocks_used.store(total.saturating_sub(g.pool().free_blocks() + cached), Ordering::Relaxed);
}

/// Moves the job's sink into a shared cell (the stream's token callback and the loop both use it).
fn take_sink(job: &mut Job) -> Rc<RefCell<EventSink>> {
    let sink = std::mem::replace(&mut job.sink, Box::new(|_| Flow::Continue));
    Rc::new(RefCell::new(sink))
}

/// Admits `job` as a stream whose token callback feeds its sink and the live counters. On refusal the job
/// keeps its sink (nothing was sent).
fn admit<'s>(
    g: &mut Generator<'_>,
    job: &mut Job,
    stats: &'s EngineStats,
) -> Result<(Stream<'s>, Rc<RefCell<EventSink>>), EngineError> {
    let queued_s = job.queued_at.elapsed().as_secs_f64();
    let sink = take_sink(job);
    let started = Instant::now();
    let first = Cell::new(true);
    let cb_sink = sink.clone();
    let on_token: OnToken<'s> = Box::new(move |ev| {
        if first.replace(false) {
            stats.observe_ttft(started.elapsed().as_secs_f64() + queued_s);
        }
        stats.generation_tokens.fetch_add(1, Ordering::Relaxed);
        (cb_sink.borrow_mut())(EngineEvent::Token(ev))
    });
    match g.admit_stream(job.req.clone(), on_token) {
        Ok(stream) => {
            stats.queue_us.fetch_add(micros(queued_s), Ordering::Relaxed);
            let _ = (sink.borrow_mut())(EngineEvent::Started { queued_s });
            Ok((stream, sink))
        }
        Err(e) => {
            // The callback (and its clone of the sink) is gone with the refused stream.
            if let Ok(cell) = Rc::try_unwrap(sink) {
                job.sink = cell.into_inner();
            }
            Err(e)
        }
    }
}
