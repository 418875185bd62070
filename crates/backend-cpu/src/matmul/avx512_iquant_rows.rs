//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for IQ2_XXS, IQ2_XS, IQ2_S and IQ1_S below 8 activation rows
//! (decode steps, short verify windows), where `avx512_iquant`'s chunk kernel would decode 16 weight rows per group
//! for too few rows: here each block of a weight row is decoded once into four registers and used by every row.
//!
//! IQ2_XXS, IQ2_XS, IQ2_S. Decoding one block (256 elements, 32 grid entries of 8 values `g` in 8, 25, 43):
//! - The grid as u16 codes in a split layout ([`split_codes`]): value `k`'s 2-bit code (its index among 8, 25,
//!   43) at bit `2 (k / 2)` of the low byte for even `k`, of the high byte for odd `k`. The 32 grid indices fetch
//!   their codes by `avx512_iquant`'s `vpermt2w` lookup ([`codes`]).
//! - Register `c` (elements `64 c..64 c + 64`, entries `8 c..8 c + 8`): `vpermw` puts entry `8 c + i`'s code in
//!   all four u16 lanes of bytes `8 i..8 i + 8`, so byte `8 i + k` holds value `k`'s code at the bits
//!   `2 (k / 2)`, the same for every entry; two `vptestmb` against per-byte bit patterns give the code's bits as
//!   two 64-bit masks, and two blends turn them into the bytes `g` (unsigned).
//! - The signs as one 64-bit mask per register (IQ2_XXS: `KSIGNS_IQ2XS` bytes of the `aux` fields, formed in
//!   vectors; IQ2_XS: the same from bits 9..16 of each u16 `qs`; IQ2_S: the stored sign bytes), and the
//!   sub-block multipliers `m_j = 1 + 2 sc_j` as i32 lanes, spread to one register per 64 elements (i32 lane `l`
//!   of register `c`: the multiplier of elements `64 c + 4 l..64 c + 4 l + 4`).
//!
//! Per activation row, register `c`: the signs go onto the activations (`vpsubb` from zero under the sign mask:
//! `x` is in `-127..=127`, so `−x` is exact), `p = vpdpbusd(0, g, ±x)` (i32 lanes, each four products of one
//! sub-block: `|p| ≤ 4·43·127 = 21844`, an i16), and `S += vpdpwssd(p, m)` with `m`'s high i16 zero (the
//! low i16 of `p` is `p`, its high one contributes `· 0`): `S = Σ_j m_j·Σ_{i∈j} (±g_i)·x_i`, the reference's
//! integer, `|S| ≤ 256·43·127·31 < 2^26`, exact in any order.
//!
//! IQ1_S (8 sub-blocks of 32; element value `8 g + δ_j` with `g` in −1, 0, 1 from the 2048-entry grid, `δ_j = ±1`
//! the sub-block's delta sign, multiplier `m_j = 1 + 2 sc_j ≤ 15`). Decoding one block:
//! - The 32 grid indices `qs[k] | ((qh[k / 4] >> 3 (k % 4)) & 7) << 8` as u16 lanes (`vpermw` of the eight `qh`
//!   words, `vpsrlvw`, a shift by 8 and `vpternlogd` with `qs`), widened to i32; per register `c` one `vpgatherdq`
//!   of entries `8 c..8 c + 8` from `IQ1S_GRID` gives the 64 bytes `g` (0xff, 0, 1) in element order. The grid
//!   (16 KiB) is read 32 entries per block whichever way; the gather forms their addresses in vectors, where
//!   scalar loads would form each index in general registers and insert the entries lane by lane, and the
//!   `vpermt2w` code lookup of the IQ2 types would take 32 permutes per 32 indices for 2048 entries.
//! - The table `t`: the u16 `m_j · 0x1008` in u16 lane `j` of every 128-bit lane (`vpmullw`, broadcast), so byte
//!   `2 j` is `8 m_j` and byte `2 j + 1` is `16 m_j` (≤ 120 and 240, no carry between them). Then
//!   `u = vpshufb(t, g | 2 j)` with `2 j` (even, at most 14) the element's sub-block: `g = −1` is 0xff, whose bit
//!   7 makes the byte 0; `g = 0` reads byte `2 j`, `g = 1` byte `2 j + 1`: `u = 8 m_j (g + 1)`, in `0..=240`,
//!   unsigned.
//! - The correction `c_j = m_j (δ_j − 8)` (`−7 m_j` or `−9 m_j`, `|c_j| ≤ 135`) in i16 lanes `2 j` and `2 j + 1`.
//!
//! Per activation row: `p = vpmaddwd(bsums, c)` (the row's 16 sums of 16 values: i32 lane `j` is `c_j X_j`, `X_j`
//! the sum of sub-block `j`'s 32 activations, `|c_j X_j| ≤ 135·32·127`), then `p = vpdpbusd(p, u, x)` over the four
//! registers, one instruction per 64 elements: `S = Σ_j 8 m_j Σ_{i∈j} (g_i + 1) x_i + Σ_j m_j (δ_j − 8) X_j =
//! Σ_j m_j Σ_{i∈j} (8 g_i + δ_j) x_i`, the reference's integer. Every partial sum is at most
//! `8·135·32·127 + 256·240·127 < 2^24` in magnitude (an i32 lane: `2·135·16·127 + 16·240·127`), exact in any order.
//!
//! Then, every type, per (row, weight row) the lanes are summed and, in floats, as the reference:
//! `acc = fma((dw * dx) * 0.125, S, acc)`, blocks in order.
//!
//! Weight rows are taken [`COLS`] at a time (one f32 lane each in the float steps); every activation row (1..=7)
//! runs against each decoded block before the next.

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

use super::act::ActQ;
use super::avx2::reduce8;
use super::avx512_iquant::{codes, grid_codes, sign_masks, Codes};
use super::avx512_iquant2::{iq2s_indices, scales16};
use super::avx512_kquant::{fold, prefetch};
use super::{ChunkKernel, CpuWeight, Out};

/// The few-row kernel of IQ2_XXS, IQ2_XS, IQ2_S or IQ1_S: activation rows `1..8` over output columns `c0..c1`.
pub(super) fn chunk_kernel(dtype: DType) -> Option<ChunkKernel> {
    Some(match dtype {
        DType::IQ2XXS => few_rows::<IQ2XXS>,
        DType::IQ2XS => few_rows::<IQ2XS>,
        DType::IQ2S => few_rows::<IQ2S>,
        DType::IQ1S => few_rows::<IQ1S>,
        _ => return None,
    })
}

/// A layout the few-row kernel runs: a block decoded once, then its integer sum `S` against each activation row.
trait Rows {
    const BYTES: usize;
    /// One decoded block.
    type Block;
    /// Decodes the block at `blk` (see the module docs).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `blk` points at a whole block.
    unsafe fn decode(blk: *const u8) -> Self::Block;
    /// The decoded block's `S` against one activation row as eight i32 lanes to be summed (`x`: the row's 256
    /// values of this block, `bs`: their 16 sums of 16).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `x` points at 256 values, `bs` at 16.
    unsafe fn dot(b: &Self::Block, x: *const i8, bs: *const i16) -> __m256i;
}

/// A layout of 32 grid entries of 8 values (8, 25, 43) per block, with signs and sub-block scales.
trait Iq2 {
    const BYTES: usize;
    /// Sub-blocks per block: 8 of 32 elements or 16 of 16.
    const SUBS: usize;
    /// The block at `blk` as: the split codes of its 32 grid entries (u16 lanes, [`split_codes`]); the sign masks of
    /// elements `64 c..64 c + 64` (bit `i`: element `64 c + i` is negative); the multipliers `1 + 2 sc_j` as i32
    /// lanes `0..SUBS` (the others any value).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `blk` points at a whole block.
    unsafe fn parts(blk: *const u8) -> (__m512i, [u64; 4], __m512i);
}

struct IQ2XXS;
struct IQ2XS;
struct IQ2S;
struct IQ1S;

/// A grid of eight values 8, 25 or 43 per entry as split codes: value `k`'s index in `XXS2_VALUES` at bit
/// `8 (k % 2) + 2 (k / 2)`.
const fn split_codes<const N: usize>(grid: &[u64; N]) -> Codes<N> {
    grid_codes(grid, true)
}

static SPLIT_2XXS: Codes<256> = split_codes(&IQ2XXS_GRID);
static SPLIT_2XS: Codes<512> = split_codes(&IQ2XS_GRID);
static SPLIT_2S: Codes<1024> = split_codes(&IQ2S_GRID);

/// `[4][32]` `vpermw` indices: register `c`'s u16 lane `m` reads entry `8 c + m / 4`.
static SPREAD: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut m = 0;
        while m < 32 {
            t[c][m] = (8 * c + m / 4) as u16;
            m += 1;
        }
        c += 1;
    }
    t
};

/// `[2][4][16]` `vpermd` indices of the multipliers: with 8 sub-blocks (`[0]`) register `c`'s i32 lane `l` reads
/// multiplier `2 c + l / 8`, with 16 (`[1]`) multiplier `4 c + l / 4`.
static SUB_OF_LANE: [[[i32; 16]; 4]; 2] = {
    let mut t = [[[0i32; 16]; 4]; 2];
    let mut c = 0;
    while c < 4 {
        let mut l = 0;
        while l < 16 {
            t[0][c][l] = (2 * c + l / 8) as i32;
            t[1][c][l] = (4 * c + l / 4) as i32;
            l += 1;
        }
        c += 1;
    }
    t
};

/// Per byte `k` of each 8-byte entry: the low bit of value `k`'s code in the split layout (`1 << 2 (k / 2)`).
const BIT0: i64 = 0x4040_1010_0404_0101;
/// Per byte `k` of each 8-byte entry: the high bit of value `k`'s code (`2 << 2 (k / 2)`).
const BIT1: i64 = (0x8080_2020_0808_0202u64) as i64;

/// One decoded block: `g` the 256 unsigned grid values (bytes, element order, 64 per register), `neg` the sign
/// mask of each register, `m` per register the multiplier of each i32 lane's four elements (high i16 zero).
struct Block {
    g: [__m512i; 4],
    neg: [u64; 4],
    m: [__m512i; 4],
}

/// Decodes the block at `blk` (see the module docs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode<T: Iq2>(blk: *const u8) -> Block {
    let (codes, neg, m32) = T::parts(blk);
    let (bit0, bit1) = (_mm512_set1_epi64(BIT0), _mm512_set1_epi64(BIT1));
    let (v8, v25, v43) = (_mm512_set1_epi8(8), _mm512_set1_epi8(25), _mm512_set1_epi8(43));
    let g = std::array::from_fn(|c| {
        let spread = _mm512_permutexvar_epi16(_mm512_loadu_si512(SPREAD[c].as_ptr() as *const __m512i), codes);
        let (b0, b1) = (_mm512_test_epi8_mask(spread, bit0), _mm512_test_epi8_mask(spread, bit1));
        // Codes 0, 1, 2 (never 3): 8, 25, 43.
        _mm512_mask_blend_epi8(b1, _mm512_mask_blend_epi8(b0, v8, v25), v43)
    });
    let sub = &SUB_OF_LANE[(T::SUBS == 16) as usize];
    // Multipliers are at most 31: as i32 lanes their high i16 is zero.
    let m =
        std::array::from_fn(|c| _mm512_permutexvar_epi32(_mm512_loadu_si512(sub[c].as_ptr() as *const __m512i), m32));
    Block { g, neg, m }
}

impl<T: Iq2> Rows for T {
    const BYTES: usize = T::BYTES;
    type Block = Block;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> Block {
        decode::<T>(blk)
    }

    /// `S = Σ_q vpdpwssd(vpdpbusd(0, g_q, ±x_q), m_q)` (the bsums are not used).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot(b: &Block, x: *const i8, _bs: *const i16) -> __m256i {
        let z = _mm512_setzero_si512();
        let mut p = z;
        for q in 0..4 {
            let xv = _mm512_loadu_si512(x.add(64 * q) as *const __m512i);
            let xs = _mm512_mask_sub_epi8(xv, b.neg[q], z, xv);
            p = _mm512_dpwssd_epi32(p, _mm512_dpbusd_epi32(z, b.g[q], xs), b.m[q]);
        }
        fold(p)
    }
}

impl Iq2 for IQ2XXS {
    const BYTES: usize = 66;
    const SUBS: usize = 8;
    /// Layout: `d` (f16), then per sub-block `j` two u32 at `2 + 8 j`: the grid indices of its four 8-element
    /// groups (one byte each), and `aux_j`: scale `aux_j >> 28`, signs of group `k` `KSIGNS_IQ2XS[(aux_j >> 7 k)
    /// & 127]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn parts(blk: *const u8) -> (__m512i, [u64; 4], __m512i) {
        // `[8]` (index word, aux word) pairs as u64 lanes.
        let v = _mm512_loadu_si512(blk.add(2) as *const __m512i);
        let idx = _mm512_cvtepu8_epi16(_mm512_cvtepi64_epi32(v));
        let aux = _mm512_cvtepi64_epi32(_mm512_srli_epi64::<32>(v));
        let sc = _mm256_srli_epi32::<28>(aux);
        let m = _mm256_add_epi32(_mm256_add_epi32(sc, sc), _mm256_set1_epi32(1));
        (codes(&SPLIT_2XXS, idx), sign_masks(aux), _mm512_castsi256_si512(m))
    }
}

impl Iq2 for IQ2XS {
    const BYTES: usize = 74;
    const SUBS: usize = 16;
    /// Layout: `d` (f16), `qs[32]` (u16) at 2: group `g`'s grid index `qs[g] & 511`, its signs
    /// `KSIGNS_IQ2XS[qs[g] >> 9]`; `scales[8]` at 66 (sub-block `j` of 16: nibble `(scales[j / 2] >> 4 (j % 2)) & 15`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn parts(blk: *const u8) -> (__m512i, [u64; 4], __m512i) {
        // `[32]` u16 words, one per group of 8 elements.
        let q = _mm512_loadu_si512(blk.add(2) as *const __m512i);
        let idx = _mm512_and_si512(q, _mm512_set1_epi16(511));
        // The 7-bit sign field of each group (u16 lanes), its parity in bit 0 of `p`, the sign byte
        // `f | parity << 7` (`KSIGNS_IQ2XS[f]`), 32 bytes in group order: the 256 sign bits in element order.
        let f = _mm512_srli_epi16::<9>(q);
        let p = _mm512_xor_si512(f, _mm512_srli_epi16::<4>(f));
        let p = _mm512_xor_si512(p, _mm512_srli_epi16::<2>(p));
        let p = _mm512_xor_si512(p, _mm512_srli_epi16::<1>(p));
        let s = _mm512_or_si512(f, _mm512_and_si512(_mm512_slli_epi16::<7>(p), _mm512_set1_epi16(0x80)));
        let s = _mm512_cvtepi16_epi8(s);
        let (lo, hi) = (_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let neg = [
            _mm_cvtsi128_si64(lo) as u64,
            _mm_extract_epi64::<1>(lo) as u64,
            _mm_cvtsi128_si64(hi) as u64,
            _mm_extract_epi64::<1>(hi) as u64,
        ];
        (codes(&SPLIT_2XS, idx), neg, _mm512_cvtepu16_epi32(scales16(blk.add(66))))
    }
}

impl Iq2 for IQ2S {
    const BYTES: usize = 82;
    const SUBS: usize = 16;
    /// Layout: `d` (f16), `qs[32]` at 2, `signs[32]` at 34 (element `e`'s sign bit `e % 8` of `signs[e / 8]`),
    /// `qh[8]` at 66 (group `g`'s index `qs[g] | ((qh[g / 4] >> 2 (g % 4)) & 3) << 8`), `scales[8]` at 74 (as
    /// IQ2_XS).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn parts(blk: *const u8) -> (__m512i, [u64; 4], __m512i) {
        let signs = blk.add(34);
        let neg = std::array::from_fn(|c| (signs.add(8 * c) as *const u64).read_unaligned());
        (codes(&SPLIT_2S, iq2s_indices(blk)), neg, _mm512_cvtepu16_epi32(scales16(blk.add(74))))
    }
}

/// One decoded IQ1_S block: `u` the 256 bytes `8 m_j (g + 1)` (element order, 64 per register), `c` the
/// corrections `m_j (δ_j − 8)` in i16 lanes `2 j` and `2 j + 1`.
struct Block1 {
    u: [__m512i; 4],
    c: __m256i,
}

/// u16 lane `k` (group of 8 elements): the `qh` word holding its index bits, `k / 4`.
static WORD_OF_GROUP: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut k = 0;
    while k < 32 {
        t[k] = (k / 4) as u16;
        k += 1;
    }
    t
};

/// u16 lane `k`: the position of its index bits in that word, `3 (k % 4)`.
static SHIFT_OF_GROUP: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut k = 0;
    while k < 32 {
        t[k] = (3 * (k % 4)) as u16;
        k += 1;
    }
    t
};

/// `[4][64]`: byte `i` of register `c` is `2 j`, `j = 2 c + i / 32` the sub-block of element `64 c + i`.
static SUB_BYTES: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 64 {
            t[c][i] = (2 * (2 * c + i / 32)) as u8;
            i += 1;
        }
        c += 1;
    }
    t
};

impl Rows for IQ1S {
    const BYTES: usize = 50;
    type Block = Block1;

    /// Layout: `d` (f16), `qs[32]` at 2, `qh[8]` (u16) at 34: group `k`'s grid index
    /// `qs[k] | ((qh[k / 4] >> 3 (k % 4)) & 7) << 8`, sub-block `j`'s scale `(qh[j] >> 12) & 7` and delta sign
    /// bit 15 of `qh[j]` (set: −1).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn decode(blk: *const u8) -> Block1 {
        let words = _mm_loadu_si128(blk.add(34) as *const __m128i);
        // u16 lane `k`: `qs[k]`, and word `k / 4` shifted so that index bits 8..11 are bits 8..11.
        let q = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(2) as *const __m256i));
        let h = _mm512_permutexvar_epi16(
            _mm512_loadu_si512(WORD_OF_GROUP.as_ptr() as *const __m512i),
            _mm512_castsi128_si512(words),
        );
        let h = _mm512_slli_epi16::<8>(_mm512_srlv_epi16(h, _mm512_loadu_si512(SHIFT_OF_GROUP.as_ptr() as *const _)));
        // `q | (h & 0x0700)`: the 11-bit indices, then as i32 lanes (groups 0..16 and 16..32).
        let idx = _mm512_ternarylogic_epi32::<0xf8>(q, h, _mm512_set1_epi16(0x0700));
        let (lo, hi) = (
            _mm512_cvtepu16_epi32(_mm512_castsi512_si256(idx)),
            _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(idx)),
        );
        let sc = _mm_and_si128(_mm_srli_epi16::<12>(words), _mm_set1_epi16(7));
        let m = _mm_add_epi16(_mm_add_epi16(sc, sc), _mm_set1_epi16(1));
        // Bytes `2 j`, `2 j + 1` of every 128-bit lane: `8 m_j`, `16 m_j`.
        let t = _mm512_broadcast_i32x4(_mm_mullo_epi16(m, _mm_set1_epi16(0x1008)));
        let u = std::array::from_fn(|c| {
            let i = match c {
                0 => _mm512_castsi512_si256(lo),
                1 => _mm512_extracti64x4_epi64::<1>(lo),
                2 => _mm512_castsi512_si256(hi),
                _ => _mm512_extracti64x4_epi64::<1>(hi),
            };
            // Entries 8 c..8 c + 8: 64 grid bytes (0xff, 0, 1) in element order.
            let g = _mm512_i32gather_epi64::<8>(i, IQ1S_GRID.as_ptr() as *const _);
            _mm512_shuffle_epi8(t, _mm512_or_si512(g, _mm512_loadu_si512(SUB_BYTES[c].as_ptr() as *const __m512i)))
        });
        // δ_j − 8 = −7 − 2 (bit 15 of `qh[j]`), times `m_j`, each in two i16 lanes.
        let e = _mm_add_epi16(_mm_slli_epi16::<1>(_mm_srai_epi16::<15>(words)), _mm_set1_epi16(-7));
        let dup = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        let c = _mm256_permutexvar_epi16(dup, _mm256_castsi128_si256(_mm_mullo_epi16(m, e)));
        Block1 { u, c }
    }

    /// `S = vpmaddwd(bsums, c) + Σ_q vpdpbusd(u_q, x_q)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dot(b: &Block1, x: *const i8, bs: *const i16) -> __m256i {
        let mut p = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_loadu_si256(bs as *const __m256i), b.c));
        for q in 0..4 {
            p = _mm512_dpbusd_epi32(p, b.u[q], _mm512_loadu_si512(x.add(64 * q) as *const __m512i));
        }
        fold(p)
    }
}

/// Weight rows per group: the f32 lanes of the float steps.
const COLS: usize = 8;

fn few_rows<T: Rows>(w: &CpuWeight, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (bytes, rb, nb, rows) = (w.bytes(), w.row_bytes, act.nb, act.rows);
    assert!(act.block == 256 && rb == nb * T::BYTES && c0 <= c1 && c1 * rb <= bytes.len(), "few rows: weight");
    assert!((1..8).contains(&rows) && act.qs.len() == rows * act.k, "few rows: activations");
    assert!(act.d_t.len() == rows * nb && act.sums.len() == rows * nb * 16, "few rows: activation blocks");
    assert!(c1 <= out.stride && rows <= out.rows, "few rows: output");
    crate::simd::prefetch_l2(&bytes[c0 * rb..(c0 + COLS).min(c1) * rb]);
    for g0 in (c0..c1).step_by(COLS) {
        let live = (c1 - g0).min(COLS);
        // Lane `c`: weight row `g0 + c`, the last live one repeated past the chunk's end (its results dropped).
        let cols: [*const u8; COLS] = std::array::from_fn(|c| bytes[(g0 + c.min(live - 1)) * rb..].as_ptr());
        // SAFETY: `Kernel::Chunk` is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; every
        // column holds `nb` blocks, `act` every row's data and `out` rows `rows` of columns `g0..g0 + live`
        // (asserts above; the grid indices are below the code tables' and `IQ1S_GRID`'s lengths by construction);
        // this task owns columns `c0..c1` of `out`.
        unsafe {
            let dst = out.ptr.get().add(g0);
            let (stride, ahead) = (out.stride, COLS * rb);
            match rows {
                1 => group::<T, 1>(&cols, act, dst, stride, live, ahead),
                2 => group::<T, 2>(&cols, act, dst, stride, live, ahead),
                3 => group::<T, 3>(&cols, act, dst, stride, live, ahead),
                4 => group::<T, 4>(&cols, act, dst, stride, live, ahead),
                5 => group::<T, 5>(&cols, act, dst, stride, live, ahead),
                6 => group::<T, 6>(&cols, act, dst, stride, live, ahead),
                _ => group::<T, 7>(&cols, act, dst, stride, live, ahead),
            }
        }
    }
}

/// The `R` activation rows against the weight rows `cols`, into the first `live` columns from `dst` of rows
/// `0..R` (`stride` apart); `ahead`: bytes from a weight row to the same row of the next group (prefetched).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group<T: Rows, const R: usize>(
    cols: &[*const u8; COLS],
    act: &ActQ,
    dst: *mut f32,
    stride: usize,
    live: usize,
    ahead: usize,
) {
    let (k, nb) = (act.k, act.nb);
    // `[R]` accumulators, lane `c` weight row `c`.
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // `[R]` activation blocks of 256 values, and their 16 sums of 16.
        let x: [*const i8; R] = std::array::from_fn(|r| act.qs.as_ptr().add(r * k + 256 * b));
        let bs: [*const i16; R] = std::array::from_fn(|r| act.sums.as_ptr().add((r * nb + b) * 16));
        // `[R][COLS]`: eight i32 lanes whose sum is `S` of row `r` against weight row `c`.
        let mut s = [[_mm256_setzero_si256(); COLS]; R];
        // `[COLS]` f16 `d` of the weight rows' blocks.
        let mut d = [0u16; COLS];
        for c in 0..COLS {
            let blk = cols[c].add(b * T::BYTES);
            prefetch(blk.wrapping_add(ahead), T::BYTES);
            d[c] = (blk as *const u16).read_unaligned();
            let block = T::decode(blk);
            for r in 0..R {
                s[r][c] = T::dot(&block, x[r], bs[r]);
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr() as *const __m128i));
        for r in 0..R {
            let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(b * R + r));
            let ddx = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_set1_ps(0.125));
            acc[r] = _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(reduce8(&s[r])), acc[r]);
        }
    }
    let mask = ((1u32 << live) - 1) as __mmask8;
    for (r, &a) in acc.iter().enumerate() {
        _mm256_mask_storeu_ps(dst.add(r * stride), mask, a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::matmul::iquant_test_util::{
        activations, assert_chunk, assert_matmul, assert_rows_exact, blocks, reference, seeded,
    };
    use rand::Rng;

    /// The split code lookups and bit tests give every grid entry's bytes, for every index of the three grids.
    #[test]
    fn split_codes_give_the_grids() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for start in (0..1024).step_by(32) {
            let idx: [u16; 32] = std::array::from_fn(|i| (start + i) as u16);
            // `[3][32]` grid entries (IQ2_XXS, IQ2_XS, IQ2_S), 8 bytes each.
            let mut got = [[0u64; 32]; 3];
            // SAFETY: AVX-512 checked above; every index is masked below its table's length.
            unsafe {
                let v = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
                let all = [
                    codes(&SPLIT_2XXS, _mm512_and_si512(v, _mm512_set1_epi16(255))),
                    codes(&SPLIT_2XS, _mm512_and_si512(v, _mm512_set1_epi16(511))),
                    codes(&SPLIT_2S, v),
                ];
                let (bit0, bit1) = (_mm512_set1_epi64(BIT0), _mm512_set1_epi64(BIT1));
                for (t, &cv) in all.iter().enumerate() {
                    for c in 0..4 {
                        let sp = _mm512_permutexvar_epi16(_mm512_loadu_si512(SPREAD[c].as_ptr() as *const _), cv);
                        let (b0, b1) = (_mm512_test_epi8_mask(sp, bit0), _mm512_test_epi8_mask(sp, bit1));
                        let g = _mm512_mask_blend_epi8(
                            b1,
                            _mm512_mask_blend_epi8(b0, _mm512_set1_epi8(8), _mm512_set1_epi8(25)),
                            _mm512_set1_epi8(43),
                        );
                        _mm512_storeu_si512(got[t][8 * c..].as_mut_ptr() as *mut __m512i, g);
                    }
                }
            }
            for (i, ((&xxs, &xs), &s)) in got[0].iter().zip(&got[1]).zip(&got[2]).enumerate() {
                let e = start + i;
                assert_eq!(xxs, IQ2XXS_GRID[e & 255], "IQ2_XXS entry {}", e & 255);
                assert_eq!(xs, IQ2XS_GRID[e & 511], "IQ2_XS entry {}", e & 511);
                assert_eq!(s, IQ2S_GRID[e], "IQ2_S entry {e}");
            }
        }
    }

    /// An IQ1_S block with group `k`'s grid index `idx[k]`, sub-block `j`'s scale `sc[j]` and delta sign
    /// `neg[j]`, `d` the f16 bits.
    fn iq1s_block(d: u16, idx: &[usize; 32], sc: &[u16; 8], neg: &[bool; 8]) -> [u8; 50] {
        let mut blk = [0u8; 50];
        blk[..2].copy_from_slice(&d.to_le_bytes());
        for (k, &i) in idx.iter().enumerate() {
            blk[2 + k] = i as u8;
        }
        for j in 0..8 {
            let high = (0..4).fold(0u16, |h, k| h | ((idx[4 * j + k] >> 8) as u16) << (3 * k));
            let h = high | sc[j] << 12 | if neg[j] { 0x8000 } else { 0 };
            blk[34 + 2 * j..36 + 2 * j].copy_from_slice(&h.to_le_bytes());
        }
        blk
    }

    /// The IQ1_S decode gives `u = 8 m_j (g + 1)` for every grid entry in every sub-block position, every scale,
    /// and the corrections `m_j (δ_j − 8)` for both delta signs.
    #[test]
    fn iq1s_decode_gives_the_grid_values() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for n in 0..2048 / 32 {
            let idx: [usize; 32] = std::array::from_fn(|k| 32 * n + (k + 5 * n) % 32);
            let sc: [u16; 8] = std::array::from_fn(|j| ((j + n) % 8) as u16);
            let neg: [bool; 8] = std::array::from_fn(|j| (j + n) % 2 == 1);
            let blk = iq1s_block(0x3c00, &idx, &sc, &neg);
            let (mut u, mut c) = ([[0u8; 64]; 4], [0i16; 16]);
            // SAFETY: AVX-512 checked above; `blk` is a whole block.
            unsafe {
                let b = <IQ1S as Rows>::decode(blk.as_ptr());
                for (q, &v) in b.u.iter().enumerate() {
                    _mm512_storeu_si512(u[q].as_mut_ptr() as *mut __m512i, v);
                }
                _mm256_storeu_si256(c.as_mut_ptr() as *mut __m256i, b.c);
            }
            for e in 0..256 {
                let (j, g) = (e / 32, (IQ1S_GRID[idx[e / 8]] >> (8 * (e % 8))) as u8 as i8 as i32);
                let m = 1 + 2 * sc[j] as i32;
                assert_eq!(u[e / 64][e % 64] as i32, 8 * m * (g + 1), "block {n} element {e}");
            }
            for (l, &cl) in c.iter().enumerate() {
                let j = l / 2;
                let delta = if neg[j] { -1 } else { 1 };
                assert_eq!(cl as i32, (1 + 2 * sc[j] as i32) * (delta - 8), "block {n} lane {l}");
            }
        }
    }

    const TYPES: [(DType, usize); 4] = [
        (DType::IQ2XXS, <IQ2XXS as Rows>::BYTES),
        (DType::IQ2XS, <IQ2XS as Rows>::BYTES),
        (DType::IQ2S, <IQ2S as Rows>::BYTES),
        (DType::IQ1S, <IQ1S as Rows>::BYTES),
    ];

    /// Blocks at the bounds of the integer sums and random blocks, 1..=7 activation rows, ragged column ranges:
    /// the few-row kernel equals the reference bit for bit, leaves the columns outside its range alone, and the
    /// whole matmul (which runs it below 8 rows, the chunk kernel from 8) does too, for 1..=17 rows.
    #[test]
    fn extreme_and_random_blocks_equal_the_reference() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        for (dtype, bytes) in TYPES {
            assert_eq!(dtype.block_bytes(), bytes);
            for case in 0..40 {
                let (nb, out, rows) = (rng.gen_range(1..4), [8, 21, 40, 3][case % 4], 1 + case % 7);
                let extreme = (case / 3) % 4;
                let w = blocks(&mut rng, dtype, out * nb, extreme);
                let k = 256 * nb;
                let x = activations(&mut rng, rows, k, extreme);
                let want = reference(&x, rows, dtype, &w, out, k);
                let act = ActQ::new(Isa::Avx512, &x, rows, k, 256);
                let c0 = rng.gen_range(0..out);
                let c1 = rng.gen_range(c0 + 1..=out);
                let what = format!("case {case} (TF_SEED={seed})");
                assert_chunk(chunk_kernel(dtype).unwrap(), dtype, &w, out, &act, (c0, c1), &want, &what);
                let rows = rows + 10 * (case % 2);
                let x = activations(&mut rng, rows, k, extreme);
                let want = reference(&x, rows, dtype, &w, out, k);
                assert_matmul(dtype, &w, out, &x, rows, &want, &what);
            }
        }
    }

    /// IQ1_S blocks whose sub-blocks take every scale 0..=7 and both delta signs, with groups of the entry of all
    /// −1 (index 0), all +1 (index 2047) and random entries, so that every value −9, −7, −1, 1, 7, 9 meets every
    /// multiplier; activations all 127, rows alternately ±127, or random; 1..=7 rows over all columns and a ragged
    /// range: the few-row kernel and the whole matmul equal the reference bit for bit.
    #[test]
    fn iq1s_every_scale_and_delta_equals_the_reference() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        for case in 0..21 {
            let (nb, out, rows) = (1 + case % 2, [8, 21, 40][case % 3], 1 + case % 7);
            let extreme = [1, 3, 0][(case / 7) % 3];
            let mut w = Vec::with_capacity(out * nb * 50);
            for n in 0..out * nb {
                let idx: [usize; 32] = std::array::from_fn(|k| match (k + n) % 3 {
                    0 => 0,
                    1 => 2047,
                    _ => rng.gen_range(0..2048),
                });
                let sc: [u16; 8] = std::array::from_fn(|j| ((j + n) % 8) as u16);
                let neg: [bool; 8] = std::array::from_fn(|j| (j / 2 + n) % 2 == 1);
                w.extend_from_slice(&iq1s_block(0x3c00 + rng.gen_range(0..0x400), &idx, &sc, &neg));
            }
            let k = 256 * nb;
            let x = activations(&mut rng, rows, k, extreme);
            let want = reference(&x, rows, DType::IQ1S, &w, out, k);
            let act = ActQ::new(Isa::Avx512, &x, rows, k, 256);
            let what = format!("mixed case {case} (TF_SEED={seed})");
            let c0 = rng.gen_range(0..out);
            let c1 = rng.gen_range(c0 + 1..=out);
            for range in [(0, out), (c0, c1)] {
                assert_chunk(few_rows::<IQ1S>, DType::IQ1S, &w, out, &act, range, &want, &what);
            }
            assert_matmul(DType::IQ1S, &w, out, &x, rows, &want, &what);
        }
    }

    /// Row-exactness: each of 17 activation rows gives the reference's bits whether the call has 1, 2, …, 17 rows
    /// (this kernel below 8 rows, the chunk kernel from 8).
    #[test]
    fn a_row_is_the_same_whatever_the_row_count() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        for (dtype, _) in TYPES {
            assert_rows_exact(&mut rng, seed, dtype, 3, 45, 17);
        }
    }
}
