//! AVX2 + FMA building blocks shared by the matmul kernels: activation quantization, the 8-lane integer
//! reduction, tile lane patterns, and gathered f16 scales.
//!
//! Tile lanes: a checkpoint tile of `C` weight rows × `RT` activation rows (`C · RT = 8`) keeps one f32 lane per
//! output, lane `c · RT + r`. Every lane runs the reference's float sequence on its own values; lanes never mix.

use std::arch::x86_64::*;

/// Quantizes one activation block like `reference::matmul::quantize_block`, bit for bit. `x.len() == q.len()`,
/// a multiple of 32.
///
/// `amax`: lane-wise `max_ps(|x|, m)` (which keeps `m` when `|x|` is NaN, like the reference's `>` test), then a
/// max over lanes (exact, order-free). Rounding half away from zero: `t = trunc(p)`, `t + copysign(1, p)` when
/// `|p - t| >= 0.5` (`p - t` is exact); then the clamp to ±127 and NaN → 0.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    assert!(x.len() == q.len() && x.len().is_multiple_of(32), "quantize_block: lengths");
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(c.as_ptr()), abs_mask), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    for (x, q) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
        let p = x.as_ptr();
        let a = round_q(_mm256_loadu_ps(p), idv);
        let b = round_q(_mm256_loadu_ps(p.add(8)), idv);
        let c = round_q(_mm256_loadu_ps(p.add(16)), idv);
        let e = round_q(_mm256_loadu_ps(p.add(24)), idv);
        // packs interleave 128-bit halves: [a0-3 b0-3 c0-3 e0-3 | a4-7 b4-7 c4-7 e4-7]; the permute restores order.
        let v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
        let v = _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, v);
    }
    d
}

/// `clamp(round_half_away(v * id), -127, 127)` with NaN → 0, as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn round_q(v: __m256, idv: __m256) -> __m256i {
    let sign = _mm256_set1_ps(-0.0);
    let p = _mm256_mul_ps(v, idv);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
    let away = _mm256_or_ps(_mm256_set1_ps(1.0), _mm256_and_ps(p, sign));
    let step = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)), away);
    let r = _mm256_add_ps(t, step);
    let r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0)), _mm256_set1_ps(127.0));
    // NaN products (and only they) become 0; the max/min above turned them into -127.
    let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
    _mm256_cvtps_epi32(r)
}

/// Eight i32x8 partial sums to one i32x8 whose lane `i` is the sum of `p[i]`'s lanes (exact, wrapping never
/// happens for our ranges).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn reduce8(p: &[__m256i; 8]) -> __m256i {
    // hadd(a, b) per 128-bit half: [a0+a1, a2+a3, b0+b1, b2+b3].
    let h01 = _mm256_hadd_epi32(p[0], p[1]);
    let h23 = _mm256_hadd_epi32(p[2], p[3]);
    let h45 = _mm256_hadd_epi32(p[4], p[5]);
    let h67 = _mm256_hadd_epi32(p[6], p[7]);
    // [p0..p3 low-half sums | p0..p3 high-half sums], and the same for p4..p7.
    let a = _mm256_hadd_epi32(h01, h23);
    let b = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256::<0x20>(a, b);
    let hi = _mm256_permute2x128_si256::<0x31>(a, b);
    _mm256_add_epi32(lo, hi)
}

/// Lanes `c · RT + r` ← `v[r]` for `r < RT` (`v` points at `RT` consecutive values: rows `r0..r0 + RT` of one
/// block in the transposed `[nb][rows]` tables).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pattern_ps<const RT: usize>(v: *const f32) -> __m256 {
    match RT {
        1 => _mm256_set1_ps(*v),
        2 => _mm256_castpd_ps(_mm256_set1_pd((v as *const f64).read_unaligned())),
        4 => {
            let h = _mm_loadu_ps(v);
            _mm256_set_m128(h, h)
        }
        _ => _mm256_loadu_ps(v),
    }
}

/// [`pattern_ps`] for i32 values.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pattern_epi32<const RT: usize>(v: *const i32) -> __m256i {
    _mm256_castps_si256(pattern_ps::<RT>(v as *const f32))
}

/// Byte offsets of each lane's weight row from the tile's first row: lane `c · RT + r` → `cols[c] - cols[0]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lane_offsets<const RT: usize>(cols: &[&[u8]; 8]) -> __m256i {
    let base = cols[0].as_ptr() as isize;
    let off: [i32; 8] = std::array::from_fn(|lane| {
        i32::try_from(cols[lane / RT].as_ptr() as isize - base).expect("weight tile spans less than 2 GiB")
    });
    _mm256_loadu_si256(off.as_ptr() as *const __m256i)
}

/// The 32-bit words at `base + offsets[lane]` (unaligned).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gather32(base: *const u8, offsets: __m256i) -> __m256i {
    _mm256_i32gather_epi32::<1>(base as *const i32, offsets)
}

/// Lane `c · RT + r` ← the 32-bit word at byte `at` of weight row `c` (`offsets` from [`lane_offsets`]): plain
/// broadcasts for one or two rows, a gather otherwise.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn words<const C: usize>(cols: &[&[u8]; 8], at: usize, offsets: __m256i) -> __m256i {
    let word = |c: usize| (cols[c].as_ptr().add(at) as *const i32).read_unaligned();
    match C {
        1 => _mm256_set1_epi32(word(0)),
        2 => _mm256_set_m128i(_mm_set1_epi32(word(1)), _mm_set1_epi32(word(0))),
        _ => gather32(cols[0].as_ptr().add(at), offsets),
    }
}

/// The f16 in the low 16 bits of each lane, converted exactly (as `tf_quant::f16_bits_to_f32` for every
/// non-NaN value; NaNs stay NaNs with their payload). Normal and subnormal values: the magnitude bits moved to
/// f32 position and scaled by 2^112 (exact); Inf/NaN: exponent set to all ones.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn f16_lo(h: __m256i) -> __m256 {
    let em = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
    let sign = _mm256_slli_epi32::<16>(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)));
    let mag = _mm256_slli_epi32::<13>(em);
    let finite =
        _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(f32::from_bits(239 << 23))));
    let inf_nan = _mm256_or_si256(mag, _mm256_set1_epi32(0x7f80_0000));
    let is_inf_nan = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7bff));
    _mm256_castsi256_ps(_mm256_or_si256(_mm256_blendv_epi8(finite, inf_nan, is_inf_nan), sign))
}

/// The f16 in the high 16 bits of each lane, converted as [`f16_lo`].
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn f16_hi(h: __m256i) -> __m256 {
    f16_lo(_mm256_srli_epi32::<16>(h))
}

/// The eight lanes as an array.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn lanes(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}

/// Prefetches (a span of) the tile after the current one (weight rows are contiguous) line by line in
/// address order, a share of it per block iteration, so the next tile streams in while this one is computed.
/// A prefetch is never dereferenced and changes no value; addresses past the weight's end are harmless.
pub(super) struct NextTile {
    /// The next tile's first byte.
    base: *const u8,
    /// Its 64-byte lines.
    lines: usize,
    /// Block iterations of the current tile.
    nb: usize,
    /// Into L1 when the tile fits comfortably there, else into L2.
    l1: bool,
}

impl NextTile {
    /// `bytes` from `base`, into L1 when `l1`, else into L2.
    pub(super) fn span(base: *const u8, bytes: usize, nb: usize, l1: bool) -> NextTile {
        NextTile { base, lines: bytes.div_ceil(64), nb: nb.max(1), l1 }
    }

    /// The share of block iteration `b`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn at(&self, b: usize) {
        for l in b * self.lines / self.nb..(b + 1) * self.lines / self.nb {
            let p = self.base.wrapping_add(64 * l) as *const i8;
            if self.l1 {
                _mm_prefetch::<_MM_HINT_T0>(p);
            } else {
                _mm_prefetch::<_MM_HINT_T1>(p);
            }
        }
    }
}

/// Dispatches a tile kernel generic over `<.., C, RT>` on the row-group size `rt` (8, 4, 2 or 1).
macro_rules! by_rows {
    ($rt:expr, $f:ident :: <$($t:ty),*> ($($arg:expr),*)) => {
        match $rt {
            8 => $f::<$($t,)* 1, 8>($($arg),*),
            4 => $f::<$($t,)* 2, 4>($($arg),*),
            2 => $f::<$($t,)* 4, 2>($($arg),*),
            _ => $f::<$($t,)* 8, 1>($($arg),*),
        }
    };
}
pub(super) use by_rows;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_matches_tf_quant_for_every_value() {
        if crate::isa::Isa::detect() < crate::isa::Isa::Avx2 {
            return;
        }
        for start in (0..=u16::MAX as u32).step_by(8) {
            let h: [i32; 8] = std::array::from_fn(|i| ((start + i as u32) | 0x5a5a_0000) as i32);
            // SAFETY: AVX2 checked above.
            let (lo, hi) = unsafe {
                let v = _mm256_loadu_si256(h.as_ptr() as *const __m256i);
                let swapped = _mm256_or_si256(_mm256_slli_epi32::<16>(v), _mm256_set1_epi32(0x1234));
                (lanes(f16_lo(v)), lanes(f16_hi(swapped)))
            };
            for i in 0..8 {
                let want = tf_quant::f16_bits_to_f32((start + i as u32) as u16);
                if want.is_nan() {
                    assert!(lo[i].is_nan() && hi[i].is_nan());
                } else {
                    assert_eq!(lo[i].to_bits(), want.to_bits(), "{:#06x}", start + i as u32);
                    assert_eq!(hi[i].to_bits(), want.to_bits(), "{:#06x}", start + i as u32);
                }
            }
        }
    }

    #[test]
    fn reduce8_sums_each_vector() {
        if crate::isa::Isa::detect() < crate::isa::Isa::Avx2 {
            return;
        }
        let vals: [[i32; 8]; 8] = std::array::from_fn(|v| std::array::from_fn(|l| (v * 100 + l * l) as i32 - 300));
        // SAFETY: AVX2 checked above.
        let got = unsafe {
            let p: [__m256i; 8] = std::array::from_fn(|v| _mm256_loadu_si256(vals[v].as_ptr() as *const __m256i));
            let mut out = [0i32; 8];
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, reduce8(&p));
            out
        };
        let want: [i32; 8] = std::array::from_fn(|v| vals[v].iter().sum());
        assert_eq!(got, want);
    }
}
