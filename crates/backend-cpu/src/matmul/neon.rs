//! NEON (aarch64 Advanced SIMD) building blocks shared by the checkpoint matmul kernels: activation
//! quantization, the exact int8 dot product, the 8-lane integer reduction, tile lane patterns, and the f16 scales
//! of the tile's weight rows.
//!
//! Tile lanes, as in the AVX2 kernels: a checkpoint tile of `C` weight rows × `RT` activation rows (`C · RT = 8`)
//! keeps one f32 lane per output, lane `c · RT + r`, held in two registers (lanes 0..4 and 4..8). Every lane runs
//! the reference's float sequence on its own values; lanes never mix.
//!
//! Integer dot products use only baseline ARMv8.0 instructions: `smull`/`smlal2` (i8 × i8 → i16, two products
//! per i16 lane, each |product| ≤ 128·127, so a lane stays ≤ 32512 and never wraps) then `sadalp` (pairwise add
//! into i32). FEAT_DotProd's `sdot` would be faster on cores that have it, but its intrinsics are not stable in
//! Rust and it would need a second detected level; every integer sum is exact either way, so it can come later
//! without changing a bit.

use std::arch::aarch64::*;

/// Quantizes one activation block like `reference::matmul::quantize_block`, bit for bit. `x.len() == q.len()`,
/// a multiple of 16.
///
/// `amax`: per lane `m = |x| > m ? |x| : m` (a compare and select, so NaNs are skipped exactly as the
/// reference's `>` test skips them), then a max over the lanes (exact, order-free: no NaN is left). Then
/// `d = amax / 127` and `id` in scalar as the reference; `q = clamp(fcvtas(x * id), -127, 127)`: `fcvtas` rounds
/// half away from zero (`f32::round`), gives 0 for NaN and saturates ±inf, as `as i8` does before the clamp.
///
/// # Safety
/// NEON.
#[target_feature(enable = "neon")]
pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    assert!(x.len() == q.len() && x.len().is_multiple_of(16), "quantize_block: lengths");
    let mut m = vdupq_n_f32(0.0);
    for c in x.chunks_exact(4) {
        let a = vabsq_f32(vld1q_f32(c.as_ptr()));
        m = vbslq_f32(vcgtq_f32(a, m), a, m);
    }
    let amax = vmaxvq_f32(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (idv, lo, hi) = (vdupq_n_f32(id), vdupq_n_s32(-127), vdupq_n_s32(127));
    for (x, q) in x.chunks_exact(16).zip(q.chunks_exact_mut(16)) {
        // `[4]` i32x4 of 4 values each, clamped, then narrowed to i16 and i8 (exact: all in -127..=127).
        let v: [int32x4_t; 4] = std::array::from_fn(|i| {
            let r = vcvtaq_s32_f32(vmulq_f32(vld1q_f32(x.as_ptr().add(4 * i)), idv));
            vminq_s32(vmaxq_s32(r, lo), hi)
        });
        let h0 = vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]));
        let h1 = vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]));
        vst1q_s8(q.as_mut_ptr(), vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
    }
    d
}

/// `acc + Σ w[i]·x[i]` over 16 signed bytes, spread over the four i32 lanes (exact).
///
/// # Safety
/// NEON (baseline on aarch64).
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot_acc(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    vpadalq_s16(acc, vmlal_high_s8(p, w, x))
}

/// Σ w[i]·x[i] over 16 signed bytes, as four i32 partial sums (exact).
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn dot16_i8(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    vpaddlq_s16(vmlal_high_s8(p, w, x))
}

/// Eight i32x4 partial sums to two i32x4 (lanes 0..4, 4..8) whose lane `i` is the sum of `p[i]`'s lanes (exact).
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn reduce8(p: &[int32x4_t; 8]) -> [int32x4_t; 2] {
    // vpaddq(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3].
    let lo = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
    let hi = vpaddq_s32(vpaddq_s32(p[4], p[5]), vpaddq_s32(p[6], p[7]));
    [lo, hi]
}

/// Lanes `c · RT + r` ← `v[r]` for `r < RT` (`v` points at `RT` consecutive values: rows `r0..r0 + RT` of one
/// block in the transposed `[nb][rows]` tables of `ActQ`).
///
/// # Safety
/// NEON; `v` valid for `RT` reads.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn pattern<T: Copy, const RT: usize>(v: *const T) -> [T; 8] {
    std::array::from_fn(|lane| *v.add(lane % RT))
}

/// [`pattern`] of f32 values as two registers.
///
/// # Safety
/// As [`pattern`].
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn pattern_f32<const RT: usize>(v: *const f32) -> [float32x4_t; 2] {
    let a = pattern::<f32, RT>(v);
    [vld1q_f32(a.as_ptr()), vld1q_f32(a.as_ptr().add(4))]
}

/// [`pattern`] of i32 values as two registers.
///
/// # Safety
/// As [`pattern`].
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn pattern_i32<const RT: usize>(v: *const i32) -> [int32x4_t; 2] {
    let a = pattern::<i32, RT>(v);
    [vld1q_s32(a.as_ptr()), vld1q_s32(a.as_ptr().add(4))]
}

/// Lane `c · RT + r` ← the f16 at byte `at` of weight row `c`, converted exactly ([`f16x4`]).
///
/// # Safety
/// NEON; `cols[c][at..at + 2]` in bounds for `c < C` (the callers assert the row lengths).
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn f16_lanes<const C: usize, const RT: usize>(cols: &[&[u8]; 8], at: usize) -> [float32x4_t; 2] {
    let h: [u16; C] = std::array::from_fn(|c| (cols[c].as_ptr().add(at) as *const u16).read_unaligned());
    let lanes: [u32; 8] = std::array::from_fn(|lane| h[lane / RT] as u32);
    [f16x4(vld1q_u32(lanes.as_ptr())), f16x4(vld1q_u32(lanes.as_ptr().add(4)))]
}

/// Lane `c · RT + r` ← the f32 at byte `at` of weight row `c` (Q8_K's scale).
///
/// # Safety
/// NEON; `cols[c][at..at + 4]` in bounds for `c < C`.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn f32_lanes<const C: usize, const RT: usize>(cols: &[&[u8]; 8], at: usize) -> [float32x4_t; 2] {
    let v: [f32; C] = std::array::from_fn(|c| (cols[c].as_ptr().add(at) as *const f32).read_unaligned());
    let lanes: [f32; 8] = std::array::from_fn(|lane| v[lane / RT]);
    [vld1q_f32(lanes.as_ptr()), vld1q_f32(lanes.as_ptr().add(4))]
}

/// The f16 in the low 16 bits of each lane, converted exactly (as `tf_quant::f16_bits_to_f32` for every
/// non-NaN value; NaNs stay NaNs with their payload). Normal and subnormal values: the magnitude bits moved to
/// f32 position and scaled by 2^112 (exact: the product is a normal f32; aarch64 Linux runs with flush-to-zero
/// off); Inf/NaN: exponent set to all ones. The same steps as the AVX2 `f16_lo`.
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn f16x4(h: uint32x4_t) -> float32x4_t {
    let em = vandq_u32(h, vdupq_n_u32(0x7fff));
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let mag = vshlq_n_u32::<13>(em);
    let finite = vreinterpretq_u32_f32(vmulq_f32(vreinterpretq_f32_u32(mag), vdupq_n_f32(f32::from_bits(239 << 23))));
    let inf_nan = vorrq_u32(mag, vdupq_n_u32(0x7f80_0000));
    let is_inf_nan = vcgtq_u32(em, vdupq_n_u32(0x7bff));
    vreinterpretq_f32_u32(vorrq_u32(vbslq_u32(is_inf_nan, inf_nan, finite), sign))
}

/// `a * b` on both halves (rounded products).
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn mul(a: [float32x4_t; 2], b: [float32x4_t; 2]) -> [float32x4_t; 2] {
    [vmulq_f32(a[0], b[0]), vmulq_f32(a[1], b[1])]
}

/// The reference's per-block update on all eight lanes: `acc = fma(p, s, acc)` with `p` a rounded product such
/// as `dw * dx` and `s` the exact integer sum converted with round-to-nearest-even (as `as f32`).
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn update(acc: [float32x4_t; 2], p: [float32x4_t; 2], s: [int32x4_t; 2]) -> [float32x4_t; 2] {
    [vfmaq_f32(acc[0], p[0], vcvtq_f32_s32(s[0])), vfmaq_f32(acc[1], p[1], vcvtq_f32_s32(s[1]))]
}

/// The eight lanes as an array.
///
/// # Safety
/// NEON.
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn lanes(v: [float32x4_t; 2]) -> [f32; 8] {
    let mut out = [0f32; 8];
    vst1q_f32(out.as_mut_ptr(), v[0]);
    vst1q_f32(out.as_mut_ptr().add(4), v[1]);
    out
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
        for start in (0..=u16::MAX as u32).step_by(4) {
            // High halves set to junk: only the low 16 bits count.
            let h: [u32; 4] = std::array::from_fn(|i| (start + i as u32) | 0x5a5a_0000);
            // SAFETY: NEON is baseline on aarch64.
            let got = unsafe {
                let mut out = [0f32; 4];
                vst1q_f32(out.as_mut_ptr(), f16x4(vld1q_u32(h.as_ptr())));
                out
            };
            for (i, g) in got.iter().enumerate() {
                let want = tf_quant::f16_bits_to_f32((start + i as u32) as u16);
                if want.is_nan() {
                    assert!(g.is_nan(), "{:#06x}", start + i as u32);
                } else {
                    assert_eq!(g.to_bits(), want.to_bits(), "{:#06x}", start + i as u32);
                }
            }
        }
    }

    #[test]
    fn integer_dots_and_reduce8_are_exact_at_the_extremes() {
        // Extreme values: -128 × -127 products, two per i16 lane, must not wrap.
        let ws: [[i8; 16]; 3] = [[-128; 16], [127; 16], std::array::from_fn(|i| (i as i8) * 17 - 100)];
        let xs: [[i8; 16]; 3] = [[-127; 16], [127; 16], std::array::from_fn(|i| 120 - (i as i8) * 15)];
        for w in &ws {
            for x in &xs {
                let want: i32 = w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
                // SAFETY: NEON is baseline on aarch64.
                let (a, b) = unsafe {
                    let (wv, xv) = (vld1q_s8(w.as_ptr()), vld1q_s8(x.as_ptr()));
                    (vaddvq_s32(dot_acc(vdupq_n_s32(5), wv, xv)), vaddvq_s32(dot16_i8(wv, xv)))
                };
                assert_eq!((a, b), (want + 20, want));
            }
        }
        let vals: [[i32; 4]; 8] = std::array::from_fn(|v| std::array::from_fn(|l| (v * 100 + l * l) as i32 - 300));
        // SAFETY: NEON is baseline on aarch64.
        let got = unsafe {
            let p: [int32x4_t; 8] = std::array::from_fn(|v| vld1q_s32(vals[v].as_ptr()));
            let [lo, hi] = reduce8(&p);
            let mut out = [0i32; 8];
            vst1q_s32(out.as_mut_ptr(), lo);
            vst1q_s32(out.as_mut_ptr().add(4), hi);
            out
        };
        let want: [i32; 8] = std::array::from_fn(|v| vals[v].iter().sum());
        assert_eq!(got, want);
    }
}
