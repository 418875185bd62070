//! Choices of the float matmuls that change no output's bits: the weight layout, the interleaved block width and
//! which projections norm their own input. Defaults from measurements on the H200 (docs/perf-notes-cuda.md); the
//! environment variables are for measurements.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8};

/// The float matmuls' tuning (module docs).
pub(super) struct FloatTuning {
    /// Upload float matrices unpermuted even in the portable arithmetic.
    pub no_interleave: AtomicBool,
    /// Columns per block of the interleaved kernels (0: [`crate::geometry::il_cols`]; `TF_CUDA_IL_COLS`, a power of
    /// two from 2 to 16, for measurements: fewer, larger blocks per launch). Same bits at any width.
    pub cols: AtomicU32,
    /// Make no half copies of window activations (`TF_CUDA_HALF_X=0`, for measurements; backend/half.rs).
    pub no_half_x: AtomicBool,
    /// Which one-row projections norm their input themselves (bit 0 q/k/v, bit 1 gate/up; the others take
    /// `rms_norm` first): gate/up only by default (and only below K 4,096, `geometry::GLU_NORM_BELOW_K`),
    /// `TF_CUDA_NORM_FUSE` for measurements. On the H200 (session 12) the gate/up kernel norming its row gained 3% on
    /// the 1.5B shape and nothing on the 7B; q/k/v doing it lost 4%.
    pub norm_fuse: AtomicU8,
    /// `matmul_add` on the tensor-core and `matmul_float` kernels as `matmul` then `add` (`TF_CUDA_EPI_ADD=0`, for
    /// measurements) instead of the kernels adding into the residual themselves.
    pub no_epi_add: AtomicBool,
    /// `norm_qkv_rope_kv_write` of one row as the projections, then `rope_kv_write` (`TF_CUDA_QKV_ROPE=0`, for
    /// measurements) instead of the projections' kernel rotating and writing the cache in its epilogue.
    pub no_qkv_rope: AtomicBool,
    /// Which `_il1_qkv_rope` a one-row q/k/v runs: [`BY_OCCUPANCY`] the shallower `_il1_qkv_rope_w` when the
    /// default's grid is more than the GPU holds at once, [`NEVER`] / [`ALWAYS`] forced (`TF_CUDA_QKV_WIDE=0` /
    /// `1`, for measurements and tests). Same bits either way.
    pub qkv_wide: AtomicU8,
    /// Which `_il1_add` a one-row `matmul_add` runs: [`BY_OCCUPANCY`] the deeper `_il1_add_d` when its grid fits
    /// the GPU at once (few columns: the 1.5B's o and down, +2–3% on the H200 in session 17), else `_il1_add`;
    /// [`NEVER`] / [`ALWAYS`] forced (`TF_CUDA_ADD_DEEP=0` / `1`, for measurements and tests). Same bits either
    /// way.
    pub add_deep: AtomicU8,
}

/// Widths `TF_CUDA_IL_COLS` accepts (anything else: the default).
const IL_COLS: [u32; 4] = [2, 4, 8, 16];

/// A kernel variant chosen by occupancy (the default), or forced off / on for measurements and tests.
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

/// The environment's `0` (never) or `1` (always); anything else by occupancy.
fn choice_from_env(name: &str) -> u8 {
    choice(match std::env::var(name).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    })
}

fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl FloatTuning {
    /// Columns per block of a one-row interleaved kernel with `n` outputs: the measurement override, else
    /// [`crate::geometry::il_cols`].
    pub fn il1_cols(&self, n: usize) -> u32 {
        match self.cols.load(std::sync::atomic::Ordering::Relaxed) {
            0 => crate::geometry::il_cols(n),
            c => c,
        }
    }

    /// The defaults, overridden by the environment's measurement knobs.
    pub fn from_env() -> FloatTuning {
        FloatTuning {
            // On unless TF_CUDA_INTERLEAVE=0: interleaved rows make one-row steps ~25% faster, and row groups
            // read them at matmul_float's speed (docs/perf-notes-cuda.md, issue 8).
            no_interleave: AtomicBool::new(std::env::var("TF_CUDA_INTERLEAVE").is_ok_and(|v| v == "0")),
            no_half_x: AtomicBool::new(std::env::var("TF_CUDA_HALF_X").is_ok_and(|v| v == "0")),
            norm_fuse: AtomicU8::new(env_u32("TF_CUDA_NORM_FUSE", 2).min(3) as u8),
            no_epi_add: AtomicBool::new(std::env::var("TF_CUDA_EPI_ADD").is_ok_and(|v| v == "0")),
            no_qkv_rope: AtomicBool::new(std::env::var("TF_CUDA_QKV_ROPE").is_ok_and(|v| v == "0")),
            qkv_wide: AtomicU8::new(choice_from_env("TF_CUDA_QKV_WIDE")),
            cols: AtomicU32::new(Some(env_u32("TF_CUDA_IL_COLS", 0)).filter(|c| IL_COLS.contains(c)).unwrap_or(0)),
            add_deep: AtomicU8::new(choice_from_env("TF_CUDA_ADD_DEEP")),
        }
    }
}

impl super::CudaBackend {
    /// Which kernel one row's `matmul_add` runs (`TF_CUDA_ADD_DEEP`): `None` by occupancy (the default), `Some(true)`
    /// always the deeper `_il1_add_d`, `Some(false)` never. For tests and measurements: no bits change.
    pub fn set_add_deep(&self, deep: Option<bool>) {
        self.tune.add_deep.store(choice(deep), std::sync::atomic::Ordering::Relaxed);
    }

    /// Which kernel one row's fused q/k/v runs (`TF_CUDA_QKV_WIDE`): `None` by occupancy (the default), `Some(true)`
    /// always the shallower `_il1_qkv_rope_w`, `Some(false)` never. For tests and measurements: no bits change.
    pub fn set_qkv_wide(&self, wide: Option<bool>) {
        self.tune.qkv_wide.store(choice(wide), std::sync::atomic::Ordering::Relaxed);
    }

    /// Queues one plain launch of `pdl_probe` (one block spinning `spin_ns` on the GPU) and returns at once: work
    /// ahead of a measured chain so that the host, enqueueing, is never what the GPU waits on.
    #[doc(hidden)]
    pub fn spin(&self, spin_ns: i32) {
        self.gpu.launch("pdl_probe").int(spin_ns).go((1, 1, 1), (32, 1, 1));
    }

    /// One programmatic launch boundary measured alone (the bench example's `TF_BENCH_BOUNDARY`): `launches`
    /// launches of `pdl_probe` (`blocks` blocks of `threads` threads, each spinning `spin_ns` after its wait), queued
    /// behind a 2 ms spin so that the host is never what the GPU waits on; GPU microseconds per launch. With `pdl`
    /// each launch may be scheduled once the previous one's blocks have all started, as in the decode chain, so the
    /// time over the spin is one boundary's cost with nothing to overlap.
    #[doc(hidden)]
    pub fn boundary_probe(&self, launches: usize, blocks: u32, threads: u32, spin_ns: i32, pdl: bool) -> f64 {
        self.spin(2_000_000);
        let a = self.gpu.mark();
        for _ in 0..launches {
            let l = self.gpu.launch("pdl_probe");
            let l = if pdl { l.pdl() } else { l };
            l.int(spin_ns).go((blocks, 1, 1), (threads, 1, 1));
        }
        let b = self.gpu.mark();
        self.gpu.sync();
        self.gpu.elapsed_ms(&a, &b) as f64 * 1e3 / launches.max(1) as f64
    }

    /// [`tf_core::Backend::kv_write`] through `kv_write_late` (kernels/ops.cu): a programmatic launch that lets the
    /// next kernel start at once and writes only `spin_ns` after its wait, so that the rows are still old while a
    /// dependent kernel runs its code before `griddepcontrol.wait`. Recorded like every cache write. For tests of what
    /// attention may load before its wait (tests/kv_writes.rs).
    #[doc(hidden)]
    pub fn kv_write_late(
        &self,
        kv: &mut tf_core::KvCache,
        layer: usize,
        k: &tf_core::Tensor,
        v: &tf_core::Tensor,
        slots: &[u32],
        spin_ns: i32,
    ) {
        self.kv_write_with(kv, layer, k, v, slots, Some(spin_ns))
    }

    /// One grid barrier in global memory measured alone (the bench example's `TF_BENCH_BOUNDARY`, beside
    /// [`Self::boundary_probe`]): one launch of `barrier_probe` with `blocks` blocks of 128 threads (at most what the
    /// GPU holds at once: they wait on each other) running `rounds` rounds of a `spin_ns` spin and a barrier; GPU
    /// microseconds per round. `None` when the grid would not be resident at once.
    #[doc(hidden)]
    pub fn barrier_probe(&self, rounds: usize, blocks: u32, spin_ns: i32) -> Option<f64> {
        if blocks == 0 || blocks > self.gpu.resident_blocks("barrier_probe", 128) {
            return None;
        }
        let count = self.gpu.zeros(4).ok()?;
        let a = self.gpu.mark();
        self.gpu.launch("barrier_probe").ptr(&count).i32(rounds).int(spin_ns).go((blocks, 1, 1), (128, 1, 1));
        let b = self.gpu.mark();
        self.gpu.sync();
        Some(self.gpu.elapsed_ms(&a, &b) as f64 * 1e3 / rounds.max(1) as f64)
    }

    /// The bench example's dependent chain as one persistent launch (`chain_persist`, kernels/ops.cu; the bench
    /// example's `TF_BENCH_CHAIN`): `steps` one-row matmuls against `m` distinct bf16 weights [k, k] taken in turn,
    /// a grid barrier between steps, each column's next weight row requested before the barrier; blocks of
    /// `threads` threads (one column per half-warp), `mode` the kernel's bits (1 activations staged in shared
    /// memory, 2 flag barrier, 4 residual in registers, 8 no barrier: self-flagged activations). Queued behind a 3 ms
    /// spin; GPU microseconds per step. `None` when k is not a multiple of 128 up to 2,048, bit 8 comes without 1
    /// and 4, or the grid would not be resident at once.
    #[doc(hidden)]
    pub fn chain_persist_probe(&self, k: usize, m: usize, steps: usize, threads: u32, mode: i32) -> Option<f64> {
        let blocks = (k as u32 * 16).div_ceil(threads);
        if k == 0
            || !k.is_multiple_of(128)
            || k > 2048
            || m == 0
            || (mode & 8 != 0 && mode & 5 != 5) // self-flagged words need the staged input and register residual
            || blocks > self.gpu.resident_blocks("chain_persist", threads)
        {
            return None;
        }
        let w = self.gpu.upload(&crate::timing_bf16_bytes(m * k * k, 0x2545_F491_4F6C_DD1D)).ok()?; // m × [k, k]
        let mut times = Vec::new();
        for rep in 0..4 {
            let (a, b) = (self.gpu.zeros(8 * k).ok()?, self.gpu.zeros(8 * k).ok()?); // [k] floats or tagged words
            let sync = self.gpu.zeros(4 * (blocks as usize + 1)).ok()?;
            self.spin(3_000_000);
            let t0 = self.gpu.mark();
            self.gpu
                .launch("chain_persist")
                .ptr(&w)
                .ptr(&a)
                .ptr(&b)
                .ptr(&sync)
                .i32(k)
                .i32(m)
                .i32(steps)
                .int(mode)
                .go((blocks, 1, 1), (threads, 1, 1));
            let t1 = self.gpu.mark();
            self.gpu.sync();
            if rep > 0 {
                times.push(self.gpu.elapsed_ms(&t0, &t1) as f64 * 1e3 / steps.max(1) as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        Some(times[times.len() / 2])
    }

    /// The decode chain's kernel timestamps since the last call, with kernels built with `TRACE=1`
    /// ([`crate::device::Gpu::trace_take`]; for the bench example's `TF_BENCH_TRACE`).
    #[doc(hidden)]
    pub fn trace_take(&self) -> Option<Vec<u64>> {
        self.gpu.trace_take()
    }
}
