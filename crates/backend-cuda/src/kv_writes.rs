//! Which KV slots may still be in flight: the writes a KV store received since the host's last synchronizing
//! download, so that attention can load older rows before its `griddepcontrol.wait` (kernels/attention.cu,
//! `ATTN_K_EARLY`).
//!
//! With programmatic dependent launches several earlier kernels can still be running when attention starts, so
//! "an earlier call wrote it" does not make a row safe to read before the wait. A row is safe when the kernel that
//! wrote it completed before the host last waited for the whole stream ([`crate::device::Gpu::syncs`] counts those
//! waits): every write is recorded with the count at its launch, and the writes of an older count are complete.

use std::collections::BTreeMap;
use tf_core::AttnMeta;

/// Blocks with writes in flight beyond which every row is treated as unsafe (a long prompt's chunks): the bound
/// only matters to decode, and the per-step work stays small.
const MAX_DIRTY_BLOCKS: usize = 1024;

/// The writes one KV store received since a given synchronization count.
#[derive(Debug, Default)]
pub struct KvWrites {
    /// The synchronization count the recorded writes were launched under.
    epoch: u64,
    /// block → the lowest offset in it written under `epoch`.
    dirty: BTreeMap<u32, u32>,
    /// More than [`MAX_DIRTY_BLOCKS`] blocks were written: no row is safe until the next synchronization.
    overflow: bool,
    /// Bumped whenever the set of unsafe rows grows (part of [`KvWrites::key`]).
    generation: u64,
}

impl KvWrites {
    /// Records writes to `slots` (any layer) launched while the synchronization count is `epoch`.
    pub fn record(&mut self, epoch: u64, slots: impl IntoIterator<Item = u32>, block_size: usize) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.dirty.clear();
            self.overflow = false;
            self.generation += 1;
        }
        if self.overflow {
            return;
        }
        let bs = block_size as u32;
        for s in slots {
            let (b, off) = (s / bs, s % bs);
            let e = self.dirty.entry(b).or_insert(u32::MAX);
            if off < *e {
                *e = off;
                self.generation += 1;
            }
        }
        if self.dirty.len() > MAX_DIRTY_BLOCKS {
            self.overflow = true;
            self.dirty.clear();
            self.generation += 1;
        }
    }

    /// Changes whenever [`KvWrites::clean_bounds`] could answer differently for the same metadata at `epoch`.
    pub fn key(&self, epoch: u64) -> (u64, u64) {
        (epoch, if epoch == self.epoch { self.generation } else { 0 })
    }

    /// Per row of `meta`: the position below which every prefix position (`< ctx`) of its sequence was written by
    /// a kernel launched before synchronization `epoch` (so complete now), capped at the row's `ctx`.
    pub fn clean_bounds(&self, epoch: u64, meta: &AttnMeta, block_size: usize) -> Vec<u32> {
        if epoch != self.epoch || (self.dirty.is_empty() && !self.overflow) {
            return meta.rows.iter().map(|r| r.ctx).collect();
        }
        if self.overflow {
            return vec![0; meta.rows.len()];
        }
        // The lowest position of each sequence whose slot may still be being written.
        let first_dirty: Vec<u32> = meta
            .block_tables
            .iter()
            .map(|t| {
                t.iter()
                    .enumerate()
                    .find_map(|(i, b)| self.dirty.get(b).map(|&off| (i * block_size) as u32 + off))
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
    fn a_write_is_unsafe_until_the_next_synchronization() {
        let mut w = KvWrites::default();
        // Sequence 0 holds blocks 7, 3 (block size 4): positions 0..4 in block 7, 4..8 in block 3.
        let m = meta(vec![vec![7, 3], vec![5]], &[(0, 7), (1, 3)]);
        assert_eq!(w.clean_bounds(0, &m, 4), vec![7, 3], "nothing written: every prefix position is clean");
        // Decode writes position 6 (block 3, offset 2) of sequence 0 under synchronization count 5.
        w.record(5, [3 * 4 + 2], 4);
        assert_eq!(w.clean_bounds(5, &m, 4), vec![6, 3], "position 6 and beyond are unsafe; sequence 1 untouched");
        // A lower offset of the same block lowers the bound; another sequence's block lowers only its rows.
        w.record(5, [3 * 4 + 1, 5 * 4 + 2], 4);
        assert_eq!(w.clean_bounds(5, &m, 4), vec![5, 2]);
        // After a synchronization the writes are complete.
        assert_eq!(w.clean_bounds(6, &m, 4), vec![7, 3]);
        // Writes launched under the new count replace the old ones.
        w.record(6, [7 * 4], 4);
        assert_eq!(w.clean_bounds(6, &m, 4), vec![0, 3]);
    }

    #[test]
    fn the_key_changes_when_the_bounds_can() {
        let mut w = KvWrites::default();
        let k0 = w.key(1);
        w.record(1, [9], 4);
        let k1 = w.key(1);
        assert_ne!(k0, k1, "a new dirty block");
        w.record(1, [9], 4);
        assert_eq!(w.key(1), k1, "the same slot again (another layer): the same bounds");
        w.record(1, [8], 4);
        assert_ne!(w.key(1), k1, "a lower offset of the same block");
        assert_ne!(w.key(2), w.key(1), "a synchronization");
    }

    #[test]
    fn too_many_blocks_in_flight_make_every_row_unsafe() {
        let mut w = KvWrites::default();
        let m = meta(vec![vec![0, 1]], &[(0, 8)]);
        w.record(3, (0..(MAX_DIRTY_BLOCKS as u32 + 1)).map(|b| 100 + 4 * b), 4);
        assert_eq!(w.clean_bounds(3, &m, 4), vec![0]);
        assert_eq!(w.clean_bounds(4, &m, 4), vec![8], "until the next synchronization");
    }
}
