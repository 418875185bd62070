//! Conformance of the keyed draw with the definition (DESIGN.md §3) as computed by NumPy: 1,500 random rows
//! (ties, every filter, penalties, vocabularies around NumPy's pairwise-sum block sizes) × 4 positions, from
//! `data/keyed_draws.py` (its output, `data/keyed_draws.txt`, is committed).

use tf_core::mix;
use tf_engine::{sample, SamplingParams};

/// The rows' logits, regenerated exactly as the script does (integer arithmetic, exact in f32).
fn logits(case: u64, vocab: usize, quantized: bool) -> Vec<f32> {
    (0..vocab as u64)
        .map(|i| {
            let r = mix((case << 32) ^ i) >> 40;
            if quantized {
                ((r % 41) as f32 - 20.0) * 0.25
            } else {
                (r as f32 - 8_388_608.0) / 2_097_152.0
            }
        })
        .collect()
}

fn list(s: &str) -> Vec<u64> {
    if s == "-" {
        Vec::new()
    } else {
        s.split(',').map(|x| x.parse().unwrap()).collect()
    }
}

#[test]
fn draws_match_the_numpy_definition() {
    let mut draws = 0;
    for line in include_str!("data/keyed_draws.txt").lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 14, "{line}");
        let num = |i: usize| f[i].parse::<f64>().unwrap();
        let p = SamplingParams {
            temperature: num(1),
            top_k: f[2].parse().unwrap(),
            top_p: num(3),
            min_p: num(4),
            repetition_penalty: num(5),
            presence_penalty: num(6),
            frequency_penalty: num(7),
            seed: None,
            logit_bias: Vec::new(),
        };
        let (case, seed): (u64, u64) = (f[0].parse().unwrap(), f[8].parse().unwrap());
        let lg = logits(case, f[9].parse().unwrap(), f[10] == "1");
        let reply: Vec<u32> = list(f[13]).into_iter().map(|t| t as u32).collect();
        for (&pos, &want) in list(f[11]).iter().zip(&list(f[12])) {
            assert_eq!(u64::from(sample(&lg, &p, seed, pos, &reply).token), want, "case {case} position {pos}: {p:?}");
            draws += 1;
        }
    }
    assert_eq!(draws, 6000);
}
