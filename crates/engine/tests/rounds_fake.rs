//! Shared rounds on the fake model: 16 concurrent streams (mixed prompt lengths, greedy and sampled, drafts on
//! and off) each equal their solo run; row budgets of 1, 16 and 512 give identical replies; the prefix cache
//! under concurrency changes nothing; a cancelled stream ends and frees its blocks while the others go on;
//! streams preempted in any phase and resumed later equal their solo runs.

#[allow(dead_code)]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tf_engine::{
    CostTable, DraftConfig, FinishReason, Flow, GenOutput, GenRequest, Generator, Grant, OnToken, SamplingParams,
};

const VOCAB: usize = 14;

/// The serial reply from the definition (tests/fake).
fn reference(req: &GenRequest, seed: u64) -> Vec<u32> {
    fake::reference_reply(req, seed, VOCAB)
}

fn requests(n: usize) -> Vec<GenRequest> {
    (0..n as u64)
        .map(|i| {
            let len = [3usize, 40, 9, 77, 1, 25][i as usize % 6] + i as usize;
            let prompt: Vec<u32> = if i % 4 == 1 {
                [2u32, 4, 6, 8, 10].iter().cycle().take(len).copied().collect() // repetitive: copies accept
            } else {
                (0..len as u32).map(|j| (j * 5 + i as u32) % VOCAB as u32).collect()
            };
            let params = if i % 4 == 0 {
                SamplingParams { seed: Some(i), ..SamplingParams::greedy() }
            } else if i % 4 == 2 {
                SamplingParams {
                    seed: Some(i),
                    repetition_penalty: 1.4,
                    frequency_penalty: 0.3,
                    ..SamplingParams::greedy()
                }
            } else {
                SamplingParams { temperature: 0.9, top_k: 8, top_p: 0.9, seed: Some(i * 3), ..Default::default() }
            };
            let mut r = GenRequest::new(prompt, params, 12 + (i as usize * 7) % 30);
            r.draft = i % 3 != 2;
            r.stop_ids = if i % 5 == 0 { vec![3] } else { vec![] };
            r.prefill_chunk = [64, 7, 1][i as usize % 3];
            // Half the streams ask for no logprobs (the draw skips them): their tokens must not change.
            r.logprobs = i % 2 == 0;
            r
        })
        .collect()
}

fn many(g: &mut Generator<'_>, reqs: &[GenRequest], max_rows: usize) -> Vec<GenOutput> {
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    g.generate_many(items, max_rows).into_iter().map(Result::unwrap).collect()
}

fn drafting() -> DraftConfig {
    DraftConfig::new(5, CostTable::from_widths(&[1e-3; 5]))
}

#[test]
fn sixteen_concurrent_streams_each_equal_their_solo_run() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    g.set_drafting(Some(drafting()));
    let reqs = requests(16);
    let outs = many(&mut g, &reqs, 64);
    let mut drafted = 0;
    for (r, o) in reqs.iter().zip(&outs) {
        let solo = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(o.tokens, solo.tokens, "prompt {:?}", r.prompt);
        assert_eq!(o.tokens, reference(r, r.params.seed.unwrap()));
        assert_eq!(o.counts.drafts, r.draft);
        // The scheduler keeps rows for prompt chunks while prompts fill, so a drafting stream's window may get
        // no draft rows in some rounds; a stream that does not draft never has a draft row.
        if !r.draft {
            assert_eq!(o.counts.drafted, 0);
            assert!(o.counts.min_rows <= 1, "{:?}", o.counts);
        }
        drafted += o.counts.drafted;
    }
    assert!(drafted > 0);
    assert!(model.widest.load(Ordering::SeqCst) > 8, "rounds packed several streams");
    assert_eq!(g.pool().free_blocks(), 256);
}

#[test]
fn row_budgets_of_1_16_and_512_give_identical_replies() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    g.set_drafting(Some(drafting()));
    let reqs = requests(10);
    let base = many(&mut g, &reqs, 512);
    for budget in [1, 16] {
        model.reset_counts();
        let outs = many(&mut g, &reqs, budget);
        for (a, b) in base.iter().zip(&outs) {
            assert_eq!(a.tokens, b.tokens, "budget {budget}");
        }
        let widest = model.widest.load(Ordering::SeqCst);
        // Every decoding stream gets its pending row even when the budget is smaller.
        assert!(widest <= budget.max(10) + 10 * 4, "budget {budget}: widest round {widest}");
    }
}

#[test]
fn the_prefix_cache_under_concurrency_changes_nothing() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 400, 8).unwrap();
    g.set_drafting(Some(drafting()));
    g.set_prefix_cache(true);
    let reqs = requests(12);
    let first = many(&mut g, &reqs, 48);
    let second = many(&mut g, &reqs, 48);
    let mut cached = 0;
    for ((r, a), b) in reqs.iter().zip(&first).zip(&second) {
        assert_eq!(a.tokens, reference(r, r.params.seed.unwrap()));
        assert_eq!(a.tokens, b.tokens);
        cached += b.cached_tokens;
    }
    assert!(cached > 0);
}

#[test]
fn a_cancelled_stream_ends_while_the_others_go_on() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    let reqs = requests(6);
    let flag = Arc::new(AtomicBool::new(false));
    let mut items: Vec<(GenRequest, OnToken<'_>)> = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let mut r = r.clone();
        r.max_tokens = 40;
        r.stop_ids.clear();
        if i == 2 {
            r.cancel = Some(flag.clone());
            let f = flag.clone();
            // Cancel from outside the stream after its fourth token (as a disconnect would).
            items.push((
                r,
                Box::new(move |ev| {
                    if ev.index == 3 {
                        f.store(true, Ordering::Relaxed);
                    }
                    Flow::Continue
                }),
            ));
        } else {
            items.push((r, Box::new(|_| Flow::Continue)));
        }
    }
    let outs: Vec<GenOutput> = g.generate_many(items, 32).into_iter().map(Result::unwrap).collect();
    assert_eq!(outs[2].finish_reason, FinishReason::Cancelled);
    assert_eq!(outs[2].tokens.len(), 4);
    for (i, o) in outs.iter().enumerate().filter(|(i, _)| *i != 2) {
        assert_eq!(o.tokens.len(), 40, "stream {i}");
        assert_eq!(o.finish_reason, FinishReason::Length);
    }
    assert_eq!(g.pool().free_blocks(), 256);
}

/// Proposes the true continuation (computed from the definition), wrong at every fourth reply index: most
/// drafts are accepted, so the penalties over the accepted path matter.
struct Oracle {
    prompt_len: usize,
    truth: Vec<u32>,
}

impl tf_engine::spec::Proposer for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> tf_engine::spec::DraftTree {
        let start = context.len() - self.prompt_len;
        let chain: Vec<u32> = (start..(start + max_tokens).min(self.truth.len()))
            .map(|i| if i % 4 == 3 { (self.truth[i] + 1) % VOCAB as u32 } else { self.truth[i] })
            .collect();
        tf_engine::spec::DraftTree::from_chain(&chain)
    }
    fn observe(&mut self, _: usize, _: usize) {}
    fn reset(&mut self) {}
}

#[test]
fn accepted_drafts_with_penalties_under_concurrency_equal_solo() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    let mut c = drafting();
    c.proposer = Some(Arc::new(|req: &GenRequest| {
        Box::new(Oracle { prompt_len: req.prompt.len(), truth: reference(req, req.params.seed.unwrap()) })
            as Box<dyn tf_engine::spec::Proposer>
    }));
    g.set_drafting(Some(c));
    let mut reqs = requests(12);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.draft = true;
        r.params.repetition_penalty = 1.0 + 0.1 * (i % 4) as f64;
        r.params.presence_penalty = 0.2 * (i % 3) as f64;
    }
    let outs = many(&mut g, &reqs, 40);
    let mut accepted = 0;
    for (r, o) in reqs.iter().zip(&outs) {
        assert_eq!(o.tokens, reference(r, r.params.seed.unwrap()), "{:?}", r.params);
        accepted += o.counts.accepted;
    }
    assert!(accepted > 50, "{accepted}");
}

/// Tree windows (context copies with three candidates merged) of eight sequences sharing rounds, some of them
/// scoring their prompt (prompt logprobs, also with nothing to generate): every reply and every prompt logprob
/// equals the same request run alone, and trees really ran in shared rounds.
#[test]
fn tree_windows_and_prompt_logprobs_under_parallel_8_equal_solo() {
    use tf_engine::spec::{NgramConfig, NgramProposer, Proposer};
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    let mut c = drafting();
    c.proposer = Some(Arc::new(|_: &GenRequest| {
        Box::new(NgramProposer::new(NgramConfig { max_candidates: 3, min_n: 1, ..NgramConfig::default() }))
            as Box<dyn Proposer>
    }));
    g.set_drafting(Some(c));
    let mut reqs = requests(8);
    for (i, r) in reqs.iter_mut().enumerate() {
        r.draft = true;
        if i % 3 == 1 {
            r.prompt_logprobs = Some(2);
        }
        if i == 4 {
            r.max_tokens = 0;
        }
    }
    let outs = many(&mut g, &reqs, 64);
    assert!(model.shared_tree_rows.load(Ordering::SeqCst) > 0, "tree windows ran in shared rounds");
    for (r, o) in reqs.iter().zip(&outs) {
        let solo = g.generate(r, &mut |_| Flow::Continue).unwrap();
        assert_eq!(o.tokens, solo.tokens, "prompt {:?}", r.prompt);
        assert_eq!(o.tokens, reference(r, r.params.seed.unwrap()));
        assert_eq!(o.prompt_logprobs, solo.prompt_logprobs);
        if r.prompt_logprobs.is_some() {
            assert_eq!(o.prompt_logprobs.len(), r.prompt.len());
            assert!(o.prompt_logprobs[0].is_none());
            // Each entry is the definition's: ln P of the next prompt token under the logits of the prefix.
            for (p, lp) in o.prompt_logprobs.iter().enumerate().skip(1) {
                let lp = lp.as_ref().expect("scored");
                let values = tf_engine::penalized(&fake::reference_logits(&r.prompt[..p], VOCAB), &r.params, &[]);
                assert_eq!(lp.token, r.prompt[p]);
                assert_eq!(lp.logprob.to_bits(), tf_engine::log_softmax_at(&values, r.prompt[p]).to_bits());
            }
        } else {
            assert!(o.prompt_logprobs.is_empty());
        }
    }
    assert_eq!(g.pool().free_blocks(), 256, "scratch and sequence blocks are returned");
}

/// Streams preempted at every phase (mid-fill, right after their first token, mid-decode with drafts) and
/// resumed later — from their cached blocks or, with the cache off, refilled from scratch — equal their solo
/// runs; every block returns to the pool.
#[test]
fn preempted_and_resumed_streams_equal_their_solo_runs() {
    for prefix_cache in [true, false] {
        let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
        let mut g = Generator::new(&be, &model, 256, 8).unwrap();
        g.set_drafting(Some(drafting()));
        g.set_prefix_cache(prefix_cache);
        let reqs = requests(8);
        let mut streams = Vec::new();
        for r in &reqs {
            streams.push(g.admit_seq(r.clone(), Box::new(|_| Flow::Continue)).unwrap());
        }
        let mut preemptions = 0;
        let mut times = vec![0; streams.len()];
        for round in 0..5000 {
            if streams.iter().all(|s| s.is_done()) {
                break;
            }
            // Every few rounds, preempt a running stream (whatever phase it is in; each at most twice, so a
            // one-row-per-round refill always completes) and resume a waiting one.
            if round % 3 == 1 {
                let i = (round / 3) % streams.len();
                if !streams[i].is_done() && !streams[i].is_preempted() && times[i] < 2 {
                    g.preempt(&mut streams[i]);
                    times[i] += 1;
                    preemptions += 1;
                }
            }
            if round % 5 == 4 {
                for s in streams.iter_mut().filter(|s| s.is_preempted()).take(2) {
                    g.resume(s).unwrap();
                }
            }
            let grants = grants(&g, &streams, 24);
            g.run_round(&mut streams, &grants).unwrap();
            if streams.iter().all(|s| s.is_done() || s.is_preempted()) {
                for s in streams.iter_mut().filter(|s| s.is_preempted()) {
                    g.resume(s).unwrap();
                }
            }
        }
        assert!(preemptions >= 8, "{preemptions}");
        for (r, s) in reqs.iter().zip(streams.iter_mut()) {
            assert!(s.is_done());
            assert_eq!(s.output().unwrap().tokens, reference(r, r.params.seed.unwrap()), "cache {prefix_cache}");
        }
        drop(streams);
        let cached = g.prefix_cache().map_or(0, |c| c.len());
        assert_eq!(g.pool().free_blocks() + cached, 256);
    }
}

/// In shared rounds each stream is priced as its own rows come back: with flat argmax costs and steep costs
/// for copying the logits, greedy streams without logprobs draft and sampled ones never do; every reply still
/// equals the definition's.
#[test]
fn shared_rounds_price_greedy_streams_with_the_argmax_costs() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = Generator::new(&be, &model, 256, 8).unwrap();
    // A window of w ≥ 2 rows costs 2w one-row rounds: never worth it, even if every draft were accepted.
    let steep: Vec<f64> = (1..=5).map(|w| if w == 1 { 1e-3 } else { 2e-3 * w as f64 }).collect();
    let mut c = DraftConfig::new(5, CostTable::from_widths(&steep));
    c.costs.argmax = CostTable::from_widths(&[1e-3; 5]);
    c.min_drafts = 0;
    g.set_drafting(Some(c));
    let reqs: Vec<GenRequest> = (0..8u64)
        .map(|i| {
            let prompt: Vec<u32> = [2u32, 4, 6, 8, 10, 12].iter().cycle().take(30 + i as usize).copied().collect();
            let params = match i % 2 {
                0 => SamplingParams { seed: Some(i), ..SamplingParams::greedy() },
                _ => SamplingParams { temperature: 0.7, top_k: 4, seed: Some(i), ..Default::default() },
            };
            let mut r = GenRequest::new(prompt, params, 24);
            r.logprobs = false;
            r.stop_ids.clear();
            r
        })
        .collect();
    let outs = many(&mut g, &reqs, 64);
    let mut greedy_drafted = 0;
    for (r, o) in reqs.iter().zip(&outs) {
        assert_eq!(o.tokens, reference(r, r.params.seed.unwrap()));
        if tf_engine::greedy_on_device(r, &[]) {
            greedy_drafted += o.counts.drafted;
        } else {
            assert_eq!(o.counts.drafted, 0, "a sampled stream is priced with the copy: {:?}", o.counts);
        }
    }
    assert!(greedy_drafted > 0, "greedy streams are priced with the argmax costs");
}

/// Every decoding sequence's window with the drafts it wants, then prompt chunks in order, within `max_rows`
/// (this test preempts and resumes by hand, so it grants rows itself instead of asking the scheduler).
fn grants(g: &Generator<'_>, seqs: &[tf_engine::Sequence<'_>], max_rows: usize) -> Vec<(usize, Grant)> {
    let decoding: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].is_decoding()).collect();
    let mut budget = max_rows.saturating_sub(decoding.len());
    let mut out = Vec::new();
    for &i in &decoding {
        let k = g.want_drafts(&seqs[i]).min(budget);
        budget -= k;
        out.push((i, Grant::Window { max_drafts: k }));
    }
    for i in (0..seqs.len()).filter(|&i| seqs[i].is_filling()) {
        if budget > 0 {
            out.push((i, Grant::Fill { max_len: budget }));
            budget -= budget.min(seqs[i].req.prefill_chunk);
        }
    }
    out
}
