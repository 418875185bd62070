//! Checkpoint mode with AVX-512 VNNI for Q4_K windows of [`MIN_ROWS`] rows or more (prefill chunks): sixteen
//! weight rows side by side, one per i32 lane, so that the integer sums of a sub-block accumulate in place and
//! need no horizontal reduction, and the sub-block scales cost one multiply per sub-block instead of one per
//! four elements.
//!
//! `avx512_kquant` computes one weight row per register: each `vpdpbusd` lane sums four products of one
//! sub-block, so every lane then needs its scale (`vpackssdw` + `vpdpwssd`, a third of the multiplies) and every
//! super-block ends in a horizontal reduction. Here, per group of 16 weight rows and super-block, the weights are
//! first repacked into a scratch buffer (once per matmul call and group, shared by every activation row of the
//! window): for chunk `c` (64 elements) and step `g` (0..8), one 64-byte line holds, for each of the 16 weight
//! rows, the four `qs` bytes `32 c + 4 g ..` — whose low nibbles are elements `64 c + 4 g ..+4` and whose high
//! nibbles are elements `64 c + 32 + 4 g ..+4`. A `vpdpbusd` of a line's nibbles with four activation bytes
//! broadcast to every lane adds four products of one sub-block to each weight row's lane; eight of them make
//! that sub-block's sum `P_j` (`|P_j| ≤ 32·15·127`), and `S += sc_j · P_j` (`vpmulld`) per sub-block. The mins
//! term `M = Σ_j min_j · (bsum_2j + bsum_2j+1)` is four `vpdpwssd` per row and super-block. All of it is exact
//! integer arithmetic, so `S` and `M` are the reference's; the float steps per lane are then exactly
//! `avx512_kquant::tile`'s and the reference's: `acc = fma(dw · dx, S, acc)`, `acc = fma(-(dmin · dx), M, acc)`,
//! super-blocks in order.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::act::ActQ;
use super::Out;

/// Activation rows from which `matmul` runs Q4_K through this kernel (below it, repacking a group would cost more
/// than it saves; the bits are the same either way).
pub(crate) const MIN_ROWS: usize = 16;

/// Weight rows per group: the i32 lanes of a 512-bit register.
const LANES: usize = 16;
/// Bytes of a Q4_K block (`d`, `dmin`, 12 scale bytes, 128 `qs` bytes).
const BLOCK: usize = 144;
/// u32 words of one group's repacked super-block: `qs` lines `[4 c][8 g][16]`, scales `[8 j][16]`, min pairs
/// `[4][16]` (`min_2i | min_2i+1 << 16`), `d` `[16]` and `dmin` `[16]` as f32 bits.
const QS_AT: usize = 0;
const SC_AT: usize = 512;
const MN_AT: usize = SC_AT + 8 * LANES;
const D_AT: usize = MN_AT + 4 * LANES;
const DMIN_AT: usize = D_AT + LANES;
const WORDS: usize = DMIN_AT + LANES;

thread_local! {
    /// `[nb * WORDS]` one repacked group; `[rows][nb][4]` the activation sum pairs.
    static SCRATCH: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Q4_K, checkpoint mode, output columns `c0..c1` of `out` for every activation row of `act` (`bytes`: the
/// weight's `[N][row_bytes]` raw blocks). Bit-equal to `avx512_kquant` and the reference.
pub(super) fn q4k_chunk(bytes: &[u8], row_bytes: usize, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (rows, nb) = (act.rows, act.nb);
    assert!(act.block == 256 && row_bytes == nb * BLOCK, "Q4_K wide kernel: activation and weight layouts");
    assert!(c1 * row_bytes <= bytes.len() && act.qs.len() == rows * act.k, "Q4_K wide kernel: sizes");
    assert!(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"), "Q4_K wide kernel");
    SCRATCH.with_borrow_mut(|(group, pairs)| {
        // Per row and super-block, the four i16 pairs (sum of 32 values of sub-block 2i, of 2i + 1).
        pairs.clear();
        pairs.extend(act.sums.chunks_exact(16).flat_map(|s| {
            (0..4).map(move |i| {
                let lo = s[4 * i] + s[4 * i + 1];
                let hi = s[4 * i + 2] + s[4 * i + 3];
                lo as u16 as u32 | (hi as u16 as u32) << 16
            })
        }));
        group.resize(nb * WORDS, 0);
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            repack(bytes, row_bytes, g0, live, group);
            let mut r0 = 0;
            while r0 < rows {
                let rt = (rows - r0).min(4);
                // SAFETY: AVX-512 F/BW/VNNI checked above; `group` holds `nb` repacked super-blocks, `pairs` and
                // `act` every row's data (the asserts above).
                let res: [[f32; LANES]; 4] = unsafe {
                    match rt {
                        4 => group_rows::<4>(group, act, pairs, r0),
                        3 => group_rows::<3>(group, act, pairs, r0),
                        2 => group_rows::<2>(group, act, pairs, r0),
                        _ => group_rows::<1>(group, act, pairs, r0),
                    }
                };
                for (r, lanes) in res.iter().enumerate().take(rt) {
                    for (lane, &v) in lanes.iter().enumerate().take(live) {
                        // SAFETY: this task owns columns `c0..c1`.
                        unsafe { out.set(r0 + r, g0 + lane, v) };
                    }
                }
                r0 += rt;
            }
        }
    });
}

/// Weight rows `g0..g0 + live` into `group` (lanes past `live` repeat the last live row; their sums are dropped).
fn repack(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    for lane in 0..LANES {
        let row = &bytes[(g0 + lane.min(live - 1)) * row_bytes..][..row_bytes];
        for (b, blk) in row.chunks_exact(BLOCK).enumerate() {
            let s = &mut group[b * WORDS..(b + 1) * WORDS];
            let half = |at: usize| tf_quant::f16_bits_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
            s[D_AT + lane] = half(0).to_bits();
            s[DMIN_AT + lane] = half(2).to_bits();
            let (sc, mn) = tf_quant::q4k_scale_min(blk[4..16].try_into().expect("12 scale bytes"));
            for j in 0..8 {
                s[SC_AT + j * LANES + lane] = sc[j] as u32;
            }
            for i in 0..4 {
                s[MN_AT + i * LANES + lane] = mn[2 * i] as u32 | (mn[2 * i + 1] as u32) << 16;
            }
            for (line, q) in blk[16..].chunks_exact(4).enumerate() {
                // `qs` bytes 32 c + 4 g.. → line 8 c + g.
                s[QS_AT + line * LANES + lane] = u32::from_le_bytes(q.try_into().expect("4 bytes"));
            }
        }
    }
}

/// Activation rows `r0..r0 + RT` against one repacked group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked super-blocks, `pairs` `[act.rows][act.nb][4]` words and
/// `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows<const RT: usize>(group: &[u32], act: &ActQ, pairs: &[u32], r0: usize) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let sign = _mm512_set1_epi32(i32::MIN);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        let p = group.as_ptr().add(b * WORDS);
        // `[RT]` activation blocks of super-block `b`.
        let x: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b));
        let mut s = [zero; RT];
        for c in 0..4 {
            // Sub-block 2 c (low nibbles) and 2 c + 1 (high nibbles) of every row.
            let mut lo = [zero; RT];
            let mut hi = [zero; RT];
            for g in 0..8 {
                let w = _mm512_loadu_si512(p.add(QS_AT + (8 * c + g) * LANES) as *const __m512i);
                let wl = _mm512_and_si512(w, m4);
                let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                for r in 0..RT {
                    let xl = _mm512_set1_epi32((x[r].add(64 * c + 4 * g) as *const i32).read_unaligned());
                    let xh = _mm512_set1_epi32((x[r].add(64 * c + 32 + 4 * g) as *const i32).read_unaligned());
                    lo[r] = _mm512_dpbusd_epi32(lo[r], wl, xl);
                    hi[r] = _mm512_dpbusd_epi32(hi[r], wh, xh);
                }
            }
            let scl = _mm512_loadu_si512(p.add(SC_AT + 2 * c * LANES) as *const __m512i);
            let sch = _mm512_loadu_si512(p.add(SC_AT + (2 * c + 1) * LANES) as *const __m512i);
            for r in 0..RT {
                s[r] = _mm512_add_epi32(
                    s[r],
                    _mm512_add_epi32(_mm512_mullo_epi32(lo[r], scl), _mm512_mullo_epi32(hi[r], sch)),
                );
            }
        }
        let d = _mm512_loadu_ps(p.add(D_AT) as *const f32);
        let dmin = _mm512_loadu_ps(p.add(DMIN_AT) as *const f32);
        for r in 0..RT {
            let pr = pairs.as_ptr().add(((r0 + r) * nb + b) * 4);
            let mut m = zero;
            for i in 0..4 {
                let mn = _mm512_loadu_si512(p.add(MN_AT + i * LANES) as *const __m512i);
                m = _mm512_dpwssd_epi32(m, mn, _mm512_set1_epi32(*pr.add(i) as i32));
            }
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(s[r]), acc[r]);
            let dm = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, dx)), sign));
            acc[r] = _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(m), acc[r]);
        }
    }
    let mut res = [[0f32; LANES]; 4];
    for r in 0..RT {
        _mm512_storeu_ps(res[r].as_mut_ptr(), acc[r]);
    }
    res
}

/// u32 words of one group's repacked Q6_K super-block: per half `h` and step `g`, the `ql` lines of `n = 0, 1` and
/// the `qh` line (`[2 h][8 g][3][16]`), scales `[16 j][16]` as i32, scale pairs `[8][16]` (`sc_2i | sc_2i+1 << 16`
/// as i16), `d` `[16]` as f32 bits.
const Q6_LINES_AT: usize = 0;
const Q6_SC_AT: usize = 2 * 8 * 3 * LANES;
const Q6_SCP_AT: usize = Q6_SC_AT + 16 * LANES;
const Q6_D_AT: usize = Q6_SCP_AT + 8 * LANES;
const Q6_WORDS: usize = Q6_D_AT + LANES;
/// Bytes of a Q6_K block (`ql` 128, `qh` 64, 16 i8 scales, `d`).
const Q6_BLOCK: usize = 210;

/// Q6_K, as [`q4k_chunk`]. Element `128 h + 32 t + l` is `(ql[64 h + 32 (t % 2) + l] >> 4 (t / 2)) & 15 |
/// ((qh[32 h + l] >> 2 t) & 3) << 4`, minus 32: the four `ql`/`qh` bytes at `l = 4 g ..` of one lane give four
/// elements of each `t`, in sub-block `8 h + 2 t + g / 4`. `S = Σ_j sc_j · P_j − 32 · Σ_j sc_j · bsum_j` with the
/// unsigned `P_j` (exact: `|Σ sc·P| ≤ 16·128·16·63·127 < 2^31`).
pub(super) fn q6k_chunk(bytes: &[u8], row_bytes: usize, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (rows, nb) = (act.rows, act.nb);
    assert!(act.block == 256 && row_bytes == nb * Q6_BLOCK, "Q6_K wide kernel: activation and weight layouts");
    assert!(c1 * row_bytes <= bytes.len() && act.qs.len() == rows * act.k, "Q6_K wide kernel: sizes");
    assert!(act.sums.len() == rows * nb * 16, "Q6_K wide kernel: sums");
    assert!(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"), "Q6_K wide kernel");
    SCRATCH.with_borrow_mut(|(group, _)| {
        group.resize(nb * Q6_WORDS, 0);
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            repack_q6k(bytes, row_bytes, g0, live, group);
            let mut r0 = 0;
            while r0 < rows {
                let rt = (rows - r0).min(4);
                // SAFETY: AVX-512 F/BW/VNNI checked above; `group` holds `nb` repacked super-blocks and `act`
                // every row's data (the asserts above).
                let res: [[f32; LANES]; 4] = unsafe {
                    match rt {
                        4 => group_rows_q6k::<4>(group, act, r0),
                        3 => group_rows_q6k::<3>(group, act, r0),
                        2 => group_rows_q6k::<2>(group, act, r0),
                        _ => group_rows_q6k::<1>(group, act, r0),
                    }
                };
                for (r, lanes) in res.iter().enumerate().take(rt) {
                    for (lane, &v) in lanes.iter().enumerate().take(live) {
                        // SAFETY: this task owns columns `c0..c1`.
                        unsafe { out.set(r0 + r, g0 + lane, v) };
                    }
                }
                r0 += rt;
            }
        }
    });
}

/// Q6_K weight rows `g0..g0 + live` into `group` (as [`repack`]).
fn repack_q6k(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    for lane in 0..LANES {
        let row = &bytes[(g0 + lane.min(live - 1)) * row_bytes..][..row_bytes];
        for (b, blk) in row.chunks_exact(Q6_BLOCK).enumerate() {
            let s = &mut group[b * Q6_WORDS..(b + 1) * Q6_WORDS];
            let word = |at: usize| u32::from_le_bytes(blk[at..at + 4].try_into().expect("4 bytes"));
            for h in 0..2 {
                for g in 0..8 {
                    let at = Q6_LINES_AT + ((8 * h + g) * 3) * LANES + lane;
                    s[at] = word(64 * h + 4 * g);
                    s[at + LANES] = word(64 * h + 32 + 4 * g);
                    s[at + 2 * LANES] = word(128 + 32 * h + 4 * g);
                }
            }
            let sc = |j: usize| blk[192 + j] as i8 as i32;
            for j in 0..16 {
                s[Q6_SC_AT + j * LANES + lane] = sc(j) as u32;
            }
            for i in 0..8 {
                s[Q6_SCP_AT + i * LANES + lane] = sc(2 * i) as u16 as u32 | (sc(2 * i + 1) as u16 as u32) << 16;
            }
            s[Q6_D_AT + lane] = tf_quant::f16_bits_to_f32(u16::from_le_bytes([blk[208], blk[209]])).to_bits();
        }
    }
}

/// Activation rows `r0..r0 + RT` against one repacked Q6_K group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked super-blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows_q6k<const RT: usize>(group: &[u32], act: &ActQ, r0: usize) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        let p = group.as_ptr().add(b * Q6_WORDS);
        let x: [*const i8; RT] = std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + 256 * b));
        let mut s = [zero; RT];
        for h in 0..2 {
            for gh in 0..2 {
                // Sub-blocks 8 h + 2 t + gh, t = 0..4, of every row.
                let mut pt = [[zero; RT]; 4];
                for g in 4 * gh..4 * gh + 4 {
                    let line = p.add(Q6_LINES_AT + (8 * h + g) * 3 * LANES);
                    let ql0 = _mm512_loadu_si512(line as *const __m512i);
                    let ql1 = _mm512_loadu_si512(line.add(LANES) as *const __m512i);
                    let qh = _mm512_loadu_si512(line.add(2 * LANES) as *const __m512i);
                    // t = 2 u + n: the nibble `u` of `ql_n`, and qh bits 2t..2t+2 moved to bits 4..6.
                    let w = [
                        _mm512_ternarylogic_epi32::<0xf8>(_mm512_and_si512(ql0, m4), _mm512_slli_epi16::<4>(qh), m30),
                        _mm512_ternarylogic_epi32::<0xf8>(_mm512_and_si512(ql1, m4), _mm512_slli_epi16::<2>(qh), m30),
                        _mm512_ternarylogic_epi32::<0xf8>(_mm512_and_si512(_mm512_srli_epi16::<4>(ql0), m4), qh, m30),
                        _mm512_ternarylogic_epi32::<0xf8>(
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), m4),
                            _mm512_srli_epi16::<2>(qh),
                            m30,
                        ),
                    ];
                    for r in 0..RT {
                        for (t, wt) in w.iter().enumerate() {
                            let xv =
                                _mm512_set1_epi32((x[r].add(128 * h + 32 * t + 4 * g) as *const i32).read_unaligned());
                            pt[t][r] = _mm512_dpbusd_epi32(pt[t][r], *wt, xv);
                        }
                    }
                }
                for (t, pt) in pt.iter().enumerate() {
                    let sc = _mm512_loadu_si512(p.add(Q6_SC_AT + (8 * h + 2 * t + gh) * LANES) as *const __m512i);
                    for r in 0..RT {
                        s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(pt[r], sc));
                    }
                }
            }
        }
        let d = _mm512_loadu_ps(p.add(Q6_D_AT) as *const f32);
        for r in 0..RT {
            // Σ_j sc_j · bsum_j over the row's 16 bsums, as i16 pairs.
            let bs = act.sums.as_ptr().add(((r0 + r) * nb + b) * 16) as *const i32;
            let mut m = zero;
            for i in 0..8 {
                let scp = _mm512_loadu_si512(p.add(Q6_SCP_AT + i * LANES) as *const __m512i);
                m = _mm512_dpwssd_epi32(m, scp, _mm512_set1_epi32(bs.add(i).read_unaligned()));
            }
            let total = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<5>(m));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r]);
        }
    }
    let mut res = [[0f32; LANES]; 4];
    for r in 0..RT {
        _mm512_storeu_ps(res[r].as_mut_ptr(), acc[r]);
    }
    res
}
