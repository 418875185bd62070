//! The engine thread behind [`EngineHandle`] (DESIGN.md §5): a synchronous loop that owns the backend and the
//! model, fed by a command channel (submit, cancel, shutdown) and answering each request through its own event
//! sink. Every request goes through the one engine loop (`core.rs`): up to `parallel` sequences share each
//! round; waiting requests queue (interactive before background) up to a bound, beyond which `submit` refuses at
//! once.
//!
//! Nothing here uses an async runtime: the server wraps the sink around its own channel.

use crate::core::{Core, Entry};
use crate::generate::{EngineError, Flow, GenOutput, GenRequest, Generator, TokenEvent};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tf_core::Backend;
use tf_models::Model;

/// What a request's sink receives, in this order: `Started`, then `Token`s, then exactly one `Done` or
/// `Error` (also when the request was cancelled while waiting).
#[derive(Clone, Debug)]
pub enum EngineEvent {
    /// The request left the queue and its prompt is being filled.
    Started {
        queued_s: f64,
    },
    Token(TokenEvent),
    Done(GenOutput),
    Error(EngineError),
}

/// Called on the engine thread for every event of one request. Returning [`Flow::Stop`] from a `Token` ends the
/// request after that token (stop strings, a client that went away). Keep it cheap: it runs between rounds.
pub type EventSink = Box<dyn FnMut(EngineEvent) -> Flow + Send>;

/// Scheduling class of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Priority {
    #[default]
    Interactive,
    /// Waits behind every interactive request.
    Background,
}

/// Why `submit` refused a request (nothing was queued).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The waiting queue holds `max_waiting` requests already.
    QueueFull { max_waiting: usize },
    /// The engine is shutting down (or its thread is gone).
    ShuttingDown,
    /// The engine failed (its thread panicked; the reason): the server is stopping.
    Failed(String),
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::QueueFull { max_waiting } => {
                write!(f, "the server is busy: {max_waiting} requests are already waiting; retry later")
            }
            SubmitError::ShuttingDown => write!(f, "the server is shutting down"),
            SubmitError::Failed(why) => write!(f, "the engine failed: {why}; the server is stopping"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// How the engine thread is set up.
#[derive(Clone)]
pub struct EngineConfig {
    /// KV blocks in the pool and token slots per block.
    pub kv_blocks: usize,
    pub block_size: usize,
    /// Requests allowed to wait (beyond the running one) before `submit` refuses.
    pub max_waiting: usize,
    /// Most rows per verify window; below 2, no drafting. Drafting starts only if the load-time self-check
    /// passes.
    pub max_window: usize,
    /// The proposer per request (`None`: context copies).
    pub proposer: Option<crate::ProposerFactory>,
    /// Drafts every drafted round verifies at least ([`crate::DraftConfig::min_drafts`]).
    pub min_drafts: usize,
    /// Keep full KV blocks after each request for later requests that start the same way.
    pub prefix_cache: bool,
    /// Sequences admitted at once, sharing each round (1: one request at a time).
    pub parallel: usize,
    /// Most rows in one shared round (windows first, then prompt chunks).
    pub max_rows: usize,
    /// Rounds of greedy one-row steps run ahead of the host on a backend that queues ids (`ahead.rs`); off, each
    /// step waits for the host (the same tokens; for measurements).
    pub run_ahead: bool,
    /// The tokenizer's vocabulary size when the model's head is wider (padding rows never drawn); `None`: every
    /// id of the head is a token.
    pub token_limit: Option<usize>,
}

/// Time-to-first-token histogram bucket bounds in seconds (vLLM's).
pub const TTFT_BUCKETS: [f64; 14] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0];

/// Live counters, shared with whoever reports them (`/health`, `/metrics`, the terminal line).
#[derive(Debug, Default)]
pub struct EngineStats {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    /// Blocks held by running requests (cached prefix blocks they reuse included).
    pub kv_blocks_used: AtomicUsize,
    /// Blocks held only by the prefix cache (reusable, evicted when a request needs room).
    pub kv_blocks_cached: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    /// Prompt tokens looked up in the prefix cache, and found there.
    pub prefix_query_tokens: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    /// Requests finished, by how: stop / length / cancelled / error.
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub finished_cancelled: AtomicU64,
    pub finished_error: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub drafted_tokens: AtomicU64,
    /// Background streams preempted (KV released) to make room for interactive ones.
    pub preemptions: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Sums of seconds spent queued, filling prompts and decoding, in microseconds.
    pub queue_us: AtomicU64,
    pub prefill_us: AtomicU64,
    pub decode_us: AtomicU64,
    /// Time to first token: counts per bucket of [`TTFT_BUCKETS`] (+Inf last), their sum in µs.
    pub ttft_buckets: [AtomicU64; TTFT_BUCKETS.len() + 1],
    pub ttft_sum_us: AtomicU64,
    /// Decode speed of the running request (tokens/s × 1000), 0 when idle.
    pub live_decode_milli_tps: AtomicU64,
}

impl EngineStats {
    pub(crate) fn observe_ttft(&self, s: f64) {
        let i = TTFT_BUCKETS.iter().position(|&b| s <= b).unwrap_or(TTFT_BUCKETS.len());
        self.ttft_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.ttft_sum_us.fetch_add(micros(s), Ordering::Relaxed);
    }

    pub fn finished_total(&self) -> u64 {
        self.finished_stop.load(Ordering::Relaxed)
            + self.finished_length.load(Ordering::Relaxed)
            + self.finished_cancelled.load(Ordering::Relaxed)
            + self.finished_error.load(Ordering::Relaxed)
    }
}

pub(crate) fn micros(s: f64) -> u64 {
    (s * 1e6).max(0.0) as u64
}

/// Cancel flags of the requests not yet finished, by id.
pub(crate) type LiveList = Arc<Mutex<Vec<(u64, Arc<AtomicBool>)>>>;

/// A queued request: cancel it with [`Ticket::cancel`] (its sink still gets its final event).
#[derive(Clone, Debug)]
pub struct Ticket {
    pub id: u64,
    cancel: Arc<AtomicBool>,
}

impl Ticket {
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) req: GenRequest,
    pub(crate) priority: Priority,
    pub(crate) sink: EventSink,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) queued_at: Instant,
}

pub(crate) enum Command {
    Submit(Box<Job>),
    /// Cancel every waiting and running request (shutdown with a bound).
    CancelAll,
    Shutdown,
}

/// Static facts about the loaded engine.
#[derive(Clone, Debug)]
pub struct EngineInfo {
    pub vocab_size: usize,
    pub context_length: usize,
    pub kv_blocks: usize,
    pub block_size: usize,
    /// What turning drafting on found (measured window costs, self-check).
    pub drafting: crate::draft::DraftSetup,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    stats: Arc<EngineStats>,
    info: EngineInfo,
    max_waiting: usize,
    next_id: Arc<AtomicU64>,
    accepting: Arc<AtomicBool>,
    /// How the engine thread ended, once it has (failure.rs).
    ending: Arc<crate::failure::Ending>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Cancel flags of every request not yet finished, so `cancel_all` reaches the running one at once.
    live: LiveList,
}

impl EngineHandle {
    /// Starts the engine thread; allocates the KV pool on `backend` first (an error here is returned).
    pub fn spawn(
        backend: Arc<dyn Backend>,
        model: Box<dyn Model>,
        cfg: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        let mut kv = backend.alloc_kv(model.kv_spec(cfg.kv_blocks, cfg.block_size))?;
        crate::generate::alloc_states(backend.as_ref(), model.as_ref(), &mut kv)?;
        let (vocab_size, context_length) = (model.vocab_size(), model.context_length());
        let stats = Arc::new(EngineStats::default());
        stats.kv_blocks_total.store(cfg.kv_blocks, Ordering::Relaxed);
        let live: LiveList = Arc::default();
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread_stats = stats.clone();
        let thread_live = live.clone();
        let (max_window, proposer, min_drafts) = (cfg.max_window, cfg.proposer.clone(), cfg.min_drafts);
        let (prefix_cache, run_ahead, token_limit) = (cfg.prefix_cache, cfg.run_ahead, cfg.token_limit);
        let (parallel, max_rows) = (cfg.parallel, cfg.max_rows);
        let accepting = Arc::new(AtomicBool::new(true));
        let ending = Arc::new(crate::failure::Ending::default());
        let (thread_accepting, thread_ending) = (accepting.clone(), ending.clone());
        let thread = std::thread::Builder::new()
            .name("tensorfold-engine".into())
            .spawn(move || {
                // A panic anywhere below (failure.rs): the requests it drops get an error event from their
                // guarded sinks while it unwinds; then the failure is recorded and later requests refused.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut g = Generator::with_kv(backend.as_ref(), model.as_ref(), kv);
                    let setup = g.setup_drafting(max_window, proposer, min_drafts);
                    g.set_prefix_cache(prefix_cache);
                    g.set_run_ahead(run_ahead);
                    if let Some(n) = token_limit {
                        g.set_token_limit(n);
                    }
                    let ok = setup.is_ok();
                    let _ = ready_tx.send(setup);
                    if ok {
                        engine_loop(&mut g, &rx, &thread_stats, &thread_live, parallel, max_rows);
                    }
                }));
                match run {
                    Ok(()) => thread_ending.set(None),
                    Err(payload) => {
                        let why = crate::failure::panic_message(payload.as_ref());
                        thread_accepting.store(false, Ordering::SeqCst);
                        thread_ending.set(Some(why.clone()));
                        drop(ready_tx);
                        crate::failure::refuse_until_shutdown(&rx, &why);
                    }
                }
            })
            .map_err(|e| EngineError::Model(format!("cannot start the engine thread: {e}")))?;
        let drafting = match ready_rx.recv() {
            Ok(Ok(setup)) => setup,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                let why = ending.failure().map_or_else(String::new, |w| format!(": {w}"));
                return Err(EngineError::Model(format!("the engine thread stopped while starting{why}")));
            }
        };
        let info =
            EngineInfo { vocab_size, context_length, kv_blocks: cfg.kv_blocks, block_size: cfg.block_size, drafting };
        Ok(EngineHandle {
            tx,
            stats,
            info,
            max_waiting: cfg.max_waiting,
            next_id: Arc::new(AtomicU64::new(1)),
            accepting,
            ending,
            thread: Arc::new(Mutex::new(Some(thread))),
            live,
        })
    }

    /// Why the engine failed (its thread panicked: failure.rs), once it has; it then refuses every request.
    pub fn failure(&self) -> Option<String> {
        self.ending.failure()
    }

    /// Blocks until the engine thread has ended (after [`Self::shutdown`], or when it fails); its failure, if
    /// it failed. For a server that must stop when its engine is gone.
    pub fn wait_end(&self) -> Option<String> {
        self.ending.wait()
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Relaxed)
    }

    /// Queues a request. Refuses at once when the queue is full or the engine is shutting down.
    pub fn submit(&self, mut req: GenRequest, priority: Priority, sink: EventSink) -> Result<Ticket, SubmitError> {
        if let Some(why) = self.failure() {
            return Err(SubmitError::Failed(why));
        }
        if !self.is_accepting() {
            return Err(SubmitError::ShuttingDown);
        }
        let sink = crate::failure::guarded(sink);
        // Reserve a waiting place atomically; undo on any refusal.
        let prev = self.stats.waiting.fetch_add(1, Ordering::SeqCst);
        if prev >= self.max_waiting {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull { max_waiting: self.max_waiting });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let cancel = req.cancel.clone().unwrap_or_default();
        req.cancel = Some(cancel.clone());
        self.live.lock().unwrap_or_else(|p| p.into_inner()).push((id, cancel.clone()));
        let job = Job { id, req, priority, sink, cancel: cancel.clone(), queued_at: Instant::now() };
        if self.tx.send(Command::Submit(Box::new(job))).is_err() {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
            self.forget(id);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(Ticket { id, cancel })
    }

    fn forget(&self, id: u64) {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    }

    /// Stops accepting new requests (existing ones continue).
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Relaxed);
    }

    /// Cancels every waiting and running request; each sink gets its final event.
    pub fn cancel_all(&self) {
        for (_, c) in self.live.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            c.store(true, Ordering::Relaxed);
        }
        let _ = self.tx.send(Command::CancelAll);
    }

    /// Stops accepting, lets the engine finish what it has (call [`Self::cancel_all`] first to bound that) and
    /// joins the engine thread. Idempotent.
    pub fn shutdown(&self) {
        self.stop_accepting();
        let _ = self.tx.send(Command::Shutdown);
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Takes every command waiting in `rx` (blocking for one first when `block`), new requests into `inbox` in
/// arrival order; returns false when the channel is gone (every handle dropped). The scheduler orders them
/// (interactive first).
fn drain(rx: &mpsc::Receiver<Command>, inbox: &mut Vec<Job>, shutting_down: &mut bool, block: bool) -> bool {
    let mut first = block;
    loop {
        let cmd = if first {
            first = false;
            match rx.recv() {
                Ok(c) => c,
                Err(_) => return false,
            }
        } else {
            match rx.try_recv() {
                Ok(c) => c,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => {
                    *shutting_down = true;
                    return true;
                }
            }
        };
        match cmd {
            Command::Submit(job) => inbox.push(*job),
            Command::CancelAll => {
                for job in inbox.iter() {
                    job.cancel.store(true, Ordering::Relaxed);
                }
            }
            Command::Shutdown => *shutting_down = true,
        }
    }
}

/// The engine thread's loop: commands in, one [`Core::step`] per turn while anything is queued or running.
fn engine_loop(
    g: &mut Generator<'_>,
    rx: &mpsc::Receiver<Command>,
    stats: &EngineStats,
    live: &LiveList,
    parallel: usize,
    max_rows: usize,
) {
    let forget = |id: u64| live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
    let mut core = Core::new(g, stats, &forget, parallel, max_rows);
    let mut inbox = Vec::new();
    let mut shutting_down = false;
    loop {
        let idle = core.is_idle() && inbox.is_empty();
        let block = idle && !shutting_down;
        if !drain(rx, &mut inbox, &mut shutting_down, block) && idle {
            return;
        }
        for job in inbox.drain(..) {
            let Job { id, req, priority, sink, cancel, queued_at } = job;
            core.submit(g, Entry { id, req, priority, sink, cancel, queued_at });
        }
        if core.is_idle() {
            if shutting_down {
                return;
            }
            continue;
        }
        core.step(g);
    }
}
