//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for the grid i-quants IQ3_S, IQ3_XXS and IQ2_XXS: weight blocks are
//! decoded into unsigned bytes once, and every activation row then costs `vpdpbusd` and a multiply per sub-block.
//!
//! Decoding, per block of one weight row: the grid is held as u16 codes, the four values of an entry in its four
//! nibbles ([`Codes`]: the value itself for IQ3_S, its index among the 8 values for IQ3_XXS; IQ2_XXS below); 32 grid indices at a
//! time (u16 lanes) fetch their codes by `vpermt2w` over each 64 table entries and blends on the index's upper
//! bits ([`codes`]), a table lookup in registers (on Zen 4 about twice as fast as `vpgatherdd` from a u32 grid).
//! Then 64 elements (16 entries, sub-blocks `2 c` and `2 c + 1`) at a time in one 512-bit register: the codes
//! widened to i32 lanes and their nibbles spread to bytes; the 64 sign bits of those elements form a `__mmask64`,
//! and each byte becomes `u = OFF + g` (sign clear) or `OFF − g` (sign set), where `g` is the grid value divided
//! by `DIV`:
//! - IQ3_S: `g` the grid value (odd, 1..=15), `DIV = 1`, `OFF = 16`, so `u` is in `1..=31`; the ninth index bit of
//!   32 entries is the u32 of `qh` at byte `4 h` taken as a lane mask, the signs the u64 at `signs[8 c]`.
//! - IQ3_XXS: `g` half the grid value (every value 4..=62 is even, checked when the tables are built; `vpshufb`
//!   from the code), `DIV = 2`, `OFF = 32`, so `u` is in `1..=63`; the sign bytes `KSIGNS_IQ2XS[f]` of the 7-bit
//!   fields `f` of the eight scale words are formed in vectors as `f | parity(f) << 7` (the table's rule, tested
//!   for all 128 fields).
//! - IQ2_XXS (8 values per grid entry, each 8, 25 or 43: a 2-bit code; 8 entries per register, widened to u64
//!   lanes): `g` the grid value, `DIV = 1`, `OFF = 44`, so `u` is in `1..=87`; indices, signs and scales as
//!   IQ3_XXS from the eight (index word, scale word) pairs. Its `u` is too large for the tile kernels' i16 pairs
//!   (`4·87·127 > 2^15`): only the chunk kernel runs it, and `avx512_iquant_rows` below [`GROUP_ROWS`] rows.
//!
//! The sub-block multiplier is `m_j = DIV·(1 + 2 sc_j)` (≤ 62), and the offset comes off through the activation
//! row's bsums, so that `Σ_j m_j·Σ_{i∈j} (u_i − OFF)·x_i = Σ_j (1 + 2 sc_j)·Σ_{i∈j} (±grid_i)·x_i`, the
//! reference's `S` (activations `x` in `-127..=127`). Two kernels form it, in exact integers either way:
//! - From [`GROUP_ROWS`] activation rows, a chunk of output columns is computed 16 weight rows ("a group") at a
//!   time, one per i32 lane: the group's blocks are decoded once into lines (a 16 × 16 transpose of the decoded
//!   registers: line `l` holds every weight row's four bytes of elements `4 l..4 l + 4`), then per activation row,
//!   block and sub-block `j`, `P_j = −OFF·(bsum[2 j] + bsum[2 j + 1]) + Σ_l vpdpbusd(line l, x[4 l..4 l + 4]
//!   broadcast)` over its 8 lines and `S += m_j·P_j` (`vpmulld`): `|P_j| ≤ 32·87·127 + 32·44·127 < 2^20`,
//!   `|S| ≤ 8·62·2^20 < 2^29`.
//! - Fewer rows run `avx512_iquant_rows`'s few-row kernel where the type has one (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S),
//!   else the tile kernels (`C` weight rows × `RT` activation rows, as `avx512_kquant`): per activation
//!   row, `vpdpbusd(u, x)` from zero gives i32 lanes that are each the sum of four products of one sub-block,
//!   `|p| ≤ 4·63·127 = 32004`, so two chunks pack to i16 (`vpackssdw`, never saturating) and `vpdpwssd`
//!   multiplies each lane by its `m_j` in the lane order of `avx512_kquant`'s K-quant pairs, from a starting value
//!   of `−OFF·Σ_j m_j·(bsum[2 j] + bsum[2 j + 1])`: the products total at most `256·63·127·62 < 2^28`, the offset
//!   term `32·62·256·127 < 2^26`. A tile's later row groups read the blocks its first one decoded ([`Cache`]).
//!
//! Then per lane, in floats, as the reference: `acc = fma(dw * dx, S, acc)` (IQ3_S) or
//! `acc = fma((dw * dx) * 0.25, S, acc)` (IQ3_XXS), blocks in order.
//!
//! `avx512_iquant2` implements [`GridQuant`] for IQ2_XS, IQ2_S and IQ1_S on the chunk kernel (no tile kernels: below
//! 8 rows they run `avx512_iquant_rows`); IQ2_XS and IQ2_S have 16 sub-blocks of 16 ([`GridQuant::SUBS`]): the
//! chunk kernel then takes `P_j` over 4 lines with `bsum[j]`.

use std::arch::x86_64::*;
use std::cell::RefCell;

use tf_core::DType;
use tf_quant::{IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

use super::act::ActQ;
use super::avx2::{by_rows, lane_offsets, lanes, pattern_ps, reduce8, words};
use super::avx512_kquant::{f16_lanes, fold, pair, prefetch, Q45_IDX};
use super::{avx512_iquant_rows, chunk_quant, ChunkKernel, CpuWeight, Out, QuantKernel};

/// The AVX-512 chunk kernel of a grid i-quant `dtype`, if there is one: [`chunk`] from [`GROUP_ROWS`] activation
/// rows, below them `avx512_iquant_rows`'s kernel or the tile kernels ([`kernel`]).
pub(super) fn chunk_kernel(dtype: DType) -> Option<ChunkKernel> {
    Some(match dtype {
        DType::IQ3S => chunk::<IQ3S>,
        DType::IQ3XXS => chunk::<IQ3XXS>,
        DType::IQ2XXS => chunk::<IQ2XXS>,
        _ => return None,
    })
}

/// The AVX-512 tile kernel of a grid i-quant `dtype`, if there is one.
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::IQ3S => entry::<IQ3S>,
        DType::IQ3XXS => entry::<IQ3XXS>,
        _ => return None,
    })
}

/// A grid i-quant layout: how a block decodes into the unsigned bytes `u = OFF ± g`.
pub(super) trait GridQuant {
    const BYTES: usize;
    /// Sub-blocks per block, each with one multiplier: 8 of 32 elements or 16 of 16 (chunk kernel only).
    const SUBS: usize = 8;
    /// Lines of one decoded block in [`chunk`]'s group: 64 of weight bytes, `SUBS` of multipliers, 1 of `dw`.
    const LINES: usize = 65 + Self::SUBS;
    /// The offset added to every signed (and divided) grid value.
    const OFF: i16;
    /// The scale product is `(dw * dx) * DDX_MUL` where this is not 1.
    const DDX_MUL: f32;
    /// Whether the tile kernels here can run this type (only with `SUBS = 8`); [`chunk`] runs them below
    /// [`GROUP_ROWS`] rows for a type `avx512_iquant_rows` has no kernel for.
    const TILE: bool = true;
    /// The block at `blk` as four registers of 64 unsigned bytes `u` in element order, and the `SUBS` sub-block
    /// multipliers `m_j = DIV·(1 + 2 sc_j)` as i16 lanes `0..SUBS` (the others zero).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `blk` points at a whole block.
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i);
}

struct IQ3S;
struct IQ3XXS;
struct IQ2XXS;

/// A grid as one u16 code per entry (four values in nibbles, or eight in 2-bit fields), 64-byte aligned for the
/// loads.
#[repr(C, align(64))]
pub(super) struct Codes<const N: usize>(pub(super) [u16; N]);

/// The values of `IQ3XXS_GRID` (code `k` is value `XXS_VALUES[k]`).
const XXS_VALUES: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];

/// Half of each of `XXS_VALUES` (exact: all are even), then zeros: the `vpshufb` table from codes.
static XXS_HALVES: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut k = 0;
    while k < 8 {
        assert!(XXS_VALUES[k].is_multiple_of(2), "IQ3_XXS grid values are even");
        t[k] = XXS_VALUES[k] / 2;
        k += 1;
    }
    t
};

/// `IQ3XXS_GRID` as codes: each value's index in `XXS_VALUES`.
static CODES_3XXS: Codes<256> = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut k = 0;
        while k < 4 {
            let v = ((IQ3XXS_GRID[i] >> (8 * k)) & 255) as u8;
            let mut c = 0;
            while XXS_VALUES[c] != v {
                c += 1;
            }
            t[i] |= (c as u16) << (4 * k);
            k += 1;
        }
        i += 1;
    }
    Codes(t)
};

/// `IQ3S_GRID` as codes (every value is at most 15).
static CODES_3S: Codes<512> = {
    let mut t = [0u16; 512];
    let mut i = 0;
    while i < 512 {
        let mut k = 0;
        while k < 4 {
            let v = (IQ3S_GRID[i] >> (8 * k)) & 255;
            assert!(v < 16, "IQ3_S grid values fit a nibble");
            t[i] |= (v as u16) << (4 * k);
            k += 1;
        }
        i += 1;
    }
    Codes(t)
};

/// The codes `table[i]` of the 32 indices `i` (u16 lanes, each below `N`, 256, 512 or 1024): `vpermt2w` over each
/// 64 entries, then blends on index bits 6, 7 (and 8, 9).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn codes<const N: usize>(table: &Codes<N>, idx: __m512i) -> __m512i {
    let t = table.0.as_ptr() as *const __m512i;
    let seg =
        |s: usize| _mm512_permutex2var_epi16(_mm512_load_si512(t.add(2 * s)), idx, _mm512_load_si512(t.add(2 * s + 1)));
    let b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    let b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    let pair = |p: usize| {
        let q0 = _mm512_mask_blend_epi16(b6, seg(4 * p), seg(4 * p + 1));
        let q1 = _mm512_mask_blend_epi16(b6, seg(4 * p + 2), seg(4 * p + 3));
        _mm512_mask_blend_epi16(b7, q0, q1)
    };
    let quad = |q: usize| {
        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, _mm512_set1_epi16(256)), pair(2 * q), pair(2 * q + 1))
    };
    match N {
        256 => pair(0),
        512 => quad(0),
        1024 => _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, _mm512_set1_epi16(512)), quad(0), quad(1)),
        _ => unreachable!("code tables of 256, 512 or 1024 entries"),
    }
}

/// The four nibbles of the code in each i32 lane as its four bytes, nibble `k` in byte `k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibbles_to_bytes(c: __m512i) -> __m512i {
    let c = _mm512_and_si512(_mm512_or_si512(c, _mm512_slli_epi32::<8>(c)), _mm512_set1_epi32(0x00ff_00ff));
    _mm512_and_si512(_mm512_or_si512(c, _mm512_slli_epi32::<4>(c)), _mm512_set1_epi32(0x0f0f_0f0f))
}

/// `u = off + g` where bit `i` of `neg` is clear, `off − g` where it is set, per byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn offset_signed(g: __m512i, neg: u64, off: __m512i) -> __m512i {
    _mm512_mask_sub_epi8(_mm512_add_epi8(g, off), neg, off, g)
}

impl GridQuant for IQ3S {
    const BYTES: usize = 110;
    const OFF: i16 = 16;
    const DDX_MUL: f32 = 1.0;
    /// Layout: `d` (f16), `qs[64]` at 2, `qh[8]` at 66, `signs[32]` at 74, `scales[4]` at 106. Group `g`'s grid
    /// index is `qs[g] | ((qh[g / 8] >> g % 8) & 1) << 8`, element `e`'s sign bit `e % 8` of `signs[e / 8]`,
    /// sub-block `j`'s scale the nibble `(scales[j / 2] >> 4 (j % 2)) & 15`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        let (qs, qh, signs) = (blk.add(2), blk.add(66), blk.add(74));
        let off = _mm512_set1_epi8(Self::OFF as i8);
        let bit8 = _mm512_set1_epi16(256);
        // Grid indices of entries 32 h..32 h + 32 as u16 lanes, their codes, each code's four nibbles to bytes.
        let codes: [__m512i; 2] = std::array::from_fn(|h| {
            let idx = _mm512_cvtepu8_epi16(_mm256_loadu_si256(qs.add(32 * h) as *const __m256i));
            let high = (qh.add(4 * h) as *const u32).read_unaligned();
            codes(&CODES_3S, _mm512_mask_add_epi16(idx, high, idx, bit8))
        });
        let w = std::array::from_fn(|c| {
            let e = codes[c / 2];
            let e = if c % 2 == 0 { _mm512_castsi512_si256(e) } else { _mm512_extracti64x4_epi64::<1>(e) };
            let g = nibbles_to_bytes(_mm512_cvtepu16_epi32(e));
            offset_signed(g, (signs.add(8 * c) as *const u64).read_unaligned(), off)
        });
        // The eight nibbles of the u32 at byte 106 spread to one byte each, in order.
        let l = (blk.add(106) as *const u32).read_unaligned() as u64;
        let l = (l | l << 16) & 0x0000_ffff_0000_ffff;
        let l = (l | l << 8) & 0x00ff_00ff_00ff_00ff;
        let l = (l | l << 4) & 0x0f0f_0f0f_0f0f_0f0f;
        let sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(l as i64));
        (w, _mm256_zextsi128_si256(_mm_add_epi16(_mm_add_epi16(sc, sc), _mm_set1_epi16(1))))
    }
}

/// The sign bytes `KSIGNS_IQ2XS[f]` of the 7-bit fields `f` in the low 7 bits of each i32 lane: `f` with its
/// parity in bit 7.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn ksigns(f: __m512i) -> __m512i {
    let p = _mm512_xor_si512(f, _mm512_srli_epi32::<4>(f));
    let p = _mm512_xor_si512(p, _mm512_srli_epi32::<2>(p));
    let p = _mm512_xor_si512(p, _mm512_srli_epi32::<1>(p));
    _mm512_or_si512(f, _mm512_and_si512(_mm512_slli_epi32::<7>(p), _mm512_set1_epi32(0x80)))
}

/// The sign masks of the eight sub-blocks whose words `aux_j` are the i32 lanes of `aux` (signs of 8-element group
/// `k` of sub-block `j`: `KSIGNS_IQ2XS[(aux_j >> 7 k) & 127]`), 64 elements per mask. i32 lane `4 j' + k` of half
/// `h`: field `k` of `aux_{4 h + j'}`, then its sign byte; the 32 bytes in `(j, k)` order are the 256 sign bits in
/// element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn sign_masks(aux: __m256i) -> [u64; 4] {
    let a = _mm512_castsi256_si512(aux);
    let shifts = _mm512_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21);
    let m127 = _mm512_set1_epi32(127);
    let half = |h: i32| {
        let words = _mm512_permutexvar_epi32(
            _mm512_srli_epi32::<2>(_mm512_add_epi32(lane_ids(), _mm512_set1_epi32(16 * h))),
            a,
        );
        _mm512_cvtepi32_epi8(ksigns(_mm512_and_si512(_mm512_srlv_epi32(words, shifts), m127)))
    };
    let (s0, s1) = (half(0), half(1));
    [
        _mm_cvtsi128_si64(s0) as u64,
        _mm_extract_epi64::<1>(s0) as u64,
        _mm_cvtsi128_si64(s1) as u64,
        _mm_extract_epi64::<1>(s1) as u64,
    ]
}

/// The values of the IQ2_XXS, IQ2_XS and IQ2_S grids (code `k` is value `XXS2_VALUES[k]`), then zeros: the
/// `vpshufb` table from codes.
pub(super) static XXS2_VALUES: [u8; 16] = [8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// A grid of eight values 8, 25 or 43 per entry as codes: value `k` of entry `i` as its index in `XXS2_VALUES`, in
/// bits `2 k..2 k + 2`.
pub(super) const fn crumb_codes<const N: usize>(grid: &[u64; N]) -> Codes<N> {
    grid_codes(grid, false)
}

/// [`crumb_codes`] with value `k`'s code at bit `2 k`, or with `split` at bit `8 (k % 2) + 2 (k / 2)`
/// (`avx512_iquant_rows`' layout).
pub(super) const fn grid_codes<const N: usize>(grid: &[u64; N], split: bool) -> Codes<N> {
    let mut t = [0u16; N];
    let mut i = 0;
    while i < N {
        let mut k = 0;
        while k < 8 {
            let v = ((grid[i] >> (8 * k)) & 255) as u8;
            let mut c = 0;
            while XXS2_VALUES[c] != v {
                c += 1;
            }
            assert!(c < 3, "the grid values are 8, 25 and 43");
            let at = if split { 8 * (k % 2) + 2 * (k / 2) } else { 2 * k };
            t[i] |= (c as u16) << at;
            k += 1;
        }
        i += 1;
    }
    Codes(t)
}

/// `IQ2XXS_GRID` as codes.
static CODES_2XXS: Codes<256> = crumb_codes(&IQ2XXS_GRID);

/// The 2-bit codes of entries `8 c..8 c + 8` (u16 lanes of `codes`) as 64 bytes in element order: entry `8 c + i`'s
/// code `k` in byte `8 i + k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn crumbs_to_bytes(codes: __m512i, c: usize) -> __m512i {
    let e = _mm512_cvtepu16_epi64(match c {
        0 => _mm512_extracti32x4_epi32::<0>(codes),
        1 => _mm512_extracti32x4_epi32::<1>(codes),
        2 => _mm512_extracti32x4_epi32::<2>(codes),
        _ => _mm512_extracti32x4_epi32::<3>(codes),
    });
    let e = _mm512_and_si512(_mm512_or_si512(e, _mm512_slli_epi64::<24>(e)), _mm512_set1_epi64(0x0000_00ff_0000_00ff));
    let e = _mm512_and_si512(_mm512_or_si512(e, _mm512_slli_epi64::<12>(e)), _mm512_set1_epi64(0x000f_000f_000f_000f));
    _mm512_and_si512(_mm512_or_si512(e, _mm512_slli_epi64::<6>(e)), _mm512_set1_epi64(0x0303_0303_0303_0303))
}

impl GridQuant for IQ2XXS {
    const BYTES: usize = 66;
    const OFF: i16 = 44;
    const DDX_MUL: f32 = 0.125;
    const TILE: bool = false;
    /// Layout: `d` (f16), then per sub-block `j` two u32 at `2 + 8 j`: the grid indices of its four 8-element
    /// groups (one byte each), and `aux_j`: scale `aux_j >> 28`, signs of group `k` `KSIGNS_IQ2XS[(aux_j >> 7 k)
    /// & 127]`. `g` is the grid value (8, 25 or 43), `DIV = 1`, `OFF = 44`, so `u` is in `1..=87` (more than the
    /// tile kernels' i16 pairs hold: only the chunk kernel runs this type).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        let v = _mm512_loadu_si512(blk.add(2) as *const __m512i);
        let idx = _mm512_cvtepu8_epi16(_mm512_cvtepi64_epi32(v));
        let aux = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v));
        // m_j = 1 + 2 sc_j.
        let sc = _mm256_srli_epi32::<28>(aux);
        let m = _mm256_cvtepi32_epi16(_mm256_add_epi32(_mm256_add_epi32(sc, sc), _mm256_set1_epi32(1)));
        let neg = sign_masks(aux);
        let off = _mm512_set1_epi8(Self::OFF as i8);
        let values = _mm512_broadcast_i32x4(_mm_loadu_si128(XXS2_VALUES.as_ptr() as *const __m128i));
        let codes = codes(&CODES_2XXS, idx);
        let w =
            std::array::from_fn(|c| offset_signed(_mm512_shuffle_epi8(values, crumbs_to_bytes(codes, c)), neg[c], off));
        (w, _mm256_zextsi128_si256(m))
    }
}

impl GridQuant for IQ3XXS {
    const BYTES: usize = 98;
    const OFF: i16 = 32;
    const DDX_MUL: f32 = 0.25;
    /// Layout: `d` (f16), `qs[64]` at 2 (group `g`'s grid index `qs[g]`), then per sub-block `j` the u32 `aux_j`
    /// at `66 + 4 j`: scale `aux_j >> 28`, signs of its 8-element group `k` `KSIGNS_IQ2XS[(aux_j >> 7 k) & 127]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> ([__m512i; 4], __m256i) {
        let qs = blk.add(2);
        let aux = _mm256_loadu_si256(blk.add(66) as *const __m256i);
        // m_j = 2 (1 + 2 sc_j) = 4 sc_j + 2.
        let sc = _mm256_srli_epi32::<28>(aux);
        let m = _mm256_cvtepi32_epi16(_mm256_add_epi32(_mm256_slli_epi32::<2>(sc), _mm256_set1_epi32(2)));
        let neg = sign_masks(aux);
        let off = _mm512_set1_epi8(Self::OFF as i8);
        // Codes of entries 32 h..32 h + 32, to bytes, to half the grid value (exact: every value is even).
        let halves = _mm512_broadcast_i32x4(_mm_loadu_si128(XXS_HALVES.as_ptr() as *const __m128i));
        let codes: [__m512i; 2] = std::array::from_fn(|h| {
            codes(&CODES_3XXS, _mm512_cvtepu8_epi16(_mm256_loadu_si256(qs.add(32 * h) as *const __m256i)))
        });
        let w = std::array::from_fn(|c| {
            let e = codes[c / 2];
            let e = if c % 2 == 0 { _mm512_castsi512_si256(e) } else { _mm512_extracti64x4_epi64::<1>(e) };
            let g = _mm512_shuffle_epi8(halves, nibbles_to_bytes(_mm512_cvtepu16_epi32(e)));
            offset_signed(g, neg[c], off)
        });
        (w, _mm256_zextsi128_si256(m))
    }
}

/// i32 lanes `0, 1, …, 15`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn lane_ids() -> __m512i {
    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
}

/// One decoded block: the four registers of `u` and the multipliers `m_j` (i16 lanes 0..8).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Decoded {
    u: [[u8; 64]; 4],
    m: [i16; 8],
}

/// The decoded blocks of recently computed weight rows on this thread: a tile's later row groups read the bytes
/// its first one decoded. An entry is keyed by the weight row's address and length and by the activations
/// (`ActQ` address and buffer); a tile whose first activation row is 0 always decodes its rows afresh (and writes
/// them), and the matmul computes the row groups of a tile in order from row 0, so a later group of the same call
/// reads exactly the bytes it would decode.
struct Cache {
    entries: [Entry; CACHE_ROWS],
    /// Tile calls so far (the entries' `used` stamps).
    calls: u64,
}

/// Weight rows held: a tile has at most 8.
const CACHE_ROWS: usize = 8;

struct Entry {
    key: (usize, usize, usize, usize),
    used: u64,
    blocks: Vec<Decoded>,
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            entries: [const { Entry { key: (0, 0, 0, 0), used: 0, blocks: Vec::new() } }; CACHE_ROWS],
            calls: 0,
        })
    };
}

impl Cache {
    /// The entries of the `C` weight rows `cols` against `act` (`nb` blocks each), and whether each must be
    /// decoded (and written) rather than read: always when `fresh`.
    fn claim<const C: usize>(&mut self, cols: &[&[u8]; 8], act: &ActQ, fresh: bool) -> [(*mut Decoded, bool); C] {
        self.calls += 1;
        let call = self.calls;
        let mut out = [(std::ptr::null_mut(), true); C];
        for c in 0..C {
            let key = (cols[c].as_ptr() as usize, cols[c].len(), act as *const ActQ as usize, act.qs.as_ptr() as usize);
            let hit = self.entries.iter().position(|e| e.key == key && !e.blocks.is_empty());
            let (i, decode) = match hit {
                // A row repeated in this call (a ragged tile's last row) shares its entry and decodes as its
                // first claim does.
                Some(i) if self.entries[i].used == call => {
                    (i, out[..c].iter().find(|o| o.0 == self.entries[i].blocks.as_mut_ptr()).map_or(fresh, |o| o.1))
                }
                Some(i) => (i, fresh),
                None => {
                    let i = (0..CACHE_ROWS)
                        .filter(|&i| self.entries[i].used != call)
                        .min_by_key(|&i| self.entries[i].used)
                        .expect("a tile has at most 8 weight rows");
                    (i, true)
                }
            };
            let e = &mut self.entries[i];
            e.key = key;
            e.used = call;
            if e.blocks.len() != act.nb {
                e.blocks = vec![Decoded { u: [[0; 64]; 4], m: [0; 8] }; act.nb];
            }
            out[c] = (e.blocks.as_mut_ptr(), decode);
        }
        out
    }
}

/// This block's `S` against `RT` activation rows (`x[r]`: the block's 256 values, `bs[r]`: its 16 bsums) as eight
/// i32 lanes to be summed, in `s[r]`, from its decoded bytes `w` and multipliers `m`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<T: GridQuant, const RT: usize>(
    (w, m): ([__m512i; 4], __m128i),
    x: &[*const i8; RT],
    bs: &[*const i16; RT],
    s: &mut [__m256i; RT],
) {
    // i16 [−OFF·m_0, −OFF·m_0, −OFF·m_1, …, −OFF·m_7] against the 16 bsums (|·| ≤ 32·62).
    let dup = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let off = _mm256_mullo_epi16(_mm256_permutexvar_epi16(dup, _mm256_castsi128_si256(m)), _mm256_set1_epi16(-T::OFF));
    let mut acc: [__m512i; RT] = std::array::from_fn(|r| {
        _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256(bs[r] as *const __m256i), off))
    });
    let m = _mm512_castsi128_si512(m);
    for (q, idx) in Q45_IDX.iter().enumerate() {
        let sc = _mm512_permutexvar_epi16(_mm512_loadu_si512(idx.as_ptr() as *const __m512i), m);
        pair(w[2 * q], w[2 * q + 1], sc, x, 2 * q, &mut acc);
    }
    for r in 0..RT {
        s[r] = fold(acc[r]);
    }
}

pub(super) fn entry<T: GridQuant>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(T::TILE && T::SUBS == 8, "i-quant tile: a type with 8 sub-blocks");
    assert!(act.block == 256 && r0 + rt <= act.rows, "i-quant tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "i-quant tile: weight rows");
    // SAFETY: this kernel is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; the asserts
    // above bound every pointer the kernel forms (the lookups index tables of 512 and 256 entries with 9- and
    // 8-bit indices; the cache entries hold `nb` blocks).
    unsafe {
        if act.rows <= rt {
            // One row group: nothing to keep.
            by_rows!(rt, tile::<T>(cols, act, r0, None))
        } else {
            CACHE.with_borrow_mut(|cache| by_rows!(rt, tile::<T>(cols, act, r0, Some(&mut *cache))))
        }
    }
}

/// `C` weight rows × `RT` activation rows → 8 lanes, lane `c · RT + r`; the float steps of the reference. With a
/// cache, the weight rows' decoded blocks are read from it or decoded into it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<T: GridQuant, const C: usize, const RT: usize>(
    cols: &[&[u8]; 8],
    act: &ActQ,
    r0: usize,
    cache: Option<&mut Cache>,
) -> [f32; 8] {
    let (k, rows, nb) = (act.k, act.rows, act.nb);
    let offsets = lane_offsets::<RT>(cols);
    let slots: Option<[(*mut Decoded, bool); C]> = cache.map(|c| c.claim::<C>(cols, act, r0 == 0));
    // The same block of the row one tile (8 rows) further: the rows of a tile are contiguous, so this streams the
    // next tile into L2 while this one is computed (by the first row group, which reads the weights).
    let ahead = 8 * cols[0].len();
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let x: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b));
        let bs: [*const i16; RT] = std::array::from_fn(|r| act.sums.as_ptr().add(((r0 + r) * nb + b) * 16));
        let mut s = [_mm256_setzero_si256(); 8];
        for c in 0..C {
            let mut sc = [_mm256_setzero_si256(); RT];
            let blk = cols[c].as_ptr().add(b * T::BYTES);
            let wm = match slots {
                Some(slots) if !slots[c].1 => {
                    let d = slots[c].0.add(b) as *const u8;
                    let u = std::array::from_fn(|i| _mm512_load_si512(d.add(64 * i) as *const __m512i));
                    (u, _mm_load_si128(d.add(256) as *const __m128i))
                }
                _ => {
                    if r0 == 0 {
                        prefetch(blk.wrapping_add(ahead), T::BYTES);
                    }
                    let (u, m) = T::decode(blk);
                    let m = _mm256_castsi256_si128(m);
                    if let Some(slots) = slots {
                        let d = slots[c].0.add(b) as *mut u8;
                        for (i, &v) in u.iter().enumerate() {
                            _mm512_store_si512(d.add(64 * i) as *mut __m512i, v);
                        }
                        _mm_store_si128(d.add(256) as *mut __m128i, m);
                    }
                    (u, m)
                }
            };
            block::<T, RT>(wm, &x, &bs, &mut sc);
            s[c * RT..(c + 1) * RT].copy_from_slice(&sc);
        }
        let dw = f16_lanes(words::<C>(cols, b * T::BYTES, offsets));
        let dx = pattern_ps::<RT>(act.d_t.as_ptr().add(b * rows + r0));
        let ddx = _mm256_mul_ps(dw, dx);
        let ddx = if T::DDX_MUL != 1.0 { _mm256_mul_ps(ddx, _mm256_set1_ps(T::DDX_MUL)) } else { ddx };
        acc = _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(reduce8(&s)), acc);
    }
    lanes(acc)
}

/// Activation rows from which a chunk is computed by [`chunk`] (fewer run the tile kernels).
const GROUP_ROWS: usize = 8;

/// Weight rows of a group: the i32 lanes of a 512-bit register.
const LANES: usize = 16;

/// One 64-byte line of a decoded group.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    /// The decoded group of [`chunk`]: `[nb][T::LINES]` lines.
    static GROUP: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn chunk<T: GridQuant>(w: &CpuWeight, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    if act.rows < GROUP_ROWS {
        // The few-row kernel where the type has one (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S), else the tile kernels.
        if let Some(few) = avx512_iquant_rows::chunk_kernel(w.dtype) {
            return few(w, act, c0, c1, out);
        }
        assert!(T::TILE, "{}: no kernel below {GROUP_ROWS} rows", w.dtype);
        return chunk_quant::<8>(entry::<T>, w, act, c0, c1, out);
    }
    let (bytes, rb, nb, rows) = (w.bytes(), w.row_bytes, act.nb, act.rows);
    assert!(act.block == 256 && rb == nb * T::BYTES && c0.is_multiple_of(LANES) && c1 * rb <= bytes.len());
    assert!(act.qs.len() == rows * act.k && act.d_t.len() == rows * nb && act.sums.len() == rows * nb * 16);
    assert!(c1 <= out.stride && rows <= out.rows, "i-quant chunk: output");
    // The first group's rows now, each next group's while this one is computed (a share per pass of rows).
    crate::simd::prefetch_l2(&bytes[c0 * rb..(c0 + LANES).min(c1) * rb]);
    let passes = rows.div_ceil(4);
    GROUP.with_borrow_mut(|group| {
        if group.len() < nb * T::LINES {
            group.resize(nb * T::LINES, Line([0; 64]));
        }
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            // Lane `c`: weight row `g0 + c`, the last live one repeated past the chunk's end (its sums dropped).
            let cols: [&[u8]; LANES] = std::array::from_fn(|c| {
                let c = g0 + c.min(live - 1);
                &bytes[c * rb..(c + 1) * rb]
            });
            let next = &bytes[((g0 + LANES) * rb).min(bytes.len())..((g0 + 2 * LANES) * rb).min(bytes.len())];
            // SAFETY: `Kernel::Chunk` is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; every
            // column holds `nb` blocks, `group` `nb` decoded blocks, `act` every row's data and `out` rows `rows`
            // of columns `g0..g0 + live` (asserts above); this task owns columns `c0..c1` of `out`.
            unsafe {
                decode_group::<T>(&cols, nb, group.as_mut_ptr());
                let dst = out.ptr.get().add(g0);
                let mut r0 = 0;
                while r0 < rows {
                    let rt = (rows - r0).min(4);
                    let pass = r0 / 4;
                    crate::simd::prefetch_l2(&next[pass * next.len() / passes..(pass + 1) * next.len() / passes]);
                    let g = group.as_ptr();
                    match rt {
                        4 => group_rows::<T, 4>(g, act, r0, dst, out.stride, live),
                        3 => group_rows::<T, 3>(g, act, r0, dst, out.stride, live),
                        2 => group_rows::<T, 2>(g, act, r0, dst, out.stride, live),
                        _ => group_rows::<T, 1>(g, act, r0, dst, out.stride, live),
                    }
                    r0 += rt;
                }
            }
        }
    });
}

/// Step `s` (8, 4, 2, 1) of a 16 × 16 i32 transpose: for registers `r` and `r + s` (`r & s == 0`), lanes with bit
/// `s` set of `r` swap with lanes with it clear of `r + s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transpose_step(v: &mut [__m512i; LANES], s: usize) {
    let lo: [i32; 16] = std::array::from_fn(|c| if c & s == 0 { c as i32 } else { (16 + c - s) as i32 });
    let hi: [i32; 16] = std::array::from_fn(|c| if c & s == 0 { (c + s) as i32 } else { (16 + c) as i32 });
    let (lo, hi) =
        (_mm512_loadu_si512(lo.as_ptr() as *const __m512i), _mm512_loadu_si512(hi.as_ptr() as *const __m512i));
    for r in 0..LANES {
        if r & s == 0 {
            let (a, b) = (v[r], v[r + s]);
            v[r] = _mm512_permutex2var_epi32(a, lo, b);
            v[r + s] = _mm512_permutex2var_epi32(a, hi, b);
        }
    }
}

/// Decodes block `b` of the 16 weight rows `cols` into lines at `dst`: line `l` (0..64) holds, in i32 lane `c`, row
/// `c`'s four bytes `u` of elements `4 l..4 l + 4`; line `64 + j` its multiplier `m_j` (i32 lanes, `j < SUBS`); line
/// `64 + SUBS` its `dw` (f32 lanes, `vcvtph2ps` as [`f16_lanes`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_group<T: GridQuant>(cols: &[&[u8]; LANES], nb: usize, dst: *mut Line) {
    for b in 0..nb {
        let dst = dst.add(b * T::LINES) as *mut __m512i;
        // `[4][LANES]` registers of 64 bytes `u` per weight row.
        let mut u = [[_mm512_setzero_si512(); LANES]; 4];
        // `[LANES][16]` multipliers per weight row (the first `SUBS` used).
        let mut m = [[0i16; 16]; LANES];
        let mut d = [0u16; LANES];
        for c in 0..LANES {
            let blk = cols[c].as_ptr().add(b * T::BYTES);
            let (w, mc) = T::decode(blk);
            for q in 0..4 {
                u[q][c] = w[q];
            }
            _mm256_storeu_si256(m[c].as_mut_ptr() as *mut __m256i, mc);
            d[c] = (blk as *const u16).read_unaligned();
        }
        for (q, v) in u.iter_mut().enumerate() {
            for s in [8, 4, 2, 1] {
                transpose_step(v, s);
            }
            for (i, &line) in v.iter().enumerate() {
                _mm512_store_si512(dst.add(16 * q + i), line);
            }
        }
        // `[SUBS][LANES]`: multiplier `j` of every weight row.
        let mt: [[i32; LANES]; 16] = std::array::from_fn(|j| std::array::from_fn(|c| m[c][j] as i32));
        for (j, mj) in mt.iter().enumerate().take(T::SUBS) {
            _mm512_store_si512(dst.add(64 + j), _mm512_loadu_si512(mj.as_ptr() as *const __m512i));
        }
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr() as *const __m256i));
        _mm512_store_ps(dst.add(64 + T::SUBS) as *mut f32, dw);
    }
}

/// Activation rows `r0..r0 + RT` against the decoded group at `g`, into the first `live` columns from `dst` of
/// rows `r0..r0 + RT` (`stride` apart). Per
/// block, row and sub-block `j`: `P = −OFF·(bsum[2 j] + bsum[2 j + 1]) + Σ_l vpdpbusd(line l, x[4 l..4 l + 4])`
/// over its 8 lines (two partial sums of 4; with 16 sub-blocks `−OFF·bsum[j]` and 4 lines, two partial sums of 2),
/// then `S += m_j · P` (`vpmulld`); `acc = fma(dw * dx, S, acc)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows<T: GridQuant, const RT: usize>(
    g: *const Line,
    act: &ActQ,
    r0: usize,
    dst: *mut f32,
    stride: usize,
    live: usize,
) {
    let (k, rows, nb) = (act.k, act.rows, act.nb);
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        let lines = g.add(b * T::LINES) as *const __m512i;
        let x: [*const i32; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b) as *const i32);
        let bs: [*const i16; RT] = std::array::from_fn(|r| act.sums.as_ptr().add(((r0 + r) * nb + b) * 16));
        let mut s = [_mm512_setzero_si512(); RT];
        // Lines per sub-block: 8 or 4.
        let per = 64 / T::SUBS;
        for j in 0..T::SUBS {
            let mut p: [[__m512i; 2]; RT] = std::array::from_fn(|r| {
                let bsum = if T::SUBS == 16 {
                    *bs[r].add(j) as i32
                } else {
                    *bs[r].add(2 * j) as i32 + *bs[r].add(2 * j + 1) as i32
                };
                [_mm512_set1_epi32(-(T::OFF as i32) * bsum), _mm512_setzero_si512()]
            });
            for i in 0..per {
                let line = _mm512_load_si512(lines.add(per * j + i));
                for r in 0..RT {
                    let xv = _mm512_set1_epi32(x[r].add(per * j + i).read_unaligned());
                    p[r][i % 2] = _mm512_dpbusd_epi32(p[r][i % 2], line, xv);
                }
            }
            let mj = _mm512_load_si512(lines.add(64 + j));
            for r in 0..RT {
                s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(_mm512_add_epi32(p[r][0], p[r][1]), mj));
            }
        }
        let dw = _mm512_load_ps(lines.add(64 + T::SUBS) as *const f32);
        for r in 0..RT {
            let ddx = _mm512_mul_ps(dw, _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r)));
            let ddx = if T::DDX_MUL != 1.0 { _mm512_mul_ps(ddx, _mm512_set1_ps(T::DDX_MUL)) } else { ddx };
            acc[r] = _mm512_fmadd_ps(ddx, _mm512_cvtepi32_ps(s[r]), acc[r]);
        }
    }
    let mask = ((1u32 << live) - 1) as __mmask16;
    for (r, &a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(dst.add((r0 + r) * stride), mask, a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::matmul::iquant_test_util::{activations, assert_matmul, assert_tiles, blocks, reference, seeded};
    use rand::Rng;
    use tf_quant::KSIGNS_IQ2XS;

    /// The vector sign bytes equal `KSIGNS_IQ2XS` for every 7-bit field.
    #[test]
    fn ksigns_match_the_table() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for start in (0..128).step_by(16) {
            let f: [i32; 16] = std::array::from_fn(|i| start + i as i32);
            let mut got = [0u8; 16];
            // SAFETY: AVX-512 checked above.
            unsafe {
                let v = _mm512_loadu_si512(f.as_ptr() as *const __m512i);
                _mm_storeu_si128(got.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(ksigns(v)));
            }
            let want: [u8; 16] = std::array::from_fn(|i| KSIGNS_IQ2XS[start as usize + i]);
            assert_eq!(got, want);
        }
    }

    /// The code lookups and nibble spreading give every grid entry's bytes (IQ3_S) and halved bytes (IQ3_XXS), for
    /// every index.
    #[test]
    fn code_lookups_give_the_grids() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for start in (0..512).step_by(32) {
            let idx: [u16; 32] = std::array::from_fn(|i| (start + i) as u16);
            let (mut s3, mut xxs) = ([0u32; 32], [0u32; 32]);
            // SAFETY: AVX-512 checked above; every index is below the tables' lengths (IQ3_XXS: `idx & 255`).
            unsafe {
                let v = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
                let halves = _mm512_broadcast_i32x4(_mm_loadu_si128(XXS_HALVES.as_ptr() as *const __m128i));
                let c3 = codes(&CODES_3S, v);
                let cx = codes(&CODES_3XXS, _mm512_and_si512(v, _mm512_set1_epi16(255)));
                for h in 0..2 {
                    let part = |c: __m512i| {
                        let e = if h == 0 { _mm512_castsi512_si256(c) } else { _mm512_extracti64x4_epi64::<1>(c) };
                        nibbles_to_bytes(_mm512_cvtepu16_epi32(e))
                    };
                    _mm512_storeu_si512(s3[16 * h..].as_mut_ptr() as *mut __m512i, part(c3));
                    let x = _mm512_shuffle_epi8(halves, part(cx));
                    _mm512_storeu_si512(xxs[16 * h..].as_mut_ptr() as *mut __m512i, x);
                }
            }
            for i in 0..32 {
                assert_eq!(s3[i], IQ3S_GRID[start + i], "IQ3_S entry {}", start + i);
                assert_eq!(xxs[i] << 1, IQ3XXS_GRID[(start + i) & 255], "IQ3_XXS entry {}", (start + i) & 255);
            }
        }
    }

    /// Blocks at the bounds of the integer sums (the largest grid value everywhere, every scale 15, all signs
    /// equal, activations all ±127) and random blocks: every tile shape (1, 2, 4 and 8 rows) and the whole matmul
    /// equal the reference bit for bit.
    #[test]
    fn extreme_and_random_blocks_equal_the_reference() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        for (dtype, bytes) in
            [(DType::IQ3S, IQ3S::BYTES), (DType::IQ3XXS, IQ3XXS::BYTES), (DType::IQ2XXS, IQ2XXS::BYTES)]
        {
            assert_eq!(dtype.block_bytes(), bytes);
            // IQ2_XXS has only the chunk kernel (the matmul below).
            let kernel = kernel(dtype);
            for case in 0..40 {
                let (nb, out, rows) = (rng.gen_range(1..4), [8, 21, 40][case % 3], [8, 13, 4, 64][case % 4]);
                let extreme = case % 4;
                let w = blocks(&mut rng, dtype, out * nb, extreme);
                let k = 256 * nb;
                let x = activations(&mut rng, rows, k, extreme);
                let want = reference(&x, rows, dtype, &w, out, k);
                let what = format!("case {case} (TF_SEED={seed})");
                if let Some(kernel) = kernel {
                    let act = ActQ::new(Isa::Avx512, &x, rows, k, 256);
                    assert_tiles(kernel, dtype, &w, out, &act, &want, &what);
                }
                // The whole matmul: the chunk kernel from 8 rows, with ragged groups of 16 weight rows.
                assert_matmul(dtype, &w, out, &x, rows, &want, &what);
            }
        }
    }
}
