//! Full mode's weight-row dequantization with AVX2, bit-equal to `tf_quant::dequantize` (gguf-py's formulas):
//! the same f32 operations, lane-wise, never fused. Scales and mins per (sub-)block are converted and
//! multiplied in scalar code exactly as `tf_quant` does; the per-element products and sums are vector ops with
//! the same single roundings (`x = d * q`, `x = d * q + m`, `x = ds * q - dm`). IQ4_NL / IQ4_XS look their
//! nibbles up in `KVALUES_IQ4NL` (`pshufb`) and scale them like `Q4_0` (`x = d * kv[q]`, `x = dl * kv[q]`);
//! MXFP4 likewise in `KVALUES_MXFP4`, with `d = e8m0_to_f32_half(e)`.

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{e8m0_to_f32_half, f16_bits_to_f32, iq4xs_scales, q4k_scale_min, KVALUES_IQ4NL, KVALUES_MXFP4};

/// Dequantizes one weight row (`bytes`: whole blocks of `dtype`) into `out` when this module has a kernel for
/// `dtype`; returns `false` (and writes nothing) otherwise.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
pub(super) unsafe fn dequant_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> bool {
    let (bs, bb) = (dtype.block_size(), dtype.block_bytes());
    if !matches!(
        dtype,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::IQ4NL
            | DType::IQ4XS
            | DType::MXFP4
    ) {
        return false;
    }
    assert!(bytes.len().is_multiple_of(bb) && bytes.len() / bb * bs == out.len(), "dequant_row: lengths");
    for (blk, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bs)) {
        let (p, o) = (blk.as_ptr(), o.as_mut_ptr());
        match dtype {
            DType::Q4_0 => legacy::<false>(f16(p, 0), 0.0, nibbles(p.add(2)), -8, o),
            DType::Q4_1 => legacy::<true>(f16(p, 0), f16(p, 2), nibbles(p.add(4)), 0, o),
            DType::Q5_0 => legacy::<false>(f16(p, 0), 0.0, or(nibbles(p.add(6)), high_bits(p.add(2))), -16, o),
            DType::Q5_1 => legacy::<true>(f16(p, 0), f16(p, 2), or(nibbles(p.add(8)), high_bits(p.add(4))), 0, o),
            DType::Q8_0 => legacy::<false>(f16(p, 0), 0.0, _mm256_loadu_si256(p.add(2) as *const __m256i), 0, o),
            DType::Q4K => q45k::<false>(p, o),
            DType::Q5K => q45k::<true>(p, o),
            DType::Q6K => q6k(p, o),
            DType::IQ4NL => legacy::<false>(f16(p, 0), 0.0, iq4(p.add(2)), 0, o),
            DType::IQ4XS => {
                let (d, sc) = (f16(p, 0), iq4xs_scales([*p.add(2), *p.add(3)], &*(p.add(4) as *const [u8; 4])));
                for (j, &sc) in sc.iter().enumerate() {
                    legacy::<false>(d * sc as f32, 0.0, iq4(p.add(8 + 16 * j)), 0, o.add(32 * j));
                }
            }
            DType::MXFP4 => legacy::<false>(e8m0_to_f32_half(*p), 0.0, table4(&KVALUES_MXFP4, p.add(1)), 0, o),
            _ => unreachable!(),
        }
    }
    true
}

/// The f16 at `p + at`, converted exactly.
#[inline(always)]
unsafe fn f16(p: *const u8, at: usize) -> f32 {
    f16_bits_to_f32((p.add(at) as *const u16).read_unaligned())
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
    _mm256_or_si256(a, b)
}

/// 16 bytes of nibbles → 32 bytes: elements 0..16 are the low nibbles, 16..32 the high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), _mm_and_si128(q, m4))
}

/// 16 bytes of IQ4 indices → the 32 table values `KVALUES_IQ4NL[q]`, in element order (as [`nibbles`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn iq4(qs: *const u8) -> __m256i {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    _mm256_shuffle_epi8(table, nibbles(qs))
}

/// 16 bytes of 4-bit codes → the 32 values `table[q]`, in element order (as [`nibbles`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn table4(table: &[i8; 16], qs: *const u8) -> __m256i {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    _mm256_shuffle_epi8(table, nibbles(qs))
}

/// 16 in byte `i` where bit `i` of the little-endian u32 at `qh` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn high_bits(qh: *const u8) -> __m256i {
    let bits = (qh as *const u32).read_unaligned();
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let set =
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Byte lanes `8 g .. 8 g + 8` of `q` (signed) as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group(q: __m256i, g: usize) -> __m256 {
    let half = if g < 2 { _mm256_castsi256_si128(q) } else { _mm256_extracti128_si256::<1>(q) };
    let eight = if g.is_multiple_of(2) { half } else { _mm_srli_si128::<8>(half) };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight))
}

/// 32 elements `x = d * f32(q + off)`, then `+ m` when `MIN` (two roundings, as gguf-py).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn legacy<const MIN: bool>(d: f32, m: f32, q: __m256i, off: i8, o: *mut f32) {
    let q = _mm256_add_epi8(q, _mm256_set1_epi8(off));
    let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
    for g in 0..4 {
        let x = _mm256_mul_ps(dv, group(q, g));
        let x = if MIN { _mm256_add_ps(x, mv) } else { x };
        _mm256_storeu_ps(o.add(8 * g), x);
    }
}

/// 32 elements `x = ds * f32(q) - dm` (unsigned `q`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sub_block(ds: f32, dm: f32, q: __m256i, o: *mut f32) {
    let (dv, mv) = (_mm256_set1_ps(ds), _mm256_set1_ps(dm));
    for g in 0..4 {
        _mm256_storeu_ps(o.add(8 * g), _mm256_sub_ps(_mm256_mul_ps(dv, group(q, g)), mv));
    }
}

/// Q4_K (`QH = false`) / Q5_K: sub-block `j = 2 c + n` is `qs[32 c + l] >> 4 n` (+ bit `j` of `qh[l]` << 4).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q45k<const QH: bool>(p: *const u8, o: *mut f32) {
    let (d, dmin) = (f16(p, 0), f16(p, 2));
    let (sc, mn) = q4k_scale_min(&*(p.add(4) as *const [u8; 12]));
    let qs_at = if QH { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let qh = if QH { _mm256_loadu_si256(p.add(16) as *const __m256i) } else { _mm256_setzero_si256() };
    for c in 0..4 {
        let q = _mm256_loadu_si256(p.add(qs_at + 32 * c) as *const __m256i);
        for n in 0..2 {
            let j = 2 * c + n;
            let mut v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * n as i32)), m4);
            if QH {
                let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
                v = _mm256_or_si256(v, _mm256_slli_epi16::<4>(bit));
            }
            sub_block(d * sc[j] as f32, dmin * mn[j] as f32, v, o.add(32 * j));
        }
    }
}

/// Q6_K: element `128 h + 32 t + l` from `ql[64 h + 32 (t % 2) + l] >> 4 (t / 2)` and `qh[32 h + l] >> 2 t`;
/// 16-element sub-block `j` scaled by `ds = d * f32(scales[j])`: `x = ds * f32(q - 32)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6k(p: *const u8, o: *mut f32) {
    let d = f16(p, 208);
    let scales = p.add(192) as *const i8;
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    for h in 0..2 {
        let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
        for t in 0..4 {
            let ql = _mm256_loadu_si256(p.add(64 * h + 32 * (t % 2)) as *const __m256i);
            let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2) as i32)), m4);
            let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)), m2);
            let q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16::<4>(high)), _mm256_set1_epi8(32));
            let e = 128 * h + 32 * t;
            for g in 0..4 {
                let ds = d * *scales.add((e + 8 * g) / 16) as f32;
                _mm256_storeu_ps(o.add(e + 8 * g), _mm256_mul_ps(_mm256_set1_ps(ds), group(q, g)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn equals_tf_quant_dequantize() {
        if crate::isa::Isa::detect() < crate::isa::Isa::Avx2 {
            return;
        }
        let seed: u64 = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
            DType::IQ4NL,
            DType::IQ4XS,
            DType::MXFP4,
        ] {
            for _ in 0..50 {
                let blocks = rng.gen_range(1..5);
                // Fully random bytes: any f16 scale, Inf and NaN included (any E8M0 byte for MXFP4).
                let mut bytes = vec![0u8; blocks * dtype.block_bytes()];
                rng.fill(&mut bytes[..]);
                let n = blocks * dtype.block_size();
                let want = tf_quant::dequantize_to_vec(dtype, &bytes, n).unwrap();
                let mut got = vec![0f32; n];
                // SAFETY: AVX2 checked above.
                assert!(unsafe { dequant_row(dtype, &bytes, &mut got) });
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "{dtype} element {i}: {g} vs {w} (TF_SEED={seed})"
                    );
                }
            }
        }
    }
}
