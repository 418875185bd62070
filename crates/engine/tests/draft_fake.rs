//! Drafted decoding on the fake model: every reply equals the serial reply (`draft: false`) by token ids, for
//! context copies and for scripted proposers that are always right, wrong at draft k, or always wrong; and a
//! reply ends exactly where serial would when an EOS, a stop (callback) or max_tokens falls inside a window.

#[allow(dead_code)]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::Arc;
use tf_engine::spec::{DraftTree, Proposer};
use tf_engine::{CostTable, DraftConfig, FinishReason, Flow, GenOutput, GenRequest, Generator, SamplingParams};

const VOCAB: usize = 12;

/// The serial reply from the definition (tests/fake).
fn reference(req: &GenRequest, seed: u64) -> Vec<u32> {
    fake::reference_reply(req, seed, VOCAB)
}

fn costs(w: usize) -> CostTable {
    // Flat: every width costs the same, so the widest window always pays.
    CostTable::from_widths(&vec![1e-3; w])
}

fn run(g: &mut Generator<'_>, req: &GenRequest) -> GenOutput {
    g.generate(req, &mut |_| Flow::Continue).unwrap()
}

/// A proposer that knows the serial reply and proposes it, corrupting the draft at reply index `wrong_at`
/// (`usize::MAX`: never).
struct Scripted {
    prompt_len: usize,
    truth: Vec<u32>,
    wrong_every: Option<usize>,
}

impl Proposer for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree {
        // context = prompt + reply so far (pending last): the next reply index is context.len() − prompt_len.
        let start = context.len() - self.prompt_len;
        let mut chain = Vec::new();
        for i in start..(start + max_tokens).min(self.truth.len()) {
            let t = self.truth[i];
            chain.push(match self.wrong_every {
                Some(k) if i % k == k - 1 => (t + 1) % VOCAB as u32,
                _ => t,
            });
        }
        DraftTree::from_chain(&chain)
    }
    fn observe(&mut self, _: usize, _: usize) {}
    fn reset(&mut self) {}
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 8, top_p: 0.95, seed: Some(seed), ..SamplingParams::default() }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..9u32).map(|i| (i * 5 + 1) % VOCAB as u32).collect(),
        // Repetitive: context copies find matches.
        [1u32, 2, 3, 4, 5].repeat(6),
        vec![7],
        (0..40u32).map(|i| (i * i + 3) % VOCAB as u32).collect(),
    ]
}

#[test]
fn context_copies_give_the_serial_reply_greedy_and_sampled() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let mut drafted_total = 0;
    let mut accepted_total = 0;
    for max_window in [2, 3, 5, 9] {
        g.set_drafting(Some(DraftConfig::new(max_window, costs(max_window))));
        for prompt in prompts() {
            let penalized = SamplingParams {
                repetition_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
                ..SamplingParams { seed: Some(2), ..SamplingParams::greedy() }
            };
            let biased = SamplingParams { logit_bias: vec![(0, -2.0), (5, 1.5), (11, 100.0)], ..sampled(5) };
            for params in [
                SamplingParams { seed: Some(1), ..SamplingParams::greedy() },
                sampled(3),
                sampled(11),
                penalized,
                biased,
            ] {
                let mut req = GenRequest::new(prompt.clone(), params.clone(), 40);
                req.stop_ids = vec![];
                let seed = params.seed.unwrap();
                let drafted = run(&mut g, &req);
                let serial = run(&mut g, &GenRequest { draft: false, ..req.clone() });
                assert_eq!(drafted.tokens, reference(&req, seed), "window {max_window}, prompt {prompt:?}");
                assert_eq!(serial.tokens, drafted.tokens);
                assert_eq!(drafted.token_sha, serial.token_sha);
                assert!(drafted.counts.drafts && !serial.counts.drafts);
                assert!(drafted.counts.min_rows >= 2, "every drafted round verifies a draft: {:?}", drafted.counts);
                assert_eq!(serial.counts.min_rows, 1);
                assert_eq!(serial.counts.rounds, serial.tokens.len() - 1);
                assert!(drafted.counts.accepted <= drafted.counts.drafted);
                drafted_total += drafted.counts.drafted;
                accepted_total += drafted.counts.accepted;
            }
        }
    }
    assert!(accepted_total > 0 && drafted_total > accepted_total, "{accepted_total}/{drafted_total}");
}

fn scripted(g: &mut Generator<'_>, window: usize, truth: Vec<u32>, prompt_len: usize, wrong_every: Option<usize>) {
    let truth = Arc::new(truth);
    let mut c = DraftConfig::new(window, costs(window));
    c.proposer = Some(Arc::new(move |_req: &GenRequest| {
        Box::new(Scripted { prompt_len, truth: truth.to_vec(), wrong_every }) as Box<dyn Proposer>
    }));
    g.set_drafting(Some(c));
}

#[test]
fn always_right_always_wrong_and_wrong_at_k_all_equal_serial() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let prompt: Vec<u32> = (0..11u32).map(|i| (i * 7 + 2) % VOCAB as u32).collect();
    let penalized = SamplingParams { repetition_penalty: 1.5, frequency_penalty: 0.7, ..sampled(9) };
    for params in [SamplingParams { seed: Some(5), ..SamplingParams::greedy() }, sampled(8), penalized] {
        let req = GenRequest::new(prompt.clone(), params.clone(), 33);
        let truth = reference(&req, params.seed.unwrap());
        // Accept all: with 5-row windows each round emits 4 drafts + 1 bonus token.
        scripted(&mut g, 5, truth.clone(), prompt.len(), None);
        let out = run(&mut g, &req);
        assert_eq!(out.tokens, truth);
        assert_eq!(out.counts.accepted, out.counts.drafted.min(out.tokens.len() - 1), "{:?}", out.counts);
        assert_eq!(out.counts.rounds, (out.tokens.len() - 1).div_ceil(5), "{:?}", out.counts);
        // Always wrong: one token per round, like serial.
        scripted(&mut g, 4, truth.clone(), prompt.len(), Some(1));
        let out = run(&mut g, &req);
        assert_eq!(out.tokens, truth);
        assert_eq!(out.counts.accepted, 0);
        assert_eq!(out.counts.rounds, out.tokens.len() - 1);
        // Wrong at every third reply index: rejections in the middle of windows.
        for k in [2, 3, 4] {
            scripted(&mut g, 6, truth.clone(), prompt.len(), Some(k));
            let out = run(&mut g, &req);
            assert_eq!(out.tokens, truth, "wrong every {k}");
            assert!(out.counts.accepted > 0 && out.counts.accepted < out.counts.drafted, "{:?}", out.counts);
        }
    }
}

#[test]
fn a_reply_ends_where_serial_ends_inside_a_window() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let prompt: Vec<u32> = (0..6u32).map(|i| (i * 3 + 1) % VOCAB as u32).collect();
    let params = sampled(21);
    let long = GenRequest::new(prompt.clone(), params.clone(), 30);
    let truth = reference(&long, 21);
    for end in [1usize, 2, 5, 9, 13] {
        // max_tokens inside a window of 8 always-right drafts.
        scripted(&mut g, 8, truth.clone(), prompt.len(), None);
        let req = GenRequest { max_tokens: end, ..long.clone() };
        let out = run(&mut g, &req);
        assert_eq!(out.tokens, truth[..end].to_vec());
        assert_eq!(out.finish_reason, FinishReason::Length);
        // An EOS inside a window: the first occurrence of truth[end − 1] ends the reply.
        let stop = truth[end - 1];
        let first = truth.iter().position(|&t| t == stop).unwrap();
        let req = GenRequest { stop_ids: vec![stop], ..long.clone() };
        let out = run(&mut g, &req);
        assert_eq!(out.tokens, truth[..=first].to_vec(), "EOS {stop}");
        assert_eq!(out.finish_reason, FinishReason::Stop);
        // A stop from the callback (a stop string) at token `end − 1`: nothing after it is emitted.
        let mut seen = Vec::new();
        let out = g
            .generate(&long, &mut |ev| {
                seen.push(ev.token);
                if ev.index == end - 1 {
                    Flow::Stop
                } else {
                    Flow::Continue
                }
            })
            .unwrap();
        assert_eq!(out.tokens, truth[..end].to_vec());
        assert_eq!(seen, out.tokens);
        assert_eq!(out.finish_reason, FinishReason::Cancelled);
    }
}

#[test]
fn the_self_check_passes_on_a_row_exact_model() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let tokens: Vec<u32> = (0..24u32).map(|i| (i * 5 + 3) % VOCAB as u32).collect();
    for w in [2, 3, 8] {
        assert_eq!(g.self_check(&tokens, w).unwrap(), None);
    }
    assert_eq!(g.pool().free_blocks(), 64, "the check frees its blocks");
    let costs = g.measure_costs(4).unwrap();
    assert_eq!((costs.logits.max_width(), costs.argmax.max_width()), (4, 4));
}

/// Proposes a tree: a wrong branch first, then the true continuation as the second branch (and a wrong
/// sibling under the true path's second node), so acceptance must follow the right branch.
struct TreeScripted {
    prompt_len: usize,
    truth: Vec<u32>,
}

impl Proposer for TreeScripted {
    fn name(&self) -> &'static str {
        "tree"
    }
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree {
        let start = context.len() - self.prompt_len;
        let depth = (max_tokens / 2).max(1);
        let truth: Vec<u32> = self.truth.iter().skip(start).take(depth).copied().collect();
        let mut tree = DraftTree::new();
        if truth.is_empty() {
            return tree;
        }
        let wrong: Vec<u32> = truth.iter().map(|t| (t + 1) % VOCAB as u32).collect();
        tree.merge_chain(&wrong);
        tree.merge_chain(&truth);
        if truth.len() >= 3 {
            let mut fork = truth[..2].to_vec();
            fork.push((truth[2] + 3) % VOCAB as u32);
            tree.merge_chain(&fork);
        }
        tree.truncate_to(max_tokens);
        tree
    }
    fn observe(&mut self, _: usize, _: usize) {}
    fn reset(&mut self) {}
}

#[test]
fn tree_windows_accept_along_the_right_branch_and_equal_serial() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let prompt: Vec<u32> = (0..13u32).map(|i| (i * 5 + 4) % VOCAB as u32).collect();
    let penalized = SamplingParams { repetition_penalty: 1.4, presence_penalty: 0.3, ..sampled(4) };
    for params in [SamplingParams { seed: Some(6), ..SamplingParams::greedy() }, sampled(12), penalized] {
        let req = GenRequest::new(prompt.clone(), params.clone(), 37);
        let truth = reference(&req, params.seed.unwrap());
        for window in [3, 5, 9] {
            let truth2 = Arc::new(truth.clone());
            let plen = prompt.len();
            let mut c = DraftConfig::new(window, costs(window));
            c.proposer = Some(Arc::new(move |_: &GenRequest| {
                Box::new(TreeScripted { prompt_len: plen, truth: truth2.to_vec() }) as Box<dyn Proposer>
            }));
            g.set_drafting(Some(c));
            let out = run(&mut g, &req);
            assert_eq!(out.tokens, truth, "window {window}");
            assert!(out.counts.accepted > 0, "{:?}", out.counts);
            assert!(out.counts.rounds < truth.len() - 1, "trees saved rounds: {:?}", out.counts);
            assert_eq!(g.pool().free_blocks(), 64, "scratch blocks are returned");
        }
    }
}

#[test]
fn context_copy_trees_equal_serial() {
    use tf_engine::spec::{NgramConfig, NgramProposer};
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let mut c = DraftConfig::new(8, costs(8));
    c.proposer = Some(Arc::new(|_: &GenRequest| {
        Box::new(NgramProposer::new(NgramConfig { max_candidates: 3, min_n: 1, ..NgramConfig::default() }))
            as Box<dyn Proposer>
    }));
    g.set_drafting(Some(c));
    let mut accepted = 0;
    for prompt in prompts() {
        for params in [SamplingParams { seed: Some(1), ..SamplingParams::greedy() }, sampled(3)] {
            let req = GenRequest::new(prompt.clone(), params.clone(), 40);
            let out = run(&mut g, &req);
            assert_eq!(out.tokens, reference(&req, params.seed.unwrap()), "{prompt:?}");
            accepted += out.counts.accepted;
        }
    }
    assert!(accepted > 0);
}

#[test]
fn round_costs_take_each_width_from_the_way_its_rows_come_back() {
    let mut c = DraftConfig::new(3, CostTable::from_widths(&[1.0, 2.0, 3.0]));
    c.costs.argmax = CostTable::from_widths(&[0.5, 1.0, 1.5]);
    assert_eq!(c.round_costs(false, false).cost[1..], [1.0, 2.0, 3.0]);
    assert_eq!(c.round_costs(true, true).cost[1..], [0.5, 1.0, 1.5]);
    assert_eq!(c.round_costs(true, false).cost[1..], [0.5, 2.0, 3.0]);
    assert_eq!(c.round_costs(false, true).cost[1..], [1.0, 1.0, 1.5]);
}

/// A round is priced as its rows would come back: a greedy request (only argmaxes) with the argmax costs, a
/// sampled one with the costs that include copying the logits. Flat costs for one and steep for the other make
/// one kind draft and the other not; the replies equal serial either way.
#[test]
fn greedy_rounds_are_priced_with_the_argmax_costs_and_sampled_ones_with_the_copy() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 512));
    let mut g = Generator::new(&be, &model, 64, 8).unwrap();
    let prompt: Vec<u32> = (0..11u32).map(|i| (i * 7 + 2) % VOCAB as u32).collect();
    let flat = CostTable::from_widths(&[1e-3; 6]);
    // A window of w ≥ 2 rows costs 2w one-row rounds: never worth it, even if every draft were accepted.
    let steep: Vec<f64> = (1..=6).map(|w| if w == 1 { 1e-3 } else { 2e-3 * w as f64 }).collect();
    let steep = CostTable::from_widths(&steep);
    for params in [SamplingParams { seed: Some(5), ..SamplingParams::greedy() }, sampled(8)] {
        let mut req = GenRequest::new(prompt.clone(), params.clone(), 30);
        req.logprobs = false;
        let greedy = tf_engine::greedy_on_device(&req, &[]);
        let truth = reference(&req, params.seed.unwrap());
        for (argmax_costs, costs) in [(&flat, &steep), (&steep, &flat)] {
            let truth2 = Arc::new(truth.clone());
            let plen = prompt.len();
            let mut c = DraftConfig::new(6, costs.clone());
            c.costs.argmax = argmax_costs.clone();
            c.min_drafts = 0;
            c.proposer = Some(Arc::new(move |_: &GenRequest| {
                Box::new(Scripted { prompt_len: plen, truth: truth2.to_vec(), wrong_every: None }) as Box<dyn Proposer>
            }));
            g.set_drafting(Some(c));
            let out = run(&mut g, &req);
            assert_eq!(out.tokens, truth);
            let what = format!("greedy {greedy}, argmax costs flat {}: {:?}", argmax_costs == &flat, out.counts);
            if (if greedy { argmax_costs } else { costs }) == &flat {
                assert!(out.counts.accepted > 0 && out.counts.rounds < truth.len() - 1, "{what}");
            } else {
                assert_eq!((out.counts.drafted, out.counts.rounds), (0, truth.len() - 1), "{what}");
            }
        }
    }
}
