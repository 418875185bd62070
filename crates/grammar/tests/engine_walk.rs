//! The matcher used as the engine uses it in a verify window (DESIGN.md §8): at each step the forced tokens are
//! asked for, a draft path is walked (consume, mask) and rolled back, drafts are cut with `valid_prefix`, and then
//! one token allowed by the mask is consumed. Every token the mask allows must be consumed without error, and
//! the masks after a rollback must equal those of a fresh matcher fed the same tokens.

mod support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{allowed, base_seed, mask_of, tokenizer};
use tf_grammar::{compile, Grammar, GrammarEnv};

#[test]
fn a_tool_call_grammar_survives_draft_paths_and_rollbacks() {
    let tok = tokenizer("qwen05");
    let env = GrammarEnv::new(tok.clone(), tok.stop_ids()).expect("env");
    let width = tok.vocab_size() + 5;
    let lark = r#"start: "<tool_call>\n" %json{"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false} "\n</tool_call>""#;
    let spec = compile(&env, &Grammar::Lark(lark.into())).expect("compile");
    // The byte length of every token, to prefer long tokens (those spanning lexemes, as a model's often do).
    let lens: Vec<usize> = (0..tok.vocab_size() as u32).map(|t| tok.token_to_piece(t).len()).collect();
    for walk in 0..8u64 {
        let seed = base_seed() ^ walk;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut m = spec.start().expect("start");
        let mut history = Vec::new();
        for step in 0..3000 {
            let _ = m.forced();
            // A draft path of up to 4 tokens, each allowed at its state, then rolled back.
            let depth = rng.gen_range(0..5);
            let mut walked = 0;
            for _ in 0..depth {
                let options = allowed(&mask_of(m.as_mut(), width));
                if options.is_empty() || m.is_stopped() {
                    break;
                }
                let t = pick(&mut rng, &options, &lens);
                m.consume(t).unwrap_or_else(|e| panic!("seed {seed} step {step}: draft {t} allowed but {e}"));
                walked += 1;
            }
            m.rollback(walked).expect("rollback");
            let before = mask_of(m.as_mut(), width);
            let mut fresh = spec.start().expect("start");
            for &t in &history {
                fresh.consume(t).expect("replay");
            }
            assert_eq!(
                before,
                mask_of(fresh.as_mut(), width),
                "seed {seed} step {step}: mask after a rolled-back path"
            );
            let options = allowed(&before);
            let junk: Vec<u32> = (0..3).map(|_| rng.gen_range(0..tok.vocab_size() as u32)).collect();
            let _ = m.valid_prefix(&junk);
            let t = pick(&mut rng, &options, &lens);
            m.consume(t).unwrap_or_else(|e| panic!("seed {seed} step {step}: {t} allowed but {e} after {history:?}"));
            history.push(t);
            if tok.stop_ids().contains(&t) {
                break;
            }
        }
        assert!(m.is_stopped() || m.is_accepting(), "seed {seed}: the walk ended inside the call: {history:?}");
    }
}

/// A reference by id to an ordinary token is refused: llguidance masks it by id but consumes it by its bytes.
#[test]
fn token_references_must_be_special_tokens() {
    let tok = tokenizer("qwen05");
    let env = GrammarEnv::new(tok.clone(), tok.stop_ids()).expect("env");
    let e = compile(&env, &Grammar::Lark(r#"start: "a" <[151658]>"#.into())).expect_err("refused");
    assert!(e.to_string().contains("not a special token") && e.to_string().contains("</tool_call>"), "{e}");
    let im_end = tok.id_of("<|im_end|>").expect("a control token");
    compile(&env, &Grammar::Lark(format!(r#"start: "a" <[{im_end}]>"#))).expect("a control token is fine");
}

/// An allowed token: the longest one half the time, else a uniform choice.
fn pick(rng: &mut StdRng, options: &[u32], lens: &[usize]) -> u32 {
    if rng.gen_bool(0.5) {
        *options.iter().max_by_key(|&&t| (lens.get(t as usize).copied().unwrap_or(0), std::cmp::Reverse(t))).unwrap()
    } else {
        options[rng.gen_range(0..options.len())]
    }
}
