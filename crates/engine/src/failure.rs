//! When the engine thread panics: a backend op that has no clean way to fail (a GPU allocation or a driver error
//! in the middle of a forward, a broken invariant). Every request the engine holds gets an error event instead of
//! a silently closed channel, later submits are refused with the reason, and the handle reports the failure (the
//! server's `/health` answers 503 with it, and `serve` stops and exits non-zero so a supervisor restarts it). The
//! engine is not restarted in place: its KV pool and device state are not known to be sound after a panic.

use crate::generate::EngineError;
use crate::handle::{Command, EngineEvent, EventSink};
use std::sync::{mpsc, Condvar, Mutex};

/// How the engine thread ended, for anyone waiting on it.
#[derive(Default)]
pub(crate) struct Ending {
    /// None while it runs; `Some(None)` after a normal stop; `Some(Some(why))` after a panic.
    state: Mutex<Option<Option<String>>>,
    ended: Condvar,
}

impl Ending {
    pub(crate) fn set(&self, failure: Option<String>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_none() {
            *s = Some(failure);
        }
        self.ended.notify_all();
    }

    /// Why the engine failed, once it has.
    pub(crate) fn failure(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone().flatten()
    }

    /// Blocks until the engine thread has ended; its failure, if it failed.
    pub(crate) fn wait(&self) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.is_none() {
            s = self.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.clone().flatten()
    }
}

/// The error a request gets when the engine fails under it (or after it failed).
pub(crate) fn failed_error(why: Option<&str>) -> EngineError {
    EngineError::Model(match why {
        Some(w) => format!("the engine failed: {w}; the server is stopping"),
        None => "the engine failed while running this request (see the server log); the server is stopping".into(),
    })
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `sink`, delivering one error event of its own if it is dropped by a panic's unwinding before it delivered its
/// request's final event (`Done` or `Error`). An ordinary drop delivers nothing.
pub(crate) fn guarded(sink: EventSink) -> EventSink {
    struct Guard {
        sink: EventSink,
        ended: bool,
    }
    impl Drop for Guard {
        fn drop(&mut self) {
            if !self.ended && std::thread::panicking() {
                self.ended = true;
                let _ = (self.sink)(EngineEvent::Error(failed_error(None)));
            }
        }
    }
    let mut g = Guard { sink, ended: false };
    Box::new(move |ev| {
        let last = matches!(ev, EngineEvent::Done(_) | EngineEvent::Error(_));
        let flow = (g.sink)(ev);
        g.ended |= last;
        flow
    })
}

/// After a failure: answers every request still sent to the engine with the failure until the handle asks it to
/// shut down or every handle is gone.
pub(crate) fn refuse_until_shutdown(rx: &mpsc::Receiver<Command>, why: &str) {
    while let Ok(cmd) = rx.recv() {
        match cmd {
            Command::Submit(mut job) => {
                let _ = (job.sink)(EngineEvent::Error(failed_error(Some(why))));
            }
            Command::CancelAll => {}
            Command::Shutdown => return,
        }
    }
}
