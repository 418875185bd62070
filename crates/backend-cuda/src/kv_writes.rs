//! Which KV slots may still be in flight: the writes a KV store received that no completed download has waited
//! for, so that attention can load older rows before its `griddepcontrol.wait` (kernels/attention.cu,
//! `ATTN_K_EARLY`).
//!
//! With programmatic dependent launches several earlier kernels can still be running when attention starts, so
//! "an earlier call wrote it" does not make a row safe to read before the wait. A row is safe when the kernel that
//! wrote it completed before the host last waited for the stream. The device counts the waits it starts
//! (downloads and synchronizations, [`crate::device::Gpu::write_ticket`]) and the highest one completed
//! ([`crate::device::Gpu::waits_done`]); a write is recorded with the count of started waits read after its launch,
//! `ticket`, and is complete once a wait numbered `ticket` or later has completed (`done > ticket`): that wait was
//! started after the launch, so on the one stream it waited for the write, whichever threads call the backend.

use std::collections::{BTreeMap, VecDeque};
use tf_core::AttnMeta;

/// Blocks with writes in flight beyond which every row is treated as unsafe (a long prompt's chunks): the bound
/// only matters to decode, and the per-step work stays small.
const MAX_DIRTY_BLOCKS: usize = 1024;

/// Writes recorded with one ticket.
#[derive(Debug)]
struct Set {
    /// Complete once `done > ticket`.
    ticket: u64,
    /// block → the lowest offset in it written by a write of this set.
    dirty: BTreeMap<u32, u32>,
    /// The store had more than [`MAX_DIRTY_BLOCKS`] blocks in flight: no row is safe until this set is complete.
    overflow: bool,
}

/// The writes one KV store received that may still be in flight, in sets by ticket (oldest first, tickets
/// increasing), so that a write completes with its own ticket even while later ones are in flight (a forward
/// queued before the host took the previous one's ids: src/host_ids.rs).
#[derive(Debug, Default)]
pub struct KvWrites {
    sets: VecDeque<Set>,
    /// Bumped whenever the recorded sets change (part of [`KvWrites::key`]).
    generation: u64,
}

impl KvWrites {
    /// Records writes to `slots` (any layer) launched before the device had started `ticket` waits; `done` is the
    /// device's completed-wait count now.
    pub fn record(&mut self, ticket: u64, done: u64, slots: impl IntoIterator<Item = u32>, block_size: usize) {
        while self.sets.front().is_some_and(|s| done > s.ticket) {
            self.sets.pop_front();
            self.generation += 1;
        }
        // A ticket below the newest set's (another thread's launch read its ticket first) joins that set and waits
        // for its later ticket: conservative.
        if self.sets.back().is_none_or(|s| s.ticket < ticket) {
            self.sets.push_back(Set { ticket, dirty: BTreeMap::new(), overflow: false });
            self.generation += 1;
        }
        let others: usize = self.sets.iter().rev().skip(1).map(|s| s.dirty.len()).sum();
        let set = self.sets.back_mut().expect("a set");
        if set.overflow {
            return;
        }
        let bs = block_size as u32;
        for s in slots {
            let (b, off) = (s / bs, s % bs);
            let e = set.dirty.entry(b).or_insert(u32::MAX);
            if off < *e {
                *e = off;
                self.generation += 1;
            }
        }
        if others + set.dirty.len() > MAX_DIRTY_BLOCKS {
            set.overflow = true;
            set.dirty.clear();
            self.generation += 1;
        }
    }

    /// The sets not complete when `done` waits have completed (a suffix: tickets increase).
    fn live(&self, done: u64) -> impl Iterator<Item = &Set> {
        self.sets.iter().filter(move |s| s.ticket >= done)
    }

    /// Changes whenever [`KvWrites::clean_bounds`] could answer differently for the same metadata.
    pub fn key(&self, done: u64) -> (u64, u64) {
        (self.live(done).count() as u64, self.generation)
    }

    /// Per row of `meta`: the position below which every prefix position (`< ctx`) of its sequence was written by
    /// a completed kernel when `done` waits have completed, capped at the row's `ctx`.
    pub fn clean_bounds(&self, done: u64, meta: &AttnMeta, block_size: usize) -> Vec<u32> {
        let live: Vec<&Set> = self.live(done).filter(|s| s.overflow || !s.dirty.is_empty()).collect();
        if live.is_empty() {
            return meta.rows.iter().map(|r| r.ctx).collect();
        }
        if live.iter().any(|s| s.overflow) {
            return vec![0; meta.rows.len()];
        }
        // The lowest position of each sequence whose slot may still be being written.
        let first_dirty: Vec<u32> = meta
            .block_tables
            .iter()
            .map(|t| {
                t.iter()
                    .enumerate()
                    .find_map(|(i, b)| {
                        let off = live.iter().filter_map(|s| s.dirty.get(b).copied()).min()?;
                        Some((i * block_size) as u32 + off)
                    })
                    .unwrap_or(u32::MAX)
            })
            .collect();
        meta.rows.iter().map(|r| r.ctx.min(first_dirty[r.seq])).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tf_core::RowAttn;

    fn meta(tables: Vec<Vec<u32>>, rows: &[(usize, u32)]) -> AttnMeta {
        AttnMeta {
            block_tables: tables,
            rows: rows.iter().map(|&(seq, ctx)| RowAttn { pos: ctx - 1, seq, ctx, tree: vec![] }).collect(),
        }
    }

    #[test]
    fn a_write_is_unsafe_until_a_wait_started_after_it_completes() {
        let mut w = KvWrites::default();
        // Sequence 0 holds blocks 7, 3 (block size 4): positions 0..4 in block 7, 4..8 in block 3.
        let m = meta(vec![vec![7, 3], vec![5]], &[(0, 7), (1, 3)]);
        assert_eq!(w.clean_bounds(0, &m, 4), vec![7, 3], "nothing written: every prefix position is clean");
        // Decode writes position 6 (block 3, offset 2) of sequence 0 after 5 waits were started (5 completed).
        w.record(5, 5, [3 * 4 + 2], 4);
        assert_eq!(w.clean_bounds(5, &m, 4), vec![6, 3], "position 6 and beyond are unsafe; sequence 1 untouched");
        // A lower offset of the same block lowers the bound; another sequence's block lowers only its rows.
        w.record(5, 5, [3 * 4 + 1, 5 * 4 + 2], 4);
        assert_eq!(w.clean_bounds(5, &m, 4), vec![5, 2]);
        // Wait number 5 (the sixth, started after the writes) completes: they are complete.
        assert_eq!(w.clean_bounds(6, &m, 4), vec![7, 3]);
        // Writes recorded after it start a new set.
        w.record(6, 6, [7 * 4], 4);
        assert_eq!(w.clean_bounds(6, &m, 4), vec![0, 3]);
    }

    #[test]
    fn a_wait_started_before_the_write_does_not_cover_it() {
        // Another thread started wait number 5 before this write's launch; it completes, but the write's ticket
        // (read after its launch) is 6: only a wait numbered 6 or later covers it.
        let mut w = KvWrites::default();
        let m = meta(vec![vec![0, 1]], &[(0, 8)]);
        w.record(6, 5, [4], 4);
        assert_eq!(w.clean_bounds(6, &m, 4), vec![4], "wait 5 done: not enough");
        assert_eq!(w.clean_bounds(7, &m, 4), vec![8], "wait 6 done");
        // Each write completes with its own ticket while later ones are in flight.
        let mut w = KvWrites::default();
        w.record(3, 2, [1], 4);
        w.record(4, 3, [4], 4);
        assert_eq!(w.clean_bounds(3, &m, 4), vec![1], "neither is complete");
        assert_eq!(w.clean_bounds(4, &m, 4), vec![4], "the ticket-3 write is complete, the ticket-4 one is not");
        assert_eq!(w.clean_bounds(5, &m, 4), vec![8]);
        // A ticket below the newest one (another thread read it first) waits for the newest: conservative.
        let mut w = KvWrites::default();
        w.record(4, 3, [4], 4);
        w.record(3, 3, [1], 4);
        assert_eq!(w.clean_bounds(4, &m, 4), vec![1], "the ticket-3 write waits for ticket 4");
        assert_eq!(w.clean_bounds(5, &m, 4), vec![8]);
        // Run-ahead decoding: step p writes its position (ticket p) while step p − 1's write (ticket p − 1) is
        // still in flight and step p − 2's is complete; the bound follows the steps instead of staying at the
        // first write.
        let mut w = KvWrites::default();
        let long = meta(vec![(0..16).collect()], &[(0, 64)]);
        for p in 10..40u32 {
            let ticket = u64::from(p);
            w.record(ticket, ticket - 1, [p], 4);
            let want = if p == 10 { 10 } else { p - 1 };
            assert_eq!(w.clean_bounds(ticket - 1, &long, 4), vec![want], "step {p}");
        }
    }

    #[test]
    fn the_key_changes_when_the_bounds_can() {
        let mut w = KvWrites::default();
        let k0 = w.key(1);
        w.record(1, 1, [9], 4);
        let k1 = w.key(1);
        assert_ne!(k0, k1, "a new dirty block");
        w.record(1, 1, [9], 4);
        assert_eq!(w.key(1), k1, "the same slot again (another layer): the same bounds");
        w.record(1, 1, [8], 4);
        let k2 = w.key(1);
        assert_ne!(k2, k1, "a lower offset of the same block");
        assert_ne!(w.key(2), k2, "a covering wait completed");
    }

    #[test]
    fn too_many_blocks_in_flight_make_every_row_unsafe() {
        let mut w = KvWrites::default();
        let m = meta(vec![vec![0, 1]], &[(0, 8)]);
        w.record(3, 3, (0..(MAX_DIRTY_BLOCKS as u32 + 1)).map(|b| 100 + 4 * b), 4);
        assert_eq!(w.clean_bounds(3, &m, 4), vec![0]);
        assert_eq!(w.clean_bounds(4, &m, 4), vec![8], "until a covering wait completes");
    }
}
