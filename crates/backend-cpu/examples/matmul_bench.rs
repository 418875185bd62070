//! Matmul kernel throughput (speed lives here, never in tests): weight GB/s and GFLOP/s of one `[N, K]` weight
//! type at 1, 4, 8, 16 and 64 rows, for the weights resident in L2 (`l2`, 512 × 1536) and streamed from
//! memory (`dram`: 8192 × 1536, `dram-s`: 576 × 1536 like a small model's layers; a rotation of weights
//! totalling ~512 MiB, each used once per round).
//!
//! `cargo run --release -p tf-backend-cpu --example matmul_bench -- [threads] [isa] [types...]`
//! (`isa`: scalar, avx2 or avx512; types as GGUF names, e.g. Q4_K Q6_K Q4_1 Q5_0 Q8_0). `TF_BENCH_SETS=dram,l2`
//! keeps only the named sets, `TF_BENCH_ROWS=1,8` only those row counts, `TF_BENCH_K=8960` sets the input width
//! (default 1536; a multiple of 256 for the K-quants), `TF_BENCH_PACK=0` keeps the weights as stored (no AVX-512
//! or AVX2 wide layout), `TF_BENCH_AB=1` times the weights as stored too, alternated with the wide layout in one
//! process. `TF_BENCH_CPU=1` times by the calling thread's CPU time instead of the clock (Linux;
//! with 1 thread, whose pool runs every task on the caller): a per-core speed that other processes on a busy
//! machine disturb much less than they do the wall clock. `TF_BENCH_PRECISION=full` times the portable f32
//! arithmetic (`Precision::Full`) instead of the checkpoint's.

#[path = "common/mod.rs"]
mod common;
use common::thread_cpu_s;

use std::time::Instant;

use tf_backend_cpu::matmul::{matmul, CpuWeight};
use tf_backend_cpu::{Isa, Pool};
use tf_core::{DType, Precision, Tensor, TensorInfo};

/// A deterministic xorshift stream (no dependency on `rand` outside tests).
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random bytes of an `[out, inn]` weight with finite, modest f16 scales.
fn weight(rng: &mut Rng, dtype: DType, out: usize, inn: usize) -> CpuWeight {
    let bb = dtype.block_bytes();
    // `[out * inn / block * bb]` raw GGUF bytes.
    let mut w: Vec<u8> = (0..out * inn / dtype.block_size() * bb).map(|_| rng.next() as u8).collect();
    let f16_fields: &[usize] = match dtype {
        DType::Q4_0
        | DType::Q5_0
        | DType::Q8_0
        | DType::IQ4NL
        | DType::IQ4XS
        | DType::IQ3S
        | DType::IQ3XXS
        | DType::IQ2XXS
        | DType::IQ2XS
        | DType::IQ1S
        | DType::IQ2S => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        _ => &[],
    };
    for blk in w.chunks_exact_mut(bb) {
        for &at in f16_fields {
            let h = ((4 + rng.next() % 8) << 10) as u16 | (rng.next() % 1024) as u16;
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    let info = TensorInfo { name: format!("w.{dtype}"), dtype, shape: vec![out as u64, inn as u64] };
    let w = CpuWeight::from_bytes(&info, &w).expect("valid weight");
    // `TF_BENCH_PACK=0`: the blocks as stored (the tile kernels), not the AVX-512 or AVX2 wide layout.
    if std::env::var("TF_BENCH_PACK").is_ok_and(|v| v == "0") {
        w.unpacked()
    } else {
        w
    }
}

/// CPU time of the calling thread in seconds (Linux `CLOCK_THREAD_CPUTIME_ID`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(0);
    let isa = match args.get(1).map(String::as_str) {
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512") => Isa::Avx512,
        Some("neon") => Isa::Neon,
        _ => Isa::detect(),
    };
    let types: Vec<DType> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|t| *DType::ALL.iter().find(|d| d.name() == t).unwrap_or_else(|| panic!("unknown type {t}")))
            .collect()
    } else {
        vec![DType::Q4K, DType::Q6K, DType::Q4_1, DType::Q5_0, DType::Q8_0]
    };
    let pool = Pool::new(threads);
    let sets = std::env::var("TF_BENCH_SETS").ok();
    let row_list = std::env::var("TF_BENCH_ROWS").ok();
    let cpu_time = std::env::var("TF_BENCH_CPU").is_ok_and(|v| v == "1");
    // `TF_BENCH_PRECISION=full`: the portable f32 arithmetic (`Precision::Full`) instead of the checkpoint's.
    let precision = match std::env::var("TF_BENCH_PRECISION").as_deref() {
        Ok("full") => Precision::Full,
        Ok("checkpoint") | Err(_) => Precision::Checkpoint,
        Ok(other) => panic!("TF_BENCH_PRECISION={other}: expected full or checkpoint"),
    };
    let k: usize = std::env::var("TF_BENCH_K").ok().and_then(|v| v.parse().ok()).unwrap_or(1536);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "threads {}, isa {}, K = {k}, {}{}",
        pool.threads(),
        isa.name(),
        precision.name(),
        if cpu_time { ", CPU time" } else { "" }
    );
    println!("{:6} {:6} {:>5} {:>10} {:>9} {:>9}", "type", "set", "rows", "us/call", "GB/s", "GFLOP/s");
    for dtype in types {
        for (set, n, count) in [("l2", 512, 1), ("dram", 8192, 0), ("dram-s", 576, 0)] {
            if !sets.as_ref().is_none_or(|s| s.split(',').any(|x| x == set)) {
                continue;
            }
            let row_bytes = k / dtype.block_size() * dtype.block_bytes();
            // Enough distinct weights to total ~512 MiB for the DRAM set.
            let count = if count == 0 { (512 << 20) / (n * row_bytes) } else { count };
            // `count` weights of `[n, k]`.
            let ab = std::env::var("TF_BENCH_AB").is_ok_and(|v| v == "1");
            let mut rng2 = rng.clone();
            let ws: Vec<CpuWeight> = (0..count).map(|_| weight(&mut rng, dtype, n, k)).collect();
            // `TF_BENCH_AB=1`: the same weights also as stored, timed alternately with `ws` in one process.
            let stored: Vec<CpuWeight> =
                if ab { (0..count).map(|_| weight(&mut rng2, dtype, n, k).unpacked()).collect() } else { Vec::new() };
            for rows in [1, 4, 8, 16, 64] {
                if !row_list.as_ref().is_none_or(|s| s.split(',').any(|x| x.parse() == Ok(rows))) {
                    continue;
                }
                // `[rows, k]` activations.
                let x =
                    Tensor::host(rows, k, (0..rows * k).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect());
                let reps = (((64 << 20) / (n * row_bytes * rows.min(16))).max(count)).min(20000);
                let run = |ws: &[CpuWeight], reps: usize| {
                    for i in 0..reps {
                        std::hint::black_box(matmul(&pool, isa, precision, &x, &ws[i % count], None));
                    }
                };
                let t0 = Instant::now();
                let now = || if cpu_time { thread_cpu_s() } else { t0.elapsed().as_secs_f64() };
                let sets: Vec<(&str, &[CpuWeight])> =
                    if ab { vec![("", &ws[..]), (" stored", &stored[..])] } else { vec![("", &ws[..])] };
                // Alternated in ten slices so that a drift of the machine's speed hits every variant alike.
                let mut secs = vec![0f64; sets.len()];
                for (_, w) in &sets {
                    run(w, count.min(reps));
                }
                let slice = reps.div_ceil(10);
                for _ in 0..10 {
                    for (i, (_, w)) in sets.iter().enumerate() {
                        let c = now();
                        run(w, slice);
                        secs[i] += now() - c;
                    }
                }
                for ((label, _), total) in sets.iter().zip(&secs) {
                    let s = total / (10 * slice) as f64;
                    let gbs = (n * row_bytes) as f64 / s / 1e9;
                    let gflops = 2.0 * (n * k * rows) as f64 / s / 1e9;
                    println!(
                        "{:6} {:6} {:>5} {:>10.1} {:>9.1} {:>9.1}{label}",
                        dtype.to_string(),
                        set,
                        rows,
                        s * 1e6,
                        gbs,
                        gflops
                    );
                }
            }
        }
    }
}
