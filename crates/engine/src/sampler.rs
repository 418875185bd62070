//! The keyed draw of DESIGN.md §3, bit-compatible with the published TensorFold rule (`exact_sampling.py`
//! `choose`/`penalized`): the token at a position depends only on that row's logits, the stream's reply so far
//! (penalties), the parameters, the seed and the absolute position — never on which call produced the logits.
//!
//! Per row, in this order, all in f64:
//! 1. The request's `logit_bias` added to its tokens' logits (cast f32 → f64; OpenAI's field, an extension of
//!    the published rule, which has none), then penalties from the tokens of this stream's reply only (see
//!    [`SamplingParams`]).
//! 2. Temperature ≤ 0: argmax, ties to the lower id. Otherwise:
//! 3. Candidates ordered by logit descending, ties to the lower id; keep the first `top_k` (0 = all).
//! 4. `scaled = logit / max(T, 1e-6)` (a division, as published; not a multiplication by the reciprocal).
//! 5. Top-p (only when `0 < top_p < 1`): `p = exp(scaled − scaled[0])`, divided by their sum (NumPy's pairwise
//!    summation order, see `pairwise_sum`); keep the first `count(cumsum(p) < top_p) + 1` (cumsum sequential).
//! 6. Min-p (only when `min_p > 0`): keep candidates with `scaled ≥ scaled[0] + ln(min_p)` (a prefix).
//! 7. Pick the argmax of `scaled + (−ln(−ln u))`, `u = uniform(seed, position, id)`; equal scores go to the
//!    earlier candidate (higher logit, then lower id).
//!
//! `exp`/`ln` are the platform's f64 functions (glibc on Linux, as NumPy on Linux uses); they only matter at
//! exact near-ties of the top-p cut or the Gumbel scores.

use std::cmp::Ordering;
use std::collections::HashMap;
use tf_core::uniform;

/// Per-request sampling parameters. The defaults are neutral (T = 1, no truncation, no penalties): callers
/// fill in the model's `generation_config` or the request's values.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// ≤ 0 (0 after validation): greedy argmax.
    pub temperature: f64,
    /// Keep the `top_k` likeliest tokens; 0 = all.
    pub top_k: usize,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f64,
    /// Keep tokens at least `min_p` times as likely as the likeliest (after temperature); 0 = off.
    pub min_p: f64,
    /// HF rule on tokens of the reply so far: a positive logit is divided by it, a non-positive one multiplied.
    /// 1 = off.
    pub repetition_penalty: f64,
    /// OpenAI rule: subtracted once from the logit of every token that occurs in the reply so far. 0 = off.
    pub presence_penalty: f64,
    /// OpenAI rule: subtracted once per occurrence in the reply so far. 0 = off.
    pub frequency_penalty: f64,
    /// The request's seed; `None` derives one from the prompt (`tf_core::derive_seed`).
    pub seed: Option<u64>,
    /// OpenAI's `logit_bias`: (token id, bias in [−100, 100]) added to that token's logit before the penalties,
    /// at every position (as llama.cpp orders them). Ids ascending and unique; ids outside the vocabulary are
    /// not in any row and change nothing. Empty = off.
    pub logit_bias: Vec<(u32, f64)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

/// A parameter out of range; `field` is the request field's name.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for SamplingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.message)
    }
}

impl std::error::Error for SamplingError {}

impl SamplingParams {
    /// Greedy decoding, no penalties.
    pub fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    /// Checks the ranges: temperature finite and ≥ 0; top_p in (0, 1]; min_p in [0, 1]; repetition_penalty
    /// finite and > 0; presence and frequency penalties in [−2, 2] (OpenAI's range).
    pub fn validate(&self) -> Result<(), SamplingError> {
        let err = |field, message: &str| Err(SamplingError { field, message: message.to_string() });
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return err("temperature", &format!("{t}: must be a finite number ≥ 0"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return err("top_p", &format!("{p}: must be in (0, 1]"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return err("min_p", &format!("{m}: must be in [0, 1]"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return err("repetition_penalty", &format!("{r}: must be a finite number > 0"));
        }
        for (field, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return err(field, &format!("{v}: must be in [-2, 2]"));
            }
        }
        for (i, &(id, b)) in self.logit_bias.iter().enumerate() {
            if !(-100.0..=100.0).contains(&b) {
                return err("logit_bias", &format!("token {id}: bias {b} must be in [-100, 100]"));
            }
            match i.checked_sub(1).map(|j| self.logit_bias[j].0) {
                Some(prev) if prev == id => return err("logit_bias", &format!("token {id} appears twice")),
                Some(prev) if prev > id => return err("logit_bias", "token ids must be ascending"),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether any penalty is set (penalties change only the values of tokens in the reply).
    pub fn has_penalty(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// One drawn token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draw {
    pub token: u32,
    /// ln P(token) under softmax of the whole vocabulary's logits after penalties, at temperature 1 (the model's
    /// own distribution, independent of temperature and truncation). f64; the sum runs in id order.
    pub logprob: f64,
}

/// The keyed draw for one row: `logits [vocab]` (f32, as the model returned them), the stream's `seed`, the
/// absolute `position` of the token being sampled, and `reply` = the tokens this stream generated so far (for
/// the penalties; the prompt is not penalized, as in the published rule).
pub fn sample(logits: &[f32], params: &SamplingParams, seed: u64, position: u64, reply: &[u32]) -> Draw {
    assert!(!logits.is_empty(), "sample: empty logits");
    let values = penalized(logits, params, reply);
    let token = draw_from(&values, params, seed, position);
    Draw { token, logprob: log_softmax_at(&values, token) }
}

/// [`sample`]'s token alone: the same draw without the logprob (which costs an `exp` per vocabulary entry).
pub fn sample_token(logits: &[f32], params: &SamplingParams, seed: u64, position: u64, reply: &[u32]) -> u32 {
    assert!(!logits.is_empty(), "sample: empty logits");
    draw_from(&penalized(logits, params, reply), params, seed, position)
}

fn draw_from(values: &[f64], params: &SamplingParams, seed: u64, position: u64) -> u32 {
    if params.is_greedy() {
        argmax(values)
    } else {
        keyed(values, params, seed, position)
    }
}

/// The logits in f64 with `params.logit_bias` added, then the penalties of `params` applied for the tokens
/// of `reply` (published `penalized`): repetition first (`v > 0 → v / r`, else `v · r`), then
/// `v − (frequency·count + presence)`. NaN logits become −∞ (never drawn unless every logit is NaN; a bias
/// leaves them there).
pub fn penalized(logits: &[f32], params: &SamplingParams, reply: &[u32]) -> Vec<f64> {
    let mut v: Vec<f64> = logits.iter().map(|&x| if x.is_nan() { f64::NEG_INFINITY } else { f64::from(x) }).collect();
    for &(id, b) in &params.logit_bias {
        if let Some(x) = v.get_mut(id as usize) {
            *x += b;
        }
    }
    if reply.is_empty() || !params.has_penalty() {
        return v;
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in reply {
        *counts.entry(t).or_insert(0) += 1;
    }
    for (&t, &c) in &counts {
        let Some(x) = v.get_mut(t as usize) else { continue };
        if params.repetition_penalty != 1.0 {
            *x = if *x > 0.0 { *x / params.repetition_penalty } else { *x * params.repetition_penalty };
        }
        if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            *x -= params.frequency_penalty * f64::from(c) + params.presence_penalty;
        }
    }
    v
}

/// The candidate order: logit descending, ties to the lower id.
fn order(values: &[f64], a: u32, b: u32) -> Ordering {
    let (x, y) = (values[a as usize], values[b as usize]);
    y.partial_cmp(&x).unwrap_or(Ordering::Equal).then(a.cmp(&b))
}

/// Every id in candidate order ([`order`]: value descending, ties to the lower id), by a stable LSD radix sort of
/// order-preserving integer keys, 11 bits a pass, starting from ids in increasing order (so equal values keep the
/// lower id first); a pass whose digit is the same for every key is skipped. When every value is an f32 (logits
/// without penalties) the key is the f32's 32 bits packed with the id into one `u64`, else the f64's 64 bits
/// beside the id. The comparator sort of ids by `order` took 17 ms for a 152k vocabulary. Keys order like the
/// values (`-0.0` as `0.0`, as `partial_cmp` has them equal), so the order, a strict one, is the same.
pub(crate) fn sorted_ids(values: &[f64]) -> Vec<u32> {
    if values.iter().all(|&v| f64::from(v as f32) == v) {
        let packed: Vec<u64> =
            values.iter().enumerate().map(|(i, &v)| (u64::from(descending_key32(v as f32)) << 32) | i as u64).collect();
        return radix(packed, 32..64, false, |_| ()).into_iter().map(|k| k as u32).collect();
    }
    let keys: Vec<u64> = values.iter().map(|&v| descending_key(v)).collect();
    let n = values.len();
    let mut ids: Vec<u32> = (0..n as u32).collect();
    let mut ids2 = vec![0u32; n];
    radix(keys, 0..64, true, |moves: &[usize]| {
        for (j, &to) in moves.iter().enumerate() {
            ids2[to] = ids[j];
        }
        std::mem::swap(&mut ids, &mut ids2);
    });
    ids
}

/// Stable LSD radix sort of `keys` by their bits `bits`, 11 at a time; with `track`, after each pass that moved
/// anything, `follow` gets where each element went (`moves[old] = new`) to carry a payload along.
fn radix(mut keys: Vec<u64>, bits: std::ops::Range<u32>, track: bool, mut follow: impl FnMut(&[usize])) -> Vec<u64> {
    const DIGIT: u32 = 11;
    const MASK: u64 = (1 << DIGIT) - 1;
    let n = keys.len();
    let mut out = vec![0u64; n];
    let mut moves = if track { vec![0usize; n] } else { Vec::new() };
    let mut count = vec![0usize; 1 << DIGIT];
    for shift in bits.step_by(DIGIT as usize) {
        count.iter_mut().for_each(|c| *c = 0);
        for &k in &keys {
            count[((k >> shift) & MASK) as usize] += 1;
        }
        if count.contains(&n) {
            continue;
        }
        let mut sum = 0;
        for c in count.iter_mut() {
            let here = *c;
            *c = sum;
            sum += here;
        }
        for (j, &k) in keys.iter().enumerate() {
            let d = ((k >> shift) & MASK) as usize;
            out[count[d]] = k;
            if track {
                moves[j] = count[d];
            }
            count[d] += 1;
        }
        std::mem::swap(&mut keys, &mut out);
        if track {
            follow(&moves);
        }
    }
    keys
}

/// A `u32` that is smaller for a larger `v` (NaN-free input; `-0.0` and `0.0` map alike).
fn descending_key32(v: f32) -> u32 {
    let v = if v == 0.0 { 0.0 } else { v };
    let b = v.to_bits();
    let ascending = if b >> 31 == 1 { !b } else { b | (1 << 31) };
    !ascending
}

/// A `u64` that is smaller for a larger `v` (NaN-free input; `-0.0` and `0.0` map alike).
fn descending_key(v: f64) -> u64 {
    let v = if v == 0.0 { 0.0 } else { v };
    let b = v.to_bits();
    let ascending = if b >> 63 == 1 { !b } else { b | (1 << 63) };
    !ascending
}

/// Argmax, ties to the lower id.
fn argmax(values: &[f64]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate().skip(1) {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// The candidates that survive top-k, top-p and min-p, with their scaled logits. In candidate order, except
/// when no step depends on the order (no top-k cut below the vocabulary and top-p off): then in id order, which
/// spares a full-vocabulary sort (the draw breaks score ties by candidate order itself).
pub(crate) struct Kept {
    pub ids: Vec<u32>,
    pub scaled: Vec<f64>,
}

pub(crate) fn kept(values: &[f64], params: &SamplingParams) -> Kept {
    let vocab = values.len();
    let k = if params.top_k == 0 { vocab } else { params.top_k.min(vocab) }.max(1);
    let top_p_on = params.top_p > 0.0 && params.top_p < 1.0;
    let mut ids: Vec<u32> = (0..vocab as u32).collect();
    if k < vocab {
        // The first k of the total order (a strict order: ids break every tie), then sorted.
        ids.select_nth_unstable_by(k - 1, |&a, &b| order(values, a, b));
        ids.truncate(k);
        ids.sort_unstable_by(|&a, &b| order(values, a, b));
    } else if top_p_on {
        ids = sorted_ids(values);
    }
    let t = params.temperature.max(1e-6);
    let mut scaled: Vec<f64> = ids.iter().map(|&i| values[i as usize] / t).collect();
    if top_p_on {
        // Sorted here: scaled[0] is the maximum.
        let top = scaled[0];
        let mut p: Vec<f64> = scaled.iter().map(|&s| (s - top).exp()).collect();
        let sum = pairwise_sum(&p);
        for x in p.iter_mut() {
            *x /= sum;
        }
        let mut cum = 0.0f64;
        let mut below = 0usize;
        for &x in &p {
            cum += x;
            // `cum < top_p` is false for NaN too (a row of −∞ logits): keep one, as NumPy's count does.
            if cum < params.top_p {
                below += 1;
            } else {
                break;
            }
        }
        let keep = (below + 1).min(ids.len());
        ids.truncate(keep);
        scaled.truncate(keep);
    }
    if params.min_p > 0.0 {
        let top = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let floor = top + params.min_p.ln();
        let mut w = 0;
        for r in 0..ids.len() {
            if scaled[r] >= floor {
                ids[w] = ids[r];
                scaled[w] = scaled[r];
                w += 1;
            }
        }
        ids.truncate(w.max(1));
        scaled.truncate(w.max(1));
    }
    Kept { ids, scaled }
}

/// Temperature > 0: the Gumbel-max draw over the kept candidates.
fn keyed(values: &[f64], params: &SamplingParams, seed: u64, position: u64) -> u32 {
    let Kept { ids, scaled } = kept(values, params);
    let mut best = 0usize;
    let mut best_score = f64::NAN;
    for (r, (&id, &s)) in ids.iter().zip(&scaled).enumerate() {
        let u = uniform(seed, position, id);
        let score = s + -(-u.ln()).ln();
        // First maximum in candidate order (the published argmax); the order test only matters for an
        // unsorted set.
        if r == 0 || score > best_score || (score == best_score && order(values, id, ids[best]) == Ordering::Less) {
            best = r;
            best_score = score;
        }
    }
    ids[best]
}

/// ln softmax(values)\[token\], f64, the sum in id order.
/// The `k` likeliest tokens with their ln P under softmax of `values` (temperature 1), likeliest first, ties to
/// the lower id — the alternatives a reply's `top_logprobs` reports. Same sum as [`Draw::logprob`].
pub fn top_logprobs(values: &[f64], k: usize) -> Vec<(u32, f64)> {
    if k == 0 || values.is_empty() {
        return Vec::new();
    }
    let top = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0f64;
    for &v in values {
        sum += (v - top).exp();
    }
    let ln_sum = sum.ln();
    let mut ids: Vec<u32> = (0..values.len() as u32).collect();
    let k = k.min(ids.len());
    ids.select_nth_unstable_by(k - 1, |&a, &b| order(values, a, b));
    ids.truncate(k);
    ids.sort_by(|&a, &b| order(values, a, b));
    ids.into_iter()
        .map(|id| (id, if top == f64::NEG_INFINITY { top } else { values[id as usize] - top - ln_sum }))
        .collect()
}

/// ln P(token) under softmax of `values` at temperature 1, the sum in id order.
pub fn log_softmax_at(values: &[f64], token: u32) -> f64 {
    let top = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if top == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let mut sum = 0.0f64;
    for &v in values {
        sum += (v - top).exp();
    }
    values[token as usize] - top - sum.ln()
}

/// NumPy's `np.sum` order for a contiguous f64 array (`pairwise_sum` in its loops): below 8 elements a plain
/// sequential sum from 0; up to 128, eight interleaved partial sums combined as ((0+1)+(2+3))+((4+5)+(6+7)),
/// then the tail added in order; above, split at half rounded down to a multiple of 8 and recurse.
pub(crate) fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for &x in a {
            res += x;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let body = n - n % 8;
        let mut i = 8;
        while i < body {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[body..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
