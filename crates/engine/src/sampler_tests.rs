//! Sampler tests: known vectors computed from the published definition, tie-breaking, filter order, the
//! distribution of draws (chi-square), penalties and validation.

use super::*;

fn params(temperature: f64, top_k: usize, top_p: f64, min_p: f64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, ..SamplingParams::default() }
}

const SMALL: [f32; 12] = [1.5, -0.25, 2.0, 2.0, 0.0, -3.0, 1.5, 0.75, -1.0, 2.0, 0.5, -0.5];

fn tied() -> Vec<f32> {
    (0..300u32).map(|i| ((i * 7919) % 131) as f32 * 0.0625 - 4.0).collect()
}

fn frac() -> Vec<f32> {
    (0..300u32).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect()
}

fn draws(logits: &[f32], p: &SamplingParams, seed: u64, reply: &[u32]) -> Vec<u32> {
    (100..124u64).map(|pos| sample(logits, p, seed, pos, reply).token).collect()
}

// Expected tokens computed independently from DESIGN.md §3 with this Python one-off (NumPy 2.4.6; lexsort,
// np.sum's pairwise order and a sequential cumsum are NumPy's own):
//
//   import math, numpy as np
//   M = (1 << 64) - 1
//   def mix(z):
//       z ^= z >> 30; z = (z * 0xBF58476D1CE4E5B9) & M
//       z ^= z >> 27; z = (z * 0x94D049BB133111EB) & M
//       return z ^ (z >> 31)
//   def uniform(seed, pos, tok):
//       x = mix((seed + 0x9E3779B97F4A7C15) & M)
//       x = mix(x ^ ((pos * 0xD1B54A32D192ED03) & M))
//       x = mix(x ^ tok)
//       return (x >> 11) * 2.0**-53 + 2.0**-54
//   def penalize(v, hist, rep, pres, freq):
//       v = v.astype(np.float64).copy()
//       if not hist or (rep == 1.0 and pres == 0.0 and freq == 0.0): return v
//       cnt = {}
//       for t in hist: cnt[t] = cnt.get(t, 0) + 1
//       for t, c in cnt.items():
//           if rep != 1.0: v[t] = v[t] / rep if v[t] > 0 else v[t] * rep
//           v[t] -= freq * c + pres
//       return v
//   def draw(logits, pos, seed, T, top_k, top_p, min_p, hist=(), rep=1.0, pres=0.0, freq=0.0):
//       v = penalize(np.asarray(logits, dtype=np.float32), list(hist), rep, pres, freq)
//       ids = np.arange(len(v))
//       if T <= 0:
//           return int(np.lexsort((ids, -v))[0])
//       order = np.lexsort((ids, -v))
//       k = max(1, min(top_k if top_k else len(v), len(v)))
//       ids = ids[order][:k]
//       scaled = v[order][:k] / max(T, 1e-6)
//       if 0.0 < top_p < 1.0:
//           probs = np.exp(scaled - scaled.max()); probs /= probs.sum()
//           keep = int((np.cumsum(probs) < top_p).sum()) + 1
//           ids, scaled = ids[:keep], scaled[:keep]
//       if min_p > 0.0:
//           keep = int((scaled >= scaled[0] + math.log(min_p)).sum())
//           ids, scaled = ids[:keep], scaled[:keep]
//       g = np.array([-math.log(-math.log(uniform(seed, pos, int(t)))) for t in ids])
//       return int(ids[int(np.argmax(scaled + g))])
//   def logprob(logits, tok, hist=(), rep=1.0, pres=0.0, freq=0.0):
//       v = penalize(np.asarray(logits, dtype=np.float32), list(hist), rep, pres, freq)
//       m = float(v.max()); s = 0.0
//       for x in v: s += math.exp(float(x) - m)
//       return float(v[tok]) - m - math.log(s)
//   small = np.array([1.5, -0.25, 2.0, 2.0, 0.0, -3.0, 1.5, 0.75, -1.0, 2.0, 0.5, -0.5], dtype=np.float32)
//   tied = np.array([((i * 7919) % 131) * 0.0625 - 4.0 for i in range(300)], dtype=np.float32)
//   frac = np.array([np.float32((i * 7919) % 1000) / np.float32(100) - np.float32(5) for i in range(300)],
//                   dtype=np.float32)
//   cases = [
//       ("small_t08_all", small, dict(T=0.8, top_k=0, top_p=1.0, min_p=0.0)),
//       ("small_k5_p09_m005", small, dict(T=1.3, top_k=5, top_p=0.9, min_p=0.05)),
//       ("small_p07_t05", small, dict(T=0.5, top_k=0, top_p=0.7, min_p=0.0)),
//       ("small_pen", small, dict(T=1.0, top_k=8, top_p=1.0, min_p=0.0, hist=(3, 3, 7, 1, 5), rep=1.3,
//                                 pres=0.5, freq=0.25)),
//       ("tied_p095", tied, dict(T=1.0, top_k=0, top_p=0.95, min_p=0.0)),
//       ("tied_k40_m02", tied, dict(T=0.7, top_k=40, top_p=1.0, min_p=0.2)),
//       ("frac_p09_t15", frac, dict(T=1.5, top_k=0, top_p=0.9, min_p=0.0)),
//   ]
//   seed = 987654321
//   for name, lg, kw in cases:
//       print(name, [draw(lg, pos, seed, **kw) for pos in range(100, 124)])
//   print("greedy small", draw(small, 0, 1, 0.0, 0, 1.0, 0.0), "greedy tied", draw(tied, 0, 1, 0.0, 0, 1.0, 0.0))
//   print("greedy small pen", draw(small, 0, 1, 0.0, 0, 1.0, 0.0, hist=(2, 3, 9), rep=1.5))
//   print("logprob small 2", repr(logprob(small, 2)), "logprob small pen 3",
//         repr(logprob(small, 3, hist=(3, 3, 7, 1, 5), rep=1.3, pres=0.5, freq=0.25)))
//
// Output:
//   small_t08_all [9, 9, 2, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 6, 2, 3, 2, 6, 2, 7, 6, 2, 2]
//   small_k5_p09_m005 [9, 9, 6, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 6, 2, 3, 6, 6, 2, 2, 6, 2, 2]
//   small_p07_t05 [9, 9, 2, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 3, 2, 3, 2, 2, 2, 2, 3, 2, 2]
//   small_pen [9, 9, 2, 9, 9, 9, 9, 9, 2, 0, 9, 2, 9, 10, 6, 2, 3, 6, 6, 2, 7, 6, 2, 2]
//   tied_p095 [273, 51, 153, 31, 242, 144, 195, 266, 106, 122, 202, 293, 111, 162, 13, 22, 295, 11, 46, 266,
//              13, 286, 173, 77]
//   tied_k40_m02 [273, 51, 153, 31, 242, 293, 111, 293, 204, 222, 202, 293, 111, 162, 133, 22, 102, 11, 162,
//                 202, 184, 273, 173, 71]
//   frac_p09_t15 [161, 236, 199, 136, 38, 136, 223, 87, 89, 199, 75, 285, 250, 247, 13, 38, 286, 248, 176, 173,
//                 161, 137, 173, 87]
//   greedy small 2 greedy tied 111
//   greedy small pen 0
//   logprob small 2 -1.6296406162033694 logprob small pen 3 -2.871693036275378
#[test]
fn known_vectors_from_the_published_definition() {
    let seed = 987654321;
    let pen = SamplingParams {
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..params(1.0, 8, 1.0, 0.0)
    };
    let hist = [3, 3, 7, 1, 5];
    let cases: [(&str, Vec<u32>, Vec<u32>); 7] = [
        (
            "small_t08_all",
            draws(&SMALL, &params(0.8, 0, 1.0, 0.0), seed, &[]),
            vec![9, 9, 2, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 6, 2, 3, 2, 6, 2, 7, 6, 2, 2],
        ),
        (
            "small_k5_p09_m005",
            draws(&SMALL, &params(1.3, 5, 0.9, 0.05), seed, &[]),
            vec![9, 9, 6, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 6, 2, 3, 6, 6, 2, 2, 6, 2, 2],
        ),
        (
            "small_p07_t05",
            draws(&SMALL, &params(0.5, 0, 0.7, 0.0), seed, &[]),
            vec![9, 9, 2, 9, 9, 3, 9, 9, 3, 3, 9, 2, 9, 3, 3, 2, 3, 2, 2, 2, 2, 3, 2, 2],
        ),
        (
            "small_pen",
            draws(&SMALL, &pen, seed, &hist),
            vec![9, 9, 2, 9, 9, 9, 9, 9, 2, 0, 9, 2, 9, 10, 6, 2, 3, 6, 6, 2, 7, 6, 2, 2],
        ),
        (
            "tied_p095",
            draws(&tied(), &params(1.0, 0, 0.95, 0.0), seed, &[]),
            vec![
                273, 51, 153, 31, 242, 144, 195, 266, 106, 122, 202, 293, 111, 162, 13, 22, 295, 11, 46, 266, 13, 286,
                173, 77,
            ],
        ),
        (
            "tied_k40_m02",
            draws(&tied(), &params(0.7, 40, 1.0, 0.2), seed, &[]),
            vec![
                273, 51, 153, 31, 242, 293, 111, 293, 204, 222, 202, 293, 111, 162, 133, 22, 102, 11, 162, 202, 184,
                273, 173, 71,
            ],
        ),
        (
            "frac_p09_t15",
            draws(&frac(), &params(1.5, 0, 0.9, 0.0), seed, &[]),
            vec![
                161, 236, 199, 136, 38, 136, 223, 87, 89, 199, 75, 285, 250, 247, 13, 38, 286, 248, 176, 173, 161, 137,
                173, 87,
            ],
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, want, "{name}");
    }
    let g = SamplingParams::greedy();
    assert_eq!(sample(&SMALL, &g, 1, 0, &[]).token, 2);
    assert_eq!(sample(&tied(), &g, 1, 0, &[]).token, 111);
    let g_pen = SamplingParams { repetition_penalty: 1.5, ..g };
    assert_eq!(sample(&SMALL, &g_pen, 1, 0, &[2, 3, 9]).token, 0);
    // Logprobs: same libm on Linux gives the same bits; allow an ulp-scale slack for other platforms.
    let lp = log_softmax_at(&penalized(&SMALL, &params(1.0, 0, 1.0, 0.0), &[]), 2);
    assert!((lp - -1.6296406162033694).abs() < 1e-12, "{lp}");
    let lp = log_softmax_at(&penalized(&SMALL, &pen, &hist), 3);
    assert!((lp - -2.871693036275378).abs() < 1e-12, "{lp}");
}

// NumPy reference for the summation order (NumPy 2.4.6):
//   a = np.array([((i * 7919) % 1000) / 7.0 * 10.0 ** ((i % 5) * 4 - 8) for i in range(300)])
//   print(repr(float(np.sum(a))), repr(sequential_sum(a)), repr(float(np.sum(a[:100]))), repr(float(np.sum(a[:5]))))
//   -> 424472247204.70416 424472247204.704 136728844258.70615 9658224405.4417
#[test]
fn pairwise_sum_follows_numpy() {
    let pow = [1e-8, 1e-4, 1.0, 1e4, 1e8];
    let a: Vec<f64> = (0..300usize).map(|i| ((i * 7919) % 1000) as f64 / 7.0 * pow[i % 5]).collect();
    assert_eq!(pairwise_sum(&a), 424472247204.70416);
    assert_eq!(a.iter().fold(0.0, |s, &x| s + x), 424472247204.704, "the sequential sum differs, so the test bites");
    assert_eq!(pairwise_sum(&a[..100]), 136728844258.70615);
    assert_eq!(pairwise_sum(&a[..5]), 9658224405.4417);
}

#[test]
fn greedy_ties_go_to_the_lower_id() {
    let g = SamplingParams::greedy();
    assert_eq!(sample(&[0.0, 3.0, 1.0, 3.0], &g, 0, 0, &[]).token, 1);
    assert_eq!(sample(&[5.0, 5.0], &g, 9, 9, &[]).token, 0);
    assert_eq!(sample(&[f32::NAN, -1.0, f32::NAN], &g, 0, 0, &[]).token, 1, "NaN is treated as −∞");
    // Negative temperature is greedy too (validation rejects it for requests).
    assert_eq!(sample(&[0.0, 3.0, 1.0, 3.0], &params(-1.0, 0, 1.0, 0.0), 0, 0, &[]).token, 1);
    // top_k = 1 is greedy by another road, ties to the lower id as well.
    for pos in 0..50 {
        assert_eq!(sample(&[0.0, 3.0, 1.0, 3.0], &params(1.0, 1, 1.0, 0.0), 5, pos, &[]).token, 1);
    }
}

#[test]
fn candidate_ties_resolve_by_id_at_the_top_k_boundary() {
    // Ids 1, 2, 3 tie at the boundary of top_k = 2: the lower ids 1 and 2 are kept (after id 0).
    let logits = [2.0, 1.0, 1.0, 1.0, 0.0];
    let k = kept(&penalized(&logits, &SamplingParams::default(), &[]), &params(1.0, 3, 1.0, 0.0));
    assert_eq!(k.ids, vec![0, 1, 2]);
    let k = kept(&penalized(&logits, &SamplingParams::default(), &[]), &params(1.0, 2, 1.0, 0.0));
    assert_eq!(k.ids, vec![0, 1]);
}

fn kept_ids(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
    let mut ids = kept(&penalized(logits, p, &[]), p).ids;
    ids.sort_unstable();
    ids
}

/// Logits whose softmax is `probs` exactly up to rounding.
fn ln(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

#[test]
fn filters_apply_top_k_then_top_p_then_min_p() {
    let probs = [0.4, 0.3, 0.1, 0.1, 0.05, 0.05];
    let logits = ln(&probs);
    // top_k = 2 renormalizes to [0.571, 0.429]: top_p = 0.5 then keeps one token. Top-p over the whole
    // distribution first (cumsum 0.4, 0.7) would keep two.
    assert_eq!(kept_ids(&logits, &params(1.0, 2, 0.5, 0.0)), vec![0]);
    assert_eq!(kept_ids(&logits, &params(1.0, 0, 0.5, 0.0)), vec![0, 1]);
    // top_p = 0.75 over the whole distribution keeps three (cumsum 0.4, 0.7, 0.8), then min_p = 0.2 (p ≥ 0.08)
    // keeps all three. Min-p first (vLLM's order) would renormalize over {0..3} and top-p would keep two.
    assert_eq!(kept_ids(&logits, &params(1.0, 0, 0.75, 0.2)), vec![0, 1, 2]);
    // Min-p alone: p ≥ 0.3·0.4 = 0.12 keeps two.
    assert_eq!(kept_ids(&logits, &params(1.0, 0, 1.0, 0.3)), vec![0, 1]);
    // Temperature sharpens before min-p: at T = 0.5, p ∝ probs², so 0.1² / 0.4² = 0.0625 < 0.1 drops ids 2, 3.
    assert_eq!(kept_ids(&logits, &params(0.5, 0, 1.0, 0.1)), vec![0, 1]);
    // Draws never leave the kept set and reach all of it.
    let p = params(1.0, 0, 0.75, 0.2);
    let mut seen = [0usize; 6];
    for pos in 0..3000 {
        seen[sample(&logits, &p, 77, pos, &[]).token as usize] += 1;
    }
    assert!(seen[0] > 0 && seen[1] > 0 && seen[2] > 0, "{seen:?}");
    assert_eq!(seen[3] + seen[4] + seen[5], 0, "{seen:?}");
}

#[test]
fn exact_arithmetic_details() {
    // Temperature divides (published `values / T`); 1.7f32 / 3 and 1.7f32 · (1/3) differ in the last bit
    // (Python: 0.5666666825612386 vs 0.5666666825612385).
    let k = kept(&penalized(&[1.7f32, 0.0], &SamplingParams::default(), &[]), &params(3.0, 0, 0.99, 0.0));
    assert_eq!(k.scaled[0], 0.5666666825612386);
    assert_ne!(k.scaled[0], f64::from(1.7f32) * (1.0 / 3.0));
    // Min-p keeps a token exactly on the floor (≥): ln(exp(−1)) == −1 exactly, and 1.0 == 2.0 + (−1).
    let min_p = (-1.0f64).exp();
    assert_eq!(min_p.ln(), -1.0);
    assert_eq!(kept_ids(&[2.0, 1.0, 0.5], &params(1.0, 0, 1.0, min_p)), vec![0, 1]);
}

/// Pearson's statistic of `counts` against the distribution `probs` (cells with p = 0 must be empty).
fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    let mut stat = 0.0;
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            if c > 0 {
                return f64::INFINITY;
            }
            continue;
        }
        let e = n as f64 * p;
        stat += (c as f64 - e).powi(2) / e;
    }
    stat
}

fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let top = logits.iter().map(|&x| f64::from(x) / t).fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&x| (f64::from(x) / t - top).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn counts(logits: &[f32], p: &SamplingParams, seed: u64, n: u64, fixed_position: bool) -> Vec<usize> {
    let mut c = vec![0usize; logits.len()];
    for pos in 0..n {
        let pos = if fixed_position { 1000 } else { pos };
        c[sample(logits, p, seed, pos, &[]).token as usize] += 1;
    }
    c
}

// χ² critical value at significance 0.001: 7 degrees of freedom (8 cells).
const CHI2_7DF_999: f64 = 24.322;

#[test]
fn draws_follow_softmax_over_positions() {
    let logits = [1.0f32, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.2];
    let t = 0.8;
    let want = softmax(&logits, t);
    let p = params(t, 0, 1.0, 0.0);
    for seed in [1u64, 2, 3, 0xDEAD_BEEF, u64::MAX] {
        let c = counts(&logits, &p, seed, 20_000, false);
        let stat = chi_square(&c, &want);
        assert!(stat < CHI2_7DF_999, "seed {seed}: χ² = {stat} for {c:?}");
        // The same counts against a wrong distribution (temperature ignored) are rejected: the test can fail.
        let wrong = chi_square(&c, &softmax(&logits, 1.0));
        assert!(wrong > CHI2_7DF_999 * 4.0, "seed {seed}: χ² vs the wrong distribution only {wrong}");
    }
    // A deliberately broken draw (noise not keyed on position: every draw identical) fails too.
    let c = counts(&logits, &p, 1, 20_000, true);
    assert!(chi_square(&c, &want) > CHI2_7DF_999 * 100.0, "{c:?}");
}

#[test]
fn truncated_draws_follow_the_renormalized_kept_set() {
    // top_k = 6 then top_p = 0.8: kept = the prefix of the top-6 renormalized distribution reaching 0.8.
    let logits = [1.0f32, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.2];
    let p = params(1.0, 6, 0.8, 0.0);
    let kept = kept_ids(&logits, &p);
    // top-6 renormalized: 0.424, 0.191, 0.156, 0.095, ... → cumsum < 0.8 for three, keep four.
    assert_eq!(kept, vec![0, 1, 4, 7]);
    let full = softmax(&logits, 1.0);
    let mass: f64 = kept.iter().map(|&i| full[i as usize]).sum();
    let want: Vec<f64> = (0..8u32).map(|i| if kept.contains(&i) { full[i as usize] / mass } else { 0.0 }).collect();
    // 4 non-empty cells: 3 degrees of freedom, critical value 16.266 at 0.001.
    for seed in [11u64, 12] {
        let c = counts(&logits, &p, seed, 20_000, false);
        let stat = chi_square(&c, &want);
        assert!(stat < 16.266, "seed {seed}: χ² = {stat} for {c:?}");
        assert!((0..8u32).all(|i| kept.contains(&i) || c[i as usize] == 0), "draws outside the kept set: {c:?}");
        // Against the untruncated distribution (7 df) the same counts are rejected: the test can fail.
        let untruncated = chi_square(&c, &softmax(&logits, 1.0));
        assert!(untruncated > CHI2_7DF_999 * 4.0, "seed {seed}: χ² vs untruncated only {untruncated}");
    }
}

#[test]
fn penalties_follow_the_hf_and_openai_rules() {
    let logits = [2.0f32, -1.0, 0.5, 0.0, 3.0];
    let reply = [0, 1, 1, 3, 9]; // id 9 is outside the vocabulary: ignored.
    let p = SamplingParams {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..Default::default()
    };
    let v = penalized(&logits, &p, &reply);
    // id 0: once, 2 > 0 → 2/2 − (0.25·1 + 0.5); id 1: twice, −1 ≤ 0 → −1·2 − (0.25·2 + 0.5);
    // id 3: once, 0 ≤ 0 → 0·2 − 0.75.
    assert_eq!(v, vec![2.0 / 2.0 - (0.25 + 0.5), -2.0 - (0.5 + 0.5), 0.5, 0.0 * 2.0 - (0.25 + 0.5), 3.0]);
    // No reply, or neutral penalties: the logits unchanged (as f64).
    assert_eq!(penalized(&logits, &p, &[]), logits.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    assert_eq!(penalized(&logits, &SamplingParams::default(), &reply)[0], 2.0);
    // A penalized token loses the greedy pick.
    let g = SamplingParams { repetition_penalty: 4.0, ..SamplingParams::greedy() };
    assert_eq!(sample(&logits, &g, 0, 0, &[]).token, 4);
    assert_eq!(sample(&logits, &g, 0, 0, &[4]).token, 0);
}

/// `logit_bias` is the same as adding the bias to those logits before everything else: with logits and biases
/// on a 1/4 grid (the sums are exact in f32), every draw (greedy, sampled, every filter, penalties that act
/// after the bias) equals the draw without a bias from logits with the bias already added.
#[test]
fn logit_bias_equals_adding_to_the_logits_first() {
    let mut rng = 0x5eed_u64;
    let mut next = |n: u64| {
        rng = tf_core::mix(rng);
        rng % n
    };
    for case in 0..300 {
        let vocab = 2 + next(300) as usize;
        let logits: Vec<f32> = (0..vocab).map(|_| (next(81) as f32 - 40.0) * 0.25).collect();
        let mut bias: Vec<(u32, f64)> = Vec::new();
        for id in 0..vocab as u32 + 3 {
            if next(5) == 0 {
                // Ids past the vocabulary are in no row: they change nothing.
                bias.push((id, (next(801) as f64 - 400.0) * 0.25));
            }
        }
        let mut shifted = logits.clone();
        for &(id, b) in &bias {
            if let Some(x) = shifted.get_mut(id as usize) {
                *x += b as f32;
            }
        }
        let base = [
            SamplingParams::greedy(),
            params(0.7, 0, 1.0, 0.0),
            params(1.3, 5, 0.9, 0.05),
            SamplingParams {
                repetition_penalty: 1.7,
                presence_penalty: 0.5,
                frequency_penalty: 0.3,
                ..params(0.9, 0, 0.95, 0.0)
            },
            SamplingParams { repetition_penalty: 1.7, ..SamplingParams::greedy() },
        ];
        let reply: Vec<u32> = (0..next(6)).map(|_| next(vocab as u64) as u32).collect();
        for p in base {
            let biased = SamplingParams { logit_bias: bias.clone(), ..p.clone() };
            biased.validate().unwrap();
            for pos in [0u64, 17, 4096] {
                let want = sample(&shifted, &p, case, pos, &reply);
                let got = sample(&logits, &biased, case, pos, &reply);
                assert_eq!(got, want, "case {case} pos {pos}: {p:?}");
            }
        }
    }
    // −100 all but bans the likeliest token, +100 all but forces an unlikely one.
    let g = SamplingParams::greedy();
    assert_eq!(sample(&SMALL, &g, 0, 0, &[]).token, 2);
    assert_eq!(sample(&SMALL, &SamplingParams { logit_bias: vec![(2, -100.0)], ..g.clone() }, 0, 0, &[]).token, 3);
    assert_eq!(sample(&SMALL, &SamplingParams { logit_bias: vec![(5, 100.0)], ..g }, 0, 0, &[]).token, 5);
}

#[test]
fn draws_are_keyed_not_stateful() {
    let logits = frac();
    let p = params(1.2, 50, 0.95, 0.01);
    // Same key, same token, whatever was drawn before; a different seed changes the sequence.
    let a: Vec<u32> = (0..64).map(|pos| sample(&logits, &p, 5, pos, &[]).token).collect();
    let b: Vec<u32> = (0..64).rev().map(|pos| sample(&logits, &p, 5, pos, &[]).token).rev().collect();
    let c: Vec<u32> = (0..64).map(|pos| sample(&logits, &p, 6, pos, &[]).token).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

/// A direct transcription of the definition (full sort every time) to check the unsorted fast path.
fn reference_token(logits: &[f32], p: &SamplingParams, seed: u64, pos: u64) -> u32 {
    let v = penalized(logits, p, &[]);
    let mut ids: Vec<u32> = (0..v.len() as u32).collect();
    ids.sort_by(|&a, &b| v[b as usize].partial_cmp(&v[a as usize]).unwrap().then(a.cmp(&b)));
    if p.temperature <= 0.0 {
        return ids[0];
    }
    let k = if p.top_k == 0 { ids.len() } else { p.top_k.min(ids.len()) };
    ids.truncate(k);
    let t = p.temperature.max(1e-6);
    let scaled: Vec<f64> = ids.iter().map(|&i| v[i as usize] / t).collect();
    let mut keep = ids.len();
    if p.top_p > 0.0 && p.top_p < 1.0 {
        let e: Vec<f64> = scaled.iter().map(|s| (s - scaled[0]).exp()).collect();
        let sum = pairwise_sum(&e);
        let mut cum = 0.0;
        let below = e.iter().take_while(|&&x| {
            cum += x / sum;
            cum < p.top_p
        });
        keep = (below.count() + 1).min(keep);
    }
    if p.min_p > 0.0 {
        keep = keep.min(scaled.iter().filter(|&&s| s >= scaled[0] + p.min_p.ln()).count());
    }
    let mut best = 0;
    let mut best_score = f64::NEG_INFINITY;
    for r in 0..keep {
        let score = scaled[r] + -(-uniform(seed, pos, ids[r]).ln()).ln();
        if score > best_score {
            best = r;
            best_score = score;
        }
    }
    ids[best]
}

#[test]
fn fast_paths_equal_the_plain_definition() {
    let logits = tied();
    let configs = [
        params(1.0, 0, 1.0, 0.0),
        params(0.6, 0, 1.0, 0.3),
        params(1.4, 0, 0.9, 0.0),
        params(1.0, 17, 1.0, 0.0),
        params(1.0, 300, 1.0, 0.05),
        params(0.9, 64, 0.8, 0.1),
        params(0.0, 0, 1.0, 0.0),
    ];
    for (ci, p) in configs.iter().enumerate() {
        for pos in 0..200 {
            let want = reference_token(&logits, p, 31337, pos);
            assert_eq!(sample(&logits, p, 31337, pos, &[]).token, want, "config {ci} position {pos}");
        }
    }
}

#[test]
fn validation_rejects_out_of_range_values() {
    assert!(SamplingParams::default().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
    let bad = [
        ("temperature", SamplingParams { temperature: -0.1, ..Default::default() }),
        ("temperature", SamplingParams { temperature: f64::NAN, ..Default::default() }),
        ("temperature", SamplingParams { temperature: f64::INFINITY, ..Default::default() }),
        ("top_p", SamplingParams { top_p: 0.0, ..Default::default() }),
        ("top_p", SamplingParams { top_p: 1.5, ..Default::default() }),
        ("min_p", SamplingParams { min_p: -0.5, ..Default::default() }),
        ("min_p", SamplingParams { min_p: f64::NAN, ..Default::default() }),
        ("repetition_penalty", SamplingParams { repetition_penalty: 0.0, ..Default::default() }),
        ("presence_penalty", SamplingParams { presence_penalty: 2.5, ..Default::default() }),
        ("frequency_penalty", SamplingParams { frequency_penalty: f64::NAN, ..Default::default() }),
        ("logit_bias", SamplingParams { logit_bias: vec![(3, 100.5)], ..Default::default() }),
        ("logit_bias", SamplingParams { logit_bias: vec![(3, f64::NAN)], ..Default::default() }),
        ("logit_bias", SamplingParams { logit_bias: vec![(3, 1.0), (3, 2.0)], ..Default::default() }),
        ("logit_bias", SamplingParams { logit_bias: vec![(4, 1.0), (3, 2.0)], ..Default::default() }),
    ];
    for (field, p) in bad {
        let e = p.validate().unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().starts_with(&format!("invalid {field}: ")), "{e}");
    }
}

#[test]
fn top_logprobs_are_the_likeliest_in_order_and_match_log_softmax() {
    // Ties (1.5 twice) go to the lower id; -inf entries come last.
    let values = vec![0.5, 1.5, -2.0, 1.5, f64::NEG_INFINITY, 3.0, 0.0];
    let top = top_logprobs(&values, 4);
    let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
    assert_eq!(ids, vec![5, 1, 3, 0]);
    for &(id, lp) in &top {
        assert_eq!(lp.to_bits(), log_softmax_at(&values, id).to_bits(), "id {id}");
    }
    let total: f64 = (0..values.len() as u32).map(|i| log_softmax_at(&values, i).exp()).sum();
    assert!((total - 1.0).abs() < 1e-12);
    assert!(top_logprobs(&values, 0).is_empty());
    assert_eq!(top_logprobs(&values, 100).len(), values.len());
}

#[test]
fn sample_token_is_samples_token() {
    for p in [params(0.0, 0, 1.0, 0.0), params(0.8, 5, 0.9, 0.0), params(1.3, 0, 1.0, 0.05)] {
        for logits in [tied(), frac()] {
            for pos in 0..20u64 {
                let reply = [1u32, 2, 2];
                assert_eq!(sample_token(&logits, &p, 9, pos, &reply), sample(&logits, &p, 9, pos, &reply).token);
            }
        }
    }
}

#[test]
fn the_radix_candidate_order_is_the_comparator_order() {
    // xorshift64*: values of every kind the draw can see (ties, signed zeros, −∞, denormals, penalized f64s).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for case in 0..40 {
        let n = [1usize, 2, 7, 300, 5000][case % 5];
        let values: Vec<f64> = (0..n)
            .map(|_| {
                // Even cases hold only f32 values (the packed 32-bit path), odd ones f64s too (the 64-bit path).
                let r = next();
                let f = (r >> 11) as f64 / (1u64 << 53) as f64;
                let kind = if case % 2 == 0 && matches!(r % 10, 4 | 5) { 9 } else { r % 10 };
                match kind {
                    0 => 0.0,
                    1 => -0.0,
                    2 => f64::NEG_INFINITY,
                    3 => ((r >> 8) % 7) as f64 - 3.0,
                    4 => (f - 0.5) * 1e-300,
                    5 => f64::from(((f - 0.5) * 60.0) as f32) / 1.05,
                    _ => f64::from(((f - 0.5) * 60.0) as f32),
                }
            })
            .collect();
        let mut want: Vec<u32> = (0..n as u32).collect();
        want.sort_by(|&a, &b| order(&values, a, b));
        assert_eq!(sorted_ids(&values), want, "case {case}");
    }
}
