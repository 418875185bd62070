//! Checkpoint mode with AVX2 for the 32-element GGUF types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4).
//!
//! Per block and lane: the weight block's 32 quants as bytes (`0..=31` unsigned, or signed for Q8 and for
//! IQ4_NL, whose nibbles index the table `KVALUES_IQ4NL` by `pshufb`: values in −127..=113), their integer
//! dot with the activation block by `maddubs` + `madd` (no saturation: unsigned quants ≤ 31 give pairs
//! ≤ 2·31·127; the Q8 sign trick gives pairs ≤ 2·128·127 < 32767, activations being in −127..=127), the eight
//! lanes' partial vectors reduced at once ([`reduce8`]), the offset `8·Σqx` / `16·Σqx` subtracted in integers,
//! then the reference's float update on all lanes: `acc = fma(dw * dx, S, acc)` (and `acc = fma(mw * dx, Σqx,
//! acc)` for the `_1` types). `dw`/`mw` of the lanes' weight rows are gathered from the blocks and converted
//! exactly.
//!
//! MXFP4 goes the way of IQ4_NL: its nibbles index `KVALUES_MXFP4` (−12..=12) by `pshufb`, signed; its scale is
//! the E8M0 byte at the block's start, turned into the f32 bits of `e8m0_to_f32_half` by integer ops
//! ([`e8m0_half_lo`]).

use std::arch::x86_64::*;

use tf_core::DType;

use super::act::ActQ;
use super::avx2::{by_rows, f16_hi, f16_lo, lane_offsets, lanes, pattern_epi32, pattern_ps, reduce8, words, NextTile};
use super::QuantKernel;

/// A legacy block layout.
pub(super) trait Legacy {
    /// Bytes per block.
    const BYTES: usize;
    /// Whether the block has an offset `m` (f16 right after `d`, i.e. in the high half of the gathered word).
    const HAS_MIN: bool;
    /// `log2` of the value subtracted from every quant (8 → 3, 16 → 4); 0 for none.
    const OFFSET_LOG2: i32;
    /// Quants are signed bytes (Q8): use the sign trick.
    const SIGNED: bool;
    /// The scale is an E8M0 byte at byte 0 ([`e8m0_half_lo`]), not an f16.
    const E8M0: bool = false;
    /// The 32 quants of the block at `blk`, in element order.
    ///
    /// # Safety
    /// AVX2; `blk` points at a whole block.
    unsafe fn unpack(blk: *const u8) -> __m256i;
}

/// 16 bytes of nibbles → 32 bytes: elements 0..16 are the low nibbles, 16..32 the high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn nibbles(qs: *const u8) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), _mm_and_si128(q, m4))
}

/// 16 (0x10) in byte `i` where bit `i` of the little-endian u32 at `qh` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn high_bits(qh: *const u8) -> __m256i {
    let bits = (qh as *const u32).read_unaligned();
    // Byte i gets byte i / 8 of `bits`; OR-ing every bit but bit i % 8 makes it 0xff iff that bit is set.
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let set =
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)), _mm256_set1_epi8(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;
pub(super) struct Q8_1;
pub(super) struct IQ4NL;
pub(super) struct MXFP4;

/// `KVALUES_IQ4NL` in both 128-bit lanes, as a `pshufb` table.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn iq4nl_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(tf_quant::KVALUES_IQ4NL.as_ptr() as *const __m128i))
}

/// `KVALUES_MXFP4` in both 128-bit lanes, as a `pshufb` table.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn mxfp4_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(tf_quant::KVALUES_MXFP4.as_ptr() as *const __m128i))
}

/// `e8m0_to_f32_half` of the low byte `e` of each 32-bit lane: the bits `0x00200000 << e` for `e < 2`, else
/// `(e - 1) << 23`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn e8m0_half_lo(g: __m256i) -> __m256 {
    let e = _mm256_and_si256(g, _mm256_set1_epi32(0xff));
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let norm = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, small))
}

impl Legacy for Q4_0 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 3;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        nibbles(blk.add(2))
    }
}

impl Legacy for Q4_1 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        nibbles(blk.add(4))
    }
}

impl Legacy for Q5_0 {
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 4;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_or_si256(nibbles(blk.add(6)), high_bits(blk.add(2)))
    }
}

impl Legacy for Q5_1 {
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_or_si256(nibbles(blk.add(8)), high_bits(blk.add(4)))
    }
}

impl Legacy for Q8_0 {
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_loadu_si256(blk.add(2) as *const __m256i)
    }
}

/// Q8_1 weights: as Q8_0 (the stored `s` is not used).
impl Legacy for Q8_1 {
    const BYTES: usize = 36;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_loadu_si256(blk.add(4) as *const __m256i)
    }
}

/// IQ4_NL: the layout of Q4_0 (f16 `d`, then 16 bytes of nibbles), each nibble looked up in the table.
impl Legacy for IQ4NL {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_shuffle_epi8(iq4nl_table(), nibbles(blk.add(2)))
    }
}

/// MXFP4: the E8M0 scale byte, then 16 bytes of nibbles, each looked up in the doubled E2M1 table.
impl Legacy for MXFP4 {
    const BYTES: usize = 17;
    const HAS_MIN: bool = false;
    const OFFSET_LOG2: i32 = 0;
    const SIGNED: bool = true;
    const E8M0: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(blk: *const u8) -> __m256i {
        _mm256_shuffle_epi8(mxfp4_table(), nibbles(blk.add(1)))
    }
}

/// The AVX2 kernel of a legacy `dtype`, if there is one.
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::Q4_0 => entry::<Q4_0>,
        DType::Q4_1 => entry::<Q4_1>,
        DType::Q5_0 => entry::<Q5_0>,
        DType::Q5_1 => entry::<Q5_1>,
        DType::Q8_0 => entry::<Q8_0>,
        DType::Q8_1 => entry::<Q8_1>,
        DType::IQ4NL => entry::<IQ4NL>,
        DType::MXFP4 => entry::<MXFP4>,
        _ => return None,
    })
}

fn entry<T: Legacy>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(act.block == 32 && r0 + rt <= act.rows, "legacy tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "legacy tile: weight rows");
    // SAFETY: this kernel is only picked for `Isa::Avx2`, which `matmul` checks against the CPU; the asserts above
    // bound every pointer the kernel forms.
    unsafe { by_rows!(rt, tile::<T>(cols, act, r0)) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile<T: Legacy, const C: usize, const RT: usize>(cols: &[&[u8]; 8], act: &ActQ, r0: usize) -> [f32; 8] {
    let (k, rows) = (act.k, act.rows);
    let offsets = lane_offsets::<RT>(cols);
    // The same `C` weight rows (consecutive) of the next 8-row tile, by the first row group only: the other calls
    // of the row group fetch their own rows, and the later row groups find them in cache.
    let len = cols[0].len();
    let next = NextTile::span(
        cols[0].as_ptr().wrapping_add(8 * len),
        if r0 == 0 { C * len } else { 0 },
        act.nb,
        8 * len <= 16 << 10,
    );
    let ones = _mm256_set1_epi16(1);
    let shift = _mm_cvtsi32_si128(T::OFFSET_LOG2);
    // `[RT]` rows of `[k]` quantized activations.
    let xq: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k));
    let mut acc = _mm256_setzero_ps();
    for b in 0..act.nb {
        next.at(b);
        let mut p = [_mm256_setzero_si256(); 8];
        for c in 0..C {
            let blk = cols[c].as_ptr().add(b * T::BYTES);
            let wv = T::unpack(blk);
            let wa = if T::SIGNED { _mm256_sign_epi8(wv, wv) } else { wv };
            for r in 0..RT {
                let xv = _mm256_loadu_si256(xq[r].add(32 * b) as *const __m256i);
                let xv = if T::SIGNED { _mm256_sign_epi8(xv, wv) } else { xv };
                p[c * RT + r] = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xv), ones);
            }
        }
        let mut s = reduce8(&p);
        let at = b * rows + r0;
        let sx = pattern_epi32::<RT>(act.s_t.as_ptr().add(at));
        if T::OFFSET_LOG2 != 0 {
            s = _mm256_sub_epi32(s, _mm256_sll_epi32(sx, shift));
        }
        let g = words::<C>(cols, b * T::BYTES, offsets);
        let dx = pattern_ps::<RT>(act.d_t.as_ptr().add(at));
        let dw = if T::E8M0 { e8m0_half_lo(g) } else { f16_lo(g) };
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(s), acc);
        if T::HAS_MIN {
            acc = _mm256_fmadd_ps(_mm256_mul_ps(f16_hi(g), dx), _mm256_cvtepi32_ps(sx), acc);
        }
    }
    lanes(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// [`e8m0_half_lo`] has the bits of `tf_quant::e8m0_to_f32_half` for every byte, whatever the upper bytes.
    #[test]
    fn e8m0_conversion_matches_the_scalar_one_for_every_byte() {
        if Isa::detect() < Isa::Avx2 {
            return;
        }
        for e0 in (0..256u32).step_by(8) {
            // `[8]` words: byte `e0 + i` under arbitrary upper bytes.
            let words: [u32; 8] = std::array::from_fn(|i| (e0 + i as u32) | 0x9a5c_e300u32.rotate_left(i as u32) << 8);
            let mut got = [0f32; 8];
            // SAFETY: AVX2 checked above.
            unsafe {
                let v = e8m0_half_lo(_mm256_loadu_si256(words.as_ptr() as *const __m256i));
                _mm256_storeu_ps(got.as_mut_ptr(), v);
            }
            for (i, g) in got.iter().enumerate() {
                let want = tf_quant::e8m0_to_f32_half((e0 + i as u32) as u8);
                assert_eq!(g.to_bits(), want.to_bits(), "e = {}", e0 + i as u32);
            }
        }
    }
}
