//! NEON forms of the canonical `dot16` and of `fma_acc_rows` (aarch64, where NEON is baseline).
//!
//! `dot16`: the 16 lane accumulators in four registers (lanes 0..4, 4..8, 8..12, 12..16), element `i` into lane
//! `i % 16` by `fmla` (fused, as the reference's `mul_add`); the last `n % 16` elements folded into their own
//! lanes one by one with `f32::mul_add` (an `fmadd` here; the other lanes are left alone, never `+ 0.0`); then
//! the reference's own `tree16`.

use std::arch::aarch64::*;

use tf_quant::reference::matmul::tree16;

/// The 16 lanes of the four registers `acc`, with the elements `i0..n` of `a`·`b` folded into lanes
/// `(i - i0) % 16` (`n - i0 < 16`), reduced by `tree16`.
#[inline]
#[target_feature(enable = "neon")]
fn finish(acc: [float32x4_t; 4], a: &[f32], b: &[f32], i0: usize) -> f32 {
    // `[16]` lane accumulators.
    let mut lanes = [0f32; 16];
    for (q, v) in acc.iter().enumerate() {
        // SAFETY: `lanes` holds 16 values; `4 q + 4 <= 16`.
        unsafe { vst1q_f32(lanes.as_mut_ptr().add(4 * q), *v) };
    }
    for (j, (&x, &y)) in a[i0..].iter().zip(&b[i0..]).enumerate() {
        lanes[j] = x.mul_add(y, lanes[j]);
    }
    tree16(&lanes)
}

/// `dot16` of `a [n]` and `b [n]` (panics on unequal lengths).
#[target_feature(enable = "neon")]
pub(crate) fn dot16(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot16: lengths differ");
    let whole = a.len() / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    // SAFETY: every load reads within `0..whole` of both slices.
    unsafe {
        for i in (0..whole).step_by(16) {
            for (q, v) in acc.iter_mut().enumerate() {
                *v = vfmaq_f32(*v, vld1q_f32(pa.add(i + 4 * q)), vld1q_f32(pb.add(i + 4 * q)));
            }
        }
    }
    finish(acc, a, b, whole)
}

/// `[dot16(a, b[0]), …, dot16(a, b[3])]`: the same lanes and tree as `dot16`, four products interleaved.
#[target_feature(enable = "neon")]
pub(crate) fn dot16_x4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    assert!(b.iter().all(|b| b.len() == n), "dot16: lengths differ");
    let whole = n / 16 * 16;
    let pa = a.as_ptr();
    let pb = b.map(|b| b.as_ptr());
    // `[4][4]` registers: the 16 lanes of each product.
    let mut acc = [[vdupq_n_f32(0.0); 4]; 4];
    // SAFETY: every load reads within `0..whole` of `a` and of each `b[k]`.
    unsafe {
        for i in (0..whole).step_by(16) {
            let av: [float32x4_t; 4] = std::array::from_fn(|q| vld1q_f32(pa.add(i + 4 * q)));
            for (k, acc) in acc.iter_mut().enumerate() {
                for q in 0..4 {
                    acc[q] = vfmaq_f32(acc[q], av[q], vld1q_f32(pb[k].add(i + 4 * q)));
                }
            }
        }
    }
    std::array::from_fn(|k| finish(acc[k], a, b[k], whole))
}

/// For `j` in order: `o[d] = fma(e[j], v[j][d], o[d])`. Blocks of 16 dimensions stay in registers across all
/// `j` (the per-element order is unchanged); the last `n % 4` dimensions are done one by one.
#[target_feature(enable = "neon")]
pub(crate) fn fma_acc_rows(o: &mut [f32], e: &[f32], v: &[&[f32]]) {
    let n = o.len();
    assert!(v.iter().all(|r| r.len() == n), "fma_acc_rows: row lengths");
    let po = o.as_mut_ptr();
    let mut d = 0;
    // SAFETY: every access is at `d + 4·t + 4 <= n` of `o` and of each row of `v`, all of length `n`.
    unsafe {
        while d + 16 <= n {
            let mut acc: [float32x4_t; 4] = std::array::from_fn(|t| vld1q_f32(po.add(d + 4 * t)));
            for (&w, row) in e.iter().zip(v) {
                let (ve, pr) = (vdupq_n_f32(w), row.as_ptr());
                for (t, a) in acc.iter_mut().enumerate() {
                    *a = vfmaq_f32(*a, ve, vld1q_f32(pr.add(d + 4 * t)));
                }
            }
            for (t, a) in acc.iter().enumerate() {
                vst1q_f32(po.add(d + 4 * t), *a);
            }
            d += 16;
        }
        while d + 4 <= n {
            let mut acc = vld1q_f32(po.add(d));
            for (&w, row) in e.iter().zip(v) {
                acc = vfmaq_f32(acc, vdupq_n_f32(w), vld1q_f32(row.as_ptr().add(d)));
            }
            vst1q_f32(po.add(d), acc);
            d += 4;
        }
    }
    for d in d..n {
        for (&w, row) in e.iter().zip(v) {
            o[d] = w.mul_add(row[d], o[d]);
        }
    }
}
