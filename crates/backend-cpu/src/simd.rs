//! Vector building blocks per ISA: the canonical `dot16`, and lane-wise slice operations (fma accumulation,
//! attention merges, norm scaling, add, scale). Every function gives the bits of its scalar form: `dot16` keeps
//! the 16 canonical lane accumulators in two registers and reduces them with the fixed tree; the others are
//! elementwise, one rounded operation per element in the order written. NEON (`simd/neon.rs`) has `dot16`,
//! `dot16_x4` and `fma_acc_rows`; its other operations are the scalar loops.
//!
//! Every function taking an [`Isa`] requires `isa` to be usable on this CPU (`Isa::available()`); `CpuBackend`
//! guarantees it for the ISA it holds.

use crate::isa::Isa;
use tf_quant::reference::matmul as rm;

/// Asks for every cache line of `data` to be brought into L2 (a prefetch: changes no value, never faults).
#[inline]
pub(crate) fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let (p, len) = (data.as_ptr() as *const u8, std::mem::size_of_val(data));
        for at in (0..len).step_by(64) {
            // SAFETY: a prefetch of an address inside `data`; SSE is part of x86_64.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.add(at) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// The canonical dot product (`tf_quant::reference::matmul::dot16`) of `a [n]` and `b [n]`.
#[inline]
pub(crate) fn dot16(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` is Avx2 only when the CPU has AVX2 and FMA (module docs).
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::dot16(a, b) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `isa` is Neon only on aarch64 with NEON (module docs).
        Isa::Neon => unsafe { neon::dot16(a, b) },
        _ => rm::dot16(a, b),
    }
}

/// Four canonical dot products of `a [n]` with `b[0..4]` (each `[n]`); each result is `dot16(a, b[i])`.
#[inline]
pub(crate) fn dot16_x4(isa: Isa, a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::dot16_x4(a, b) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as in `dot16`.
        Isa::Neon => unsafe { neon::dot16_x4(a, b) },
        _ => b.map(|b| rm::dot16(a, b)),
    }
}

/// For `j` in order: `o[d] = fma(e[j], v[j][d], o[d])`; `o` and every `v[j]`: `[n]`, `e`: `[v.len()]`.
#[inline]
pub(crate) fn fma_acc_rows(isa: Isa, o: &mut [f32], e: &[f32], v: &[&[f32]]) {
    assert_eq!(e.len(), v.len(), "fma_acc_rows: weights vs rows");
    assert!(v.iter().all(|r| r.len() == o.len()), "fma_acc_rows: row lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::fma_acc_rows(o, e, v) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as in `dot16`.
        Isa::Neon => unsafe { neon::fma_acc_rows(o, e, v) },
        _ => {
            for (&e, v) in e.iter().zip(v) {
                o.iter_mut().zip(*v).for_each(|(o, &v)| *o = e.mul_add(v, *o));
            }
        }
    }
}

/// `o[d] = o[d] * a + oc[d] * b` (two rounded products, then a rounded sum); `o`, `oc`: `[n]`.
#[inline]
pub(crate) fn merge(isa: Isa, o: &mut [f32], a: f32, oc: &[f32], b: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::merge(o, a, oc, b) },
        _ => o.iter_mut().zip(oc).for_each(|(o, &c)| *o = *o * a + c * b),
    }
}

/// `y[i] = (x[i] * s) * w[i]`; all `[n]` (`w` may be longer only when `x` is, never shorter).
#[inline]
pub(crate) fn mul_scalar_mul(isa: Isa, x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
    assert!(x.len() == y.len() && w.len() == y.len(), "mul_scalar_mul: lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::mul_scalar_mul(x, s, w, y) },
        _ => y.iter_mut().zip(x).zip(w).for_each(|((y, &x), &w)| *y = (x * s) * w),
    }
}

/// `y[i] = x[i] / l`; both `[n]`.
#[inline]
pub(crate) fn div_scalar(isa: Isa, x: &[f32], l: f32, y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "div_scalar: lengths");
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::div_scalar(x, l, y) },
        _ => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x / l),
    }
}

/// `a[i] += b[i]`; both `[n]`.
#[inline]
pub(crate) fn add(isa: Isa, a: &mut [f32], b: &[f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::add(a, b) },
        _ => tf_quant::reference::ops::add(a, b),
    }
}

/// `x[i] *= s`.
#[inline]
pub(crate) fn scale(isa: Isa, x: &mut [f32], s: f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot16`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::scale(x, s) },
        _ => tf_quant::reference::ops::scale(x, s),
    }
}

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Lane mask for the first `k` (0..=8) lanes of a register.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn first_lanes(k: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), idx)
    }

    /// `fma(a[i], b[i], acc[lane])` for the first `k` lanes of `a`, `b` (read with a masked load); the other
    /// lanes keep `acc` unchanged (no padding term is added: `-0.0 + 0.0` would change a sign).
    ///
    /// # Safety
    /// `a` and `b` must be valid for `k` reads.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_partial(acc: __m256, a: *const f32, b: *const f32, k: usize) -> __m256 {
        let mask = first_lanes(k);
        // SAFETY: masked loads touch only the first `k` elements (caller's contract).
        let (va, vb) = unsafe { (_mm256_maskload_ps(a, mask), _mm256_maskload_ps(b, mask)) };
        _mm256_blendv_ps(acc, _mm256_fmadd_ps(va, vb, acc), _mm256_castsi256_ps(mask))
    }

    /// The fixed tree over the 16 lanes (`lo` = lanes 0..8, `hi` = lanes 8..16): `t8 = lo + hi`,
    /// `t4[j] = t8[j] + t8[j+4]`, `t2[j] = t4[j] + t4[j+2]`, `t2[0] + t2[1]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn tree16(lo: __m256, hi: __m256) -> f32 {
        let t8 = _mm256_add_ps(lo, hi);
        let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps::<1>(t8));
        let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        let t1 = _mm_add_ss(t2, _mm_shuffle_ps::<0b01>(t2, t2));
        _mm_cvtss_f32(t1)
    }

    /// `dot16` of `a [n]` and `b [n]` (panics on unequal lengths).
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn dot16(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot16: lengths differ");
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut lo = _mm256_setzero_ps();
        let mut hi = _mm256_setzero_ps();
        let full = n / 16 * 16;
        let mut i = 0;
        // SAFETY: every load below reads within `0..n` of both slices.
        unsafe {
            while i < full {
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)), hi);
                i += 16;
            }
            let rem = n - full;
            if rem >= 8 {
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), lo);
                if rem > 8 {
                    hi = fma_partial(hi, pa.add(i + 8), pb.add(i + 8), rem - 8);
                }
            } else if rem > 0 {
                lo = fma_partial(lo, pa.add(i), pb.add(i), rem);
            }
        }
        tree16(lo, hi)
    }

    /// `[dot16(a, b[0]), …, dot16(a, b[3])]`: the same lanes and tree as `dot16`, four products interleaved.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn dot16_x4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        assert!(b.iter().all(|b| b.len() == n), "dot16: lengths differ");
        let pa = a.as_ptr();
        let pb = b.map(|b| b.as_ptr());
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        let full = n / 16 * 16;
        let mut i = 0;
        // SAFETY: every load below reads within `0..n` of `a` and of each `b[k]`.
        unsafe {
            while i < full {
                let (alo, ahi) = (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pa.add(i + 8)));
                for k in 0..4 {
                    lo[k] = _mm256_fmadd_ps(alo, _mm256_loadu_ps(pb[k].add(i)), lo[k]);
                    hi[k] = _mm256_fmadd_ps(ahi, _mm256_loadu_ps(pb[k].add(i + 8)), hi[k]);
                }
                i += 16;
            }
            let rem = n - full;
            for k in 0..4 {
                if rem >= 8 {
                    lo[k] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb[k].add(i)), lo[k]);
                    if rem > 8 {
                        hi[k] = fma_partial(hi[k], pa.add(i + 8), pb[k].add(i + 8), rem - 8);
                    }
                } else if rem > 0 {
                    lo[k] = fma_partial(lo[k], pa.add(i), pb[k].add(i), rem);
                }
            }
        }
        [tree16(lo[0], hi[0]), tree16(lo[1], hi[1]), tree16(lo[2], hi[2]), tree16(lo[3], hi[3])]
    }

    /// For `j` in order: `o[d] = fma(e[j], v[j][d], o[d])`. Blocks of 32 dimensions stay in registers across
    /// all `j` (the per-element order is unchanged); the last `n % 8` dimensions are done one by one.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn fma_acc_rows(o: &mut [f32], e: &[f32], v: &[&[f32]]) {
        let n = o.len();
        let po = o.as_mut_ptr();
        let mut d = 0;
        // SAFETY: every access below is at `d + 8·t + 8 <= n` (vectors) or `< n` (tail) of `o` and of each row
        // of `v`, all of length `n` (checked by the caller).
        unsafe {
            // Eight independent accumulator chains (two fmas per cycle need eight in flight at latency four);
            // each `o[d]` still takes its products in `j` order.
            while d + 64 <= n {
                let mut acc = [0, 1, 2, 3, 4, 5, 6, 7].map(|t| _mm256_loadu_ps(po.add(d + 8 * t)));
                for (&w, row) in e.iter().zip(v) {
                    let (ve, pr) = (_mm256_set1_ps(w), row.as_ptr());
                    for (t, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(ve, _mm256_loadu_ps(pr.add(d + 8 * t)), *a);
                    }
                }
                for (t, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(po.add(d + 8 * t), *a);
                }
                d += 64;
            }
            while d + 32 <= n {
                let mut acc = [0, 1, 2, 3].map(|t| _mm256_loadu_ps(po.add(d + 8 * t)));
                for (&w, row) in e.iter().zip(v) {
                    let (ve, pr) = (_mm256_set1_ps(w), row.as_ptr());
                    for (t, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(ve, _mm256_loadu_ps(pr.add(d + 8 * t)), *a);
                    }
                }
                for (t, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(po.add(d + 8 * t), *a);
                }
                d += 32;
            }
            while d + 8 <= n {
                let mut acc = _mm256_loadu_ps(po.add(d));
                for (&w, row) in e.iter().zip(v) {
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(row.as_ptr().add(d)), acc);
                }
                _mm256_storeu_ps(po.add(d), acc);
                d += 8;
            }
        }
        for d in d..n {
            for (&w, row) in e.iter().zip(v) {
                o[d] = w.mul_add(row[d], o[d]);
            }
        }
    }

    /// `o[d] = o[d] * a + oc[d] * b`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn merge(o: &mut [f32], a: f32, oc: &[f32], b: f32) {
        let n = o.len();
        assert_eq!(oc.len(), n);
        let (va, vb) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
        let full = n / 8 * 8;
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            for i in (0..full).step_by(8) {
                let po = o.as_mut_ptr().add(i);
                let x = _mm256_mul_ps(_mm256_loadu_ps(po), va);
                let y = _mm256_mul_ps(_mm256_loadu_ps(oc.as_ptr().add(i)), vb);
                _mm256_storeu_ps(po, _mm256_add_ps(x, y));
            }
        }
        for i in full..n {
            o[i] = o[i] * a + oc[i] * b;
        }
    }

    /// `y[i] = (x[i] * s) * w[i]`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn mul_scalar_mul(x: &[f32], s: f32, w: &[f32], y: &mut [f32]) {
        let n = y.len();
        assert!(x.len() == n && w.len() == n);
        let vs = _mm256_set1_ps(s);
        let full = n / 8 * 8;
        // SAFETY: i + 8 <= n for all three slices.
        unsafe {
            for i in (0..full).step_by(8) {
                let t = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vs);
                _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_mul_ps(t, _mm256_loadu_ps(w.as_ptr().add(i))));
            }
        }
        for i in full..n {
            y[i] = (x[i] * s) * w[i];
        }
    }

    /// `y[i] = x[i] / l`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn div_scalar(x: &[f32], l: f32, y: &mut [f32]) {
        let n = y.len();
        assert_eq!(x.len(), n);
        let vl = _mm256_set1_ps(l);
        let full = n / 8 * 8;
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            for i in (0..full).step_by(8) {
                _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vl));
            }
        }
        for i in full..n {
            y[i] = x[i] / l;
        }
    }

    /// `a[i] += b[i]`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn add(a: &mut [f32], b: &[f32]) {
        let n = a.len();
        assert_eq!(b.len(), n, "add: lengths");
        let full = n / 8 * 8;
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            for i in (0..full).step_by(8) {
                let pa = a.as_mut_ptr().add(i);
                _mm256_storeu_ps(pa, _mm256_add_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(b.as_ptr().add(i))));
            }
        }
        for i in full..n {
            a[i] += b[i];
        }
    }

    /// `x[i] *= s`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn scale(x: &mut [f32], s: f32) {
        let n = x.len();
        let vs = _mm256_set1_ps(s);
        let full = n / 8 * 8;
        // SAFETY: i + 8 <= n.
        unsafe {
            for i in (0..full).step_by(8) {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), vs));
            }
        }
        for v in &mut x[full..] {
            *v *= s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot16_every_length_and_signed_zeros() {
        let mut s = 12345u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        for isa in Isa::available() {
            // Every tail, and the head sizes 64 and 128 that take the eight-register path once or twice.
            for n in (0..100).chain([128, 131, 192]) {
                let a: Vec<f32> = (0..n).map(|_| next()).collect();
                let b: Vec<f32> = (0..n).map(|_| next()).collect();
                assert_eq!(dot16(isa, &a, &b).to_bits(), rm::dot16(&a, &b).to_bits(), "{isa:?} n={n}");
                let bs: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| next()).collect()).collect();
                let x4 = dot16_x4(isa, &a, [&bs[0], &bs[1], &bs[2], &bs[3]]);
                for k in 0..4 {
                    assert_eq!(x4[k].to_bits(), rm::dot16(&a, &bs[k]).to_bits(), "{isa:?} x4 n={n}");
                }
                // fma_acc_rows against the plain per-element loop.
                let e: Vec<f32> = (0..4).map(|_| next()).collect();
                let rows: Vec<&[f32]> = bs.iter().map(|b| &b[..]).collect();
                let mut o = a.clone();
                fma_acc_rows(isa, &mut o, &e, &rows);
                let mut want = a.clone();
                for (j, row) in rows.iter().enumerate() {
                    for d in 0..n {
                        want[d] = e[j].mul_add(row[d], want[d]);
                    }
                }
                assert_eq!(
                    o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} fma_acc_rows n={n}"
                );
                // Signed-zero products.
                let z: Vec<f32> = (0..n).map(|i| if i % 2 == 0 { -0.0 } else { 0.0 }).collect();
                let o = vec![1.0f32; n];
                assert_eq!(dot16(isa, &z, &o).to_bits(), rm::dot16(&z, &o).to_bits(), "{isa:?} zeros n={n}");
            }
        }
    }
}
