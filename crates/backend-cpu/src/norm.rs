//! RMSNorm (docs/arithmetic.md "rms_norm"), per row and group: `ss = dot16(g, g)` (AVX2 `dot16` on AVX2),
//! `inv = 1 / sqrt(ss / group + eps)`, `y_i = (x_i * inv) * w_i` (vector products on AVX2).

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
