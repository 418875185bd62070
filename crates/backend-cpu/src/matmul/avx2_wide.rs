//! Checkpoint mode with AVX2 for Q4_K, Q5_K, Q6_K, Q4_1, Q5_0 and Q8_0 weights stored in a *wide layout* ([`pack`], once
//! at load): eight weight rows side by side, one per 32-bit lane of a 256-bit register, so that the integer sums of
//! a (sub-)block accumulate in place and need no horizontal reduction. Every row count, one included, runs these
//! kernels on a CPU with AVX2, FMA and F16C but not AVX-512 (which has its own wide kernels, `avx512_wide`).
//!
//! The tile kernels (`avx2_legacy`, `avx2_kquant`) compute one weight row per register: each block's 32 products
//! land in eight i32 lanes that must then be summed across the register (`reduce8`, about as many instructions as
//! the products themselves), and each lane's f16 scale is gathered and converted on its own. Here a group of 8
//! weight rows is stored as 32-byte lines, each holding one 32-bit word of every row's block; a `vpmaddubsw` of a
//! line's unsigned weight bytes with four activation bytes broadcast to every lane adds two products to each of the
//! lane's two i16 halves. AVX2 has no `vpdpbusd`, so the i16 sums of several steps are added in i16 as long as
//! they cannot overflow (bounds at each kernel), then widened once by `vpmaddwd` — with the sub-block scale as the
//! multiplier for the K-quants, so `sc_j · P_j` comes out of the same instruction. All of it is exact integer
//! arithmetic, so every lane's integer sums are the reference's, and the float steps per lane are the reference's:
//! `acc = fma(dw · dx, S, acc)` (and the mins or offset term of each type), blocks in order.
//!
//! The layout holds the same bytes as the GGUF blocks, only moved (scales stay packed and `d` stays f16), except
//! the Q5_0 fifth bits, whose 32 bits per block are permuted (see [`pack_q50`]): a packed weight is as large as the
//! file's plus at most 7 padding rows. One group is `nb` blocks of whole lines, then (Q6_K, Q5_0, Q8_0) each block's
//! eight `d` as f16 (16 bytes per block), rounded up to a line. Packing is plain byte copies.

use std::arch::x86_64::*;
use std::cell::RefCell;

use tf_core::DType;

use super::act::ActQ;
use super::Out;

mod kquant;

/// Weight rows per group: the 32-bit lanes of a 256-bit register.
pub(super) const LANES: usize = 8;
/// Bytes of a line: one 256-bit load.
const LINE: usize = 32;
/// How many groups ahead of the one being computed the next weights are requested.
const AHEAD_GROUPS: usize = 2;

/// The wide kernel of `dtype`, if there is one.
fn kernel(dtype: DType) -> Option<&'static Wide> {
    Some(match dtype {
        DType::Q4K => &kquant::Q4K,
        DType::Q5K => &kquant::Q5K,
        DType::Q6K => &kquant::Q6K,
        DType::Q4_1 => &Q41,
        DType::Q5_0 => &Q50,
        DType::Q8_0 => &Q80,
        _ => return None,
    })
}

/// One line of a packed weight, aligned as a line.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Line([u8; LINE]);

/// A weight `[n][row_bytes]` in the wide layout: `[n.div_ceil(8)]` groups of `group_bytes` (rows past `n` in the
/// last group repeat its last row; their sums are dropped).
pub(crate) struct Packed {
    kernel: &'static Wide,
    /// Weight rows (`n`) and blocks per row.
    rows: usize,
    nb: usize,
    group_bytes: usize,
    /// `[groups * group_bytes / 32]` lines.
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

/// Whether this CPU runs the AVX2 wide kernels (AVX2, FMA and F16C).
pub(crate) fn usable() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// `bytes` (`n` rows of `row_bytes`, whole blocks of `dtype`) in the wide layout, when `dtype` has a wide kernel
/// and this CPU has AVX2, FMA and F16C. `done` is told each range of `bytes` that has been copied (a few MB at a
/// time, in order), so that a mapped source can be released as the copy grows.
pub(crate) fn pack(
    dtype: DType,
    bytes: &[u8],
    n: usize,
    row_bytes: usize,
    done: &mut dyn FnMut(std::ops::Range<usize>),
) -> Option<Packed> {
    let k = kernel(dtype)?;
    if n == 0 || !usable() {
        return None;
    }
    assert!(row_bytes.is_multiple_of(k.block_bytes) && bytes.len() == n * row_bytes, "{} pack: layout", k.name);
    let nb = row_bytes / k.block_bytes;
    let group_bytes = k.group_bytes(nb);
    let groups = n.div_ceil(LANES);
    let mut lines = vec![Line([0; LINE]); groups * group_bytes / LINE];
    // SAFETY: `lines` is `groups * group_bytes` initialized bytes (plain data), borrowed mutably once.
    let all = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr() as *mut u8, groups * group_bytes) };
    // Source bytes copied since `done` was last told.
    let (mut told, batch) = (0, 4 << 20);
    for (g, dst) in all.chunks_exact_mut(group_bytes).enumerate() {
        let live = (n - LANES * g).min(LANES);
        let rows: [&[u8]; LANES] = std::array::from_fn(|l| {
            let r = LANES * g + l.min(live - 1);
            &bytes[r * row_bytes..(r + 1) * row_bytes]
        });
        (k.pack)(&rows, nb, dst);
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

/// One wide kernel: the weight block it reads, how it packs a group of 8 weight rows and how it computes up to four
/// activation rows against a packed group.
pub(super) struct Wide {
    name: &'static str,
    /// Bytes of a weight block; elements of an activation block (256 for the K-quants, 32 for the legacy types).
    block_bytes: usize,
    act_block: usize,
    /// Lines of one packed block.
    lines: usize,
    /// Whether the group ends in the blocks' `d` (f16, `[nb][8]`).
    tail: bool,
    /// Whether the row kernel reads the Q4_K mins pairs of the activation sums.
    pairs: bool,
    pack: Pack,
    /// The row kernels for 1, 2, 3 and 4 rows.
    rows: [Rows; 4],
}

impl Wide {
    /// Bytes of one packed group of 8 rows of `nb` blocks.
    fn group_bytes(&self, nb: usize) -> usize {
        (nb * self.lines * LINE + if self.tail { nb * 2 * LANES } else { 0 }).next_multiple_of(LINE)
    }
}

/// Packs the 8 weight rows `rows` (`nb` whole blocks each) into the group `dst` (`group_bytes(nb)`).
type Pack = fn(&[&[u8]; LANES], usize, &mut [u8]);
/// Activation rows `r0..` against a packed group (`pairs`: the Q4_K mins pairs, else unused).
type Rows = unsafe fn(*const u8, &ActQ, &[u32], usize, Ahead) -> [[f32; LANES]; 4];

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

/// Output columns `c0..c1` of `out` (`c0` a multiple of 8) for every activation row of `act` against the packed
/// weight `p`, checkpoint mode (`next`: the weight computed after this one, whose first groups are requested while
/// this one's last are computed). Bit-equal to the tile kernels and the reference.
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
        for i in c0 / LANES..(c0 / LANES + AHEAD_GROUPS).min(c1.div_ceil(LANES)) {
            crate::simd::prefetch_l2(p.group(i));
        }
        for g0 in (c0..c1).step_by(LANES) {
            let live = (c1 - g0).min(LANES);
            let group = p.group(g0 / LANES);
            // The group `AHEAD_GROUPS` further, requested into L2 a slice per block while this group's first rows
            // are computed; past the chunk's end too, and into the next weight.
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
                // SAFETY: `pack` only builds a `Packed` on a CPU with AVX2, FMA and F16C; `group` holds `nb` packed
                // blocks (and their tail), `pairs` (when read) and `act` every row's data (the asserts above),
                // `r0 + rt ≤ rows`.
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
pub(super) struct Ahead {
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
            at += 64;
        }
    }
}

/// Copies, for each lane `l`, `len` bytes at byte `at` of `rows[l]` to byte `len · l` of `dst` (a line of 4-byte
/// words when `len` is 4, a tail entry of f16 when it is 2).
fn put_lanes(rows: &[&[u8]; LANES], at: usize, len: usize, dst: &mut [u8]) {
    for (l, row) in rows.iter().enumerate() {
        dst[len * l..len * (l + 1)].copy_from_slice(&row[at..at + len]);
    }
}

/// Line `i` from `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn ld(p: *const u8, i: usize) -> __m256i {
    _mm256_loadu_si256(p.add(LINE * i) as *const __m256i)
}

/// The four activation bytes at `x` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bcast(x: *const i8) -> __m256i {
    _mm256_set1_epi32((x as *const i32).read_unaligned())
}

/// The eight f16 at `p` as f32 (`vcvtph2ps`: exact but for a signaling NaN, which comes out quiet, as the product
/// with the activation scale that always follows makes it anyway).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The `RT` rows' 8 lanes as `[4][8]` floats (rows past `RT` zero), the row kernels' result.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_out<const RT: usize>(acc: &[__m256; RT]) -> [[f32; LANES]; 4] {
    let mut res = [[0f32; LANES]; 4];
    for r in 0..RT {
        _mm256_storeu_ps(res[r].as_mut_ptr(), acc[r]);
    }
    res
}

/// `[RT]` pointers to block `b` (of `block` elements) of activation rows `r0..r0 + RT`.
#[inline]
pub(super) fn act_rows<const RT: usize>(act: &ActQ, r0: usize, b: usize, block: usize) -> [*const i8; RT] {
    std::array::from_fn(|r| act.qs[(r0 + r) * act.k + block * b..].as_ptr())
}

/// Bytes of a Q4_1 block (`d`, `m`, 16 `qs` bytes: element `l < 16` the low nibble of `qs[l]`, `16 + l` its high
/// nibble). A packed block is its `qs` lines `[4]` (line `i`: word `i` of `qs` of each row), then one line of the
/// rows' `d` (8 f16) and `m` (8 f16).
const Q41_BLOCK: usize = 20;

fn pack_q41(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q41_BLOCK, b * 5 * LINE);
        for i in 0..4 {
            put_lanes(rows, blk + 4 + 4 * i, 4, &mut dst[p + LINE * i..]);
        }
        put_lanes(rows, blk, 2, &mut dst[p + 4 * LINE..]);
        put_lanes(rows, blk + 2, 2, &mut dst[p + 4 * LINE + 2 * LANES..]);
    }
}

/// Q4_1: per block, `P = Σ q·qx` by eight `vpmaddubsw` added in i16 (each i16 then holds 16 products:
/// `|·| ≤ 16·15·127 < 2^15`) and one `vpmaddwd`; then the reference's `acc = fma(dw · dx, P, acc)` and
/// `acc = fma(m · dx, Σ qx, acc)` per lane.
///
/// Activation rows `r0..r0 + RT` against one packed Q4_1 group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// AVX2/FMA/F16C; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q41<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (nb, rows) = (act.nb, act.rows);
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * 5 * LINE);
        let x = act_rows::<RT>(act, r0, b, 32);
        let mut s = [zero; RT];
        for i in 0..4 {
            let w = ld(p, i);
            let wl = _mm256_and_si256(w, m4);
            let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
            for r in 0..RT {
                s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(wl, bcast(x[r].add(4 * i))));
                s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(wh, bcast(x[r].add(16 + 4 * i))));
            }
        }
        let d = f16x8(p.add(4 * LINE));
        let m = f16x8(p.add(4 * LINE + 2 * LANES));
        for r in 0..RT {
            let at = b * rows + r0 + r;
            let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(at));
            let sx = _mm256_set1_ps(*act.s_t.as_ptr().add(at) as f32);
            let sum = _mm256_madd_epi16(s[r], ones);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sum), acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), sx, acc[r]);
        }
    }
    rows_out(&acc)
}

/// Bytes of a Q5_0 block: `d` (f16), `qh` (32 fifth bits, bit `e` of element `e`), 16 `qs` bytes (element
/// `l < 16` the low nibble of `qs[l]`, `16 + l` its high nibble); a value is `nibble | bit << 4`, minus 16. A
/// packed block is a line of the rows' permuted fifth bits ([`q50_bits`]) and the `qs` lines `[4]`; the group's
/// tail holds `d`.
const Q50_BLOCK: usize = 22;

/// The fifth bits `qh` of a Q5_0 block permuted so that bit `k` of byte `j` is the bit of element `16 (k / 4) +
/// 4 (k % 4) + j`: the bits of the four elements of `qs` word `i`'s low (`k = i`) or high (`k = 4 + i`) nibbles then
/// sit at bit `k` of the word's four bytes, one shift from bit 4.
fn q50_bits(qh: u32) -> u32 {
    let mut out = 0;
    for j in 0..4 {
        for k in 0..8 {
            let e = 16 * (k / 4) + 4 * (k % 4) + j;
            out |= (qh >> e & 1) << (8 * j + k);
        }
    }
    out
}

fn pack_q50(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q50_BLOCK, b * 5 * LINE);
        for (l, row) in rows.iter().enumerate() {
            let qh = u32::from_le_bytes(row[blk + 2..blk + 6].try_into().expect("4 bytes"));
            dst[p + 4 * l..p + 4 * l + 4].copy_from_slice(&q50_bits(qh).to_le_bytes());
        }
        for i in 0..4 {
            put_lanes(rows, blk + 6 + 4 * i, 4, &mut dst[p + LINE * (1 + i)..]);
        }
        put_lanes(rows, blk, 2, &mut dst[nb * 5 * LINE + b * 2 * LANES..]);
    }
}

/// Bit `K` of each byte of `v` moved to bit 4 and the rest cleared: 16 where that element's fifth bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fifth<const K: i32>(v: __m256i) -> __m256i {
    let m10 = _mm256_set1_epi8(0x10);
    match K {
        0..4 => _mm256_and_si256(_mm256_sll_epi32(v, _mm_cvtsi32_si128(4 - K)), m10),
        4 => _mm256_and_si256(v, m10),
        _ => _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(K - 4)), m10),
    }
}

/// Q5_0: per block, `P = Σ q·qx` over the unsigned five-bit values (eight `vpmaddubsw`, added in i16 four at a
/// time: `|·| ≤ 8·31·127 < 2^15`), `S = P − 16 · Σ qx` (exact), then the reference's `acc = fma(dw · dx, S, acc)`
/// per lane.
///
/// Activation rows `r0..r0 + RT` against one packed Q5_0 group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// AVX2/FMA/F16C; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q50<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (nb, rows) = (act.nb, act.rows);
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * 5 * LINE);
        let x = act_rows::<RT>(act, r0, b, 32);
        let qh = ld(p, 0);
        // Low nibbles (elements 0..16) of the four `qs` words, then the high nibbles (16..32).
        let mut s = [zero; RT];
        for half in 0..2 {
            let mut h = [zero; RT];
            for i in 0..4 {
                let w = ld(p, 1 + i);
                let nib = if half == 0 { w } else { _mm256_srli_epi16::<4>(w) };
                let bit = match 4 * half + i {
                    0 => fifth::<0>(qh),
                    1 => fifth::<1>(qh),
                    2 => fifth::<2>(qh),
                    3 => fifth::<3>(qh),
                    4 => fifth::<4>(qh),
                    5 => fifth::<5>(qh),
                    6 => fifth::<6>(qh),
                    _ => fifth::<7>(qh),
                };
                let v = _mm256_or_si256(_mm256_and_si256(nib, m4), bit);
                for r in 0..RT {
                    h[r] = _mm256_add_epi16(h[r], _mm256_maddubs_epi16(v, bcast(x[r].add(16 * half + 4 * i))));
                }
            }
            for r in 0..RT {
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(h[r], ones));
            }
        }
        let d = f16x8(g.add(nb * 5 * LINE + b * 2 * LANES));
        for r in 0..RT {
            let at = b * rows + r0 + r;
            let sx = _mm256_set1_epi32(*act.s_t.as_ptr().add(at));
            let total = _mm256_sub_epi32(s[r], _mm256_slli_epi32::<4>(sx));
            let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(at));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(total), acc[r]);
        }
    }
    rows_out(&acc)
}

/// Bytes of a Q8_0 block: `d` (f16), 32 i8 `qs`. A packed block is its `qs` lines `[8]`; the group's tail holds `d`.
const Q80_BLOCK: usize = 34;

fn pack_q80(rows: &[&[u8]; LANES], nb: usize, dst: &mut [u8]) {
    for b in 0..nb {
        let (blk, p) = (b * Q80_BLOCK, b * 8 * LINE);
        for i in 0..8 {
            put_lanes(rows, blk + 2 + 4 * i, 4, &mut dst[p + LINE * i..]);
        }
        put_lanes(rows, blk, 2, &mut dst[nb * 8 * LINE + b * 2 * LANES..]);
    }
}

/// Q8_0: per block, `S = Σ q·qx` as `vpmaddubsw(|q|, sign(q)·qx)` (pairs `≤ 2·128·127 < 2^15`), widened by
/// `vpmaddwd` each step, then the reference's `acc = fma(dw · dx, S, acc)` per lane.
///
/// Activation rows `r0..r0 + RT` against one packed Q8_0 group: `[RT][8]` results (rows past `RT` unset).
///
/// # Safety
/// AVX2/FMA/F16C; `g` is a packed group of `act.nb` blocks and `r0 + RT ≤ act.rows`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_q80<const RT: usize>(
    g: *const u8,
    act: &ActQ,
    _pairs: &[u32],
    r0: usize,
    ahead: Ahead,
) -> [[f32; LANES]; 4] {
    let (nb, rows) = (act.nb, act.rows);
    let ones = _mm256_set1_epi16(1);
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); RT];
    for b in 0..nb {
        ahead.block(b);
        let p = g.add(b * 8 * LINE);
        let x = act_rows::<RT>(act, r0, b, 32);
        let mut s = [zero; RT];
        for i in 0..8 {
            let w = ld(p, i);
            let a = _mm256_sign_epi8(w, w);
            for r in 0..RT {
                let xv = _mm256_sign_epi8(bcast(x[r].add(4 * i)), w);
                s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a, xv), ones));
            }
        }
        let d = f16x8(g.add(nb * 8 * LINE + b * 2 * LANES));
        for r in 0..RT {
            let at = b * rows + r0 + r;
            let dx = _mm256_set1_ps(*act.d_t.as_ptr().add(at));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(s[r]), acc[r]);
        }
    }
    rows_out(&acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fifth bit lands where [`fifth`] looks for it.
    #[test]
    fn q50_bits_put_each_element_where_the_kernel_reads_it() {
        for e in 0..32 {
            let p = q50_bits(1 << e);
            assert_eq!(p.count_ones(), 1, "element {e}");
            let (byte, bit) = (p.trailing_zeros() / 8, p.trailing_zeros() % 8);
            // Element e: nibble half e / 16, qs word (e % 16) / 4, byte e % 4 of the word.
            assert_eq!((byte, bit), (e % 4, 4 * (e / 16) + (e % 16) / 4), "element {e}");
        }
    }
}
