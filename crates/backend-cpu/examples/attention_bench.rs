//! Decode attention throughput (speed lives here, never in tests): one query row per layer over a paged KV cache
//! of `ctx` positions, every layer of a model's shape in turn (so each step reads the whole cache from memory, as a
//! decode step does), timed per step.
//!
//! `cargo run --release -p tf-backend-cpu --example attention_bench -- [threads] [ctx] [kv-type] [shape]`
//! (defaults 2, 4096, f32, qwen05; kv-type f32, f16 or q8_0; shapes `smollm2` (30 layers, 9 heads over 3 kv heads
//! of 64), `qwen05` (24, 14 over 2 of 64), `qwen15` (28, 12 over 2 of 128)). Prints the median and the fastest of
//! `TF_BENCH_STEPS` steps (default 40) in ms, and the K/V bytes a step reads per ms of the median. `TF_BENCH_CPU=1`
//! times by the calling thread's CPU time instead of the clock (Linux; with 1 thread, whose pool runs every task on
//! the caller): a per-core speed that other processes on a busy machine disturb much less than they do the clock.

#[path = "common/mod.rs"]
mod common;
use common::thread_cpu_s;

use std::time::Instant;

use tf_backend_cpu::{CpuBackend, KvType};
use tf_core::{AttnMeta, AttnParams, Backend, KvSpec, Precision, RowAttn, Tensor};

/// A deterministic xorshift stream (no dependency on `rand` outside tests).
struct Rng(u64);

impl Rng {
    /// A value in [-1, 1).
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let threads: usize = arg(0, "2").parse().expect("threads");
    let ctx: usize = arg(1, "4096").parse().expect("ctx");
    let ty = KvType::parse(&arg(2, "f32")).expect("kv type: f32, f16 or q8_0");
    // (layers, heads, kv_heads, head_dim)
    let (layers, heads, kv_heads, head_dim) = match arg(3, "qwen05").as_str() {
        "smollm2" => (30, 9, 3, 64),
        "qwen05" => (24, 14, 2, 64),
        "qwen15" => (28, 12, 2, 128),
        s => panic!("unknown shape {s} (smollm2, qwen05, qwen15)"),
    };
    let cpu_time = std::env::var("TF_BENCH_CPU").is_ok_and(|v| v == "1");
    let t0 = Instant::now();
    let now = || if cpu_time { thread_cpu_s() } else { t0.elapsed().as_secs_f64() };
    let steps: usize = std::env::var("TF_BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let bs = 16;
    let blocks = ctx.div_ceil(bs);
    let be = CpuBackend::new(threads, Precision::Full).with_kv_type(ty);
    let mut kv = be.alloc_kv(KvSpec { layers, blocks, block_size: bs, kv_heads, head_dim }).expect("KV pool");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let width = kv_heads * head_dim;
    // Written in pieces of 256 rows: k, v [256, kv_heads·head_dim].
    for layer in 0..layers {
        for start in (0..ctx).step_by(256) {
            let n = 256.min(ctx - start);
            let slots: Vec<u32> = (start as u32..(start + n) as u32).collect();
            let k = Tensor::host(n, width, (0..n * width).map(|_| rng.unit()).collect());
            let v = Tensor::host(n, width, (0..n * width).map(|_| rng.unit()).collect());
            be.kv_write(&mut kv, layer, &k, &v, &slots);
        }
    }
    let p = AttnParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window: None,
        softcap: None,
        sinks: None,
    };
    let meta = AttnMeta {
        block_tables: vec![(0..blocks as u32).collect()],
        rows: vec![RowAttn { pos: ctx as u32 - 1, seq: 0, ctx: ctx as u32, tree: vec![] }],
    };
    // q [1, heads·head_dim] per layer
    let qs: Vec<Tensor> = (0..layers)
        .map(|_| Tensor::host(1, heads * head_dim, (0..heads * head_dim).map(|_| rng.unit()).collect()))
        .collect();
    let mut times = Vec::with_capacity(steps);
    let mut check = 0f32;
    for _ in 0..steps + 2 {
        let t = now();
        for (layer, q) in qs.iter().enumerate() {
            check += be.attention(q, &kv, layer, &meta, &p).host[0];
        }
        times.push((now() - t) * 1e3);
    }
    let mut t = times[2..].to_vec();
    t.sort_by(f64::total_cmp);
    let bytes = ty.bytes_per_token(layers, kv_heads, head_dim) * ctx;
    println!(
        "{} ctx {ctx} kv {ty:?} threads {threads}: step median {:.3} ms, fastest {:.3} ms, {:.1} GB/s of K/V (check {check:.3})",
        arg(3, "qwen05"),
        t[t.len() / 2],
        t[0],
        bytes as f64 / t[t.len() / 2] / 1e6
    );
}
