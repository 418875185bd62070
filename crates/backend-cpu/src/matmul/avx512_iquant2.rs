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
//!   `1 + 2 sc_j` (≤ 15): both the tile kernels (`4·18·127` fits an i16) and the chunk kernel.
//!
//! All three scale `S` by `(dw * dx) * 0.125` as the reference.

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID};

use super::avx512_iquant::{
    chunk, codes, crumb_codes, crumbs_to_bytes, entry, ksigns, lane_ids, offset_signed, Codes, GridQuant, XXS2_VALUES,
};
use super::{ChunkKernel, QuantKernel};

/// The AVX-512 chunk kernel of IQ2_XS, IQ2_S or IQ1_S: `avx512_iquant`'s from 8 activation rows, tile kernels
/// below.
pub(super) fn chunk_kernel(dtype: DType) -> Option<ChunkKernel> {
    Some(match dtype {
        DType::IQ2XS => chunk::<IQ2XS>,
        DType::IQ2S => chunk::<IQ2S>,
        DType::IQ1S => chunk::<IQ1S>,
        _ => return None,
    })
}

/// The AVX-512 tile kernel of IQ1_S (IQ2_XS and IQ2_S have none: their `u` exceeds the tile kernels' i16 pairs;
/// `avx512_iquant_rows` runs them below 8 activation rows).
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::IQ1S => entry::<IQ1S>,
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
    use crate::matmul::act::ActQ;
    use crate::matmul::{matmul, CpuWeight};
    use crate::Pool;
    use rand::{Rng, SeedableRng};
    use tf_core::{Precision, Tensor, TensorInfo};
    use tf_quant::reference::matmul::matmul_ref;

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

    /// `[out * nb]` blocks of `dtype`: random bytes with a finite `d`, or (`extreme` 1, 2) every group the grid
    /// entry of the largest values, every scale the largest, all signs (deltas) positive (1) or negative (2).
    fn blocks(rng: &mut impl Rng, dtype: DType, bytes: usize, count: usize, extreme: usize) -> Vec<u8> {
        let sum = |g: u64| g.to_le_bytes().iter().map(|&b| b as i8 as i32).sum::<i32>();
        let max2xs = (0..512).max_by_key(|&i| sum(IQ2XS_GRID[i])).unwrap();
        let max2s = (0..1024).max_by_key(|&i| sum(IQ2S_GRID[i])).unwrap();
        let (max1s, min1s) = (
            (0..2048).max_by_key(|&i| sum(IQ1S_GRID[i])).unwrap(),
            (0..2048).min_by_key(|&i| sum(IQ1S_GRID[i])).unwrap(),
        );
        let mut w = vec![0u8; count * bytes];
        rng.fill(&mut w[..]);
        for blk in w.chunks_exact_mut(bytes) {
            blk[..2].copy_from_slice(&(0x3c00u16 + rng.gen_range(0..0x400)).to_le_bytes());
            if extreme == 0 {
                continue;
            }
            let sign = if extreme == 1 { 0x00 } else { 0xff };
            match dtype {
                DType::IQ2XS => {
                    let q = max2xs as u16 | if sign == 0 { 0 } else { 127 << 9 };
                    for g in 0..32 {
                        blk[2 + 2 * g..4 + 2 * g].copy_from_slice(&q.to_le_bytes());
                    }
                    blk[66..74].fill(0xff);
                }
                DType::IQ2S => {
                    blk[2..34].fill(max2s as u8);
                    blk[34..66].fill(sign);
                    blk[66..74].fill(((max2s >> 8) as u8) * 0b0101_0101);
                    blk[74..82].fill(0xff);
                }
                _ => {
                    // All +1 with delta +1, or all −1 with delta −1: every value ±9.
                    let i = if sign == 0 { max1s } else { min1s };
                    blk[2..34].fill(i as u8);
                    // The index's high bits for each of the 4 groups, scale 7, the delta's sign.
                    let high = ((i >> 8) as u16) * 0b10_0100_1001;
                    let h = high | (7 << 12) | if sign == 0 { 0 } else { 0x8000 };
                    for j in 0..8 {
                        blk[34 + 2 * j..36 + 2 * j].copy_from_slice(&h.to_le_bytes());
                    }
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

    const TYPES: [(DType, usize); 3] = [(DType::IQ2XS, IQ2XS::BYTES), (DType::IQ2S, IQ2S::BYTES), (DType::IQ1S, 50)];

    /// Blocks at the bounds of the integer sums and random blocks, 1..=17 activation rows: the IQ1_S tile kernels
    /// (1, 2, 4 and 8 rows) and the whole matmul (the chunk kernel from 8 rows, with ragged groups of 16 weight
    /// rows) equal the reference bit for bit.
    #[test]
    fn extreme_and_random_blocks_equal_the_reference() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        assert_eq!(std::mem::size_of::<tf_quant::BlockIQ1S>(), IQ1S::BYTES);
        for (dtype, bytes) in TYPES {
            let kernel = kernel(dtype);
            assert_eq!(kernel.is_some(), dtype == DType::IQ1S);
            for case in 0..34 {
                let (nb, out, rows) = (rng.gen_range(1..4), [8, 21, 40][case % 3], 1 + case % 17);
                let extreme = case % 4;
                let w = blocks(&mut rng, dtype, bytes, out * nb, extreme);
                let k = 256 * nb;
                let x = activations(&mut rng, rows, k, extreme);
                let want = matmul_ref(Precision::Checkpoint, &x, rows, dtype, &w, out, k, None);
                let act = ActQ::new(Isa::Avx512, &x, rows, k, 256);
                let row = |c: usize| &w[c * nb * bytes..(c + 1) * nb * bytes];
                for rt in if kernel.is_some() { &[1, 2, 4, 8][..] } else { &[] } {
                    let (kernel, rt) = (kernel.unwrap(), *rt);
                    for r0 in (0..rows - rows % rt).step_by(rt) {
                        for s0 in (0..out).step_by(8 / rt) {
                            let cols: [&[u8]; 8] = std::array::from_fn(|i| row((s0 + i).min(out - 1)));
                            let got = kernel(&cols, &act, r0, rt);
                            for ci in 0..(8 / rt).min(out - s0) {
                                for ri in 0..rt {
                                    let want = want[(r0 + ri) * out + s0 + ci];
                                    assert_eq!(
                                        got[ci * rt + ri].to_bits(),
                                        want.to_bits(),
                                        "{dtype} case {case} rt={rt} row {} col {} (TF_SEED={seed})",
                                        r0 + ri,
                                        s0 + ci
                                    );
                                }
                            }
                        }
                    }
                }
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
    /// (tile or AVX2 kernels below 8 rows, the chunk kernel from 8).
    #[test]
    fn a_row_is_the_same_whatever_the_row_count() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let (seed, mut rng) = seeded();
        let (nb, out, rows) = (2, 37, 17);
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
