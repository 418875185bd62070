//! The GLU's output streamed to the down projection (`TF_CUDA_STREAM_DOWN`, backend/stream.rs): a one-row MLP
//! (`norm_matmul_glu` or `matmul_glu`, then `matmul_add` of the down weight) gives the same bits streamed as waiting
//! on the whole GLU, and as the CPU, over several layers in a row (each launch its own epoch), with the GLU's outputs
//! in whole and partial segments of 128 and more column groups than the GPU holds blocks.
#![cfg(feature = "cuda")]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::CudaBackend;
use tf_core::{Backend, DType, GluAct, Precision, Tensor, TensorInfo, Weight};
use tf_testkit::rows::values;

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// Random 16-bit weights of `dtype` (finite, magnitudes about 2^-10 to 2^4).
fn weight(be: &dyn Backend, dtype: DType, shape: &[usize], rng: &mut StdRng) -> (Weight, Vec<u8>) {
    let n: usize = shape.iter().product();
    let bytes: Vec<u8> = (0..n)
        .flat_map(|_| {
            let h: u16 = match dtype {
                DType::F16 => (rng.gen_range(5u16..19) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000),
                _ => (rng.gen_range(117u16..131) << 7) | rng.gen_range(0u16..128) | (rng.gen::<u16>() & 0x8000),
            };
            h.to_le_bytes()
        })
        .collect();
    let info = TensorInfo { name: "w".into(), dtype, shape: shape.iter().map(|&d| d as u64).collect() };
    (be.upload(&info, &bytes).unwrap_or_else(|e| panic!("{e}")), bytes)
}

#[test]
fn streamed_down_projection_equals_waiting_and_the_cpu() {
    let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_2512u64);
    eprintln!("TF_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let g = CudaBackend::new(0, Precision::Full).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let c = CpuBackend::new(4, Precision::Full);
    g.set_float_tuning(true, 0);
    g.set_norm_fuse(2); // gate/up norm their own row where the kernel allows it
    let eps = 1e-6;
    // (type, hidden K, intermediate N, the GLU norms its row): N 8,960 has more column groups than the GPU holds
    // blocks of `_il1_glu_norm`; 1,000 and 200 end in a partial segment.
    let cases = [(DType::BF16, 1536, 8960, true), (DType::F16, 1024, 1000, true), (DType::BF16, 512, 200, false)];
    for (dtype, k, n, normed) in cases {
        let layers = 3;
        let mut gw = Vec::new();
        let mut cw = Vec::new();
        for _ in 0..layers {
            let (norm_g, nb) = weight(&g, DType::BF16, &[k], &mut rng);
            let norm_c =
                c.upload(&TensorInfo { name: "n".into(), dtype: DType::BF16, shape: vec![k as u64] }, &nb).unwrap();
            let mut one = |shape: &[usize]| {
                let (wg, bytes) = weight(&g, dtype, shape, &mut rng);
                let info = TensorInfo { name: "w".into(), dtype, shape: shape.iter().map(|&d| d as u64).collect() };
                (wg, c.upload(&info, &bytes).unwrap())
            };
            let (gate, up, down) = (one(&[n, k]), one(&[n, k]), one(&[k, n]));
            gw.push((norm_g, gate.0, up.0, down.0));
            cw.push((norm_c, gate.1, up.1, down.1));
        }
        let x = Tensor::host(1, k, values(&mut rng, k, 4.0));
        // `layers` MLP blocks in a row on the residual, as the model runs them.
        let run_gpu = |stream: bool| {
            g.set_stream_down(stream);
            let mut h = g.select_rows(&x, &[0]);
            for (norm, gate, up, down) in &gw {
                let a = if normed {
                    g.norm_matmul_glu(&h, norm, eps, gate, up, GluAct::Silu)
                } else {
                    g.matmul_glu(&g.rms_norm(&h, norm, k, eps), gate, up, GluAct::Silu)
                };
                g.matmul_add(&a, down, None, &mut h);
            }
            g.set_stream_down(false);
            g.to_host(&h)
        };
        let mut h = x.clone();
        for (norm, gate, up, down) in &cw {
            let a = c.norm_matmul_glu(&h, norm, eps, gate, up, GluAct::Silu);
            c.matmul_add(&a, down, None, &mut h);
        }
        let what = format!("{dtype} K {k} N {n}, GLU norming its row: {normed}");
        let (streamed, waited) = (run_gpu(true), run_gpu(false));
        same(&streamed, &waited, &format!("{what}: streamed vs waited"));
        same(&streamed, &c.to_host(&h), &format!("{what}: streamed vs cpu"));
    }
}
