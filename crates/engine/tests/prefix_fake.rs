//! The prefix cache on the fake model (whose logits are a hash of the whole history read back through the KV
//! slots, so a wrong block or position changes tokens): a prompt resumed from the cache equals the fresh fill, a
//! second turn that reuses blocks written while decoding the first reply equals the fresh run, with and without
//! drafting, and a small pool evicts instead of refusing.

#[allow(dead_code)]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tf_engine::spec::Proposer;
use tf_engine::{ngram_proposer, CostTable, DraftConfig, Flow, GenOutput, GenRequest, Generator, SamplingParams};

const VOCAB: usize = 16;

/// The serial reply from the definition (tests/fake).
fn reference(req: &GenRequest, seed: u64) -> Vec<u32> {
    fake::reference_reply(req, seed, VOCAB)
}

fn run(g: &mut Generator<'_>, req: &GenRequest) -> GenOutput {
    g.generate(req, &mut |_| Flow::Continue).unwrap()
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + salt) % VOCAB as u32).collect()
}

fn params(i: u64) -> SamplingParams {
    if i.is_multiple_of(2) {
        SamplingParams { seed: Some(i), ..SamplingParams::greedy() }
    } else {
        SamplingParams { temperature: 0.9, top_k: 10, seed: Some(i), repetition_penalty: 1.2, ..Default::default() }
    }
}

fn drafting(on: bool) -> Option<DraftConfig> {
    on.then(|| {
        let mut c = DraftConfig::new(6, CostTable::from_widths(&[1e-3; 6]));
        c.proposer = Some(Arc::new(|_: &GenRequest| ngram_proposer(3) as Box<dyn Proposer>));
        c
    })
}

#[test]
fn a_prompt_resumed_from_the_cache_equals_the_fresh_fill() {
    for draft in [false, true] {
        let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
        let mut g = Generator::new(&be, &model, 64, 8).unwrap();
        g.set_drafting(drafting(draft));
        g.set_prefix_cache(true);
        for i in 0..4u64 {
            let req = GenRequest::new(prompt(37 + i as usize * 9, i as u32), params(i), 25);
            let first = run(&mut g, &req);
            assert_eq!(first.cached_tokens, 0);
            model.reset_counts();
            let again = run(&mut g, &req);
            assert_eq!(again.tokens, first.tokens);
            assert_eq!(again.tokens, reference(&req, i));
            let full_blocks = (req.prompt.len() - 1) / 8 * 8;
            assert_eq!(again.cached_tokens, full_blocks, "prompt of {}", req.prompt.len());
            // Only the uncached rest of the prompt was fed again (plus decoding).
            let prefill_rows = req.prompt.len() - again.cached_tokens;
            assert!(model.rows.load(Ordering::SeqCst) >= prefill_rows);
            assert!(model.rows.load(Ordering::SeqCst) < req.prompt.len() + 6 * 25);
        }
    }
}

#[test]
fn a_second_turn_reuses_blocks_written_while_decoding_the_first() {
    for draft in [false, true] {
        let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
        let mut g = Generator::new(&be, &model, 64, 8).unwrap();
        g.set_drafting(drafting(draft));
        g.set_prefix_cache(true);
        let (fbe, fmodel) = (FakeBackend, FakeModel::new(VOCAB, 1024));
        let mut fresh = Generator::new(&fbe, &fmodel, 64, 8).unwrap();
        fresh.set_drafting(drafting(draft));
        for i in 0..3u64 {
            // 21 + 43 = 64: in turn 1 the reply ends exactly at a block boundary (the last token, never fed,
            // must not be cached with its block).
            let turn1 = GenRequest::new(prompt(21, 3 + i as u32), params(i), 40 + 3 * i as usize);
            let r1 = run(&mut g, &turn1);
            let mut p2 = turn1.prompt.clone();
            p2.extend_from_slice(&r1.tokens);
            p2.extend(prompt(5, 11));
            let turn2 = GenRequest::new(p2, params(i + 10), 20);
            let r2 = run(&mut g, &turn2);
            assert!(
                r2.cached_tokens > turn1.prompt.len(),
                "turn 2 reuses decode-written blocks: {} cached of a {}-token first prompt",
                r2.cached_tokens,
                turn1.prompt.len()
            );
            let f2 = run(&mut fresh, &turn2);
            assert_eq!(f2.cached_tokens, 0);
            assert_eq!(r2.tokens, f2.tokens, "draft {draft}, turn {i}");
            assert_eq!(r2.tokens, reference(&turn2, i + 10));
        }
    }
}

#[test]
fn a_small_pool_evicts_cached_blocks_instead_of_refusing() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 10, 8).unwrap(); // 80 slots
    g.set_prefix_cache(true);
    for i in 0..12u64 {
        let req = GenRequest::new(prompt(40 + (i as usize % 3) * 7, i as u32), params(i), 20);
        let out = run(&mut g, &req);
        assert_eq!(out.tokens, reference(&req, i));
        assert!(g.prefix_cache().unwrap().len() <= 10);
    }
    // A request larger than the pool is still refused clearly.
    let huge = GenRequest::new(prompt(70, 1), params(0), 20);
    let e = g.generate(&huge, &mut |_| Flow::Continue).unwrap_err();
    assert!(e.to_string().contains("80"), "{e}");
    // Turning the cache off frees its blocks.
    g.set_prefix_cache(false);
    assert_eq!(g.pool().free_blocks(), 10);
}
