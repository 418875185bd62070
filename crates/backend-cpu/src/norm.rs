//! RMSNorm (docs/arithmetic.md "rms_norm"), per row and group: `ss = dot16(g, g)` (AVX2 `dot16` on AVX2),
//! `inv = 1 / sqrt(ss / group + eps)`, `y_i = (x_i * inv) * w_i` (vector products on AVX2); and its two parts for
//! the normed projections ("Normed projections": `u_i = x_i * w_i` and `inv`, then `y_n * inv (+ bias_n)`).

use crate::isa::Isa;
use crate::{for_rows, simd};
use tf_core::Tensor;

/// `x [R, cols]`, `w [group]` → `[R, cols]`, each `group` columns normalized on their own.
pub(crate) fn rms_norm(pool: &crate::Pool, isa: Isa, x: &Tensor, w: &[f32], group: usize, eps: f32) -> Tensor {
    assert!(group > 0 && x.cols.is_multiple_of(group), "rms_norm: cols {} not a multiple of group {group}", x.cols);
    assert_eq!(w.len(), group, "rms_norm: weight has {} values for groups of {group}", w.len());
    let mut out = Tensor::zeros(x.rows, x.cols);
    for_rows(pool, &mut out.host, x.cols, |r, y| {
        for (g, yg) in x.row(r).chunks_exact(group).zip(y.chunks_exact_mut(group)) {
            let ss = simd::dot16(isa, g, g);
            let inv = 1.0 / (ss / group as f32 + eps).sqrt();
            simd::mul_scalar_mul(isa, g, inv, w, yg);
        }
    });
    out
}

/// `x [R, cols]`, `w [cols]` → (`u [R, cols]` with `u_i = x_i * w_i`, `inv [R, 1]` as [`rms_norm`]'s over whole
/// rows).
pub(crate) fn rms_split(pool: &crate::Pool, isa: Isa, x: &Tensor, w: &[f32], eps: f32) -> (Tensor, Tensor) {
    assert_eq!(w.len(), x.cols, "rms_split: weight has {} values for rows of {}", w.len(), x.cols);
    let mut u = Tensor::zeros(x.rows, x.cols);
    for_rows(pool, &mut u.host, x.cols, |r, ur| {
        for ((o, &xi), &wi) in ur.iter_mut().zip(x.row(r)).zip(w) {
            *o = xi * wi;
        }
    });
    let inv = (0..x.rows)
        .map(|r| {
            let g = x.row(r);
            1.0 / (simd::dot16(isa, g, g) / x.cols as f32 + eps).sqrt()
        })
        .collect();
    (u, Tensor::host(x.rows, 1, inv))
}

/// `y [R, N]` in place: `y_n = y_n * inv[r]`, then `+ bias[n]` with a bias (no fma).
pub(crate) fn scale_rows(pool: &crate::Pool, y: &mut Tensor, inv: &Tensor, bias: Option<&[f32]>) {
    assert_eq!(inv.rows * inv.cols, y.rows, "scale_rows: one inv per row");
    if let Some(b) = bias {
        assert_eq!(b.len(), y.cols, "scale_rows: bias length");
    }
    let cols = y.cols;
    for_rows(pool, &mut y.host, cols, |r, yr| {
        let s = inv.host[r];
        match bias {
            Some(b) => yr.iter_mut().zip(b).for_each(|(v, &bi)| *v = *v * s + bi),
            None => yr.iter_mut().for_each(|v| *v *= s),
        }
    });
}
