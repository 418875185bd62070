//! The AVX2 wide kernels of the K-quants Q4_K, Q5_K and Q6_K (layout and arithmetic in the parent module's notes).

use std::arch::x86_64::*;

use super::super::act::ActQ;
use super::{act_rows, bcast, f16x8, fifth, ld, put_lanes, rows_out, Ahead, Wide, LANES, LINE};

pub(super) static Q4K: Wide = Wide {
    name: "Q4_K",
    block_bytes: Q4K_BLOCK,
    act_block: 256,
    lines: Q4K_LINES,
    tail: false,
    pairs: true,
    pack: pack_q4k,
    rows: [rows_q4k::<1>, rows_q4k::<2>, rows_q4k::<3>, rows_q4k::<4>],
};

pub(super) static Q5K: Wide = Wide {
    name: "Q5_K",
    block_bytes: Q5K_BLOCK,
    act_block: 256,
    lines: Q5K_LINES,
    tail: false,
    pairs: true,
    pack: pack_q5k,
    rows: [rows_q5k::<1>, rows_q5k::<2>, rows_q5k::<3>, rows_q5k::<4>],
};

pub(super) static Q6K: Wide = Wide {
    name: "Q6_K",
    block_bytes: Q6K_BLOCK,
    act_block: 256,
    lines: Q6K_LINES,
    tail: true,
    pairs: false,
    pack: pack_q6k,
    rows: [rows_q6k::<1>, rows_q6k::<2>, rows_q6k::<3>, rows_q6k::<4>],
};

/// Bytes of a Q4_K block (`d`, `dmin`, 12 scale bytes, 128 `qs` bytes).
const Q4K_BLOCK: usize = 144;
/// Lines of a packed Q4_K block: `qs` lines `[4 c][8 g]` (block bytes `16 + 32 c + 4 g`), then one line of the
/// rows' `d` (8 f16) and `dmin` (8 f16), then the three words of the 12 packed scale bytes.
const Q4K_LINES: usize = 36;
const Q4K_DD: usize = 32;
const Q4K_SC: usize = 33;

fn pack_q4k(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q4K_BLOCK, b * Q4K_LINES * LINE);
        for line in 0..32 {
            put_lanes(rows, blk + 16 + 4 * line, 4, &mut dst[p + LINE * line..]);
        }
        put_lanes(rows, blk, 2, &mut dst[p + LINE * Q4K_DD..]);
        put_lanes(rows, blk + 2, 2, &mut dst[p + LINE * Q4K_DD + 2 * LANES..]);
        for w in 0..3 {
            put_lanes(rows, blk + 4 + 4 * w, 4, &mut dst[p + LINE * (Q4K_SC + w)..]);
        }
    }
}

/// Byte `i` (0..4) of each 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn byte(v: __m256i, i: i32) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(8 * i)), _mm256_set1_epi32(0xff))
}

/// Q4_K: chunk `c` (64 elements) word `g` holds elements `64 c + 4 g ..+4` of sub-block `2 c` in its low nibbles
/// and `64 c + 32 + 4 g ..+4` of sub-block `2 c + 1` in its high nibbles. Per sub-block, eight `vpmaddubsw` added in
/// i16 (16 products per i16: `|·| ≤ 16·15·127 < 2^15`), then `vpmaddwd` with the scale in both halves of the lane
/// gives `sc_j · P_j`; `S = Σ_j sc_j · P_j`, and the mins term `M = Σ_j min_j · (bsum_2j + bsum_2j+1)` is four
/// `vpmaddwd` per row and super-block. The scales and mins are unpacked as `tf_quant::q4k_scale_min` (GGML's
/// `get_scale_min_k4`) does, per lane. Then the reference's `acc = fma(dw · dx, S, acc)`,
/// `acc = fma(-(dmin · dx), M, acc)`.
///
/// Activation rows `r0..r0 + RT` against one packed Q4_K group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// AVX2/FMA/F16C; `g` is a packed group of `act.nb` blocks, `pairs` holds `[act.rows][act.nb][4]` words and
/// `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q4k<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let nb = act.nb;
    let m4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * Q4K_LINES * LINE);
        let sc16 = q4k_scales(p, Q4K_SC);
        let x = act_rows::<RT>(act, r0, b, 256);
        let mut s = [zero; RT];
        for c in 0..4 {
            for half in 0..2 {
                // Sub-block 2 c + half of every row.
                let mut t = [zero; RT];
                for step in 0..8 {
                    let w = ld(p, 8 * c + step);
                    let v = if half == 0 { w } else { _mm256_srli_epi16::<4>(w) };
                    let v = _mm256_and_si256(v, m4);
                    for r in 0..RT {
                        let xv = bcast(x[r].add(64 * c + 32 * half + 4 * step));
                        t[r] = _mm256_add_epi16(t[r], _mm256_maddubs_epi16(v, xv));
                    }
                }
                for r in 0..RT {
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(t[r], sc16[2 * c + half]));
                }
            }
        }
        sm_update(p.add(Q4K_DD * LINE), &s, &q4k_mins(p, Q4K_SC), act, pairs, r0, b, &mut acc);
    }
    rows_out(&acc)
}

/// The eight scales of each lane in both i16 halves of its word, from the three scale lines at line `at` of a
/// packed Q4_K / Q5_K block `p`, unpacked as `tf_quant::q4k_scale_min` (GGML's `get_scale_min_k4`) does, per lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_scales(p: *const u8, at: usize) -> [__m256i; 8] {
    let (m15, m63, m3) = (_mm256_set1_epi32(15), _mm256_set1_epi32(63), _mm256_set1_epi32(3));
    let (l0, l2) = (ld(p, at), ld(p, at + 2));
    let mut sc = [_mm256_setzero_si256(); 8];
    for j in 0..4 {
        let (b0, b2) = (byte(l0, j), byte(l2, j));
        let j = j as usize;
        sc[j] = _mm256_and_si256(b0, m63);
        let hi0 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(b0), m3));
        sc[j + 4] = _mm256_or_si256(_mm256_and_si256(b2, m15), hi0);
    }
    std::array::from_fn(|j| _mm256_or_si256(sc[j], _mm256_slli_epi32::<16>(sc[j])))
}

/// Each lane's four min pairs (`min_2i | min_2i+1 << 16`), from the scale lines as [`q4k_scales`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_mins(p: *const u8, at: usize) -> [__m256i; 4] {
    let (m63, m3) = (_mm256_set1_epi32(63), _mm256_set1_epi32(3));
    let (l1, l2) = (ld(p, at + 1), ld(p, at + 2));
    let mut mn = [_mm256_setzero_si256(); 8];
    for j in 0..4 {
        let (b1, b2) = (byte(l1, j), byte(l2, j));
        let j = j as usize;
        mn[j] = _mm256_and_si256(b1, m63);
        let hi1 = _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(b1), m3));
        mn[j + 4] = _mm256_or_si256(_mm256_srli_epi32::<4>(b2), hi1);
    }
    std::array::from_fn(|i| _mm256_or_si256(mn[2 * i], _mm256_slli_epi32::<16>(mn[2 * i + 1])))
}

/// The float steps of a Q4_K / Q5_K super-block `b` for rows `r0..r0 + RT`: the mins term `M = Σ_i mnp_i · pair_i`
/// (four `vpmaddwd`), then the reference's `acc = fma(dw · dx, S, acc)`, `acc = fma(-(dmin · dx), M, acc)`; `dd` is
/// the block's line of 8 `d` then 8 `dmin` (f16).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sm_update<const RT: usize>(
    dd: *const u8,
    s: &[__m256i; RT],
    mnp: &[__m256i; 4],
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    b: usize,
    acc: &mut [__m256; RT],
) {
    let (nb, rows) = (act.nb, act.rows);
    let sign = _mm256_set1_ps(-0.0);
    let d = f16x8(dd);
    let dmin = f16x8(dd.add(2 * LANES));
    for r in 0..RT {
        let pr = pairs.as_ptr().add(((r0 + r) * nb + b) * 4);
        let mut m = _mm256_setzero_si256();
        for (i, mnp) in mnp.iter().enumerate() {
            m = _mm256_add_epi32(m, _mm256_madd_epi16(*mnp, _mm256_set1_epi32(*pr.add(i) as i32)));
        }
        let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(s[r]), acc[r]);
        let dm = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), sign);
        acc[r] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(m), acc[r]);
    }
}

/// Bytes of a Q5_K block (`d`, `dmin`, 12 scale bytes, 32 `qh` bytes, 128 `qs` bytes).
const Q5K_BLOCK: usize = 176;
/// Lines of a packed Q5_K block: `qs` lines `[4 c][8 g]` (block bytes `48 + 32 c + 4 g`), the `qh` lines `[8 g]`
/// (bytes `16 + 4 g`), one line of the rows' `d` and `dmin`, then the three words of the packed scale bytes.
const Q5K_LINES: usize = 44;
const Q5K_QH: usize = 32;
const Q5K_DD: usize = 40;
const Q5K_SC: usize = 41;

fn pack_q5k(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q5K_BLOCK, b * Q5K_LINES * LINE);
        for line in 0..32 {
            put_lanes(rows, blk + 48 + 4 * line, 4, &mut dst[p + LINE * line..]);
        }
        for g in 0..8 {
            put_lanes(rows, blk + 16 + 4 * g, 4, &mut dst[p + LINE * (Q5K_QH + g)..]);
        }
        put_lanes(rows, blk, 2, &mut dst[p + LINE * Q5K_DD..]);
        put_lanes(rows, blk + 2, 2, &mut dst[p + LINE * Q5K_DD + 2 * LANES..]);
        for w in 0..3 {
            put_lanes(rows, blk + 4 + 4 * w, 4, &mut dst[p + LINE * (Q5K_SC + w)..]);
        }
    }
}

/// Sub-block `J` (chunk `J / 2`, the low nibbles for even `J`, else the high) of a packed Q5_K block `p` into `s`:
/// `s[r] += sc_J · P_J` for rows `x`, in two runs of four steps.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k_sub<const RT: usize, const J: i32>(
    p: *const u8,
    x: &[*const i8; RT],
    sc16: __m256i,
    s: &mut [__m256i; RT],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let (c, half) = (J as usize / 2, J as usize % 2);
    for run in 0..2 {
        let mut t = [_mm256_setzero_si256(); RT];
        for step in 4 * run..4 * run + 4 {
            let w = ld(p, 8 * c + step);
            let nib = _mm256_and_si256(if half == 0 { w } else { _mm256_srli_epi16::<4>(w) }, m4);
            let v = _mm256_or_si256(nib, fifth::<J>(ld(p, Q5K_QH + step)));
            for r in 0..RT {
                let xv = bcast(x[r].add(64 * c + 32 * half + 4 * step));
                t[r] = _mm256_add_epi16(t[r], _mm256_maddubs_epi16(v, xv));
            }
        }
        for r in 0..RT {
            s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(t[r], sc16));
        }
    }
}

/// Q5_K: as Q4_K, each value's fifth bit (element `e` uses bit `e / 32` of `qh[e % 32]`: for chunk `c` word `g`,
/// bit `2 c` of the `qh` bytes `4 g ..+4` for the low nibbles, `2 c + 1` for the high) added as 16. Five-bit
/// values: four `vpmaddubsw` added in i16 (`|·| ≤ 8·31·127 < 2^15`), widened by `vpmaddwd` with the scale, twice per
/// sub-block.
///
/// Activation rows `r0..r0 + RT` against one packed Q5_K group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// As [`rows_q4k`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q5k<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..act.nb {
        ahead.block(b);
        let p = g.add(b * Q5K_LINES * LINE);
        let sc16 = q4k_scales(p, Q5K_SC);
        let x = act_rows::<RT>(act, r0, b, 256);
        let mut s = [zero; RT];
        q5k_sub::<RT, 0>(p, &x, sc16[0], &mut s);
        q5k_sub::<RT, 1>(p, &x, sc16[1], &mut s);
        q5k_sub::<RT, 2>(p, &x, sc16[2], &mut s);
        q5k_sub::<RT, 3>(p, &x, sc16[3], &mut s);
        q5k_sub::<RT, 4>(p, &x, sc16[4], &mut s);
        q5k_sub::<RT, 5>(p, &x, sc16[5], &mut s);
        q5k_sub::<RT, 6>(p, &x, sc16[6], &mut s);
        q5k_sub::<RT, 7>(p, &x, sc16[7], &mut s);
        sm_update(p.add(Q5K_DD * LINE), &s, &q4k_mins(p, Q5K_SC), act, pairs, r0, b, &mut acc);
    }
    rows_out(&acc)
}

/// Bytes of a Q6_K block (`ql` 128, `qh` 64, 16 i8 scales, `d`).
const Q6K_BLOCK: usize = 210;
/// Lines of a packed Q6_K block: per half `h` and step `g`, the `ql` lines of `n = 0, 1` (block bytes
/// `64 h + 32 n + 4 g`) and the `qh` line (`128 + 32 h + 4 g`), `[2 h][8 g][3]`; then the four words of i8 scales.
/// The group's tail holds `d`.
const Q6K_LINES: usize = 52;
const Q6K_SC: usize = 48;

fn pack_q6k(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q6K_BLOCK, b * Q6K_LINES * LINE);
        for h in 0..2 {
            for step in 0..8 {
                let at = p + LINE * 3 * (8 * h + step);
                put_lanes(rows, blk + 64 * h + 4 * step, 4, &mut dst[at..]);
                put_lanes(rows, blk + 64 * h + 32 + 4 * step, 4, &mut dst[at + LINE..]);
                put_lanes(rows, blk + 128 + 32 * h + 4 * step, 4, &mut dst[at + 2 * LINE..]);
            }
        }
        for w in 0..4 {
            put_lanes(rows, blk + 192 + 4 * w, 4, &mut dst[p + LINE * (Q6K_SC + w)..]);
        }
        put_lanes(rows, blk + 208, 2, &mut dst[nb * Q6K_LINES * LINE + b * 2 * LANES..]);
    }
}

/// The unsigned six-bit values of the four fields `t` of step line triple `at`: element `128 h + 32 t + l` is
/// `(ql[64 h + 32 (t % 2) + l] >> 4 (t / 2)) & 15 | ((qh[32 h + l] >> 2 t) & 3) << 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_fields(p: *const u8, at: usize) -> [__m256i; 4] {
    let (ql0, ql1, qh) = (ld(p, at), ld(p, at + 1), ld(p, at + 2));
    [
        six(ql0, _mm256_slli_epi16::<4>(qh)),
        six(ql1, _mm256_slli_epi16::<2>(qh)),
        six(_mm256_srli_epi16::<4>(ql0), qh),
        six(_mm256_srli_epi16::<4>(ql1), _mm256_srli_epi16::<2>(qh)),
    ]
}

/// `lo & 0x0f | hi & 0x30` per byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn six(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(0x0f)), _mm256_and_si256(hi, _mm256_set1_epi8(0x30)))
}

/// Q6_K: the four bytes at `l = 4 g ..` of one lane's step lines give four elements of each field `t`, in
/// sub-block `8 h + 2 t + g / 4`. `S = Σ_j sc_j · P_j − 32 · Σ_j sc_j · bsum_j` with the unsigned `P_j`: two
/// `vpmaddubsw` of a field added in i16 (`|·| ≤ 4·63·127 < 2^15`), widened by `vpmaddwd` with the scale (exact:
/// `|Σ sc·P| ≤ 16·128·16·63·127 < 2^31`); then the reference's `acc = fma(dw · dx, S, acc)`.
///
/// Activation rows `r0..r0 + RT` against one packed Q6_K group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// AVX2/FMA/F16C; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q6k<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (nb, rows) = (act.nb, act.rows);
    let m16 = _mm256_set1_epi32(0xffff);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * Q6K_LINES * LINE);
        // The 16 scales of each lane, sign-extended (scale 4 w + i is byte i of scale word w), and in both i16
        // halves.
        let mut sc = [zero; 16];
        for w in 0..4 {
            let sw = ld(p, Q6K_SC + w);
            for i in 0..4 {
                sc[4 * w + i] = _mm256_srai_epi32::<24>(_mm256_sll_epi32(sw, _mm_cvtsi32_si128(24 - 8 * i as i32)));
            }
        }
        let sc16: [__m256i; 16] =
            std::array::from_fn(|j| _mm256_or_si256(_mm256_and_si256(sc[j], m16), _mm256_slli_epi32::<16>(sc[j])));
        let x = act_rows::<RT>(act, r0, b, 256);
        let mut s = [zero; RT];
        for h in 0..2 {
            for pair in 0..4 {
                // Steps 2 pair, 2 pair + 1: field t in sub-block 8 h + 2 t + pair / 2.
                let mut u = [[zero; RT]; 4];
                for step in 2 * pair..2 * pair + 2 {
                    let v = q6k_fields(p, 3 * (8 * h + step));
                    for r in 0..RT {
                        for t in 0..4 {
                            let xv = bcast(x[r].add(128 * h + 32 * t + 4 * step));
                            u[t][r] = _mm256_add_epi16(u[t][r], _mm256_maddubs_epi16(v[t], xv));
                        }
                    }
                }
                for (t, ut) in u.iter().enumerate() {
                    for r in 0..RT {
                        s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(ut[r], sc16[8 * h + 2 * t + pair / 2]));
                    }
                }
            }
        }
        let d = f16x8(g.add(nb * Q6K_LINES * LINE + b * 2 * LANES));
        for r in 0..RT {
            // Σ_j sc_j · bsum_j over the row's 16 bsums, as i16 pairs.
            let bs = act.sums.as_ptr().add(((r0 + r) * nb + b) * 16) as *const i32;
            let mut m = zero;
            for i in 0..8 {
                let scp = _mm256_or_si256(_mm256_and_si256(sc[2 * i], m16), _mm256_slli_epi32::<16>(sc[2 * i + 1]));
                m = _mm256_add_epi32(m, _mm256_madd_epi16(scp, _mm256_set1_epi32(bs.add(i).read_unaligned())));
            }
            let total = _mm256_sub_epi32(s[r], _mm256_slli_epi32::<5>(m));
            let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}
