//! Greedy requests take their tokens from `Backend::argmax_rows` instead of downloading the logits, and the
//! tokens are the same:
//! - the sampler's greedy draw equals `tf_core::argmax_row` on random rows with ties, NaN, ±0, ±∞ (property test);
//! - serial, drafted (chains, trees, a draft model) and shared-round replies equal the definition's reply and a
//!   run with the path off (whose backend panics if asked for an argmax), with the number of argmax calls and
//!   downloads the design says;
//! - requests that need the values (logprobs, alternatives, sampling, penalties after the first token, a logit
//!   bias, prompt logprobs, scoring, the drafting self-check) never ask for an argmax;
//! - a backend that returns wrong argmaxes changes the replies: the path really feeds the emitted tokens.

#[allow(dead_code)]
#[macro_use]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tf_core::{Backend, Tensor};
use tf_engine::spec::Proposer;
use tf_engine::{
    greedy_on_device, model_proposer_factory, ngram_proposer, sample_token, CostTable, DraftConfig, DraftModel, Flow,
    GenOutput, GenRequest, Generator, ModelProposer, OnToken, SamplingParams,
};

const VOCAB: usize = 13;

/// What the wrapper does when asked for argmaxes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Forwards to the fake backend (the default rule on its host data).
    Delegate,
    /// Panics: the reference runs, which must never ask.
    Forbid,
    /// Returns the id after the true argmax: a wrong answer that must show in the replies.
    Sabotage,
}

/// The fake backend behind a wrapper that counts argmax calls (and their rows) and downloads.
struct Counting {
    inner: FakeBackend,
    mode: Mode,
    argmax_calls: AtomicUsize,
    argmax_rows: AtomicUsize,
    downloads: AtomicUsize,
}

impl Counting {
    fn new(mode: Mode) -> Counting {
        Counting {
            inner: FakeBackend,
            mode,
            argmax_calls: AtomicUsize::new(0),
            argmax_rows: AtomicUsize::new(0),
            downloads: AtomicUsize::new(0),
        }
    }

    fn calls(&self) -> usize {
        self.argmax_calls.load(Ordering::SeqCst)
    }

    fn downloads(&self) -> usize {
        self.downloads.load(Ordering::SeqCst)
    }

    fn reset(&self) {
        for c in [&self.argmax_calls, &self.argmax_rows, &self.downloads] {
            c.store(0, Ordering::SeqCst);
        }
    }
}

impl Backend for Counting {
    forward_backend_to_inner!();
    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        self.downloads.fetch_add(1, Ordering::SeqCst);
        self.inner.to_host(x)
    }
    fn argmax_rows(&self, x: &Tensor) -> Vec<u32> {
        assert!(self.mode != Mode::Forbid, "argmax_rows called on a run that must download the logits");
        self.argmax_calls.fetch_add(1, Ordering::SeqCst);
        self.argmax_rows.fetch_add(x.rows, Ordering::SeqCst);
        let ids = self.inner.argmax_rows(x);
        match self.mode {
            Mode::Sabotage => ids.into_iter().map(|t| (t + 1) % x.cols as u32).collect(),
            _ => ids,
        }
    }
}

fn reference(req: &GenRequest) -> Vec<u32> {
    fake::reference_reply(req, req.params.seed.expect("tests set seeds"), VOCAB)
}

fn greedy(seed: u64) -> SamplingParams {
    SamplingParams { seed: Some(seed), ..SamplingParams::greedy() }
}

fn penalized(seed: u64) -> SamplingParams {
    SamplingParams { repetition_penalty: 1.3, presence_penalty: 0.4, frequency_penalty: 0.2, ..greedy(seed) }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 6, top_p: 0.95, seed: Some(seed), ..SamplingParams::default() }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..9u32).map(|i| (i * 5 + 1) % VOCAB as u32).collect(),
        // Repetitive: context copies find matches (and several continuations: tree windows).
        [1u32, 2, 3, 1, 2, 4, 1, 2, 3, 5].repeat(4),
        vec![7],
        (0..40u32).map(|i| (i * i + 3) % VOCAB as u32).collect(),
    ]
}

/// A greedy request without logprobs: every row may take the device argmax.
fn request(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> GenRequest {
    let mut r = GenRequest::new(prompt, params, max_tokens);
    r.logprobs = false;
    r.prefill_chunk = 5;
    r
}

/// How a generator drafts: serial, context-copy chains, or context-copy trees (up to 3 continuations).
#[derive(Clone, Copy, Debug)]
enum Drafting {
    Serial,
    Chains(usize),
    Trees(usize),
}

fn set_drafting(g: &mut Generator<'_>, d: Drafting) {
    let costs = |w: usize| CostTable::from_widths(&vec![1e-3; w]);
    g.set_drafting(match d {
        Drafting::Serial => None,
        Drafting::Chains(w) => Some(DraftConfig::new(w, costs(w))),
        Drafting::Trees(w) => {
            let mut c = DraftConfig::new(w, costs(w));
            c.proposer = Some(Arc::new(|_: &GenRequest| ngram_proposer(3)));
            Some(c)
        }
    });
}

const DRAFTINGS: [Drafting; 5] =
    [Drafting::Serial, Drafting::Chains(2), Drafting::Chains(5), Drafting::Trees(4), Drafting::Trees(9)];

/// One solo reply on a fresh generator over `be` (device argmax `on` or off).
fn solo(be: &Counting, model: &FakeModel, d: Drafting, on: bool, req: &GenRequest) -> GenOutput {
    let mut g = Generator::new(be, model, 64, 8).unwrap();
    set_drafting(&mut g, d);
    g.set_device_argmax(on);
    g.generate(req, &mut |_| Flow::Continue).unwrap()
}

/// xorshift64*, seeded from the clock (printed, and again on failure); `TF_SEED` replays one.
struct Rng(u64);

impl Rng {
    fn from_env() -> (Rng, SeedGuard) {
        let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 40)
        });
        eprintln!("TF_SEED={seed}");
        (Rng(seed | 1), SeedGuard(seed))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn coin(&mut self) -> bool {
        self.next() >> 63 == 1
    }
}

struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failed with TF_SEED={} (set it to replay)", self.0);
        }
    }
}

/// A random row of `n` logits of one of several kinds: plain values, ties at the maximum, NaN among them, ±0 as
/// the maximum, +∞ twice, every value −∞, every value NaN, NaN and −∞ only, few distinct values.
fn special_row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let nan = |rng: &mut Rng| f32::from_bits(0x7fc0_0000 | (rng.next() as u32 & 0x803f_ffff));
    let mut row: Vec<f32> = (0..n).map(|_| ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 20.0).collect();
    let kind = rng.below(9);
    let at = |rng: &mut Rng| rng.below(n);
    match kind {
        0 => {}
        1 => {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for _ in 0..1 + rng.below(4) {
                let i = at(rng);
                row[i] = m;
            }
        }
        2 => {
            for _ in 0..1 + rng.below(n.min(50)) {
                let i = at(rng);
                row[i] = nan(rng);
            }
        }
        3 => {
            for v in row.iter_mut() {
                *v = -v.abs() - 1.0;
            }
            for _ in 0..1 + rng.below(4) {
                let i = at(rng);
                row[i] = if rng.coin() { 0.0 } else { -0.0 };
            }
        }
        4 => {
            for _ in 0..2 {
                let i = at(rng);
                row[i] = f32::INFINITY;
            }
        }
        5 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
        6 => {
            for v in row.iter_mut() {
                *v = nan(rng);
            }
        }
        7 => {
            for v in row.iter_mut() {
                *v = if rng.coin() { nan(rng) } else { f32::NEG_INFINITY };
            }
        }
        _ => {
            for v in row.iter_mut() {
                *v = (rng.below(5) as f32 - 2.0) * if rng.coin() { 1.0 } else { -1.0 };
            }
        }
    }
    // Sometimes the maximum sits at either end.
    if kind < 5 && n > 1 && rng.below(4) == 0 {
        let m = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        let i = if rng.coin() { 0 } else { n - 1 };
        row[i] = m;
    }
    row
}

#[test]
fn the_samplers_greedy_draw_is_tf_core_argmax_row() {
    let (mut rng, _guard) = Rng::from_env();
    // Greedy with penalties draws the plain argmax too while the reply is empty (what greedy_on_device allows).
    let params =
        [SamplingParams::greedy(), SamplingParams { temperature: -1.0, ..SamplingParams::greedy() }, penalized(3)];
    let mut kinds_seen = 0;
    for case in 0..3000 {
        let n = [1usize, 2, 3, 7, 31, 32, 33, 300, 1000][case % 9];
        let row = special_row(&mut rng, n);
        let want = tf_core::argmax_row(&row);
        for p in &params {
            let got = sample_token(&row, p, rng.next(), rng.next() % 1000, &[]);
            assert_eq!(got, want, "case {case}: {p:?} on {row:?}");
        }
        kinds_seen += usize::from(row.iter().all(|v| v.is_nan()));
    }
    assert!(kinds_seen > 0, "no all-NaN row was generated: the generator lost a kind");
}

#[test]
fn serial_and_drafted_greedy_replies_take_device_argmaxes() {
    let model = FakeModel::new(VOCAB, 512);
    let (on, off) = (Counting::new(Mode::Delegate), Counting::new(Mode::Forbid));
    for d in DRAFTINGS {
        for prompt in prompts() {
            for params in [greedy(1), greedy(5), penalized(2)] {
                let req = request(prompt.clone(), params.clone(), 30);
                on.reset();
                let got = solo(&on, &model, d, true, &req);
                let want = solo(&off, &model, d, false, &req);
                let what = format!("{d:?}, prompt {prompt:?}, {params:?}");
                assert_eq!(got.tokens, reference(&req), "{what}");
                assert_eq!(got.tokens, want.tokens, "{what}");
                assert_eq!(got.counts, want.counts, "{what}: the same rounds and acceptances");
                // Each forward with logits rows either asks for argmaxes or downloads, never both: the prompt's
                // last chunk, then one forward per round.
                let forwards = 1 + got.counts.rounds;
                if params.has_penalty() {
                    // Only the first token, drawn after an empty reply, escapes the penalties.
                    assert_eq!((on.calls(), on.downloads()), (1, forwards - 1), "{what}");
                } else {
                    assert_eq!((on.calls(), on.downloads()), (forwards, 0), "{what}: no logits downloaded");
                }
            }
        }
    }
    assert_eq!(off.calls(), 0);
}

#[test]
fn requests_that_need_the_values_never_ask_for_argmaxes() {
    let model = FakeModel::new(VOCAB, 512);
    // The path is on, but the backend panics if asked.
    let be = Counting::new(Mode::Forbid);
    for d in DRAFTINGS {
        for prompt in prompts() {
            let mut with_logprob = request(prompt.clone(), greedy(1), 20);
            with_logprob.logprobs = true;
            let mut with_top = request(prompt.clone(), greedy(1), 20);
            with_top.top_logprobs = 2;
            let sampled = request(prompt.clone(), sampled(4), 20);
            // A logit bias changes the values: the argmax of the raw logits is not the draw.
            let biased =
                request(prompt.clone(), SamplingParams { logit_bias: vec![(1, -3.0), (4, 2.5)], ..greedy(2) }, 20);
            for req in [with_logprob, with_top, sampled, biased] {
                let out = solo(&be, &model, d, true, &req);
                assert_eq!(out.tokens, reference(&req), "{d:?}, prompt {prompt:?}, {:?}", req.params);
            }
        }
    }
    // Scoring and the drafting self-check compare or report the values themselves; with the path off even the
    // start-up cost measurement (which times it when it is on) never asks.
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let check: Vec<u32> = (0..24u32).map(|i| (i * 5 + 3) % VOCAB as u32).collect();
    assert_eq!(g.self_check(&check, 5).unwrap(), None);
    g.set_device_argmax(false);
    let setup = g.setup_drafting(5, None, 1).unwrap();
    assert!(setup.enabled, "{:?}", setup.warning);
    assert_eq!(setup.costs.argmax, setup.costs.logits, "without the path both tables time the copy");
    g.set_device_argmax(true);
    // A scoring request (prompt logprobs, nothing generated) reads every prompt row's values.
    let tokens: Vec<u32> = (0..30u32).map(|i| (i * 7 + 2) % VOCAB as u32).collect();
    let mut req = request(tokens.clone(), greedy(1), 0);
    req.prompt_logprobs = Some(2);
    let out = g.generate(&req, &mut |_| Flow::Continue).unwrap();
    assert_eq!(out.prompt_logprobs.len(), tokens.len());
    assert_eq!(be.calls(), 0);
}

/// The start-up cost measurement times both ways a window's rows come back on the same forwards: one argmax
/// call and one download per timed forward (4 per width, the first a warm-up), and the argmax time is never
/// above the time with the copy.
#[test]
fn window_costs_are_timed_with_argmaxes_and_with_the_logits_copied() {
    let model = FakeModel::new(VOCAB, 512);
    let be = Counting::new(Mode::Delegate);
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let costs = g.measure_costs(6).unwrap();
    assert_eq!((be.calls(), be.downloads()), (4 * 6, 4 * 6));
    assert_eq!((costs.argmax.max_width(), costs.logits.max_width()), (6, 6));
    for w in 1..=6 {
        assert!(costs.argmax.get(w).unwrap() <= costs.logits.get(w).unwrap(), "width {w}: {costs:?}");
    }
    assert_eq!(g.pool().free_blocks(), 64, "the measurement frees its blocks");
}

#[test]
fn prompt_logprobs_download_the_prompt_and_decode_takes_argmaxes() {
    let model = FakeModel::new(VOCAB, 512);
    let (on, off) = (Counting::new(Mode::Delegate), Counting::new(Mode::Forbid));
    for d in DRAFTINGS {
        for prompt in prompts() {
            let mut req = request(prompt.clone(), greedy(9), 16);
            req.prompt_logprobs = Some(2);
            on.reset();
            let got = solo(&on, &model, d, true, &req);
            let want = solo(&off, &model, d, false, &req);
            assert_eq!(got.tokens, reference(&req), "{d:?}, prompt {prompt:?}");
            assert_eq!(got.prompt_logprobs, want.prompt_logprobs);
            assert_eq!(got.prompt_logprobs.len(), prompt.len());
            // Every prompt chunk downloads (its rows are scored); the decode rounds ask for argmaxes.
            let chunks = prompt.len().div_ceil(req.prefill_chunk);
            assert_eq!((on.calls(), on.downloads()), (got.counts.rounds, chunks), "{d:?}, prompt {prompt:?}");
        }
    }
}

fn many(g: &mut Generator<'_>, reqs: &[GenRequest], max_rows: usize) -> Vec<GenOutput> {
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    g.generate_many(items, max_rows).into_iter().map(Result::unwrap).collect()
}

/// Shared rounds of `reqs` on a fresh generator.
fn shared(be: &Counting, model: &FakeModel, d: Drafting, on: bool, reqs: &[GenRequest]) -> Vec<GenOutput> {
    let mut g = Generator::new(be, model, 256, 8).unwrap();
    set_drafting(&mut g, d);
    g.set_device_argmax(on);
    many(&mut g, reqs, 24)
}

fn stream_requests(params: &[SamplingParams]) -> Vec<GenRequest> {
    prompts()
        .into_iter()
        .cycle()
        .zip(params)
        .enumerate()
        .map(|(i, (prompt, p))| {
            let mut r = request(prompt, p.clone(), 10 + 5 * i);
            r.prefill_chunk = [3, 64, 1][i % 3];
            r.draft = i % 4 != 3;
            r
        })
        .collect()
}

#[test]
fn shared_rounds_take_device_argmaxes_when_every_row_is_greedy() {
    let model = FakeModel::new(VOCAB, 1024);
    let (on, off) = (Counting::new(Mode::Delegate), Counting::new(Mode::Forbid));
    // Chains only: shared rounds cut trees to their first path.
    for d in [Drafting::Serial, Drafting::Chains(3), Drafting::Chains(6)] {
        // All greedy: no round downloads anything.
        let reqs = stream_requests(&[greedy(1), greedy(2), greedy(3), greedy(4), greedy(5)]);
        on.reset();
        let got = shared(&on, &model, d, true, &reqs);
        let want = shared(&off, &model, d, false, &reqs);
        for ((r, g), w) in reqs.iter().zip(&got).zip(&want) {
            assert_eq!(g.tokens, reference(r), "{d:?}, prompt {:?}", r.prompt);
            assert_eq!(g.tokens, w.tokens);
            assert_eq!(g.counts, w.counts);
        }
        assert!(on.calls() > 0, "{d:?}");
        assert_eq!(on.downloads(), 0, "{d:?}: every row greedy, nothing downloaded");
        // Mixed: rounds holding a sampled or penalized stream's rows download; the replies do not change.
        let reqs = stream_requests(&[greedy(1), sampled(2), greedy(3), penalized(4), greedy(5), greedy(6)]);
        on.reset();
        let got = shared(&on, &model, d, true, &reqs);
        let want = shared(&off, &model, d, false, &reqs);
        for ((r, g), w) in reqs.iter().zip(&got).zip(&want) {
            assert_eq!(g.tokens, reference(r), "{d:?}, prompt {:?}, {:?}", r.prompt, r.params);
            assert_eq!(g.tokens, w.tokens);
        }
        assert!(on.downloads() > 0, "{d:?}");
        // Logprobs wanted: the path is on but the backend panics if asked.
        let mut reqs = stream_requests(&[greedy(1), greedy(2), greedy(3)]);
        reqs.iter_mut().for_each(|r| r.logprobs = true);
        let got = shared(&off, &model, d, true, &reqs);
        for (r, g) in reqs.iter().zip(&got) {
            assert_eq!(g.tokens, reference(r));
        }
    }
    assert_eq!(off.calls(), 0);
}

#[test]
fn wrong_argmaxes_change_the_replies() {
    // The path must really feed the emitted tokens: a backend whose argmaxes are off by one changes every reply.
    let model = FakeModel::new(VOCAB, 1024);
    let be = Counting::new(Mode::Sabotage);
    for d in [Drafting::Serial, Drafting::Chains(4), Drafting::Trees(4)] {
        for prompt in prompts() {
            let req = request(prompt.clone(), greedy(1), 12);
            let out = solo(&be, &model, d, true, &req);
            assert_ne!(out.tokens[0], reference(&req)[0], "{d:?}, prompt {prompt:?}");
        }
    }
    let reqs = stream_requests(&[greedy(1), greedy(2), greedy(3)]);
    let got = shared(&be, &model, Drafting::Chains(3), true, &reqs);
    for (r, g) in reqs.iter().zip(&got) {
        assert_ne!(g.tokens, reference(r));
    }
}

/// A draft model (a second fake model: it agrees with the target) on a counting backend.
fn draft_model(be: &Arc<Counting>, on: bool) -> Arc<Mutex<DraftModel>> {
    let b: Arc<dyn Backend> = be.clone();
    let mut dm = DraftModel::new(b, Box::new(FakeModel::new(VOCAB, 512)), 512, 8).unwrap();
    dm.set_device_argmax(on);
    Arc::new(Mutex::new(dm))
}

#[test]
fn a_draft_model_drafts_the_same_with_device_argmaxes() {
    let (on, off) = (Arc::new(Counting::new(Mode::Delegate)), Arc::new(Counting::new(Mode::Forbid)));
    let (dm_on, dm_off) = (draft_model(&on, true), draft_model(&off, false));
    for prompt in prompts() {
        for params in [greedy(1), penalized(2), sampled(3)] {
            let req = request(prompt.clone(), params.clone(), 20);
            let (mut a, mut b) =
                (ModelProposer::new(dm_on.clone(), &req, false), ModelProposer::new(dm_off.clone(), &req, false));
            let mut context = prompt.clone();
            on.reset();
            for step in 0..6u32 {
                let (ta, tb) = (a.propose(&context, 4), b.propose(&context, 4));
                let chain = |t: &tf_engine::spec::DraftTree| t.nodes().iter().map(|n| n.token).collect::<Vec<_>>();
                assert_eq!(chain(&ta), chain(&tb), "prompt {prompt:?}, {params:?}, step {step}");
                assert_eq!(chain(&ta).len(), 4);
                context.push((step * 3) % VOCAB as u32);
            }
            let expect_calls = match () {
                _ if !params.is_greedy() => 0,
                // The reply is empty only while the context is the prompt: the first proposal's first draft.
                _ if params.has_penalty() => 1,
                _ => 6 * 4,
            };
            assert_eq!(on.calls(), expect_calls, "prompt {prompt:?}, {params:?}");
        }
    }
    // And whole replies drafted by it: the definition's tokens, drafts accepted.
    let model = FakeModel::new(VOCAB, 512);
    let target = Counting::new(Mode::Delegate);
    let mut g = Generator::new(&target, &model, 64, 8).unwrap();
    let mut c = DraftConfig::new(5, CostTable::from_widths(&[1e-3; 5]));
    c.proposer = Some(model_proposer_factory(dm_on, false));
    g.set_drafting(Some(c));
    on.reset();
    for prompt in prompts() {
        let req = request(prompt.clone(), greedy(7), 24);
        let out = g.generate(&req, &mut |_| Flow::Continue).unwrap();
        assert_eq!(out.tokens, reference(&req), "prompt {prompt:?}");
        assert!(out.counts.accepted > 0, "{:?}", out.counts);
    }
    assert!(on.calls() > 0 && on.downloads() == 0);
    // Eight sequences sharing rounds and the one draft model (greedy and sampled): each equals serial.
    let reqs: Vec<GenRequest> = prompts()
        .into_iter()
        .cycle()
        .take(8)
        .enumerate()
        .map(|(i, prompt)| {
            let params = match i % 2 {
                0 => greedy(i as u64),
                _ => SamplingParams { temperature: 0.8, top_k: 6, seed: Some(i as u64), ..SamplingParams::default() },
            };
            request(prompt, params, 20)
        })
        .collect();
    let items: Vec<(GenRequest, tf_engine::OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as tf_engine::OnToken<'_>)).collect();
    let outs = g.generate_many(items, 64);
    let mut accepted = 0;
    for (r, o) in reqs.iter().zip(outs) {
        let o = o.unwrap();
        let serial = g.generate(&GenRequest { draft: false, ..r.clone() }, &mut |_| Flow::Continue).unwrap();
        assert_eq!(o.tokens, serial.tokens, "{:?}", r.params);
        assert_eq!(o.tokens, reference(r));
        accepted += o.counts.accepted;
    }
    assert!(accepted > 0, "the draft model's drafts were accepted in shared rounds");
}

#[test]
fn greedy_on_device_is_exported_and_follows_the_request() {
    let mut r = request(vec![1, 2], greedy(1), 4);
    assert!(greedy_on_device(&r, &[]) && greedy_on_device(&r, &[5]));
    r.logprobs = true;
    assert!(!greedy_on_device(&r, &[]));
}
