//! The tensor arithmetic's matmul (kernels/mma.cu) for BF16 and F16 weights: (a) row-exact bitwise: a row computed
//! alone equals the same row at a random index among R-1 random rows, for R in 1..=256 (both kernels: up to 16 rows
//! and more), with and without bias, host and device inputs; (b) within a stated bound of the f32 reference (the
//! CPU backend's full precision on the same weights); (c) really on tensor cores (it differs from the portable
//! arithmetic). Needs a CUDA device of compute capability 8.0 or later.
//!
//! Random data from a fresh seed per run, printed on failure; set `TF_SEED` to replay one.
#![cfg(feature = "cuda")]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::{Arithmetic, CudaBackend};
use tf_core::{Backend, DType, Precision, Tensor, TensorInfo, Weight};
use tf_testkit::rows::values;

const ROW_COUNTS: [usize; 10] = [1, 2, 3, 5, 8, 16, 17, 33, 64, 256];

struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("failed with TF_SEED={} (set it to replay)", self.0);
        }
    }
}

fn rng() -> (StdRng, SeedGuard) {
    let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ ((std::process::id() as u64) << 40)
    });
    eprintln!("TF_SEED={seed}");
    (StdRng::seed_from_u64(seed), SeedGuard(seed))
}

fn gpu(a: Arithmetic) -> CudaBackend {
    CudaBackend::with_arithmetic(0, Precision::Full, a).unwrap_or_else(|e| panic!("no CUDA backend: {e}"))
}

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// A random `[n, k]` weight of `dtype` (BF16 or F16): its raw bytes and its values as f32.
fn weight_bits(dtype: DType, n: usize, k: usize, rng: &mut StdRng) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::with_capacity(2 * n * k);
    let mut vals = Vec::with_capacity(n * k);
    for _ in 0..n * k {
        let (h, v) = if dtype == DType::F16 {
            let h: u16 = (rng.gen_range(1u16..16) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000);
            (h, tf_quant::f16_bits_to_f32(h))
        } else {
            let v: f32 = rng.gen_range(-1.0..1.0);
            let h = (v.to_bits() >> 16) as u16;
            (h, f32::from_bits((h as u32) << 16))
        };
        bytes.extend_from_slice(&h.to_le_bytes());
        vals.push(v);
    }
    (bytes, vals)
}

fn up(be: &dyn Backend, dtype: DType, n: usize, k: usize, bytes: &[u8]) -> Weight {
    let info = TensorInfo { name: "w".into(), dtype, shape: vec![n as u64, k as u64] };
    be.upload(&info, bytes).unwrap_or_else(|e| panic!("{e}"))
}

fn pick(x: &[f32], k: usize, rows: &[usize]) -> Tensor {
    Tensor::host(rows.len(), k, rows.iter().flat_map(|&r| x[r * k..(r + 1) * k].iter().copied()).collect())
}

/// (a) and (b) for one weight type and shape: every row count, a random target row alone and at a random index;
/// the batch within the bound of the f32 reference; and the tensor result not the portable one.
/// `t`: the tensor arithmetic, `p`: the portable one, `c`: the CPU's full precision.
struct Backends {
    t: CudaBackend,
    p: CudaBackend,
    c: CpuBackend,
}

fn check(rng: &mut StdRng, be: &Backends, dtype: DType, n: usize, k: usize, with_bias: bool, device_input: bool) {
    let (t, p, c) = (&be.t, &be.p, &be.c);
    let pool = 300;
    let (bytes, wv) = weight_bits(dtype, n, k, rng);
    let x = values(rng, pool * k, 2.0);
    let bias = values(rng, n, 1.0);
    let (wt, wp, wc) = (up(t, dtype, n, k, &bytes), up(p, dtype, n, k, &bytes), up(c, dtype, n, k, &bytes));
    let bt = t.upload_f32("b", &[n], bias.clone()).unwrap();
    let bc = c.upload_f32("b", &[n], bias.clone()).unwrap();
    let what = format!("{dtype} [{n}, {k}] bias {with_bias} device input {device_input}");
    let on_t = |rows: &[usize]| {
        let xt = pick(&x, k, rows);
        let xt = if device_input { t.select_rows(&xt, &(0..rows.len()).collect::<Vec<_>>()) } else { xt };
        t.to_host(&t.matmul(&xt, &wt, with_bias.then_some(&bt)))
    };
    let mut differs = false;
    for &count in &ROW_COUNTS {
        let target = rng.gen_range(0..pool);
        let alone = on_t(&[target]);
        let at = rng.gen_range(0..count);
        let rows: Vec<usize> = (0..count).map(|i| if i == at { target } else { rng.gen_range(0..pool) }).collect();
        let batch = on_t(&rows);
        same(&batch[at * n..(at + 1) * n], &alone, &format!("{what}: row alone vs at {at} of {count}"));
        // (b) |y - y_ref| ≤ 2^-8 · Σ_k |x_k w_k| + 1e-30: rounding x to the weight type moves each product by at
        // most 2^-9 of itself (2^-11 for f16), f32 accumulation adds far less.
        let want = c.to_host(&c.matmul(&pick(&x, k, &rows), &wc, with_bias.then_some(&bc)));
        for (i, &r) in rows.iter().enumerate() {
            for col in 0..n {
                let mag: f64 = (0..k).map(|j| (x[r * k + j] as f64 * wv[col * k + j] as f64).abs()).sum();
                let (got, exp) = (batch[i * n + col] as f64, want[i * n + col] as f64);
                let bound = mag / 256.0 + 1e-30;
                assert!(
                    (got - exp).abs() <= bound,
                    "{what}: row {i} of {count}, column {col}: {got:e} vs reference {exp:e} (bound {bound:e})"
                );
            }
        }
        let portable = p.to_host(&p.matmul(&pick(&x, k, &rows), &wp, None));
        let plain = if with_bias { t.to_host(&t.matmul(&pick(&x, k, &rows), &wt, None)) } else { batch.clone() };
        differs |= plain.iter().zip(&portable).any(|(a, b)| a.to_bits() != b.to_bits());
    }
    if k.is_multiple_of(32) {
        assert!(differs, "{what}: the tensor arithmetic gave the portable bits everywhere (did it run?)");
    }
}

#[test]
fn tensor_matmul_is_row_exact_and_close_to_f32() {
    let (mut rng, _g) = rng();
    let be =
        Backends { t: gpu(Arithmetic::Tensor), p: gpu(Arithmetic::Portable), c: CpuBackend::new(4, Precision::Full) };
    for dtype in [DType::BF16, DType::F16] {
        // Shapes: one column; columns not a multiple of 8 or 32; K of one chunk, of fewer chunks than K-parts, of
        // many chunks; K not a multiple of 32 (the portable kernel, still row-exact); enough columns for the wide
        // small-row kernel (`mma_*_s`, from 8,448 columns; fewer take `mma_*_sn`).
        for (n, k) in [(1, 64), (75, 512), (9, 32), (40, 96), (33, 1536), (130, 2048), (17, 24), (8456, 64)] {
            check(&mut rng, &be, dtype, n, k, n % 2 == 1, false);
        }
        check(&mut rng, &be, dtype, 75, 512, true, true);
    }
}

#[test]
fn tensor_arithmetic_is_named_and_portable_stays_default() {
    let t = gpu(Arithmetic::Tensor);
    assert!(t.describe().ends_with(", tensor)"), "{}", t.describe());
    assert_eq!(t.arithmetic(), Arithmetic::Tensor);
    let p = CudaBackend::new(0, Precision::Full).unwrap();
    assert!(p.describe().ends_with(", portable)"), "{}", p.describe());
    assert_eq!(Arithmetic::default(), Arithmetic::Portable);
}

/// Several weights against the same rows in one launch (`matmul_many`: q/k/v) and gate/up with the GLU in one
/// launch (`matmul_glu`) give exactly the bits of separate `matmul` calls (and `glu`), for every small row count
/// and past it (where they fall back to separate calls).
#[test]
fn tensor_many_and_glu_in_one_launch_equal_separate_calls() {
    let (mut rng, _g) = rng();
    let t = gpu(Arithmetic::Tensor);
    for dtype in [DType::BF16, DType::F16] {
        for k in [32, 96, 1536] {
            let ns = [75, 40, 130];
            let ws: Vec<Weight> =
                ns.iter().map(|&n| up(&t, dtype, n, k, &weight_bits(dtype, n, k, &mut rng).0)).collect();
            let bias = t.upload_f32("b", &[40], values(&mut rng, 40, 1.0)).unwrap();
            let (gate, upw) = (&ws[0], &up(&t, dtype, 75, k, &weight_bits(dtype, 75, k, &mut rng).0));
            for rows in [1, 2, 5, 8, 16, 17] {
                let x = t.select_rows(
                    &Tensor::host(rows, k, values(&mut rng, rows * k, 2.0)),
                    &(0..rows).collect::<Vec<_>>(),
                );
                let what = format!("{dtype} K {k}, {rows} rows");
                for count in [2, 3] {
                    let list: Vec<(&Weight, Option<&Weight>)> =
                        (0..count).map(|i| (&ws[i], (i == 1).then_some(&bias))).collect();
                    let fused = t.matmul_many(&x, &list);
                    for (i, (w, b)) in list.iter().enumerate() {
                        let alone = t.to_host(&t.matmul(&x, w, *b));
                        same(&t.to_host(&fused[i]), &alone, &format!("{what}: matmul_many of {count}, weight {i}"));
                    }
                }
                for act in [tf_core::GluAct::Silu, tf_core::GluAct::GeluTanh] {
                    let fused = t.to_host(&t.matmul_glu(&x, gate, upw, act));
                    let split = t.glu(&t.matmul(&x, gate, None), &t.matmul(&x, upw, None), act);
                    same(&fused, &t.to_host(&split), &format!("{what}: matmul_glu {act:?}"));
                }
            }
        }
    }
}

fn has_half(x: &Tensor) -> bool {
    let s = x.device.as_ref().expect("a device tensor");
    s.downcast_ref::<tf_backend_cuda::CudaTensor>().expect("a CUDA tensor").half.is_some()
}

/// Window activations come with a copy rounded to the weights' half type, written by the kernel that produces them
/// (RMSNorm with and without the residual add, the gate/up + GLU kernel), and the small tensor-core kernels read
/// that copy instead of rounding x themselves: every matmul of such an activation (one weight, several, gate/up +
/// GLU, the down-projection of the GLU's output) equals the same matmul of the same values without a copy, bitwise,
/// for both half types. Copies exist for windows of 8..=16 rows only, and an in-place op drops them.
#[test]
fn half_copies_of_window_activations_change_no_bits() {
    let (mut rng, _g) = rng();
    for dtype in [DType::BF16, DType::F16] {
        let t = gpu(Arithmetic::Tensor);
        for k in [96, 1536] {
            let mk = |rng: &mut StdRng, n: usize, k: usize| up(&t, dtype, n, k, &weight_bits(dtype, n, k, rng).0);
            let ws: Vec<Weight> = [130, 40, 64].iter().map(|&n| mk(&mut rng, n, k)).collect();
            let (gate, upw, down) = (mk(&mut rng, 96, k), mk(&mut rng, 96, k), mk(&mut rng, 40, 96));
            let nw = t.upload_f32("norm", &[k], values(&mut rng, k, 1.0)).unwrap();
            let bias = t.upload_f32("b", &[40], values(&mut rng, 40, 1.0)).unwrap();
            for rows in [1, 5, 8, 11, 16, 17] {
                let dev = |v: Vec<f32>| t.select_rows(&Tensor::host(rows, k, v), &(0..rows).collect::<Vec<_>>());
                let mut a = dev(values(&mut rng, rows * k, 4.0));
                let d = dev(values(&mut rng, rows * k, 4.0));
                let normed = [t.add_rms_norm(&mut a, &d, &nw, 1e-6), t.rms_norm(&a, &nw, k, 1e-6)];
                for (which, h) in normed.iter().enumerate() {
                    let what = format!("{dtype} K {k}, {rows} rows, norm {which}");
                    assert_eq!(has_half(h), (8..=16).contains(&rows), "{what}: half copy");
                    let plain = dev(t.to_host(h));
                    assert!(!has_half(&plain));
                    for w in &ws {
                        let got = t.to_host(&t.matmul(h, w, None));
                        same(&got, &t.to_host(&t.matmul(&plain, w, None)), &format!("{what}: matmul {:?}", w.shape));
                    }
                    let list: Vec<(&Weight, Option<&Weight>)> =
                        ws.iter().enumerate().map(|(i, w)| (w, (i == 1).then_some(&bias))).collect();
                    let (many, many_plain) = (t.matmul_many(h, &list), t.matmul_many(&plain, &list));
                    for i in 0..list.len() {
                        same(&t.to_host(&many[i]), &t.to_host(&many_plain[i]), &format!("{what}: many, weight {i}"));
                    }
                    for act in [tf_core::GluAct::Silu, tf_core::GluAct::GeluTanh] {
                        let g = t.matmul_glu(h, &gate, &upw, act);
                        let g_plain = t.matmul_glu(&plain, &gate, &upw, act);
                        same(&t.to_host(&g), &t.to_host(&g_plain), &format!("{what}: glu {act:?}"));
                        assert_eq!(has_half(&g), (8..=16).contains(&rows), "{what}: glu half copy");
                        let gp = g_plain.rows;
                        let g_host = t.select_rows(&Tensor::host(gp, 96, t.to_host(&g)), &(0..gp).collect::<Vec<_>>());
                        let y = t.to_host(&t.matmul(&g, &down, None));
                        same(&y, &t.to_host(&t.matmul(&g_host, &down, None)), &format!("{what}: down {act:?}"));
                    }
                }
                // An in-place op drops the copy (it would be stale).
                let [mut h, _] = normed;
                t.scale(&mut h, 2.0);
                assert!(!has_half(&h), "{dtype} {rows} rows: scaled in place, copy dropped");
            }
        }
    }
}

/// `matmul_add` in the tensor arithmetic (the tensor-core kernels adding into the residual in their epilogue) gives
/// exactly `matmul` then `add`: every small-row kernel (1, 5, 8 and 16 rows; windows of 8..=16 with the half copy of
/// x the GLU writes) and the large-row one (17, 40), BF16 and F16, with and without a bias; the residual's shared
/// storage is left untouched and the result carries no stale half copy.
#[test]
fn tensor_matmul_add_equals_matmul_then_add() {
    let (mut rng, _g) = rng();
    let t = gpu(Arithmetic::Tensor);
    for dtype in [DType::BF16, DType::F16] {
        let (n, k, f) = (160, 96, 224);
        let (gate, upw) = (
            up(&t, dtype, f, k, &weight_bits(dtype, f, k, &mut rng).0),
            up(&t, dtype, f, k, &weight_bits(dtype, f, k, &mut rng).0),
        );
        let down = up(&t, dtype, n, f, &weight_bits(dtype, n, f, &mut rng).0);
        let o = up(&t, dtype, n, k, &weight_bits(dtype, n, k, &mut rng).0);
        let bias = t.upload_f32("b", &[n], values(&mut rng, n, 1.0)).unwrap();
        for rows in [1, 5, 8, 16, 17, 40] {
            let dev =
                |v: Vec<f32>, cols: usize| t.select_rows(&Tensor::host(rows, cols, v), &(0..rows).collect::<Vec<_>>());
            let resid = dev(values(&mut rng, rows * n, 30.0), n);
            let before = t.to_host(&resid);
            let h = dev(values(&mut rng, rows * k, 2.0), k);
            // The GLU's output: a window's carries a half copy the down-projection reads.
            let g = t.matmul_glu(&h, &gate, &upw, tf_core::GluAct::Silu);
            for (what, x, w) in [("o", &h, &o), ("down", &g, &down)] {
                for b in [None, Some(&bias)] {
                    let what = format!("{dtype} {rows} rows, {what}, bias {}", b.is_some());
                    let mut acc = resid.clone();
                    t.matmul_add(x, w, b, &mut acc);
                    let mut split = resid.clone();
                    t.add(&mut split, &t.matmul(x, w, b));
                    same(&t.to_host(&acc), &t.to_host(&split), &format!("{what}: matmul_add vs matmul + add"));
                    assert!(!has_half(&acc), "{what}: no half copy on the sum");
                    same(&t.to_host(&resid), &before, &format!("{what}: the shared residual untouched"));
                }
            }
        }
    }
}
