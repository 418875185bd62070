//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for the 32-element GGUF types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q8_1, IQ4_NL) in 16-lane tiles: `C` weight rows × `RT` activation rows with `C · RT = 16` (2×8, 4×4, 8×2, 16×1), the
//! integer dot of a weight block with an activation block by `vpdpbusd`, two weight rows per 512-bit register,
//! the sixteen dots reduced to one register ([`reduce16`]), then the reference's float steps on 16 lanes at once.
//!
//! Exactness: `vpdpbusd` sums four u8 × s8 products into each i32 lane without saturation, so every lane's sum
//! is the exact integer the reference forms (any grouping of an exact integer sum gives the same integer). The
//! unsigned types (quants `0..=31`) go in as the u8 operand, the activations (`-127..=127`) as the s8 one. The
//! signed Q8 types (and IQ4_NL, whose nibbles index `KVALUES_IQ4NL` by `vpshufb`) use
//! `Σ x·w = Σ x·(w + 128) − 128·Σx`: `w + 128` (`w ^ 0x80`, in `0..=255`) is the u8 operand and `128·Σx` comes
//! off the reduced sum like the `8·Σx` of Q4_0 (`Σx` is the activation block's sum; |sums| < 2^21). Then per
//! lane, in floats, exactly as the reference and `avx2_legacy`: `acc = fma(dw * dx, S, acc)`
//! (and `acc = fma(mw * dx, Σqx, acc)` for the `_1` types). Lanes never mix.
//!
//! The f16 scales of the blocks are converted by `vcvtph2ps` ([`scales16`]): exact for every value but a
//! signaling NaN, which comes out quiet — as the multiplication by the activation scale that always follows
//! would make it anyway, so the products carry the reference's bits (tested for all 65,536 values and shapes).
//!
//! Unpacking two rows at once: Q4/Q5 nibbles of rows `c` and `c + 1` are loaded into one 256-bit register,
//! spread to `[qs_c, qs_c, qs_c1, qs_c1]` (128-bit quarters), shifted by 0 / 4 per quarter and masked, which is
//! each row's 32 quants in element order; the Q5 fifth bits come from one 64-bit mask (`qh_c | qh_c1 << 32`)
//! and a masked byte add of 16.
//!
//! Speed (docs/perf-notes.md): per block and 16 outputs, one or more weight-pair unpacks, eight `vpdpbusd`, a
//! 15-21 op reduction and ~10 float ops; the next tile's rows are prefetched by the first row group only.

use std::arch::x86_64::*;

use tf_core::DType;

use super::act::ActQ;
use super::avx2::NextTile;
use super::avx2_legacy::{Legacy, IQ4NL, MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1};
use super::QuantKernel16;

/// Two rows' blocks at once.
trait Pair: Legacy {
    /// The quants of the blocks at `b0` (bytes 0..32) and `b1` (bytes 32..64), each in element order.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `b0` and `b1` point at whole blocks.
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i;
}

/// 16 bytes of nibbles at `q0` and at `q1` → 64 bytes: per row, elements 0..16 the low nibbles, 16..32 the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibbles2(q0: *const u8, q1: *const u8) -> __m512i {
    let t = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(q0 as *const __m128i)),
        _mm_loadu_si128(q1 as *const __m128i),
    );
    // Quarters [qs_c, qs_c, qs_c1, qs_c1], then shifts 0, 4, 0, 4 (per 16-bit lane) and the nibble mask.
    let z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(t));
    let s4 = 0x0004_0004_0004_0004;
    let z = _mm512_srlv_epi16(z, _mm512_setr_epi64(0, 0, s4, s4, 0, 0, s4, s4));
    _mm512_and_si512(z, _mm512_set1_epi8(0x0f))
}

/// Adds 16 to byte `i` of `w` where bit `i` of `qh_c | qh_c1 << 32` is set (the little-endian u32s at `h0`, `h1`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fifth_bits2(w: __m512i, h0: *const u8, h1: *const u8) -> __m512i {
    let m = (h0 as *const u32).read_unaligned() as u64 | ((h1 as *const u32).read_unaligned() as u64) << 32;
    _mm512_mask_add_epi8(w, m, w, _mm512_set1_epi8(16))
}

/// 32 bytes at `p0` and at `p1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn bytes2(p0: *const u8, p1: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i)),
        _mm256_loadu_si256(p1 as *const __m256i),
    )
}

impl Pair for Q4_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        nibbles2(b0.add(2), b1.add(2))
    }
}

impl Pair for Q4_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        nibbles2(b0.add(4), b1.add(4))
    }
}

impl Pair for Q5_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        fifth_bits2(nibbles2(b0.add(6), b1.add(6)), b0.add(2), b1.add(2))
    }
}

impl Pair for Q5_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        fifth_bits2(nibbles2(b0.add(8), b1.add(8)), b0.add(4), b1.add(4))
    }
}

impl Pair for Q8_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        bytes2(b0.add(2), b1.add(2))
    }
}

impl Pair for Q8_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        bytes2(b0.add(4), b1.add(4))
    }
}

impl Pair for IQ4NL {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(tf_quant::KVALUES_IQ4NL.as_ptr() as *const __m128i));
        _mm512_shuffle_epi8(table, nibbles2(b0.add(2), b1.add(2)))
    }
}

/// MXFP4: the nibbles after the scale byte, looked up in `KVALUES_MXFP4`.
impl Pair for MXFP4 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn unpack2(b0: *const u8, b1: *const u8) -> __m512i {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(tf_quant::KVALUES_MXFP4.as_ptr() as *const __m128i));
        _mm512_shuffle_epi8(table, nibbles2(b0.add(1), b1.add(1)))
    }
}

/// The 16-lane AVX-512 kernel of a legacy `dtype`, if there is one.
pub(super) fn kernel16(dtype: DType) -> Option<QuantKernel16> {
    Some(match dtype {
        DType::Q4_0 => entry16::<Q4_0>,
        DType::Q4_1 => entry16::<Q4_1>,
        DType::Q5_0 => entry16::<Q5_0>,
        DType::Q5_1 => entry16::<Q5_1>,
        DType::Q8_0 => entry16::<Q8_0>,
        DType::Q8_1 => entry16::<Q8_1>,
        DType::IQ4NL => entry16::<IQ4NL>,
        DType::MXFP4 => entry16::<MXFP4>,
        _ => return None,
    })
}

fn entry16<T: Pair>(cols: &[&[u8]; 16], act: &ActQ, r0: usize, rt: usize) -> [f32; 16] {
    assert!(act.block == 32 && r0 + rt <= act.rows, "legacy tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "legacy tile: weight rows");
    // SAFETY: this kernel is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; the asserts
    // above bound every pointer the kernel forms.
    unsafe {
        match rt {
            8 => tile16::<T, 2, 8>(cols, act, r0),
            4 => tile16::<T, 4, 4>(cols, act, r0),
            2 => tile16::<T, 8, 2>(cols, act, r0),
            1 => tile16::<T, 16, 1>(cols, act, r0),
            _ => panic!("legacy tile: {rt} rows (the 16-lane tiles take 8, 4, 2 or 1)"),
        }
    }
}

/// Sixteen i32 sums from eight vectors of two 8-lane halves: lane `ℓ` of the result is the sum of half `ℓ / 8`
/// of `v[ℓ % 8]` (exact; a transposing tree of pairwise adds, then one two-source permute).
///
/// `SMALL`: every lane of `v` is below 2^14 in magnitude, so the first two levels pack pairs of vectors to i16
/// (`vpackssdw`, exact) and add neighbours with `vpmaddwd` by ones (sums below 2^15, packed again exactly);
/// otherwise they interleave with unpacks and add in i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn reduce16<const SMALL: bool>(v: &[__m512i; 8]) -> __m512i {
    let ones = _mm512_set1_epi16(1);
    // Per 128-bit quarter, with a = v[2j], b = v[2j + 1] (four lanes each): pairs of a's lanes and of b's
    // (packs: [a0+a1, a2+a3, b0+b1, b2+b3]; unpacks: [a0+a2, b0+b2, a1+a3, b1+b3]).
    let pair = |a: __m512i, b: __m512i| {
        if SMALL {
            _mm512_madd_epi16(_mm512_packs_epi32(a, b), ones)
        } else {
            _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
        }
    };
    let w: [__m512i; 4] = std::array::from_fn(|j| pair(v[2 * j], v[2 * j + 1]));
    // Per quarter q: the quarter-q sums of v[4k], v[4k + 1], v[4k + 2], v[4k + 3] (either way).
    let x: [__m512i; 2] = std::array::from_fn(|k| {
        let (a, b) = (w[2 * k], w[2 * k + 1]);
        if SMALL {
            _mm512_madd_epi16(_mm512_packs_epi32(a, b), ones)
        } else {
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        }
    });
    // Quarters [x0.q0, x1.q0, x0.q2, x1.q2] + [x0.q1, x1.q1, x0.q3, x1.q3]: half 0 of v[0..8], then half 1.
    let lo = _mm512_permutex2var_epi64(x[0], _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), x[1]);
    let hi = _mm512_permutex2var_epi64(x[0], _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15), x[1]);
    _mm512_add_epi32(lo, hi)
}

/// Lanes `c · RT + r` ← `v[r]` for `r < RT` (16 lanes; `v` points at `RT` consecutive values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pattern16_ps<const RT: usize>(v: *const f32) -> __m512 {
    match RT {
        1 => _mm512_set1_ps(*v),
        2 => _mm512_castpd_ps(_mm512_set1_pd((v as *const f64).read_unaligned())),
        4 => _mm512_broadcast_f32x4(_mm_loadu_ps(v)),
        _ => _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(v as *const f64))),
    }
}

/// [`pattern16_ps`] for i32 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pattern16_epi32<const RT: usize>(v: *const i32) -> __m512i {
    _mm512_castps_si512(pattern16_ps::<RT>(v as *const f32))
}

/// Byte offsets of weight row `c` from the tile's first row (`cols[c] - cols[0]`), by lanes `c · RT + r` when
/// `BY_LANE`, else by `c` alone (then lanes `c ≥ 16 / RT` are 0).
fn offsets16<const RT: usize, const BY_LANE: bool>(cols: &[&[u8]; 16]) -> [i32; 16] {
    let base = cols[0].as_ptr() as isize;
    std::array::from_fn(|lane| {
        let c = if BY_LANE {
            lane / RT
        } else if lane < 16 / RT {
            lane
        } else {
            0
        };
        i32::try_from(cols[c].as_ptr() as isize - base).expect("weight tile spans less than 2 GiB")
    })
}

/// The f16 scales `d` (low half) and, with `min`, `m` (high half) of the 32-bit word at byte `at` of each lane's
/// weight row, lane `c · RT + r` ← row `c`, as f32 by `vcvtph2ps` (`m` is `d` again without `min`). Up to eight
/// rows: their words (loaded, or gathered by `offsets` from [`offsets16`] by row) converted at once, then spread
/// to the lanes by a permute; sixteen rows, one per lane: gathered by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scales16<const C: usize, const RT: usize>(
    cols: &[&[u8]; 16],
    at: usize,
    offsets: __m512i,
    min: bool,
) -> (__m512, __m512) {
    let base = cols[0].as_ptr().add(at);
    if C == 16 {
        let g = _mm512_i32gather_epi32::<1>(offsets, base as *const _);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        let m = if min { _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(g))) } else { d };
        return (d, m);
    }
    // [d0, m0, d1, m1, ..] as f32, for rows 0..C.
    let h = match C {
        2 => {
            let word = |c: usize| (cols[c].as_ptr().add(at) as *const i32).read_unaligned();
            _mm512_castps128_ps512(_mm_cvtph_ps(_mm_unpacklo_epi32(
                _mm_cvtsi32_si128(word(0)),
                _mm_cvtsi32_si128(word(1)),
            )))
        }
        4 => _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_i32gather_epi32::<1>(
            base as *const i32,
            _mm512_castsi512_si128(offsets),
        ))),
        _ => _mm512_cvtph_ps(_mm256_i32gather_epi32::<1>(base as *const i32, _mm512_castsi512_si256(offsets))),
    };
    let idx: [i32; 16] = std::array::from_fn(|lane| 2 * (lane / RT) as i32);
    let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
    let d = _mm512_permutexvar_ps(idx, h);
    let m = if min { _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), h) } else { d };
    (d, m)
}

/// `e8m0_to_f32_half` of the low byte `e` of each 32-bit lane (as `avx2_legacy::e8m0_half_lo`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn e8m0_half16(g: __m512i) -> __m512 {
    let e = _mm512_and_si512(g, _mm512_set1_epi32(0xff));
    let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let norm = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
    let small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, norm, sub))
}

/// The E8M0 scales (MXFP4: the byte at `at` of each lane's weight row) as f32 by [`e8m0_half16`], lane
/// `c · RT + r` ← row `c`; the words are loaded or gathered as in [`scales16`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scales16_e8m0<const C: usize, const RT: usize>(cols: &[&[u8]; 16], at: usize, offsets: __m512i) -> __m512 {
    let base = cols[0].as_ptr().add(at);
    if C == 16 {
        return e8m0_half16(_mm512_i32gather_epi32::<1>(offsets, base as *const _));
    }
    // `[C]` words of rows 0..C, in lanes 0..C.
    let w = match C {
        2 => {
            let word = |c: usize| (cols[c].as_ptr().add(at) as *const i32).read_unaligned();
            _mm512_zextsi128_si512(_mm_setr_epi32(word(0), word(1), 0, 0))
        }
        4 => _mm512_zextsi128_si512(_mm_i32gather_epi32::<1>(base as *const i32, _mm512_castsi512_si128(offsets))),
        _ => _mm512_zextsi256_si512(_mm256_i32gather_epi32::<1>(base as *const i32, _mm512_castsi512_si256(offsets))),
    };
    let idx: [i32; 16] = std::array::from_fn(|lane| (lane / RT) as i32);
    _mm512_permutexvar_ps(_mm512_loadu_si512(idx.as_ptr() as *const _), e8m0_half16(w))
}

/// `C` weight rows × `RT` activation rows (`C · RT = 16`, `C ≥ 2`) → 16 lanes, lane `c · RT + r`.
///
/// Per block, eight `vpdpbusd` results of two dots each: weight rows `c` and `c + C / 2` (one per half) against
/// activation row `r` (in both halves), in `v[c · RT + r]`, so that half `h` of `v[j]` is lane `8h + j`, which is
/// how [`reduce16`] lays out its sums. Then the float steps of the reference on all 16 lanes at once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile16<T: Pair, const C: usize, const RT: usize>(cols: &[&[u8]; 16], act: &ActQ, r0: usize) -> [f32; 16] {
    let (k, rows) = (act.k, act.rows);
    let offsets = if C == 16 { offsets16::<RT, true>(cols) } else { offsets16::<RT, false>(cols) };
    let offsets = _mm512_loadu_si512(offsets.as_ptr() as *const _);
    // The same `C` weight rows (consecutive) of the next 16-row tile, by the first row group only: the others
    // find them in cache.
    let len = cols[0].len();
    let next = NextTile::span(
        cols[0].as_ptr().wrapping_add(16 * len),
        if r0 == 0 { C * len } else { 0 },
        act.nb,
        16 * len <= 32 << 10,
    );
    // What comes off `S` as `Σqx << log2`: the type's offset, or the 128 added to the signed quants.
    let off_log2 = if T::SIGNED { 7 } else { T::OFFSET_LOG2 };
    let shift = _mm_cvtsi32_si128(off_log2);
    let flip = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    // `[RT]` rows of `[k]` quantized activations.
    let xq: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k));
    let mut acc = _mm512_setzero_ps();
    for b in 0..act.nb {
        next.at(b);
        let mut v = [zero; 8];
        // `[RT]` activation blocks, in both 256-bit halves.
        let xx: [__m512i; RT] =
            std::array::from_fn(|r| _mm512_broadcast_i64x4(_mm256_loadu_si256(xq[r].add(32 * b) as *const __m256i)));
        for c in 0..C / 2 {
            let b0 = cols[c].as_ptr().add(b * T::BYTES);
            let b1 = cols[c + C / 2].as_ptr().add(b * T::BYTES);
            // Signed quants as `w + 128` (`w ^ 0x80`, in `0..=255`): the u8 operand like the unsigned ones.
            let w = if T::SIGNED { _mm512_xor_si512(T::unpack2(b0, b1), flip) } else { T::unpack2(b0, b1) };
            for r in 0..RT {
                v[c * RT + r] = _mm512_dpbusd_epi32(zero, w, xx[r]);
            }
        }
        // Unsigned quants (≤ 31) times activations (≤ 127 in magnitude), four per lane: below 2^14. Signed ones
        // plus 128: below 2^17.
        let mut s = if T::SIGNED { reduce16::<false>(&v) } else { reduce16::<true>(&v) };
        // From here on, the float steps of `avx2_legacy` (and of the reference), lane by lane.
        let at = b * rows + r0;
        let sx = pattern16_epi32::<RT>(act.s_t.as_ptr().add(at));
        if off_log2 != 0 {
            s = _mm512_sub_epi32(s, _mm512_sll_epi32(sx, shift));
        }
        let (dw, mw) = if T::E8M0 {
            let d = scales16_e8m0::<C, RT>(cols, b * T::BYTES, offsets);
            (d, d)
        } else {
            scales16::<C, RT>(cols, b * T::BYTES, offsets, T::HAS_MIN)
        };
        let dx = pattern16_ps::<RT>(act.d_t.as_ptr().add(at));
        acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(s), acc);
        if T::HAS_MIN {
            acc = _mm512_fmadd_ps(_mm512_mul_ps(mw, dx), _mm512_cvtepi32_ps(sx), acc);
        }
    }
    let mut out = [0f32; 16];
    _mm512_storeu_ps(out.as_mut_ptr(), acc);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    #[test]
    fn reduce16_sums_each_half() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        // Below 2^14 in magnitude, as `reduce16::<true>` needs.
        let vals: [[i32; 16]; 8] =
            std::array::from_fn(|v| std::array::from_fn(|l| (v * 1900 + l * l * 7) as i32 - 16000));
        // SAFETY: AVX-512 checked above.
        let got = unsafe {
            let p: [__m512i; 8] = std::array::from_fn(|v| _mm512_loadu_si512(vals[v].as_ptr() as *const _));
            let mut out = [0i32; 16];
            let mut small = [0i32; 16];
            _mm512_storeu_si512(out.as_mut_ptr() as *mut _, reduce16::<false>(&p));
            _mm512_storeu_si512(small.as_mut_ptr() as *mut _, reduce16::<true>(&p));
            (out, small)
        };
        let want: [i32; 16] = std::array::from_fn(|l| vals[l % 8][8 * (l / 8)..8 * (l / 8) + 8].iter().sum());
        assert_eq!(got, (want, want));
    }

    /// The E8M0 scales of every tile shape have the bits of `tf_quant::e8m0_to_f32_half` for every byte, in the
    /// right lanes, whatever the bytes after the scale.
    #[test]
    fn e8m0_scales_match_the_scalar_conversion_for_every_byte() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        fn check<const C: usize, const RT: usize>(words: &[u32; 16]) {
            // `[16][4]`: row `c` is the word alone, at byte 0.
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let cols: [&[u8]; 16] = std::array::from_fn(|c| &bytes[4 * c..4 * c + 4]);
            let offsets = if C == 16 { offsets16::<RT, true>(&cols) } else { offsets16::<RT, false>(&cols) };
            let mut d = [0f32; 16];
            // SAFETY: AVX-512 checked by the caller; every row holds the word at byte 0.
            unsafe {
                let dv = scales16_e8m0::<C, RT>(&cols, 0, _mm512_loadu_si512(offsets.as_ptr() as *const _));
                _mm512_storeu_ps(d.as_mut_ptr(), dv);
            }
            for (lane, got) in d.iter().enumerate() {
                let want = tf_quant::e8m0_to_f32_half(words[lane / RT] as u8);
                assert_eq!(got.to_bits(), want.to_bits(), "{:#x}, {C} x {RT} lane {lane}", words[lane / RT]);
            }
        }
        for start in (0..256u32).step_by(16) {
            let words: [u32; 16] =
                std::array::from_fn(|c| (start + c as u32) | (0x005a_5a5a_u32 ^ (c as u32 * 0x10305)) << 8);
            check::<2, 8>(&words);
            check::<4, 4>(&words);
            check::<8, 2>(&words);
            check::<16, 1>(&words);
            // Rows in reverse order: each lane takes its own row's byte.
            let mut rev = words;
            rev.reverse();
            check::<2, 8>(&rev);
            check::<4, 4>(&rev);
            check::<8, 2>(&rev);
        }
    }

    /// The scales of every tile shape, times an activation scale, have the bits of `f16_bits_to_f32(h) * dx` for
    /// every f16 `h` (NaNs included: `vcvtph2ps` quiets a signaling NaN, as the product would), in the right lanes.
    #[test]
    fn scale_products_match_the_exact_conversion_for_every_f16() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        /// Lane `c · RT + r` of `scales16::<C, RT>` × `dx` against row `c`'s `d` and `m` (`words[c]`).
        fn check<const C: usize, const RT: usize>(words: &[u32; 16], dx: f32) {
            // `[16][4]`: row `c` is the word alone, at byte 0.
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let cols: [&[u8]; 16] = std::array::from_fn(|c| &bytes[4 * c..4 * c + 4]);
            let offsets = if C == 16 { offsets16::<RT, true>(&cols) } else { offsets16::<RT, false>(&cols) };
            let (mut d, mut m) = ([0f32; 16], [0f32; 16]);
            // SAFETY: AVX-512 checked by the caller; every row holds the word at byte 0.
            unsafe {
                let (dv, mv) = scales16::<C, RT>(&cols, 0, _mm512_loadu_si512(offsets.as_ptr() as *const _), true);
                let x = _mm512_set1_ps(dx);
                _mm512_storeu_ps(d.as_mut_ptr(), _mm512_mul_ps(dv, x));
                _mm512_storeu_ps(m.as_mut_ptr(), _mm512_mul_ps(mv, x));
            }
            for lane in 0..16 {
                let w = words[lane / RT];
                for (got, h) in [(d[lane], w as u16), (m[lane], (w >> 16) as u16)] {
                    let want = std::hint::black_box(tf_quant::f16_bits_to_f32(h)) * dx;
                    assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x} * {dx}, {C} x {RT} lane {lane}");
                }
            }
        }
        for dx in [1.0f32, -3.5e-3, 0.0, 7.0e-5, f32::INFINITY] {
            for start in (0..=u16::MAX as u32).step_by(16) {
                let words: [u32; 16] = std::array::from_fn(|c| {
                    let h = start + c as u32;
                    h | (h ^ 0x5a5a) << 16
                });
                check::<2, 8>(&words, dx);
                check::<4, 4>(&words, dx);
                check::<8, 2>(&words, dx);
                check::<16, 1>(&words, dx);
            }
        }
    }
}
