//! Checkpoint mode with AVX-512 (F/BW/VL/VNNI) for the K-quants Q4_K, Q5_K and Q6_K (and IQ4_XS, below): the
//! integer sums of a super-block by `vpdpbusd` over 64 elements at a time, the sub-block scales by `vpdpwssd`,
//! then exactly the float steps of the AVX2 kernel (`avx2_kquant`) and of the reference.
//!
//! Per super-block, weight row and activation row, 64 elements (a "chunk": 2 sub-blocks of 32 for Q4_K/Q5_K, 4 of
//! 16 for Q6_K) are unpacked into one 512-bit register of unsigned quants (`0..=63`) in element order and
//! multiplied with the 64 activation bytes (`-127..=127`) by `vpdpbusd` from zero: each i32 lane is the exact sum
//! of four products of one sub-block, `|p| ≤ 4·63·127 = 32004`, so it fits an i16. Two chunks' lanes are packed
//! to i16 (`vpackssdw`, which never saturates here) and `vpdpwssd` multiplies each by its sub-block's scale (an
//! i16 vector arranged by `vpermw` in the pack's lane order) and adds pairs into the row's i32 accumulator. All of
//! it is exact integer arithmetic (|S| < 2^31 as in `avx2_kquant`), so any grouping gives the reference's `S`.
//! Q6_K's `−32` comes off as `−32·Σ_j sc_j·bsum[j]` (the accumulator's starting value), the mins term `M` of
//! Q4_K/Q5_K is `madd(bsums, mins)` as in `avx2_kquant`. Then per lane, in floats, as the reference:
//! `acc = fma(dw * dx, S, acc)` and, with mins, `acc = fma(-(dmin * dx), M, acc)`.
//!
//! IQ4_XS: two sub-blocks of 32 per 512-bit register, their nibbles looked up in `KVALUES_IQ4NL` (`vpshufb`,
//! signed values −127..=113); `vpmaddubsw(|q|, ±qx)` (the sign of `q` moved onto the activations; pairs
//! ≤ 2·127·127, no saturation), then `vpdpwssd` with the sub-block scale `ls - 32` as i16 (|S| ≤ 256·127·127·32).

use std::arch::x86_64::*;

use tf_core::DType;

use super::act::ActQ;
use super::avx2::{by_rows, lane_offsets, lanes, pattern_ps, reduce8, words};
use super::QuantKernel;

/// The AVX-512 kernel of a K-quant or i-quant `dtype`, if there is one (IQ3_S and IQ3_XXS in `avx512_iquant`; the
/// others run `avx2_kquant`).
pub(crate) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::Q4K => entry::<Q4K>,
        DType::Q5K => entry::<Q5K>,
        DType::Q6K => entry::<Q6K>,
        DType::IQ4XS => entry::<IQ4XS>,
        _ => return super::avx512_iquant::kernel(dtype),
    })
}

/// A K-quant layout: how one lane's integer sums of one super-block are formed.
trait KQuant {
    const BYTES: usize;
    /// Byte offset of the 32-bit word gathered for the scales: `d` in its low half (and `dmin` in its high half
    /// when `HAS_MIN`), or `d` in its high half when `D_HIGH`.
    const D_AT: usize;
    const D_HIGH: bool;
    const HAS_MIN: bool;
    /// This block's `S` against `RT` activation rows (`x[r]`: the block's 256 values, `bs[r]`: its 16 bsums) as
    /// eight i32 lanes to be summed, in `s[r]`, and the `M` partials in `m[r]` (left alone without mins).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/VNNI; `blk` points at a whole block, `x[r]` at 256 values and `bs[r]` at 16 i16.
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        m: &mut [__m256i; RT],
    );
}

struct Q4K;
struct Q5K;
struct Q6K;
struct IQ4XS;

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// 32 bytes at `p` in both 256-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn bcast256(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(load256(p))
}

/// The i16 lane order of `vpackssdw(p0, p1)` for chunks `2 q` (`p0`) and `2 q + 1` (`p1`): i16 `8 L + i` (128-bit
/// lane `L`, `i < 8`) is i32 lane `4 L + i % 4` of chunk `2 q + i / 4`. The result indexes `vpermw` into the
/// block's 16 i16 scales: the sub-block of that lane, `4 q + 2 (i / 4) + lane / 8` for Q4_K/Q5_K (chunk `c`
/// holds sub-blocks `2 c`, lanes 0..8, and `2 c + 1`, lanes 8..16), `8 q + 4 (i / 4) + lane / 4` for Q6_K (chunk
/// `c` holds sub-blocks `4 c ..4 c + 4`, four lanes each).
const fn pack_index(q6k: bool, q: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut at = 0;
    while at < 32 {
        let (l, i) = (at / 8, at % 8);
        let lane = 4 * l + i % 4;
        idx[at] = if q6k { 8 * q + 4 * (i / 4) + lane / 4 } else { 4 * q + 2 * (i / 4) + lane / 8 } as i16;
        at += 1;
    }
    idx
}

pub(super) static Q45_IDX: [[i16; 32]; 2] = [pack_index(false, 0), pack_index(false, 1)];
static Q6_IDX: [[i16; 32]; 2] = [pack_index(true, 0), pack_index(true, 1)];

/// `s[r] += Σ scale · (Σ of four products)` over chunks `c` (weights `w0`) and `c + 1` (`w1`) of every row:
/// `vpdpbusd` from zero per chunk, `vpackssdw` of the two (exact: every lane fits an i16), `vpdpwssd` with the
/// scales `sc` in the pack's lane order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pair<const RT: usize>(
    w0: __m512i,
    w1: __m512i,
    sc: __m512i,
    x: &[*const i8; RT],
    c: usize,
    s: &mut [__m512i; RT],
) {
    let z = _mm512_setzero_si512();
    for r in 0..RT {
        let x0 = _mm512_loadu_si512(x[r].add(64 * c) as *const __m512i);
        let x1 = _mm512_loadu_si512(x[r].add(64 * c + 64) as *const __m512i);
        let p = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, w0, x0), _mm512_dpbusd_epi32(z, w1, x1));
        s[r] = _mm512_dpwssd_epi32(s[r], p, sc);
    }
}

/// The two 256-bit halves of `v` added (eight i32 lanes whose sum is the sum of `v`'s sixteen).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Q4_K / Q5_K scales and mins from the 12 packed bytes at `p` (GGML's `utmp` unpacking, equal to
/// `tf_quant::q4k_scale_min`): bytes 0..8 the scales, 8..16 the mins, each `0..=63`. Reads 16 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scale_min(p: *const u8) -> __m128i {
    let v = _mm_loadu_si128(p as *const __m128i);
    // scales 0..4: p[j] & 63; scales 4..8: (p[j+4] & 15) | (p[j-4] >> 6) << 4;
    // mins 0..4: p[j+4] & 63; mins 4..8: (p[j+4] >> 4) | (p[j] >> 6) << 4 (j the index within its eight).
    let a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    let low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    let nib = _mm_and_si128(_mm_srli_epi16::<4>(a), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    let b = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    let top = _mm_and_si128(_mm_srli_epi16::<2>(b), _mm_set1_epi8(0x30));
    _mm_or_si128(_mm_or_si128(low, nib), top)
}

/// Q4_K (`QH = false`) and Q5_K (`QH = true`): element `64 c + 32 n + l` from `qs[32 c + l] >> 4 n`, plus
/// `((qh[l] >> (2 c + n)) & 1) << 4` for Q5_K; chunk `c` is one 32-byte load in both halves, the upper half
/// shifted by 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_q45k<const QH: bool, const RT: usize>(
    blk: *const u8,
    x: &[*const i8; RT],
    bs: &[*const i16; RT],
    s: &mut [__m256i; RT],
    m: &mut [__m256i; RT],
) {
    let sm = scale_min(blk.add(4));
    let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
    let qs_at = if QH { 48 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0f);
    let qh = if QH { bcast256(blk.add(16)) } else { _mm512_setzero_si512() };
    let mut acc = [_mm512_setzero_si512(); RT];
    for (q, idx) in Q45_IDX.iter().enumerate() {
        let w: [__m512i; 2] = std::array::from_fn(|i| {
            let c = 2 * q + i;
            let v = bcast256(blk.add(qs_at + 32 * c));
            let w = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(v, 0xffff_0000, v), m4);
            if QH {
                let bit = _mm512_inserti64x4::<1>(_mm512_set1_epi8(1 << (2 * c)), _mm256_set1_epi8(1 << (2 * c + 1)));
                _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(qh, bit), w, _mm512_set1_epi8(16))
            } else {
                w
            }
        });
        let sc = _mm512_permutexvar_epi16(_mm512_loadu_si512(idx.as_ptr() as *const __m512i), sc16);
        pair(w[0], w[1], sc, x, 2 * q, &mut acc);
    }
    // i16 [m0, m0, m1, m1, ..., m7, m7] against the 16 bsums: m_j · (bsum[2j] + bsum[2j+1]) per i32 lane.
    let dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
    for r in 0..RT {
        s[r] = fold(acc[r]);
        m[r] = _mm256_madd_epi16(load256(bs[r] as *const u8), mins);
    }
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        m: &mut [__m256i; RT],
    ) {
        block_q45k::<false, RT>(blk, x, bs, s, m)
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        m: &mut [__m256i; RT],
    ) {
        block_q45k::<true, RT>(blk, x, bs, s, m)
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const D_AT: usize = 206;
    const D_HIGH: bool = true;
    const HAS_MIN: bool = false;
    /// Element `128 h + 64 u + 32 n + l`: low nibble of `ql[64 h + 32 n + l] >> 4 u` (one 64-byte load per `h`),
    /// high bits `(qh[32 h + l] >> (4 u + 2 n)) & 3` (one 32-byte load per `h` in both halves, shifted into
    /// bits 4..6 by a per-half variable shift).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i));
        let scz = _mm512_castsi256_si512(sc16);
        // −32·sc_j as i16 (|·| ≤ 4096); the starting accumulator −32·Σ_j sc_j·bsum[j] takes the offset off.
        let off = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16));
        let mut acc: [__m512i; RT] =
            std::array::from_fn(|r| _mm512_zextsi256_si512(_mm256_madd_epi16(load256(bs[r] as *const u8), off)));
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        // 16-bit shift counts per half: n = 0 in the low 256 bits, n = 1 in the high.
        let left = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
        let right = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
        for (h, idx) in Q6_IDX.iter().enumerate() {
            let ql = _mm512_loadu_si512(blk.add(64 * h) as *const __m512i);
            let qh = bcast256(blk.add(128 + 32 * h));
            // u = 0: bits 0..2 (n = 0) and 2..4 (n = 1) of qh to 4..6; u = 1: bits 4..6 and 6..8.
            let w0 = _mm512_ternarylogic_epi32::<0xf8>(_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, left), m30);
            let lo1 = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4);
            let w1 = _mm512_ternarylogic_epi32::<0xf8>(lo1, _mm512_srlv_epi16(qh, right), m30);
            let sc = _mm512_permutexvar_epi16(_mm512_loadu_si512(idx.as_ptr() as *const __m512i), scz);
            pair(w0, w1, sc, x, 2 * h, &mut acc);
        }
        for r in 0..RT {
            s[r] = fold(acc[r]);
        }
    }
}

/// `vpermw` indices of IQ4_XS's chunk `q`: sub-block `2 q` in i16 lanes 0..16, `2 q + 1` in 16..32.
static IQ4XS_IDX: [[i16; 32]; 4] = {
    let mut idx = [[0i16; 32]; 4];
    let mut q = 0;
    while q < 4 {
        let mut l = 0;
        while l < 32 {
            idx[q][l] = (2 * q + l / 16) as i16;
            l += 1;
        }
        q += 1;
    }
    idx
};

/// The 8 sub-block scales `ls_j - 32` of the IQ4_XS block at `blk` as i16 lanes 0..8 (equal to
/// `tf_quant::iq4xs_scales`): the nibbles of `scales_l` and the 2-bit fields of `scales_h` spread to one byte
/// each (bit interleaving in a u64), joined, biased, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn iq4xs_scales16(blk: *const u8) -> __m128i {
    let h = (blk.add(2) as *const u16).read_unaligned() as u64;
    let l = (blk.add(4) as *const u32).read_unaligned() as u64;
    let l = (l | l << 16) & 0x0000_ffff_0000_ffff;
    let l = (l | l << 8) & 0x00ff_00ff_00ff_00ff;
    let l = (l | l << 4) & 0x0f0f_0f0f_0f0f_0f0f;
    let h = (h | h << 24) & 0x0000_00ff_0000_00ff;
    let h = (h | h << 12) & 0x000f_000f_000f_000f;
    let h = (h | h << 6) & 0x0303_0303_0303_0303;
    let ls = _mm_cvtsi64_si128((l | h << 4) as i64);
    _mm_cvtepi8_epi16(_mm_sub_epi8(ls, _mm_set1_epi8(32)))
}

impl KQuant for IQ4XS {
    const BYTES: usize = 136;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    /// Sub-blocks `2 q` and `2 q + 1` (elements `64 q..64 q + 64`) from the 32 bytes `qs[32 q..32 q + 32]`:
    /// 128-bit quarters `[lo, hi]` of the first 16 bytes, then of the next 16, each in element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let sc16 = _mm512_castsi128_si512(iq4xs_scales16(blk));
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(tf_quant::KVALUES_IQ4NL.as_ptr() as *const __m128i));
        let m4 = _mm512_set1_epi8(0x0f);
        let z = _mm512_setzero_si512();
        let mut acc = [z; RT];
        for (q, idx) in IQ4XS_IDX.iter().enumerate() {
            // Quarters [v0, v0, v1, v1] shifted by 0, 4, 0, 4 and masked: the indices in element order.
            let v = _mm512_castsi256_si512(load256(blk.add(8 + 32 * q)));
            let v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), v);
            let v = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(v, 0xff00_ff00, v), m4);
            let w = _mm512_shuffle_epi8(table, v);
            let wa = _mm512_abs_epi8(w);
            let neg = _mm512_movepi8_mask(w);
            // i16 lanes 0..16: sub-block 2q's scale, 16..32: 2q + 1's.
            let scale = _mm512_permutexvar_epi16(_mm512_loadu_si512(idx.as_ptr() as *const __m512i), sc16);
            for r in 0..RT {
                let xv = _mm512_loadu_si512(x[r].add(64 * q) as *const __m512i);
                let xv = _mm512_mask_sub_epi8(xv, neg, z, xv);
                acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(wa, xv), scale);
            }
        }
        for r in 0..RT {
            s[r] = fold(acc[r]);
        }
    }
}

/// The f16 in the low 16 bits of each 32-bit lane, as f32 (`vpmovdw` + `vcvtph2ps`): exact for every value but a
/// signaling NaN, which comes out quiet, as the multiplication by the activation scale that always follows makes
/// it anyway (so the products carry the reference's bits; tested below for all 65,536 values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn f16_lanes(g: __m256i) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g))
}

/// Requests the cache lines of `bytes` bytes at `p` into L2 (never dereferenced: `p` may lie past the weight's
/// end; a prefetch changes no value).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn prefetch(p: *const u8, bytes: usize) {
    let mut at = 0;
    while at < bytes + 63 {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(at) as *const i8);
        at += 64;
    }
}

fn entry<T: KQuant>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(act.block == 256 && r0 + rt <= act.rows, "K-quant tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "K-quant tile: weight rows");
    // SAFETY: this kernel is only picked for `Isa::Avx512`, which `matmul` checks against the CPU; the asserts
    // above bound every pointer the kernel forms (the 16-byte scale read of Q4_K/Q5_K at byte 4 stays inside
    // the block).
    unsafe { by_rows!(rt, tile::<T>(cols, act, r0)) }
}

/// `C` weight rows × `RT` activation rows → 8 lanes, lane `c · RT + r`; the float steps of `avx2_kquant::tile`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<T: KQuant, const C: usize, const RT: usize>(cols: &[&[u8]; 8], act: &ActQ, r0: usize) -> [f32; 8] {
    let (k, rows, nb) = (act.k, act.rows, act.nb);
    let offsets = lane_offsets::<RT>(cols);
    // The same block of the row one tile (8 rows) further: the rows of a tile are contiguous, so this streams the
    // next tile into L2 while this one is computed.
    let ahead = 8 * cols[0].len();
    let neg = _mm256_set1_ps(-0.0);
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        // `[RT]` activation blocks and their `[16]` bsums.
        let x: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b));
        let bs: [*const i16; RT] = std::array::from_fn(|r| act.sums.as_ptr().add(((r0 + r) * nb + b) * 16));
        let mut s = [_mm256_setzero_si256(); 8];
        let mut m = [_mm256_setzero_si256(); 8];
        for c in 0..C {
            let mut sc = [_mm256_setzero_si256(); RT];
            let mut mc = [_mm256_setzero_si256(); RT];
            let blk = cols[c].as_ptr().add(b * T::BYTES);
            prefetch(blk.wrapping_add(ahead), T::BYTES);
            T::block::<RT>(blk, &x, &bs, &mut sc, &mut mc);
            s[c * RT..(c + 1) * RT].copy_from_slice(&sc);
            m[c * RT..(c + 1) * RT].copy_from_slice(&mc);
        }
        let g = words::<C>(cols, b * T::BYTES + T::D_AT, offsets);
        let dw = f16_lanes(if T::D_HIGH { _mm256_srli_epi32::<16>(g) } else { g });
        let dx = pattern_ps::<RT>(act.d_t.as_ptr().add(b * rows + r0));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(reduce8(&s)), acc);
        if T::HAS_MIN {
            let dmin = _mm256_xor_ps(_mm256_mul_ps(f16_lanes(_mm256_srli_epi32::<16>(g)), dx), neg);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(reduce8(&m)), acc);
        }
    }
    lanes(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use rand::{Rng, SeedableRng};

    /// `f16_lanes(h) * dx` has the bits of `f16_bits_to_f32(h) * dx` for every f16 `h`, NaNs included.
    #[test]
    fn scale_products_match_the_exact_conversion_for_every_f16() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for dx in [1.0f32, -3.5e-3, 0.0, 7.0e-5, f32::INFINITY] {
            for start in (0..=u16::MAX as u32).step_by(8) {
                let h: [i32; 8] = std::array::from_fn(|i| ((start + i as u32) | 0x5a5a_0000) as i32);
                // SAFETY: AVX-512 checked above.
                let got = unsafe {
                    let v = _mm256_loadu_si256(h.as_ptr() as *const __m256i);
                    lanes(_mm256_mul_ps(f16_lanes(v), _mm256_set1_ps(dx)))
                };
                for (i, g) in got.iter().enumerate() {
                    let bits = start + i as u32;
                    let want = std::hint::black_box(tf_quant::f16_bits_to_f32(bits as u16)) * dx;
                    assert_eq!(g.to_bits(), want.to_bits(), "{bits:#06x} * {dx}");
                }
            }
        }
    }

    /// The IQ4_XS scale unpacking equals `tf_quant::iq4xs_scales` for every `scales_h` and random `scales_l`.
    #[test]
    fn iq4xs_scales_match_tf_quant() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for h in 0..=u16::MAX {
            let mut blk = [0u8; 8];
            rng.fill(&mut blk[..]);
            blk[2..4].copy_from_slice(&h.to_le_bytes());
            let want = tf_quant::iq4xs_scales([blk[2], blk[3]], &blk[4..8].try_into().unwrap());
            let mut got = [0i16; 8];
            // SAFETY: AVX-512 checked above; `blk` holds the 8 header bytes read.
            unsafe { _mm_storeu_si128(got.as_mut_ptr() as *mut __m128i, iq4xs_scales16(blk.as_ptr())) };
            assert_eq!(got, want.map(|v| v as i16), "{blk:?}");
        }
    }

    /// The vector unpacking of the 12 scale bytes equals `tf_quant::q4k_scale_min` for random bytes.
    #[test]
    fn scale_min_matches_tf_quant() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..10_000 {
            let mut p = [0u8; 16];
            rng.fill(&mut p[..]);
            let packed: [u8; 12] = p[..12].try_into().unwrap();
            let (sc, mn) = tf_quant::q4k_scale_min(&packed);
            let mut got = [0u8; 16];
            // SAFETY: AVX-512 checked above; `p` holds 16 bytes.
            unsafe { _mm_storeu_si128(got.as_mut_ptr() as *mut __m128i, scale_min(p.as_ptr())) };
            assert_eq!(&got[..8], &sc[..], "{packed:?}");
            assert_eq!(&got[8..], &mn[..], "{packed:?}");
        }
    }
}
