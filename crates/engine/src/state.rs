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
