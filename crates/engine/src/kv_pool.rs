//! The paged KV pool's bookkeeping: a fixed number of blocks of `block_size` token slots, a free list and
//! reference counts. The KV data itself lives in the backend's [`tf_core::KvCache`]; this module only decides
//! which block ids a sequence owns. Block layout never changes bits (DESIGN.md §2), so the allocation order is
//! free to be anything; it is deterministic (lowest ids first on a fresh pool, then most recently freed).
//!
//! A [`BlockRef`] is an RAII handle: cloning it adds a reference (a block shared by two sequences, later the
//! prefix cache), dropping the last reference returns the block to the free list.

use std::sync::{Arc, Mutex, MutexGuard};

/// Why a request cannot get its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// More tokens than the whole pool holds: no amount of waiting helps.
    TooLarge { tokens: usize, capacity_tokens: usize },
    /// Not enough free blocks now.
    Exhausted { needed_blocks: usize, free_blocks: usize, block_size: usize },
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::TooLarge { tokens, capacity_tokens } => write!(
                f,
                "the request needs KV for {tokens} tokens but the KV pool holds only {capacity_tokens} \
                 (raise the pool size or lower the prompt + max_tokens)"
            ),
            PoolError::Exhausted { needed_blocks, free_blocks, block_size } => write!(
                f,
                "the KV pool has {free_blocks} free blocks of {block_size} tokens; {needed_blocks} are needed"
            ),
        }
    }
}

impl std::error::Error for PoolError {}

struct Inner {
    /// Free block ids; `alloc` pops from the end.
    free: Vec<u32>,
    /// References per block (0 = free).
    refs: Vec<u32>,
}

/// The block allocator. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct KvPool {
    inner: Arc<Mutex<Inner>>,
    blocks: usize,
    block_size: usize,
}

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvPool({} of {} blocks free, {} tokens each)", self.free_blocks(), self.blocks, self.block_size)
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // The bookkeeping stays consistent across a panic elsewhere (every update is a few plain stores).
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvPool {
    /// A pool of `blocks` blocks of `block_size` slots. Panics when `block_size` is 0 or the slot count does
    /// not fit the u32 slot ids of [`tf_models::Batch`] (configuration errors).
    pub fn new(blocks: usize, block_size: usize) -> KvPool {
        assert!(block_size > 0, "KvPool: block_size must be > 0");
        assert!(blocks.checked_mul(block_size).is_some_and(|s| s <= u32::MAX as usize), "KvPool: too many slots");
        let inner = Inner { free: (0..blocks as u32).rev().collect(), refs: vec![0; blocks] };
        KvPool { inner: Arc::new(Mutex::new(inner)), blocks, block_size }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total_blocks(&self) -> usize {
        self.blocks
    }

    pub fn free_blocks(&self) -> usize {
        lock(&self.inner).free.len()
    }

    /// Token slots in the whole pool.
    pub fn capacity_tokens(&self) -> usize {
        self.blocks * self.block_size
    }

    /// Blocks that hold `tokens` token slots.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Admission: whether a sequence of `tokens` slots can get its blocks now.
    pub fn check_fits(&self, tokens: usize) -> Result<(), PoolError> {
        if tokens > self.capacity_tokens() {
            return Err(PoolError::TooLarge { tokens, capacity_tokens: self.capacity_tokens() });
        }
        let (needed, free) = (self.blocks_for(tokens), self.free_blocks());
        if needed > free {
            return Err(PoolError::Exhausted { needed_blocks: needed, free_blocks: free, block_size: self.block_size });
        }
        Ok(())
    }

    /// `n` blocks, all or none.
    pub fn alloc(&self, n: usize) -> Result<Vec<BlockRef>, PoolError> {
        let mut g = lock(&self.inner);
        if n > g.free.len() {
            return Err(PoolError::Exhausted {
                needed_blocks: n,
                free_blocks: g.free.len(),
                block_size: self.block_size,
            });
        }
        let at = g.free.len() - n;
        let ids: Vec<u32> = g.free.drain(at..).rev().collect();
        for &id in &ids {
            debug_assert_eq!(g.refs[id as usize], 0);
            g.refs[id as usize] = 1;
        }
        drop(g);
        Ok(ids.into_iter().map(|id| BlockRef { id, pool: Arc::clone(&self.inner) }).collect())
    }

    /// References held on block `id` (0 = free).
    pub fn refcount(&self, id: u32) -> u32 {
        lock(&self.inner).refs[id as usize]
    }
}

/// One reference to an allocated block; the block returns to the free list when the last one drops.
pub struct BlockRef {
    id: u32,
    pool: Arc<Mutex<Inner>>,
}

impl BlockRef {
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Clone for BlockRef {
    fn clone(&self) -> Self {
        lock(&self.pool).refs[self.id as usize] += 1;
        BlockRef { id: self.id, pool: Arc::clone(&self.pool) }
    }
}

impl Drop for BlockRef {
    fn drop(&mut self) {
        let mut g = lock(&self.pool);
        let r = &mut g.refs[self.id as usize];
        *r -= 1;
        if *r == 0 {
            g.free.push(self.id);
        }
    }
}

impl std::fmt::Debug for BlockRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockRef({})", self.id)
    }
}

/// A sequence's blocks in position order: position `p` lives in slot
/// `blocks[p / block_size] · block_size + p % block_size` (the [`tf_core::KvCache`] slot convention).
#[derive(Debug)]
pub struct BlockTable {
    blocks: Vec<BlockRef>,
    block_size: usize,
}

impl BlockTable {
    pub fn new(pool: &KvPool) -> BlockTable {
        BlockTable { blocks: Vec::new(), block_size: pool.block_size() }
    }

    /// Token positions covered by the blocks held.
    pub fn capacity_tokens(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    /// Grows the table so positions `0..tokens` have slots (all new blocks or none).
    pub fn ensure(&mut self, pool: &KvPool, tokens: usize) -> Result<(), PoolError> {
        assert_eq!(pool.block_size(), self.block_size, "BlockTable used with another pool");
        let need = tokens.div_ceil(self.block_size);
        if need > self.blocks.len() {
            self.blocks.extend(pool.alloc(need - self.blocks.len())?);
        }
        Ok(())
    }

    /// The KV slot of absolute position `pos`. Panics when the table does not cover it.
    pub fn slot(&self, pos: usize) -> u32 {
        let b = &self.blocks[pos / self.block_size];
        (b.id() as usize * self.block_size + pos % self.block_size) as u32
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The `i`-th block.
    pub fn block(&self, i: usize) -> &BlockRef {
        &self.blocks[i]
    }

    /// Appends blocks already allocated (e.g. cached prefix blocks) to the end of the table.
    pub fn adopt(&mut self, blocks: Vec<BlockRef>) {
        self.blocks.extend(blocks);
    }

    /// Block ids in position order (an [`tf_core::AttnMeta`] block table).
    pub fn ids(&self) -> Vec<u32> {
        self.blocks.iter().map(BlockRef::id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_and_drop_return_blocks() {
        let pool = KvPool::new(4, 16);
        assert_eq!((pool.total_blocks(), pool.free_blocks(), pool.capacity_tokens()), (4, 4, 64));
        let a = pool.alloc(3).unwrap();
        assert_eq!(a.iter().map(BlockRef::id).collect::<Vec<_>>(), vec![0, 1, 2], "fresh pool: lowest ids first");
        assert_eq!(pool.free_blocks(), 1);
        assert!(a.iter().all(|b| pool.refcount(b.id()) == 1));
        drop(a);
        assert_eq!(pool.free_blocks(), 4);
        assert!((0..4).all(|id| pool.refcount(id) == 0));
    }

    #[test]
    fn alloc_is_all_or_nothing() {
        let pool = KvPool::new(4, 8);
        let _a = pool.alloc(3).unwrap();
        let e = pool.alloc(2).unwrap_err();
        assert_eq!(e, PoolError::Exhausted { needed_blocks: 2, free_blocks: 1, block_size: 8 });
        assert_eq!(pool.free_blocks(), 1, "a refused alloc takes nothing");
        assert_eq!(pool.alloc(1).unwrap().len(), 1);
        assert_eq!(pool.alloc(0).unwrap().len(), 0);
    }

    #[test]
    fn clones_share_and_the_last_drop_frees() {
        let pool = KvPool::new(2, 4);
        let mut a = pool.alloc(1).unwrap();
        let b = a.pop().unwrap();
        let c = b.clone();
        assert_eq!((b.id(), pool.refcount(b.id())), (c.id(), 2));
        drop(b);
        assert_eq!((pool.refcount(c.id()), pool.free_blocks()), (1, 1));
        let id = c.id();
        drop(c);
        assert_eq!((pool.refcount(id), pool.free_blocks()), (0, 2));
        // The most recently freed block is reused first.
        assert_eq!(pool.alloc(1).unwrap()[0].id(), id);
    }

    #[test]
    fn admission_refuses_with_clear_errors() {
        let pool = KvPool::new(4, 16);
        assert!(pool.check_fits(64).is_ok());
        assert!(pool.check_fits(0).is_ok());
        let e = pool.check_fits(65).unwrap_err();
        assert_eq!(e, PoolError::TooLarge { tokens: 65, capacity_tokens: 64 });
        assert!(e.to_string().contains("65 tokens") && e.to_string().contains("only 64"), "{e}");
        let _held = pool.alloc(3).unwrap();
        assert!(pool.check_fits(16).is_ok());
        let e = pool.check_fits(17).unwrap_err();
        assert_eq!(e, PoolError::Exhausted { needed_blocks: 2, free_blocks: 1, block_size: 16 });
        assert!(e.to_string().contains("1 free blocks") && e.to_string().contains("2 are needed"), "{e}");
    }

    #[test]
    fn block_table_maps_positions_to_slots() {
        let pool = KvPool::new(8, 4);
        let _skip = pool.alloc(2).unwrap(); // blocks 0 and 1 taken: the table gets 2, 3, ...
        let mut t = BlockTable::new(&pool);
        t.ensure(&pool, 5).unwrap();
        assert_eq!((t.ids(), t.capacity_tokens()), (vec![2, 3], 8));
        assert_eq!((0..5).map(|p| t.slot(p)).collect::<Vec<_>>(), vec![8, 9, 10, 11, 12]);
        t.ensure(&pool, 8).unwrap();
        assert_eq!(t.ids(), vec![2, 3], "already covered");
        t.ensure(&pool, 9).unwrap();
        assert_eq!((t.ids(), t.slot(8)), (vec![2, 3, 4], 16));
        assert!(t.ensure(&pool, 100).is_err());
        assert_eq!(pool.free_blocks(), 3, "a failed ensure takes nothing");
        drop(t);
        assert_eq!(pool.free_blocks(), 6);
    }

    #[test]
    #[should_panic(expected = "block_size")]
    fn zero_block_size_is_rejected() {
        KvPool::new(4, 0);
    }
}
