//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for the grid i-quants IQ2_XS, IQ2_S and IQ1_S: the [`GridQuant`]
//! layouts of these types on the kernels of `avx512_iquant` (decode into unsigned bytes `u = OFF + v` per element
//! value `v`, exact integer sums by `vpdpbusd`, the offset off through the bsums; see there).
//!
//! - IQ2_XS (16 sub-blocks of 16; `v = ±g`, `g` in 8, 25, 43, 8 per entry of the 512-entry grid): the grid as
//!   2-bit codes (as IQ2_XXS), looked up by `vpermt2w` over 32 indices (`qs[g] & 511`, [`codes`]); the signs
//!   `KSIGNS_IQ2XS[qs[g] >> 9]` formed in vectors ([`ksigns`]); `OFF = 44`, `u` in `1..=87`: chunk kernel only
//!   (`avx512_iquant_rows` below 8 activation rows), with 16 multipliers `1 + 2 sc_j`.
//! - IQ2_S (as IQ2_XS with a 10-bit index, `qs[g] | ((qh[g / 4] >> 2 (g % 4)) & 3) << 8`, and one stored sign bit
//!   per element): codes of the 1024-entry grid by `vpermt2w` and blends on index bits 6..9; the 256 sign bits are
//!   the four u64 at `signs`.
//! - IQ1_S (8 sub-blocks of 32; `v = 8 g ± 1`, `g` in −1, 0, 1 from the 2048-entry grid, the sign of the delta per
//!   sub-block): the grid bytes gathered as u64 (`vpgatherdq`, 8 entries per gather: a code table of 2048 entries
//!   would take 32 `vpermt2w` per 32 indices), `u = 8 (g + 1) + 1 ± 1`, `OFF = 9`, `u` in `0..=18`, multipliers
//!   `1 + 2 sc_j` (≤ 15): chunk kernel only (`avx512_iquant_rows` below 8 activation rows).
//!
//! All three scale `S` by `(dw * dx) * 0.125` as the reference.

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID};

use super::avx512_iquant::{
    chunk, codes, crumb_codes, crumbs_to_bytes, ksigns, lane_ids, offset_signed, Codes, GridQuant, XXS2_VALUES,
};
use super::ChunkKernel;

/// The AVX-512 chunk kernel of IQ2_XS, IQ2_S or IQ1_S: `avx512_iquant`'s from 8 activation rows,
/// `avx512_iquant_rows`'s below.
pub(super) fn chunk_kernel(dtype: DType) -> Option<ChunkKernel> {
    Some(match dtype {
        DType::IQ2XS => chunk::<IQ2XS>,
        DType::IQ2S => chunk::<IQ2S>,
        DType::IQ1S => chunk::<IQ1S>,
        _ => return None,
    })
}

struct IQ2XS;
struct IQ2S;
struct IQ1S;

/// `IQ2XS_GRID` as 2-bit codes.
static CODES_2XS: Codes<512> = crumb_codes(&IQ2XS_GRID);

/// `IQ2S_GRID` as 2-bit codes.
static CODES_2S: Codes<1024> = crumb_codes(&IQ2S_GRID);

/// The 16 multipliers `1 + 2 sc_j` (i16 lanes) of the 4-bit scales at `p` (8 bytes, sub-block `j`'s scale
/// `(p[j / 2] >> 4 (j % 2)) & 15`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn scales16(p: *const u8) -> __m256i {
    // u32 lane `i`: byte `i`; then its low nibble in the low u16, its high nibble in the high u16.
    let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let sc =
        _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(15)), _mm256_slli_epi32::<16>(_mm256_srli_epi32::<4>(b)));
    _mm256_add_epi16(_mm256_add_epi16(sc, sc), _mm256_set1_epi16(1))
}

/// The four registers of `u = 44 ± g` from the 2-bit codes of a block's 32 entries (u16 lanes) and the sign masks
/// of its four 64-element parts.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn signed_crumbs(codes: __m512i, neg: [u64; 4]) -> [__m512i; 4] {
    let off = _mm512_set1_epi8(IQ2XS::OFF as i8);
    let values = _mm512_broadcast_i32x4(_mm_loadu_si128(XXS2_VALUES.as_ptr() as *const __m128i));
    std::array::from_fn(|c| offset_signed(_mm512_shuffle_epi8(values, crumbs_to_bytes(codes, c)), neg[c], off))
}

impl GridQuant for IQ2XS {
    const BYTES: usize = 74;
    const SUBS: usize = 16;
    const OFF: i16 = 44;
    const DDX_MUL: f32 = 0.125;
    const TILE: bool = false;
    /// Layout: `d` (f16), `qs[32]` (u16) at 2: group `g`'s grid index `qs[g] & 511`, its signs
    /// `KSIGNS_IQ2XS[qs[g] >> 9]`; `scales[8]` at 66 (sub-block `j` of 16: nibble `(scales[j / 2] >> 4 (j % 2)) & 15`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        // `[32]` u16 words, one per group of 8 elements.
        let q = _mm512_loadu_si512(blk.add(2) as *const __m512i);
        let codes = codes(&CODES_2XS, _mm512_and_si512(q, _mm512_set1_epi16(511)));
        // Sign fields of groups 16 h..16 h + 16 as i32 lanes, their sign bytes, 8 groups (64 elements) per mask.
        let f = _mm512_srli_epi16::<9>(q);
        let half = |h: usize| {
            let f = if h == 0 { _mm512_castsi512_si256(f) } else { _mm512_extracti64x4_epi64::<1>(f) };
            _mm512_cvtepi32_epi8(ksigns(_mm512_cvtepu16_epi32(f)))
        };
        let (s0, s1) = (half(0), half(1));
        let neg = [
            _mm_cvtsi128_si64(s0) as u64,
            _mm_extract_epi64::<1>(s0) as u64,
            _mm_cvtsi128_si64(s1) as u64,
            _mm_extract_epi64::<1>(s1) as u64,
        ];
        (signed_crumbs(codes, neg), scales16(blk.add(66)))
    }
}

impl GridQuant for IQ2S {
    const BYTES: usize = 82;
    const SUBS: usize = 16;
    const OFF: i16 = 44;
    const DDX_MUL: f32 = 0.125;
    const TILE: bool = false;
    /// Layout: `d` (f16), `qs[32]` at 2, `signs[32]` at 34 (element `e`'s sign bit `e % 8` of `signs[e / 8]`),
    /// `qh[8]` at 66 (group `g`'s index `qs[g] | ((qh[g / 4] >> 2 (g % 4)) & 3) << 8`), `scales[8]` at 74 (as
    /// IQ2_XS).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        let signs = blk.add(34);
        let neg = std::array::from_fn(|c| (signs.add(8 * c) as *const u64).read_unaligned());
        (signed_crumbs(codes(&CODES_2S, iq2s_indices(blk)), neg), scales16(blk.add(74)))
    }
}

/// The 32 grid indices of the IQ2_S block at `blk` as u16 lanes: `qs[g] | ((qh[g / 4] >> 2 (g % 4)) & 3) << 8`
/// (`qs` at byte 2, `qh` at 66).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn iq2s_indices(blk: *const u8) -> __m512i {
    let (qs, qh) = (blk.add(2), blk.add(66));
    // u16 lane `g`: `qh[g / 4]`, shifted right by `2 (g % 4)`, its low two bits as index bits 8 and 9.
    let ids = _mm512_cvtepu8_epi16(_mm256_loadu_si256(GROUP_IDS.as_ptr() as *const __m256i));
    let h = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(qh as *const __m128i)));
    let h = _mm512_permutexvar_epi16(_mm512_srli_epi16::<2>(ids), h);
    let h = _mm512_srlv_epi16(h, _mm512_slli_epi16::<1>(_mm512_and_si512(ids, _mm512_set1_epi16(3))));
    let h = _mm512_slli_epi16::<8>(_mm512_and_si512(h, _mm512_set1_epi16(3)));
    _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(qs as *const __m256i)), h)
}

/// The bytes `0, 1, …, 31`.
static GROUP_IDS: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

impl GridQuant for IQ1S {
    const BYTES: usize = 50;
    const TILE: bool = false;
    const OFF: i16 = 9;
    const DDX_MUL: f32 = 0.125;
    /// Layout: `d` (f16), `qs[32]` at 2, `qh[8]` (u16) at 34: group `g`'s grid index
    /// `qs[g] | ((qh[g / 4] >> 3 (g % 4)) & 7) << 8`, sub-block `j`'s scale `(qh[j] >> 12) & 7` and delta sign
    /// bit 15 of `qh[j]` (set: −1).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        let (qs, qh) = (blk.add(2), blk.add(34));
        // `[8]` u16 words, one per sub-block.
        let words = _mm_loadu_si128(qh as *const __m128i);
        // i32 lanes 0..8: the words.
        let h = _mm512_castsi256_si512(_mm256_cvtepu16_epi32(words));
        let ids = lane_ids();
        let shifts = _mm512_mullo_epi32(_mm512_and_si512(ids, _mm512_set1_epi32(3)), _mm512_set1_epi32(3));
        // Grid indices of groups 16 h..16 h + 16 as i32 lanes (lane `l`: word `4 h + l / 4`, bits `3 (l % 4)..`).
        let idx: [__m512i; 2] = std::array::from_fn(|half| {
            let sel = _mm512_add_epi32(_mm512_srli_epi32::<2>(ids), _mm512_set1_epi32(4 * half as i32));
            let hi = _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, h), shifts);
            let hi = _mm512_slli_epi32::<8>(_mm512_and_si512(hi, _mm512_set1_epi32(7)));
            _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(16 * half) as *const __m128i)), hi)
        });
        // Bit `j`: sub-block `j`'s delta is −1.
        let minus = _mm_movepi16_mask(words) as u64;
        let (one, two) = (_mm512_set1_epi8(1), _mm512_set1_epi8(2));
        let w = std::array::from_fn(|c| {
            let i = if c % 2 == 0 {
                _mm512_castsi512_si256(idx[c / 2])
            } else {
                _mm512_extracti64x4_epi64::<1>(idx[c / 2])
            };
            // Entries 8 c..8 c + 8: 64 grid bytes (−1, 0, 1 as i8) in element order.
            let g = _mm512_i32gather_epi64::<8>(i, IQ1S_GRID.as_ptr() as *const _);
            // 8 (g + 1) in 0..=16 per byte (no carry across bytes), plus 2 where the delta is +1.
            let u = _mm512_slli_epi16::<3>(_mm512_add_epi8(g, one));
            let lo = if (minus >> (2 * c)) & 1 != 0 { 0xffff_ffffu64 } else { 0 };
            let hi = if (minus >> (2 * c + 1)) & 1 != 0 { 0xffff_ffff_0000_0000u64 } else { 0 };
            let plus = !(lo | hi);
            _mm512_mask_add_epi8(u, plus, u, two)
        });
        let sc = _mm_and_si128(_mm_srli_epi16::<12>(words), _mm_set1_epi16(7));
        (w, _mm256_zextsi128_si256(_mm_add_epi16(_mm_add_epi16(sc, sc), _mm_set1_epi16(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::matmul::iquant_test_util::{activations, assert_matmul, assert_rows_exact, blocks, reference, seeded};
    use rand::Rng;

    /// The code lookups and 2-bit field spreading give every IQ2_XS and IQ2_S grid entry's bytes, for every index.
    #[test]
    fn code_lookups_give_the_grids() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for start in (0..1024).step_by(32) {
            let idx: [u16; 32] = std::array::from_fn(|i| (start + i) as u16);
            // `[32]` grid entries per table, 8 bytes each.
            let (mut xs, mut s) = ([0u64; 32], [0u64; 32]);
            // SAFETY: AVX-512 checked above; every index is below the tables' lengths (IQ2_XS: `idx & 511`).
            unsafe {
                let v = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
                let values = _mm512_broadcast_i32x4(_mm_loadu_si128(XXS2_VALUES.as_ptr() as *const __m128i));
                let cxs = codes(&CODES_2XS, _mm512_and_si512(v, _mm512_set1_epi16(511)));
                let cs = codes(&CODES_2S, v);
                for c in 0..4 {
                    let bytes = |codes: __m512i| _mm512_shuffle_epi8(values, crumbs_to_bytes(codes, c));
                    _mm512_storeu_si512(xs[8 * c..].as_mut_ptr() as *mut __m512i, bytes(cxs));
                    _mm512_storeu_si512(s[8 * c..].as_mut_ptr() as *mut __m512i, bytes(cs));
                }
            }
            for i in 0..32 {
                assert_eq!(xs[i], IQ2XS_GRID[(start + i) & 511], "IQ2_XS entry {}", (start + i) & 511);
                assert_eq!(s[i], IQ2S_GRID[start + i], "IQ2_S entry {}", start + i);
            }
        }
    }

    const TYPES: [(DType, usize); 3] =
        [(DType::IQ2XS, IQ2XS::BYTES), (DType::IQ2S, IQ2S::BYTES), (DType::IQ1S, IQ1S::BYTES)];

    /// Blocks at the bounds of the integer sums and random blocks, 1..=17 activation rows: the whole matmul
    /// (`avx512_iquant_rows` below 8 rows, the chunk kernel from 8 with ragged groups of 16 weight rows) equals the
    /// reference bit for bit.
    #[test]
    fn extreme_and_random_blocks_equal_the_reference() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        assert_eq!(std::mem::size_of::<tf_quant::BlockIQ1S>(), IQ1S::BYTES);
        for (dtype, bytes) in TYPES {
            assert_eq!(dtype.block_bytes(), bytes);
            for case in 0..34 {
                let (nb, out, rows) = (rng.gen_range(1..4), [8, 21, 40][case % 3], 1 + case % 17);
                let extreme = case % 4;
                let w = blocks(&mut rng, dtype, out * nb, extreme);
                let k = 256 * nb;
                let x = activations(&mut rng, rows, k, extreme);
                let want = reference(&x, rows, dtype, &w, out, k);
                let what = format!("case {case} (TF_SEED={seed})");
                assert_matmul(dtype, &w, out, &x, rows, &want, &what);
            }
        }
    }

    /// Row-exactness: each of 17 activation rows gives the reference's bits whether the call has 1, 2, …, 17 rows
    /// (`avx512_iquant_rows` below 8 rows, the chunk kernel from 8).
    #[test]
    fn a_row_is_the_same_whatever_the_row_count() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        for (dtype, _) in TYPES {
            assert_rows_exact(&mut rng, seed, dtype, 2, 37, 17);
        }
    }
}
