//! The streaming checkpoint kernels (kernels/matmul_q.cu: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K) against the CPU backend, bit for bit, and row-exact: shapes whose weight rows start at every 2-byte alignment, rows of one to many steps with a
//! partial last step, column counts that leave a block's warps idle, 1 to 256 rows (several row groups), with and
//! without a bias, equal to `matmul_quant` (`CudaTuning::quant_stream` off) and with the tensor-core kernels
//! (kernels/matmul_qt.cu) at every row count (`CudaTuning::quant_tiles` 1) and never (0), the tensor-core streaming
//! kernels of Q4_K and Q6_K (kernels/matmul_qm.cu) from one row (`CudaTuning::quant_mma` 1) and never (0), both their forms
//! (K split across a block's warps below 8,192 columns, `mmqm_*_ks`, with K of 1 to 74 blocks and rounds where some
//! warps have no block; one warp per column group from there); `matmul_add` (the add
//! in the kernels' epilogue) equal to the CPU's matmul then add; and `matmul_many` quantizing x once for weights of one block size (mixing the streaming kernels
//! with `matmul_quant`) equal to one call each. Needs a CUDA device: without one these tests fail.
//!
//! Random data from a fresh seed per run, printed on failure; set `TF_SEED` to replay one.
#![cfg(feature = "cuda")]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::{CudaBackend, CudaTuning};
use tf_core::{Backend, DType, GluAct, Precision, Tensor, TensorInfo, Weight};
use tf_testkit::rows::values;

const ROW_COUNTS: [usize; 14] = [1, 2, 3, 5, 7, 8, 9, 16, 17, 33, 64, 100, 130, 256];

fn rng() -> StdRng {
    let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ ((std::process::id() as u64) << 40)
    });
    eprintln!("TF_SEED={seed} (set it to replay)");
    StdRng::seed_from_u64(seed)
}

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// Random blocks of `dtype` with finite, modest f16 scales.
fn random_weight(dtype: DType, out: usize, inn: usize, rng: &mut StdRng) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let mut w = vec![0u8; out * inn / dtype.block_size() * bb];
    rng.fill(&mut w[..]);
    let fields: &[usize] = match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => &[0, 2],
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        other => panic!("no generator for {other}"),
    };
    for blk in w.chunks_exact_mut(bb) {
        for &at in fields {
            let h = (rng.gen_range(8u16..15) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000);
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    w
}

fn up(be: &dyn Backend, dtype: DType, n: usize, k: usize, bytes: &[u8]) -> Weight {
    let info = TensorInfo { name: "w".into(), dtype, shape: vec![n as u64, k as u64] };
    be.upload(&info, bytes).unwrap_or_else(|e| panic!("{e}"))
}

fn pick(x: &[f32], cols: usize, rows: &[usize]) -> Tensor {
    let data = rows.iter().flat_map(|&r| x[r * cols..(r + 1) * cols].iter().copied()).collect();
    Tensor::host(rows.len(), cols, data)
}

#[test]
fn streaming_kernels_equal_the_cpu_and_are_row_exact() {
    let mut rng = rng();
    let g = CudaBackend::new(0, Precision::Checkpoint).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let c = CpuBackend::new(4, Precision::Checkpoint);
    // (type, N, K): odd row lengths in bytes (Q6_K 630 and 7,770, Q8_0 170 and 1,054, Q4_0 90, Q5_0 110, Q3_K 330
    // and 4,070; Q5_1 120 and Q2_K 252 at multiples of 8 and 4) put row starts at every even offset; K of one block,
    // of one step and a partial one, of many steps.
    let cases = [
        (DType::Q8_0, 37, 32 * 5),
        (DType::Q8_0, 6, 32 * 31),
        (DType::Q8_0, 9, 32 * 112),
        (DType::Q4_0, 37, 32 * 5),
        (DType::Q4_0, 6, 32 * 77),
        (DType::Q4_1, 37, 32 * 5),
        (DType::Q4_1, 6, 32 * 77),
        (DType::Q5_0, 37, 32 * 5),
        (DType::Q5_0, 6, 32 * 77),
        (DType::Q4K, 37, 256 * 3),
        (DType::Q4K, 5, 256),
        (DType::Q4K, 11, 256 * 37),
        (DType::Q6K, 37, 256 * 3),
        (DType::Q6K, 3, 256 * 37),
        (DType::Q6K, 8, 256 * 9),
        (DType::Q5_1, 37, 32 * 5),
        (DType::Q5_1, 6, 32 * 77),
        (DType::Q5K, 37, 256 * 3),
        (DType::Q5K, 5, 256),
        (DType::Q5K, 11, 256 * 37),
        (DType::Q3K, 37, 256 * 3),
        (DType::Q3K, 3, 256 * 37),
        (DType::Q3K, 8, 256 * 9),
        (DType::Q2K, 37, 256 * 3),
        (DType::Q2K, 5, 256),
        (DType::Q2K, 11, 256 * 37),
        // More columns than one tensor-core tile (64), a partial last tile.
        (DType::Q8_0, 70, 32 * 9),
        (DType::Q4_0, 64, 32 * 8),
        (DType::Q4_1, 66, 32 * 17),
        (DType::Q5_0, 129, 32 * 10),
        (DType::Q4K, 130, 256 * 2),
        (DType::Q6K, 65, 256 * 2),
        (DType::Q5_1, 70, 32 * 9),
        (DType::Q5K, 130, 256 * 2),
        (DType::Q3K, 65, 256 * 3),
        (DType::Q2K, 129, 256 * 2),
        // Q4_K and Q6_K on the tensor-core streaming kernels (src/geometry.rs, `mmqm_splits`): K split across a
        // block's warps with the down projection's 74 blocks (18 rounds of 4 and a partial one) and a partial last
        // column group; 1,025 column groups, one warp each (a block of one group, a group of 4 columns). Q6_K rows of
        // 74 blocks start 4-byte aligned, so the blocks alternate between 4- and 2-byte aligned; rows of 3 blocks (630
        // bytes) mix both within a column group.
        (DType::Q4K, 44, 256 * 74),
        (DType::Q4K, 8196, 256 * 2),
        (DType::Q6K, 44, 256 * 74),
        (DType::Q6K, 8196, 256 * 3),
    ];
    for (i, (dtype, n, k)) in cases.into_iter().enumerate() {
        let pool = 300;
        let w = random_weight(dtype, n, k, &mut rng);
        let x = values(&mut rng, pool * k, 2.0);
        let bias = values(&mut rng, n, 1.0);
        let (wg, wc) = (up(&g, dtype, n, k, &w), up(&c, dtype, n, k, &w));
        let (bg, bc) = (g.upload_f32("b", &[n], bias.clone()).unwrap(), c.upload_f32("b", &[n], bias).unwrap());
        let with_bias = i % 2 == 0;
        for &count in &ROW_COUNTS {
            let what = format!("{dtype} [{n}, {k}], {count} rows");
            let target = rng.gen_range(0..pool);
            let at = rng.gen_range(0..count);
            let rows: Vec<usize> = (0..count).map(|j| if j == at { target } else { rng.gen_range(0..pool) }).collect();
            let run = |be: &dyn Backend, w: &Weight, b: &Weight, rows: &[usize]| {
                be.to_host(&be.matmul(&pick(&x, k, rows), w, with_bias.then_some(b)))
            };
            let alone = run(&g, &wg, &bg, &[target]);
            let batch = run(&g, &wg, &bg, &rows);
            same(&batch[at * n..(at + 1) * n], &alone, &format!("{what}: row alone vs at {at}"));
            same(&batch, &run(&c, &wc, &bc, &rows), &format!("{what}: cuda vs cpu"));
            // CudaTuning::quant_stream off (matmul_quant): the same bits.
            g.tune(|t| t.quant_stream = false);
            same(&run(&g, &wg, &bg, &rows), &batch, &format!("{what}: matmul_quant vs the default"));
            // The streaming kernels alone and the tensor-core kernels alone (from one row): the same bits.
            g.tune(|t| (t.quant_stream, t.quant_tiles) = (true, 0));
            same(&run(&g, &wg, &bg, &rows), &batch, &format!("{what}: streaming vs the default"));
            // The tensor-core streaming kernels of Q4_K and Q6_K (kernels/matmul_qm.cu) never, then from one row.
            g.tune(|t| t.quant_mma = 0);
            same(&run(&g, &wg, &bg, &rows), &batch, &format!("{what}: integer streaming kernels vs the default"));
            g.tune(|t| t.quant_mma = 1);
            same(&run(&g, &wg, &bg, &rows), &batch, &format!("{what}: tensor-core streaming vs the default"));
            g.tune(|t| (t.quant_tiles, t.quant_mma) = (1, 0));
            same(&run(&g, &wg, &bg, &rows), &batch, &format!("{what}: tensor-core tiles vs the default"));
            g.tune(|t| *t = CudaTuning::default());
            // matmul_add (the product added into a residual in the kernel's epilogue) == matmul, then add, on the
            // CPU.
            let resid = values(&mut rng, count * n, 3.0);
            let add_on = |be: &dyn Backend, w: &Weight, b: &Weight| {
                let mut acc = Tensor::host(count, n, resid.clone());
                be.matmul_add(&pick(&x, k, &rows), w, with_bias.then_some(b), &mut acc);
                be.to_host(&acc)
            };
            same(&add_on(&g, &wg, &bg), &add_on(&c, &wc, &bc), &format!("{what}: matmul_add cuda vs cpu"));
        }
    }
}

#[test]
fn matmul_many_quantizes_once_with_the_same_bits() {
    let mut rng = rng();
    let g = CudaBackend::new(0, Precision::Checkpoint).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let c = CpuBackend::new(4, Precision::Checkpoint);
    // Five blocks: one round of the K-split tensor-core streaming kernels and one warp's block of the next.
    let k = 256 * 5;
    let sets: [&[(DType, usize)]; 16] = [
        &[(DType::Q4K, 96), (DType::Q4K, 16), (DType::Q6K, 16)],
        // Q8_1 takes matmul_quant.
        &[(DType::Q8_0, 40), (DType::Q4_0, 40), (DType::Q8_1, 8)],
        &[(DType::Q6K, 7), (DType::Q4K, 9)],
        // One type (one launch of mmq_many_*): q/k/v-like and gate/up-like sets, a partial block of warps each.
        &[(DType::Q4K, 96), (DType::Q4K, 16), (DType::Q4K, 18)],
        &[(DType::Q6K, 7), (DType::Q6K, 9), (DType::Q6K, 33)],
        &[(DType::Q8_0, 40), (DType::Q8_0, 9)],
        &[(DType::Q4_0, 13), (DType::Q4_0, 5), (DType::Q4_0, 64)],
        &[(DType::Q4_1, 6), (DType::Q4_1, 70)],
        &[(DType::Q5_0, 3), (DType::Q5_0, 3), (DType::Q5_0, 3)],
        &[(DType::Q5_1, 40), (DType::Q5_1, 9), (DType::Q5_1, 5)],
        &[(DType::Q5K, 96), (DType::Q5K, 16), (DType::Q5K, 18)],
        &[(DType::Q3K, 7), (DType::Q3K, 9), (DType::Q3K, 33)],
        &[(DType::Q2K, 13), (DType::Q2K, 70)],
        &[(DType::Q5K, 9), (DType::Q6K, 7), (DType::Q3K, 5)],
        // 1,026 column groups: mmqm_many_q4k and mmqm_many_q6k (one warp per group) rather than their K-split forms.
        &[(DType::Q4K, 8192), (DType::Q4K, 16)],
        &[(DType::Q6K, 8192), (DType::Q6K, 16)],
    ];
    for set in sets {
        let mut wg = Vec::new();
        let mut wc = Vec::new();
        let mut bg = Vec::new();
        let mut bc = Vec::new();
        for &(dtype, n) in set {
            let w = random_weight(dtype, n, k, &mut rng);
            wg.push(up(&g, dtype, n, k, &w));
            wc.push(up(&c, dtype, n, k, &w));
            let b = values(&mut rng, n, 1.0);
            bg.push(g.upload_f32("b", &[n], b.clone()).unwrap());
            bc.push(c.upload_f32("b", &[n], b).unwrap());
        }
        for rows in [1usize, 3, 8, 20, 40] {
            let x = Tensor::host(rows, k, values(&mut rng, rows * k, 2.0));
            let lg: Vec<(&Weight, Option<&Weight>)> = wg.iter().zip(&bg).map(|(w, b)| (w, Some(b))).collect();
            let lc: Vec<(&Weight, Option<&Weight>)> = wc.iter().zip(&bc).map(|(w, b)| (w, Some(b))).collect();
            let many = g.matmul_many(&x, &lg);
            let cpu = c.matmul_many(&x, &lc);
            for (i, &(w, b)) in lg.iter().enumerate() {
                let what = format!("{set:?}, {rows} rows, weight {i}");
                let got = g.to_host(&many[i]);
                same(&got, &g.to_host(&g.matmul(&x, w, b)), &format!("{what}: many vs one call"));
                same(&got, &c.to_host(&cpu[i]), &format!("{what}: cuda vs cpu"));
            }
        }
    }
}

/// `matmul_glu` of quantized gate and up of one type (one launch of `mmq_glu_*` on the streaming kernels; from
/// `CudaTuning::quant_tiles` rows the tiles, then `glu`) equals the CPU's matmuls then GLU, for SiLU and GELU, and is
/// row-exact.
#[test]
fn matmul_glu_of_quantized_weights_equals_the_cpu() {
    let mut rng = rng();
    let g = CudaBackend::new(0, Precision::Checkpoint).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let c = CpuBackend::new(4, Precision::Checkpoint);
    let types = [(DType::Q4K, 256 * 3), (DType::Q6K, 256 * 2), (DType::Q8_0, 32 * 9), (DType::Q4_0, 32 * 7)];
    let more = [
        (DType::Q4_1, 32 * 5),
        (DType::Q5_0, 32 * 11),
        (DType::Q5_1, 32 * 7),
        (DType::Q5K, 256 * 3),
        (DType::Q3K, 256 * 2),
        (DType::Q2K, 256 * 3),
        // The tensor-core streaming kernels of Q4_K and Q6_K: K split (3 rounds per weight, so up's rounds start on
        // the other slots), and one warp per column group (1,025 groups).
        (DType::Q4K, 256 * 9),
        (DType::Q4K, 256 * 2),
        (DType::Q6K, 256 * 9),
        (DType::Q6K, 256 * 3),
    ];
    for (i, &(dtype, k)) in types.iter().chain(&more).enumerate() {
        let n = [37, 64, 5, 130, 9, 66, 38, 37, 65, 7, 21, 8196, 21, 8196][i];
        let (gw, uw) = (random_weight(dtype, n, k, &mut rng), random_weight(dtype, n, k, &mut rng));
        let (gg, gu) = (up(&g, dtype, n, k, &gw), up(&g, dtype, n, k, &uw));
        let (cg, cu) = (up(&c, dtype, n, k, &gw), up(&c, dtype, n, k, &uw));
        for act in [GluAct::Silu, GluAct::GeluTanh] {
            for rows in [1usize, 2, 8, 9, 40] {
                let what = format!("{dtype} [{n}, {k}], {act:?}, {rows} rows");
                let x = Tensor::host(rows, k, values(&mut rng, rows * k, 2.0));
                let got = g.to_host(&g.matmul_glu(&x, &gg, &gu, act));
                same(&got, &c.to_host(&c.matmul_glu(&x, &cg, &cu, act)), &format!("{what}: cuda vs cpu"));
                let last = Tensor::host(1, k, x.host[(rows - 1) * k..].to_vec());
                let alone = g.to_host(&g.matmul_glu(&last, &gg, &gu, act));
                same(&got[(rows - 1) * n..], &alone, &format!("{what}: last row alone vs in the batch"));
            }
        }
    }
}
