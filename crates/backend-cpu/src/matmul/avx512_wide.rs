//! Checkpoint mode with AVX-512 VNNI for Q4_K, Q6_K, Q4_1 and Q5_0 windows of a few rows or more ([`kernel`]) (verify
//! windows, prefill chunks): sixteen weight rows side by side, one per i32 lane, so that the integer sums of a sub-block
//! accumulate in place and need no horizontal reduction, and the sub-block scales cost one multiply per sub-block
//! instead of one per four elements.
//!
//! `avx512_kquant` computes one weight row per register: each `vpdpbusd` lane sums four products of one
//! sub-block, so every lane then needs its scale (`vpackssdw` + `vpdpwssd`, a third of the multiplies) and every
//! super-block ends in a horizontal reduction. Here, per group of 16 weight rows and super-block, the weights are
//! first repacked into a scratch buffer (per matmul call and group, shared by every activation row of the window;
//! 16 × 16 word transposes of the rows' blocks, the next group prefetched meanwhile): for Q4_K chunk `c` (64
//! elements) and step `g` (0..8), one 64-byte line holds, for each of the 16 weight rows, the four `qs` bytes
//! `32 c + 4 g ..` — whose low nibbles are elements `64 c + 4 g ..+4` and whose high nibbles are elements
//! `64 c + 32 + 4 g ..+4`. A `vpdpbusd` of a line's nibbles with four activation bytes broadcast to every lane adds
//! four products of one sub-block to each weight row's lane; eight of them make that sub-block's sum `P_j`
//! (`|P_j| ≤ 32·15·127`), and `S += sc_j · P_j` (`vpmulld`) per sub-block. The mins term
//! `M = Σ_j min_j · (bsum_2j + bsum_2j+1)` is four `vpdpwssd` per row and super-block. All of it is exact integer
//! arithmetic, so `S` and `M` are the reference's; the float steps per lane are then exactly
//! `avx512_kquant::tile`'s and the reference's: `acc = fma(dw · dx, S, acc)`, `acc = fma(-(dmin · dx), M, acc)`,
//! super-blocks in order. Q6_K, Q4_1 and Q5_0 likewise (below).

use std::arch::x86_64::*;
use std::cell::RefCell;

use tf_core::DType;

use super::act::ActQ;
use super::Out;

/// The wide kernel for a window of `rows` rows of `dtype`, if there is one and the window is wide enough: below
/// its threshold the repack of a group costs more than it saves (measured with `matmul_bench`, weights streamed
/// from memory: Q4_K, Q4_1 and Q5_0 gain from 4 rows, Q6_K breaks even at 8). The bits are the same either way.
pub(crate) fn kernel(dtype: DType, rows: usize) -> Option<&'static Wide> {
    let (k, min_rows) = match dtype {
        DType::Q4K => (&Q4K, 4),
        DType::Q6K => (&Q6K, 8),
        DType::Q4_1 => (&Q41, 4),
        DType::Q5_0 => (&Q50, 4),
        _ => return None,
    };
    (rows >= min_rows).then_some(k)
}

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

/// One wide kernel: the weight block it reads, how it repacks a group of 16 weight rows and how it computes up to
/// four activation rows against the repacked group.
pub(crate) struct Wide {
    name: &'static str,
    /// Bytes of a weight block; elements of an activation block (256 for the K-quants, 32 for the legacy types).
    block_bytes: usize,
    act_block: usize,
    /// u32 words of one group's repacked block.
    words: usize,
    /// Whether the row kernel reads the Q4_K mins pairs of the activation sums.
    pairs: bool,
    repack: Repack,
    /// The row kernels for 1, 2, 3 and 4 rows.
    rows: [Rows; 4],
}

/// Repacks weight rows `g0..g0 + live` (of `row_bytes`) of `bytes` into a group's scratch words.
type Repack = unsafe fn(&[u8], usize, usize, usize, &mut [u32]);
/// Activation rows `r0..` against a repacked group (`pairs`: the Q4_K mins pairs, else unused).
type Rows = unsafe fn(&[u32], &ActQ, &[u32], usize, Ahead) -> [[f32; LANES]; 4];

static Q4K: Wide = Wide {
    name: "Q4_K",
    block_bytes: BLOCK,
    act_block: 256,
    words: WORDS,
    pairs: true,
    repack,
    rows: [group_rows::<1>, group_rows::<2>, group_rows::<3>, group_rows::<4>],
};

static Q6K: Wide = Wide {
    name: "Q6_K",
    block_bytes: Q6_BLOCK,
    act_block: 256,
    words: Q6_WORDS,
    pairs: false,
    repack: repack_q6k,
    rows: [group_rows_q6k::<1>, group_rows_q6k::<2>, group_rows_q6k::<3>, group_rows_q6k::<4>],
};

static Q41: Wide = Wide {
    name: "Q4_1",
    block_bytes: Q41_BLOCK,
    act_block: 32,
    words: Q41_WORDS,
    pairs: false,
    repack: repack_q41,
    rows: [group_rows_q41::<1>, group_rows_q41::<2>, group_rows_q41::<3>, group_rows_q41::<4>],
};

static Q50: Wide = Wide {
    name: "Q5_0",
    block_bytes: Q50_BLOCK,
    act_block: 32,
    words: Q50_WORDS,
    pairs: false,
    repack: repack_q50,
    rows: [group_rows_q50::<1>, group_rows_q50::<2>, group_rows_q50::<3>, group_rows_q50::<4>],
};

/// Output columns `c0..c1` of `out` for every activation row of `act` with kernel `k`, checkpoint mode (`bytes`:
/// the weight's `[N][row_bytes]` raw blocks). Bit-equal to the tile kernels and the reference.
pub(super) fn chunk(k: &Wide, bytes: &[u8], row_bytes: usize, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (rows, nb, name) = (act.rows, act.nb, k.name);
    assert!(act.block == k.act_block && row_bytes == nb * k.block_bytes, "{name} wide kernel: layouts");
    assert!(c1 * row_bytes <= bytes.len() && act.qs.len() == rows * act.k, "{name} wide kernel: sizes");
    assert!(act.d_t.len() == rows * nb, "{name} wide kernel: scales");
    if k.act_block == 256 {
        assert!(act.sums.len() == rows * nb * 16, "{name} wide kernel: sums");
    } else {
        assert!(act.s_t.len() == rows * nb, "{name} wide kernel: block sums");
    }
    assert!(is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"), "{name} wide kernel");
    SCRATCH.with_borrow_mut(|(group, pairs)| {
        pairs.clear();
        if k.pairs {
            // Per row and super-block, the four i16 pairs (sum of 32 values of sub-block 2i, of 2i + 1).
            pairs.extend(act.sums.chunks_exact(16).flat_map(|s| {
                (0..4).map(move |i| {
                    let lo = s[4 * i] + s[4 * i + 1];
                    let hi = s[4 * i + 2] + s[4 * i + 3];
                    lo as u16 as u32 | (hi as u16 as u32) << 16
                })
            }));
        }
        group.resize(nb * k.words, 0);
        super::prefetch_l2(&bytes[c0 * row_bytes..(c0 + LANES).min(c1) * row_bytes]);
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            // The next group's rows, requested into L2 a slice per block while this group's first rows are
            // computed (the loads of 16 rows at once do not train the hardware prefetchers).
            let next = &bytes[(g0 + LANES).min(c1) * row_bytes..(g0 + 2 * LANES).min(c1) * row_bytes];
            let ahead = Ahead { p: next.as_ptr(), per_block: next.len().div_ceil(nb) };
            // SAFETY: AVX-512 checked above; rows `g0..g0 + live` lie inside `bytes` (`c1 * row_bytes ≤ len`).
            unsafe { (k.repack)(bytes, row_bytes, g0, live, group) };
            let mut r0 = 0;
            while r0 < rows {
                let rt = (rows - r0).min(4);
                let a = if r0 == 0 { ahead } else { Ahead::NONE };
                // SAFETY: AVX-512 F/BW/VNNI checked above; `group` holds `nb` repacked blocks, `pairs` (when read)
                // and `act` every row's data (the asserts above), `r0 + rt ≤ rows`.
                let res = unsafe { (k.rows[rt - 1])(group, act, pairs, r0, a) };
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

/// Bytes to request into L2 while a group is computed, `per_block` of them per super-block (never read: a prefetch
/// changes no value).
#[derive(Clone, Copy)]
struct Ahead {
    p: *const u8,
    per_block: usize,
}

impl Ahead {
    const NONE: Ahead = Ahead { p: std::ptr::null(), per_block: 0 };

    /// Requests super-block `b`'s share.
    #[inline]
    fn block(self, b: usize) {
        let start = self.p.wrapping_add(b * self.per_block);
        let mut at = 0;
        while at < self.per_block {
            // SAFETY: a prefetch never faults and changes no value; SSE is part of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(at) as *const i8) };
            at += 64;
        }
    }
}

/// The `RT` rows' 16 lanes as `[4][16]` floats (rows past `RT` zero), the row kernels' result.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_out<const RT: usize>(acc: &[__m512; RT]) -> [[f32; LANES]; 4] {
    let mut res = [[0f32; LANES]; 4];
    for r in 0..RT {
        _mm512_storeu_ps(res[r].as_mut_ptr(), acc[r]);
    }
    res
}

/// The byte offset of each lane's weight row from row `g0` (lanes past `live` repeat the last live row; their sums
/// are dropped).
fn lane_offsets(row_bytes: usize, live: usize) -> [i32; LANES] {
    std::array::from_fn(|lane| i32::try_from(lane.min(live - 1) * row_bytes).expect("row offsets fit an i32"))
}

/// A 16 × 16 matrix of 32-bit words transposed: `out[c]` word `r` = `m[r]` word `c`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn transpose16(m: &[__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane k, rows 4i..4i+4 × words 4k..4k+4 become u[4i + j] = word 4k + j of those rows.
    // (Plain loops: closures would not inherit this function's target features and would not be inlined.)
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        for h in 0..2 {
            let (a, b) = (t[4 * i + h], t[4 * i + 2 + h]);
            u[4 * i + 2 * h] = _mm512_unpacklo_epi64(a, b);
            u[4 * i + 2 * h + 1] = _mm512_unpackhi_epi64(a, b);
        }
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let x01 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[j], u[4 + j]);
        let y01 = _mm512_shuffle_i32x4::<0b01_00_01_00>(u[8 + j], u[12 + j]);
        let x23 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[j], u[4 + j]);
        let y23 = _mm512_shuffle_i32x4::<0b11_10_11_10>(u[8 + j], u[12 + j]);
        out[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(x01, y01);
        out[4 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(x01, y01);
        out[8 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(x23, y23);
        out[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(x23, y23);
    }
    out
}

/// The `words` (≤ 16) 32-bit words from byte `at` of each lane's block as lines: `out[w]` = word `w` of the 16
/// lanes (`base` = block of lane 0; lines past `words` are 0 and nothing past them is read).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_lines(offs: &[i32; LANES], base: *const u8, at: usize, words: usize) -> [__m512i; 16] {
    let mask: __mmask16 = if words >= 16 { 0xffff } else { (1u16 << words) - 1 };
    let mut m = [_mm512_setzero_si512(); 16];
    for l in 0..LANES {
        m[l] = _mm512_maskz_loadu_epi32(mask, base.add(offs[l] as usize + at) as *const i32);
    }
    transpose16(&m)
}

/// The u16 at byte `at` of each lane's block, zero-extended (`base` = block of lane 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_u16(offs: &[i32; LANES], base: *const u8, at: usize) -> __m512i {
    let mut v = [0u32; LANES];
    for l in 0..LANES {
        v[l] = (base.add(offs[l] as usize + at) as *const u16).read_unaligned() as u32;
    }
    _mm512_loadu_si512(v.as_ptr() as *const __m512i)
}

/// The f16 in the low 16 bits of each lane, as f32 bits (`vcvtph2ps`: exact but for a signaling NaN, which comes
/// out quiet, as the product with the activation scale that always follows makes it anyway).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn f16_lanes(v: __m512i) -> __m512i {
    _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)))
}

/// Byte `i` (0..4) of each 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn byte(v: __m512i, i: usize) -> __m512i {
    _mm512_and_si512(_mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * i as i32)), _mm512_set1_epi32(0xff))
}

/// Q4_K weight rows `g0..g0 + live` into `group` by 16-lane gathers (the layout of the `*_AT` constants): `qs`
/// words as they are, the scales and mins unpacked as `tf_quant::q4k_scale_min` (GGML's `get_scale_min_k4`) does.
///
/// # Safety
/// AVX-512 F/BW/VNNI; rows `g0..g0 + live` of `row_bytes` (whole blocks) lie in `bytes`, `live ≥ 1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn repack(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    assert!((g0 + live) * row_bytes <= bytes.len() && group.len() >= row_bytes / BLOCK * WORDS);
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let (m15, m63, m3) = (_mm512_set1_epi32(15), _mm512_set1_epi32(63), _mm512_set1_epi32(3));
    for b in 0..row_bytes / BLOCK {
        let blk = base.add(b * BLOCK);
        let s = group.as_mut_ptr().add(b * WORDS);
        let put = |at: usize, v: __m512i| _mm512_storeu_si512(s.add(at) as *mut __m512i, v);
        // Block words: 0 = d | dmin, 1..4 = the 12 scale bytes, 4..36 = `qs`.
        let w0 = block_lines(&offs, blk, 0, 16);
        let w1 = block_lines(&offs, blk, 64, 16);
        let w2 = block_lines(&offs, blk, 128, 4);
        put(D_AT, f16_lanes(w0[0]));
        put(DMIN_AT, f16_lanes(_mm512_srli_epi32::<16>(w0[0])));
        let (l0, l1, l2) = (w0[1], w0[2], w0[3]);
        let mut mn = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let (b0, b1, b2) = (byte(l0, j), byte(l1, j), byte(l2, j));
            put(SC_AT + j * LANES, _mm512_and_si512(b0, m63));
            mn[j] = _mm512_and_si512(b1, m63);
            let hi0 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b0), m3));
            put(SC_AT + (j + 4) * LANES, _mm512_or_si512(_mm512_and_si512(b2, m15), hi0));
            let hi1 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b1), m3));
            mn[j + 4] = _mm512_or_si512(_mm512_srli_epi32::<4>(b2), hi1);
        }
        for i in 0..4 {
            put(MN_AT + i * LANES, _mm512_or_si512(mn[2 * i], _mm512_slli_epi32::<16>(mn[2 * i + 1])));
        }
        // `qs` word `line` (bytes 32 c + 4 g.. → line 8 c + g) is block word 4 + line.
        for line in 0..32 {
            let w = 4 + line;
            let v = match w / 16 {
                0 => w0[w % 16],
                1 => w1[w % 16],
                _ => w2[w % 16],
            };
            put(QS_AT + line * LANES, v);
        }
    }
}

/// Activation rows `r0..r0 + RT` against one repacked group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked super-blocks, `pairs` `[act.rows][act.nb][4]` words and
/// `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows<const RT: usize>(
    group: &[u32],
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let sign = _mm512_set1_epi32(i32::MIN);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
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
    rows_out(&acc)
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

/// Q6_K weight rows `g0..g0 + live` into `group` by 16-lane gathers (as [`repack`]).
///
/// # Safety
/// As [`repack`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn repack_q6k(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    assert!((g0 + live) * row_bytes <= bytes.len() && group.len() >= row_bytes / Q6_BLOCK * Q6_WORDS);
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let m16 = _mm512_set1_epi32(0xffff);
    for b in 0..row_bytes / Q6_BLOCK {
        let blk = base.add(b * Q6_BLOCK);
        let s = group.as_mut_ptr().add(b * Q6_WORDS);
        let put = |at: usize, v: __m512i| _mm512_storeu_si512(s.add(at) as *mut __m512i, v);
        // Block words 0..32 `ql`, 32..48 `qh`, 48..52 the scales; `d` is the u16 at byte 208.
        let ql: [[__m512i; 16]; 2] = [block_lines(&offs, blk, 0, 16), block_lines(&offs, blk, 64, 16)];
        let qh = block_lines(&offs, blk, 128, 16);
        for h in 0..2 {
            for g in 0..8 {
                let at = Q6_LINES_AT + ((8 * h + g) * 3) * LANES;
                put(at, ql[h][g]);
                put(at + LANES, ql[h][8 + g]);
                put(at + 2 * LANES, qh[8 * h + g]);
            }
        }
        // The 16 i8 scales, sign-extended: scale 4 w + i is byte i of word 48 + w.
        let sw = block_lines(&offs, blk, 192, 4);
        let mut sc = [_mm512_setzero_si512(); 16];
        for w in 0..4 {
            for i in 0..4 {
                let up = _mm512_sll_epi32(sw[w], _mm_cvtsi32_si128(24 - 8 * i as i32));
                sc[4 * w + i] = _mm512_srai_epi32::<24>(up);
                put(Q6_SC_AT + (4 * w + i) * LANES, sc[4 * w + i]);
            }
        }
        for i in 0..8 {
            let pair = _mm512_or_si512(_mm512_and_si512(sc[2 * i], m16), _mm512_slli_epi32::<16>(sc[2 * i + 1]));
            put(Q6_SCP_AT + i * LANES, pair);
        }
        put(Q6_D_AT, f16_lanes(block_u16(&offs, blk, 208)));
    }
}

/// Q6_K: element `128 h + 32 t + l` is `(ql[64 h + 32 (t % 2) + l] >> 4 (t / 2)) & 15 | ((qh[32 h + l] >> 2 t) & 3)
/// << 4`, minus 32: the four `ql`/`qh` bytes at `l = 4 g ..` of one lane give four elements of each `t`, in
/// sub-block `8 h + 2 t + g / 4`. `S = Σ_j sc_j · P_j − 32 · Σ_j sc_j · bsum_j` with the unsigned `P_j` (exact:
/// `|Σ sc·P| ≤ 16·128·16·63·127 < 2^31`).
///
/// Activation rows `r0..r0 + RT` against one repacked Q6_K group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked super-blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows_q6k<const RT: usize>(
    group: &[u32],
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
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
    rows_out(&acc)
}

/// Bytes of a Q4_1 block (`d`, `m`, 16 `qs` bytes: element `l < 16` the low nibble of `qs[l]`, `16 + l` its high
/// nibble): five 32-bit words, so a weight row is a stream of words.
const Q41_BLOCK: usize = 20;
/// u32 words of one group's repacked Q4_1 block: `qs` lines `[4][16]`, `d` `[16]` and `m` `[16]` as f32 bits.
const Q41_WORDS: usize = 6 * LANES;

/// Q4_1 weight rows `g0..g0 + live` into `group`: each row is a stream of `5 nb` words, transposed 16 words at a
/// time; word `5 b` (`d | m`) becomes block `b`'s `d` and `m` lines as f32, words `5 b + 1 ..+4` its `qs` lines.
///
/// # Safety
/// As [`repack`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn repack_q41(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    let nb = row_bytes / Q41_BLOCK;
    assert!((g0 + live) * row_bytes <= bytes.len() && group.len() >= nb * Q41_WORDS);
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let words = 5 * nb;
    let s = group.as_mut_ptr();
    let put = |at: usize, v: __m512i| _mm512_storeu_si512(s.add(at) as *mut __m512i, v);
    for q in 0..words.div_ceil(16) {
        let n = (words - 16 * q).min(16);
        let lines = block_lines(&offs, base, 64 * q, n);
        for (i, &line) in lines.iter().enumerate().take(n) {
            let w = 16 * q + i;
            let (b, k) = (w / 5, w % 5);
            let at = b * Q41_WORDS;
            if k == 0 {
                put(at + 4 * LANES, f16_lanes(line));
                put(at + 5 * LANES, f16_lanes(_mm512_srli_epi32::<16>(line)));
            } else {
                put(at + (k - 1) * LANES, line);
            }
        }
    }
}

/// Q4_1: per block, `P = Σ q·qx` by eight `vpdpbusd` (word `i`'s low nibbles are elements `4 i ..+4`, its high
/// nibbles `16 + 4 i ..+4`), then the reference's `acc = fma(dw · dx, P, acc)` and `acc = fma(m · dx, Σ qx, acc)`
/// per lane.
///
/// Activation rows `r0..r0 + RT` against one repacked Q4_1 group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows_q41<const RT: usize>(
    group: &[u32],
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = group.as_ptr().add(b * Q41_WORDS);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let mut s = [zero; RT];
        for i in 0..4 {
            let w = _mm512_loadu_si512(p.add(i * LANES) as *const __m512i);
            let wl = _mm512_and_si512(w, m4);
            let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
            for r in 0..RT {
                let xl = _mm512_set1_epi32((x[r].add(4 * i) as *const i32).read_unaligned());
                let xh = _mm512_set1_epi32((x[r].add(16 + 4 * i) as *const i32).read_unaligned());
                s[r] = _mm512_dpbusd_epi32(s[r], wl, xl);
                s[r] = _mm512_dpbusd_epi32(s[r], wh, xh);
            }
        }
        let d = _mm512_loadu_ps(p.add(4 * LANES) as *const f32);
        let m = _mm512_loadu_ps(p.add(5 * LANES) as *const f32);
        for r in 0..RT {
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            let sx = _mm512_set1_ps(*act.s_t.as_ptr().add(b * rows + r0 + r) as f32);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(s[r]), acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx), sx, acc[r]);
        }
    }
    rows_out(&acc)
}

/// Bytes of a Q5_0 block: `d` (f16), `qh` (32 fifth bits, bit `i` of element `i`), 16 `qs` bytes (element
/// `l < 16` the low nibble of `qs[l]`, `16 + l` its high nibble); a value is `nibble | bit << 4`, minus 16.
const Q50_BLOCK: usize = 22;
/// u32 words of one group's repacked Q5_0 block: the `qh` line, `qs` lines `[4][16]`, `d` `[16]` as f32 bits.
const Q50_WORDS: usize = 6 * LANES;

/// Q5_0 weight rows `g0..g0 + live` into `group`, two blocks per transpose: the five words after `d` of block
/// `b` (`qh`, then `qs`) in words 0..5 of each lane, those of block `b + 1` in words 8..13.
///
/// # Safety
/// As [`repack`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn repack_q50(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, group: &mut [u32]) {
    let nb = row_bytes / Q50_BLOCK;
    assert!((g0 + live) * row_bytes <= bytes.len() && group.len() >= nb * Q50_WORDS);
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let s = group.as_mut_ptr();
    let put = |at: usize, v: __m512i| _mm512_storeu_si512(s.add(at) as *mut __m512i, v);
    for b in (0..nb).step_by(2) {
        let two = b + 1 < nb;
        let mut m = [_mm512_setzero_si512(); 16];
        for l in 0..LANES {
            let blk = base.add(offs[l] as usize + b * Q50_BLOCK);
            let lo = _mm256_maskz_loadu_epi32(0x1f, blk.add(2) as *const i32);
            let hi = if two {
                _mm256_maskz_loadu_epi32(0x1f, blk.add(Q50_BLOCK + 2) as *const i32)
            } else {
                _mm256_setzero_si256()
            };
            m[l] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        }
        let lines = transpose16(&m);
        for (k, half) in [(b, 0usize), (b + 1, 8)].into_iter().take(if two { 2 } else { 1 }) {
            let at = k * Q50_WORDS;
            for w in 0..5 {
                put(at + w * LANES, lines[half + w]);
            }
            put(at + 5 * LANES, f16_lanes(block_u16(&offs, base, k * Q50_BLOCK)));
        }
    }
}

/// Per `qs` word `i` (0..4) and half (low nibbles: elements `4 i + j`; high: `16 + 4 i + j`), the byte-shuffle
/// control that puts the `qh` byte holding those elements' fifth bits into every byte of its dword, and the bit
/// each byte tests.
const fn q50_select(i: usize, high: bool) -> ([i8; 64], [u8; 64]) {
    let (mut shuf, mut bits) = ([0i8; 64], [0u8; 64]);
    let mut at = 0;
    while at < 64 {
        let (dword, j) = (at / 4 % 4, at % 4);
        let e = if high { 16 } else { 0 } + 4 * i + j;
        shuf[at] = (4 * dword + e / 8) as i8;
        bits[at] = 1 << (e % 8);
        at += 1;
    }
    (shuf, bits)
}

static Q50_SEL: [([i8; 64], [u8; 64]); 8] = [
    q50_select(0, false),
    q50_select(1, false),
    q50_select(2, false),
    q50_select(3, false),
    q50_select(0, true),
    q50_select(1, true),
    q50_select(2, true),
    q50_select(3, true),
];

/// Q5_0: per block, `P = Σ q·qx` over the unsigned five-bit values (eight `vpdpbusd`; the fifth bits added as 16
/// under byte masks from `qh`), `S = P − 16 · Σ qx` (exact), then the reference's `acc = fma(dw · dx, S, acc)` per
/// lane.
///
/// Activation rows `r0..r0 + RT` against one repacked Q5_0 group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `group` holds `act.nb` repacked blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn group_rows_q50<const RT: usize>(
    group: &[u32],
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let b16 = _mm512_set1_epi8(16);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = group.as_ptr().add(b * Q50_WORDS);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let qh = _mm512_loadu_si512(p as *const __m512i);
        let mut s = [zero; RT];
        for i in 0..4 {
            let w = _mm512_loadu_si512(p.add((1 + i) * LANES) as *const __m512i);
            let mut half = [_mm512_and_si512(w, m4), _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4)];
            for (h, v) in half.iter_mut().enumerate() {
                let (shuf, bits) = &Q50_SEL[4 * h + i];
                let sel = _mm512_shuffle_epi8(qh, _mm512_loadu_si512(shuf.as_ptr() as *const __m512i));
                let set = _mm512_test_epi8_mask(sel, _mm512_loadu_si512(bits.as_ptr() as *const __m512i));
                *v = _mm512_mask_add_epi8(*v, set, *v, b16);
            }
            for r in 0..RT {
                let xl = _mm512_set1_epi32((x[r].add(4 * i) as *const i32).read_unaligned());
                let xh = _mm512_set1_epi32((x[r].add(16 + 4 * i) as *const i32).read_unaligned());
                s[r] = _mm512_dpbusd_epi32(s[r], half[0], xl);
                s[r] = _mm512_dpbusd_epi32(s[r], half[1], xh);
            }
        }
        let d = _mm512_loadu_ps(p.add(5 * LANES) as *const f32);
        for r in 0..RT {
            let sx = _mm512_set1_epi32(*act.s_t.as_ptr().add(b * rows + r0 + r));
            let total = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<4>(sx));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}
