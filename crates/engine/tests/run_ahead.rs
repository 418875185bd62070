//! Serial greedy decoding that runs ahead of the host (`ahead.rs`): on a backend that queues ids, each step is
//! queued fed by the previous step's argmax before the engine takes that argmax. Checked on the fake model
//! (tests/fake) behind a backend that really defers its argmaxes until they are taken or fed:
//! - replies (tokens, events, finish reasons) equal the definition's and a run with running ahead off, for
//!   replies that end at `max_tokens`, at a stop id, by the caller's `Flow::Stop` and by a cancel flag;
//! - the pipeline is real: every step but the first decode step is fed by a queued id, and the engine takes a
//!   step's id only after the next step was queued; exactly one step is wasted when a reply ends early, none at
//!   `max_tokens`;
//! - requests that need the host (sampling, logprobs, penalties, drafting) and backends that do not queue never
//!   run ahead;
//! - a backend that feeds a different id than it hands to the host changes the replies (the fed path is used).

#[allow(dead_code)]
#[macro_use]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tf_core::{Backend, KvCache, KvSpec, QueuedIds, Tensor, Weight};
use tf_engine::{
    CostTable, DraftConfig, FinishReason, Flow, GenOutput, GenRequest, Generator, SamplingParams, TokenEvent,
};

const VOCAB: usize = 11;

/// What happened on the queueing backend, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// Argmax number `n` was queued.
    Queue(usize),
    /// Argmax number `n` was read (by the engine, or by the fake model feeding it to a forward).
    Take(usize),
}

/// One deferred argmax: the logits it will be computed from.
struct Deferred {
    n: usize,
    logits: Tensor,
}

/// The fake backend with argmaxes that exist only once taken: `argmax_rows_queued` keeps the logits and a
/// number; `take_ids` computes them then (the fake model reads fed ids with it, inside the forward they feed).
/// `queues` says whether it claims to queue ids at all.
struct Queueing {
    inner: FakeBackend,
    queues: bool,
    next: AtomicUsize,
    log: Mutex<Vec<Event>>,
}

impl Queueing {
    fn new(queues: bool) -> Queueing {
        Queueing { inner: FakeBackend, queues, next: AtomicUsize::new(0), log: Mutex::default() }
    }

    fn events(&self) -> Vec<Event> {
        self.log.lock().unwrap().clone()
    }

    fn reset(&self) {
        self.log.lock().unwrap().clear();
        self.next.store(0, Ordering::SeqCst);
    }
}

impl Backend for Queueing {
    forward_backend_to_inner!();
    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        self.inner.to_host(x)
    }
    fn queues_ids(&self) -> bool {
        self.queues
    }
    fn argmax_rows_queued(&self, x: &Tensor) -> QueuedIds {
        assert!(self.queues, "argmax_rows_queued on a backend that does not queue");
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push(Event::Queue(n));
        QueuedIds { rows: x.rows, host: None, device: Some(Arc::new(Deferred { n, logits: x.clone() })) }
    }
    fn take_ids(&self, ids: &QueuedIds) -> Vec<u32> {
        let d = ids.device.as_ref().and_then(|s| s.downcast_ref::<Deferred>()).expect("ids this backend queued");
        self.log.lock().unwrap().push(Event::Take(d.n));
        self.inner.argmax_rows(&d.logits)
    }
    fn embed_queued(&self, _table: &Weight, _ids: &QueuedIds) -> Tensor {
        unreachable!("the fake model reads queued ids with take_ids")
    }
}

/// The fake model fed the id after each queued one: a backend whose fed ids differ from those it hands the host.
struct Skewed<'m> {
    model: &'m FakeModel,
}

impl tf_models::Model for Skewed<'_> {
    fn family(&self) -> &'static str {
        self.model.family()
    }
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }
    fn context_length(&self) -> usize {
        self.model.context_length()
    }
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        self.model.kv_spec(blocks, block_size)
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn forward(&self, be: &dyn Backend, batch: &tf_models::Batch, kv: &mut KvCache) -> Tensor {
        let mut b = batch.clone();
        if let Some(q) = &batch.fed {
            b.tokens = be.take_ids(q).into_iter().map(|t| (t + 1) % VOCAB as u32).collect();
            b.fed = None;
        }
        self.model.forward(be, &b, kv)
    }
}

fn greedy(seed: u64) -> SamplingParams {
    SamplingParams { seed: Some(seed), ..SamplingParams::greedy() }
}

fn request(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> GenRequest {
    let mut r = GenRequest::new(prompt, params, max_tokens);
    r.logprobs = false;
    r.prefill_chunk = 4;
    r
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![3],
        (0..9u32).map(|i| (i * 5 + 1) % VOCAB as u32).collect(),
        (0..23u32).map(|i| (i * i + 3) % VOCAB as u32).collect(),
    ]
}

/// A solo reply on a fresh generator; `stop_after`: the callback answers `Flow::Stop` at that event index.
fn solo(
    be: &dyn Backend,
    model: &dyn tf_models::Model,
    ahead: bool,
    req: &GenRequest,
    stop_after: Option<usize>,
) -> (GenOutput, Vec<TokenEvent>) {
    let mut g = Generator::new(be, model, 32, 4).unwrap();
    g.set_run_ahead(ahead);
    let mut events = Vec::new();
    let out = g
        .generate(req, &mut |e| {
            let stop = stop_after == Some(e.index);
            events.push(e);
            if stop {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    (out, events)
}

/// Checks the order of `log` for a run-ahead reply that queued `steps` decode forwards (`wasted` of them past
/// its end): the engine reads argmax `n` only after argmax `n + 1` was queued (fed by it, while it runs).
fn assert_pipelined(log: &[Event], steps: usize, wasted: usize) {
    let queued = log.iter().filter(|e| matches!(e, Event::Queue(_))).count();
    assert_eq!(queued, steps, "queued argmaxes: {log:?}");
    for n in 0..steps - 1 {
        let q_next = log.iter().position(|&e| e == Event::Queue(n + 1)).unwrap();
        let last_take = log.iter().rposition(|&e| e == Event::Take(n)).unwrap();
        assert!(last_take > q_next, "argmax {n} taken before argmax {} was queued: {log:?}", n + 1);
    }
    let last = steps - 1;
    let takes_of_last = log.iter().filter(|&&e| e == Event::Take(last)).count();
    // A wasted step's argmax is never read; else the engine reads the last one once.
    assert_eq!(takes_of_last, 1 - wasted, "reads of the last queued argmax: {log:?}");
}

#[test]
fn running_ahead_gives_the_serial_reply_and_really_pipelines() {
    let model = FakeModel::new(VOCAB, 256);
    let host = FakeBackend;
    let be = Queueing::new(true);
    for (i, prompt) in prompts().into_iter().enumerate() {
        for max_tokens in [1, 2, 3, 17] {
            let req = request(prompt.clone(), greedy(i as u64), max_tokens);
            let (serial, serial_events) = solo(&host, &model, false, &req, None);
            assert_eq!(serial.tokens, fake::reference_reply(&req, i as u64, VOCAB), "the serial run");
            be.reset();
            model.reset_counts();
            let (ahead, events) = solo(&be, &model, true, &req, None);
            assert_eq!(ahead.tokens, serial.tokens, "prompt {i}, max_tokens {max_tokens}");
            assert_eq!(ahead.finish_reason, FinishReason::Length);
            assert_eq!(format!("{events:?}"), format!("{serial_events:?}"), "the same events");
            assert_eq!(ahead.counts.rounds, serial.counts.rounds, "decode rounds");
            // One forward per prompt chunk and one per decode step, nothing wasted at max_tokens.
            let chunks = prompt.len().div_ceil(4);
            assert_eq!(model.forwards.load(Ordering::SeqCst), chunks + max_tokens - 1);
            if max_tokens >= 2 {
                // (The prompt's last row is a plain argmax taken at once, not queued.)
                assert_pipelined(&be.events(), max_tokens - 1, 0);
            }
        }
    }
}

#[test]
fn a_reply_that_ends_early_wastes_exactly_one_queued_step() {
    let model = FakeModel::new(VOCAB, 256);
    let host = FakeBackend;
    let be = Queueing::new(true);
    let prompt: Vec<u32> = (0..9u32).map(|i| (i * 5 + 1) % VOCAB as u32).collect();
    let free = request(prompt.clone(), greedy(5), 30);
    let reply = fake::reference_reply(&free, 5, VOCAB);
    // Stop at the fifth token's id (its first occurrence ends the reply).
    let mut stopped = free.clone();
    stopped.stop_ids = vec![reply[4]];
    let want = fake::reference_reply(&stopped, 5, VOCAB);
    assert!(want.len() >= 2 && want.len() < 30, "the stop id ends the reply early: {want:?}");
    let (serial, _) = solo(&host, &model, false, &stopped, None);
    assert_eq!(serial.tokens, want);
    be.reset();
    model.reset_counts();
    let (ahead, _) = solo(&be, &model, true, &stopped, None);
    assert_eq!((ahead.tokens.clone(), ahead.finish_reason), (want.clone(), FinishReason::Stop));
    let chunks = prompt.len().div_ceil(4);
    assert_eq!(model.forwards.load(Ordering::SeqCst), chunks + want.len(), "one step past the stop");
    assert_pipelined(&be.events(), want.len(), 1);

    // The caller stops after the third token: the same events as serial decoding, one step wasted.
    let (serial, serial_events) = solo(&host, &model, false, &free, Some(2));
    assert_eq!(serial.tokens, reply[..3]);
    be.reset();
    model.reset_counts();
    let (ahead, events) = solo(&be, &model, true, &free, Some(2));
    assert_eq!((ahead.tokens, ahead.finish_reason), (serial.tokens, FinishReason::Cancelled));
    assert_eq!(format!("{events:?}"), format!("{serial_events:?}"));
    assert_eq!(model.forwards.load(Ordering::SeqCst), chunks + 3);

    // A cancel flag raised by the callback at the fourth token.
    let flag = Arc::new(AtomicBool::new(false));
    let mut cancel = free.clone();
    cancel.cancel = Some(flag.clone());
    let mut g = Generator::new(&be, &model, 32, 4).unwrap();
    let out = g
        .generate(&cancel, &mut |e| {
            if e.index == 3 {
                flag.store(true, Ordering::SeqCst);
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!((out.tokens, out.finish_reason), (reply[..4].to_vec(), FinishReason::Cancelled));
}

#[test]
fn requests_that_need_the_host_and_backends_that_do_not_queue_never_run_ahead() {
    let model = FakeModel::new(VOCAB, 256);
    let prompt: Vec<u32> = (0..9u32).map(|i| (i * 3 + 2) % VOCAB as u32).collect();
    let sampled = SamplingParams { temperature: 0.8, top_k: 5, seed: Some(3), ..SamplingParams::default() };
    let penalized = SamplingParams { repetition_penalty: 1.3, ..greedy(3) };
    let mut logprobs = request(prompt.clone(), greedy(3), 12);
    logprobs.logprobs = true;
    let cases = [request(prompt.clone(), sampled, 12), request(prompt.clone(), penalized, 12), logprobs];
    let be = Queueing::new(true);
    for req in &cases {
        be.reset();
        let (out, _) = solo(&be, &model, true, req, None);
        assert_eq!(out.tokens, fake::reference_reply(req, 3, VOCAB));
        assert!(be.events().is_empty(), "{:?} queued argmaxes: {:?}", req.params, be.events());
    }
    // Drafted decoding verifies windows on the host's side of each round.
    let mut g = Generator::new(&be, &model, 32, 4).unwrap();
    g.set_drafting(Some(DraftConfig::new(4, CostTable::from_widths(&[1e-3; 4]))));
    let mut req = request([1u32, 2, 3, 1, 2, 4, 1, 2, 3].repeat(3), greedy(3), 12);
    req.draft = true;
    be.reset();
    let out = g.generate(&req, &mut |_| Flow::Continue).unwrap();
    assert_eq!(out.tokens, fake::reference_reply(&req, 3, VOCAB));
    assert!(out.counts.drafted > 0, "the drafted run drafted");
    assert!(!be.events().iter().any(|e| matches!(e, Event::Queue(_))), "a drafted reply queued: {:?}", be.events());
    // A backend that does not queue: the loop of serial decoding (its argmax_rows_queued would panic).
    let plain = Queueing::new(false);
    let req = request(prompt, greedy(3), 12);
    let (out, _) = solo(&plain, &model, true, &req, None);
    assert_eq!(out.tokens, fake::reference_reply(&req, 3, VOCAB));
}

#[test]
fn a_wrong_fed_id_changes_the_reply() {
    let model = FakeModel::new(VOCAB, 256);
    let skewed = Skewed { model: &model };
    let be = Queueing::new(true);
    let mut differ = 0;
    for (i, prompt) in prompts().into_iter().enumerate() {
        let req = request(prompt, greedy(i as u64), 12);
        let (out, _) = solo(&be, &skewed, true, &req, None);
        differ += usize::from(out.tokens != fake::reference_reply(&req, i as u64, VOCAB));
        // Without running ahead nothing is fed: the skew never applies.
        let (out, _) = solo(&be, &skewed, false, &req, None);
        assert_eq!(out.tokens, fake::reference_reply(&req, i as u64, VOCAB));
    }
    assert_eq!(differ, prompts().len(), "every reply fed wrong ids differs from the definition");
}

/// Several greedy sequences sharing rounds run ahead together (one queued row each, fed by the previous round's
/// queued ids), ending at different lengths: every reply equals the serial definition.
#[test]
fn shared_greedy_rounds_run_ahead_and_equal_serial() {
    let model = FakeModel::new(VOCAB, 256);
    let be = Queueing::new(true);
    let mut g = Generator::new(&be, &model, 64, 4).unwrap();
    let reqs: Vec<GenRequest> =
        prompts().into_iter().enumerate().map(|(i, p)| request(p, greedy(i as u64), 5 + 4 * i)).collect();
    let items: Vec<(GenRequest, tf_engine::OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as tf_engine::OnToken<'_>)).collect();
    let outs = g.generate_many(items, 64);
    for (i, (r, o)) in reqs.iter().zip(outs).enumerate() {
        assert_eq!(o.unwrap().tokens, fake::reference_reply(r, i as u64, VOCAB), "request {i}");
    }
    let queued = be.events().iter().filter(|e| matches!(e, Event::Queue(_))).count();
    assert!(queued > 0, "the shared rounds were queued ahead");
    assert_eq!(g.pool().free_blocks(), 64);
}
