//! The thinking budget on the tiny Qwen3 tokenizer (`fixtures/tiny-qwen3`: 407 ids, `<think>` 405, `</think>`
//! 406, end of sequence `<|im_end|>` 402 and `<|endoftext|>` 400; masks sized for its 448-row head). Seeded random
//! walks over the masks: at most N thinking tokens, `</think>` forced exactly at N, every mask equal to one
//! computed from scratch from the walk's tokens, rollback to any depth giving bitwise-equal masks, and an inner
//! grammar that applies only after thinking.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tf_core::{mask_allows, ConstraintSpec, TokenConstraint};
use tf_grammar::{compile, Grammar, GrammarEnv, ThinkingBudget};
use tf_text::Tokenizer;

const HEAD: usize = 448;
const THINK: u32 = 405;
const END: u32 = 406;

fn env() -> GrammarEnv {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-qwen3");
    let tok = Arc::new(Tokenizer::from_hf_dir(&dir).expect("tokenizer"));
    GrammarEnv::new(tok.clone(), tok.stop_ids()).expect("grammar env")
}

fn mask(c: &mut dyn TokenConstraint) -> Vec<u32> {
    let mut m = vec![0u32; HEAD.div_ceil(32)];
    c.fill_mask(&mut m).expect("mask");
    m
}

fn ids(m: &[u32]) -> Vec<u32> {
    (0..(m.len() * 32) as u32).filter(|&t| mask_allows(m, t)).collect()
}

fn all_but(vocab: usize, except: &[u32]) -> Vec<u32> {
    (0..vocab as u32).filter(|t| !except.contains(t)).collect()
}

/// The mask a budget without inner constraint must give after `tokens`, from the rules alone.
fn expected(tokens: &[u32], budget: usize, starts_inside: bool, vocab: usize) -> Vec<u32> {
    let mut inside = starts_inside;
    let mut count = 0;
    let mut before = !starts_inside;
    for &t in tokens {
        if before {
            before = false;
            inside = t == THINK;
        } else if inside {
            if t == END {
                inside = false;
            } else {
                count += 1;
            }
        }
    }
    if inside && count >= budget {
        vec![END]
    } else {
        all_but(vocab, &[])
    }
}

/// A random allowed token, leaning towards `</think>` and end of sequence now and then so walks end both ways.
fn pick(rng: &mut StdRng, m: &[u32], eos: &[u32]) -> u32 {
    let allowed = ids(m);
    assert!(!allowed.is_empty());
    let r = rng.gen_range(0..100);
    if r < 6 && allowed.contains(&END) {
        return END;
    }
    if r < 9 {
        if let Some(&e) = eos.iter().find(|e| allowed.contains(e)) {
            return e;
        }
    }
    allowed[rng.gen_range(0..allowed.len())]
}

#[test]
fn walks_think_at_most_n_tokens_and_end_is_forced_at_n() {
    let env = env();
    let vocab = env.vocab_size();
    assert_eq!(vocab, 407);
    let eos = env.eos_ids().to_vec();
    let mut forced_seen = 0;
    for budget in [0usize, 1, 2, 5, 17] {
        for starts_inside in [false, true] {
            let spec = ThinkingBudget::for_env(&env, budget).unwrap().starting_inside(starts_inside);
            assert_eq!((spec.think_start, spec.think_end), (THINK, END));
            for walk in 0..40u64 {
                let seed = 1000 * budget as u64 + 10 * walk + starts_inside as u64;
                let mut rng = StdRng::seed_from_u64(seed);
                let mut c = spec.start().unwrap();
                let mut tokens = Vec::new();
                // Open the block first in most walks that start outside.
                if !starts_inside && walk % 4 != 0 {
                    c.consume(THINK).unwrap();
                    tokens.push(THINK);
                }
                for _ in 0..40 {
                    let m = mask(c.as_mut());
                    let want = expected(&tokens, budget, starts_inside, vocab);
                    assert_eq!(ids(&m), want, "seed {seed}: mask after {tokens:?}");
                    if want == [END] {
                        assert_eq!(c.forced(), vec![END], "seed {seed}");
                        assert!(!c.is_accepting(), "seed {seed}: the reply may not end at the limit");
                        forced_seen += 1;
                    } else {
                        assert_eq!(c.forced(), Vec::<u32>::new(), "seed {seed}");
                        assert!(c.is_accepting(), "seed {seed}: without an inner constraint the reply may end");
                    }
                    let t = pick(&mut rng, &m, &eos);
                    c.consume(t).unwrap();
                    tokens.push(t);
                    if eos.contains(&t) {
                        break;
                    }
                }
                // Thinking tokens: after `<think>` (or from the start), up to `</think>`.
                let opened = starts_inside || tokens.first() == Some(&THINK);
                if opened {
                    let body = &tokens[usize::from(!starts_inside)..];
                    let n = body.iter().position(|&t| t == END).unwrap_or(body.len());
                    assert!(n <= budget, "seed {seed}: {n} thinking tokens over a budget of {budget}: {tokens:?}");
                    if n == budget && body.len() > n {
                        assert_eq!(body[n], END, "seed {seed}");
                    }
                }
                assert!(!c.is_stopped());
            }
        }
    }
    assert!(forced_seen > 100, "walks reached the limit {forced_seen} times");
}

#[test]
fn rollback_gives_bitwise_equal_masks() {
    let env = env();
    let inner = compile(&env, &Grammar::Regex("[a-z]{1,6}( [a-z]{1,6}){0,3}".into())).unwrap();
    for (k, with_inner) in [false, true].into_iter().enumerate() {
        for starts_inside in [false, true] {
            let mut spec = ThinkingBudget::for_env(&env, 6).unwrap().starting_inside(starts_inside);
            if with_inner {
                spec = spec.then(inner.clone());
            }
            for walk in 0..25u64 {
                let seed = 7_000 + 100 * k as u64 + 10 * walk + starts_inside as u64;
                let mut rng = StdRng::seed_from_u64(seed);
                let mut c = spec.start().unwrap();
                let mut tokens: Vec<u32> = Vec::new();
                let mut masks = vec![mask(c.as_mut())];
                for step in 0..30 {
                    let m = masks.last().unwrap().clone();
                    if ids(&m).is_empty() {
                        break;
                    }
                    let t = pick(&mut rng, &m, &[]);
                    // A token outside the mask is refused and changes nothing.
                    if let Some(bad) = (0..HEAD as u32).find(|&b| !mask_allows(&m, b)) {
                        assert!(c.consume(bad).is_err(), "seed {seed}: token {bad} refused");
                        assert_eq!(mask(c.as_mut()), m, "seed {seed}: state after a refused token");
                    }
                    // valid_prefix leaves the state as it was.
                    let _ = c.valid_prefix(&[t, t, t]);
                    assert_eq!(mask(c.as_mut()), m, "seed {seed}: state after valid_prefix");
                    c.consume(t).unwrap();
                    tokens.push(t);
                    masks.push(mask(c.as_mut()));
                    if step % 5 == 4 {
                        // Roll back a random depth, compare, and replay.
                        let n = rng.gen_range(1..=tokens.len());
                        c.rollback(n).unwrap();
                        let depth = tokens.len() - n;
                        assert_eq!(mask(c.as_mut()), masks[depth], "seed {seed}: rollback of {n} to depth {depth}");
                        for &t in &tokens[depth..] {
                            c.consume(t).unwrap();
                        }
                        assert_eq!(&mask(c.as_mut()), masks.last().unwrap(), "seed {seed}: replayed");
                    }
                }
                // Serial replay from a fresh matcher gives the same masks at every depth.
                let mut fresh = spec.start().unwrap();
                for (d, &t) in tokens.iter().enumerate() {
                    assert_eq!(mask(fresh.as_mut()), masks[d], "seed {seed}: fresh replay at depth {d}");
                    fresh.consume(t).unwrap();
                }
                assert!(c.rollback(tokens.len() + 1).is_err());
                c.rollback(tokens.len()).unwrap();
                assert_eq!(mask(c.as_mut()), masks[0], "seed {seed}: rolled back to the start");
            }
        }
    }
}

#[test]
fn the_inner_grammar_applies_only_after_thinking() {
    let env = env();
    let tok = env.tokenizer().clone();
    let vocab = env.vocab_size();
    let eos = env.eos_ids().to_vec();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": false
    });
    let inner = compile(&env, &Grammar::JsonSchema { schema, strict: true }).unwrap();
    let open_brace = tok.encode("{", false, false).unwrap();
    assert_eq!(open_brace.len(), 1);
    let letter = tok.encode("x", false, false).unwrap()[0];
    let mut answers = 0;
    for starts_inside in [false, true] {
        let spec = ThinkingBudget::for_env(&env, 8).unwrap().starting_inside(starts_inside).then(inner.clone());
        for walk in 0..40u64 {
            let seed = 9_000 + 10 * walk + starts_inside as u64;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut c = spec.start().unwrap();
            let mut fresh_inner = inner.start().unwrap();
            if !starts_inside {
                // Before: the answer's first tokens and `<think>`.
                let m = ids(&mask(c.as_mut()));
                assert!(m.contains(&THINK) && m.contains(&open_brace[0]) && !m.contains(&letter), "seed {seed}");
                assert!(eos.iter().all(|e| !m.contains(e)), "seed {seed}: an empty answer is not valid");
                c.consume(THINK).unwrap();
            }
            // Inside: anything but the end of sequence (the answer's schema would be left unmet), and text the
            // schema would refuse.
            let mut thinking = 0;
            loop {
                let m = mask(c.as_mut());
                if thinking == 8 {
                    assert_eq!(ids(&m), vec![END], "seed {seed}");
                    let forced = c.forced();
                    assert_eq!(forced[0], END, "seed {seed}");
                    // What the schema forces at its start follows `</think>`.
                    let mut f2 = inner.start().unwrap();
                    assert_eq!(forced[1..], f2.forced()[..], "seed {seed}");
                } else {
                    assert_eq!(ids(&m), all_but(vocab, &eos), "seed {seed}: inside thinking");
                    assert!(!c.is_accepting());
                    assert!(c.consume(eos[0]).is_err());
                }
                let t = if thinking < 8 && rng.gen_range(0..10) == 0 {
                    END
                } else if thinking < 8 {
                    [letter, open_brace[0], THINK, rng.gen_range(0..vocab as u32)][rng.gen_range(0..4)]
                } else {
                    END
                };
                let t = if eos.contains(&t) { letter } else { t };
                c.consume(t).unwrap();
                if t == END {
                    break;
                }
                thinking += 1;
            }
            // After: exactly the fresh schema's masks, token by token, to the end of the answer.
            let mut answer = Vec::new();
            for _ in 0..60 {
                let m = mask(c.as_mut());
                assert_eq!(m, mask(fresh_inner.as_mut()), "seed {seed}: after thinking, the schema's mask");
                assert_eq!(c.is_accepting(), fresh_inner.is_accepting());
                let t = pick(&mut rng, &m, &eos);
                if eos.contains(&t) {
                    break;
                }
                c.consume(t).unwrap();
                fresh_inner.consume(t).unwrap();
                answer.push(t);
            }
            let text = tok.decode(&answer, false).unwrap();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                // An integer (`-0` parses as a float), the only key.
                assert!(v["answer"].as_f64().is_some_and(|x| x.fract() == 0.0), "seed {seed}: {text}");
                assert_eq!(v.as_object().map(|o| o.len()), Some(1), "seed {seed}: {text}");
                answers += 1;
            }
        }
    }
    assert!(answers > 20, "{answers} walks wrote a complete answer");
}

#[test]
fn without_a_block_and_at_budget_zero() {
    let env = env();
    let vocab = env.vocab_size();
    // A reply whose first token does not open the block has no budget at all.
    let spec = ThinkingBudget::for_env(&env, 1).unwrap();
    let mut c = spec.start().unwrap();
    c.consume(7).unwrap();
    for t in [THINK, 9, 10, 11, END, 12] {
        assert_eq!(ids(&mask(c.as_mut())), all_but(vocab, &[]));
        c.consume(t).unwrap();
    }
    assert!(c.forced().is_empty());
    // Budget 0: `</think>` right after `<think>` (or at once, starting inside), then anything.
    let spec = ThinkingBudget::for_env(&env, 0).unwrap();
    let mut c = spec.start().unwrap();
    c.consume(THINK).unwrap();
    assert_eq!(c.forced(), vec![END]);
    assert!(c.consume(5).is_err() && c.consume(THINK).is_err() && c.consume(402).is_err());
    c.consume(END).unwrap();
    assert_eq!(ids(&mask(c.as_mut())), all_but(vocab, &[]));
    let mut c = spec.clone().starting_inside(true).start().unwrap();
    assert_eq!(c.forced(), vec![END]);
    // Ids past the vocabulary are never allowed and never consumed.
    assert!(c.consume(vocab as u32).is_err());
    let mut c = ThinkingBudget::for_env(&env, 3).unwrap().start().unwrap();
    let m = mask(c.as_mut());
    assert!(!mask_allows(&m, vocab as u32) && mask_allows(&m, vocab as u32 - 1));
    assert!(c.consume(vocab as u32 + 3).is_err());
    // Markers outside the vocabulary are refused when the matcher starts.
    let bad = ThinkingBudget::new(THINK, vocab as u32, 3, vocab, env.eos_ids());
    assert!(bad.start().is_err());
}
