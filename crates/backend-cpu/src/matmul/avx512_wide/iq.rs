//! The wide layouts and kernels of IQ4_XS, IQ4_NL and MXFP4 (see the parent module for the layout's idea).
//!
//! A packed IQ4_XS block is 34 lines: the 32 words of `qs` (line `4 j + w` is word `w` of sub-block `j`'s 16
//! bytes, whose low nibbles are elements `32 j + 4 w ..+4` and high nibbles `32 j + 16 + 4 w ..+4`), then block
//! word 0 (`d | scales_h << 16`) and word 1 (`scales_l`). Per line, the nibbles are looked up (`vpshufb`) in
//! `KVALUES_IQ4NL + 128` (so `1..=241`, the u8 operand of `vpdpbusd`), and eight `vpdpbusd` with activation words
//! broadcast make each lane's `P_j = Σ_{i∈j} (kv[q_i] + 128)·qx_i` (`|P_j| ≤ 32·241·127`). Per super-block
//! `S' = Σ_j sc_j · P_j` (`vpmulld`, `sc_j = ls_j - 32`) and `M = Σ_j sc_j · xs_j` (`vpdpwssd` with the pairs of
//! 32-value activation sums `xs_j` the Q4_K kernel reads), so `S = S' - 128·M` is the reference's exact integer
//! (`|S'| < 2^28`). Then per lane the reference's float step: `acc = fma(dw · dx, S, acc)`.
//!
//! IQ4_NL is packed as Q5_0 is (`pack_pairs`: a block's four `qs` words as lines, `d` in the group's tail); per
//! block `P = Σ (kv[q] + 128)·qx` by eight `vpdpbusd` on the looked-up nibbles, `S = P − 128·Σqx` (as Q8_0's
//! kernel), then `acc = fma(dw · dx, S, acc)`.
//!
//! MXFP4 is packed and computed as IQ4_NL, with its codes after the scale byte (`pack_pairs` from byte 1), the
//! table `KVALUES_MXFP4 + 128` (`116..=140`) and `dw = e8m0_to_f32_half(e)` from the low byte of each tail entry
//! (`avx512_legacy::e8m0_half16`).

use std::arch::x86_64::*;

use super::{block_lines, f16_low, lane_offsets, ld, pack_pairs, put, rows_out, tail_f16, Ahead, Wide, LANES, LINE};
use crate::matmul::act::ActQ;
use crate::matmul::avx512_legacy::e8m0_half16;

/// Bytes of an IQ4_XS block (`d`, `scales_h`, 4 bytes `scales_l`, 128 `qs` bytes).
const IQ4XS_BLOCK: usize = 136;
/// Lines of a packed IQ4_XS block: the 32 `qs` lines, then block words 0 and 1.
const IQ4XS_LINES: usize = 34;
const IQ4XS_DH: usize = 32;
const IQ4XS_SL: usize = 33;

pub(super) static IQ4XS: Wide = Wide {
    name: "IQ4_XS",
    block_bytes: IQ4XS_BLOCK,
    act_block: 256,
    lines: IQ4XS_LINES,
    tail: false,
    pairs: true,
    pack: pack_iq4xs,
    rows: [rows_iq4xs::<1>, rows_iq4xs::<2>, rows_iq4xs::<3>, rows_iq4xs::<4>],
};

/// Bytes of an IQ4_NL block (`d`, 16 `qs` bytes).
const IQ4NL_BLOCK: usize = 18;

pub(super) static IQ4NL: Wide = Wide {
    name: "IQ4_NL",
    block_bytes: IQ4NL_BLOCK,
    act_block: 32,
    lines: 4,
    tail: true,
    pairs: false,
    pack: pack_iq4nl,
    rows: [rows_nl::<1, false>, rows_nl::<2, false>, rows_nl::<3, false>, rows_nl::<4, false>],
};

/// Bytes of an MXFP4 block (E8M0 `e`, 16 `qs` bytes).
const MXFP4_BLOCK: usize = 17;

pub(super) static MXFP4: Wide = Wide {
    name: "MXFP4",
    block_bytes: MXFP4_BLOCK,
    act_block: 32,
    lines: 4,
    tail: true,
    pairs: false,
    pack: pack_mxfp4,
    rows: [rows_nl::<1, true>, rows_nl::<2, true>, rows_nl::<3, true>, rows_nl::<4, true>],
};

/// `kv + 128` in every 128-bit lane, a `vpshufb` table (`KVALUES_IQ4NL + 128`: `1..=241`, the IQ4 kernels';
/// `KVALUES_MXFP4 + 128`: `116..=140`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn table_u8(kv: &[i8; 16]) -> __m512i {
    let mut table = [0u8; 16];
    for (t, &v) in table.iter_mut().zip(kv) {
        *t = (v as i16 + 128) as u8;
    }
    _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr() as *const __m128i))
}

/// IQ4_NL weight rows `g0..g0 + live` into the group at `dst`.
///
/// # Safety
/// As [`pack_iq4xs`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_iq4nl(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    pack_pairs(bytes, row_bytes, g0, live, dst, IQ4NL_BLOCK, 2, 4, _mm512_setzero_si512())
}

/// MXFP4 weight rows `g0..g0 + live` into the group at `dst` (the four `qs` words from byte 1 as lines; the tail
/// entry's low byte is `e`).
///
/// # Safety
/// As [`pack_iq4xs`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_mxfp4(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    pack_pairs(bytes, row_bytes, g0, live, dst, MXFP4_BLOCK, 1, 4, _mm512_setzero_si512())
}

/// Activation rows `r0..r0 + RT` against one packed IQ4_NL (`MX` false) or MXFP4 (`MX`) group: `[RT][16]`
/// results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_nl<const RT: usize, const MX: bool>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let table = table_u8(if MX { &tf_quant::KVALUES_MXFP4 } else { &tf_quant::KVALUES_IQ4NL });
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * 4 * LINE);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let mut s = [zero; RT];
        for i in 0..4 {
            let v = ld(p, i);
            let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
            let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
            for r in 0..RT {
                let xl = _mm512_set1_epi32((x[r].add(4 * i) as *const i32).read_unaligned());
                let xh = _mm512_set1_epi32((x[r].add(16 + 4 * i) as *const i32).read_unaligned());
                s[r] = _mm512_dpbusd_epi32(s[r], lo, xl);
                s[r] = _mm512_dpbusd_epi32(s[r], hi, xh);
            }
        }
        let tail = g.add(nb * 4 * LINE + b * 2 * LANES);
        let d = if MX {
            e8m0_half16(_mm512_cvtepu16_epi32(_mm256_loadu_si256(tail as *const __m256i)))
        } else {
            tail_f16(tail)
        };
        for r in 0..RT {
            let sx = _mm512_set1_epi32(*act.s_t.as_ptr().add(b * rows + r0 + r));
            let total = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<7>(sx));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}

/// IQ4_XS weight rows `g0..g0 + live` into the group at `dst` (16 × 16 word transposes of the rows' blocks).
///
/// # Safety
/// AVX-512 F/BW/VNNI; rows `g0..g0 + live` of `row_bytes` (whole blocks) lie in `bytes`, `live` in `1..=16`, and
/// `dst` has a group's bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_iq4xs(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    assert!((g0 + live) * row_bytes <= bytes.len() && (1..=LANES).contains(&live));
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    for b in 0..row_bytes / IQ4XS_BLOCK {
        let blk = base.add(b * IQ4XS_BLOCK);
        let p = dst.add(b * IQ4XS_LINES * LINE);
        // Block words: 0 = d | scales_h, 1 = scales_l, 2..34 = `qs`.
        let w: [[__m512i; 16]; 3] =
            [block_lines(&offs, blk, 0, 16), block_lines(&offs, blk, 64, 16), block_lines(&offs, blk, 128, 2)];
        for line in 0..32 {
            put(p, line, w[(2 + line) / 16][(2 + line) % 16]);
        }
        put(p, IQ4XS_DH, w[0][0]);
        put(p, IQ4XS_SL, w[0][1]);
    }
}

/// Activation rows `r0..r0 + RT` against one packed IQ4_XS group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks, `pairs` holds `[act.rows][act.nb][4]` words and
/// `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_iq4xs<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let table = table_u8(&tf_quant::KVALUES_IQ4NL);
    let m4 = _mm512_set1_epi8(0x0f);
    let (m15, m3, m16) = (_mm512_set1_epi32(15), _mm512_set1_epi32(3), _mm512_set1_epi32(0xffff));
    let bias = _mm512_set1_epi32(32);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * IQ4XS_LINES * LINE);
        let (dh, sl) = (ld(p, IQ4XS_DH), ld(p, IQ4XS_SL));
        // sc_j = ((scales_l >> 4 j) & 15 | ((scales_h >> 2 j) & 3) << 4) - 32 per lane.
        let mut sc = [zero; 8];
        for (j, s) in sc.iter_mut().enumerate() {
            let low = _mm512_and_si512(_mm512_srl_epi32(sl, _mm_cvtsi32_si128(4 * j as i32)), m15);
            let high = _mm512_and_si512(_mm512_srl_epi32(dh, _mm_cvtsi32_si128(16 + 2 * j as i32)), m3);
            *s = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32::<4>(high)), bias);
        }
        // `[RT]` activation blocks of super-block `b`.
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 256 * b);
        }
        let mut s = [zero; RT];
        for (j, &scj) in sc.iter().enumerate() {
            let mut pj = [zero; RT];
            for w in 0..4 {
                let v = ld(p, 4 * j + w);
                let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
                let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
                for r in 0..RT {
                    let xl = _mm512_set1_epi32((x[r].add(32 * j + 4 * w) as *const i32).read_unaligned());
                    let xh = _mm512_set1_epi32((x[r].add(32 * j + 16 + 4 * w) as *const i32).read_unaligned());
                    pj[r] = _mm512_dpbusd_epi32(pj[r], lo, xl);
                    pj[r] = _mm512_dpbusd_epi32(pj[r], hi, xh);
                }
            }
            for r in 0..RT {
                s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(pj[r], scj));
            }
        }
        let d = f16_low(dh);
        for r in 0..RT {
            // M = Σ_j sc_j · xs_j by i16 pairs (sub-blocks 2i, 2i + 1), then S = S' - 128·M.
            let pr = pairs.as_ptr().add(((r0 + r) * nb + b) * 4);
            let mut m = zero;
            for i in 0..4 {
                let scp = _mm512_or_si512(_mm512_and_si512(sc[2 * i], m16), _mm512_slli_epi32::<16>(sc[2 * i + 1]));
                m = _mm512_dpwssd_epi32(m, scp, _mm512_set1_epi32(*pr.add(i) as i32));
            }
            let st = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<7>(m));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(st), acc[r]);
        }
    }
    rows_out(&acc)
}
