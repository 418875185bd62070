//! Full mode with AVX2 + FMA: `dot16` (docs/arithmetic.md) of f32 weight rows with f32 activation rows.
//!
//! The 16 lane accumulators of one (weight row, activation row) pair live in two registers: `lo` = lanes 0..8,
//! `hi` = lanes 8..16, element `i` going to lane `i % 16`. A tile holds `C × RT = 4` pairs (8 registers), so each
//! weight load serves `RT` rows and each activation load `C` weight rows. The last `k % 16` elements touch only
//! their own lanes (the other lanes are kept by a blend, never `+ 0.0`). The tree is the reference's:
//! `lo + hi`, then the two 128-bit halves, then lanes 2..4 onto 0..2, then lane 0 + lane 1.

use std::arch::x86_64::*;

/// `dot16` of weight rows `w[0..c]` with activation rows `x[0..rt]` (`c · rt = 4`, all rows the same length):
/// lane `ci · rt + ri`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
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

#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const C: usize, const RT: usize>(w: &[&[f32]; 4], x: &[&[f32]; 4], k: usize) -> [f32; 4] {
    let wp: [*const f32; C] = std::array::from_fn(|c| w[c].as_ptr());
    let xp: [*const f32; RT] = std::array::from_fn(|r| x[r].as_ptr());
    let mut lo = [[_mm256_setzero_ps(); RT]; C];
    let mut hi = [[_mm256_setzero_ps(); RT]; C];
    let whole = k / 16 * 16;
    let mut i = 0;
    while i < whole {
        for c in 0..C {
            let w0 = _mm256_loadu_ps(wp[c].add(i));
            let w1 = _mm256_loadu_ps(wp[c].add(i + 8));
            for r in 0..RT {
                lo[c][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp[r].add(i)), w0, lo[c][r]);
                hi[c][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp[r].add(i + 8)), w1, hi[c][r]);
            }
        }
        i += 16;
    }
    let rem = k - whole;
    if rem > 0 {
        // Lane j of the tail exists iff j < rem: masks for lanes 0..8 and 8..16.
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32), idx);
        let m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32 - 8), idx);
        for c in 0..C {
            let w0 = _mm256_maskload_ps(wp[c].add(whole), m0);
            let w1 = _mm256_maskload_ps(wp[c].add(whole + 8), m1);
            for r in 0..RT {
                let x0 = _mm256_maskload_ps(xp[r].add(whole), m0);
                let x1 = _mm256_maskload_ps(xp[r].add(whole + 8), m1);
                let n0 = _mm256_fmadd_ps(x0, w0, lo[c][r]);
                let n1 = _mm256_fmadd_ps(x1, w1, hi[c][r]);
                lo[c][r] = _mm256_blendv_ps(lo[c][r], n0, _mm256_castsi256_ps(m0));
                hi[c][r] = _mm256_blendv_ps(hi[c][r], n1, _mm256_castsi256_ps(m1));
            }
        }
    }
    let mut out = [0f32; 4];
    for c in 0..C {
        for r in 0..RT {
            out[c * RT + r] = tree(lo[c][r], hi[c][r]);
        }
    }
    out
}

/// The reference tree over lanes `lo` (0..8) and `hi` (8..16).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tree(lo: __m256, hi: __m256) -> f32 {
    let t8 = _mm256_add_ps(lo, hi);
    let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps::<1>(t2, t2)))
}
