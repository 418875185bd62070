//! The engine thread behind `EngineHandle`, on the fake model: replies equal the direct generation loop, the
//! queue is bounded and ordered by priority, cancellation (waiting or running) frees everything.
//! Synchronization is by channels only: a "gate" request holds the engine inside its sink until released.

#[allow(dead_code)]
mod fake;

use fake::{collecting, FakeBackend, FakeModel};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tf_engine::{
    EngineConfig, EngineError, EngineEvent, EngineHandle, FinishReason, Flow, GenOutput, GenRequest, Priority,
    SamplingParams, SubmitError,
};

const VOCAB: usize = 40;
const WAIT: Duration = Duration::from_secs(30);

fn spawn(max_waiting: usize) -> EngineHandle {
    spawn_with(max_waiting, 1)
}

fn spawn_with(max_waiting: usize, parallel: usize) -> EngineHandle {
    let cfg = fake::engine_config(max_waiting, parallel);
    EngineHandle::spawn(Arc::new(FakeBackend), Box::new(FakeModel::new(VOCAB, 256)), cfg).unwrap()
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 17 + 3 + salt) % VOCAB as u32).collect()
}

/// Serial generation straight from the definition.
fn reference(req: &GenRequest) -> Vec<u32> {
    fake::reference_reply(req, req.params.seed.unwrap(), VOCAB)
}

/// A request holding the engine inside its sink until released (`fake::gate`).
fn gate(h: &EngineHandle) -> (mpsc::Sender<()>, mpsc::Receiver<Result<GenOutput, EngineError>>) {
    fake::gate(h, GenRequest::new(prompt(5, 99), SamplingParams::greedy(), 3), WAIT)
}

#[test]
fn replies_through_the_handle_equal_the_reference() {
    let h = spawn(8);
    let mut waits = Vec::new();
    let mut reqs = Vec::new();
    for i in 0..4u32 {
        let params = if i % 2 == 0 {
            SamplingParams { seed: Some(u64::from(i)), ..SamplingParams::greedy() }
        } else {
            SamplingParams { temperature: 0.9, top_k: 20, seed: Some(u64::from(i) * 7), ..Default::default() }
        };
        let req = GenRequest::new(prompt(3 + i as usize * 5, i), params, 12);
        let (tx, rx) = mpsc::channel();
        h.submit(req.clone(), Priority::Interactive, collecting(tx)).unwrap();
        waits.push(rx);
        reqs.push(req);
    }
    for (req, rx) in reqs.iter().zip(waits) {
        let out = rx.recv_timeout(WAIT).unwrap().unwrap();
        assert_eq!(out.tokens, reference(req));
        assert_eq!(out.finish_reason, FinishReason::Length);
    }
    let s = h.stats();
    assert_eq!(s.finished_length.load(Ordering::Relaxed), 4);
    assert_eq!(s.generation_tokens.load(Ordering::Relaxed), 48);
    assert_eq!(s.kv_blocks_used.load(Ordering::Relaxed), 0);
    h.shutdown();
}

#[test]
fn shared_rounds_through_the_handle_equal_the_reference() {
    let h = spawn_with(32, 4);
    let mut waits = Vec::new();
    let mut reqs = Vec::new();
    for i in 0..10u32 {
        let params = if i % 2 == 0 {
            SamplingParams { seed: Some(u64::from(i)), ..SamplingParams::greedy() }
        } else {
            SamplingParams { temperature: 0.9, top_k: 20, seed: Some(u64::from(i) * 7), ..Default::default() }
        };
        let mut req = GenRequest::new(prompt(3 + i as usize * 4, i), params, 10 + i as usize);
        req.prefill_chunk = 5;
        let (tx, rx) = mpsc::channel();
        h.submit(req.clone(), Priority::Interactive, collecting(tx)).unwrap();
        waits.push(rx);
        reqs.push(req);
    }
    for (req, rx) in reqs.iter().zip(waits) {
        let out = rx.recv_timeout(WAIT).unwrap().unwrap();
        assert_eq!(out.tokens, reference(req));
    }
    let s = h.stats();
    assert_eq!(s.finished_length.load(Ordering::Relaxed), 10);
    assert_eq!(s.kv_blocks_used.load(Ordering::Relaxed), 0);
    assert_eq!(s.running.load(Ordering::SeqCst), 0);
    // A request beyond the context is refused; the engine goes on.
    let (tx, rx) = mpsc::channel();
    h.submit(GenRequest::new(prompt(240, 1), SamplingParams::greedy(), 50), Priority::Interactive, collecting(tx))
        .unwrap();
    assert!(rx.recv_timeout(WAIT).unwrap().is_err());
    h.cancel_all();
    h.shutdown();
}

#[test]
fn the_queue_is_bounded_and_interactive_goes_first() {
    let h = spawn(4);
    let (release, gate_done) = gate(&h);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut dones = Vec::new();
    for (name, prio) in [
        ("b1", Priority::Background),
        ("i1", Priority::Interactive),
        ("b2", Priority::Background),
        ("i2", Priority::Interactive),
    ] {
        let order = order.clone();
        let (tx, rx) = mpsc::channel();
        let sink: tf_engine::EventSink = Box::new(move |ev| {
            match ev {
                EngineEvent::Started { .. } => order.lock().unwrap().push(name),
                EngineEvent::Done(_) | EngineEvent::Error(_) => {
                    let _ = tx.send(());
                }
                _ => {}
            }
            Flow::Continue
        });
        h.submit(GenRequest::new(prompt(4, 1), SamplingParams::greedy(), 2), prio, sink).unwrap();
        dones.push(rx);
    }
    assert_eq!(h.stats().waiting.load(Ordering::SeqCst), 4);
    let refused = h.submit(
        GenRequest::new(prompt(4, 1), SamplingParams::greedy(), 2),
        Priority::Interactive,
        Box::new(|_| Flow::Continue),
    );
    assert_eq!(refused.unwrap_err(), SubmitError::QueueFull { max_waiting: 4 });
    assert_eq!(h.stats().waiting.load(Ordering::SeqCst), 4, "a refusal leaves no trace");
    release.send(()).unwrap();
    gate_done.recv_timeout(WAIT).unwrap().unwrap();
    for d in dones {
        d.recv_timeout(WAIT).unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec!["i1", "i2", "b1", "b2"]);
    h.shutdown();
}

#[test]
fn cancelling_a_waiting_or_running_request_frees_everything() {
    let h = spawn(4);
    let (release, gate_done) = gate(&h);
    // Waiting: cancelled before it starts, its sink still gets the final event.
    let (tx, waiting_done) = mpsc::channel();
    let ticket =
        h.submit(GenRequest::new(prompt(6, 2), SamplingParams::greedy(), 50), Priority::Interactive, collecting(tx));
    let ticket = ticket.unwrap();
    ticket.cancel();
    // Running: its sink pauses at the third token while the test cancels it through the ticket.
    let (tx, running_done) = mpsc::channel();
    let (at3_tx, at3_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let mut inner = collecting(tx);
    let mut seen = 0;
    let sink: tf_engine::EventSink = Box::new(move |ev| {
        if let EngineEvent::Token(_) = ev {
            seen += 1;
            if seen == 3 {
                let _ = at3_tx.send(());
                let _ = go_rx.recv_timeout(WAIT);
            }
        }
        inner(ev)
    });
    let running =
        h.submit(GenRequest::new(prompt(6, 3), SamplingParams::greedy(), 100), Priority::Interactive, sink).unwrap();
    release.send(()).unwrap();
    gate_done.recv_timeout(WAIT).unwrap().unwrap();
    assert_eq!(waiting_done.recv_timeout(WAIT).unwrap(), Err(EngineError::Cancelled));
    at3_rx.recv_timeout(WAIT).unwrap();
    assert_eq!(h.stats().running.load(Ordering::SeqCst), 1);
    assert!(h.stats().kv_blocks_used.load(Ordering::Relaxed) > 0);
    running.cancel();
    go_tx.send(()).unwrap();
    let out = running_done.recv_timeout(WAIT).unwrap().unwrap();
    assert_eq!(out.tokens.len(), 3, "the reply ends at the token where the cancel was seen");
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    let s = h.stats();
    assert_eq!(s.kv_blocks_used.load(Ordering::Relaxed), 0);
    assert_eq!(s.running.load(Ordering::SeqCst), 0);
    assert_eq!(s.waiting.load(Ordering::SeqCst), 0);
    // The engine still serves.
    let (tx, rx) = mpsc::channel();
    let req = GenRequest::new(prompt(7, 4), SamplingParams { seed: Some(1), ..SamplingParams::greedy() }, 5);
    h.submit(req.clone(), Priority::Interactive, collecting(tx)).unwrap();
    assert_eq!(rx.recv_timeout(WAIT).unwrap().unwrap().tokens, reference(&req));
    h.cancel_all();
    h.shutdown();
    let refused = h.submit(req, Priority::Interactive, Box::new(|_| Flow::Continue));
    assert_eq!(refused.unwrap_err(), SubmitError::ShuttingDown);
}

#[test]
fn a_sink_that_stops_ends_the_reply_at_that_token() {
    let h = spawn(4);
    let (tx, rx) = mpsc::channel();
    let mut inner = collecting(tx);
    let mut n = 0;
    let sink: tf_engine::EventSink = Box::new(move |ev| {
        let is_token = matches!(ev, EngineEvent::Token(_));
        let flow = inner(ev);
        if is_token {
            n += 1;
            if n == 4 {
                return Flow::Stop;
            }
        }
        flow
    });
    let req = GenRequest::new(prompt(5, 5), SamplingParams { seed: Some(3), ..SamplingParams::greedy() }, 20);
    h.submit(req.clone(), Priority::Interactive, sink).unwrap();
    let out = rx.recv_timeout(WAIT).unwrap().unwrap();
    assert_eq!(out.tokens, reference(&req)[..4].to_vec());
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    h.shutdown();
}

/// A background request is preempted for an interactive one that does not fit the pool beside it, resumes
/// when room is back, and its reply equals its solo run: no token lost, repeated or changed, with its blocks
/// kept in the prefix cache across the preemption or (cache off) refilled from scratch.
#[test]
fn a_preempted_background_request_resumes_and_equals_its_solo_run() {
    for prefix_cache in [true, false] {
        let h = EngineHandle::spawn(
            Arc::new(FakeBackend),
            Box::new(FakeModel::new(VOCAB, 256)),
            EngineConfig {
                kv_blocks: 12,
                block_size: 8,
                max_waiting: 8,
                max_window: 4,
                proposer: None,
                min_drafts: 1,
                prefix_cache,
                run_ahead: true,
                token_limit: None,
                parallel: 4,
                max_rows: 32,
            },
        )
        .unwrap();
        // 20 + 60 tokens: 10 of the 12 blocks. One token per round, so it has run long enough to be
        // preemptible (the scheduler protects fresh admissions for a few rounds) when it submits the other.
        let mut bg = GenRequest::new(
            prompt(20, 5),
            SamplingParams { temperature: 0.8, top_k: 12, seed: Some(3), ..Default::default() },
            60,
        );
        bg.draft = false;
        let fg = GenRequest::new(prompt(10, 9), SamplingParams { seed: Some(1), ..SamplingParams::greedy() }, 20);
        let (fg_tx, fg_rx) = mpsc::channel();
        let (bg_tx, bg_rx) = mpsc::channel();
        let (h2, fg2) = (h.clone(), fg.clone());
        let mut fg_sink = Some(collecting(fg_tx));
        let mut seen = Vec::new();
        let sink: tf_engine::EventSink = Box::new(move |ev| {
            match ev {
                EngineEvent::Token(t) => {
                    seen.push(t.index);
                    if t.index == 20 {
                        // 4 blocks needed, 2 free: only a preemption makes room.
                        h2.submit(fg2.clone(), Priority::Interactive, fg_sink.take().unwrap()).unwrap();
                    }
                }
                EngineEvent::Done(out) => {
                    let _ = bg_tx.send((Ok(out), seen.clone()));
                }
                EngineEvent::Error(e) => {
                    let _ = bg_tx.send((Err(e), seen.clone()));
                }
                _ => {}
            }
            Flow::Continue
        });
        h.submit(bg.clone(), Priority::Background, sink).unwrap();
        let fg_out = fg_rx.recv_timeout(WAIT).unwrap().unwrap();
        let (bg_out, seen) = bg_rx.recv_timeout(WAIT).unwrap();
        let bg_out = bg_out.unwrap();
        assert_eq!(fg_out.tokens, reference(&fg), "prefix_cache {prefix_cache}");
        assert_eq!(bg_out.tokens, reference(&bg), "prefix_cache {prefix_cache}");
        assert_eq!(seen, (0..60).collect::<Vec<_>>(), "each token sent once, in order");
        let s = h.stats();
        assert_eq!(s.preemptions.load(Ordering::Relaxed), 1, "prefix_cache {prefix_cache}");
        assert_eq!(s.finished_length.load(Ordering::Relaxed), 2);
        assert_eq!(s.kv_blocks_used.load(Ordering::Relaxed), 0);
        h.shutdown();
    }
}

/// The scheduler's plans with row budgets of 1, 16 and 512 (drafts split or not, prompts in chunks of one
/// row or whole) and mixed priorities give every request its solo reply.
#[test]
fn scheduled_rounds_with_any_row_budget_equal_the_reference() {
    for max_rows in [1, 16, 512] {
        let h = EngineHandle::spawn(
            Arc::new(FakeBackend),
            Box::new(FakeModel::new(VOCAB, 256)),
            EngineConfig {
                kv_blocks: 40,
                block_size: 8,
                max_waiting: 32,
                max_window: 5,
                proposer: None,
                min_drafts: 1,
                prefix_cache: true,
                run_ahead: true,
                token_limit: None,
                parallel: 6,
                max_rows,
            },
        )
        .unwrap();
        let mut waits = Vec::new();
        for i in 0..12u32 {
            let params = if i % 3 == 0 {
                SamplingParams { seed: Some(u64::from(i)), ..SamplingParams::greedy() }
            } else {
                SamplingParams { temperature: 0.7, top_k: 10, seed: Some(u64::from(i) + 40), ..Default::default() }
            };
            // Repetitive prompts so context copies propose and get accepted.
            let p: Vec<u32> = (0..(4 + i as usize * 7)).map(|j| [1u32, 2, 3, 4][j % 4] + i % 3).collect();
            let req = GenRequest::new(p, params, 8 + i as usize * 3);
            let priority = if i % 4 == 3 { Priority::Background } else { Priority::Interactive };
            let (tx, rx) = mpsc::channel();
            h.submit(req.clone(), priority, collecting(tx)).unwrap();
            waits.push((req, rx));
        }
        for (req, rx) in waits {
            let out = rx.recv_timeout(WAIT).unwrap().unwrap();
            assert_eq!(out.tokens, reference(&req), "max_rows {max_rows}");
        }
        assert_eq!(h.stats().kv_blocks_used.load(Ordering::Relaxed), 0);
        if max_rows > 1 {
            assert!(h.stats().accepted_tokens.load(Ordering::Relaxed) > 0, "drafts ran (max_rows {max_rows})");
        }
        h.shutdown();
    }
}
