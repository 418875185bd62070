//! The engine on the tiny hybrid checkpoint (fixtures/tiny/nemotron_h: Mamba-2 layers whose recurrent state
//! must follow every accepted row and roll back on every rejection). Every reply is compared by token ids with
//! its serial solo run on a fresh generator:
//! - drafted by scripted proposers that know the serial reply and are wrong at every k-th draft (so windows end
//!   rejected at every depth, and at every position across the replies), in chains and in trees;
//! - drafted by context copies, alone and in shared rounds of eight sequences;
//! - resumed from the prefix cache (a state snapshot every block) and after a preemption.

mod tiny;

use std::sync::Arc;
use tf_backend_cpu::CpuBackend;
use tf_core::Precision;
use tf_engine::spec::{DraftTree, Proposer};
use tf_engine::{CostTable, DraftConfig, Flow, GenOutput, GenRequest, Generator, OnToken, SamplingParams, Sequence};
use tf_models::Model;
use tiny::requests;

const BLOCK: usize = 16;

/// Serial solo replies, each on a fresh generator.
fn serial(be: &CpuBackend, model: &dyn Model, reqs: &[GenRequest]) -> Vec<GenOutput> {
    reqs.iter()
        .map(|r| {
            let mut g = Generator::new(be, model, 64, BLOCK).unwrap();
            g.generate(r, &mut |_| Flow::Continue).unwrap()
        })
        .collect()
}

/// Proposes the serial reply, wrong at every reply index `i` with `i % k == k - 1`; as a tree, with a wrong
/// first branch before the scripted one.
struct Scripted {
    prompt_len: usize,
    truth: Vec<u32>,
    k: usize,
    tree: bool,
    vocab: u32,
}

impl Proposer for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree {
        let start = context.len() - self.prompt_len;
        let n = if self.tree { (max_tokens / 2).max(1) } else { max_tokens };
        let chain: Vec<u32> = (start..(start + n).min(self.truth.len()))
            .map(|i| if i % self.k == self.k - 1 { (self.truth[i] + 1) % self.vocab } else { self.truth[i] })
            .collect();
        if !self.tree || chain.is_empty() {
            return DraftTree::from_chain(&chain);
        }
        let mut t = DraftTree::new();
        t.merge_chain(&chain.iter().map(|x| (x + 2) % self.vocab).collect::<Vec<_>>());
        t.merge_chain(&chain);
        t.truncate_to(max_tokens);
        t
    }
    fn observe(&mut self, _: usize, _: usize) {}
    fn reset(&mut self) {}
}

#[test]
fn rejections_at_every_depth_roll_the_state_back() {
    let be = CpuBackend::new(2, Precision::Full);
    let model = tiny::load(&be, "nemotron_h");
    let vocab = model.vocab_size() as u32;
    let reqs = requests(vocab);
    let want = serial(&be, model.as_ref(), &reqs);
    let mut g = Generator::new(&be, model.as_ref(), 64, BLOCK).unwrap();
    let mut rejected = 0;
    for tree in [false, true] {
        for k in [1, 2, 3, 5] {
            for (r, w) in reqs.iter().zip(&want) {
                let (truth, plen) = (Arc::new(w.tokens.clone()), r.prompt.len());
                let mut c = DraftConfig::new(6, CostTable::from_widths(&[1e-3; 6]));
                c.min_drafts = 1;
                c.proposer = Some(Arc::new(move |_: &GenRequest| {
                    Box::new(Scripted { prompt_len: plen, truth: truth.to_vec(), k, tree, vocab }) as Box<dyn Proposer>
                }));
                g.set_drafting(Some(c));
                let got = g.generate(r, &mut |_| Flow::Continue).unwrap();
                assert_eq!(got.tokens, w.tokens, "tree {tree}, wrong every {k}: prompt {:?}", r.prompt);
                rejected += got.counts.drafted - got.counts.accepted;
            }
        }
    }
    assert!(rejected > 100, "only {rejected} drafts were rejected");
}

#[test]
fn context_copies_alone_and_shared_equal_serial_solo() {
    let be = CpuBackend::new(2, Precision::Checkpoint);
    let model = tiny::load(&be, "nemotron_h");
    let reqs = requests(model.vocab_size() as u32);
    let want = serial(&be, model.as_ref(), &reqs);
    let mut g = Generator::new(&be, model.as_ref(), 256, BLOCK).unwrap();
    g.set_drafting(Some(DraftConfig::new(5, CostTable::from_widths(&[1e-3; 5]))));
    let mut drafted = 0;
    for (r, w) in reqs.iter().zip(&want) {
        let got = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.tokens, w.tokens, "drafted solo != serial for {:?}", r.prompt);
        drafted += got.counts.drafted;
    }
    assert!(drafted > 0, "nothing was drafted");
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    for ((r, w), got) in reqs.iter().zip(&want).zip(g.generate_many(items, 64)) {
        assert_eq!(got.unwrap().tokens, w.tokens, "shared rounds != serial for {:?}", r.prompt);
    }
}

/// With a snapshot every block, a request that starts like an earlier one continues from the cached prefix's
/// state (its cached tokens say so) and equals its fresh run; a preempted sequence resumes equal too.
#[test]
fn prefix_cache_and_preemption_resume_from_kept_states() {
    let be = CpuBackend::new(2, Precision::Full);
    let model = tiny::load(&be, "nemotron_h");
    let vocab = model.vocab_size() as u32;
    let base: Vec<u32> = (0..50u32).map(|j| (j * 29 + 7) % vocab).collect();
    let reqs: Vec<GenRequest> = [0u32, 1, 2]
        .iter()
        .map(|&i| {
            let mut p = base.clone();
            p.extend((0..5 + i).map(|j| (j * 13 + i * 31 + 1) % vocab));
            GenRequest::new(p, SamplingParams::greedy(), 20)
        })
        .collect();
    let want = serial(&be, model.as_ref(), &reqs);

    let mut g = Generator::new(&be, model.as_ref(), 64, BLOCK).unwrap();
    g.set_state_snapshots(BLOCK);
    g.set_prefix_cache(true);
    for (r, w) in reqs.iter().zip(&want) {
        let got = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(got.tokens, w.tokens, "cached prefix: prompt of {} tokens", r.prompt.len());
    }
    let again = g.generate(&reqs[0], &mut |_| Flow::Continue).unwrap();
    assert_eq!(again.tokens, want[0].tokens);
    assert!(again.cached_tokens >= 48, "cached tokens {}", again.cached_tokens);

    // Preempt a sequence mid-reply, then resume it (from the cache's snapshot) to the end.
    for cache in [true, false] {
        let mut g = Generator::new(&be, model.as_ref(), 64, BLOCK).unwrap();
        g.set_state_snapshots(BLOCK);
        g.set_prefix_cache(cache);
        let mut s: Sequence<'_> = g.admit_seq(reqs[1].clone(), Box::new(|_| Flow::Continue)).unwrap();
        let mut rounds = 0;
        while !s.is_done() {
            let grant = if s.is_filling() {
                tf_engine::Grant::Fill { max_len: 7 }
            } else {
                tf_engine::Grant::Window { max_drafts: 0 }
            };
            g.run_round(std::slice::from_mut(&mut s), &[(0, grant)]).unwrap();
            rounds += 1;
            if rounds == 12 || rounds == 17 {
                g.preempt(&mut s);
                g.resume(&mut s).unwrap();
            }
        }
        assert_eq!(s.output().unwrap().tokens, want[1].tokens, "preempted and resumed (prefix cache {cache})");
    }
}

/// Prompt logprobs on the hybrid: scored prompt rows keep no state, and the scores and the reply are the same
/// whatever the prefill chunk, drafted or not.
#[test]
fn prompt_logprobs_are_chunk_independent() {
    let be = CpuBackend::new(2, Precision::Full);
    let model = tiny::load(&be, "nemotron_h");
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..45u32).map(|j| (j * 53 + 11) % vocab).collect();
    let mut runs = Vec::new();
    for (chunk, draft) in [(45, false), (1, false), (7, true), (16, true)] {
        let mut req = GenRequest::new(prompt.clone(), SamplingParams::greedy(), 12);
        req.prompt_logprobs = Some(3);
        req.prefill_chunk = chunk;
        req.draft = draft;
        let mut g = Generator::new(&be, model.as_ref(), 64, BLOCK).unwrap();
        g.set_drafting(Some(DraftConfig::new(4, CostTable::from_widths(&[1e-3; 4]))));
        let out = g.generate(&req, &mut |_| Flow::Continue).unwrap();
        assert_eq!(out.prompt_logprobs.len(), prompt.len());
        let scores: Vec<(u32, u64)> =
            out.prompt_logprobs.iter().flatten().map(|l| (l.token, l.logprob.to_bits())).collect();
        runs.push((out.tokens, scores));
    }
    for r in &runs[1..] {
        assert_eq!(r, &runs[0]);
    }
}
