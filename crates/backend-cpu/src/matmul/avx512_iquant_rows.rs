//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for IQ2_XXS, IQ2_XS and IQ2_S below 8 activation rows (decode
//! steps, short verify windows), where `avx512_iquant`'s chunk kernel would decode 16 weight rows per group for
//! too few rows: here each block of a weight row is decoded once into four registers and used by every row.
//!
//! Decoding one block (256 elements, 32 grid entries of 8 values `g` in 8, 25, 43):
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
//! integer, `|S| ≤ 256·43·127·31 < 2^26`, exact in any order. Then per (row, weight row) the 16 lanes are summed
//! and, in floats, as the reference: `acc = fma((dw * dx) * 0.125, S, acc)`, blocks in order.
//!
//! Weight rows are taken [`COLS`] at a time (one f32 lane each in the float steps); every activation row (1..=7)
//! runs against each decoded block before the next.

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};

use super::act::ActQ;
use super::avx2::reduce8;
use super::avx512_iquant::{codes, sign_masks, Codes, XXS2_VALUES};
use super::avx512_iquant2::{iq2s_indices, scales16};
use super::avx512_kquant::{fold, prefetch};
use super::{ChunkKernel, CpuWeight, Out};

/// The few-row kernel of IQ2_XXS, IQ2_XS or IQ2_S: activation rows `1..8` over output columns `c0..c1`.
pub(super) fn chunk_kernel(dtype: DType) -> Option<ChunkKernel> {
    Some(match dtype {
        DType::IQ2XXS => few_rows::<IQ2XXS>,
        DType::IQ2XS => few_rows::<IQ2XS>,
        DType::IQ2S => few_rows::<IQ2S>,
        _ => return None,
    })
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

/// A grid of eight values 8, 25 or 43 per entry as split codes: value `k`'s index in `XXS2_VALUES` at bit
/// `8 (k % 2) + 2 (k / 2)`.
const fn split_codes<const N: usize>(grid: &[u64; N]) -> Codes<N> {
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
            t[i] |= (c as u16) << (8 * (k % 2) + 2 * (k / 2));
            k += 1;
        }
        i += 1;
    }
    Codes(t)
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

/// Weight rows per group: the f32 lanes of the float steps.
const COLS: usize = 8;

fn few_rows<T: Iq2>(w: &CpuWeight, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (bytes, rb, nb, rows) = (w.bytes(), w.row_bytes, act.nb, act.rows);
    assert!(act.block == 256 && rb == nb * T::BYTES && c0 <= c1 && c1 * rb <= bytes.len(), "IQ2 rows: weight");
    assert!((1..8).contains(&rows) && act.qs.len() == rows * act.k && act.d_t.len() == rows * nb, "IQ2 rows: act");
    assert!(c1 <= out.stride && rows <= out.rows, "IQ2 rows: output");
    crate::simd::prefetch_l2(&bytes[c0 * rb..(c0 + COLS).min(c1) * rb]);
    for g0 in (c0..c1).step_by(COLS) {
        let live = (c1 - g0).min(COLS);
        // Lane `c`: weight row `g0 + c`, the last live one repeated past the chunk's end (its results dropped).
        let cols: [*const u8; COLS] = std::array::from_fn(|c| bytes[(g0 + c.min(live - 1)) * rb..].as_ptr());
        // SAFETY: `Kernel::Chunk` is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; every
        // column holds `nb` blocks, `act` every row's data and `out` rows `rows` of columns `g0..g0 + live`
        // (asserts above; the grid indices are below the code tables' lengths by construction); this task owns
        // columns `c0..c1` of `out`.
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
unsafe fn group<T: Iq2, const R: usize>(
    cols: &[*const u8; COLS],
    act: &ActQ,
    dst: *mut f32,
    stride: usize,
    live: usize,
    ahead: usize,
) {
    let (k, nb) = (act.k, act.nb);
    let z = _mm512_setzero_si512();
    // `[R]` accumulators, lane `c` weight row `c`.
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // `[R]` activation blocks of 256 values.
        let x: [*const i8; R] = std::array::from_fn(|r| act.qs.as_ptr().add(r * k + 256 * b));
        // `[R][COLS]`: eight i32 lanes whose sum is `S` of row `r` against weight row `c`.
        let mut s = [[_mm256_setzero_si256(); COLS]; R];
        // `[COLS]` f16 `d` of the weight rows' blocks.
        let mut d = [0u16; COLS];
        for c in 0..COLS {
            let blk = cols[c].add(b * T::BYTES);
            prefetch(blk.wrapping_add(ahead), T::BYTES);
            d[c] = (blk as *const u16).read_unaligned();
            let Block { g, neg, m } = decode::<T>(blk);
            for r in 0..R {
                let mut p = z;
                for q in 0..4 {
                    let xv = _mm512_loadu_si512(x[r].add(64 * q) as *const __m512i);
                    let xs = _mm512_mask_sub_epi8(xv, neg[q], z, xv);
                    p = _mm512_dpwssd_epi32(p, _mm512_dpbusd_epi32(z, g[q], xs), m[q]);
                }
                s[r][c] = fold(p);
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
    use crate::matmul::matmul;
    use crate::Pool;
    use rand::{Rng, SeedableRng};
    use tf_core::{Precision, Tensor, TensorInfo};
    use tf_quant::reference::matmul::matmul_ref;

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

    /// `[count]` blocks of `dtype`: random bytes with a finite `d`, or (`extreme` 1, 2) every group the grid entry
    /// of the largest values, every scale the largest, all signs positive (1) or negative (2).
    fn blocks(rng: &mut impl Rng, dtype: DType, bytes: usize, count: usize, extreme: usize) -> Vec<u8> {
        let sum = |g: u64| g.to_le_bytes().iter().map(|&b| b as u32).sum::<u32>();
        let max2xxs = (0..256).max_by_key(|&i| sum(IQ2XXS_GRID[i])).unwrap();
        let max2xs = (0..512).max_by_key(|&i| sum(IQ2XS_GRID[i])).unwrap();
        let max2s = (0..1024).max_by_key(|&i| sum(IQ2S_GRID[i])).unwrap();
        let mut w = vec![0u8; count * bytes];
        rng.fill(&mut w[..]);
        for blk in w.chunks_exact_mut(bytes) {
            blk[..2].copy_from_slice(&(0x3c00u16 + rng.gen_range(0..0x400)).to_le_bytes());
            if extreme == 0 {
                continue;
            }
            let sign = if extreme == 1 { 0x00 } else { 0xff };
            match dtype {
                DType::IQ2XXS => {
                    // Scale 15, sign fields all 0 or all 127 (`KSIGNS_IQ2XS[127]` = 0xff).
                    let aux = 0xf000_0000u32 | if sign == 0 { 0 } else { 0x0fff_ffff };
                    for j in 0..8 {
                        blk[2 + 8 * j..6 + 8 * j].fill(max2xxs as u8);
                        blk[6 + 8 * j..10 + 8 * j].copy_from_slice(&aux.to_le_bytes());
                    }
                }
                DType::IQ2XS => {
                    let q = max2xs as u16 | if sign == 0 { 0 } else { 127 << 9 };
                    for g in 0..32 {
                        blk[2 + 2 * g..4 + 2 * g].copy_from_slice(&q.to_le_bytes());
                    }
                    blk[66..74].fill(0xff);
                }
                _ => {
                    blk[2..34].fill(max2s as u8);
                    blk[34..66].fill(sign);
                    blk[66..74].fill(((max2s >> 8) as u8) * 0b0101_0101);
                    blk[74..82].fill(0xff);
                }
            }
        }
        w
    }

    /// `[rows * k]` activations: random, all 1 (`extreme` 1, 2), or rows alternately all 1 and all −1 (3).
    fn activations(rng: &mut impl Rng, rows: usize, k: usize, extreme: usize) -> Vec<f32> {
        (0..rows * k)
            .map(|i| match extreme {
                0 => rng.gen_range(-1.0f32..1.0),
                3 if (i / k) % 2 == 1 => -1.0,
                _ => 1.0,
            })
            .collect()
    }

    fn seeded() -> (u64, rand::rngs::StdRng) {
        let seed: u64 = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
        eprintln!("TF_SEED={seed}");
        (seed, rand::rngs::StdRng::seed_from_u64(seed))
    }

    const TYPES: [(DType, usize); 3] =
        [(DType::IQ2XXS, IQ2XXS::BYTES), (DType::IQ2XS, IQ2XS::BYTES), (DType::IQ2S, IQ2S::BYTES)];

    /// The output of the few-row kernel over columns `c0..c1` (the others NaN), `[rows][out]`.
    fn run(w: &[u8], dtype: DType, out: usize, act: &ActQ, c0: usize, c1: usize) -> Vec<f32> {
        let info = TensorInfo { name: "w".into(), dtype, shape: vec![out as u64, act.k as u64] };
        let wt = CpuWeight::from_bytes(&info, w).unwrap();
        let mut y = vec![f32::NAN; act.rows * out];
        let o = Out { ptr: crate::pool::SendPtr(y.as_mut_ptr()), rows: act.rows, stride: out };
        chunk_kernel(dtype).unwrap()(&wt, act, c0, c1, &o);
        y
    }

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
                let w = blocks(&mut rng, dtype, bytes, out * nb, extreme);
                let k = 256 * nb;
                let x = activations(&mut rng, rows, k, extreme);
                let want = matmul_ref(Precision::Checkpoint, &x, rows, dtype, &w, out, k, None);
                let act = ActQ::new(Isa::Avx512, &x, rows, k, 256);
                let c0 = rng.gen_range(0..out);
                let c1 = rng.gen_range(c0 + 1..=out);
                let got = run(&w, dtype, out, &act, c0, c1);
                for r in 0..rows {
                    for c in 0..out {
                        let (g, e) = (got[r * out + c], want[r * out + c]);
                        if (c0..c1).contains(&c) {
                            assert_eq!(
                                g.to_bits(),
                                e.to_bits(),
                                "{dtype} case {case} rows {rows} ({r}, {c}) of {c0}..{c1} (TF_SEED={seed})"
                            );
                        } else {
                            assert!(g.is_nan(), "{dtype} case {case}: column {c} outside {c0}..{c1} written");
                        }
                    }
                }
                let rows = rows + 10 * (case % 2);
                let x = activations(&mut rng, rows, k, extreme);
                let want = matmul_ref(Precision::Checkpoint, &x, rows, dtype, &w, out, k, None);
                let info = TensorInfo { name: "w".into(), dtype, shape: vec![out as u64, k as u64] };
                let wt = CpuWeight::from_bytes(&info, &w).unwrap();
                let got =
                    matmul(&Pool::new(2), Isa::Avx512, Precision::Checkpoint, &Tensor::host(rows, k, x), &wt, None);
                for (i, (g, e)) in got.host.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{dtype} case {case} rows {rows} element {i} (TF_SEED={seed})"
                    );
                }
            }
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
        let (nb, out, rows) = (3, 45, 17);
        let k = 256 * nb;
        for (dtype, bytes) in TYPES {
            let w = blocks(&mut rng, dtype, bytes, out * nb, 0);
            let x = activations(&mut rng, rows, k, 0);
            let want = matmul_ref(Precision::Checkpoint, &x, rows, dtype, &w, out, k, None);
            let info = TensorInfo { name: "w".into(), dtype, shape: vec![out as u64, k as u64] };
            let wt = CpuWeight::from_bytes(&info, &w).unwrap();
            for r in 1..=rows {
                let xt = Tensor::host(r, k, x[..r * k].to_vec());
                let got = matmul(&Pool::new(2), Isa::Avx512, Precision::Checkpoint, &xt, &wt, None);
                for (i, (g, e)) in got.host.iter().zip(&want[..r * out]).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{dtype} {r} rows: element {i} (TF_SEED={seed})");
                }
            }
        }
    }
}
