//! Attention's score dot products and value sums over f16 KV rows read where the cache stores them
//! (docs/arithmetic.md "KV storage types"). Each stored value is widened exactly as `kv::read_back_rows` widens
//! it (`vcvtph2ps`) and enters the same fma chains in the same order as the f32 rows do in `simd::avx2`
//! (`dot16`'s 16 lanes and tree, `fma_acc_rows`' per-element order), so every result equals the read-back path's
//! bit for bit, without writing the widened rows out and reading them again.
//!
//! Rows are `[head_dim]` values from `starts[j]` of the layer's K or V store; `head_dim` must be a multiple of 16
//! (the callers fall back to the read-back path otherwise). q8_0 rows are read back: widening one costs a scale
//! and three conversions per 8 values, and every query head of a kv head would repeat it (measured slower, 0.5B
//! at 4,096 tokens: 22.6–23.2 tok/s against 34.3–37.2 read back).

use std::arch::x86_64::*;

use crate::simd::avx2::tree16;

/// K or V rows of one chunk as stored.
pub(crate) trait StoredRows {
    /// How many rows.
    fn count(&self) -> usize;

    /// Values `i .. i + 8` of row `j` widened to f32 (`i` a multiple of 8, `i + 8 ≤ head_dim`).
    ///
    /// # Safety
    /// AVX2 and F16C; `j < count()`.
    unsafe fn load8(&self, j: usize, i: usize) -> __m256;
}

/// f16 rows: row `j` at `h[starts[j]..]`.
pub(crate) struct F16Rows<'a> {
    pub h: &'a [u16],
    pub starts: &'a [usize],
}

impl StoredRows for F16Rows<'_> {
    fn count(&self) -> usize {
        self.starts.len()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, j: usize, i: usize) -> __m256 {
        let at = self.starts[j] + i;
        debug_assert!(at + 8 <= self.h.len());
        _mm256_cvtph_ps(_mm_loadu_si128(self.h.as_ptr().add(at) as *const __m128i))
    }
}

/// Checks what every function below needs of its rows: `n` a multiple of 16 and each row inside the store.
fn check(n: usize, starts: &[usize], len: usize) {
    assert!(n.is_multiple_of(16), "kv_dot: head_dim {n} is not a multiple of 16");
    assert!(starts.iter().all(|&s| s + n <= len), "kv_dot: a row lies outside the cache");
}

impl F16Rows<'_> {
    /// The rows checked for `head_dim` `n` (panics when they do not fit).
    pub(crate) fn checked(self, n: usize) -> Self {
        check(n, self.starts, self.h.len());
        self
    }
}

/// `[dot16(a, row j), …, dot16(a, row j + 3)]` (`simd::avx2::dot16_x4`'s lanes and tree).
///
/// # Safety
/// AVX2, FMA and F16C; `a.len()` is the rows' checked `head_dim`; `j + 4 ≤ r.count()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot16_x4<R: StoredRows>(a: &[f32], r: &R, j: usize) -> [f32; 4] {
    debug_assert!(j + 4 <= r.count());
    let pa = a.as_ptr();
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    for i in (0..a.len()).step_by(16) {
        let (alo, ahi) = (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pa.add(i + 8)));
        for k in 0..4 {
            lo[k] = _mm256_fmadd_ps(alo, r.load8(j + k, i), lo[k]);
            hi[k] = _mm256_fmadd_ps(ahi, r.load8(j + k, i + 8), hi[k]);
        }
    }
    [tree16(lo[0], hi[0]), tree16(lo[1], hi[1]), tree16(lo[2], hi[2]), tree16(lo[3], hi[3])]
}

/// `dot16(a, row j)` (`simd::avx2::dot16`'s lanes and tree).
///
/// # Safety
/// As [`dot16_x4`], with `j < r.count()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot16<R: StoredRows>(a: &[f32], r: &R, j: usize) -> f32 {
    debug_assert!(j < r.count());
    let pa = a.as_ptr();
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in (0..a.len()).step_by(16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), r.load8(j, i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), r.load8(j, i + 8), hi);
    }
    tree16(lo, hi)
}

/// For `j` in order: `o[d] = fma(e[j], row j [d], o[d])` (`simd::fma_acc_rows`' per-element order), rows
/// `0..e.len()`; 32 dimensions at a time stay in registers across all `j`.
///
/// # Safety
/// AVX2, FMA and F16C; `o.len()` is the rows' checked `head_dim`; `e.len() ≤ r.count()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fma_acc<R: StoredRows>(o: &mut [f32], e: &[f32], r: &R) {
    debug_assert!(e.len() <= r.count());
    let (n, po) = (o.len(), o.as_mut_ptr());
    let mut d = 0;
    while d + 32 <= n {
        let mut acc = [0, 1, 2, 3].map(|t| _mm256_loadu_ps(po.add(d + 8 * t)));
        for (j, &w) in e.iter().enumerate() {
            let ve = _mm256_set1_ps(w);
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(ve, r.load8(j, d + 8 * t), *a);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(po.add(d + 8 * t), *a);
        }
        d += 32;
    }
    while d < n {
        let mut acc = [0, 1].map(|t| _mm256_loadu_ps(po.add(d + 8 * t)));
        for (j, &w) in e.iter().enumerate() {
            let ve = _mm256_set1_ps(w);
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(ve, r.load8(j, d + 8 * t), *a);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(po.add(d + 8 * t), *a);
        }
        d += 16;
    }
}
