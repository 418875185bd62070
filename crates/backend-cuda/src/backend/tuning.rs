//! The live form of [`CudaTuning`]: atomics the ops read on every call, set from a whole value
//! ([`CudaBackend::tune`]). None of them changes an output's bits.

use crate::CudaTuning;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering::Relaxed};

/// [`CudaTuning`]'s fields but the kernel defines (fixed at compile time), as the ops read them.
pub(super) struct Knobs {
    /// Upload float matrices unpermuted even in the portable arithmetic.
    pub no_interleave: AtomicBool,
    /// Columns per block of the one-row interleaved kernels (0: [`crate::geometry::il_cols`]).
    pub cols: AtomicU32,
    /// Which one-row projections norm their input themselves (bit 0 q/k/v, bit 1 gate/up).
    pub norm_fuse: AtomicU8,
    /// One row's `norm_qkv_rope_kv_write` as the projections, then `rope_kv_write`.
    pub no_qkv_rope: AtomicBool,
    /// Which `_il1_qkv_rope` a one-row q/k/v runs: [`BY_OCCUPANCY`], [`NEVER`] or [`ALWAYS`] the `_w` one.
    pub qkv_wide: AtomicU8,
    /// Which `_il1_add` a one-row `matmul_add` runs: [`BY_OCCUPANCY`], [`NEVER`] or [`ALWAYS`] the `_d` one.
    pub add_deep: AtomicU8,
    /// Query heads per attention block: 0 by block count, else at most this many.
    pub attn_heads: AtomicUsize,
    /// `!CudaTuning::quant_stream`
    pub no_quant_stream: AtomicBool,
    /// `CudaTuning::quant_tiles`
    pub quant_tiles: AtomicU32,
    /// `CudaTuning::quant_mma`
    pub quant_mma: AtomicU32,
}

/// A kernel variant chosen by occupancy (the default), or forced off / on.
pub(super) const BY_OCCUPANCY: u8 = 0;
pub(super) const NEVER: u8 = 1;
pub(super) const ALWAYS: u8 = 2;

/// [`BY_OCCUPANCY`] / [`NEVER`] / [`ALWAYS`] for `None` / `Some(false)` / `Some(true)`.
fn choice(forced: Option<bool>) -> u8 {
    match forced {
        None => BY_OCCUPANCY,
        Some(false) => NEVER,
        Some(true) => ALWAYS,
    }
}

fn forced(c: u8) -> Option<bool> {
    match c {
        NEVER => Some(false),
        ALWAYS => Some(true),
        _ => None,
    }
}

impl Knobs {
    pub fn new(t: &CudaTuning) -> Knobs {
        let k = Knobs {
            no_interleave: AtomicBool::new(false),
            cols: AtomicU32::new(0),
            norm_fuse: AtomicU8::new(0),
            no_qkv_rope: AtomicBool::new(false),
            qkv_wide: AtomicU8::new(BY_OCCUPANCY),
            add_deep: AtomicU8::new(BY_OCCUPANCY),
            attn_heads: AtomicUsize::new(0),
            no_quant_stream: AtomicBool::new(false),
            quant_tiles: AtomicU32::new(0),
            quant_mma: AtomicU32::new(0),
        };
        k.store(t);
        k
    }

    /// Sets every knob from `t` (panics on a value out of range: [`CudaTuning`]'s docs).
    pub fn store(&self, t: &CudaTuning) {
        // Whole warps per block (the reduction tree shuffles across all 32 lanes); at most 16 (`_il1_glu` keeps
        // 2 · cols sums in shared memory of 64, and blocks of 512 threads).
        let c = t.il_cols;
        assert!(c == 0 || (c.is_power_of_two() && (2..=16).contains(&c)), "columns per block {c}");
        assert!(t.attn_heads <= 7, "query heads per attention block {}", t.attn_heads);
        self.no_interleave.store(!t.interleave, Relaxed);
        self.cols.store(c, Relaxed);
        self.norm_fuse.store(t.norm_fuse & 3, Relaxed);
        self.no_qkv_rope.store(!t.qkv_rope, Relaxed);
        self.qkv_wide.store(choice(t.qkv_wide), Relaxed);
        self.add_deep.store(choice(t.add_deep), Relaxed);
        self.attn_heads.store(t.attn_heads, Relaxed);
        self.no_quant_stream.store(!t.quant_stream, Relaxed);
        self.quant_tiles.store(t.quant_tiles, Relaxed);
        self.quant_mma.store(t.quant_mma, Relaxed);
    }

    /// The knobs as a [`CudaTuning`] with `defines`.
    pub fn load(&self, defines: &[crate::KernelDefine]) -> CudaTuning {
        CudaTuning {
            interleave: !self.no_interleave.load(Relaxed),
            il_cols: self.cols.load(Relaxed),
            norm_fuse: self.norm_fuse.load(Relaxed),
            qkv_rope: !self.no_qkv_rope.load(Relaxed),
            qkv_wide: forced(self.qkv_wide.load(Relaxed)),
            add_deep: forced(self.add_deep.load(Relaxed)),
            attn_heads: self.attn_heads.load(Relaxed),
            quant_stream: !self.no_quant_stream.load(Relaxed),
            quant_tiles: self.quant_tiles.load(Relaxed),
            quant_mma: self.quant_mma.load(Relaxed),
            defines: defines.to_vec(),
        }
    }

    /// Columns per block of a one-row interleaved kernel with `n` outputs: the set width, else
    /// [`crate::geometry::il_cols`].
    pub fn il1_cols(&self, n: usize) -> u32 {
        match self.cols.load(Relaxed) {
            0 => crate::geometry::il_cols(n),
            c => c,
        }
    }
}

impl super::CudaBackend {
    /// The tuning in force.
    pub fn tuning(&self) -> CudaTuning {
        self.tune.load(&self.defines)
    }

    /// Changes the tuning of a live backend: `f` edits the value in force, which then applies to every later op
    /// (interleaving: to later uploads). No output's bits change. The kernel defines are fixed when the kernels are
    /// compiled ([`super::CudaBackend::with_tuning`]); changing them here panics.
    pub fn tune(&self, f: impl FnOnce(&mut CudaTuning)) {
        let mut t = self.tuning();
        f(&mut t);
        assert_eq!(t.defines, self.defines, "kernel defines are fixed when the backend opens");
        self.tune.store(&t);
    }
}
