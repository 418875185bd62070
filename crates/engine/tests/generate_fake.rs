//! The generation loop on a fake model (tests/fake): chunking, stops, limits, seeds and admission errors.

#[allow(dead_code)]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::atomic::Ordering;
use tf_core::{derive_seed, DEFAULT_SEED_SALT};
use tf_engine::{
    token_sha, EngineError, FinishReason, Flow, GenOutput, GenRequest, Generator, PoolError, SamplingParams, TokenEvent,
};

const VOCAB: usize = 40;

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 17 + 3) % VOCAB as u32).collect()
}

fn sampled(seed: Option<u64>) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 20, top_p: 0.95, seed, ..SamplingParams::default() }
}

fn run(g: &mut Generator<'_>, req: &GenRequest) -> (GenOutput, Vec<TokenEvent>) {
    let mut events = Vec::new();
    let out = g
        .generate(req, &mut |e| {
            events.push(e);
            Flow::Continue
        })
        .unwrap();
    (out, events)
}

/// The serial reply from the definition (tests/fake).
fn reference(req: &GenRequest, seed: u64) -> Vec<u32> {
    fake::reference_reply(req, seed, VOCAB)
}

#[test]
fn any_prefill_chunking_gives_the_same_tokens() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 16, 8).unwrap();
    for params in [SamplingParams::greedy(), sampled(Some(7)), sampled(None)] {
        let mut req = GenRequest::new(prompt(23), params, 30);
        let mut outs = Vec::new();
        for chunk in [1, 7, 23, 64] {
            req.prefill_chunk = chunk;
            model.reset_counts();
            let (out, events) = run(&mut g, &req);
            // Prefill: ceil(23 / chunk) calls and one logit row; decode: one row per further token.
            assert_eq!(model.forwards.load(Ordering::SeqCst), 23usize.div_ceil(chunk) + 29);
            assert_eq!(model.rows.load(Ordering::SeqCst), 23 + 29);
            assert_eq!(model.logit_rows.load(Ordering::SeqCst), 30);
            assert_eq!(model.widest.load(Ordering::SeqCst), chunk.min(23));
            assert_eq!(g.pool().free_blocks(), 16, "blocks return to the pool");
            assert_eq!(out.tokens, reference(&req, out.seed), "chunk {chunk}");
            assert_eq!((out.finish_reason, out.prompt_tokens), (FinishReason::Length, 23));
            assert_eq!(out.token_sha, token_sha(&out.tokens));
            let ev: Vec<(u32, usize, usize)> = events.iter().map(|e| (e.token, e.index, e.position)).collect();
            let want: Vec<(u32, usize, usize)> = out.tokens.iter().enumerate().map(|(i, &t)| (t, i, 23 + i)).collect();
            assert_eq!(ev, want);
            outs.push(out.tokens);
        }
        assert!(outs.windows(2).all(|w| w[0] == w[1]));
    }
}

#[test]
fn a_stop_id_ends_the_reply_and_is_included() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 16, 8).unwrap();
    let mut req = GenRequest::new(prompt(9), sampled(Some(3)), 20);
    let (free, _) = run(&mut g, &req);
    let stop = free.tokens[6];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    // A second stop id that never occurs changes nothing.
    let absent = (0..VOCAB as u32).find(|t| !free.tokens.contains(t)).unwrap();
    req.stop_ids = vec![absent, stop];
    let (out, events) = run(&mut g, &req);
    assert_eq!(out.tokens, free.tokens[..=first].to_vec());
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.token_sha, token_sha(&free.tokens[..=first]));
    assert!(events.last().unwrap().is_stop && events.iter().rev().skip(1).all(|e| !e.is_stop));
}

#[test]
fn max_tokens_and_callback_stop() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 16, 8).unwrap();
    let req = GenRequest::new(prompt(5), SamplingParams::greedy(), 12);
    let (out, _) = run(&mut g, &req);
    assert_eq!((out.tokens.len(), out.finish_reason), (12, FinishReason::Length));
    let one = GenRequest { max_tokens: 1, ..req.clone() };
    let (o1, _) = run(&mut g, &one);
    assert_eq!((o1.tokens, o1.finish_reason), (out.tokens[..1].to_vec(), FinishReason::Length));

    model.reset_counts();
    let mut seen = 0;
    let cancelled = g
        .generate(&req, &mut |e| {
            seen += 1;
            if e.index == 3 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    assert_eq!(seen, 4);
    assert_eq!((cancelled.tokens, cancelled.finish_reason), (out.tokens[..4].to_vec(), FinishReason::Cancelled));
    assert_eq!(model.forwards.load(Ordering::SeqCst), 1 + 3, "no forward after the stop");
}

#[test]
fn seeds_are_deterministic_and_derived_from_the_prompt_when_absent() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 16, 8).unwrap();
    let p = prompt(11);
    let gen = |g: &mut Generator<'_>, params: SamplingParams, salt: &str| {
        let mut req = GenRequest::new(p.clone(), params, 24);
        req.seed_salt = salt.to_string();
        run(g, &req).0
    };
    let a = gen(&mut g, sampled(Some(1)), "0");
    assert_eq!(a.seed, 1);
    assert_eq!(a.tokens, gen(&mut g, sampled(Some(1)), "0").tokens);
    assert_ne!(a.tokens, gen(&mut g, sampled(Some(2)), "0").tokens);
    let derived = gen(&mut g, sampled(None), DEFAULT_SEED_SALT);
    assert_eq!(derived.seed, derive_seed(&p, "0"));
    assert_eq!(derived.tokens, gen(&mut g, sampled(Some(derive_seed(&p, "0"))), "x").tokens);
    let salted = gen(&mut g, sampled(None), "other");
    assert_eq!(salted.seed, derive_seed(&p, "other"));
    assert_ne!(salted.tokens, derived.tokens);
}

#[test]
fn requests_that_cannot_run_are_refused_before_any_work() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 32));
    let mut g = Generator::new(&be, &model, 3, 8).unwrap(); // 24 KV slots
    let refuse = |g: &mut Generator<'_>, req: GenRequest| {
        let e = g.generate(&req, &mut |_| Flow::Continue).unwrap_err();
        assert_eq!(model.forwards.load(Ordering::SeqCst), 0, "{e}");
        assert_eq!(g.pool().free_blocks(), 3);
        e
    };
    let ok = GenRequest::new(prompt(10), SamplingParams::greedy(), 8);
    let e = refuse(&mut g, GenRequest { max_tokens: 23, ..ok.clone() });
    assert_eq!(e, EngineError::ContextOverflow { prompt_tokens: 10, max_tokens: 23, context_length: 32 });
    assert!(e.to_string().contains("exceeds the model's context of 32"), "{e}");
    // Fits the context (10 + 20 ≤ 32) but needs 30 KV slots of 24 (prompt + max_tokens: a drafted window may
    // write one slot past the last generated token).
    let e = refuse(&mut g, GenRequest { max_tokens: 20, ..ok.clone() });
    assert_eq!(e, EngineError::Pool(PoolError::TooLarge { tokens: 30, capacity_tokens: 24 }));
    assert!(matches!(refuse(&mut g, GenRequest { prompt: vec![], ..ok.clone() }), EngineError::InvalidRequest(_)));
    assert!(matches!(refuse(&mut g, GenRequest { max_tokens: 0, ..ok.clone() }), EngineError::InvalidRequest(_)));
    assert!(matches!(refuse(&mut g, GenRequest { prefill_chunk: 0, ..ok.clone() }), EngineError::InvalidRequest(_)));
    let e = refuse(&mut g, GenRequest { prompt: vec![1, VOCAB as u32], ..ok.clone() });
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    let bad = SamplingParams { top_p: 0.0, ..SamplingParams::default() };
    assert!(matches!(refuse(&mut g, GenRequest { params: bad, ..ok.clone() }), EngineError::Sampling(_)));
    // Exactly full: 10 + 14 = 24 slots.
    let (out, _) = run(&mut g, &GenRequest { max_tokens: 14, ..ok.clone() });
    assert_eq!(out.tokens.len(), 14);
    model.reset_counts();
    let e = refuse(&mut g, GenRequest { max_tokens: 15, ..ok });
    assert_eq!(e, EngineError::Pool(PoolError::TooLarge { tokens: 25, capacity_tokens: 24 }));
}

#[test]
fn the_generator_is_reusable_and_stale_kv_does_not_leak() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 8, 4).unwrap();
    let a = GenRequest::new(prompt(13), sampled(Some(9)), 10);
    let b = GenRequest::new(prompt(6), sampled(Some(9)), 10);
    let first = run(&mut g, &a).0.tokens;
    let other = run(&mut g, &b).0.tokens;
    assert_eq!(run(&mut g, &a).0.tokens, first);
    assert_eq!(run(&mut g, &b).0.tokens, other);
    assert_eq!(first, reference(&a, 9));
}

#[test]
fn logprobs_off_gives_the_same_tokens_and_no_logprobs() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 256));
    let mut g = Generator::new(&be, &model, 16, 8).unwrap();
    for params in [SamplingParams::greedy(), sampled(Some(5))] {
        let mut req = GenRequest::new(prompt(11), params, 25);
        let (with, ev_with) = run(&mut g, &req);
        req.logprobs = false;
        let (without, ev_without) = run(&mut g, &req);
        assert_eq!(with.tokens, without.tokens);
        assert_eq!(without.tokens, reference(&req, without.seed));
        assert!(ev_with.iter().all(|e| e.logprob.is_some_and(|l| l <= 0.0)), "logprobs reported when asked");
        assert!(ev_without.iter().all(|e| e.logprob.is_none()), "and only then");
    }
}
