//! Grammar masks in the engine loop (DESIGN.md §8) on the fake model, with a small test grammar over token ids:
//! every reply equals the masked serial definition (the keyed sampler over the allowed ids only), drafted ==
//! serial, concurrent == solo, and a run of forced tokens is drafted for free.

#[allow(dead_code)]
mod fake;

use fake::{FakeBackend, FakeModel};
use std::sync::Arc;
use tf_core::{ConstraintError, ConstraintSpec, TokenConstraint};
use tf_engine::spec::{NgramConfig, NgramProposer, Proposer};
use tf_engine::{CostTable, DraftConfig, Flow, GenOutput, GenRequest, Generator, OnToken, SamplingParams};

const VOCAB: usize = 16;
/// The end-of-sequence id of these tests.
const EOS: u32 = 0;

/// The test grammar, a function of the step `n` (tokens consumed so far):
/// - steps `forced_at..forced_at + forced.len()`: exactly `forced[n - forced_at]`;
/// - from step `len`: EOS only;
/// - otherwise the non-zero ids `t` with `t % 3 == n % 3`, and EOS once `n ≥ min_len`.
#[derive(Debug, Clone)]
struct Steps {
    forced_at: usize,
    forced: Vec<u32>,
    min_len: usize,
    len: usize,
}

impl Steps {
    fn allowed(&self, n: usize, t: u32) -> bool {
        if n >= self.len {
            return t == EOS;
        }
        if n >= self.forced_at && n < self.forced_at + self.forced.len() {
            return t == self.forced[n - self.forced_at];
        }
        if t == EOS {
            return n >= self.min_len;
        }
        t as usize % 3 == n % 3
    }
}

impl ConstraintSpec for Steps {
    fn start(&self) -> Result<Box<dyn TokenConstraint>, ConstraintError> {
        Ok(Box::new(StepsMatcher { g: self.clone(), n: 0 }))
    }
}

struct StepsMatcher {
    g: Steps,
    n: usize,
}

impl TokenConstraint for StepsMatcher {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
        mask.fill(0);
        for t in 0..VOCAB as u32 {
            if self.g.allowed(self.n, t) {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Ok(())
    }
    fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.g.allowed(self.n, token) {
            return Err(ConstraintError(format!("token {token} at step {}", self.n)));
        }
        self.n += 1;
        Ok(())
    }
    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        self.n = self.n.checked_sub(n).ok_or_else(|| ConstraintError("rollback past the start".into()))?;
        Ok(())
    }
    fn forced(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut n = self.n;
        loop {
            let allowed: Vec<u32> = (0..VOCAB as u32).filter(|&t| self.g.allowed(n, t)).collect();
            if allowed.len() != 1 || allowed[0] == EOS {
                return out;
            }
            out.push(allowed[0]);
            n += 1;
        }
    }
    fn is_accepting(&mut self) -> bool {
        self.g.allowed(self.n, EOS)
    }
    fn is_stopped(&self) -> bool {
        self.n >= self.g.len
    }
}

/// The masked serial definition: the keyed sampler on [`fake::reference_logits`] with every id the grammar does
/// not allow at that step set to −∞.
fn reference(req: &GenRequest, g: &Steps) -> Vec<u32> {
    let seed = req.params.seed.expect("tests set seeds");
    let mut history = req.prompt.clone();
    let mut reply = Vec::new();
    while reply.len() < req.max_tokens {
        let mut logits = fake::reference_logits(&history, VOCAB);
        for (t, v) in logits.iter_mut().enumerate() {
            if !g.allowed(reply.len(), t as u32) {
                *v = f32::NEG_INFINITY;
            }
        }
        let t = tf_engine::sample(&logits, &req.params, seed, history.len() as u64, &reply).token;
        reply.push(t);
        history.push(t);
        if req.stop_ids.contains(&t) {
            break;
        }
    }
    reply
}

fn grammar() -> Steps {
    Steps { forced_at: 4, forced: vec![7, 8, 9, 10, 11, 12], min_len: 14, len: 30 }
}

fn requests() -> Vec<GenRequest> {
    (0..8u64)
        .map(|i| {
            let prompt: Vec<u32> =
                [1u32, 2, 3, 4, 5, 6].iter().cycle().skip(i as usize).take(9 + i as usize).copied().collect();
            let params = match i % 3 {
                0 => SamplingParams { seed: Some(i), ..SamplingParams::greedy() },
                1 => SamplingParams { temperature: 0.9, top_k: 6, top_p: 0.9, seed: Some(i), ..Default::default() },
                _ => SamplingParams { temperature: 1.2, repetition_penalty: 1.2, seed: Some(i), ..Default::default() },
            };
            let mut r = GenRequest::new(prompt, params, 40);
            r.stop_ids = vec![EOS];
            r.logprobs = i % 2 == 0;
            r.constraint = Some(Arc::new(grammar()));
            r
        })
        .collect()
}

fn generator<'a>(be: &'a FakeBackend, model: &'a FakeModel) -> Generator<'a> {
    let mut g = Generator::new(be, model, 256, 8).unwrap();
    let mut c = DraftConfig::new(6, CostTable::from_widths(&[1e-3; 6]));
    c.proposer = Some(Arc::new(|_: &GenRequest| {
        Box::new(NgramProposer::new(NgramConfig { max_candidates: 2, min_n: 1, ..NgramConfig::default() }))
            as Box<dyn Proposer>
    }));
    g.set_drafting(Some(c));
    g
}

fn run(g: &mut Generator<'_>, req: &GenRequest) -> GenOutput {
    g.generate(req, &mut |_| Flow::Continue).unwrap()
}

#[test]
fn constrained_replies_follow_the_grammar_and_drafted_equals_serial() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = generator(&be, &model);
    let gram = grammar();
    for req in requests() {
        let want = reference(&req, &gram);
        let drafted = run(&mut g, &req);
        let serial = run(&mut g, &GenRequest { draft: false, ..req.clone() });
        assert_eq!(serial.tokens, want, "{:?}", req.params);
        assert_eq!(drafted.tokens, want, "{:?}", req.params);
        assert_eq!(drafted.token_sha, serial.token_sha);
        for (n, &t) in drafted.tokens.iter().enumerate() {
            assert!(gram.allowed(n, t), "token {t} at step {n}");
        }
        assert_eq!(&drafted.tokens[4..10], &gram.forced[..], "the forced run");
        // The forced run is drafted for free and always accepted.
        assert!(drafted.counts.accepted >= 4, "{:?}", drafted.counts);
    }
}

#[test]
fn constrained_sequences_sharing_rounds_equal_their_solo_runs() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = generator(&be, &model);
    let mut reqs = requests();
    // Unconstrained sequences beside the constrained ones.
    for r in reqs.iter_mut().skip(5) {
        r.constraint = None;
    }
    let items: Vec<(GenRequest, OnToken<'_>)> =
        reqs.iter().map(|r| (r.clone(), Box::new(|_| Flow::Continue) as OnToken<'_>)).collect();
    let outs = g.generate_many(items, 48);
    for (r, o) in reqs.iter().zip(outs) {
        let o = o.unwrap();
        let solo = run(&mut g, r);
        assert_eq!(o.tokens, solo.tokens);
        let want = match r.constraint {
            Some(_) => reference(r, &grammar()),
            None => fake::reference_reply(r, r.params.seed.unwrap(), VOCAB),
        };
        assert_eq!(o.tokens, want);
    }
    assert_eq!(g.pool().free_blocks(), 256);
}

#[test]
fn a_grammar_that_allows_nothing_ends_the_request_with_an_error() {
    #[derive(Debug)]
    struct Nothing;
    struct NothingMatcher;
    impl ConstraintSpec for Nothing {
        fn start(&self) -> Result<Box<dyn TokenConstraint>, ConstraintError> {
            Ok(Box::new(NothingMatcher))
        }
    }
    impl TokenConstraint for NothingMatcher {
        fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
            mask.fill(0);
            Ok(())
        }
        fn consume(&mut self, t: u32) -> Result<(), ConstraintError> {
            Err(ConstraintError(format!("{t}")))
        }
        fn rollback(&mut self, _: usize) -> Result<(), ConstraintError> {
            Ok(())
        }
        fn forced(&mut self) -> Vec<u32> {
            Vec::new()
        }
        fn is_accepting(&mut self) -> bool {
            false
        }
        fn is_stopped(&self) -> bool {
            false
        }
    }
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = generator(&be, &model);
    let mut req = requests().remove(0);
    req.constraint = Some(Arc::new(Nothing));
    let err = g.generate(&req, &mut |_| Flow::Continue).unwrap_err();
    assert!(err.to_string().contains("allows no token"), "{err}");
    assert_eq!(g.pool().free_blocks(), 256, "its blocks are returned");
    // The generator goes on serving.
    let ok = requests().remove(1);
    assert_eq!(run(&mut g, &ok).tokens, reference(&ok, &grammar()));
}

/// A head wider than the tokenizer (padding rows): with a token limit no draw takes a padding id, drafted or
/// not, greedy or sampled, and replies equal the serial definition with those ids masked.
#[test]
fn a_token_limit_masks_the_heads_padding_rows() {
    let (be, model) = (FakeBackend, FakeModel::new(VOCAB, 1024));
    let mut g = generator(&be, &model);
    let limit = 11;
    g.set_token_limit(limit);
    for mut req in requests() {
        req.constraint = None;
        let want = {
            let seed = req.params.seed.unwrap();
            let (mut history, mut reply) = (req.prompt.clone(), Vec::new());
            while reply.len() < req.max_tokens {
                let mut logits = fake::reference_logits(&history, VOCAB);
                logits[limit..].fill(f32::NEG_INFINITY);
                let t = tf_engine::sample(&logits, &req.params, seed, history.len() as u64, &reply).token;
                reply.push(t);
                history.push(t);
                if req.stop_ids.contains(&t) {
                    break;
                }
            }
            reply
        };
        let drafted = run(&mut g, &req);
        let serial = run(&mut g, &GenRequest { draft: false, ..req.clone() });
        assert_eq!(drafted.tokens, want, "{:?}", req.params);
        assert_eq!(serial.tokens, want);
        assert!(drafted.tokens.iter().all(|&t| (t as usize) < limit));
    }
}
