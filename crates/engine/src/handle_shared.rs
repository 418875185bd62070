//! The engine thread with shared rounds (`parallel > 1`): up to `parallel` requests are active at once and every
//! round is one forward over their rows ([`Generator::round`]). New requests are admitted between rounds (as KV
//! allows: one that does not fit yet waits at the head of its queue), so a prompt fills inside the decode rounds
//! of the others instead of stalling them. Requests that score their prompt (prompt logprobs) run solo.

use crate::generate::{EngineError, FinishReason, Flow, Generator};
use crate::handle::{drain, micros, run_job, Command, EngineEvent, EngineStats, EventSink, Job, LiveList, Queue};
use crate::kv_pool::PoolError;
use crate::rounds::{OnToken, Stream};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

/// The engine-side state of an active request besides its [`Stream`].
struct Active {
    id: u64,
    sink: Rc<RefCell<EventSink>>,
}

pub(crate) fn shared_loop(
    g: &mut Generator<'_>,
    rx: mpsc::Receiver<Command>,
    stats: &EngineStats,
    live: &LiveList,
    parallel: usize,
    max_rows: usize,
) {
    let mut queue = Queue::default();
    let mut shutting_down = false;
    let mut streams: Vec<Stream<'_>> = Vec::new();
    let mut actives: Vec<Active> = Vec::new();
    let forget = |id: u64| live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    loop {
        let block = streams.is_empty() && queue.is_empty() && !shutting_down;
        if !drain(&rx, &mut queue, &mut shutting_down, block) && streams.is_empty() {
            return;
        }
        // Admit while there is room.
        while streams.len() < parallel {
            let Some(mut job) = queue.pop() else { break };
            stats.waiting.fetch_sub(1, Ordering::SeqCst);
            if job.req.prompt_logprobs.is_some() || job.cancel.load(Ordering::Relaxed) {
                if streams.is_empty() {
                    run_job(g, &mut job, stats);
                    forget(job.id);
                    continue;
                }
                // Scoring waits until the active streams are done.
                stats.waiting.fetch_add(1, Ordering::SeqCst);
                queue.push_front(job);
                break;
            }
            match admit(g, &mut job, stats) {
                Ok((stream, sink)) => {
                    streams.push(stream);
                    actives.push(Active { id: job.id, sink });
                }
                Err(EngineError::Pool(PoolError::Exhausted { .. })) if !streams.is_empty() => {
                    // It fits the pool, just not now: wait for a stream to finish.
                    stats.waiting.fetch_add(1, Ordering::SeqCst);
                    queue.push_front(job);
                    break;
                }
                Err(e) => {
                    stats.finished_error.fetch_add(1, Ordering::Relaxed);
                    let _ = (job.sink)(EngineEvent::Error(e));
                    forget(job.id);
                }
            }
        }
        if streams.is_empty() {
            if shutting_down && queue.is_empty() {
                return;
            }
            continue;
        }
        stats.running.store(streams.len(), Ordering::SeqCst);
        let total = g.pool().total_blocks();
        let cached = g.prefix_cache().map_or(0, |c| c.len());
        stats.kv_blocks_used.store(total.saturating_sub(g.pool().free_blocks() + cached), Ordering::Relaxed);
        if let Err(e) = g.round(&mut streams, max_rows) {
            for a in actives.drain(..) {
                stats.finished_error.fetch_add(1, Ordering::Relaxed);
                let _ = (a.sink.borrow_mut())(EngineEvent::Error(e.clone()));
                forget(a.id);
            }
            streams.clear();
        }
        // Finished streams leave (their blocks return first, so the counters are current when they report).
        let mut finished = Vec::new();
        let mut i = 0;
        while i < streams.len() {
            if streams[i].is_done() {
                let s = streams.swap_remove(i);
                finished.push((s.output(), actives.swap_remove(i)));
            } else {
                i += 1;
            }
        }
        stats.running.store(streams.len(), Ordering::SeqCst);
        let cached = g.prefix_cache().map_or(0, |c| c.len());
        stats.kv_blocks_cached.store(cached, Ordering::Relaxed);
        stats.kv_blocks_used.store(total.saturating_sub(g.pool().free_blocks() + cached), Ordering::Relaxed);
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
        if streams.is_empty() {
            stats.live_decode_milli_tps.store(0, Ordering::Relaxed);
        }
    }
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
