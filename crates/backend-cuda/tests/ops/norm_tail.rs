//! `matmul_add_rms_norm` of one row (a layer's down projection, its residual add and the next layer's RMSNorm),
//! where the projection's last block to finish norms the row (`_il1_add_norm`, kernels/matmul_il.cu), against the
//! same call with the norm as its own launch (`matmul_add` then `rms_norm`) and against the CPU's default, bitwise.

use super::*;

/// Shapes: the 1.5B's, 7B's and 8B's hidden widths (K cut down: the tail only sees N), a row past one chunk of
/// the tail's registers (N > 16 · 4 · 64 at the default width), N not a multiple of 16 and a tiny N; every float
/// weight type and norm type; block widths 2, 4 (default) and 16, both kernel depths, bias or none, and three calls
/// in a row with fresh inputs (the block counter must be back at zero after each). Residual values up to ±30, so
/// the norm's scale matters. A kernel summing the last block's parts out of order fails it (`TAIL_MUT=1`).
#[test]
fn matmul_add_rms_norm_in_the_last_block_equals_matmul_add_then_rms_norm() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let eps = 1e-5;
    let cases: [(DType, usize, usize, DType); 6] = [
        (DType::BF16, 1024, 1536, DType::BF16),
        (DType::BF16, 512, 3584, DType::F32),
        (DType::F16, 256, 4096, DType::BF16),
        (DType::BF16, 256, 5120, DType::F16),
        (DType::F32, 128, 1000, DType::F32),
        (DType::BF16, 128, 17, DType::BF16),
    ];
    for cols in [0u32, 2, 16] {
        g.set_float_tuning(true, cols);
        for (dtype, k, n, ndt) in cases {
            let w = random_weight(dtype, n, k, &mut rng);
            let (wg, wc) = (up(&g, "down", dtype, &[n, k], &w), up(&c, "down", dtype, &[n, k], &w));
            assert!(interleaved(&wg), "{dtype} [{n}, {k}] layout");
            let b = values(&mut rng, n, 1.0);
            let (bg, bc) = (g.upload_f32("b", &[n], b.clone()).unwrap(), c.upload_f32("b", &[n], b).unwrap());
            let nw = random_weight(ndt, 1, n, &mut rng);
            let (ng, nc) = (up(&g, "norm", ndt, &[n], &nw), up(&c, "norm", ndt, &[n], &nw));
            for bias in [false, true] {
                let (bg, bc) = (bias.then_some(&bg), bias.then_some(&bc));
                for deep in [None, Some(true), Some(false)] {
                    g.set_add_deep(deep);
                    for call in 0..3 {
                        let what = format!(
                            "{dtype} [{n}, {k}], norm {ndt}, cols {cols}, bias {bias}, deep {deep:?}, call {call}"
                        );
                        let x = Tensor::host(1, k, values(&mut rng, k, 2.0));
                        let r = values(&mut rng, n, 30.0);
                        // The residual on the device, as the model holds it.
                        let resid = g.select_rows(&Tensor::host(1, n, r.clone()), &[0]);
                        g.set_norm_tail(true);
                        let mut acc = resid.clone();
                        let normed = g.to_host(&g.matmul_add_rms_norm(&x, &wg, bg, &mut acc, &ng, eps));
                        g.set_norm_tail(false);
                        let mut split_acc = resid.clone();
                        let split = g.matmul_add_rms_norm(&x, &wg, bg, &mut split_acc, &ng, eps);
                        let mut cpu_acc = Tensor::host(1, n, r.clone());
                        let cpu = c.matmul_add_rms_norm(&x, &wc, bc, &mut cpu_acc, &nc, eps);
                        same(&normed, &g.to_host(&split), &format!("{what}: normed, vs matmul_add + rms_norm"));
                        same(&normed, &c.to_host(&cpu), &format!("{what}: normed, cuda vs cpu"));
                        let acc = g.to_host(&acc);
                        same(&acc, &g.to_host(&split_acc), &format!("{what}: residual, vs matmul_add"));
                        same(&acc, &c.to_host(&cpu_acc), &format!("{what}: residual, cuda vs cpu"));
                        same(&g.to_host(&resid), &r, &format!("{what}: the clone's storage untouched"));
                    }
                }
            }
        }
    }
    g.set_add_deep(None);
    g.set_norm_tail(true);
    g.set_float_tuning(true, 0);
}
