//! The scalar reference of the Mamba-2 mixer's recurrent ops (docs/arithmetic.md, "Recurrent state"): one row
//! at a time, from the state the row reads to the state it leaves. A row's bits depend only on its inputs and
//! that state, so they are the same whatever else shares the call.

use super::math::{exp, silu};

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

/// One row of the selective scan, gated and normalized.
/// - `xbc [heads·head_dim + 2·groups·d_state]`: the convolution's output, `x` then `B [groups, d_state]` then
///   `C [groups, d_state]`; `dt [heads]` raw; `z [heads·head_dim]` the gate;
/// - `state [heads, head_dim, d_state]` is advanced in place: per head `h` (group `g = h / (heads/groups)`),
///   `step = max(softplus(dt[h] + dt_bias[h]), dt_min)`, `decay = exp(step · -exp(a_log[h]))`, and per channel
///   `p`, `s[h,p,n] = s[h,p,n]·decay + (step·B[g,n])·x[h,p]`;
/// - `y[h,p] = Σ_n s[h,p,n]·C[g,n]` (increasing `n`, fused multiply-adds from 0) `+ x[h,p]·d[h]`;
/// - then `y·silu(z)`, and per group of `norm_group` channels `v · (1 / sqrt(mean(v²) + eps)) · norm` with the
///   sum of squares in increasing index.
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
        let step = softplus(dt[h] + p.dt_bias[h]).max(p.dt_min);
        let decay = exp(step * -exp(p.a_log[h]));
        let g = h / per_group;
        let b = &b_all[g * d_state..(g + 1) * d_state];
        let c = &c_all[g * d_state..(g + 1) * d_state];
        for ch in 0..head_dim {
            let xv = x[h * head_dim + ch];
            let s = &mut state[(h * head_dim + ch) * d_state..(h * head_dim + ch + 1) * d_state];
            let mut y = 0f32;
            for n in 0..d_state {
                s[n] = s[n].mul_add(decay, (step * b[n]) * xv);
                y = s[n].mul_add(c[n], y);
            }
            out[h * head_dim + ch] = xv.mul_add(p.d[h], y);
        }
    }
    for (o, &zv) in out.iter_mut().zip(z) {
        *o *= silu(zv);
    }
    let ng = p.norm_group;
    assert!(ng > 0 && inner.is_multiple_of(ng), "scan_row: norm group {ng} vs {inner}");
    for (gi, grp) in out.chunks_exact_mut(ng).enumerate() {
        let mut ss = 0f32;
        for v in grp.iter() {
            ss = v.mul_add(*v, ss);
        }
        let inv = 1.0 / (ss / ng as f32 + p.eps).sqrt();
        for (j, v) in grp.iter_mut().enumerate() {
            *v = (*v * inv) * p.norm[gi * ng + j];
        }
    }
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
        // A one-channel group normalizes to 1 times the weight (a positive value).
        assert!((out[0] - 1.0).abs() < 1e-6, "{out:?}");
    }
}
