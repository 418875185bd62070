//! The decode step's matmuls alone: how close to the bandwidth floor one token's weight stream can get on this
//! backend when nothing but the dependent one-row matmuls runs (no attention, no RoPE, no KV cache, optionally no
//! norm launch). Its fraction of the floor bounds the engine's from above, layer shape by layer shape.
//!
//! `skeleton [SHAPE ...]` (default: qwen2.5-1.5b qwen2.5-7b). Per layer, launched as the decode chain launches
//! them (programmatic launches, portable arithmetic, interleaved bf16 weights):
//! 1. `rms_norm` (the "norm" rows only), then q/k/v in one `matmul_many` with their biases;
//! 2. o as `matmul_add` into the residual, reading q in place of attention's output (the same width);
//! 3. gate/up and the GLU in one `norm_matmul_glu` (norming its own row, as the engine's GLU does);
//! 4. down as `matmul_add` into the residual;
//!
//! then the final `rms_norm` and the head (`matmul` against the [vocab, hidden] table). Every weight is distinct
//! (random bf16 patterns of the real shapes), so each token reads them all from DRAM as the engine does. Prints GPU
//! µs per token (median of 5 runs of 20 tokens, each run behind a 3 ms spin so the host never paces it) and the
//! weight bytes per token; divided by the copy bandwidth measured in the same call, that is the fraction of the
//! floor reached.

use tf_backend_cuda::{Arithmetic, CudaBackend};
use tf_core::{Backend, DType, GluAct, Precision, Tensor, TensorInfo, Weight};
use tf_cuda_lab::probes::Probes;

/// (name, hidden, intermediate, layers, heads, kv heads, vocab): the bench example's shapes (head_dim 128).
const SHAPES: [(&str, usize, usize, usize, usize, usize, usize); 3] = [
    ("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936),
    ("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936),
    ("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064),
];

/// One layer's weights ([out, in] matrices, [n] vectors).
struct Layer {
    norm1: Weight, // [hidden]
    wq: Weight,    // [hidden, hidden]
    bq: Weight,    // [hidden]
    wk: Weight,    // [kv_dim, hidden]
    bk: Weight,    // [kv_dim]
    wv: Weight,    // [kv_dim, hidden]
    bv: Weight,    // [kv_dim]
    wo: Weight,    // [hidden, hidden]
    norm2: Weight, // [hidden]
    gate: Weight,  // [inter, hidden]
    up: Weight,    // [inter, hidden]
    down: Weight,  // [hidden, inter]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[allow(clippy::too_many_arguments)]
fn run(
    be: &CudaBackend,
    probes: &Probes,
    name: &str,
    hidden: usize,
    inter: usize,
    layers: usize,
    kv_dim: usize,
    vocab: usize,
) {
    // One pool of timing patterns sliced for every weight (each weight is its own allocation, so the reads are
    // distinct bytes to the GPU).
    let largest = [vocab * hidden, inter * hidden].into_iter().max().unwrap_or(0);
    let pool = tf_cuda_lab::timing_bf16_bytes(largest, 0x9E37_79B9_7F4A_7C15);
    let mut bytes = 0u64;
    let mut load = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let info =
            TensorInfo { name: "w".into(), dtype: DType::BF16, shape: shape.iter().map(|&d| d as u64).collect() };
        bytes += 2 * n as u64;
        be.upload(&info, &pool[..2 * n]).unwrap_or_else(|e| panic!("{e}"))
    };
    let ls: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            norm1: load(&[hidden]),
            wq: load(&[hidden, hidden]),
            bq: load(&[hidden]),
            wk: load(&[kv_dim, hidden]),
            bk: load(&[kv_dim]),
            wv: load(&[kv_dim, hidden]),
            bv: load(&[kv_dim]),
            wo: load(&[hidden, hidden]),
            norm2: load(&[hidden]),
            gate: load(&[inter, hidden]),
            up: load(&[inter, hidden]),
            down: load(&[hidden, inter]),
        })
        .collect();
    let fnorm = load(&[hidden]); // [hidden]
    let head = load(&[vocab, hidden]); // [vocab, hidden]
    let eps = 1e-6;
    for with_norm in [true, false] {
        let token = |x: &mut Tensor| {
            for l in &ls {
                let qkv = {
                    let ws = [(&l.wq, Some(&l.bq)), (&l.wk, Some(&l.bk)), (&l.wv, Some(&l.bv))];
                    if with_norm {
                        let xn = be.rms_norm(x, &l.norm1, hidden, eps); // [1, hidden]
                        be.matmul_many(&xn, &ws)
                    } else {
                        be.matmul_many(x, &ws)
                    }
                };
                be.matmul_add(&qkv[0], &l.wo, None, x);
                let g = be.norm_matmul_glu(x, &l.norm2, eps, &l.gate, &l.up, GluAct::Silu); // [1, inter]
                be.matmul_add(&g, &l.down, None, x);
            }
            let xn = be.rms_norm(x, &fnorm, hidden, eps); // [1, hidden]
            be.matmul(&xn, &head, None) // [1, vocab]
        };
        let h: Vec<f32> = (0..hidden).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        let mut x = be.select_rows(&Tensor::host(1, hidden, h), &[0]); // [1, hidden]
        drop(token(&mut x)); // warm-up: module, allocations
        be.synchronize();
        let n = 20;
        let times: Vec<f64> = (0..5)
            .map(|_| {
                probes.spin(3_000_000);
                let t0 = be.device().mark();
                for _ in 0..n {
                    drop(token(&mut x));
                }
                let t1 = be.device().mark();
                be.synchronize();
                be.device().elapsed_ms(&t0, &t1) as f64 * 1e3 / n as f64
            })
            .collect();
        let us = median(times);
        println!(
            "{name} {}: {us:.1} µs per token, {:.3} GB of weights per token, {:.0} GB/s",
            if with_norm { "with the norm launch" } else { "matmuls only" },
            bytes as f64 / 1e9,
            bytes as f64 / us / 1e3
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names = if args.is_empty() { vec!["qwen2.5-1.5b".to_string(), "qwen2.5-7b".to_string()] } else { args };
    let be = CudaBackend::with_arithmetic(0, Precision::Full, Arithmetic::Portable).unwrap_or_else(|e| panic!("{e}"));
    let probes = Probes::new(&be).unwrap_or_else(|e| panic!("{e}"));
    for name in &names {
        let &(_, hidden, inter, layers, _heads, kv_heads, vocab) =
            SHAPES.iter().find(|s| s.0 == name).unwrap_or_else(|| panic!("unknown shape {name}"));
        run(&be, &probes, name, hidden, inter, layers, kv_heads * 128, vocab);
    }
}
