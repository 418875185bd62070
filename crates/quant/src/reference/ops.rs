//! Scalar references of every op except matmul: rms_norm, RoPE (tables and rotation), attention over paged KV,
//! GLU, add, scale. Plain and slow on purpose; each function is the executable definition of its section of
//! docs/arithmetic.md, and every backend kernel must give the same bits.
//!
//! Row-exactness is visible in the signatures: every per-row function sees only that row (and, for attention,
//! the K/V it attends); the matrix wrappers just loop over rows.

use super::math;
use super::matmul::dot16;
use tf_core::{AttnMeta, AttnParams, GluAct, Rope, RopeScaling, RopeStyle, RowAttn, Tensor};

// ---------------------------------------------------------------------------------------------------------------
// rms_norm

/// RMSNorm of one row `x [cols]` in groups of `group` columns, each group scaled by `w [group]`, into
/// `out [cols]`: `ss = dot16(g, g)`, `inv = 1 / sqrt(ss / group + eps)`, `y_i = (x_i * inv) * w_i`.
pub fn rms_norm_row(x: &[f32], w: &[f32], group: usize, eps: f32, out: &mut [f32]) {
    assert!(group > 0 && x.len().is_multiple_of(group), "rms_norm: cols {} not a multiple of group {group}", x.len());
    assert_eq!(w.len(), group, "rms_norm: weight length");
    assert_eq!(out.len(), x.len(), "rms_norm: output length");
    for (g, o) in x.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        let ss = dot16(g, g);
        let inv = 1.0 / (ss / group as f32 + eps).sqrt();
        for ((o, &xi), &wi) in o.iter_mut().zip(g).zip(w) {
            *o = (xi * inv) * wi;
        }
    }
}

/// [`rms_norm_row`] over every row of `x [R, cols]` → `[R, cols]`.
pub fn rms_norm(x: &Tensor, w: &[f32], group: usize, eps: f32) -> Tensor {
    let mut out = Tensor::zeros(x.rows, x.cols);
    for r in 0..x.rows {
        rms_norm_row(x.row(r), w, group, eps, out.row_mut(r));
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE

/// The `rot_dims / 2` rotation frequencies (radians per position) in f64, scaling applied:
/// `freq_i = theta.powf(-((2 i) as f64) / (rot_dims as f64))`, then
/// - `Linear { factor }`: `freq_i / factor`;
/// - `Llama3 { factor, low_freq_factor: lo, high_freq_factor: hi, original_context: ctx }`: with
///   `wavelen = 2π / freq_i`: if `wavelen < ctx / hi` keep; else if `wavelen > ctx / lo` use `freq_i / factor`;
///   else `smooth = (ctx / wavelen - lo) / (hi - lo)`, `freq_i = (1 - smooth) * freq_i / factor + smooth * freq_i`;
/// - `Yarn { factor, original_context: ctx, beta_fast, beta_slow, truncate, .. }`: with
///   `dim(b) = rot_dims · ln(ctx / (2π b)) / (2 ln theta)`, `lo = dim(beta_fast)`, `hi = dim(beta_slow)` (floor and
///   ceil when `truncate`), then `lo = max(lo, 0)`, `hi = min(hi, rot_dims - 1)`, `hi += 0.001` if equal;
///   `ramp = clamp((i - lo) / (hi - lo), 0, 1)`, `freq_i = (freq_i / factor) · ramp + freq_i · (1 - ramp)`.
pub fn rope_freqs(rope: &Rope) -> Vec<f64> {
    assert!(
        rope.rot_dims.is_multiple_of(2) && rope.rot_dims > 0,
        "rope: rot_dims {} must be even and > 0",
        rope.rot_dims
    );
    let rot = rope.rot_dims as f64;
    (0..rope.rot_dims / 2)
        .map(|i| {
            let freq = rope.theta.powf(-((2 * i) as f64) / rot);
            match rope.scaling {
                RopeScaling::None => freq,
                RopeScaling::Linear { factor } => freq / factor,
                RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    if wavelen < original_context / high_freq_factor {
                        freq
                    } else if wavelen > original_context / low_freq_factor {
                        freq / factor
                    } else {
                        let smooth =
                            (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * freq / factor + smooth * freq
                    }
                }
                RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, truncate, .. } => {
                    let (lo, hi) = yarn_ramp_range(rope.theta, rot, original_context, beta_fast, beta_slow, truncate);
                    let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                    (freq / factor) * ramp + freq * (1.0 - ramp)
                }
            }
        })
        .collect()
}

/// YaRN's ramp bounds `(lo, hi)` over the pair index (see [`rope_freqs`]), in f64.
fn yarn_ramp_range(theta: f64, rot: f64, ctx: f64, beta_fast: f64, beta_slow: f64, truncate: bool) -> (f64, f64) {
    let dim = |b: f64| rot * (ctx / (b * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
    let (mut lo, mut hi) = (dim(beta_fast), dim(beta_slow));
    if truncate {
        (lo, hi) = (lo.floor(), hi.ceil());
    }
    let (lo, mut hi) = (lo.max(0.0), hi.min(rot - 1.0));
    if lo == hi {
        hi += 0.001;
    }
    (lo, hi)
}

/// The factor cos and sin are multiplied by: YaRN's `mscale`, else 1.
pub fn rope_mscale(rope: &Rope) -> f64 {
    match rope.scaling {
        RopeScaling::Yarn { mscale, .. } => mscale,
        _ => 1.0,
    }
}

/// The table row of position `pos`: `angle = pos as f64 * freqs[i]`, `cos[i] = angle.cos() as f32`,
/// `sin[i] = angle.sin() as f32` (computed in f64, rounded to f32 once). `freqs`, `cos`, `sin`: `[rot_dims / 2]`.
pub fn rope_cos_sin(freqs: &[f64], pos: u32, cos: &mut [f32], sin: &mut [f32]) {
    rope_cos_sin_scaled(freqs, 1.0, pos, cos, sin)
}

/// [`rope_cos_sin`] with both multiplied by `mscale` ([`rope_mscale`]) in f64 before the one rounding:
/// `cos[i] = (angle.cos() * mscale) as f32` (`mscale = 1` gives [`rope_cos_sin`]'s bits: the product is exact).
pub fn rope_cos_sin_scaled(freqs: &[f64], mscale: f64, pos: u32, cos: &mut [f32], sin: &mut [f32]) {
    assert!(cos.len() == freqs.len() && sin.len() == freqs.len(), "rope: table row length");
    for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(freqs) {
        let angle = pos as f64 * f;
        *c = (angle.cos() * mscale) as f32;
        *s = (angle.sin() * mscale) as f32;
    }
}

/// Rotates one head `x [head_dim]` in place by the table row `cos`, `sin` (`[rot / 2]`, `rot = 2·cos.len()`):
/// pairs `(2i, 2i+1)` (`Normal`) or `(i, i + rot/2)` (`Neox`); `y0 = x0 * c - x1 * s`, `y1 = x0 * s + x1 * c`
/// (no fma). Dimensions `rot..head_dim` are untouched.
pub fn rope_rotate_head(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    assert!(sin.len() == half && 2 * half <= x.len(), "rope: rot_dims exceed head_dim");
    for i in 0..half {
        let (i0, i1) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1, c, s) = (x[i0], x[i1], cos[i], sin[i]);
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

/// RoPE of every `head_dim` group of every row of `x [R, heads·head_dim]` in place, row `r` at `positions[r]`.
pub fn rope(x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope) {
    assert_eq!(positions.len(), x.rows, "rope: one position per row");
    assert!(
        head_dim > 0 && x.cols.is_multiple_of(head_dim),
        "rope: cols {} not a multiple of head_dim {head_dim}",
        x.cols
    );
    assert!(rope.rot_dims <= head_dim, "rope: rot_dims {} > head_dim {head_dim}", rope.rot_dims);
    let (freqs, mscale) = (rope_freqs(rope), rope_mscale(rope));
    let (mut cos, mut sin) = (vec![0f32; freqs.len()], vec![0f32; freqs.len()]);
    for (r, &pos) in positions.iter().enumerate() {
        rope_cos_sin_scaled(&freqs, mscale, pos, &mut cos, &mut sin);
        for head in x.row_mut(r).chunks_exact_mut(head_dim) {
            rope_rotate_head(head, &cos, &sin, rope.style);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Attention

/// Attention chunks hold this many consecutive absolute positions (chunk `c`: `256c .. 256c + 255`).
pub const ATTN_CHUNK: u32 = 256;

/// One layer of a paged KV cache as attention reads it. `k`, `v`: `[slots, kv_heads, head_dim]` f32, slot `s`
/// of head `h` at `(s · kv_heads + h) · head_dim`.
#[derive(Clone, Copy, Debug)]
pub struct KvLayer<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayer<'_> {
    /// Number of token slots.
    pub fn slots(&self) -> usize {
        self.k.len() / (self.kv_heads * self.head_dim)
    }

    /// K of `slot`, kv head `h`: `[head_dim]`.
    #[inline]
    pub fn k_at(&self, slot: u32, h: usize) -> &[f32] {
        let o = (slot as usize * self.kv_heads + h) * self.head_dim;
        &self.k[o..o + self.head_dim]
    }

    /// V of `slot`, kv head `h`: `[head_dim]`.
    #[inline]
    pub fn v_at(&self, slot: u32, h: usize) -> &[f32] {
        let o = (slot as usize * self.kv_heads + h) * self.head_dim;
        &self.v[o..o + self.head_dim]
    }
}

/// Whether a row at `row_pos` sees position `p` under the sliding window (`row_pos - p < window`).
#[inline]
pub fn in_window(row_pos: u32, p: u32, window: Option<u32>) -> bool {
    window.is_none_or(|w| (row_pos as i64 - p as i64) < w as i64)
}

/// The `(position, slot)` pairs row `row` visits, in the canonical (increasing position) order: its prefix
/// `0..ctx` through `block_table` (slot `block_table[p / block_size] · block_size + p % block_size`), then its
/// `tree` entries; positions outside the sliding window are left out. Panics on a short block table or tree
/// positions that do not increase past `ctx`.
pub fn visited_positions(
    row: &RowAttn,
    block_table: &[u32],
    block_size: usize,
    window: Option<u32>,
) -> Vec<(u32, u32)> {
    let ctx = row.ctx as usize;
    assert!(
        ctx.div_ceil(block_size) <= block_table.len(),
        "attention: ctx {ctx} needs {} blocks, the block table has {}",
        ctx.div_ceil(block_size),
        block_table.len()
    );
    let mut out = Vec::with_capacity(ctx + row.tree.len());
    for p in 0..row.ctx {
        if in_window(row.pos, p, window) {
            let slot = block_table[p as usize / block_size] as usize * block_size + p as usize % block_size;
            out.push((p, slot as u32));
        }
    }
    let mut last = row.ctx.checked_sub(1);
    for &(p, slot) in &row.tree {
        assert!(last.is_none_or(|l| p > l), "attention: tree positions must increase past ctx ({p} after {last:?})");
        last = Some(p);
        if in_window(row.pos, p, window) {
            out.push((p, slot));
        }
    }
    out
}

/// The score of one position: `s = dot16(q, k) * scale`; with a softcap `s = cap * tanh(s / cap)`.
#[inline]
pub fn attn_score(q: &[f32], k: &[f32], p: &AttnParams) -> f32 {
    let s = dot16(q, k) * p.scale;
    match p.softcap {
        Some(cap) => cap * math::tanh(s / cap),
        None => s,
    }
}

/// One query head `q [head_dim]` against kv head `kvh` over `visits` (from [`visited_positions`]) into
/// `out [head_dim]`. Per chunk of 256 absolute positions, over its visited positions in order:
/// `m_c = max s`, `e = exp(s - m_c)`, `l_c = Σ e` sequentially, `o_c[d] = fma(e, v[d], o_c[d])` from 0.0.
/// Chunks merge in increasing order: `m' = max(m, m_c)`, `a = exp(m - m')`, `b = exp(m_c - m')`,
/// `l = l * a + l_c * b`, `o[d] = o[d] * a + o_c[d] * b`, `m = m'`. With a sink logit `sink` (this head's entry of
/// [`AttnParams::sinks`]) it joins last, as a chunk without values: `m' = max(m, sink)`, `a = exp(m - m')`,
/// `l = l * a + exp(sink - m')`, `o[d] = o[d] * a`. Output `o[d] / l`. A row that visits no position gets zeros.
pub fn attention_head(q: &[f32], kv: &KvLayer, kvh: usize, visits: &[(u32, u32)], p: &AttnParams, out: &mut [f32]) {
    attention_head_sink(q, kv, kvh, visits, p, None, out)
}

/// [`attention_head`] with this head's sink logit (`None`: none).
pub fn attention_head_sink(
    q: &[f32],
    kv: &KvLayer,
    kvh: usize,
    visits: &[(u32, u32)],
    p: &AttnParams,
    sink: Option<f32>,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    assert!(q.len() == hd && out.len() == hd, "attention: head_dim");
    // Running merged state (None before the first chunk) and the current chunk's accumulators.
    let mut acc: Option<(f32, f32, Vec<f32>)> = None; // (m, l, o [head_dim])
    let mut o_c = vec![0f32; hd];
    let mut scores: Vec<f32> = Vec::with_capacity(ATTN_CHUNK as usize);
    let mut start = 0;
    while start < visits.len() {
        let chunk = visits[start].0 / ATTN_CHUNK;
        let end = start + visits[start..].iter().take_while(|&&(pos, _)| pos / ATTN_CHUNK == chunk).count();
        let part = &visits[start..end];
        scores.clear();
        scores.extend(part.iter().map(|&(_, slot)| attn_score(q, kv.k_at(slot, kvh), p)));
        let m_c = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut l_c = 0f32;
        o_c.fill(0.0);
        for (&s, &(_, slot)) in scores.iter().zip(part) {
            let e = math::exp(s - m_c);
            l_c += e;
            for (o, &v) in o_c.iter_mut().zip(kv.v_at(slot, kvh)) {
                *o = e.mul_add(v, *o);
            }
        }
        acc = Some(match acc {
            None => (m_c, l_c, o_c.clone()),
            Some((m, l, mut o)) => {
                let m2 = m.max(m_c);
                let a = math::exp(m - m2);
                let b = math::exp(m_c - m2);
                for (o, &oc) in o.iter_mut().zip(&o_c) {
                    *o = *o * a + oc * b;
                }
                (m2, l * a + l_c * b, o)
            }
        });
        start = end;
    }
    if let (Some(s), Some((m, l, o))) = (sink, acc.as_mut()) {
        let m2 = m.max(s);
        let a = math::exp(*m - m2);
        *l = *l * a + math::exp(s - m2);
        for o in o.iter_mut() {
            *o *= a;
        }
        *m = m2;
    }
    match acc {
        Some((_, l, o)) => {
            for (y, &o) in out.iter_mut().zip(&o) {
                *y = o / l;
            }
        }
        None => out.fill(0.0),
    }
}

/// Checks `q`, `kv` and `meta` against `p` (panics with the op and shapes on a mismatch).
pub fn check_attention(q: &Tensor, kv: &KvLayer, meta: &AttnMeta, p: &AttnParams) {
    p.check(q, meta, kv.kv_heads, kv.head_dim);
    assert_eq!(kv.k.len(), kv.v.len(), "attention: K and V sizes");
    for row in &meta.rows {
        assert!(row.seq < meta.block_tables.len(), "attention: row seq {} without a block table", row.seq);
    }
}

/// Attention of `q [R, heads·head_dim]` over `kv` → `[R, heads·head_dim]`; query head `h` reads kv head
/// `h / (heads / kv_heads)`.
pub fn attention(q: &Tensor, kv: &KvLayer, meta: &AttnMeta, p: &AttnParams) -> Tensor {
    check_attention(q, kv, meta, p);
    let hd = p.head_dim;
    let group = p.heads / p.kv_heads;
    let mut out = Tensor::zeros(q.rows, q.cols);
    for (r, row) in meta.rows.iter().enumerate() {
        let visits = visited_positions(row, &meta.block_tables[row.seq], kv.block_size, p.window);
        for h in 0..p.heads {
            let qh = &q.row(r)[h * hd..(h + 1) * hd];
            let sink = p.sinks.as_ref().map(|s| s[h]);
            attention_head_sink(qh, kv, h / group, &visits, p, sink, &mut out.row_mut(r)[h * hd..(h + 1) * hd]);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Elementwise

/// `out[i] = act(gate[i]) * up[i]` (one rounded product after the activation); [`GluAct::SwigluClamp`] as
/// [`glu_one`] says.
pub fn glu(gate: &[f32], up: &[f32], act: GluAct, out: &mut [f32]) {
    assert!(gate.len() == up.len() && out.len() == up.len(), "glu: lengths");
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = glu_one(g, u, act);
    }
}

/// One element of [`glu`].
#[inline]
pub fn glu_one(g: f32, u: f32, act: GluAct) -> f32 {
    match act {
        GluAct::Silu => math::silu(g) * u,
        GluAct::GeluTanh => math::gelu_tanh(g) * u,
        GluAct::SwigluClamp { alpha, limit } => {
            // Comparisons, so that NaN passes through: g = min(g, limit), u = clamp(u, -limit, limit).
            let g = if g > limit { limit } else { g };
            let u = if u > limit {
                limit
            } else if u < -limit {
                -limit
            } else {
                u
            };
            (u + 1.0) * (g / (1.0 + math::exp(-(alpha * g))))
        }
    }
}

/// `a[i] += b[i]`.
pub fn add(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: lengths");
    for (a, &b) in a.iter_mut().zip(b) {
        *a += b;
    }
}

/// `acc[rows[i]] += s_i · y[i]` for every row `i` of `y [n, C]` with `s_i = scales[i]` (`acc [R, C]`), in order of
/// `i`: each element is `a + (s · y)`, one rounded product then one rounded sum (no fused multiply-add). The
/// mixture-of-experts combine: a destination row receives its experts' outputs in the order they are listed.
pub fn add_rows_scaled(acc: &mut Tensor, y: &Tensor, rows: &[usize], scales: &[f32]) {
    assert_eq!(y.cols, acc.cols, "add_rows_scaled: columns");
    assert!(rows.len() == y.rows && scales.len() == y.rows, "add_rows_scaled: one row and scale per row of y");
    for (i, (&r, &s)) in rows.iter().zip(scales).enumerate() {
        assert!(r < acc.rows, "add_rows_scaled: row {r} of {}", acc.rows);
        for (a, &v) in acc.row_mut(r).iter_mut().zip(y.row(i)) {
            *a += s * v;
        }
    }
}

/// `x[i] *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    for x in x {
        *x *= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(truncate: bool) -> Rope {
        let scaling = RopeScaling::Yarn {
            factor: 32.0,
            original_context: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate,
            mscale: 0.1 * 32f64.ln() + 1.0,
        };
        Rope { theta: 150_000.0, rot_dims: 64, style: RopeStyle::Neox, scaling }
    }

    /// gpt-oss's shape: pairs below the ramp keep their frequency, pairs past it are divided by the factor, the
    /// ones between lie in between; rounding the bounds outwards (`truncate`) widens the ramp.
    #[test]
    fn yarn_frequencies_keep_divide_and_blend() {
        let base = rope_freqs(&Rope { scaling: RopeScaling::None, ..yarn(false) });
        for truncate in [false, true] {
            let f = rope_freqs(&yarn(truncate));
            // dim(32) ≈ 8.09 and dim(1) ≈ 17.4 for these numbers (truncated: 8 and 18): either way pairs up to 8
            // are kept and pairs from 18 divided.
            let (keep, divide) = (8, 18);
            for i in 0..=keep {
                assert_eq!(f[i], base[i], "pair {i} kept (truncate {truncate})");
            }
            for i in divide..32 {
                assert_eq!(f[i], base[i] / 32.0, "pair {i} divided (truncate {truncate})");
            }
            for i in keep + 1..divide {
                assert!(f[i] < base[i] && f[i] > base[i] / 32.0, "pair {i} blended (truncate {truncate})");
            }
        }
        let (a, b) = (rope_freqs(&yarn(false)), rope_freqs(&yarn(true)));
        assert!(a[9..18].iter().zip(&b[9..18]).all(|(x, y)| x != y), "truncate moves the ramp");
    }

    #[test]
    fn yarn_scales_cos_and_sin_and_the_others_do_not() {
        let rope = yarn(false);
        let m = rope_mscale(&rope);
        let freqs = rope_freqs(&rope);
        let (mut c, mut s, mut c1, mut s1) = (vec![0f32; 32], vec![0f32; 32], vec![0f32; 32], vec![0f32; 32]);
        rope_cos_sin_scaled(&freqs, m, 1234, &mut c, &mut s);
        for (i, &f) in freqs.iter().enumerate() {
            assert_eq!(c[i], ((1234.0 * f).cos() * m) as f32);
            assert_eq!(s[i], ((1234.0 * f).sin() * m) as f32);
        }
        assert_eq!(rope_mscale(&Rope { scaling: RopeScaling::Linear { factor: 4.0 }, ..rope }), 1.0);
        rope_cos_sin(&freqs, 1234, &mut c, &mut s);
        rope_cos_sin_scaled(&freqs, 1.0, 1234, &mut c1, &mut s1);
        assert_eq!((c, s), (c1, s1));
    }

    /// A sink of −∞ is no sink, bit for bit; a sink far above every score leaves almost nothing of the values.
    #[test]
    fn attention_sinks() {
        let (hd, slots) = (8, 6);
        let k: Vec<f32> = (0..slots * hd).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
        let v: Vec<f32> = (0..slots * hd).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.5).collect();
        let kv = KvLayer { k: &k, v: &v, block_size: 4, kv_heads: 1, head_dim: hd };
        let q: Vec<f32> = (0..hd).map(|i| i as f32 * 0.25 - 1.0).collect();
        let p =
            AttnParams { heads: 1, kv_heads: 1, head_dim: hd, scale: 0.5, window: None, softcap: None, sinks: None };
        let visits: Vec<(u32, u32)> = (0..slots as u32).map(|i| (i, i)).collect();
        let run = |sink: Option<f32>| {
            let mut out = vec![0f32; hd];
            attention_head_sink(&q, &kv, 0, &visits, &p, sink, &mut out);
            out
        };
        let plain = run(None);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&run(Some(f32::NEG_INFINITY))), bits(&plain));
        let zero_sink = run(Some(0.0));
        assert!(zero_sink.iter().zip(&plain).all(|(a, b)| a.abs() < b.abs() || *b == 0.0), "a sink shrinks the output");
        assert!(run(Some(80.0)).iter().all(|x| x.abs() < 1e-20), "a dominant sink takes the whole softmax");
        // No visits: zeros with or without a sink.
        let mut out = vec![1f32; hd];
        attention_head_sink(&q, &kv, 0, &[], &p, Some(3.0), &mut out);
        assert!(out.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn swiglu_clamp_clamps_gate_above_and_up_both_ways() {
        let act = GluAct::SwigluClamp { alpha: 1.702, limit: 7.0 };
        assert_eq!(glu_one(9.0, 0.5, act).to_bits(), glu_one(7.0, 0.5, act).to_bits());
        assert_eq!(glu_one(2.0, 30.0, act).to_bits(), glu_one(2.0, 7.0, act).to_bits());
        assert_eq!(glu_one(2.0, -30.0, act).to_bits(), glu_one(2.0, -7.0, act).to_bits());
        assert_ne!(glu_one(-9.0, 0.5, act), glu_one(-7.0, 0.5, act), "the gate is not clamped below");
        // (u + 1) · g · sigmoid(1.702 g) against f64.
        for &(g, u) in &[(1.5f32, -0.25f32), (-3.0, 2.0), (6.5, -6.5), (0.0, 3.0)] {
            let (g64, u64) = (g as f64, u as f64);
            let want = (u64 + 1.0) * g64 / (1.0 + (-1.702 * g64).exp());
            assert!((glu_one(g, u, act) as f64 - want).abs() <= 1e-6 * want.abs().max(1.0), "{g} {u}");
        }
        assert!(glu_one(f32::NAN, 1.0, act).is_nan() && glu_one(1.0, f32::NAN, act).is_nan());
    }
}
