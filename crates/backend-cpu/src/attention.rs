//! Attention over paged KV, following `tf_quant::reference::ops::attention_head` bit for bit.
//!
//! Work layout (none of it changes a bit: every (row, query head) keeps its own state and visits its chunks in
//! increasing order, exactly as the reference does). Threads take units of (kv head, tile of up to
//! [`TILE_ROWS`] rows, range of that kv head's query heads); with few rows over several chunks (decode steps,
//! short windows) a unit takes every kv head of a range of chunks instead, so each slot's K and V records are
//! read whole by one unit. A unit walks the chunks (256 absolute positions)
//! in increasing order, in lockstep over its rows, so each chunk's K and V rows are read from memory once and
//! reused from cache by every row and query head of the unit. Per row and chunk it gathers the slots straight
//! from the block table (no per-position division), scores the chunk in blocks of [`BLOCK`] positions, each block
//! against every query head of every kv head of the unit before the next (so a block's K rows are fetched once,
//! side by side in their slot records, and read from L1 by the other heads) with the AVX2 `dot16` (eight rows and
//! their trees at once where `kv_dot::dot16_x8_scaled` applies), soft-caps and
//! exponentiates scores as vectors, sums `l_c` in position order, accumulates `o_c` across `head_dim` with vector
//! fmas in the same blocks, and merges into the running state.
//!
//! An f16 cache (docs/arithmetic.md "KV storage types") is read where it is stored on x86-64 with AVX2 and F16C
//! when `head_dim` is a multiple of 16 (`kv_dot`: each value widened in the register that takes it, the same
//! values and chains as the f32 loop). A q8_0 cache, or f16 otherwise, is read back to f32 per (row, chunk, kv
//! head) into a unit's scratch rows, then the same loop runs on them: the rows of a prompt chunk share their
//! chunk's leading slots, so a row reads back only the slots past those the previous row of the unit read.

use crate::isa::Isa;
use crate::kv::read_back_rows;
use crate::{math, simd};
use std::ops::Range;
use tf_core::{AttnMeta, AttnParams, RowAttn, Tensor};
use tf_quant::reference::kv::{KvData, KvView};
use tf_quant::reference::math::exp;
use tf_quant::reference::ops::{check_attention, in_window, KvLayer, ATTN_CHUNK};

/// Rows per unit: they share the K/V of each chunk while it is in cache.
const TILE_ROWS: usize = 8;
/// Below this much work (visited positions × heads × head_dim) attention runs on the calling thread.
const PAR_WORK: usize = 1 << 15;

/// Checks every row's block table and tree list once (the reference panics on the same inputs).
fn check_rows(kv: &KvView, meta: &AttnMeta) {
    let bs = kv.block_size;
    let slots = kv.slots();
    for row in &meta.rows {
        let table = &meta.block_tables[row.seq];
        let ctx = row.ctx as usize;
        assert!(
            ctx.div_ceil(bs) <= table.len(),
            "attention: ctx {ctx} needs {} blocks, the block table has {}",
            ctx.div_ceil(bs),
            table.len()
        );
        for &b in &table[..ctx.div_ceil(bs)] {
            assert!((b as usize + 1) * bs <= slots, "attention: block {b} outside the pool of {slots} slots");
        }
        let mut last = row.ctx.checked_sub(1);
        for &(p, slot) in &row.tree {
            assert!(
                last.is_none_or(|l| p > l),
                "attention: tree positions must increase past ctx ({p} after {last:?})"
            );
            assert!((slot as usize) < slots, "attention: tree slot {slot} outside the pool of {slots}");
            last = Some(p);
        }
    }
}

/// `q [R, heads·head_dim]` over `kv` → `[R, heads·head_dim]` (docs/arithmetic.md "Attention").
pub(crate) fn attention(
    pool: &crate::Pool,
    isa: Isa,
    q: &Tensor,
    kv: &KvView,
    meta: &AttnMeta,
    p: &AttnParams,
) -> Tensor {
    // The shapes against `p` (the stored values are checked by `check_rows`).
    let shape = KvLayer { k: &[], v: &[], block_size: kv.block_size, kv_heads: kv.kv_heads, head_dim: kv.head_dim };
    check_attention(q, &shape, meta, p);
    assert_eq!(kv.k.len(), kv.v.len(), "attention: K and V sizes");
    check_rows(kv, meta);
    let hd = p.head_dim;
    let group = p.heads / p.kv_heads;
    let mut out = Tensor::zeros(q.rows, q.cols);
    if out.host.is_empty() {
        return out;
    }
    // Units: kv head × row tile × (head split or chunk range). When there are too few units to keep the threads
    // busy (decode steps), a long context is split into ranges of chunks (each range's per-chunk partials are
    // merged afterwards in chunk order, as the reference merges them: the K/V are read once); a short one
    // (one chunk) splits a kv head's query heads instead.
    let tiles = q.rows.div_ceil(TILE_ROWS);
    let want = 2 * pool.threads();
    let few = p.kv_heads * tiles < want;
    let last_chunk = meta.rows.iter().map(|r| r.pos / ATTN_CHUNK).max().unwrap_or(0);
    let n = last_chunk as usize + 1;
    // With few rows and a long context, a unit takes every kv head of its range of chunks: the K and V records of
    // a slot (all kv heads side by side) are then read whole, once, by one unit.
    let all_heads = few && n >= 2;
    let ranges = if all_heads {
        (2 * want).div_ceil(tiles).min(n)
    } else if few {
        (2 * want).div_ceil(p.kv_heads * tiles).min(n)
    } else {
        1
    };
    let splits = if few && ranges < 2 { want.div_ceil(p.kv_heads * tiles).min(group) } else { 1 };
    let kv_groups: Vec<Range<usize>> =
        if all_heads { std::iter::once(0..p.kv_heads).collect() } else { (0..p.kv_heads).map(|h| h..h + 1).collect() };
    let mut units = Vec::with_capacity(kv_groups.len() * tiles * splits * ranges);
    for kvhs in kv_groups {
        for t in 0..tiles {
            let rows = t * TILE_ROWS..((t + 1) * TILE_ROWS).min(q.rows);
            for s in 0..splits {
                // Query heads of the unit: all of `kvhs`' heads, or a share of one kv head's.
                let heads = if kvhs.len() > 1 {
                    kvhs.start * group..kvhs.end * group
                } else {
                    let kvh = kvhs.start;
                    kvh * group + s * group / splits..kvh * group + (s + 1) * group / splits
                };
                if heads.is_empty() {
                    continue;
                }
                for k in 0..ranges {
                    let chunks =
                        if ranges == 1 { 0..u32::MAX } else { (k * n / ranges) as u32..((k + 1) * n / ranges) as u32 };
                    units.push(Unit { rows: rows.clone(), heads: heads.clone(), chunks });
                }
            }
        }
    }
    let work: usize = meta.rows.iter().map(|r| r.ctx as usize + r.tree.len()).sum::<usize>() * p.heads * hd;
    let serial = work < PAR_WORK || pool.threads() == 1;
    // Scatter: a group's output `[rows, heads, head_dim]` into `out [R, heads·head_dim]`.
    let mut scatter = |u: &Unit, res: &[f32]| {
        let width = u.heads.len() * hd;
        for (i, r) in u.rows.clone().enumerate() {
            out.row_mut(r)[u.heads.start * hd..u.heads.end * hd].copy_from_slice(&res[i * width..(i + 1) * width]);
        }
    };
    if ranges == 1 {
        let run = |u: &Unit| {
            let mut st = State::new(u.rows.len(), u.heads.len(), hd);
            unit(isa, q, kv, meta, p, u, &mut |i, m_c, l_c, o_c| st.fold(isa, i, m_c, l_c, o_c));
            st.finish(isa, unit_sinks(p, u))
        };
        let results: Vec<Vec<f32>> =
            if serial { units.iter().map(run).collect() } else { pool.map(units.len(), |i| run(&units[i])) };
        for (u, res) in units.iter().zip(&results) {
            scatter(u, res);
        }
    } else {
        let run = |u: &Unit| {
            let mut parts = Vec::new();
            unit(isa, q, kv, meta, p, u, &mut |i, m_c, l_c, o_c| {
                parts.push((i, m_c.to_vec(), l_c.to_vec(), o_c.to_vec()))
            });
            parts
        };
        let results: Vec<Vec<Partial>> =
            if serial { units.iter().map(run).collect() } else { pool.map(units.len(), |i| run(&units[i])) };
        // Each group's ranges are consecutive units in chunk order: fold their partials in that order.
        for (group_units, group_parts) in units.chunks(ranges).zip(results.chunks(ranges)) {
            let u = &group_units[0];
            let mut st = State::new(u.rows.len(), u.heads.len(), hd);
            for (i, m_c, l_c, o_c) in group_parts.iter().flatten() {
                st.fold(isa, *i, m_c, l_c, o_c);
            }
            scatter(u, &st.finish(isa, unit_sinks(p, u)));
        }
    }
    out
}

/// The sink logits of a unit's query heads (`[heads]`), if the layer has sinks.
fn unit_sinks<'a>(p: &'a AttnParams, u: &Unit) -> Option<&'a [f32]> {
    p.sinks.as_deref().map(|s| &s[u.heads.clone()])
}

/// Receives (row `i` of a unit, `m_c`, `l_c`, `o_c`) for each visited chunk.
type ChunkSink<'a> = dyn FnMut(usize, &[f32], &[f32], &[f32]) + 'a;

/// One chunk's result for row `i` of a unit: `m_c [heads]`, `l_c [heads]`, `o_c [heads, head_dim]`.
type Partial = (usize, Vec<f32>, Vec<f32>, Vec<f32>);

/// The running softmax state of a unit's (row, query head) pairs, merged chunk by chunk as the reference does.
struct State {
    heads: usize,
    hd: usize,
    /// `[rows, heads, head_dim]`: the unnormalized output.
    o: Vec<f32>,
    /// `[rows, heads]`: the running maximum and sum.
    m: Vec<f32>,
    l: Vec<f32>,
    /// `[rows]`: whether the row's first chunk has been merged.
    started: Vec<bool>,
}

impl State {
    fn new(rows: usize, heads: usize, hd: usize) -> State {
        State {
            heads,
            hd,
            o: vec![0f32; rows * heads * hd],
            m: vec![0f32; rows * heads],
            l: vec![0f32; rows * heads],
            started: vec![false; rows],
        }
    }

    /// Merges row `i`'s next chunk (`m_c`, `l_c` `[heads]`, `o_c [heads, head_dim]`).
    fn fold(&mut self, isa: Isa, i: usize, m_c: &[f32], l_c: &[f32], o_c: &[f32]) {
        let (nh, hd) = (self.heads, self.hd);
        for h in 0..nh {
            let st = i * nh + h;
            let (mh, lh) = (m_c[h], l_c[h]);
            let oh = &mut self.o[st * hd..(st + 1) * hd];
            if !self.started[i] {
                oh.copy_from_slice(&o_c[h * hd..(h + 1) * hd]);
                (self.m[st], self.l[st]) = (mh, lh);
            } else {
                let m2 = self.m[st].max(mh);
                let a = exp(self.m[st] - m2);
                let b = exp(mh - m2);
                simd::merge(isa, oh, a, &o_c[h * hd..(h + 1) * hd], b);
                (self.m[st], self.l[st]) = (m2, self.l[st] * a + lh * b);
            }
        }
        self.started[i] = true;
    }

    /// `o / l` per (row, head) → `[rows, heads, head_dim]` (zeros for a row that visited nothing). With sink
    /// logits `[heads]`, each joins its head's state first, as the reference's last chunk without values:
    /// `m' = max(m, sink)`, `a = exp(m - m')`, `l = l * a + exp(sink - m')`, `o = o * a`.
    fn finish(&self, isa: Isa, sinks: Option<&[f32]>) -> Vec<f32> {
        let (nh, hd) = (self.heads, self.hd);
        let mut res = vec![0f32; self.o.len()];
        let mut scaled = vec![0f32; hd]; // [head_dim]: o · a of one head
        for (i, &st) in self.started.iter().enumerate() {
            if st {
                for h in 0..nh {
                    let s = i * nh + h;
                    let (o, out) = (&self.o[s * hd..(s + 1) * hd], &mut res[s * hd..(s + 1) * hd]);
                    match sinks {
                        None => simd::div_scalar(isa, o, self.l[s], out),
                        Some(sk) => {
                            let m2 = self.m[s].max(sk[h]);
                            let a = exp(self.m[s] - m2);
                            let l = self.l[s] * a + exp(sk[h] - m2);
                            for (y, &x) in scaled.iter_mut().zip(o) {
                                *y = x * a;
                            }
                            simd::div_scalar(isa, &scaled, l, out);
                        }
                    }
                }
            }
        }
        res
    }
}

/// A unit of work: query heads `heads` (query head `h` reads kv head `h / group`) of rows `rows`, over the chunks
/// `chunks`.
struct Unit {
    rows: Range<usize>,
    heads: Range<usize>,
    chunks: Range<u32>,
}

/// Where one row stands in its visited positions: prefix positions `next_prefix..ctx` and tree entries
/// `tree[next_tree..]` (those inside the window) are still to come.
struct Cursor<'a> {
    row: &'a RowAttn,
    table: &'a [u32],
    window: Option<u32>,
    next_prefix: u32,
    next_tree: usize,
}

impl<'a> Cursor<'a> {
    fn new(row: &'a RowAttn, table: &'a [u32], window: Option<u32>) -> Cursor<'a> {
        // Prefix positions are visited from `lo`: `pos - p < window` ⇔ `p ≥ pos - window + 1`.
        let lo = match window {
            Some(w) => (row.pos as i64 - w as i64 + 1).clamp(0, row.ctx as i64) as u32,
            None => 0,
        };
        let mut c = Cursor { row, table, window, next_prefix: lo, next_tree: 0 };
        c.skip_tree();
        c
    }

    /// Skips tree entries outside the window.
    fn skip_tree(&mut self) {
        let t = &self.row.tree;
        while self.next_tree < t.len() && !in_window(self.row.pos, t[self.next_tree].0, self.window) {
            self.next_tree += 1;
        }
    }

    /// The chunk of the next visited position, if any.
    fn next_chunk(&self) -> Option<u32> {
        if self.next_prefix < self.row.ctx {
            Some(self.next_prefix / ATTN_CHUNK)
        } else {
            self.row.tree.get(self.next_tree).map(|&(p, _)| p / ATTN_CHUNK)
        }
    }

    /// Moves the slots of chunk `c`'s visited positions, in position order, into `slots` (cleared first).
    fn take_chunk(&mut self, c: u32, bs: usize, slots: &mut Vec<u32>) {
        slots.clear();
        let end = (c + 1).saturating_mul(ATTN_CHUNK);
        let prefix_end = self.row.ctx.min(end);
        if self.next_prefix < prefix_end {
            prefix_slots(self.table, bs, self.next_prefix, prefix_end, slots);
            self.next_prefix = prefix_end;
        }
        while let Some(&(p, slot)) = self.row.tree.get(self.next_tree) {
            if p >= end {
                break;
            }
            slots.push(slot);
            self.next_tree += 1;
            self.skip_tree();
        }
    }
}

/// Computes one unit: hands each (row `i` of the unit, visited chunk) to `sink` in chunk order per row, as
/// `m_c [heads]`, `l_c [heads]`, `o_c [heads, head_dim]`.
fn unit(isa: Isa, q: &Tensor, kv: &KvView, meta: &AttnMeta, p: &AttnParams, u: &Unit, sink: &mut ChunkSink) {
    let hd = p.head_dim;
    let nh = u.heads.len();
    let group = p.heads / p.kv_heads;
    let chunk = ATTN_CHUNK as usize;
    // Scratch: the chunk's slots `[≤ 256]`, its scores then `e` `[heads, 256]`, `o_c [heads, head_dim]`.
    let mut slots = Vec::with_capacity(chunk);
    let mut cursors: Vec<Cursor> = u
        .rows
        .clone()
        .map(|r| {
            let row = &meta.rows[r];
            let mut cur = Cursor::new(row, &meta.block_tables[row.seq], p.window);
            // Chunks before the unit's range belong to other units.
            while let Some(c) = cur.next_chunk().filter(|&c| c < u.chunks.start) {
                cur.take_chunk(c, kv.block_size, &mut slots);
            }
            cur
        })
        .collect();
    let mut scores = vec![0f32; nh * chunk];
    let mut o_c = vec![0f32; nh * hd];
    // The unit's kv heads, and the range of the unit's heads that reads each.
    let kvh_first = u.heads.start / group;
    let kv_ranges: Vec<Range<usize>> = (kvh_first..=(u.heads.end - 1) / group)
        .map(|kvh| {
            (kvh * group).max(u.heads.start) - u.heads.start..((kvh + 1) * group).min(u.heads.end) - u.heads.start
        })
        .collect();
    let nkv = kv_ranges.len();
    // Per kv head of the unit: the chunk's K and V rows, `[n]` slices of `[head_dim]` (f32 cache), or the chunk's
    // row starts (f16 cache read where stored).
    let mut krows: Vec<Vec<&[f32]>> = (0..nkv).map(|_| Vec::with_capacity(chunk)).collect();
    let mut vrows: Vec<Vec<&[f32]>> = (0..nkv).map(|_| Vec::with_capacity(chunk)).collect();
    // An f32 cache is read in place; f16 where it is stored when `kv_dot` can; another type or shape is read back
    // per kv head into `decoded`.
    let f32_kv = kv.as_f32();
    let stored = matches!(kv.k, KvData::F16(_)) && stored_rows_ok(isa, hd);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut, unused_variables))]
    let mut starts: Vec<Vec<usize>> = (0..nkv).map(|_| Vec::with_capacity(chunk)).collect();
    let mut decoded: Vec<Decoded> = Vec::new();
    if f32_kv.is_none() && !stored {
        decoded.resize_with(nkv, Decoded::default);
    }
    // The chunk's `m_c` and `l_c` per head.
    let (mut m_c, mut l_c) = (vec![0f32; nh], vec![0f32; nh]);
    while let Some(c) = cursors.iter().filter_map(Cursor::next_chunk).min().filter(|&c| c < u.chunks.end) {
        for (i, cur) in cursors.iter_mut().enumerate() {
            if cur.next_chunk() != Some(c) {
                continue;
            }
            cur.take_chunk(c, kv.block_size, &mut slots);
            let n = slots.len();
            let qrow = q.row(u.rows.start + i);
            let qh = |h: usize| &qrow[(u.heads.start + h) * hd..(u.heads.start + h + 1) * hd];
            let mut groups: Vec<(ChunkRows, Range<usize>)> = Vec::with_capacity(nkv);
            #[cfg(target_arch = "x86_64")]
            if stored {
                for (g, st) in starts.iter_mut().enumerate() {
                    st.clear();
                    st.extend(slots.iter().map(|&slot| (slot as usize * kv.kv_heads + kvh_first + g) * hd));
                }
                for (st, hs) in starts.iter().zip(&kv_ranges) {
                    groups.push((stored_chunk(kv, st, hd), hs.clone()));
                }
            }
            if groups.is_empty() {
                if let Some(kv) = &f32_kv {
                    for (g, (kr, vr)) in krows.iter_mut().zip(vrows.iter_mut()).enumerate() {
                        kr.clear();
                        kr.extend(slots.iter().map(|&slot| kv.k_at(slot, kvh_first + g)));
                        vr.clear();
                        vr.extend(slots.iter().map(|&slot| kv.v_at(slot, kvh_first + g)));
                        // While the scores are computed, the V rows are requested (the hardware prefetchers lose
                        // the strided slot records; a prefetch changes no value).
                        for &v in vr.iter() {
                            simd::prefetch_l2(v);
                        }
                    }
                    for ((kr, vr), hs) in krows.iter().zip(&vrows).zip(&kv_ranges) {
                        groups.push((ChunkRows::F32 { k: kr, v: vr }, hs.clone()));
                    }
                } else {
                    for (g, d) in decoded.iter_mut().enumerate() {
                        d.load(isa, kv, kvh_first + g, &slots);
                    }
                    // K and V rows of the chunk read back, `[n]` slices of `[head_dim]` per kv head.
                    let kr: Vec<Vec<&[f32]>> = decoded.iter().map(|d| d.k.chunks_exact(hd).take(n).collect()).collect();
                    let vr: Vec<Vec<&[f32]>> = decoded.iter().map(|d| d.v.chunks_exact(hd).take(n).collect()).collect();
                    let groups: Vec<(ChunkRows, Range<usize>)> = kr
                        .iter()
                        .zip(&vr)
                        .zip(&kv_ranges)
                        .map(|((k, v), hs)| (ChunkRows::F32 { k, v }, hs.clone()))
                        .collect();
                    heads_of_chunk(isa, p, &groups, n, &qh, &mut scores, &mut m_c, &mut l_c, &mut o_c);
                    sink(i, &m_c, &l_c, &o_c);
                    continue;
                }
            }
            heads_of_chunk(isa, p, &groups, n, &qh, &mut scores, &mut m_c, &mut l_c, &mut o_c);
            sink(i, &m_c, &l_c, &o_c);
        }
    }
}

/// One kv head's K and V read back to f32 for the slots of a chunk: rows `0..slots.len()` of `k`, `v`
/// (`[256, head_dim]` each) hold the values of `slots`, in order.
#[derive(Default)]
struct Decoded {
    slots: Vec<u32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Decoded {
    /// Holds `slots [≤ 256]` of kv head `kvh` afterwards, reading back only the slots past the leading ones it
    /// already holds (reading back is exact, so a held row equals a fresh read).
    fn load(&mut self, isa: Isa, kv: &KvView, kvh: usize, slots: &[u32]) {
        let hd = kv.head_dim;
        if self.k.is_empty() {
            self.k = vec![0f32; ATTN_CHUNK as usize * hd];
            self.v = vec![0f32; ATTN_CHUNK as usize * hd];
        }
        let keep = self.slots.iter().zip(slots).take_while(|(a, b)| a == b).count();
        let starts: Vec<usize> = slots[keep..].iter().map(|&slot| (slot as usize * kv.kv_heads + kvh) * hd).collect();
        let rows = keep * hd..slots.len() * hd;
        read_back_rows(isa, &kv.k, &starts, hd, &mut self.k[rows.clone()]);
        read_back_rows(isa, &kv.v, &starts, hd, &mut self.v[rows]);
        self.slots.truncate(keep);
        self.slots.extend_from_slice(&slots[keep..]);
    }
}

/// Whether an f16 cache can be read where it is stored (`kv_dot`) for rows of `hd` values.
fn stored_rows_ok(isa: Isa, hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && std::is_x86_feature_detected!("f16c") {
        return hd.is_multiple_of(16);
    }
    let _ = (isa, hd);
    false
}

/// The K and V rows at `starts` (`[n]`, each `[hd]`) of an f16 cache, as stored.
#[cfg(target_arch = "x86_64")]
fn stored_chunk<'a>(kv: &KvView<'a>, starts: &'a [usize], hd: usize) -> ChunkRows<'a> {
    use crate::kv_dot::F16Rows;
    match (&kv.k, &kv.v) {
        (KvData::F16(k), KvData::F16(v)) => {
            ChunkRows::F16 { k: F16Rows { h: k, starts }.checked(hd), v: F16Rows { h: v, starts }.checked(hd) }
        }
        _ => panic!("attention: stored rows of a cache that is not f16 in K and V"),
    }
}

/// One kv head's K and V rows of a chunk: f32 slices, or (x86-64) f16 rows as stored, checked for
/// `head_dim` ([`stored_rows_ok`] held).
enum ChunkRows<'a> {
    /// `[n]` slices of `[head_dim]`.
    F32 { k: &'a [&'a [f32]], v: &'a [&'a [f32]] },
    #[cfg(target_arch = "x86_64")]
    F16 { k: crate::kv_dot::F16Rows<'a>, v: crate::kv_dot::F16Rows<'a> },
}

impl ChunkRows<'_> {
    /// `dot16(q, K row j + t)` for t in 0..4.
    fn dot4(&self, isa: Isa, q: &[f32], j: usize) -> [f32; 4] {
        match self {
            ChunkRows::F32 { k, .. } => simd::dot16_x4(isa, q, [k[j], k[j + 1], k[j + 2], k[j + 3]]),
            // SAFETY: stored rows exist only where `stored_rows_ok` found AVX2 and F16C; `checked` verified that
            // every row lies inside the cache and `q` is `[head_dim]`; `j + 4 ≤ n`.
            #[cfg(target_arch = "x86_64")]
            ChunkRows::F16 { k, .. } => unsafe { crate::kv_dot::dot16_x4(q, k, j) },
        }
    }

    /// Whether [`ChunkRows::dot8_scaled`] may be used on these rows of `hd` values.
    fn dot8_ok(&self, isa: Isa, hd: usize) -> bool {
        match self {
            ChunkRows::F32 { k, .. } => stored_rows_ok(isa, hd) && k.iter().all(|r| r.len() == hd),
            // Stored rows exist only where `stored_rows_ok` held; `checked` verified them.
            #[cfg(target_arch = "x86_64")]
            ChunkRows::F16 { .. } => true,
        }
    }

    /// `out[t] = dot16(q, K row j + t) · scale` for t in 0..8.
    ///
    /// # Safety
    /// [`ChunkRows::dot8_ok`] held for these rows and `q.len()`; `j + 8 ≤ n`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot8_scaled(&self, q: &[f32], j: usize, scale: f32, out: &mut [f32; 8]) {
        use crate::kv_dot::{dot16_x8_scaled, F32Rows};
        // SAFETY: the caller's contract: AVX2, FMA and F16C are present, every row holds `q.len()` values (a
        // multiple of 16) and rows `j..j + 8` exist.
        unsafe {
            match self {
                ChunkRows::F32 { k, .. } => dot16_x8_scaled(q, &F32Rows { rows: k }, j, scale, out),
                ChunkRows::F16 { k, .. } => dot16_x8_scaled(q, k, j, scale, out),
            }
        }
    }

    /// `dot16(q, K row j)`.
    fn dot1(&self, isa: Isa, q: &[f32], j: usize) -> f32 {
        match self {
            ChunkRows::F32 { k, .. } => simd::dot16(isa, q, k[j]),
            // SAFETY: as in `dot4`, with `j < n`.
            #[cfg(target_arch = "x86_64")]
            ChunkRows::F16 { k, .. } => unsafe { crate::kv_dot::dot16(q, k, j) },
        }
    }

    /// For `j` in `0..e.len()` in order: `o[d] = fma(e[j], V row from + j [d], o[d])`.
    fn acc_v(&self, isa: Isa, o: &mut [f32], e: &[f32], from: usize) {
        match self {
            ChunkRows::F32 { v, .. } => simd::fma_acc_rows(isa, o, e, &v[from..from + e.len()]),
            // SAFETY: as in `dot4`; `o` is `[head_dim]` and `from + e.len() ≤ n` (the rows past `from` are rows of
            // the same checked cache).
            #[cfg(target_arch = "x86_64")]
            ChunkRows::F16 { v, .. } => unsafe {
                crate::kv_dot::fma_acc(o, e, &crate::kv_dot::F16Rows { h: v.h, starts: &v.starts[from..] })
            },
        }
    }
}

/// Positions per block: the scores, then the value sums, visit a chunk in blocks of this many positions with every
/// query head of the unit before the next block, so the block's K (then V) rows of all the unit's kv heads are read
/// from memory once, side by side in their slot records, and from L1 by every other head. Each head still takes its
/// positions in increasing order, so no value changes.
const BLOCK: usize = 16;

/// Scores, softmax partials and `o_c` of the unit's heads over one chunk's `n` positions: `groups` pairs each kv
/// head's K and V rows with the range of the unit's heads reading it. Into `scores [heads, 256]`, `m_c`, `l_c`
/// `[heads]` and `o_c [heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
fn heads_of_chunk<'q>(
    isa: Isa,
    p: &AttnParams,
    groups: &[(ChunkRows<'_>, Range<usize>)],
    n: usize,
    qh: &dyn Fn(usize) -> &'q [f32],
    scores: &mut [f32],
    m_c: &mut [f32],
    l_c: &mut [f32],
    o_c: &mut [f32],
) {
    let (hd, chunk) = (p.head_dim, ATTN_CHUNK as usize);
    // Eight products and their trees at once where the rows allow it (x86-64 with AVX2 and F16C, `head_dim` a
    // multiple of 16): the same bits as `dot4`.
    let dot8: Vec<bool> = groups.iter().map(|(rows, _)| rows.dot8_ok(isa, hd)).collect();
    for b in (0..n).step_by(BLOCK) {
        let e = (b + BLOCK).min(n);
        for ((rows, hs), &dot8) in groups.iter().zip(&dot8) {
            for h in hs.clone() {
                let (qv, sc) = (qh(h), &mut scores[h * chunk..h * chunk + n]);
                let mut j = b;
                #[cfg(target_arch = "x86_64")]
                while dot8 && j + 8 <= e {
                    let out: &mut [f32; 8] = (&mut sc[j..j + 8]).try_into().expect("8 scores");
                    // SAFETY: `dot8_ok` held for these rows; `qv` is `[head_dim]`; `j + 8 ≤ e ≤ n`.
                    unsafe { rows.dot8_scaled(qv, j, p.scale, out) };
                    j += 8;
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = dot8;
                while j + 4 <= e {
                    let d = rows.dot4(isa, qv, j);
                    for t in 0..4 {
                        sc[j + t] = d[t] * p.scale;
                    }
                    j += 4;
                }
                while j < e {
                    sc[j] = rows.dot1(isa, qv, j) * p.scale;
                    j += 1;
                }
            }
        }
    }
    let heads = groups.first().map_or(0, |g| g.1.start)..groups.last().map_or(0, |g| g.1.end);
    for h in heads.clone() {
        let s = &mut scores[h * chunk..h * chunk + n];
        if let Some(cap) = p.softcap {
            math::softcap_inplace(isa, s, cap);
        }
        let mh = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        math::exp_sub_inplace(isa, s, mh);
        m_c[h] = mh;
    }
    // `l_c[h] = Σ e` in position order per head; the heads' sums interleaved (independent chains, same order each).
    let mut sums = [0f32; 32];
    if heads.len() <= sums.len() {
        for j in 0..n {
            for (t, h) in heads.clone().enumerate() {
                sums[t] += scores[h * chunk + j];
            }
        }
        for (t, h) in heads.clone().enumerate() {
            l_c[h] = sums[t];
        }
    } else {
        for h in heads.clone() {
            l_c[h] = scores[h * chunk..h * chunk + n].iter().fold(0f32, |acc, &e| acc + e);
        }
    }
    o_c[heads.start * hd..heads.end * hd].fill(0.0);
    for b in (0..n).step_by(BLOCK) {
        let e = (b + BLOCK).min(n);
        for (rows, hs) in groups {
            for h in hs.clone() {
                rows.acc_v(isa, &mut o_c[h * hd..(h + 1) * hd], &scores[h * chunk + b..h * chunk + e], b);
            }
        }
    }
}

/// Pushes the slots of prefix positions `a..b` (all inside `table`) onto `slots`, walking whole blocks.
fn prefix_slots(table: &[u32], bs: usize, a: u32, b: u32, slots: &mut Vec<u32>) {
    let mut p = a as usize;
    let b = b as usize;
    while p < b {
        let (blk, off) = (p / bs, p % bs);
        let n = (bs - off).min(b - p);
        let base = table[blk] as usize * bs + off;
        slots.extend((base..base + n).map(|s| s as u32));
        p += n;
    }
}
