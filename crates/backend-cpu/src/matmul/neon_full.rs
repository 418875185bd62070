//! Full mode with NEON: `dot16` (docs/arithmetic.md) of f32 weight rows with f32 activation rows.
//!
//! The 16 lane accumulators of one (weight row, activation row) pair live in four registers (lanes 0..4, 4..8,
//! 8..12, 12..16), element `i` going to lane `i % 16` by `fmla` (fused, as the reference's `mul_add`). A tile
//! holds `C × RT = 4` pairs (16 registers), so each weight load serves `RT` rows and each activation load `C`
//! weight rows. The last `k % 16` elements are folded into their own lanes one by one with `f32::mul_add` (an
//! `fmadd` on aarch64; the other lanes are left alone, never `+ 0.0`), and the lanes are reduced by the
//! reference's own `tree16`.

use std::arch::aarch64::*;

use tf_quant::reference::matmul::tree16;

/// `dot16` of weight rows `w[0..c]` with activation rows `x[0..rt]` (`c · rt = 4`, all rows the same length):
/// lane `ci · rt + ri`.
///
/// # Safety
/// NEON (baseline on aarch64).
pub(super) unsafe fn dot16_tile(c: usize, rt: usize, w: &[&[f32]; 4], x: &[&[f32]; 4]) -> [f32; 4] {
    let k = x[0].len();
    assert!(w.iter().chain(x.iter()).all(|r| r.len() == k), "dot16_tile: row lengths differ");
    match (c, rt) {
        (1, 4) => tile::<1, 4>(w, x, k),
        (2, 2) => tile::<2, 2>(w, x, k),
        (4, 1) => tile::<4, 1>(w, x, k),
        _ => unreachable!("tile {c} × {rt}"),
    }
}

#[target_feature(enable = "neon")]
unsafe fn tile<const C: usize, const RT: usize>(w: &[&[f32]; 4], x: &[&[f32]; 4], k: usize) -> [f32; 4] {
    let wp: [*const f32; C] = std::array::from_fn(|c| w[c].as_ptr());
    let xp: [*const f32; RT] = std::array::from_fn(|r| x[r].as_ptr());
    // `[C][RT][4]` registers: the 16 lanes of each pair.
    let mut acc = [[[vdupq_n_f32(0.0); 4]; RT]; C];
    let whole = k / 16 * 16;
    let mut i = 0;
    while i < whole {
        for c in 0..C {
            let wv: [float32x4_t; 4] = std::array::from_fn(|q| vld1q_f32(wp[c].add(i + 4 * q)));
            for r in 0..RT {
                for q in 0..4 {
                    acc[c][r][q] = vfmaq_f32(acc[c][r][q], vld1q_f32(xp[r].add(i + 4 * q)), wv[q]);
                }
            }
        }
        i += 16;
    }
    let mut out = [0f32; 4];
    for c in 0..C {
        for r in 0..RT {
            // `[16]` lane accumulators.
            let mut lanes = [0f32; 16];
            for (q, v) in acc[c][r].iter().enumerate() {
                vst1q_f32(lanes.as_mut_ptr().add(4 * q), *v);
            }
            for j in 0..k - whole {
                lanes[j] = x[r][whole + j].mul_add(w[c][whole + j], lanes[j]);
            }
            out[c * RT + r] = tree16(&lanes);
        }
    }
    out
}
