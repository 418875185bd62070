//! Checkpoint mode with AVX2 for the 256-element K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K), IQ4_XS, IQ3_S,
//! IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S and IQ1_S (on AVX-512 CPUs the i-quants run `avx512_iquant`,
//! `avx512_iquant2` and `avx512_iquant_rows` instead).
//!
//! Per super-block and lane, the exact integers of the reference are built in i32 vectors, 32 elements at a time:
//! `maddubs(q, qx)` (unsigned quants ≤ 63, so pairs ≤ 2·63·127: no saturation) then `madd` with the sub-block
//! scales as i16 (lanes 0..8 of a 32-element chunk belong to its first 16 elements, 8..16 to the second); the
//! offsets of Q3_K (`−4`) and Q6_K (`−32`) are taken out as `offset · Σ_j sc_j·bsum[j]`, and the mins term `M` of
//! Q2_K/Q4_K/Q5_K is `madd(bsums, mins)`. The eight lanes' vectors are reduced at once ([`reduce8`]), then every
//! lane runs the reference's float update: `acc = fma(dw * dx, S, acc)` and, with mins,
//! `acc = fma(-(dmin * dx), M, acc)`. Integer sums stay far below 2^31 (|S| ≤ 256·63·15·127 for Q4_K).
//! IQ4_XS's table values (−127..=113, by `pshufb`) are signed: `maddubs(|q|, sign(qx, q))` (pairs ≤ 2·127·127,
//! no saturation), then `madd` with the sub-block's scale `ls - 32` (|S| ≤ 256·127·127·32). IQ3_S's grid
//! values (odd, 1..=15, four per entry of the grid) are the unsigned operand, its sign bits moved
//! onto the activations (`sign(qx, ±1)`), then `madd` with `1 + 2 sc` (|S| ≤ 256·15·127·31); IQ3_XXS likewise
//! (grid values 4..=62, signs through `KSIGNS_IQ2XS`, pairs ≤ 2·62·127) and IQ2_XXS (grid values 8, 25, 43,
//! eight per entry, signs through `KSIGNS_IQ2XS`, |S| ≤ 256·43·127·31); IQ2_XS as IQ2_XXS with a 9-bit grid
//! index and one scale per 16 elements (i16 lanes 0..8 and 8..16 of the `madd`); IQ2_S as IQ2_XS with a 10-bit
//! grid index and its signs stored as one byte per 8 elements (same bound). IQ1_S's grid values (−1, 0, 1) go
//! onto the activations (`sign(qx, g)` is `g·qx`), summed in pairs by `maddubs(1, ·)`, then `madd` with
//! `8 (2 sc + 1)`; its delta term `(2 sc + 1)·(±1)·Σ qx` is `madd(bsums, ·)` (|S| ≤ 256·9·127·15).

use std::arch::x86_64::*;

use tf_core::DType;
use tf_quant::{
    iq4xs_scales, q3k_scales, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};

use super::act::ActQ;
use super::avx2::{by_rows, f16_hi, f16_lo, lane_offsets, lanes, pattern_ps, reduce8, words};
use super::avx2_legacy::{iq4nl_table, nibbles};
use super::QuantKernel;

/// The AVX2 kernel of a K-quant `dtype`, if there is one.
pub(super) fn kernel(dtype: DType) -> Option<QuantKernel> {
    Some(match dtype {
        DType::Q2K => entry::<Q2K>,
        DType::Q3K => entry::<Q3K>,
        DType::Q4K => entry::<Q4K>,
        DType::Q5K => entry::<Q5K>,
        DType::Q6K => entry::<Q6K>,
        DType::Q8K => entry::<Q8K>,
        DType::IQ4XS => entry::<IQ4XS>,
        DType::IQ3S => entry::<IQ3S>,
        DType::IQ3XXS => entry::<IQ3XXS>,
        DType::IQ2XXS => entry::<IQ2XXS>,
        DType::IQ2XS => entry::<IQ2XS>,
        DType::IQ2S => entry::<IQ2S>,
        DType::IQ1S => entry::<IQ1S>,
        _ => return None,
    })
}

/// A K-quant layout: how one lane's integer sums of one super-block are accumulated.
trait KQuant {
    const BYTES: usize;
    /// Byte offset of the 32-bit word gathered for the scales: `d` in its low half (and `dmin` in its high half
    /// when `HAS_MIN`), or `d` in its high half when `D_HIGH`.
    const D_AT: usize;
    const D_HIGH: bool;
    const HAS_MIN: bool;
    /// `d` is an f32 (Q8_K) rather than an f16.
    const D_F32: bool = false;
    /// The scale product is `(dw * dx) * DDX_MUL` where this is not 1 (IQ3_XXS: 0.25, IQ2_XXS, IQ2_XS, IQ2_S and
    /// IQ1_S: 0.125).
    const DDX_MUL: f32 = 1.0;
    /// Adds this block's `S` partials against `RT` activation rows (`x[r]`: the block's 256 values, `bs[r]`: its
    /// 16 bsums) into `s[r]`, and returns the `M` partials in `m[r]` (left alone without mins).
    ///
    /// # Safety
    /// AVX2; `blk` points at a whole block, `x[r]` at 256 values and `bs[r]` at 16 i16.
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        m: &mut [__m256i; RT],
    );
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// i16 lanes 0..8 = `sc[i]`, 8..16 = `sc[i + 1]` (for `sc` 16 bytes, sign-extended when `SIGNED`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pair_scales<const SIGNED: bool>(sc: __m128i, i: usize) -> __m256i {
    let lo = (i as i64) * 0x0101_0101_0101_0101;
    let pair = _mm_shuffle_epi8(sc, _mm_set_epi64x(lo + 0x0101_0101_0101_0101, lo));
    if SIGNED {
        _mm256_cvtepi8_epi16(pair)
    } else {
        _mm256_cvtepu8_epi16(pair)
    }
}

/// `s[r] += madd(maddubs(q, x[r] + 32·chunk), scales)` for every row.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk<const RT: usize>(q: __m256i, sc: __m256i, x: &[*const i8; RT], chunk: usize, s: &mut [__m256i; RT]) {
    for r in 0..RT {
        let xv = load(x[r].add(32 * chunk) as *const u8);
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), sc));
    }
}

/// `s[r] -= offset · Σ_j sc[j]·bsum_r[j]` (`sc`: 16 i16, `offset = 1 << log2`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sub_offset<const RT: usize>(sc: __m256i, log2: i32, bs: &[*const i16; RT], s: &mut [__m256i; RT]) {
    for r in 0..RT {
        let t = _mm256_madd_epi16(load(bs[r] as *const u8), sc);
        s[r] = _mm256_sub_epi32(s[r], _mm256_sll_epi32(t, _mm_cvtsi32_si128(log2)));
    }
}

/// The 2-bit fields of `qs[32 h..32 h + 32]` at shift `2 s`: elements `128 h + 32 s ..+ 32` (Q2_K, Q3_K).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn crumbs(qs: __m256i, s: usize) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * s as i32)), _mm256_set1_epi8(3))
}

struct Q2K;
struct Q3K;
struct Q4K;
struct Q5K;
struct Q6K;
struct Q8K;
struct IQ4XS;
struct IQ3S;
struct IQ3XXS;
struct IQ2XXS;
struct IQ2XS;
struct IQ2S;
struct IQ1S;

impl KQuant for Q2K {
    const BYTES: usize = 84;
    const D_AT: usize = 80;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        m: &mut [__m256i; RT],
    ) {
        let packed = _mm_loadu_si128(blk as *const __m128i);
        let sc = _mm_and_si128(packed, _mm_set1_epi8(0x0f));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0f)));
        for h in 0..2 {
            let qs = load(blk.add(16 + 32 * h));
            for sh in 0..4 {
                let c = 4 * h + sh;
                chunk(crumbs(qs, sh), pair_scales::<false>(sc, 2 * c), x, c, s);
            }
        }
        for r in 0..RT {
            m[r] = _mm256_madd_epi16(load(bs[r] as *const u8), mins);
        }
    }
}

impl KQuant for Q3K {
    const BYTES: usize = 110;
    const D_AT: usize = 106;
    const D_HIGH: bool = true;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let scales = q3k_scales(&*(blk.add(96) as *const [u8; 12]));
        let sc = _mm_loadu_si128(scales.as_ptr() as *const __m128i);
        let hmask = load(blk);
        for h in 0..2 {
            let qs = load(blk.add(32 + 32 * h));
            for sh in 0..4 {
                let c = 4 * h + sh;
                // q = crumb | hbit << 2 in 0..=7; the −4 comes off through the bsums below.
                let hb = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(c as i32)), _mm256_set1_epi8(1));
                let q = _mm256_or_si256(crumbs(qs, sh), _mm256_slli_epi16::<2>(hb));
                chunk(q, pair_scales::<true>(sc, 2 * c), x, c, s);
            }
        }
        sub_offset(_mm256_cvtepi8_epi16(sc), 2, bs, s);
    }
}

/// Q4_K / Q5_K scales and mins: bytes 0..8 the 8 scales, 8..16 the 8 mins (GGML's `utmp` unpacking; equal to
/// `tf_quant::q4k_scale_min`).
#[inline]
fn scale_min(p: *const u8) -> [u8; 16] {
    // SAFETY (caller): `p` points at the 12 packed bytes.
    let w = |i: usize| unsafe { (p.add(4 * i) as *const u32).read_unaligned() };
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let (k1, k2, k3) = (0x3f3f_3f3fu32, 0x0f0f_0f0fu32, 0x0303_0303u32);
    let unpacked = [u0 & k1, (u2 & k2) | (((u0 >> 6) & k3) << 4), u1 & k1, ((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(unpacked) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Bit `j` of every byte of `qh`, as 0 or 16.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fifth_bit(qh: __m256i, j: i32) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1)))
}

/// Q4_K (`QH = false`) and Q5_K (`QH = true`): 8 sub-blocks of 32, element `64 c + 32 n + l` from
/// `qs[32 c + l] >> 4 n`, plus `((qh[l] >> (2 c + n)) & 1) << 4` for Q5_K.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_q45k<const QH: bool, const RT: usize>(
    blk: *const u8,
    x: &[*const i8; RT],
    bs: &[*const i16; RT],
    s: &mut [__m256i; RT],
    m: &mut [__m256i; RT],
) {
    let sm = scale_min(blk.add(4));
    let qs_at = if QH { 48 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0f);
    let qh = if QH { load(blk.add(16)) } else { _mm256_setzero_si256() };
    for c in 0..4 {
        let q = load(blk.add(qs_at + 32 * c));
        let mut lo = _mm256_and_si256(q, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
        if QH {
            lo = _mm256_or_si256(lo, fifth_bit(qh, 2 * c as i32));
            hi = _mm256_or_si256(hi, fifth_bit(qh, 2 * c as i32 + 1));
        }
        // Sub-blocks 2c and 2c + 1 are whole chunks: one scale for all 16 i16 lanes.
        chunk(lo, _mm256_set1_epi16(sm[2 * c] as i16), x, 2 * c, s);
        chunk(hi, _mm256_set1_epi16(sm[2 * c + 1] as i16), x, 2 * c + 1, s);
    }
    // i16 [m0, m0, m1, m1, ..., m7, m7] against the 16 bsums: m_j · (bsum[2j] + bsum[2j+1]) per i32 lane.
    let dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadu_si128(sm.as_ptr() as *const __m128i), dup));
    for r in 0..RT {
        m[r] = _mm256_madd_epi16(load(bs[r] as *const u8), mins);
    }
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
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
    #[target_feature(enable = "avx2,fma")]
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
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
        let m4 = _mm256_set1_epi8(0x0f);
        for h in 0..2 {
            let qh = load(blk.add(128 + 32 * h));
            for t in 0..4 {
                // Element 128 h + 32 t + l: low nibble of ql[64 h + 32 (t % 2) + l] at shift 4 (t / 2), high bits
                // (qh[32 h + l] >> 2 t) & 3; the −32 comes off through the bsums below.
                let ql = load(blk.add(64 * h + 32 * (t % 2)));
                let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2) as i32)), m4);
                let high = crumbs(qh, t);
                let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                let c = 4 * h + t;
                chunk(q, pair_scales::<true>(sc, 2 * c), x, c, s);
            }
        }
        sub_offset(_mm256_cvtepi8_epi16(sc), 5, bs, s);
    }
}

impl KQuant for Q8K {
    const BYTES: usize = 292;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const D_F32: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let ones = _mm256_set1_epi16(1);
        for c in 0..8 {
            // Sign trick: |w| (unsigned) times x·sign(w); pairs ≤ 2·128·127.
            let w = load(blk.add(4 + 32 * c));
            let wa = _mm256_sign_epi8(w, w);
            signed_madd(s, x, 32 * c, wa, w, ones);
        }
    }
}

impl KQuant for IQ4XS {
    const BYTES: usize = 136;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    /// Sub-block `j` (elements `32 j..32 j + 32`): the nibbles of `qs[16 j..16 j + 16]` through the table.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let sc = iq4xs_scales([*blk.add(2), *blk.add(3)], &*(blk.add(4) as *const [u8; 4]));
        let table = iq4nl_table();
        for (j, &sc) in sc.iter().enumerate() {
            let q = _mm256_shuffle_epi8(table, nibbles(blk.add(8 + 16 * j)));
            let qa = _mm256_sign_epi8(q, q);
            let scale = _mm256_set1_epi16(sc as i16);
            signed_madd(s, x, 32 * j, qa, q, scale);
        }
    }
}

/// `s[r] += madd(maddubs(u, sign(x[r][at..at + 32], sg)), scale)` for every row: the unsigned bytes `u` against
/// row `r`'s 32 activations from `at` with the signs `sg` moved onto them, pairs weighted by `scale` (i16 lanes).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn signed_madd<const RT: usize>(
    s: &mut [__m256i; RT],
    x: &[*const i8; RT],
    at: usize,
    u: __m256i,
    sg: __m256i,
    scale: __m256i,
) {
    for r in 0..RT {
        let xv = _mm256_sign_epi8(load(x[r].add(at) as *const u8), sg);
        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), scale));
    }
}

/// 1 in byte `i` where bit `i` of the little-endian u32 at `p` is clear, −1 where it is set.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn signs32(p: *const u8) -> __m256i {
    let bits = (p as *const u32).read_unaligned();
    // Byte i gets byte i / 8 of `bits`; OR-ing every bit but bit i % 8 makes it 0xff iff that bit is set.
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
    let set =
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)), _mm256_set1_epi8(-1));
    _mm256_or_si256(set, _mm256_set1_epi8(1))
}

impl KQuant for IQ3S {
    const BYTES: usize = 110;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    /// Sub-block `j`: groups `8 j..8 j + 8`, grid index `qs[g] | ((qh[j] >> (g % 8)) & 1) << 8`, signs
    /// `signs[4 j..4 j + 4]`, scale `1 + 2 ((scales[j / 2] >> 4 (j % 2)) & 15)`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let (qs, qh, signs, scales) = (blk.add(2), blk.add(66), blk.add(74), blk.add(106));
        for j in 0..8 {
            let h = *qh.add(j) as usize;
            let e = |k: usize| IQ3S_GRID[*qs.add(8 * j + k) as usize | ((h << (8 - k)) & 256)] as i32;
            let g = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
            let sg = signs32(signs.add(4 * j));
            let scale = _mm256_set1_epi16(1 + 2 * ((*scales.add(j / 2) >> (4 * (j % 2))) & 15) as i16);
            signed_madd(s, x, 32 * j, g, sg, scale);
        }
    }
}

impl KQuant for IQ3XXS {
    const BYTES: usize = 98;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const DDX_MUL: f32 = 0.25;
    /// Sub-block `j`: groups `8 j..8 j + 8` with grid index `qs[g]`, and `aux` (the u32 at `qs[64 + 4 j]`): scale
    /// `1 + 2 (aux >> 28)`, signs of its 8-element group `k` from `KSIGNS_IQ2XS[(aux >> 7 k) & 127]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let qs = blk.add(2);
        for j in 0..8 {
            let e = |k: usize| IQ3XXS_GRID[*qs.add(8 * j + k) as usize] as i32;
            let g = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
            let aux = (qs.add(64 + 4 * j) as *const u32).read_unaligned();
            let sign_bytes: [u8; 4] = std::array::from_fn(|k| KSIGNS_IQ2XS[((aux >> (7 * k)) & 127) as usize]);
            let sg = signs32(sign_bytes.as_ptr());
            let scale = _mm256_set1_epi16(1 + 2 * (aux >> 28) as i16);
            signed_madd(s, x, 32 * j, g, sg, scale);
        }
    }
}

impl KQuant for IQ2XXS {
    const BYTES: usize = 66;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const DDX_MUL: f32 = 0.125;
    /// Sub-block `j`: the u32 at `qs[8 j]` holds the grid index of its 8-element group `k` in byte `k`; `aux`
    /// (the u32 at `qs[8 j + 4]`) the scale `1 + 2 (aux >> 28)` and group `k`'s signs
    /// `KSIGNS_IQ2XS[(aux >> 7 k) & 127]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let qs = blk.add(2);
        for j in 0..8 {
            let e = |k: usize| IQ2XXS_GRID[*qs.add(8 * j + k) as usize] as i64;
            let g = _mm256_setr_epi64x(e(0), e(1), e(2), e(3));
            let aux = (qs.add(8 * j + 4) as *const u32).read_unaligned();
            let sign_bytes: [u8; 4] = std::array::from_fn(|k| KSIGNS_IQ2XS[((aux >> (7 * k)) & 127) as usize]);
            let sg = signs32(sign_bytes.as_ptr());
            let scale = _mm256_set1_epi16(1 + 2 * (aux >> 28) as i16);
            signed_madd(s, x, 32 * j, g, sg, scale);
        }
    }
}

impl KQuant for IQ2XS {
    const BYTES: usize = 74;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const DDX_MUL: f32 = 0.125;
    /// Elements `32 j..32 j + 32`: groups `4 j..4 j + 4`, each the u16 `qs[g]` (grid index `& 511`, signs
    /// `KSIGNS_IQ2XS[>> 9]`); scales `1 + 2 (scales[j] & 15)` for the first 16 elements, `1 + 2 (scales[j] >> 4)`
    /// for the second.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let (qs, scales) = (blk.add(2) as *const u16, blk.add(66));
        for j in 0..8 {
            let q: [u16; 4] = std::array::from_fn(|k| qs.add(4 * j + k).read_unaligned());
            let g = _mm256_setr_epi64x(
                IQ2XS_GRID[(q[0] & 511) as usize] as i64,
                IQ2XS_GRID[(q[1] & 511) as usize] as i64,
                IQ2XS_GRID[(q[2] & 511) as usize] as i64,
                IQ2XS_GRID[(q[3] & 511) as usize] as i64,
            );
            let sign_bytes: [u8; 4] = std::array::from_fn(|k| KSIGNS_IQ2XS[(q[k] >> 9) as usize]);
            let sg = signs32(sign_bytes.as_ptr());
            signed_madd(s, x, 32 * j, g, sg, nibble_scales(*scales.add(j)));
        }
    }
}

/// The scales of a 32-element chunk with one 4-bit scale per 16 elements (IQ2_XS, IQ2_S), for the `madd`: i16
/// lanes 0..8 `1 + 2 (sc & 15)` (the first 16 elements), lanes 8..16 `1 + 2 (sc >> 4)` (the second).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibble_scales(sc: u8) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(1 + 2 * (sc >> 4) as i16), _mm_set1_epi16(1 + 2 * (sc & 15) as i16))
}

impl KQuant for IQ2S {
    const BYTES: usize = 82;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const DDX_MUL: f32 = 0.125;
    /// Elements `32 j..32 j + 32`: groups `4 j..4 j + 4`, group `4 j + k` with the grid index
    /// `qs[4 j + k] | ((qh[j] >> 2 k) & 3) << 8` and the sign byte `signs[4 j + k]` (bytes 2, 34, 66 + j of the
    /// block); scales as IQ2_XS from `scales[j]` (byte 74 + j).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        _bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let (qs, signs, qh, scales) = (blk.add(2), blk.add(34), blk.add(66), blk.add(74));
        for j in 0..8 {
            let h = *qh.add(j) as usize;
            let e = |k: usize| IQ2S_GRID[*qs.add(4 * j + k) as usize | ((h >> (2 * k)) & 3) << 8] as i64;
            let g = _mm256_setr_epi64x(e(0), e(1), e(2), e(3));
            let sg = signs32(signs.add(4 * j));
            signed_madd(s, x, 32 * j, g, sg, nibble_scales(*scales.add(j)));
        }
    }
}

impl KQuant for IQ1S {
    const BYTES: usize = 50;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const HAS_MIN: bool = false;
    const DDX_MUL: f32 = 0.125;
    /// Sub-block `j` with `h` the u16 at `qh[j]` (byte 34 + 2 j): group `k`'s grid index
    /// `qs[4 j + k] | ((h >> 3 k) & 7) << 8`, scale `2 ((h >> 12) & 7) + 1`, delta sign bit 15; its delta term
    /// reads the bsums of its two 16-element groups.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block<const RT: usize>(
        blk: *const u8,
        x: &[*const i8; RT],
        bs: &[*const i16; RT],
        s: &mut [__m256i; RT],
        _m: &mut [__m256i; RT],
    ) {
        let (qs, qh) = (blk.add(2), blk.add(34) as *const u16);
        let ones = _mm256_set1_epi8(1);
        let mut delta = [0i16; 16];
        for j in 0..8 {
            let h = qh.add(j).read_unaligned();
            let e = |k: usize| IQ1S_GRID[*qs.add(4 * j + k) as usize | (((h >> (3 * k)) & 7) as usize) << 8] as i64;
            let g = _mm256_setr_epi64x(e(0), e(1), e(2), e(3));
            let sc = 2 * ((h >> 12) & 7) as i16 + 1;
            let d = if h & 0x8000 != 0 { -sc } else { sc };
            delta[2 * j] = d;
            delta[2 * j + 1] = d;
            let scale = _mm256_set1_epi16(8 * sc);
            signed_madd(s, x, 32 * j, ones, g, scale);
        }
        let delta = load(delta.as_ptr() as *const u8);
        for r in 0..RT {
            s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(load(bs[r] as *const u8), delta));
        }
    }
}

/// Requests the cache lines of `bytes` bytes at `p` into L2 (never dereferenced: `p` may lie past the weight's
/// end; a prefetch changes no value).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn prefetch(p: *const u8, bytes: usize) {
    let mut at = 0;
    while at < bytes + 63 {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(at) as *const i8);
        at += 64;
    }
}

/// Whether a tile call prefetches its rows of the next tile: only the first row group's calls do (`First`), as a
/// type so that the kernel of each kind carries no branch for it.
trait Fetch {
    const ON: bool;
}

struct First;
struct Later;

impl Fetch for First {
    const ON: bool = true;
}

impl Fetch for Later {
    const ON: bool = false;
}

fn entry<T: KQuant>(cols: &[&[u8]; 8], act: &ActQ, r0: usize, rt: usize) -> [f32; 8] {
    assert!(act.block == 256 && r0 + rt <= act.rows, "K-quant tile: activation rows");
    assert!(cols.iter().all(|c| c.len() == act.nb * T::BYTES), "K-quant tile: weight rows");
    // SAFETY: this kernel is only picked for `Isa::Avx2`, which `matmul` checks against the CPU; the asserts above
    // bound every pointer the kernel forms.
    unsafe {
        if r0 == 0 {
            by_rows!(rt, tile::<T, First>(cols, act, r0))
        } else {
            by_rows!(rt, tile::<T, Later>(cols, act, r0))
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile<T: KQuant, P: Fetch, const C: usize, const RT: usize>(
    cols: &[&[u8]; 8],
    act: &ActQ,
    r0: usize,
) -> [f32; 8] {
    let (k, rows, nb) = (act.k, act.rows, act.nb);
    let offsets = lane_offsets::<RT>(cols);
    // The same block of the row one tile (8 rows) further: the rows of a tile are contiguous, so this streams the
    // next tile into L2 while this one is computed. Only the first row group does it: the later ones would ask
    // again for lines already on their way or in cache (2x at 16 rows, 8x at 64).
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
            if P::ON {
                prefetch(blk.wrapping_add(ahead), T::BYTES);
            }
            T::block::<RT>(blk, &x, &bs, &mut sc, &mut mc);
            s[c * RT..(c + 1) * RT].copy_from_slice(&sc);
            m[c * RT..(c + 1) * RT].copy_from_slice(&mc);
        }
        let g = words::<C>(cols, b * T::BYTES + T::D_AT, offsets);
        let dw = if T::D_F32 {
            _mm256_castsi256_ps(g)
        } else if T::D_HIGH {
            f16_hi(g)
        } else {
            f16_lo(g)
        };
        let dx = pattern_ps::<RT>(act.d_t.as_ptr().add(b * rows + r0));
        let ddx = _mm256_mul_ps(dw, dx);
        let ddx = if T::DDX_MUL != 1.0 { _mm256_mul_ps(ddx, _mm256_set1_ps(T::DDX_MUL)) } else { ddx };
        acc = _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(reduce8(&s)), acc);
        if T::HAS_MIN {
            let dmin = _mm256_xor_ps(_mm256_mul_ps(f16_hi(g), dx), neg);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(reduce8(&m)), acc);
        }
    }
    lanes(acc)
}
