//! [`Probes`]: the lab's kernels (`kernels/probes.cu`) on a backend's stream, so that they time what surrounds the
//! backend's own launches. Compiled by NVRTC after the backend's sources (their helpers) into a module of their own.

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::collections::HashMap;
use std::sync::Arc;
use tf_backend_cuda::geometry::{nvrtc_arch, program};
use tf_backend_cuda::CudaBackend;

const PROBES_CU: &str = include_str!("../kernels/probes.cu");
const KERNELS: [&str; 3] = ["pdl_probe", "barrier_probe", "chain_persist"];

/// The probe kernels, loaded in the context of one backend.
pub struct Probes<'a> {
    be: &'a CudaBackend,
    funcs: HashMap<&'static str, CudaFunction>,
    _module: Arc<CudaModule>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl<'a> Probes<'a> {
    /// Compiles the probes for `be`'s GPU (NVRTC, with the backend's kernels in front: a minute on a cold machine)
    /// and loads them into its context.
    pub fn new(be: &'a CudaBackend) -> Result<Probes<'a>, String> {
        let gpu = be.device();
        let src = format!("{}\n#line 1 \"probes.cu\"\n{PROBES_CU}", program());
        let opts = CompileOptions {
            ftz: Some(false),
            prec_sqrt: Some(true),
            prec_div: Some(true),
            fmad: Some(false),
            options: vec![nvrtc_arch(gpu.cc.0, gpu.cc.1), "--std=c++17".into()],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(src, opts).map_err(|e| format!("NVRTC (probes): {e:?}"))?;
        let module = gpu.ctx.load_module(ptx).map_err(|e| format!("probe module: {e:?}"))?;
        let mut funcs = HashMap::new();
        for k in KERNELS {
            funcs.insert(k, module.load_function(k).map_err(|e| format!("{k}: {e:?}"))?);
        }
        Ok(Probes { be, funcs, _module: module })
    }

    fn launch(&self, name: &'static str) -> tf_backend_cuda::device::Launch<'_> {
        self.be.device().launch_fn(name, &self.funcs[name])
    }

    /// Blocks of `threads` threads of probe `name` the GPU holds at once.
    fn resident(&self, name: &'static str, threads: u32) -> u32 {
        let per_sm = self.funcs[name]
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .unwrap_or_else(|e| panic!("CUDA occupancy of {name}: {e:?}"));
        (per_sm * self.be.device().multiprocessors()).max(1)
    }

    /// Queues one plain launch of `pdl_probe` (one block spinning `spin_ns` on the GPU) and returns at once: work
    /// ahead of a measured chain so that the host, enqueueing, is never what the GPU waits on.
    pub fn spin(&self, spin_ns: i32) {
        self.launch("pdl_probe").int(spin_ns).go((1, 1, 1), (32, 1, 1));
    }

    /// One programmatic launch boundary measured alone (the bench example's `TF_BENCH_BOUNDARY`): `launches`
    /// launches of `pdl_probe` (`blocks` blocks of `threads` threads, each spinning `spin_ns` after its wait), queued
    /// behind a 2 ms spin so that the host is never what the GPU waits on; GPU microseconds per launch. With `pdl`
    /// each launch may be scheduled once the previous one's blocks have all started, as in the decode chain, so the
    /// time over the spin is one boundary's cost with nothing to overlap.
    pub fn boundary(&self, launches: usize, blocks: u32, threads: u32, spin_ns: i32, pdl: bool) -> f64 {
        let gpu = self.be.device();
        self.spin(2_000_000);
        let a = gpu.mark();
        for _ in 0..launches {
            let l = self.launch("pdl_probe");
            let l = if pdl { l.pdl() } else { l };
            l.int(spin_ns).go((blocks, 1, 1), (threads, 1, 1));
        }
        let b = gpu.mark();
        gpu.sync();
        gpu.elapsed_ms(&a, &b) as f64 * 1e3 / launches.max(1) as f64
    }

    /// One grid barrier in global memory measured alone (beside [`Self::boundary`]): one launch of `barrier_probe`
    /// with `blocks` blocks of 128 threads (at most what the GPU holds at once: they wait on each other) running
    /// `rounds` rounds of a `spin_ns` spin and a barrier; GPU microseconds per round. `None` when the grid would
    /// not be resident at once.
    pub fn barrier(&self, rounds: usize, blocks: u32, spin_ns: i32) -> Option<f64> {
        let gpu = self.be.device();
        if blocks == 0 || blocks > self.resident("barrier_probe", 128) {
            return None;
        }
        let count = gpu.zeros(4).ok()?;
        let a = gpu.mark();
        self.launch("barrier_probe").ptr(&count).i32(rounds).int(spin_ns).go((blocks, 1, 1), (128, 1, 1));
        let b = gpu.mark();
        gpu.sync();
        Some(gpu.elapsed_ms(&a, &b) as f64 * 1e3 / rounds.max(1) as f64)
    }

    /// The bench example's dependent chain as one persistent launch (`chain_persist`, the bench example's
    /// `TF_BENCH_CHAIN`): `steps` one-row matmuls against `m` distinct bf16 weights [k, k] taken in turn, a grid
    /// barrier between steps, each column's next weight row requested before the barrier; blocks of `threads`
    /// threads (one column per half-warp), `mode` the kernel's bits (1 activations staged in shared memory, 2 flag
    /// barrier, 4 residual in registers, 8 no barrier: self-flagged activations). Queued behind a 3 ms spin; GPU
    /// microseconds per step, median of 3 after a warm-up. `None` when k is not a multiple of 128 up to 2,048, bit 8
    /// comes without 1 and 4, or the grid would not be resident at once.
    pub fn chain_persist(&self, k: usize, m: usize, steps: usize, threads: u32, mode: i32) -> Option<f64> {
        let gpu = self.be.device();
        let blocks = (k as u32 * 16).div_ceil(threads);
        if k == 0
            || !k.is_multiple_of(128)
            || k > 2048
            || m == 0
            || (mode & 8 != 0 && mode & 5 != 5) // self-flagged words need the staged input and register residual
            || blocks > self.resident("chain_persist", threads)
        {
            return None;
        }
        let w = gpu.upload(&crate::timing_bf16_bytes(m * k * k, 0x2545_F491_4F6C_DD1D)).ok()?; // m × [k, k]
        let mut times = Vec::new();
        for rep in 0..4 {
            let (a, b) = (gpu.zeros(8 * k).ok()?, gpu.zeros(8 * k).ok()?); // [k] floats or tagged words
            let sync = gpu.zeros(4 * (blocks as usize + 1)).ok()?;
            self.spin(3_000_000);
            let t0 = gpu.mark();
            self.launch("chain_persist")
                .ptr(&w)
                .ptr(&a)
                .ptr(&b)
                .ptr(&sync)
                .i32(k)
                .i32(m)
                .i32(steps)
                .int(mode)
                .go((blocks, 1, 1), (threads, 1, 1));
            let t1 = gpu.mark();
            gpu.sync();
            if rep > 0 {
                times.push(gpu.elapsed_ms(&t0, &t1) as f64 * 1e3 / steps.max(1) as f64);
            }
        }
        Some(median(times))
    }
}
