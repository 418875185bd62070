//! The scalar reference of the Mamba-2 mixer's recurrent ops (docs/arithmetic.md, "Recurrent state"): one row
//! at a time, from the state the row reads to the state it leaves. A row's bits depend only on its inputs and
//! that state, so they are the same whatever else shares the call.

use super::math::{exp, silu};
use super::matmul::dot16;

/// `softplus(x) = ln(1 + e^x)`, in f64 (std's `exp` and `ln_1p`) rounded once to f32; `x` itself above 20 (as
/// PyTorch's threshold).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (x as f64).exp().ln_1p() as f32
    }
}

/// The squared ReLU of one value: `m · m` with `m = max(x, 0)` (NaN stays NaN).
pub fn relu_sq(x: f32) -> f32 {
    let m = if x > 0.0 || x.is_nan() { x } else { 0.0 };
    m * m
}

/// One row of the depthwise causal convolution and its SiLU.
/// - `x [conv_dim]`: the row's input; `window [(k - 1) · conv_dim]`: the previous `k - 1` inputs, oldest first;
/// - `w [conv_dim, k]`: channel `c`'s taps, the last one applied to `x`; `b [conv_dim]` optional;
/// - `out[c] = silu((Σ_{j<k-1} w[c,j]·window[j,c] + w[c,k-1]·x[c]) + b[c])`, the sum in increasing `j`;
/// - `next [(k - 1) · conv_dim]` receives the window after this row (`window[1..] ++ x`).
pub fn conv_row(x: &[f32], window: &[f32], w: &[f32], b: Option<&[f32]>, out: &mut [f32], next: &mut [f32]) {
    let c_dim = x.len();
    let k = w.len() / c_dim;
    assert!(k >= 1 && w.len() == c_dim * k, "conv_row: weight {} vs conv_dim {c_dim}", w.len());
    assert_eq!(window.len(), (k - 1) * c_dim, "conv_row: window length");
    assert_eq!(next.len(), window.len(), "conv_row: next window length");
    assert_eq!(out.len(), c_dim, "conv_row: output length");
    for c in 0..c_dim {
        let taps = &w[c * k..(c + 1) * k];
        let mut acc = 0f32;
        for j in 0..k - 1 {
            acc = taps[j].mul_add(window[j * c_dim + c], acc);
        }
        acc = taps[k - 1].mul_add(x[c], acc);
        if let Some(b) = b {
            acc += b[c];
        }
        out[c] = silu(acc);
    }
    if k > 1 {
        next[..(k - 2) * c_dim].copy_from_slice(&window[c_dim..]);
        next[(k - 2) * c_dim..].copy_from_slice(x);
    }
}

/// The shape of a scan row.
#[derive(Clone, Copy, Debug)]
pub struct ScanShape {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
}

/// The per-head parameters of a scan row (see `tf_core::SsmParams`).
#[derive(Clone, Copy, Debug)]
pub struct ScanParams<'a> {
    pub a_log: &'a [f32],
    pub d: &'a [f32],
    pub dt_bias: &'a [f32],
    pub dt_min: f32,
    pub eps: f32,
    pub norm_group: usize,
    /// `norm [heads · head_dim]`: the gated RMSNorm weight.
    pub norm: &'a [f32],
}

/// One head of one row of the selective scan, before the gate: `x [head_dim]` the head's channels, `b`, `c`
/// `[d_state]` its group's B and C, `dt` its raw step; `state [head_dim, d_state]` is advanced in place and
/// `out [head_dim]` receives `y`.
/// - `step = max(softplus(dt + dt_bias), dt_min)`, `decay = exp(step · -exp(a_log))`, `kb[n] = step · b[n]`;
/// - per channel `p`: `s[p,n] = fma(s[p,n], decay, kb[n] · x[p])` for every `n`, then
///   `y[p] = fma(x[p], d, dot16(s[p,·], c))` (the canonical dot product).
#[allow(clippy::too_many_arguments)]
pub fn scan_head(
    x: &[f32],
    b: &[f32],
    c: &[f32],
    dt: f32,
    a_log: f32,
    d: f32,
    dt_bias: f32,
    dt_min: f32,
    state: &mut [f32],
    out: &mut [f32],
) {
    let ds = b.len();
    let (step, decay) = step_decay(dt, dt_bias, dt_min, a_log);
    let kb: Vec<f32> = b.iter().map(|&bn| step * bn).collect();
    for (p, (&xv, o)) in x.iter().zip(out.iter_mut()).enumerate() {
        let s = &mut state[p * ds..(p + 1) * ds];
        for (sn, &k) in s.iter_mut().zip(&kb) {
            *sn = sn.mul_add(decay, k * xv);
        }
        *o = xv.mul_add(d, dot16(s, c));
    }
}

/// A head's step and decay: `step = max(softplus(dt + dt_bias), dt_min)`, `decay = exp(step · -exp(a_log))`.
pub fn step_decay(dt: f32, dt_bias: f32, dt_min: f32, a_log: f32) -> (f32, f32) {
    let step = softplus(dt + dt_bias).max(dt_min);
    (step, exp(step * -exp(a_log)))
}

/// The gate and group norm after the scan, in place on `y [heads · head_dim]`: `v = y · silu(z)`, then per group
/// of `norm_group` values `v · (1 / sqrt(dot16(v, v) / norm_group + eps)) · norm`.
pub fn gate_norm(y: &mut [f32], z: &[f32], norm: &[f32], norm_group: usize, eps: f32) {
    assert!(norm_group > 0 && y.len().is_multiple_of(norm_group), "gate_norm: group {norm_group} vs {}", y.len());
    for (o, &zv) in y.iter_mut().zip(z) {
        *o *= silu(zv);
    }
    for (gi, grp) in y.chunks_exact_mut(norm_group).enumerate() {
        let inv = 1.0 / (dot16(grp, grp) / norm_group as f32 + eps).sqrt();
        for (j, v) in grp.iter_mut().enumerate() {
            *v = (*v * inv) * norm[gi * norm_group + j];
        }
    }
}

/// One row of the selective scan, gated and normalized: every head by [`scan_head`] (head `h` reads B/C group
/// `h / (heads / groups)`), then [`gate_norm`].
/// - `xbc [heads·head_dim + 2·groups·d_state]`: the convolution's output, `x` then `B [groups, d_state]` then
///   `C [groups, d_state]`; `dt [heads]` raw; `z [heads·head_dim]` the gate;
/// - `state [heads, head_dim, d_state]` is advanced in place; `out [heads·head_dim]`.
pub fn scan_row(
    xbc: &[f32],
    dt: &[f32],
    z: &[f32],
    shape: ScanShape,
    p: &ScanParams<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    let ScanShape { heads, head_dim, d_state, groups } = shape;
    let inner = heads * head_dim;
    assert_eq!(xbc.len(), inner + 2 * groups * d_state, "scan_row: xbc length");
    assert_eq!(state.len(), inner * d_state, "scan_row: state length");
    assert!(dt.len() == heads && z.len() == inner && out.len() == inner, "scan_row: dt/z/out lengths");
    assert!(groups > 0 && heads.is_multiple_of(groups), "scan_row: heads {heads} vs groups {groups}");
    let (x, bc) = xbc.split_at(inner);
    let (b_all, c_all) = bc.split_at(groups * d_state);
    let per_group = heads / groups;
    for h in 0..heads {
        let g = h / per_group;
        let hs = h * head_dim..(h + 1) * head_dim;
        scan_head(
            &x[hs.clone()],
            &b_all[g * d_state..(g + 1) * d_state],
            &c_all[g * d_state..(g + 1) * d_state],
            dt[h],
            p.a_log[h],
            p.d[h],
            p.dt_bias[h],
            p.dt_min,
            &mut state[h * head_dim * d_state..(h + 1) * head_dim * d_state],
            &mut out[hs],
        );
    }
    gate_norm(out, z, p.norm, p.norm_group, p.eps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_row_is_a_causal_convolution() {
        // Two channels, kernel 3: window holds inputs t-2, t-1.
        let w = [1.0, 2.0, 3.0, -1.0, 0.5, 0.25];
        let window = [10.0, 20.0, 30.0, 40.0]; // t-2: (10, 20), t-1: (30, 40)
        let x = [5.0, 6.0];
        let (mut out, mut next) = ([0.0; 2], [0.0; 4]);
        conv_row(&x, &window, &w, Some(&[0.5, -0.5]), &mut out, &mut next);
        let pre = [1.0 * 10.0 + 2.0 * 30.0 + 3.0 * 5.0 + 0.5, -20.0 + 0.5 * 40.0 + 0.25 * 6.0 - 0.5];
        assert_eq!(out, [silu(pre[0]), silu(pre[1])]);
        assert_eq!(next, [30.0, 40.0, 5.0, 6.0]);
    }

    #[test]
    fn scan_row_decays_and_accumulates() {
        // One head, one channel, d_state 2, one group; dt_bias chosen so the step is exactly 1 after the clamp.
        let shape = ScanShape { heads: 1, head_dim: 1, d_state: 2, groups: 1 };
        let p = ScanParams {
            a_log: &[0.0],
            d: &[0.5],
            dt_bias: &[-100.0],
            dt_min: 1.0,
            eps: 0.0,
            norm_group: 1,
            norm: &[1.0],
        };
        let mut state = [2.0, 4.0];
        let xbc = [3.0, 1.0, 10.0, 0.5, 0.25]; // x, B[2], C[2]
        let mut out = [0.0];
        scan_row(&xbc, &[0.0], &[100.0], shape, &p, &mut state, &mut out);
        let decay = exp(-1.0);
        assert_eq!(state, [2.0f32.mul_add(decay, 3.0), 4.0f32.mul_add(decay, 30.0)]);
        // Before the gate and norm: y = x·D + s·C.
        let (mut st, mut y) = ([2.0, 4.0], [0.0]);
        scan_head(&[3.0], &[1.0, 10.0], &[0.5, 0.25], 0.0, 0.0, 0.5, -100.0, 1.0, &mut st, &mut y);
        assert_eq!(y[0], 3.0f32.mul_add(0.5, dot16(&st, &[0.5, 0.25])));
        // A one-channel group normalizes to 1 times the weight (a positive value).
        assert!((out[0] - 1.0).abs() < 1e-6, "{out:?}");
    }
}
