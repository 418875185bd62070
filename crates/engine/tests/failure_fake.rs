//! The engine thread panicking (failure.rs), on the fake model made to fail in the middle of a forward: every
//! request it held (running, waiting, in both loops) gets one error event saying the engine failed, later
//! submits are refused with the reason, and the handle reports the failure; a normal stop reports none.
//! Synchronization is by channels only: a "gate" request holds the engine inside its sink until released.

#[allow(dead_code)]
mod fake;

use fake::{collecting, FakeBackend, FakeModel};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;
use tf_engine::{EngineError, EngineHandle, GenOutput, GenRequest, Priority, SamplingParams, SubmitError};

const VOCAB: usize = 40;
const WAIT: Duration = Duration::from_secs(30);

/// The handle and the switch that makes the model's forwards panic.
fn spawn(parallel: usize) -> (EngineHandle, Arc<AtomicBool>) {
    let model = FakeModel::new(VOCAB, 256);
    let fail = model.fail.clone();
    let cfg = fake::engine_config(8, parallel);
    (EngineHandle::spawn(Arc::new(FakeBackend), Box::new(model), cfg).unwrap(), fail)
}

fn request(salt: u32, max_tokens: usize) -> GenRequest {
    let prompt = (0..6u32).map(|i| (i * 17 + 3 + salt) % VOCAB as u32).collect();
    GenRequest::new(prompt, SamplingParams::greedy(), max_tokens)
}

/// The final event of a request, which must be the engine's failure.
fn expect_failed(rx: &mpsc::Receiver<Result<GenOutput, EngineError>>, what: &str) {
    match rx.recv_timeout(WAIT) {
        Ok(Err(EngineError::Model(m))) => assert!(m.contains("the engine failed"), "{what}: {m}"),
        other => panic!("{what}: expected the engine's failure, got {other:?}"),
    }
}

/// `h.wait_end()`, bounded (a broken recording of the end would otherwise hang the test).
fn wait_end(h: &EngineHandle) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    let h = h.clone();
    std::thread::spawn(move || tx.send(h.wait_end()));
    rx.recv_timeout(WAIT).expect("the engine thread's end is recorded")
}

fn check_failed_handle(h: &EngineHandle) {
    let why = wait_end(h).expect("the engine thread ended with a failure");
    assert!(why.contains("fake device error"), "{why}");
    assert_eq!(h.failure().as_deref(), Some(why.as_str()));
    assert!(!h.is_accepting());
    let (tx, _rx) = mpsc::channel();
    match h.submit(request(7, 3), Priority::Interactive, collecting(tx)) {
        Err(SubmitError::Failed(w)) => assert_eq!(w, why),
        other => panic!("submit after the failure: {:?}", other.map(|t| t.id)),
    }
    h.shutdown();
}

#[test]
fn a_panic_in_a_forward_fails_the_running_and_the_waiting_requests_with_a_reason() {
    for parallel in [1, 2] {
        let (h, fail) = spawn(parallel);
        let (release, gate_rx) = fake::gate(&h, request(0, 20), WAIT);
        // Waiting behind the gate (solo loop), or a second stream of the shared rounds and one more waiting.
        let (tx, rx) = mpsc::channel();
        h.submit(request(1, 5), Priority::Interactive, collecting(tx.clone())).unwrap();
        h.submit(request(2, 5), Priority::Background, collecting(tx)).unwrap();
        fail.store(true, Ordering::SeqCst);
        release.send(()).unwrap();
        expect_failed(&gate_rx, &format!("parallel {parallel}: the running request"));
        for i in 0..2 {
            match rx.recv_timeout(WAIT) {
                Ok(Err(EngineError::Model(m))) => assert!(m.contains("the engine failed"), "{m}"),
                other => panic!("parallel {parallel}: request {i} behind the gate got {other:?}"),
            }
        }
        check_failed_handle(&h);
        // The engine thread is joined, so every sink is gone: one final event each, nothing after it.
        for (what, rx) in [("the gate", &gate_rx), ("the others", &rx)] {
            assert!(matches!(rx.try_recv(), Err(mpsc::TryRecvError::Disconnected)), "parallel {parallel}: {what}");
        }
    }
}

#[test]
fn a_normal_stop_reports_no_failure_and_sends_nothing_more() {
    for parallel in [1, 2] {
        let (h, _fail) = spawn(parallel);
        let (tx, rx) = mpsc::channel();
        h.submit(request(3, 4), Priority::Interactive, collecting(tx)).unwrap();
        assert!(matches!(rx.recv_timeout(WAIT), Ok(Ok(_))), "parallel {parallel}: the reply");
        h.shutdown();
        assert_eq!(wait_end(&h), None);
        assert_eq!(h.failure(), None);
        // The sink was dropped with the finished request: its channel is closed, with no error event after Done.
        assert!(matches!(rx.recv_timeout(WAIT), Err(mpsc::RecvTimeoutError::Disconnected)));
    }
}
