//! Attention's score dot products and value sums over f16 KV rows read where the cache stores them
//! (docs/arithmetic.md "KV storage types"). Each stored value is widened exactly as `kv::read_back_rows` widens
//! it (`vcvtph2ps`) and enters the same fma chains in the same order as the f32 rows do in `simd::avx2`
//! (`dot16`'s 16 lanes and tree, `fma_acc_rows`' per-element order), so every result equals the read-back path's
//! bit for bit, without writing the widened rows out and reading them again.
//!
//! `dot16_x8_scaled` also takes f32 rows ([`F32Rows`]): it scores eight rows at once and does their eight trees
//! across one register, for either storage type.
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
    assert!(j + 4 <= r.count());
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
    assert!(j < r.count());
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
    assert!(e.len() <= r.count());
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

/// f32 rows: row `j` is `rows[j]` (`[head_dim]` each; the caller checks the lengths).
pub(crate) struct F32Rows<'a> {
    pub rows: &'a [&'a [f32]],
}

impl StoredRows for F32Rows<'_> {
    fn count(&self) -> usize {
        self.rows.len()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(&self, j: usize, i: usize) -> __m256 {
        debug_assert!(i + 8 <= self.rows[j].len());
        _mm256_loadu_ps(self.rows.get_unchecked(j).as_ptr().add(i))
    }
}

/// `out[t] = dot16(a, row j + t) · scale` for t in 0..8: the same 16 lanes per product as [`dot16_x4`], and
/// `tree16`'s adds done for eight products at once across the register (`t8 = lo + hi`; `t4[i] = t8[i] + t8[i+4]`
/// with rows t and t + 4 in one register's halves; `t2[i] = t4[i] + t4[i+2]`; `t2[0] + t2[1]`), so each result
/// is `dot16`'s bits, then one vector multiply by `scale`.
///
/// # Safety
/// AVX2, FMA and F16C; `a.len()` is the rows' checked `head_dim`; `j + 8 ≤ r.count()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot16_x8_scaled<R: StoredRows>(a: &[f32], r: &R, j: usize, scale: f32, out: &mut [f32; 8]) {
    assert!(j + 8 <= r.count());
    let pa = a.as_ptr();
    // `t8[t] = lo + hi` of row j + t, four rows at a time (eight accumulators in registers).
    let mut t8 = [_mm256_setzero_ps(); 8];
    for half in 0..2 {
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        for i in (0..a.len()).step_by(16) {
            let (alo, ahi) = (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pa.add(i + 8)));
            for k in 0..4 {
                lo[k] = _mm256_fmadd_ps(alo, r.load8(j + 4 * half + k, i), lo[k]);
                hi[k] = _mm256_fmadd_ps(ahi, r.load8(j + 4 * half + k, i + 8), hi[k]);
            }
        }
        for k in 0..4 {
            t8[4 * half + k] = _mm256_add_ps(lo[k], hi[k]);
        }
    }
    // `t4` of rows t (low half) and t + 4 (high half).
    let t4 = [0, 1, 2, 3].map(|t| {
        let x = _mm256_permute2f128_ps::<0x20>(t8[t], t8[t + 4]);
        let y = _mm256_permute2f128_ps::<0x31>(t8[t], t8[t + 4]);
        _mm256_add_ps(x, y)
    });
    // `t2` of rows (t, t + 1) in each half's lanes (0, 1) and (2, 3).
    let t2 = [0, 2].map(|t| {
        let x = _mm256_shuffle_ps::<0b01_00_01_00>(t4[t], t4[t + 1]);
        let y = _mm256_shuffle_ps::<0b11_10_11_10>(t4[t], t4[t + 1]);
        _mm256_add_ps(x, y)
    });
    // Rows 0..4 in the low half, 4..8 in the high half, in order.
    let x = _mm256_shuffle_ps::<0b10_00_10_00>(t2[0], t2[1]);
    let y = _mm256_shuffle_ps::<0b11_01_11_01>(t2[0], t2[1]);
    let d = _mm256_add_ps(x, y);
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(d, _mm256_set1_ps(scale)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tf_quant::reference::matmul as rm;

    /// Eight products and their trees at once == the reference `dot16` times the scale, bit for bit, from f32 rows
    /// and from f16 rows (each value widened as the read-back path widens it), with extreme magnitudes and signed
    /// zeros among the values.
    #[test]
    fn dot16_x8_scaled_is_dot16_times_scale() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            eprintln!("no AVX2/FMA/F16C on this CPU: the kernel is never called here");
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let x = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
            match (s >> 20) % 61 {
                0 => -0.0,
                1 => x * 6.0e4,
                2 => x * 1.0e-6,
                _ => x,
            }
        };
        for hd in [16, 32, 64, 128, 256] {
            for round in 0..20 {
                let rows = 8 + round % 5;
                let q: Vec<f32> = (0..hd).map(|_| next()).collect();
                let k: Vec<Vec<f32>> = (0..rows).map(|_| (0..hd).map(|_| next()).collect()).collect();
                let scale = [0.125, 0.0883883, 1.0, 3.0][round % 4];
                let j = rows - 8;
                // f32 rows.
                let refs: Vec<&[f32]> = k.iter().map(|r| r.as_slice()).collect();
                let mut got = [0f32; 8];
                // SAFETY: AVX2, FMA and F16C were detected; every row holds `hd` values, a multiple of 16.
                unsafe { dot16_x8_scaled(&q, &F32Rows { rows: &refs }, j, scale, &mut got) };
                for t in 0..8 {
                    let want = rm::dot16(&q, &k[j + t]) * scale;
                    assert_eq!(got[t].to_bits(), want.to_bits(), "f32 hd {hd} row {t}: {} vs {want}", got[t]);
                }
                // f16 rows, one after another in one store.
                let h: Vec<u16> = k.iter().flatten().map(|&x| tf_quant::reference::kv::f16_round(x)).collect();
                let starts: Vec<usize> = (0..rows).map(|r| r * hd).collect();
                let f16 = F16Rows { h: &h, starts: &starts }.checked(hd);
                // SAFETY: as above; `checked` verified the rows.
                unsafe { dot16_x8_scaled(&q, &f16, j, scale, &mut got) };
                for t in 0..8 {
                    let row: Vec<f32> = h[(j + t) * hd..(j + t + 1) * hd]
                        .iter()
                        .map(|&b| tf_quant::reference::kv::f16_widen(b))
                        .collect();
                    let want = rm::dot16(&q, &row) * scale;
                    assert_eq!(got[t].to_bits(), want.to_bits(), "f16 hd {hd} row {t}: {} vs {want}", got[t]);
                }
            }
        }
    }
}
