//! The automatic prefix cache (DESIGN.md §2, §5): full KV blocks kept after their request ends, keyed by a
//! hash chain over (fingerprint, tokens of every block up to and including this one). A later request whose
//! prompt starts with the same tokens adopts those blocks instead of filling them again. Because every row is
//! row-exact, a block's K/V does not depend on how it was computed (prefill chunk, decode step, drafted window):
//! a cached block has exactly the bits a fresh fill would write, so the reply cannot change.
//!
//! Hits are verified (the block's own tokens and its parent's key are compared, not only the hash). Eviction is
//! least recently used among blocks nobody else references; a block's parent is always at least as recently used
//! as the block (lookups walk from the first block), so leaves go first.

use crate::kv_pool::{BlockRef, BlockTable, KvPool};
use std::collections::HashMap;

/// 64-bit mixing (SplitMix64 finalizer).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of a block: its parent's key and its tokens.
fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = mix(parent ^ 0x9e37_79b9_7f4a_7c15);
    for &t in tokens {
        h = mix(h ^ u64::from(t)).wrapping_add(0x632b_e59b_d9b4_e019);
    }
    h
}

struct Entry {
    /// The cache's own reference (keeps the block allocated).
    block: BlockRef,
    parent: u64,
    /// The block's tokens, compared on every hit.
    tokens: Vec<u32>,
    /// Logical time of the last lookup or insert that touched it.
    used: u64,
    /// Depth (0 = first block), to evict deeper blocks first among equals.
    depth: usize,
}

/// Cached full blocks of one KV cache.
pub struct PrefixCache {
    block_size: usize,
    /// The chain's root key: a fingerprint of the model and the arithmetic (a different model or precision
    /// mode never shares blocks).
    root: u64,
    entries: HashMap<u64, Entry>,
    clock: u64,
    /// Blocks reused and looked up, for reporting.
    pub hits_blocks: u64,
    pub lookups: u64,
}

impl PrefixCache {
    /// An empty cache for `pool`'s blocks; `fingerprint` names the model and precision mode.
    pub fn new(pool: &KvPool, fingerprint: &str) -> PrefixCache {
        let root = fingerprint.bytes().fold(0x5446_5f50_5245_4649u64, |h, b| mix(h ^ u64::from(b)));
        PrefixCache {
            block_size: pool.block_size(),
            root,
            entries: HashMap::new(),
            clock: 0,
            hits_blocks: 0,
            lookups: 0,
        }
    }

    /// Blocks held by the cache.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tokens [`PrefixCache::lookup`] would find for `tokens` now (whole blocks, at most `max_tokens`), without
    /// touching anything: what the scheduler plans with.
    pub fn peek(&self, tokens: &[u32], max_tokens: usize) -> usize {
        let bs = self.block_size;
        let mut parent = self.root;
        let mut n = 0;
        for chunk in tokens[..tokens.len().min(max_tokens)].chunks_exact(bs) {
            let key = block_key(parent, chunk);
            match self.entries.get(&key) {
                Some(e) if e.parent == parent && e.tokens == chunk => n += 1,
                _ => break,
            }
            parent = key;
        }
        n * bs
    }

    /// Blocks only the cache references (freed on demand by [`PrefixCache::evict`]).
    pub fn idle_blocks(&self, pool: &KvPool) -> usize {
        self.entries.values().filter(|e| pool.refcount(e.block.id()) == 1).count()
    }

    /// The longest cached run of full blocks that `tokens` starts with, at most `max_tokens` tokens (callers
    /// leave the prompt's last token to be fed, for its logits). Returns the blocks (new references).
    pub fn lookup(&mut self, tokens: &[u32], max_tokens: usize) -> Vec<BlockRef> {
        self.lookups += 1;
        self.clock += 1;
        let bs = self.block_size;
        let n = tokens.len().min(max_tokens) / bs;
        let mut out = Vec::new();
        let mut parent = self.root;
        let mut path = Vec::new();
        for i in 0..n {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent, chunk);
            match self.entries.get(&key) {
                Some(e) if e.parent == parent && e.tokens == chunk => {
                    out.push(e.block.clone());
                    path.push(key);
                }
                _ => break,
            }
            parent = key;
        }
        // Parents get the later (larger) stamp, so leaves are evicted first.
        let depth = path.len() as u64;
        for (i, key) in path.iter().enumerate() {
            if let Some(e) = self.entries.get_mut(key) {
                e.used = self.clock * 1024 + (depth - i as u64).min(1023);
            }
        }
        self.hits_blocks += out.len() as u64;
        out
    }

    /// Keeps the full blocks of `table` holding `tokens` (positions `0..tokens.len()` all written with these
    /// tokens' K/V). Blocks already cached are only touched.
    pub fn insert(&mut self, tokens: &[u32], table: &BlockTable) {
        self.clock += 1;
        let bs = self.block_size;
        let n = (tokens.len() / bs).min(table.len());
        let mut parent = self.root;
        for i in 0..n {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent, chunk);
            let used = self.clock * 1024 + (n - i).min(1023) as u64;
            match self.entries.get_mut(&key) {
                Some(e) if e.parent == parent && e.tokens == chunk => e.used = e.used.max(used),
                Some(_) => break, // a hash collision: keep the first owner, stop the chain here
                None => {
                    let block = table.block(i).clone();
                    self.entries.insert(key, Entry { block, parent, tokens: chunk.to_vec(), used, depth: i });
                }
            }
            parent = key;
        }
    }

    /// Frees up to `n` blocks that only the cache references, least recently used (deepest first among
    /// equals); returns how many were freed.
    pub fn evict(&mut self, pool: &KvPool, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut idle: Vec<(u64, usize, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| pool.refcount(e.block.id()) == 1)
            .map(|(&k, e)| (e.used, usize::MAX - e.depth, k))
            .collect();
        idle.sort_unstable();
        let mut freed = 0;
        for (_, _, key) in idle.into_iter().take(n) {
            self.entries.remove(&key);
            freed += 1;
        }
        freed
    }

    /// Drops every entry (blocks still used by a request stay allocated until it ends).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(pool: &KvPool, tokens: usize) -> BlockTable {
        let mut t = BlockTable::new(pool);
        t.ensure(pool, tokens).unwrap();
        t
    }

    #[test]
    fn lookup_finds_the_longest_cached_prefix_of_full_blocks() {
        let pool = KvPool::new(16, 4);
        let mut c = PrefixCache::new(&pool, "m");
        let a: Vec<u32> = (0..11).collect();
        let t = filled(&pool, 11);
        c.insert(&a, &t);
        assert_eq!(c.len(), 2, "two full blocks of 4; the partial third is not cached");
        let ids: Vec<u32> = t.ids();
        drop(t);
        assert_eq!(pool.free_blocks(), 14, "the cache keeps its two blocks");
        assert_eq!(c.idle_blocks(&pool), 2);
        assert_eq!(c.peek(&a, a.len() - 1), 8, "peek agrees with lookup, in tokens");
        assert_eq!(c.peek(&a, 7), 4);
        let hit = c.lookup(&a, a.len() - 1);
        assert_eq!(hit.iter().map(BlockRef::id).collect::<Vec<_>>(), ids[..2].to_vec());
        // A prompt that differs in the second block reuses only the first.
        let mut b = a.clone();
        b[5] = 99;
        assert_eq!(c.peek(&b, 100), 4);
        assert_eq!(c.lookup(&b, 100).len(), 1);
        // The cap: at most max_tokens tokens.
        assert_eq!(c.lookup(&a, 7).len(), 1);
        assert_eq!(c.lookup(&a, 3).len(), 0);
        // Another fingerprint shares nothing.
        let mut other = PrefixCache::new(&pool, "other");
        assert!(other.lookup(&a, 100).is_empty());
    }

    #[test]
    fn eviction_frees_only_idle_blocks_leaves_first() {
        let pool = KvPool::new(8, 2);
        let mut c = PrefixCache::new(&pool, "m");
        let a: Vec<u32> = (0..6).collect();
        let t = filled(&pool, 6);
        c.insert(&a, &t);
        drop(t);
        assert_eq!(pool.free_blocks(), 5);
        // In use by a request: not evictable.
        let held = c.lookup(&a, 6);
        assert_eq!(held.len(), 3);
        assert_eq!(c.idle_blocks(&pool), 0, "blocks a request holds are not idle");
        assert_eq!(c.evict(&pool, 3), 0);
        drop(held);
        // Leaves first: after evicting one, the first two blocks still hit.
        assert_eq!(c.evict(&pool, 1), 1);
        assert_eq!(pool.free_blocks(), 6);
        assert_eq!(c.lookup(&a, 6).len(), 2);
        assert_eq!(c.evict(&pool, 10), 2);
        assert_eq!(pool.free_blocks(), 8);
        assert!(c.is_empty());
    }
}
