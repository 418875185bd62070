//! Checkpoint mode with AVX-512 VNNI for Q4_K, Q6_K, Q4_1, Q5_0, Q8_0, IQ4_XS, IQ4_NL and MXFP4 (`iq`) weights
//! stored in a *wide layout* ([`pack`], once at load): sixteen weight rows side by side, one per i32 lane, so that the
//! integer sums of a (sub-)block accumulate in place and need no horizontal reduction, and the sub-block scales
//! cost one multiply per sub-block instead of one per four elements. Every row count, one included, runs these kernels.
//!
//! `avx512_kquant` computes one weight row per register: each `vpdpbusd` lane sums four products of one
//! sub-block, so every lane then needs its scale (`vpackssdw` + `vpdpwssd`, a third of the multiplies) and every
//! super-block ends in a horizontal reduction. Here a group of 16 weight rows is stored as 64-byte lines, each
//! holding one 32-bit word of every row's block: for Q4_K chunk `c` (64 elements) and step `g` (0..8), one line
//! holds, for each of the 16 weight rows, the four `qs` bytes `32 c + 4 g ..` — whose low nibbles are elements
//! `64 c + 4 g ..+4` and whose high nibbles are elements `64 c + 32 + 4 g ..+4`. A `vpdpbusd` of a line's nibbles
//! with four activation bytes broadcast to every lane adds four products of one sub-block to each weight row's
//! lane; eight of them make that sub-block's sum `P_j` (`|P_j| ≤ 32·15·127`), and `S += sc_j · P_j` (`vpmulld`)
//! per sub-block. The mins term `M = Σ_j min_j · (bsum_2j + bsum_2j+1)` is four `vpdpwssd` per row and
//! super-block. All of it is exact integer arithmetic, so `S` and `M` are the reference's; the float steps per
//! lane are then exactly `avx512_kquant::tile`'s and the reference's: `acc = fma(dw · dx, S, acc)`,
//! `acc = fma(-(dmin · dx), M, acc)`, super-blocks in order. Q6_K, Q4_1, Q5_0 and Q8_0 likewise (below).
//!
//! The layout holds the same bytes as the GGUF blocks, only moved (scales stay packed and `d` stays f16; they are
//! unpacked per block in registers), so a packed weight is as large as the file's plus at most 15 padding rows.
//! One group is `nb` blocks of whole lines, then (Q6_K, Q5_0, Q8_0) each block's 16 `d` as f16 (32 bytes per
//! block), rounded up to a line.

use std::arch::x86_64::*;
use std::cell::RefCell;

use tf_core::DType;

use super::act::ActQ;
use super::Out;

mod iq;

/// Weight rows per group: the i32 lanes of a 512-bit register.
const LANES: usize = 16;
/// Bytes of a line: a cache line, one 512-bit load.
const LINE: usize = 64;
/// How many groups ahead of the one being computed the next weights are requested (one group is 2.3 KB per 256
/// inputs of Q4_K; two measured better than one from memory, docs/perf-notes.md).
const AHEAD_GROUPS: usize = 2;

/// The wide kernel of `dtype`, if there is one.
pub(crate) fn kernel(dtype: DType) -> Option<&'static Wide> {
    Some(match dtype {
        DType::Q4K => &Q4K,
        DType::Q6K => &Q6K,
        DType::Q4_1 => &Q41,
        DType::Q5_0 => &Q50,
        DType::Q8_0 => &Q80,
        DType::IQ4XS => &iq::IQ4XS,
        DType::IQ4NL => &iq::IQ4NL,
        DType::MXFP4 => &iq::MXFP4,
        _ => return None,
    })
}

/// One line of a packed weight, aligned as a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; LINE]);

/// A weight `[n][row_bytes]` in the wide layout: `[n.div_ceil(16)]` groups of `group_bytes` (rows past `n` in the
/// last group repeat its last row; their sums are dropped).
pub(crate) struct Packed {
    kernel: &'static Wide,
    /// Weight rows (`n`) and blocks per row.
    rows: usize,
    nb: usize,
    group_bytes: usize,
    /// `[groups * group_bytes / 64]` lines.
    lines: Vec<Line>,
}

impl Packed {
    /// Bytes held (the figure a memory estimate adds instead of the mapped file's bytes).
    pub(crate) fn bytes(&self) -> usize {
        self.lines.len() * LINE
    }

    /// Group `i`'s bytes, if there is a group `i`.
    fn group_at(&self, i: usize) -> Option<&[u8]> {
        (i < self.rows.div_ceil(LANES)).then(|| self.group(i))
    }

    /// Group `i`'s bytes.
    fn group(&self, i: usize) -> &[u8] {
        // SAFETY: `lines` holds `groups * group_bytes` initialized bytes (plain data).
        let all = unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.bytes()) };
        &all[i * self.group_bytes..(i + 1) * self.group_bytes]
    }
}

/// `bytes` (`n` rows of `row_bytes`, whole blocks of `dtype`) in the wide layout, when `dtype` has a wide kernel
/// and this CPU has AVX-512 F/BW/VL/VNNI. `done` is told each range of `bytes` that has been copied (a few MB at a
/// time, in order), so that a mapped source can be released as the copy grows.
pub(crate) fn pack(
    dtype: DType,
    bytes: &[u8],
    n: usize,
    row_bytes: usize,
    done: &mut dyn FnMut(std::ops::Range<usize>),
) -> Option<Packed> {
    let k = kernel(dtype)?;
    let usable = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c");
    if n == 0 || !usable {
        return None;
    }
    assert!(row_bytes.is_multiple_of(k.block_bytes) && bytes.len() == n * row_bytes, "{} pack: layout", k.name);
    let nb = row_bytes / k.block_bytes;
    let group_bytes = k.group_bytes(nb);
    let groups = n.div_ceil(LANES);
    let mut lines = vec![Line([0; LINE]); groups * group_bytes / LINE];
    // Source bytes copied since `done` was last told.
    let (mut told, batch) = (0, 4 << 20);
    for g in 0..groups {
        let live = (n - LANES * g).min(LANES);
        // SAFETY: AVX-512 checked above; rows `16 g..16 g + live` lie in `bytes`, group `g` in `lines`.
        unsafe {
            let dst = (lines.as_mut_ptr() as *mut u8).add(g * group_bytes);
            (k.pack)(bytes, row_bytes, LANES * g, live, dst);
        }
        let copied = (LANES * g + live) * row_bytes;
        if copied - told >= batch || g + 1 == groups {
            done(told..copied);
            told = copied;
        }
    }
    Some(Packed { kernel: k, rows: n, nb, group_bytes, lines })
}

thread_local! {
    /// `[rows][nb][4]` the Q4_K activation sum pairs of one call.
    static PAIRS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// One wide kernel: the weight block it reads, how it packs a group of 16 weight rows and how it computes up to
/// four activation rows against a packed group.
pub(crate) struct Wide {
    name: &'static str,
    /// Bytes of a weight block; elements of an activation block (256 for the K-quants, 32 for the legacy types).
    block_bytes: usize,
    act_block: usize,
    /// Lines of one packed block.
    lines: usize,
    /// Whether the group ends in the blocks' `d` (f16, `[nb][16]`).
    tail: bool,
    /// Whether the row kernel reads the Q4_K mins pairs of the activation sums.
    pairs: bool,
    pack: Pack,
    /// The row kernels for 1, 2, 3 and 4 rows.
    rows: [Rows; 4],
}

impl Wide {
    /// Bytes of one packed group of 16 rows of `nb` blocks.
    fn group_bytes(&self, nb: usize) -> usize {
        (nb * self.lines * LINE + if self.tail { nb * 2 * LANES } else { 0 }).next_multiple_of(LINE)
    }
}

/// Packs weight rows `g0..g0 + live` (of `row_bytes`) of `bytes` into the group at `dst`.
type Pack = unsafe fn(&[u8], usize, usize, usize, *mut u8);
/// Activation rows `r0..` against a packed group (`pairs`: the Q4_K mins pairs, else unused).
type Rows = unsafe fn(*const u8, &ActQ, &[u32], usize, Ahead) -> [[f32; LANES]; 4];

static Q4K: Wide = Wide {
    name: "Q4_K",
    block_bytes: Q4K_BLOCK,
    act_block: 256,
    lines: Q4K_LINES,
    tail: false,
    pairs: true,
    pack: pack_q4k,
    rows: [rows_q4k::<1>, rows_q4k::<2>, rows_q4k::<3>, rows_q4k::<4>],
};

static Q6K: Wide = Wide {
    name: "Q6_K",
    block_bytes: Q6K_BLOCK,
    act_block: 256,
    lines: Q6K_LINES,
    tail: true,
    pairs: false,
    pack: pack_q6k,
    rows: [rows_q6k::<1>, rows_q6k::<2>, rows_q6k::<3>, rows_q6k::<4>],
};

static Q41: Wide = Wide {
    name: "Q4_1",
    block_bytes: Q41_BLOCK,
    act_block: 32,
    lines: 5,
    tail: false,
    pairs: false,
    pack: pack_q41,
    rows: [rows_q41::<1>, rows_q41::<2>, rows_q41::<3>, rows_q41::<4>],
};

static Q50: Wide = Wide {
    name: "Q5_0",
    block_bytes: Q50_BLOCK,
    act_block: 32,
    lines: 5,
    tail: true,
    pairs: false,
    pack: pack_q50,
    rows: [rows_q50::<1>, rows_q50::<2>, rows_q50::<3>, rows_q50::<4>],
};

static Q80: Wide = Wide {
    name: "Q8_0",
    block_bytes: Q80_BLOCK,
    act_block: 32,
    lines: 8,
    tail: true,
    pairs: false,
    pack: pack_q80,
    rows: [rows_q80::<1>, rows_q80::<2>, rows_q80::<3>, rows_q80::<4>],
};

/// Output columns `c0..c1` of `out` (`c0` a multiple of 16) for every activation row of `act` against the packed
/// weight `p`, checkpoint mode (`next`: the weight computed after this one, whose first groups are requested
/// while this one's last are computed). Bit-equal to the tile kernels and the reference.
pub(super) fn chunk(p: &Packed, next: Option<&Packed>, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let (k, rows, nb) = (p.kernel, act.rows, p.nb);
    let name = k.name;
    assert!(act.block == k.act_block && act.nb == nb, "{name} wide kernel: layouts");
    assert!(c0.is_multiple_of(LANES) && c0 <= c1 && c1 <= p.rows, "{name} wide kernel: columns {c0}..{c1}");
    assert!(act.qs.len() == rows * act.k && act.d_t.len() == rows * nb, "{name} wide kernel: sizes");
    if k.act_block == 256 {
        assert!(act.sums.len() == rows * nb * 16, "{name} wide kernel: sums");
    } else {
        assert!(act.s_t.len() == rows * nb, "{name} wide kernel: block sums");
    }
    PAIRS.with_borrow_mut(|pairs| {
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
        // The chunk's first groups at once (the previous chunk's last groups requested them too when that ran
        // just before on this core).
        for i in c0 / LANES..(c0 / LANES + AHEAD_GROUPS).min(c1.div_ceil(LANES)) {
            crate::simd::prefetch_l2(p.group(i));
        }
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            let group = p.group(g0 / LANES);
            // The group `AHEAD_GROUPS` further, requested into L2 a slice per block while this group's first rows
            // are computed; past the chunk's end too (the pool hands out the next chunk next), and into the next
            // weight.
            let at = g0 / LANES + AHEAD_GROUPS;
            let groups = p.rows.div_ceil(LANES);
            let target = if at < groups { Some(p.group(at)) } else { next.and_then(|q| q.group_at(at - groups)) };
            let ahead = match target {
                Some(g) => Ahead { p: g.as_ptr(), per_block: g.len().div_ceil(nb) },
                None => Ahead::NONE,
            };
            let mut r0 = 0;
            while r0 < rows {
                let rt = (rows - r0).min(4);
                let a = if r0 == 0 { ahead } else { Ahead::NONE };
                // SAFETY: `pack` only builds a `Packed` on a CPU with AVX-512 F/BW/VL/VNNI; `group` holds `nb`
                // packed blocks (and their tail), `pairs` (when read) and `act` every row's data (the asserts
                // above), `r0 + rt ≤ rows`.
                let res = unsafe { (k.rows[rt - 1])(group.as_ptr(), act, pairs, r0, a) };
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

/// Bytes to request into L2 while a group is computed, `per_block` of them per block (never read: a prefetch
/// changes no value).
#[derive(Clone, Copy)]
struct Ahead {
    p: *const u8,
    per_block: usize,
}

impl Ahead {
    const NONE: Ahead = Ahead { p: std::ptr::null(), per_block: 0 };

    /// Requests block `b`'s share.
    #[inline]
    fn block(self, b: usize) {
        let start = self.p.wrapping_add(b * self.per_block);
        let mut at = 0;
        while at < self.per_block {
            // SAFETY: a prefetch never faults and changes no value; SSE is part of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(at) as *const i8) };
            at += LINE;
        }
    }
}

/// Line `i` from `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn ld(p: *const u8, i: usize) -> __m512i {
    _mm512_loadu_si512(p.add(LINE * i) as *const __m512i)
}

/// Stores `v` as line `i` from `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn put(p: *mut u8, i: usize, v: __m512i) {
    _mm512_storeu_si512(p.add(LINE * i) as *mut __m512i, v)
}

/// The low 16 bits of each lane as 16 u16 at `p` (a group's tail entry).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn put_u16(p: *mut u8, v: __m512i) {
    _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(v))
}

/// The 16 f16 at `p` (a group's tail entry) as f32 (`vcvtph2ps`: exact but for a signaling NaN, which comes out
/// quiet, as the product with the activation scale that always follows makes it anyway).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tail_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// The f16 in the low 16 bits of each lane as f32 (as [`tail_f16`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn f16_low(v: __m512i) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
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

/// Byte `i` (0..4) of each 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn byte(v: __m512i, i: usize) -> __m512i {
    _mm512_and_si512(_mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * i as i32)), _mm512_set1_epi32(0xff))
}

/// Bytes of a Q4_K block (`d`, `dmin`, 12 scale bytes, 128 `qs` bytes).
const Q4K_BLOCK: usize = 144;
/// Lines of a packed Q4_K block: `qs` lines `[4 c][8 g]` (block word `4 + 8 c + g`), then block word 0 (`d | dmin`
/// as f16) and words 1..4 (the 12 packed scale bytes).
const Q4K_LINES: usize = 36;
const Q4K_DD: usize = 32;
const Q4K_SC: usize = 33;

/// Q4_K weight rows `g0..g0 + live` into the group at `dst` (16 × 16 word transposes of the rows' blocks).
///
/// # Safety
/// AVX-512 F/BW/VNNI; rows `g0..g0 + live` of `row_bytes` (whole blocks) lie in `bytes`, `live` in `1..=16`, and
/// `dst` has a group's bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q4k(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    assert!((g0 + live) * row_bytes <= bytes.len() && (1..=LANES).contains(&live));
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    for b in 0..row_bytes / Q4K_BLOCK {
        let blk = base.add(b * Q4K_BLOCK);
        let p = dst.add(b * Q4K_LINES * LINE);
        // Block words: 0 = d | dmin, 1..4 = the 12 scale bytes, 4..36 = `qs`.
        let w: [[__m512i; 16]; 3] =
            [block_lines(&offs, blk, 0, 16), block_lines(&offs, blk, 64, 16), block_lines(&offs, blk, 128, 4)];
        for line in 0..32 {
            put(p, line, w[(4 + line) / 16][(4 + line) % 16]);
        }
        put(p, Q4K_DD, w[0][0]);
        for i in 0..3 {
            put(p, Q4K_SC + i, w[0][1 + i]);
        }
    }
}

/// Block `b` of a packed Q4_K group at `g` into `acc` (activation rows `r0..r0 + RT`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block_q4k<const RT: usize>(
    g: *const u8,
    b: usize,
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
    acc: &mut [__m512; RT],
) {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let (m15, m63, m3) = (_mm512_set1_epi32(15), _mm512_set1_epi32(63), _mm512_set1_epi32(3));
    let sign = _mm512_set1_epi32(i32::MIN);
    let zero = _mm512_setzero_si512();
    ahead.block(b);
    let p = g.add(b * Q4K_LINES * LINE);
    // The eight scales and the four min pairs (`min_2i | min_2i+1 << 16`) of each lane.
    let (l0, l1, l2) = (ld(p, Q4K_SC), ld(p, Q4K_SC + 1), ld(p, Q4K_SC + 2));
    let mut sc = [zero; 8];
    let mut mn = [zero; 8];
    for j in 0..4 {
        let (b0, b1, b2) = (byte(l0, j), byte(l1, j), byte(l2, j));
        sc[j] = _mm512_and_si512(b0, m63);
        mn[j] = _mm512_and_si512(b1, m63);
        let hi0 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b0), m3));
        sc[j + 4] = _mm512_or_si512(_mm512_and_si512(b2, m15), hi0);
        let hi1 = _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(b1), m3));
        mn[j + 4] = _mm512_or_si512(_mm512_srli_epi32::<4>(b2), hi1);
    }
    // `[RT]` activation blocks of super-block `b`.
    let mut x = [std::ptr::null::<i8>(); RT];
    for (r, xr) in x.iter_mut().enumerate() {
        *xr = act.qs.as_ptr().add((r0 + r) * k + 256 * b);
    }
    let mut s = [zero; RT];
    for c in 0..4 {
        // Sub-block 2 c (low nibbles) and 2 c + 1 (high nibbles) of every row.
        let mut lo = [zero; RT];
        let mut hi = [zero; RT];
        for step in 0..8 {
            let w = ld(p, 8 * c + step);
            let wl = _mm512_and_si512(w, m4);
            let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
            for r in 0..RT {
                let xl = _mm512_set1_epi32((x[r].add(64 * c + 4 * step) as *const i32).read_unaligned());
                let xh = _mm512_set1_epi32((x[r].add(64 * c + 32 + 4 * step) as *const i32).read_unaligned());
                lo[r] = _mm512_dpbusd_epi32(lo[r], wl, xl);
                hi[r] = _mm512_dpbusd_epi32(hi[r], wh, xh);
            }
        }
        for r in 0..RT {
            let part = _mm512_add_epi32(_mm512_mullo_epi32(lo[r], sc[2 * c]), _mm512_mullo_epi32(hi[r], sc[2 * c + 1]));
            s[r] = _mm512_add_epi32(s[r], part);
        }
    }
    let dd = ld(p, Q4K_DD);
    let d = f16_low(dd);
    let dmin = f16_low(_mm512_srli_epi32::<16>(dd));
    for r in 0..RT {
        let pr = pairs.as_ptr().add(((r0 + r) * nb + b) * 4);
        let mut m = zero;
        for i in 0..4 {
            let mnp = _mm512_or_si512(mn[2 * i], _mm512_slli_epi32::<16>(mn[2 * i + 1]));
            m = _mm512_dpwssd_epi32(m, mnp, _mm512_set1_epi32(*pr.add(i) as i32));
        }
        let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(s[r]), acc[r]);
        let dm = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, dx)), sign));
        acc[r] = _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(m), acc[r]);
    }
}

/// Activation rows `r0..r0 + RT` against one packed Q4_K group: `[RT][16]` results (rows past `RT` unset). The
/// scales and mins are unpacked as `tf_quant::q4k_scale_min` (GGML's `get_scale_min_k4`) does, per lane.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks, `pairs` holds `[act.rows][act.nb][4]` words and
/// `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q4k<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..act.nb {
        block_q4k::<RT>(g, b, act, pairs, r0, ahead, &mut acc);
    }
    rows_out(&acc)
}

/// Bytes of a Q6_K block (`ql` 128, `qh` 64, 16 i8 scales, `d`).
const Q6K_BLOCK: usize = 210;
/// Lines of a packed Q6_K block: per half `h` and step `g`, the `ql` lines of `n = 0, 1` and the `qh` line
/// (`[2 h][8 g][3]`), then the four words of i8 scales; the group's tail holds `d`.
const Q6K_LINES: usize = 52;
const Q6K_SC: usize = 48;

/// Q6_K weight rows `g0..g0 + live` into the group at `dst` (as [`pack_q4k`]).
///
/// # Safety
/// As [`pack_q4k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q6k(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    assert!((g0 + live) * row_bytes <= bytes.len() && (1..=LANES).contains(&live));
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let nb = row_bytes / Q6K_BLOCK;
    for b in 0..nb {
        let blk = base.add(b * Q6K_BLOCK);
        let p = dst.add(b * Q6K_LINES * LINE);
        // Block words 0..32 `ql`, 32..48 `qh`, 48..52 the scales; `d` is the u16 at byte 208.
        let ql: [[__m512i; 16]; 2] = [block_lines(&offs, blk, 0, 16), block_lines(&offs, blk, 64, 16)];
        let qh = block_lines(&offs, blk, 128, 16);
        for h in 0..2 {
            for step in 0..8 {
                let at = (8 * h + step) * 3;
                put(p, at, ql[h][step]);
                put(p, at + 1, ql[h][8 + step]);
                put(p, at + 2, qh[8 * h + step]);
            }
        }
        let sw = block_lines(&offs, blk, 192, 4);
        for (w, &line) in sw.iter().enumerate().take(4) {
            put(p, Q6K_SC + w, line);
        }
        put_u16(dst.add(nb * Q6K_LINES * LINE + b * 2 * LANES), block_u16(&offs, blk, 208));
    }
}

/// Q6_K: element `128 h + 32 t + l` is `(ql[64 h + 32 (t % 2) + l] >> 4 (t / 2)) & 15 | ((qh[32 h + l] >> 2 t) & 3)
/// << 4`, minus 32: the four `ql`/`qh` bytes at `l = 4 g ..` of one lane give four elements of each `t`, in
/// sub-block `8 h + 2 t + g / 4`. `S = Σ_j sc_j · P_j − 32 · Σ_j sc_j · bsum_j` with the unsigned `P_j` (exact:
/// `|Σ sc·P| ≤ 16·128·16·63·127 < 2^31`).
///
/// Activation rows `r0..r0 + RT` against one packed Q6_K group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q6k<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let m16 = _mm512_set1_epi32(0xffff);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * Q6K_LINES * LINE);
        // The 16 scales of each lane, sign-extended: scale 4 w + i is byte i of scale word w.
        let mut sc = [zero; 16];
        for w in 0..4 {
            let sw = ld(p, Q6K_SC + w);
            for i in 0..4 {
                sc[4 * w + i] = _mm512_srai_epi32::<24>(_mm512_sll_epi32(sw, _mm_cvtsi32_si128(24 - 8 * i as i32)));
            }
        }
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 256 * b);
        }
        let mut s = [zero; RT];
        for h in 0..2 {
            for gh in 0..2 {
                // Sub-blocks 8 h + 2 t + gh, t = 0..4, of every row.
                let mut pt = [[zero; RT]; 4];
                for step in 4 * gh..4 * gh + 4 {
                    let at = (8 * h + step) * 3;
                    let (ql0, ql1, qh) = (ld(p, at), ld(p, at + 1), ld(p, at + 2));
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
                            let xv = _mm512_set1_epi32(
                                (x[r].add(128 * h + 32 * t + 4 * step) as *const i32).read_unaligned(),
                            );
                            pt[t][r] = _mm512_dpbusd_epi32(pt[t][r], *wt, xv);
                        }
                    }
                }
                for (t, pt) in pt.iter().enumerate() {
                    let sct = sc[8 * h + 2 * t + gh];
                    for r in 0..RT {
                        s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(pt[r], sct));
                    }
                }
            }
        }
        let d = tail_f16(g.add(nb * Q6K_LINES * LINE + b * 2 * LANES));
        for r in 0..RT {
            // Σ_j sc_j · bsum_j over the row's 16 bsums, as i16 pairs.
            let bs = act.sums.as_ptr().add(((r0 + r) * nb + b) * 16) as *const i32;
            let mut m = zero;
            for i in 0..8 {
                let scp = _mm512_or_si512(_mm512_and_si512(sc[2 * i], m16), _mm512_slli_epi32::<16>(sc[2 * i + 1]));
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
/// nibble): five 32-bit words, so a weight row is a stream of words. A packed block is its `qs` lines `[4]`, then
/// the line of block word 0 (`d | m` as f16).
const Q41_BLOCK: usize = 20;

/// Q4_1 weight rows `g0..g0 + live` into the group at `dst`: each row is a stream of `5 nb` words, transposed 16
/// words at a time; word `5 b` goes to block `b`'s `d | m` line, words `5 b + 1 ..+4` to its `qs` lines.
///
/// # Safety
/// As [`pack_q4k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q41(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    assert!((g0 + live) * row_bytes <= bytes.len() && (1..=LANES).contains(&live));
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let words = row_bytes / 4;
    for q in 0..words.div_ceil(16) {
        let n = (words - 16 * q).min(16);
        let lines = block_lines(&offs, base, 64 * q, n);
        for (i, &line) in lines.iter().enumerate().take(n) {
            let w = 16 * q + i;
            let (b, k) = (w / 5, w % 5);
            put(dst, 5 * b + if k == 0 { 4 } else { k - 1 }, line);
        }
    }
}

/// Q4_1: per block, `P = Σ q·qx` by eight `vpdpbusd` (word `i`'s low nibbles are elements `4 i ..+4`, its high
/// nibbles `16 + 4 i ..+4`), then the reference's `acc = fma(dw · dx, P, acc)` and `acc = fma(m · dx, Σ qx, acc)`
/// per lane.
///
/// Activation rows `r0..r0 + RT` against one packed Q4_1 group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q41<const RT: usize>(
    g: *const u8,
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
        let p = g.add(b * 5 * LINE);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let mut s = [zero; RT];
        for i in 0..4 {
            let w = ld(p, i);
            let wl = _mm512_and_si512(w, m4);
            let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
            for r in 0..RT {
                let xl = _mm512_set1_epi32((x[r].add(4 * i) as *const i32).read_unaligned());
                let xh = _mm512_set1_epi32((x[r].add(16 + 4 * i) as *const i32).read_unaligned());
                s[r] = _mm512_dpbusd_epi32(s[r], wl, xl);
                s[r] = _mm512_dpbusd_epi32(s[r], wh, xh);
            }
        }
        let dm = ld(p, 4);
        let d = f16_low(dm);
        let m = f16_low(_mm512_srli_epi32::<16>(dm));
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
/// `l < 16` the low nibble of `qs[l]`, `16 + l` its high nibble); a value is `nibble | bit << 4`, minus 16. A
/// packed block is its `qh` line and `qs` lines `[4]`; the group's tail holds `d`.
const Q50_BLOCK: usize = 22;

/// Q5_0 weight rows `g0..g0 + live` into the group at `dst` ([`pack_pairs`]: the five words after `d`, `qh`
/// then `qs`, are a packed block's lines).
///
/// # Safety
/// As [`pack_q4k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q50(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    pack_pairs(bytes, row_bytes, g0, live, dst, Q50_BLOCK, 2, 5, _mm512_setzero_si512())
}

/// A 32-element type whose block is `d` (f16) then `words` (≤ 8) 32-bit words: rows `g0..g0 + live` into the
/// group at `dst`, two blocks per 16 × 16 transpose (block `b`'s words in words 0..8 of each lane, block `b + 1`'s
/// in 8..16). A packed block is its `words` lines, each XORed with `flip`; the group's tail holds each block's `d`.
/// The words start at byte `at` of the block: 2, after `d`; 1 for MXFP4, whose tail entry (always the block's
/// first two bytes) is then its scale byte and first code byte.
///
/// # Safety
/// As [`pack_q4k`], with `row_bytes` whole blocks of `block` bytes.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_pairs(
    bytes: &[u8],
    row_bytes: usize,
    g0: usize,
    live: usize,
    dst: *mut u8,
    block: usize,
    at: usize,
    words: usize,
    flip: __m512i,
) {
    let nb = row_bytes / block;
    assert!((g0 + live) * row_bytes <= bytes.len() && (1..=LANES).contains(&live) && words <= 8);
    assert!(at + 4 * words <= block && block >= 2, "pack_pairs: a block's words and tail entry");
    let offs = lane_offsets(row_bytes, live);
    let base = bytes.as_ptr().add(g0 * row_bytes);
    let mask: __mmask8 = ((1u16 << words) - 1) as u8;
    for b in (0..nb).step_by(2) {
        let two = b + 1 < nb;
        let mut m = [_mm512_setzero_si512(); 16];
        for l in 0..LANES {
            let blk = base.add(offs[l] as usize + b * block);
            let lo = _mm256_maskz_loadu_epi32(mask, blk.add(at) as *const i32);
            let hi = if two {
                _mm256_maskz_loadu_epi32(mask, blk.add(block + at) as *const i32)
            } else {
                _mm256_setzero_si256()
            };
            m[l] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        }
        let lines = transpose16(&m);
        for (k, half) in [(b, 0usize), (b + 1, 8)].into_iter().take(if two { 2 } else { 1 }) {
            for w in 0..words {
                put(dst, words * k + w, _mm512_xor_si512(lines[half + w], flip));
            }
            put_u16(dst.add(nb * words * LINE + k * 2 * LANES), block_u16(&offs, base, k * block));
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
/// Activation rows `r0..r0 + RT` against one packed Q5_0 group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q50<const RT: usize>(
    g: *const u8,
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
        let p = g.add(b * 5 * LINE);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let qh = ld(p, 0);
        let mut s = [zero; RT];
        for i in 0..4 {
            let w = ld(p, 1 + i);
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
        let d = tail_f16(g.add(nb * 5 * LINE + b * 2 * LANES));
        for r in 0..RT {
            let sx = _mm512_set1_epi32(*act.s_t.as_ptr().add(b * rows + r0 + r));
            let total = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<4>(sx));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}

/// Bytes of a Q8_0 block: `d` (f16), 32 i8 `qs`. A packed block is its `qs` lines `[8]` with each byte's top bit
/// flipped (`q + 128` as a u8, the unsigned operand `vpdpbusd` takes); the group's tail holds `d`.
const Q80_BLOCK: usize = 34;

/// Q8_0 weight rows `g0..g0 + live` into the group at `dst` ([`pack_pairs`]: the eight `qs` words, top bits
/// flipped, are a packed block's lines).
///
/// # Safety
/// As [`pack_q4k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q80(bytes: &[u8], row_bytes: usize, g0: usize, live: usize, dst: *mut u8) {
    pack_pairs(bytes, row_bytes, g0, live, dst, Q80_BLOCK, 2, 8, _mm512_set1_epi8(-128))
}

/// Q8_0: per block, `P = Σ (q + 128)·qx` by eight `vpdpbusd`, `S = P − 128 · Σ qx = Σ q·qx` (exact:
/// `|P| ≤ 32·255·127`), then the reference's `acc = fma(dw · dx, S, acc)` per lane.
///
/// Activation rows `r0..r0 + RT` against one packed Q8_0 group: `[RT][16]` results (rows past `RT` unset).
///
/// # Safety
/// AVX-512 F/BW/VNNI; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_q80<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (k, nb, rows) = (act.k, act.nb, act.rows);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * 8 * LINE);
        let mut x = [std::ptr::null::<i8>(); RT];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = act.qs.as_ptr().add((r0 + r) * k + 32 * b);
        }
        let mut s = [zero; RT];
        for i in 0..8 {
            let w = ld(p, i);
            for r in 0..RT {
                let xv = _mm512_set1_epi32((x[r].add(4 * i) as *const i32).read_unaligned());
                s[r] = _mm512_dpbusd_epi32(s[r], w, xv);
            }
        }
        let d = tail_f16(g.add(nb * 8 * LINE + b * 2 * LANES));
        for r in 0..RT {
            let sx = _mm512_set1_epi32(*act.s_t.as_ptr().add(b * rows + r0 + r));
            let total = _mm512_sub_epi32(s[r], _mm512_slli_epi32::<7>(sx));
            let dx = _mm512_set1_ps(*act.d_t.as_ptr().add(b * rows + r0 + r));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}
