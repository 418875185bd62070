//! Every op of `CudaBackend` against the CPU backend (which equals the scalar reference), bit for bit, and
//! row-exactness on the GPU: a row computed alone equals the same row at a random index among R-1 random rows, for
//! R in 1..=256. Needs a CUDA device: without one these tests fail (they never pass vacuously).
//!
//! Random data from a fresh seed per run, printed on failure; set `TF_SEED` to replay one.
#![cfg(feature = "cuda")]

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::CpuBackend;
use tf_backend_cuda::CudaBackend;
use tf_core::{
    AttnMeta, AttnParams, Backend, DType, GluAct, KvSpec, Precision, Rope, RopeKv, RopeScaling, RopeStyle, RowAttn,
    Tensor, TensorInfo, Weight,
};
use tf_testkit::rows::values;

const ROW_COUNTS: [usize; 9] = [1, 2, 3, 5, 8, 16, 33, 64, 256];

/// A row op under test: computes the op on the listed rows of the caller's pool, returns the host result.
type RowOp<'a> = &'a dyn Fn(&dyn Backend, &[usize]) -> Vec<f32>;

const ALL_TYPES: [DType; 15] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q8_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::Q8K,
];

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

fn gpu(p: Precision) -> CudaBackend {
    CudaBackend::new(0, p).unwrap_or_else(|e| panic!("no CUDA backend: {e}"))
}

fn cpu(p: Precision) -> CpuBackend {
    CpuBackend::new(4, p)
}

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// Random raw bytes of a `[out, inn]` weight of `dtype` with finite, modest scales.
fn random_weight(dtype: DType, out: usize, inn: usize, rng: &mut StdRng) -> Vec<u8> {
    let n = out * inn;
    match dtype {
        DType::F32 => return values(rng, n, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => {
            return (0..n)
                .flat_map(|_| {
                    let h: u16 =
                        (rng.gen_range(1u16..15) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000);
                    h.to_le_bytes()
                })
                .collect()
        }
        DType::BF16 => {
            return values(rng, n, 1.0).iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect()
        }
        _ => {}
    }
    let bb = dtype.block_bytes();
    let mut w = vec![0u8; n / dtype.block_size() * bb];
    rng.fill(&mut w[..]);
    let f16_fields: &[usize] = match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        _ => &[],
    };
    for blk in w.chunks_exact_mut(bb) {
        for &at in f16_fields {
            let h = (rng.gen_range(8u16..15) << 10) | rng.gen_range(0u16..1024) | (rng.gen::<u16>() & 0x8000);
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        if dtype == DType::Q8K {
            blk[0..4].copy_from_slice(&rng.gen_range(-0.01f32..0.01).to_le_bytes());
        }
    }
    w
}

fn info(name: &str, dtype: DType, shape: &[usize]) -> TensorInfo {
    TensorInfo { name: name.into(), dtype, shape: shape.iter().map(|&d| d as u64).collect() }
}

fn up(be: &dyn Backend, name: &str, dtype: DType, shape: &[usize], bytes: &[u8]) -> Weight {
    be.upload(&info(name, dtype, shape), bytes).unwrap_or_else(|e| panic!("{e}"))
}

/// Row-exactness of a row op on the GPU, and GPU == CPU on every batch: `op(be, rows)` computes the op on the
/// given rows (indices into the caller's pool) and returns the host result `[R, cols]`.
fn check_rows(rng: &mut StdRng, pool: usize, cols: usize, op: RowOp, g: &dyn Backend, c: &dyn Backend, what: &str) {
    for &count in &ROW_COUNTS {
        let target = rng.gen_range(0..pool);
        let alone = op(g, &[target]);
        let at = rng.gen_range(0..count);
        let rows: Vec<usize> = (0..count).map(|i| if i == at { target } else { rng.gen_range(0..pool) }).collect();
        let batch = op(g, &rows);
        same(&batch[at * cols..(at + 1) * cols], &alone, &format!("{what}: row alone vs at {at} of {count}"));
        let want = op(c, &rows);
        same(&batch, &want, &format!("{what}: cuda vs cpu, {count} rows"));
    }
}

fn pick(x: &[f32], cols: usize, rows: &[usize]) -> Tensor {
    let data = rows.iter().flat_map(|&r| x[r * cols..(r + 1) * cols].iter().copied()).collect();
    Tensor::host(rows.len(), cols, data)
}

#[test]
fn matmul_every_type_and_precision() {
    let (mut rng, _g) = rng();
    for precision in [Precision::Checkpoint, Precision::Full] {
        let (g, c) = (gpu(precision), cpu(precision));
        for dtype in ALL_TYPES {
            let (n, k, pool) = (75, 512, 300);
            let w = random_weight(dtype, n, k, &mut rng);
            let x = values(&mut rng, pool * k, 2.0);
            let bias = values(&mut rng, n, 1.0);
            let (wg, wc) = (up(&g, "w", dtype, &[n, k], &w), up(&c, "w", dtype, &[n, k], &w));
            let (bg, bc) = (g.upload_f32("b", &[n], bias.clone()).unwrap(), c.upload_f32("b", &[n], bias).unwrap());
            let with_bias = (dtype as usize).is_multiple_of(2);
            let op = |be: &dyn Backend, rows: &[usize]| {
                let (w, b) = if be.describe().starts_with("cuda") { (&wg, &bg) } else { (&wc, &bc) };
                be.to_host(&be.matmul(&pick(&x, k, rows), w, if with_bias { Some(b) } else { None }))
            };
            check_rows(&mut rng, pool, n, &op, &g, &c, &format!("matmul {dtype} {}", precision.name()));
        }
    }
}

#[test]
fn matmul_shapes_and_device_inputs() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Checkpoint), cpu(Precision::Checkpoint));
    for (dtype, n, k) in
        [(DType::Q4K, 1, 256), (DType::Q8_0, 33, 32 * 45), (DType::Q6K, 9, 256 * 9), (DType::F16, 17, 24)]
    {
        let w = random_weight(dtype, n, k, &mut rng);
        let x = values(&mut rng, 7 * k, 3.0);
        let (wg, wc) = (up(&g, "w", dtype, &[n, k], &w), up(&c, "w", dtype, &[n, k], &w));
        // A device-resident input (from select_rows) gives the same bits as a host one.
        let xt = Tensor::host(7, k, x.clone());
        let xd = g.select_rows(&xt, &[0, 1, 2, 3, 4, 5, 6]);
        same(
            &g.to_host(&g.matmul(&xd, &wg, None)),
            &c.to_host(&c.matmul(&xt, &wc, None)),
            &format!("{dtype} [{n}, {k}]"),
        );
    }
}

#[test]
fn rms_norm_rows_and_heads() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    for (cols, group, wdt) in
        [(576, 576, DType::F32), (512, 64, DType::BF16), (1536, 128, DType::F16), (40, 40, DType::F32)]
    {
        let pool = 300;
        let x = values(&mut rng, pool * cols, 4.0);
        let w = random_weight(wdt, 1, group, &mut rng);
        let (wg, wc) = (up(&g, "n", wdt, &[group], &w), up(&c, "n", wdt, &[group], &w));
        let op = |be: &dyn Backend, rows: &[usize]| {
            let w = if be.describe().starts_with("cuda") { &wg } else { &wc };
            be.to_host(&be.rms_norm(&pick(&x, cols, rows), w, group, 1e-6))
        };
        check_rows(&mut rng, pool, cols, &op, &g, &c, &format!("rms_norm {cols}/{group}"));
    }
}

#[test]
fn rope_styles_and_scalings() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let ropes = [
        Rope { theta: 10000.0, rot_dims: 64, style: RopeStyle::Normal, scaling: RopeScaling::None },
        Rope { theta: 1e6, rot_dims: 128, style: RopeStyle::Neox, scaling: RopeScaling::None },
        Rope { theta: 5e5, rot_dims: 32, style: RopeStyle::Neox, scaling: RopeScaling::Linear { factor: 4.0 } },
        Rope {
            theta: 5e5,
            rot_dims: 128,
            style: RopeStyle::Neox,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 8192.0,
            },
        },
        Rope {
            theta: 150_000.0,
            rot_dims: 64,
            style: RopeStyle::Neox,
            scaling: RopeScaling::Yarn {
                factor: 32.0,
                original_context: 4096.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                truncate: false,
                mscale: 0.1 * 32f64.ln() + 1.0,
            },
        },
    ];
    for rope in ropes {
        let (hd, heads, pool) = (128.max(rope.rot_dims), 3, 300);
        let cols = hd * heads;
        let x = values(&mut rng, pool * cols, 3.0);
        let pos: Vec<u32> = (0..pool).map(|_| rng.gen_range(0..200_000)).collect();
        let op = |be: &dyn Backend, rows: &[usize]| {
            let mut t = pick(&x, cols, rows);
            let p: Vec<u32> = rows.iter().map(|&r| pos[r]).collect();
            be.rope(&mut t, &p, hd, &rope);
            be.to_host(&t)
        };
        check_rows(&mut rng, pool, cols, &op, &g, &c, &format!("rope {rope:?}"));
    }
}

#[test]
fn elementwise_ops() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let (pool, cols) = (300, 333);
    let a = values(&mut rng, pool * cols, 30.0);
    let b = values(&mut rng, pool * cols, 30.0);
    for act in [GluAct::Silu, GluAct::GeluTanh, GluAct::SwigluClamp { alpha: 1.702, limit: 7.0 }] {
        let op =
            |be: &dyn Backend, rows: &[usize]| be.to_host(&be.glu(&pick(&a, cols, rows), &pick(&b, cols, rows), act));
        check_rows(&mut rng, pool, cols, &op, &g, &c, &format!("glu {act:?}"));
    }
    let op = |be: &dyn Backend, rows: &[usize]| {
        let mut t = pick(&a, cols, rows);
        be.add(&mut t, &pick(&b, cols, rows));
        be.scale(&mut t, 0.37);
        be.to_host(&t)
    };
    check_rows(&mut rng, pool, cols, &op, &g, &c, "add + scale");
    // The experts' combine: rows listed in any order, some twice, onto a device-resident accumulator.
    let (n, r) = (90, 40);
    let rows: Vec<usize> = (0..n).map(|_| rng.gen_range(0..r)).collect();
    let scales: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.5f32..1.5)).collect();
    let sel: Vec<usize> = (0..r).collect();
    let (y, acc) = (Tensor::host(n, cols, b[..n * cols].to_vec()), Tensor::host(r, cols, a[..r * cols].to_vec()));
    let (mut ag, mut ac) = (g.select_rows(&acc, &sel), acc.clone());
    g.add_rows_scaled(&mut ag, &g.select_rows(&y, &(0..n).collect::<Vec<_>>()), &rows, &scales);
    c.add_rows_scaled(&mut ac, &y, &rows, &scales);
    same(&g.to_host(&ag), &ac.host, "add_rows_scaled");
    // In-place ops on a shared device tensor leave the clone alone.
    let t = g.select_rows(&Tensor::host(2, cols, a[..2 * cols].to_vec()), &[1, 0]);
    let mut t2 = t.clone();
    g.scale(&mut t2, 2.0);
    same(&g.to_host(&t)[..cols], &a[cols..2 * cols], "clone untouched by scale");
    let doubled: Vec<f32> = a[cols..2 * cols].iter().map(|v| v * 2.0).collect();
    same(&g.to_host(&t2)[..cols], &doubled, "scaled copy");
}

#[test]
fn embed_every_type_and_select_rows() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    for dtype in ALL_TYPES {
        let (vocab, hidden) = (50, 512);
        let w = random_weight(dtype, vocab, hidden, &mut rng);
        let (tg, tc) = (up(&g, "e", dtype, &[vocab, hidden], &w), up(&c, "e", dtype, &[vocab, hidden], &w));
        let ids: Vec<u32> = (0..37).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let (eg, ec) = (g.embed(&tg, &ids), c.embed(&tc, &ids));
        same(&g.to_host(&eg), &c.to_host(&ec), &format!("embed {dtype}"));
        let pick: Vec<usize> = (0..9).map(|_| rng.gen_range(0..ids.len())).collect();
        same(&g.to_host(&g.select_rows(&eg, &pick)), &c.to_host(&c.select_rows(&ec, &pick)), "select_rows");
    }
}

#[test]
fn argmax_rows_matches_the_host_rule() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    for &cols in &[1usize, 2, 31, 32, 33, 1000, 1025, 4099, 151_936, 152_064] {
        for rows in [1, 2, 7, 16, 20, rng.gen_range(1..=20)] {
            let data: Vec<f32> = (0..rows).flat_map(|_| tf_testkit::rows::argmax_row(&mut rng, cols)).collect();
            let host = Tensor::host(rows, cols, data);
            let want: Vec<u32> = (0..rows).map(|r| tf_core::argmax_row(host.row(r))).collect();
            assert_eq!(c.argmax_rows(&host), want, "cpu {rows}×{cols}");
            // A host tensor (uploaded) and a device one (rows in another order, from a kernel).
            assert_eq!(g.argmax_rows(&host), want, "cuda, host input, {rows}×{cols}");
            let order: Vec<usize> = (0..rows).rev().collect();
            let dev = g.select_rows(&host, &order);
            let copied = g.to_host(&dev);
            let want_rev: Vec<u32> = order.iter().map(|&r| want[r]).collect();
            let from_copy: Vec<u32> = copied.chunks_exact(cols).map(tf_core::argmax_row).collect();
            assert_eq!(from_copy, want_rev, "{rows}×{cols}: the device copy");
            assert_eq!(g.argmax_rows(&dev), want_rev, "cuda, device input, {rows}×{cols}");
        }
    }
    assert!(g.argmax_rows(&Tensor::zeros(0, 9)).is_empty());
    assert_eq!(g.argmax_rows(&Tensor::zeros(4, 0)), vec![0; 4]);
}

/// A KV pool filled identically on both backends, with scrambled block tables.
struct KvCase {
    spec: KvSpec,
    tables: Vec<Vec<u32>>,
}

fn fill_kv(rng: &mut StdRng, be: &dyn Backend, spec: KvSpec, kvals: &[f32], vvals: &[f32]) -> tf_core::KvCache {
    let mut kv = be.alloc_kv(spec).unwrap();
    let width = spec.kv_heads * spec.head_dim;
    let slots = spec.blocks * spec.block_size;
    let all: Vec<u32> = (0..slots as u32).collect();
    for layer in 0..spec.layers {
        let o = layer * slots * width;
        let k = Tensor::host(slots, width, kvals[o..o + slots * width].to_vec());
        let v = Tensor::host(slots, width, vvals[o..o + slots * width].to_vec());
        be.kv_write(&mut kv, layer, &k, &v, &all);
    }
    let _ = rng;
    kv
}

#[test]
fn attention_paged_gqa_windows_softcap_and_trees() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let configs = [
        (4, 2, 64, None, None),
        (8, 1, 128, Some(100u32), None),
        (2, 2, 256, None, Some(30.0f32)),
        (6, 3, 16, Some(7), Some(5.0)),
        (12, 2, 128, None, None),
        (14, 2, 128, Some(300), None),
        (15, 3, 32, None, Some(20.0)),
    ];
    // Forced to one head per block, and to several heads of a KV group per block (2, 4 of 8, 6, 7 and 5 of a group),
    // then the default choice by block count: the same bits every way.
    for ((heads, kv_heads, hd, window, softcap), cap) in configs.into_iter().flat_map(|c| [(c, 1), (c, 7), (c, 0)]) {
        g.tune(|t| t.attn_heads = cap);
        let spec = KvSpec { layers: 2, blocks: 96, block_size: 16, kv_heads, head_dim: hd };
        let slots = spec.blocks * spec.block_size;
        let width = kv_heads * hd;
        let kvals = values(&mut rng, spec.layers * slots * width, 2.0);
        let vvals = values(&mut rng, spec.layers * slots * width, 2.0);
        let (kg, kc) = (fill_kv(&mut rng, &g, spec, &kvals, &vvals), fill_kv(&mut rng, &c, spec, &kvals, &vvals));
        // Three sequences with scrambled, disjoint block tables of up to 600 positions (3 chunks of 256).
        let mut blocks: Vec<u32> = (0..spec.blocks as u32).collect();
        blocks.shuffle(&mut rng);
        let case = KvCase { spec, tables: blocks.chunks(32).take(3).map(|b| b[..30].to_vec()).collect() };
        let _ = case.spec;
        // A pool of rows: causal rows at random positions, and tree rows with ancestors past their ctx.
        let pool = 120;
        let metas: Vec<RowAttn> = (0..pool)
            .map(|i| {
                let seq = rng.gen_range(0..3);
                let table = &case.tables[seq];
                if i % 3 == 0 {
                    let ctx = rng.gen_range(1..440u32);
                    let mut tree = Vec::new();
                    let mut p = ctx;
                    for _ in 0..rng.gen_range(1..5) {
                        p += rng.gen_range(0..3);
                        let slot = table[p as usize / 16] * 16 + p % 16;
                        tree.push((p, slot));
                        p += 1;
                    }
                    RowAttn { pos: tree.last().unwrap().0, seq, ctx, tree }
                } else {
                    let pos = rng.gen_range(0..470u32);
                    RowAttn { pos, seq, ctx: pos + 1, tree: vec![] }
                }
            })
            .collect();
        let q = values(&mut rng, pool * heads * hd, 1.0);
        // Sink logits (gpt-oss) for the head counts that are not multiples of 4.
        let sinks = (heads % 4 != 0).then(|| (0..heads).map(|_| rng.gen_range(-3.0f32..5.0)).collect());
        let p = AttnParams { heads, kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt(), window, softcap, sinks };
        let layer = 1;
        let op = |be: &dyn Backend, rows: &[usize]| {
            let kv = if be.describe().starts_with("cuda") { &kg } else { &kc };
            let meta =
                AttnMeta { block_tables: case.tables.clone(), rows: rows.iter().map(|&r| metas[r].clone()).collect() };
            be.to_host(&be.attention(&pick(&q, heads * hd, rows), kv, layer, &meta, &p))
        };
        check_rows(
            &mut rng,
            pool,
            heads * hd,
            &op,
            &g,
            &c,
            &format!(
                "attention h{heads}/{kv_heads} d{hd} w{window:?} cap{softcap:?} sinks {} heads per block ≤ {cap}",
                p.sinks.is_some()
            ),
        );
    }
    g.tune(|t| t.attn_heads = 0);
}

#[test]
fn kv_copy_in_order_then_attention_sees_it() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let spec = KvSpec { layers: 3, blocks: 8, block_size: 4, kv_heads: 2, head_dim: 32 };
    let slots = spec.blocks * spec.block_size;
    let width = 64;
    let kvals = values(&mut rng, spec.layers * slots * width, 2.0);
    let vvals = values(&mut rng, spec.layers * slots * width, 2.0);
    let (mut kg, mut kc) = (fill_kv(&mut rng, &g, spec, &kvals, &vvals), fill_kv(&mut rng, &c, spec, &kvals, &vvals));
    // 9 → 2 then 2 → 5: applied in order, so slot 5 gets slot 9's values.
    for be_kv in [(&g as &dyn Backend, &mut kg), (&c as &dyn Backend, &mut kc)] {
        be_kv.0.kv_copy(be_kv.1, &[9, 2, 14], &[2, 5, 0]);
    }
    let table: Vec<u32> = (0..8).collect();
    let q = values(&mut rng, 4 * width, 1.0);
    let p = AttnParams { heads: 2, kv_heads: 2, head_dim: 32, scale: 0.2, window: None, softcap: None, sinks: None };
    for layer in 0..3 {
        // Each row attends exactly one slot (ctx 1 of a table that starts at that slot's block).
        for slot in [0u32, 2, 5, 9] {
            let meta = AttnMeta {
                block_tables: vec![table.clone()],
                rows: vec![RowAttn { pos: slot, seq: 0, ctx: slot + 1, tree: vec![] }],
            };
            let qt = Tensor::host(1, width, q[..width].to_vec());
            let og = g.to_host(&g.attention(&qt, &kg, layer, &meta, &p));
            let oc = c.to_host(&c.attention(&qt, &kc, layer, &meta, &p));
            same(&og, &oc, &format!("after kv_copy, layer {layer}, ctx through slot {slot}"));
        }
    }
}

/// The fused residual add + RMSNorm equals `add` then `rms_norm` on the GPU bit for bit (both the updated residual
/// and the normed output), equals the CPU's (whose default is the unfused pair), and is row-exact, for row counts
/// 1..=256; rows longer than one shared-memory chunk (4096) included.
#[test]
fn add_rms_norm_equals_add_then_rms_norm() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let pool = 300;
    let mut counts = vec![1, 7, 16, 33, 64, 100, 256];
    counts.extend((0..5).map(|_| rng.gen_range(1..=256)));
    for (cols, wdt) in [(1536, DType::F32), (3584, DType::BF16), (5000, DType::F32), (40, DType::F16)] {
        let a = values(&mut rng, pool * cols, 30.0);
        let b = values(&mut rng, pool * cols, 30.0);
        let w = random_weight(wdt, 1, cols, &mut rng);
        let (wg, wc) = (up(&g, "n", wdt, &[cols], &w), up(&c, "n", wdt, &[cols], &w));
        let eps = 1e-6;
        // On the GPU with device-resident inputs (fused, then unfused), and on the CPU from host tensors.
        let dev = |rows: &[usize], x: &[f32]| g.select_rows(&pick(x, cols, rows), &(0..rows.len()).collect::<Vec<_>>());
        let fused = |rows: &[usize]| {
            let (mut x, d) = (dev(rows, &a), dev(rows, &b));
            let y = g.add_rms_norm(&mut x, &d, &wg, eps);
            (g.to_host(&x), g.to_host(&y))
        };
        for &count in &counts {
            let target = rng.gen_range(0..pool);
            let at = rng.gen_range(0..count);
            let rows: Vec<usize> = (0..count).map(|i| if i == at { target } else { rng.gen_range(0..pool) }).collect();
            let what = format!("add_rms_norm {cols} {wdt:?}, {count} rows");
            let (sum, y) = fused(&rows);
            let mut x2 = dev(&rows, &a);
            g.add(&mut x2, &dev(&rows, &b));
            let y2 = g.rms_norm(&x2, &wg, cols, eps);
            same(&sum, &g.to_host(&x2), &format!("{what}: residual, fused vs add"));
            same(&y, &g.to_host(&y2), &format!("{what}: output, fused vs add + rms_norm"));
            let mut xc = pick(&a, cols, &rows);
            let yc = c.add_rms_norm(&mut xc, &pick(&b, cols, &rows), &wc, eps);
            same(&sum, &c.to_host(&xc), &format!("{what}: residual, cuda vs cpu"));
            same(&y, &c.to_host(&yc), &format!("{what}: output, cuda vs cpu"));
            let (sum1, y1) = fused(&[target]);
            same(&sum[at * cols..(at + 1) * cols], &sum1, &format!("{what}: residual, row alone vs at {at}"));
            same(&y[at * cols..(at + 1) * cols], &y1, &format!("{what}: output, row alone vs at {at}"));
        }
        // Host inputs, and a residual whose storage is shared: the clone keeps its values.
        let rows = [3, 1, 4];
        let x = dev(&rows, &a);
        let mut x2 = x.clone();
        let y = g.add_rms_norm(&mut x2, &pick(&b, cols, &rows), &wg, eps);
        same(&g.to_host(&x), &pick(&a, cols, &rows).host, "add_rms_norm: clone untouched");
        let (sum, want) = fused(&rows);
        same(&g.to_host(&x2), &sum, "add_rms_norm: host delta, residual");
        same(&g.to_host(&y), &want, "add_rms_norm: host delta, output");
    }
}

fn interleaved(w: &Weight) -> bool {
    w.storage.downcast_ref::<tf_backend_cuda::CudaWeight>().expect("a CUDA weight").interleaved
}

/// Float matrices stored interleaved (the portable arithmetic's opt-in layout for rows of whole 64/128-element blocks)
/// against the CPU bit for bit, and row-exact, at 1, 7, 16, 33 and 64 rows: row lengths that are whole blocks
/// The gate/up matmuls and the GLU in one launch (`matmul_glu`, one row, interleaved weights) equal `matmul` twice
/// then `glu` on the GPU and the CPU's default, bitwise, for both activations; several rows take the unfused path.
#[test]
fn matmul_glu_in_one_launch_matches_matmul_then_glu() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    g.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    for (dtype, n, k) in [(DType::BF16, 700, 1024), (DType::F16, 129, 512), (DType::F32, 37, 256)] {
        let (gw, uw) = (random_weight(dtype, n, k, &mut rng), random_weight(dtype, n, k, &mut rng));
        let (gg, ug) = (up(&g, "gate", dtype, &[n, k], &gw), up(&g, "up", dtype, &[n, k], &uw));
        let (gc, uc) = (up(&c, "gate", dtype, &[n, k], &gw), up(&c, "up", dtype, &[n, k], &uw));
        assert!(interleaved(&gg) && interleaved(&ug), "{dtype} layout");
        for act in [GluAct::Silu, GluAct::GeluTanh] {
            for rows in [1usize, 1, 3] {
                let what = format!("{dtype} [{n}, {k}] {act:?}, {rows} rows");
                let x = Tensor::host(rows, k, values(&mut rng, rows * k, 2.0));
                let fused = g.to_host(&g.matmul_glu(&x, &gg, &ug, act));
                let split = g.glu(&g.matmul(&x, &gg, None), &g.matmul(&x, &ug, None), act);
                same(&fused, &g.to_host(&split), &format!("{what}: fused vs matmul + glu"));
                same(&fused, &c.to_host(&c.matmul_glu(&x, &gc, &uc, act)), &format!("{what}: cuda vs cpu"));
            }
        }
    }
}

/// RoPE of q and k and the K/V write in one launch (`rope_kv_write`) equal `rope`, `rope`, `kv_write` on the GPU
/// and the CPU's default, bitwise: the rotated q and k, and the cache as attention reads it (every slot of the
/// layer, written or not, through a full-context attention of a few query rows; the other layer untouched).
/// Full and partial rotation (the unrotated dimensions copied as they are), both styles, 1 to 33 rows at scattered
/// slots, q with more heads than k.
#[test]
fn rope_kv_write_equals_rope_then_kv_write() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    let ropes = [
        Rope { theta: 1e6, rot_dims: 128, style: RopeStyle::Neox, scaling: RopeScaling::None },
        Rope { theta: 10000.0, rot_dims: 64, style: RopeStyle::Normal, scaling: RopeScaling::None },
        Rope { theta: 5e5, rot_dims: 32, style: RopeStyle::Neox, scaling: RopeScaling::Linear { factor: 4.0 } },
    ];
    let (hd, hq, hk) = (128, 6, 2);
    let spec = KvSpec { layers: 2, blocks: 16, block_size: 4, kv_heads: hk, head_dim: hd };
    let nslots = spec.blocks * spec.block_size;
    let width = hk * hd;
    let p = AttnParams { heads: hq, kv_heads: hk, head_dim: hd, scale: 0.09, window: None, softcap: None, sinks: None };
    for rope in ropes {
        for rows in [1usize, 7, 16, 33] {
            let what = format!("rope_kv_write {rope:?}, {rows} rows");
            let mut slots: Vec<u32> = (0..nslots as u32).collect();
            slots.shuffle(&mut rng);
            slots.truncate(rows);
            let positions: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..100_000)).collect();
            let at = RopeKv { positions: &positions, slots: &slots, head_dim: hd, rope: &rope };
            let probe = values(&mut rng, 3 * hq * hd, 1.0);
            let (q, k, v) = (
                values(&mut rng, rows * hq * hd, 3.0),
                values(&mut rng, rows * width, 3.0),
                values(&mut rng, rows * width, 3.0),
            );
            let run = |be: &dyn Backend, fused: bool| {
                let mut kv = be.alloc_kv(spec).unwrap();
                let (mut qt, mut kt, vt) = (
                    Tensor::host(rows, hq * hd, q.clone()),
                    Tensor::host(rows, width, k.clone()),
                    Tensor::host(rows, width, v.clone()),
                );
                if fused {
                    be.rope_kv_write(&mut qt, &mut kt, &vt, &mut kv, 1, &at);
                } else {
                    be.rope(&mut qt, &positions, hd, &rope);
                    be.rope(&mut kt, &positions, hd, &rope);
                    be.kv_write(&mut kv, 1, &kt, &vt, &slots);
                }
                let table: Vec<u32> = (0..spec.blocks as u32).collect();
                let meta = AttnMeta {
                    block_tables: vec![table],
                    rows: (0..3)
                        .map(|_| RowAttn { pos: nslots as u32 - 1, seq: 0, ctx: nslots as u32, tree: vec![] })
                        .collect(),
                };
                let probe = Tensor::host(3, hq * hd, probe.clone());
                let seen: Vec<Vec<f32>> =
                    (0..2).map(|l| be.to_host(&be.attention(&probe, &kv, l, &meta, &p))).collect();
                (be.to_host(&qt), be.to_host(&kt), seen)
            };
            let (fused, split, cpu) = (run(&g, true), run(&g, false), run(&c, true));
            for (name, other) in [("split", &split), ("cpu", &cpu)] {
                same(&fused.0, &other.0, &format!("{what}: q, fused vs {name}"));
                same(&fused.1, &other.1, &format!("{what}: k, fused vs {name}"));
                for l in 0..2 {
                    same(
                        &fused.2[l],
                        &other.2[l],
                        &format!("{what}: layer {l} as attention reads it, fused vs {name}"),
                    );
                }
            }
        }
    }
}

/// The attention block up to the cache write in one call (`norm_qkv_rope_kv_write`: for one row, `rms_norm` then
/// one launch whose q/k blocks compute rotation pairs and rotate them in their epilogue, k and v going into the
/// cache) equals the same call with the epilogue off (the projections, then `rope_kv_write`), the shallower kernel for
/// large grids (`_il1_qkv_rope_w`) and the CPU's default, bitwise: q, k, v and the cache as attention reads it. Both
/// rotation styles with the whole head rotated (fused), a partial rotation (not fused), every float weight type, biases
/// on some projections, 1 and 3 rows.
#[test]
fn norm_qkv_rope_kv_write_equals_its_two_calls() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    g.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    g.tune(|t| t.norm_fuse = 0);
    let eps = 1e-6;
    let cases = [
        (DType::BF16, 128, Rope { theta: 1e6, rot_dims: 128, style: RopeStyle::Neox, scaling: RopeScaling::None }),
        (DType::F16, 64, Rope { theta: 1e4, rot_dims: 64, style: RopeStyle::Normal, scaling: RopeScaling::None }),
        (DType::F32, 64, Rope { theta: 5e5, rot_dims: 64, style: RopeStyle::Neox, scaling: RopeScaling::None }),
        (DType::BF16, 128, Rope { theta: 1e4, rot_dims: 64, style: RopeStyle::Neox, scaling: RopeScaling::None }),
    ];
    let (hq, hk, k) = (6, 2, 512);
    // Each case at its own block width (`CudaTuning::il_cols`; 0: the default): the same bits at any width.
    for ((dtype, hd, rope), cols) in cases.into_iter().zip([0, 16, 2, 8]) {
        g.tune(|t| {
            t.interleave = true;
            t.il_cols = cols;
        });
        let spec = KvSpec { layers: 2, blocks: 16, block_size: 4, kv_heads: hk, head_dim: hd };
        let nslots = spec.blocks * spec.block_size;
        let p =
            AttnParams { heads: hq, kv_heads: hk, head_dim: hd, scale: 0.09, window: None, softcap: None, sinks: None };
        let ns = [hq * hd, hk * hd, hk * hd];
        let nw = random_weight(DType::F32, 1, k, &mut rng);
        let (ng, nc) = (up(&g, "norm", DType::F32, &[k], &nw), up(&c, "norm", DType::F32, &[k], &nw));
        let (mut wg, mut wc, mut bg, mut bc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for n in ns {
            let w = random_weight(dtype, n, k, &mut rng);
            wg.push(up(&g, "w", dtype, &[n, k], &w));
            wc.push(up(&c, "w", dtype, &[n, k], &w));
            assert!(interleaved(wg.last().unwrap()), "{dtype} [{n}, {k}] layout");
            let b = values(&mut rng, n, 1.0);
            bg.push(g.upload_f32("b", &[n], b.clone()).unwrap());
            bc.push(c.upload_f32("b", &[n], b).unwrap());
        }
        for (rows, biased) in [(1usize, [true, true, true]), (1, [false, true, false]), (3, [true, false, true])] {
            let what = format!("{dtype} hd {hd} {rope:?}, {rows} rows, biases {biased:?}, {cols} cols");
            let list = |ws: &[Weight], bs: &[Weight]| -> Vec<(Weight, Option<Weight>)> {
                (0..3).map(|i| (ws[i].clone(), biased[i].then(|| bs[i].clone()))).collect()
            };
            let mut slots: Vec<u32> = (0..nslots as u32).collect();
            slots.shuffle(&mut rng);
            slots.truncate(rows);
            let positions: Vec<u32> = (0..rows).map(|_| rng.gen_range(0..100_000)).collect();
            let at = RopeKv { positions: &positions, slots: &slots, head_dim: hd, rope: &rope };
            let x = Tensor::host(rows, k, values(&mut rng, rows * k, 30.0));
            let probe = Tensor::host(3, hq * hd, values(&mut rng, 3 * hq * hd, 1.0));
            let run = |be: &dyn Backend, owned: Vec<(Weight, Option<Weight>)>, norm: &Weight| {
                let ws: Vec<(&Weight, Option<&Weight>)> = owned.iter().map(|(w, b)| (w, b.as_ref())).collect();
                let ws: [(&Weight, Option<&Weight>); 3] = ws.try_into().unwrap();
                let mut kv = be.alloc_kv(spec).unwrap();
                let out = be.norm_qkv_rope_kv_write(&x, norm, eps, &ws, &mut kv, 1, &at);
                let table: Vec<u32> = (0..spec.blocks as u32).collect();
                let row = RowAttn { pos: nslots as u32 - 1, seq: 0, ctx: nslots as u32, tree: vec![] };
                let meta = AttnMeta { block_tables: vec![table], rows: vec![row; 3] };
                let seen: Vec<Vec<f32>> =
                    (0..2).map(|l| be.to_host(&be.attention(&probe, &kv, l, &meta, &p))).collect();
                (out.iter().map(|t| be.to_host(t)).collect::<Vec<_>>(), seen)
            };
            let fused = run(&g, list(&wg, &bg), &ng);
            // The shallower kernel (picked by occupancy for grids the default does not hold), forced here.
            g.tune(|t| t.qkv_wide = Some(true));
            let wide = run(&g, list(&wg, &bg), &ng);
            g.tune(|t| t.qkv_wide = None);
            g.tune(|t| t.qkv_rope = false);
            let split = run(&g, list(&wg, &bg), &ng);
            g.tune(|t| t.qkv_rope = true);
            let cpu = run(&c, list(&wc, &bc), &nc);
            for (name, other) in [("wide", &wide), ("split", &split), ("cpu", &cpu)] {
                for (i, t) in ["q", "k", "v"].iter().enumerate() {
                    same(&fused.0[i], &other.0[i], &format!("{what}: {t}, fused vs {name}"));
                }
                for l in 0..2 {
                    same(
                        &fused.1[l],
                        &other.1[l],
                        &format!("{what}: layer {l} as attention reads it, fused vs {name}"),
                    );
                }
            }
        }
    }
}

/// q/k/v- and gate/up-like sets of interleaved weights against one row through `matmul_many` (one launch of
/// `_il1_many`) equal the same weights one `matmul` at a time and the CPU, bitwise; with several rows, mixed types or
/// four weights (separate calls) too.
#[test]
fn matmul_many_in_one_launch_matches_separate_calls() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    g.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    let k = 1024;
    let sets: [(&[DType], &[usize], &[bool]); 6] = [
        (&[DType::BF16; 3], &[300, 64, 64], &[true, true, true]),
        (&[DType::BF16; 2], &[700, 700], &[false, false]),
        (&[DType::F16; 3], &[129, 3, 65], &[false, true, false]),
        (&[DType::F32; 2], &[1, 37], &[true, false]),
        (&[DType::BF16, DType::F16], &[40, 40], &[false, false]),
        (&[DType::BF16; 4], &[8, 9, 10, 11], &[false, false, true, false]),
    ];
    for (dtypes, ns, biased) in sets {
        let mut wg = Vec::new();
        let mut wc = Vec::new();
        for (i, (&dtype, &n)) in dtypes.iter().zip(ns).enumerate() {
            let w = random_weight(dtype, n, k, &mut rng);
            wg.push(up(&g, "w", dtype, &[n, k], &w));
            wc.push(up(&c, "w", dtype, &[n, k], &w));
            assert!(interleaved(&wg[i]), "{dtype} [{n}, {k}] layout");
        }
        let mut bg = Vec::new();
        let mut bc = Vec::new();
        for &n in ns {
            let b = values(&mut rng, n, 1.0);
            bg.push(g.upload_f32("b", &[n], b.clone()).unwrap());
            bc.push(c.upload_f32("b", &[n], b).unwrap());
        }
        fn list<'a>(ws: &'a [Weight], bs: &'a [Weight], biased: &[bool]) -> Vec<(&'a Weight, Option<&'a Weight>)> {
            ws.iter().zip(bs).zip(biased).map(|((w, b), &on)| (w, on.then_some(b))).collect()
        }
        for rows in [1usize, 1, 3] {
            let x = values(&mut rng, rows * k, 2.0);
            let xt = Tensor::host(rows, k, x);
            let what = format!("{dtypes:?} {ns:?}, {rows} rows");
            let many = g.matmul_many(&xt, &list(&wg, &bg, biased));
            let cpu = c.matmul_many(&xt, &list(&wc, &bc, biased));
            assert_eq!(many.len(), ns.len(), "{what}: outputs");
            for (i, &(w, b)) in list(&wg, &bg, biased).iter().enumerate() {
                let got = g.to_host(&many[i]);
                same(&got, &g.to_host(&g.matmul(&xt, w, b)), &format!("{what}: weight {i}, many vs one call"));
                same(&got, &c.to_host(&cpu[i]), &format!("{what}: weight {i}, cuda vs cpu"));
            }
        }
    }
}

/// The decode step's fused projections equal their unfused ops on the GPU and the CPU's defaults, bitwise:
/// `norm_matmul_many` (q/k/v-like sets) and `norm_matmul_glu` (every block norming the row itself in one launch for
/// one row up to 4096 wide, the GLU narrower than 4096; more rows or wider ones take rms_norm then the projection)
/// against `rms_norm` then `matmul_many` / `matmul_glu`, and `matmul_add` (the one-row kernel adding into the
/// residual) against `matmul` then `add`, with and without a bias, the residual's shared storage left untouched.
/// Residual values up to ±30, so the norm's scale matters; norm weights of every float type; more column groups
/// than resident blocks.
#[test]
fn fused_norm_and_residual_projections_match_the_unfused_ops() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    // The default block width, then the narrowest and the widest (`CudaTuning::il_cols`): the same bits at any width.
    for cols in [0, 2, 16] {
        fused_cases(&g, &c, &mut rng, true, cols);
    }
}

/// The same ops on weights uploaded unpermuted (`matmul_float`'s row groups, which add into the residual in their
/// epilogue for `matmul_add`, for one row as for several) equal the CPU too.
#[test]
fn fused_ops_on_unpermuted_weights_match_the_cpu() {
    let (mut rng, _g) = rng();
    let (g, c) = (gpu(Precision::Full), cpu(Precision::Full));
    fused_cases(&g, &c, &mut rng, false, 0);
}

fn fused_cases(g: &CudaBackend, c: &CpuBackend, rng: &mut StdRng, interleave: bool, cols: u32) {
    g.tune(|t| {
        t.interleave = interleave;
        t.il_cols = cols;
    });
    g.tune(|t| t.norm_fuse = 3); // both fused kernels, whatever the default
    let eps = 1e-6;
    // The last two have more column groups than the GPU holds blocks (an H200 holds ~1,200 of `_il1_many_norm`'s
    // and ~800 of `_il1_glu_norm`'s), so blocks loop over several after norming once.
    let cases: [(DType, usize, &[usize], DType); 7] = [
        (DType::BF16, 3584, &[300, 64, 64], DType::BF16),
        (DType::F16, 1024, &[129, 3, 65], DType::F32),
        (DType::F32, 512, &[37, 1], DType::F16),
        (DType::BF16, 4096, &[64, 33], DType::F32),
        (DType::BF16, 4224, &[16, 16], DType::BF16),
        (DType::BF16, 1024, &[4096, 512, 512], DType::F32),
        (DType::F16, 512, &[8960, 8960], DType::BF16),
    ];
    for (dtype, k, ns, ndt) in cases {
        let nw = random_weight(ndt, 1, k, rng);
        let (ng, nc) = (up(g, "norm", ndt, &[k], &nw), up(c, "norm", ndt, &[k], &nw));
        let mut wg = Vec::new();
        let mut wc = Vec::new();
        let mut bg = Vec::new();
        let mut bc = Vec::new();
        for &n in ns {
            let w = random_weight(dtype, n, k, rng);
            wg.push(up(g, "w", dtype, &[n, k], &w));
            wc.push(up(c, "w", dtype, &[n, k], &w));
            assert_eq!(interleaved(wg.last().unwrap()), interleave, "{dtype} [{n}, {k}] layout");
            let b = values(rng, n, 1.0);
            bg.push(g.upload_f32("b", &[n], b.clone()).unwrap());
            bc.push(c.upload_f32("b", &[n], b).unwrap());
        }
        // Biases on the first and third weights.
        fn list<'a>(ws: &'a [Weight], bs: &'a [Weight]) -> Vec<(&'a Weight, Option<&'a Weight>)> {
            ws.iter().zip(bs).enumerate().map(|(i, (w, b))| (w, (i % 2 == 0).then_some(b))).collect()
        }
        let (lg, lc) = (list(&wg, &bg), list(&wc, &bc));
        for rows in [1usize, 1, 3] {
            let what = format!("{dtype} {ns:?} K {k}, norm {ndt}, {rows} rows, {cols} cols (0: default)");
            let x = Tensor::host(rows, k, values(rng, rows * k, 30.0));
            // The residual on the device, as the model holds it.
            let xd = g.select_rows(&x, &(0..rows).collect::<Vec<_>>());
            let fused = g.norm_matmul_many(&xd, &ng, eps, &lg);
            let split = g.matmul_many(&g.rms_norm(&xd, &ng, k, eps), &lg);
            let cpu = c.norm_matmul_many(&x, &nc, eps, &lc);
            for i in 0..ns.len() {
                let got = g.to_host(&fused[i]);
                same(&got, &g.to_host(&split[i]), &format!("{what}: weight {i}, norm_matmul_many vs rms_norm + many"));
                same(&got, &c.to_host(&cpu[i]), &format!("{what}: weight {i}, norm_matmul_many cuda vs cpu"));
            }
            same(&g.to_host(&xd), &x.host, &format!("{what}: the residual is only read"));
            for act in [GluAct::Silu, GluAct::GeluTanh] {
                // Gate and up: the first two weights when their widths agree, else the first twice.
                let j = if ns.len() > 1 && ns[1] == ns[0] { 1 } else { 0 };
                let (gate, upw) = (&wg[0], &wg[j]);
                let fused = g.to_host(&g.norm_matmul_glu(&xd, &ng, eps, gate, upw, act));
                let split = g.matmul_glu(&g.rms_norm(&xd, &ng, k, eps), gate, upw, act);
                same(&fused, &g.to_host(&split), &format!("{what}: norm_matmul_glu {act:?} vs rms_norm + glu"));
                let cpu = c.norm_matmul_glu(&x, &nc, eps, &wc[0], &wc[j], act);
                same(&fused, &c.to_host(&cpu), &format!("{what}: norm_matmul_glu {act:?} cuda vs cpu"));
            }
            // matmul_add: a [K, K] weight (interleaved when asked: K is whole blocks) takes a [rows, K] input to
            // the residual.
            let n0 = k;
            let w = random_weight(dtype, k, n0, rng);
            let (og, oc) = (up(g, "o", dtype, &[k, n0], &w), up(c, "o", dtype, &[k, n0], &w));
            assert_eq!(interleaved(&og), interleave, "{dtype} [{k}, {n0}] layout");
            let b = values(rng, k, 1.0);
            let (obg, obc) = (g.upload_f32("ob", &[k], b.clone()).unwrap(), c.upload_f32("ob", &[k], b).unwrap());
            let h = Tensor::host(rows, n0, values(rng, rows * n0, 2.0));
            for bias in [false, true] {
                let what = format!("{what}: matmul_add [{k}, {n0}], bias {bias}");
                let mut acc = xd.clone();
                g.matmul_add(&h, &og, bias.then_some(&obg), &mut acc);
                let mut split = xd.clone();
                g.add(&mut split, &g.matmul(&h, &og, bias.then_some(&obg)));
                let got = g.to_host(&acc);
                same(&got, &g.to_host(&split), &format!("{what}: vs matmul + add"));
                // Both one-row kernels forced in turn (`_il1_add_d`, `_il1_add`): occupancy picked one of them above.
                for forced in [true, false] {
                    g.tune(|t| t.add_deep = Some(forced));
                    let mut other = xd.clone();
                    g.matmul_add(&h, &og, bias.then_some(&obg), &mut other);
                    same(&got, &g.to_host(&other), &format!("{what}: vs the deeper kernel {forced}"));
                }
                g.tune(|t| t.add_deep = None);
                let mut accc = x.clone();
                c.matmul_add(&h, &oc, bias.then_some(&obc), &mut accc);
                same(&got, &c.to_host(&accc), &format!("{what}: cuda vs cpu"));
                same(&g.to_host(&xd), &x.host, &format!("{what}: the clone's storage untouched"));
            }
        }
    }
}

/// (block counts 1, 5, 11, 12, 17 and 19: partial and whole batches of the one-row kernel's 8 vectors and the row
/// groups' 4) and that are not (those stay unpermuted), N not a multiple of the block width, with 1-D and 2-D
/// (interleaved) biases. A wrong map in the upload or in any reader gives other sums (the lane chains would
/// accumulate other elements, or in another order).
#[test]
fn interleaved_float_weights_match_the_cpu() {
    let (mut rng, _g) = rng();
    let counts = [1usize, 7, 16, 33, 64];
    let cases: [(DType, usize, usize, Precision); 10] = [
        (DType::BF16, 75, 1408, Precision::Full),
        (DType::BF16, 256, 2176, Precision::Full),
        (DType::BF16, 2100, 1536, Precision::Full),
        (DType::BF16, 4200, 1408, Precision::Full),
        (DType::BF16, 75, 200, Precision::Full),
        (DType::F16, 4200, 640, Precision::Checkpoint),
        (DType::F16, 33, 96, Precision::Full),
        (DType::F32, 75, 64 * 19, Precision::Full),
        (DType::F32, 256, 96, Precision::Checkpoint),
        (DType::BF16, 75, 128, Precision::Checkpoint),
    ];
    let (gf, gc, cf, cc) =
        (gpu(Precision::Full), gpu(Precision::Checkpoint), cpu(Precision::Full), cpu(Precision::Checkpoint));
    // Interleaving is on by default (`CudaTuning::interleave`): on for these two backends either way.
    gf.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    gc.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    for (dtype, n, k, precision) in cases {
        let (g, c): (&dyn Backend, &dyn Backend) = if precision == Precision::Full { (&gf, &cf) } else { (&gc, &cc) };
        let block = if dtype == DType::F32 { 64 } else { 128 };
        let what = format!("{dtype} [{n}, {k}] {}", precision.name());
        let w = random_weight(dtype, n, k, &mut rng);
        let (wg, wc) = (up(g, "w", dtype, &[n, k], &w), up(c, "w", dtype, &[n, k], &w));
        assert_eq!(interleaved(&wg), k % block == 0, "{what}: layout");
        // A bias as a vector, or (N a whole number of blocks) as a [1, N] matrix, which is interleaved too.
        let bias = values(&mut rng, n, 1.0);
        let bshape: &[usize] = if n % block == 0 { &[1, n] } else { &[n] };
        let (bg, bc) = (g.upload_f32("b", bshape, bias.clone()).unwrap(), c.upload_f32("b", bshape, bias).unwrap());
        assert_eq!(interleaved(&bg), bshape.len() == 2, "{what}: bias layout");
        let with_bias = n != 75;
        let pool = 80;
        let x = values(&mut rng, pool * k, 2.0);
        let run = |be: &dyn Backend, w: &Weight, b: &Weight, rows: &[usize]| {
            be.to_host(&be.matmul(&pick(&x, k, rows), w, if with_bias { Some(b) } else { None }))
        };
        for &count in &counts {
            let rows: Vec<usize> = (0..count).map(|_| rng.gen_range(0..pool)).collect();
            let got = run(g, &wg, &bg, &rows);
            same(&got, &run(c, &wc, &bc, &rows), &format!("{what}: cuda vs cpu, {count} rows"));
            let at = rng.gen_range(0..count);
            let alone = run(g, &wg, &bg, &[rows[at]]);
            same(&got[at * n..(at + 1) * n], &alone, &format!("{what}: row alone vs at {at} of {count}"));
        }
    }
    // A tied embedding: one interleaved table gathered (embed) and multiplied (the lm_head), the gather's output
    // fed to the matmul on the device; and an RMSNorm weight given as an interleaved [1, n] matrix.
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let (vocab, hidden) = (300, 1024);
        let w = random_weight(dtype, vocab, hidden, &mut rng);
        let (tg, tc) = (up(&gf, "e", dtype, &[vocab, hidden], &w), up(&cf, "e", dtype, &[vocab, hidden], &w));
        assert!(interleaved(&tg), "{dtype} table");
        for &count in &counts {
            let ids: Vec<u32> = (0..count).map(|_| rng.gen_range(0..vocab as u32)).collect();
            let (eg, ec) = (gf.embed(&tg, &ids), cf.embed(&tc, &ids));
            same(&gf.to_host(&eg), &cf.to_host(&ec), &format!("tied {dtype}: embed, {count} rows"));
            let (lg, lc) = (gf.matmul(&eg, &tg, None), cf.matmul(&ec, &tc, None));
            same(&gf.to_host(&lg), &cf.to_host(&lc), &format!("tied {dtype}: logits, {count} rows"));
        }
        let nw = random_weight(dtype, 1, hidden, &mut rng);
        let (ng, nc) = (up(&gf, "n", dtype, &[1, hidden], &nw), up(&cf, "n", dtype, &[1, hidden], &nw));
        assert!(interleaved(&ng), "{dtype} norm as a matrix");
        let x = values(&mut rng, 33 * hidden, 4.0);
        let xt = Tensor::host(33, hidden, x.clone());
        same(
            &gf.to_host(&gf.rms_norm(&xt, &ng, hidden, 1e-6)),
            &cf.to_host(&cf.rms_norm(&xt, &nc, hidden, 1e-6)),
            &format!("rms_norm with an interleaved {dtype} weight"),
        );
        let (mut ag, mut ac) = (Tensor::host(33, hidden, x.clone()), Tensor::host(33, hidden, x));
        let d = Tensor::host(33, hidden, values(&mut rng, 33 * hidden, 4.0));
        let (yg, yc) = (gf.add_rms_norm(&mut ag, &d, &ng, 1e-6), cf.add_rms_norm(&mut ac, &d, &nc, 1e-6));
        same(&gf.to_host(&yg), &cf.to_host(&yc), &format!("add_rms_norm with an interleaved {dtype} weight"));
    }
    // The tensor arithmetic reads the checkpoint order: nothing is interleaved there.
    let t = tf_backend_cuda::CudaBackend::with_arithmetic(0, Precision::Full, tf_backend_cuda::Arithmetic::Tensor)
        .unwrap_or_else(|e| panic!("{e}"));
    t.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    let w = random_weight(DType::BF16, 8, 256, &mut rng);
    assert!(!interleaved(&up(&t, "w", DType::BF16, &[8, 256], &w)), "tensor arithmetic");
}
