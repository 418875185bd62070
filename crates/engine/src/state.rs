//! Recurrent state for hybrid models (DESIGN.md §5): which register holds the state after which KV slot.
//!
//! A hybrid model's recurrent layers carry a state from row to row ([`tf_core::StateSpec`]); the backend keeps
//! states in numbered registers. This map ties a register to the KV slot of the position whose state it holds,
//! so the state follows the same paging as K/V: a row at position `p` continues from the state at its parent's
//! slot (the previous position through its block table, or its tree parent), taken from an earlier row of the
//! same forward when one wrote it, else from the register mapped to that slot. Every row that may be continued
//! from later keeps its state in a fresh register: the last row of each sequence, every row of a verify window
//! (one state per row, so any accepted length can be committed), and rows at snapshot positions (the prefix cache
//! resumes from those). Prompt rows scored for their logprobs keep none. Writing a slot replaces its state, as it replaces its K/V.
//!
//! Each running sequence pins the slot of its latest state; when registers run short the least recently used
//! unpinned mapping is dropped (a stale state, or a snapshot: a later cache hit then stops earlier).

use crate::generate::EngineError;
use std::collections::HashMap;
use tf_core::{StateIo, StateSrc};
use tf_models::Batch;

/// One mapped register.
#[derive(Clone, Copy, Debug)]
struct Mapped {
    reg: u32,
    /// Last use (for eviction).
    used: u64,
}

/// The slot → register map of one KV cache.
pub struct StateMap {
    free: Vec<u32>,
    by_slot: HashMap<u32, Mapped>,
    pins: HashMap<u32, usize>,
    clock: u64,
    block_size: usize,
    /// Positions `p` with `(p + 1) % snapshot_every == 0` keep their state for the prefix cache.
    snapshot_every: usize,
}

impl StateMap {
    pub fn new(registers: usize, block_size: usize, snapshot_every: usize) -> StateMap {
        assert!(block_size > 0 && snapshot_every > 0 && snapshot_every.is_multiple_of(block_size));
        StateMap {
            free: (0..registers as u32).rev().collect(),
            by_slot: HashMap::new(),
            pins: HashMap::new(),
            clock: 0,
            block_size,
            snapshot_every,
        }
    }

    /// Registers not holding a state.
    pub fn free_registers(&self) -> usize {
        self.free.len()
    }

    /// Whether position `pos` keeps its state for the prefix cache.
    pub fn is_snapshot(&self, pos: usize) -> bool {
        (pos + 1).is_multiple_of(self.snapshot_every)
    }

    /// Whether a state is held for `slot`.
    pub fn has(&self, slot: u32) -> bool {
        self.by_slot.contains_key(&slot)
    }

    pub fn pin(&mut self, slot: u32) {
        *self.pins.entry(slot).or_insert(0) += 1;
    }

    pub fn unpin(&mut self, slot: u32) {
        if let Some(n) = self.pins.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.pins.remove(&slot);
            }
        }
    }

    /// Drops the state held for `slot`, if any and not pinned.
    pub fn release(&mut self, slot: u32) {
        if self.pins.contains_key(&slot) {
            return;
        }
        if let Some(m) = self.by_slot.remove(&slot) {
            self.free.push(m.reg);
        }
    }

    /// Drops the state of `slot` at position `pos` unless it is a snapshot.
    pub fn release_unless_snapshot(&mut self, slot: u32, pos: usize) {
        if !self.is_snapshot(pos) {
            self.release(slot);
        }
    }

    /// The slot of position `pos` through a block table.
    fn slot_of(&self, table: &[u32], pos: usize) -> u32 {
        table[pos / self.block_size] * self.block_size as u32 + (pos % self.block_size) as u32
    }

    /// Fills `batch.states`: each row's source and, for rows kept beyond the call, a fresh register. Kept are the
    /// last row of each sequence (no later row reads it), the rows `window_rows` marks (every row of a verify
    /// window: any of them may be the last accepted) and rows at snapshot positions.
    pub fn assign(&mut self, batch: &mut Batch, window_rows: &[bool]) -> Result<(), EngineError> {
        let n = batch.tokens.len();
        self.clock += 1;
        let mut srcs = Vec::with_capacity(n);
        let mut parents_read = Vec::new();
        for r in 0..n {
            let ra = &batch.attn.rows[r];
            let pos = ra.pos as usize;
            let parent = if ra.tree.len() >= 2 {
                Some(ra.tree[ra.tree.len() - 2].1)
            } else if pos == 0 {
                None
            } else {
                Some(self.slot_of(&batch.attn.block_tables[ra.seq], pos - 1))
            };
            let src = match parent {
                None => StateSrc::Zero,
                Some(ps) => {
                    let earlier = (0..r).rev().find(|&j| {
                        batch.attn.rows[j].seq == ra.seq
                            && batch.slots[j] == ps
                            && batch.positions[j] as usize == pos - 1
                    });
                    match earlier {
                        Some(j) => StateSrc::Row(j),
                        None => {
                            let m = self.by_slot.get_mut(&ps).ok_or_else(|| {
                                EngineError::Model(format!(
                                    "no recurrent state for position {} (slot {ps}) to continue from",
                                    pos - 1
                                ))
                            })?;
                            m.used = self.clock;
                            parents_read.push(ps);
                            StateSrc::Reg(m.reg)
                        }
                    }
                }
            };
            srcs.push(src);
        }
        let read_later = {
            let io: Vec<StateIo> = srcs.iter().map(|&src| StateIo { src, dst: None }).collect();
            StateIo::read_later(&io)
        };
        let mut states = Vec::with_capacity(n);
        for r in 0..n {
            let window = window_rows.get(r).copied().unwrap_or(false);
            let keep = !read_later[r] || window || self.is_snapshot(batch.positions[r] as usize);
            let dst = if keep { Some(self.take_register(&parents_read)?) } else { None };
            states.push(StateIo { src: srcs[r], dst });
        }
        batch.states = states;
        Ok(())
    }

    /// A free register, evicting the least recently used unpinned mapping (not one this call reads) if none.
    fn take_register(&mut self, reading: &[u32]) -> Result<u32, EngineError> {
        if let Some(g) = self.free.pop() {
            return Ok(g);
        }
        let victim = self
            .by_slot
            .iter()
            .filter(|(s, _)| !self.pins.contains_key(s) && !reading.contains(s))
            .min_by_key(|(s, m)| (m.used, **s))
            .map(|(&s, _)| s);
        match victim {
            Some(s) => Ok(self.by_slot.remove(&s).expect("victim mapped").reg),
            None => Err(EngineError::Model(
                "recurrent state registers exhausted: every register holds a running sequence's state".into(),
            )),
        }
    }

    /// After the forward of `batch`: each row's slot now holds the state the row left (or none, when it kept
    /// none), replacing what the slot held before.
    pub fn commit(&mut self, batch: &Batch) {
        for (r, io) in batch.states.iter().enumerate() {
            let slot = batch.slots[r];
            // A pin on a rewritten slot is stale: its sequence ended without unpinning (a cancel between rounds)
            // and the block went to another sequence. A running sequence never rewrites its pinned slot.
            self.pins.remove(&slot);
            if let Some(old) = self.by_slot.remove(&slot) {
                self.free.push(old.reg);
            }
            if let Some(reg) = io.dst {
                self.by_slot.insert(slot, Mapped { reg, used: self.clock });
            }
        }
    }

    /// Moves the state held for `from` to `to` (a tree window's accepted rows copied into place).
    pub fn relocate(&mut self, from: u32, to: u32) {
        if let Some(m) = self.by_slot.remove(&from) {
            if let Some(old) = self.by_slot.insert(to, m) {
                self.free.push(old.reg);
            }
        }
    }

    /// The longest prefix of `blocks` (a cached prefix's block ids) that ends where a state is held: the
    /// number of blocks a sequence can continue from.
    pub fn usable_blocks(&self, blocks: &[u32]) -> usize {
        (1..=blocks.len())
            .rev()
            .find(|&k| self.has(blocks[k - 1] * self.block_size as u32 + self.block_size as u32 - 1))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tf_core::{AttnMeta, RowAttn};

    /// A causal chain of `len` rows of one sequence from position `start`, block table `table` (block size 4).
    fn chain(table: &[u32], start: usize, len: usize, logits: bool) -> Batch {
        let slot = |p: usize| table[p / 4] * 4 + (p % 4) as u32;
        Batch {
            tokens: vec![1; len],
            positions: (start..start + len).map(|p| p as u32).collect(),
            slots: (start..start + len).map(slot).collect(),
            attn: AttnMeta {
                block_tables: vec![table.to_vec()],
                rows: (start..start + len)
                    .map(|p| RowAttn { pos: p as u32, seq: 0, ctx: p as u32 + 1, tree: vec![] })
                    .collect(),
            },
            logit_rows: if logits { (0..len).collect() } else { vec![len - 1] },
            fed: None,
            states: Vec::new(),
        }
    }

    #[test]
    fn a_chain_reads_its_parent_and_keeps_its_last_row_and_snapshots() {
        let mut m = StateMap::new(8, 4, 4);
        let mut b = chain(&[2, 5], 0, 6, false);
        m.assign(&mut b, &[]).unwrap();
        let srcs: Vec<StateSrc> = b.states.iter().map(|s| s.src).collect();
        assert_eq!(srcs[0], StateSrc::Zero);
        assert!((1..6).all(|r| srcs[r] == StateSrc::Row(r - 1)));
        // Position 3 ends a 4-token snapshot interval; position 5 is the last row.
        let kept: Vec<usize> = (0..6).filter(|&r| b.states[r].dst.is_some()).collect();
        assert_eq!(kept, vec![3, 5]);
        m.commit(&b);
        assert!(m.has(2 * 4 + 3) && m.has(5 * 4 + 1) && !m.has(2 * 4 + 2));
        // The next chunk continues from position 5's register.
        let mut c = chain(&[2, 5], 6, 2, false);
        m.assign(&mut c, &[]).unwrap();
        assert!(matches!(c.states[0].src, StateSrc::Reg(_)));
        assert_eq!(m.usable_blocks(&[2, 5]), 1, "only the first block ends at a kept state");
    }

    #[test]
    fn window_rows_all_keep_and_rewriting_a_slot_frees_its_register() {
        let mut m = StateMap::new(8, 4, 64);
        let mut b = chain(&[0], 0, 2, false);
        m.assign(&mut b, &[]).unwrap();
        m.commit(&b);
        assert_eq!(m.free_registers(), 7);
        let mut w = chain(&[0], 2, 2, true);
        m.assign(&mut w, &[true, true]).unwrap();
        assert!(w.states.iter().all(|s| s.dst.is_some()));
        m.commit(&w);
        assert_eq!(m.free_registers(), 5);
        // Rewriting position 3 (a rejected row) replaces its state: one register freed, one taken.
        let mut again = chain(&[0], 3, 1, false);
        m.assign(&mut again, &[]).unwrap();
        m.commit(&again);
        assert_eq!(m.free_registers(), 5);
    }

    #[test]
    fn eviction_spares_pinned_states_and_the_parents_being_read() {
        let mut m = StateMap::new(2, 4, 64);
        let mut a = chain(&[0], 0, 1, false);
        m.assign(&mut a, &[]).unwrap();
        m.commit(&a);
        m.pin(0);
        let mut b = chain(&[1], 0, 1, false);
        m.assign(&mut b, &[]).unwrap();
        m.commit(&b);
        // Both registers hold states; the unpinned one (slot 4) is evicted for a third sequence.
        let mut c = chain(&[2], 0, 1, false);
        m.assign(&mut c, &[]).unwrap();
        m.commit(&c);
        assert!(m.has(0) && !m.has(4) && m.has(8));
        // Continuing sequence 3 needs a register while reading slot 8 and slot 0 is pinned: none is left.
        m.pin(8);
        let mut d = chain(&[2], 1, 1, false);
        let e = m.assign(&mut d, &[]).unwrap_err();
        assert!(e.to_string().contains("exhausted"), "{e}");
        // Unpinned, the parent being read is still spared, but the other state goes.
        m.unpin(0);
        m.assign(&mut d, &[]).unwrap();
        assert!(!m.has(0) && m.has(8));
    }

    #[test]
    fn relocate_moves_a_state_and_frees_what_it_replaces() {
        let mut m = StateMap::new(4, 4, 64);
        let (mut a, mut b) = (chain(&[0], 0, 1, false), chain(&[1], 0, 1, false));
        m.assign(&mut a, &[]).unwrap();
        m.commit(&a);
        m.assign(&mut b, &[]).unwrap();
        m.commit(&b);
        m.relocate(0, 4);
        assert!(!m.has(0) && m.has(4));
        assert_eq!(m.free_registers(), 3);
    }
}
