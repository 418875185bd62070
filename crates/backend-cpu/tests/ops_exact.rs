//! Exactness of every non-matmul op of `CpuBackend` (DESIGN.md §2):
//! 1. every ISA level and thread count gives the scalar reference's bits (`tf_quant::reference::ops`);
//! 2. row-exactness: a row computed alone equals the same row at a random index among R-1 random rows;
//! 3. attention: paged KV through scrambled block tables, GQA, sliding windows, softcaps, tree rows;
//!    plus accuracy sanity checks of attention and RoPE against plain f64 math.
//!
//! Random data from a fresh seed per run (time-based), printed on failure; set `TF_SEED` to replay one.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::{CpuBackend, Isa};
use tf_core::{
    AttnMeta, AttnParams, Backend, DType, GluAct, KvSpec, Precision, Rope, RopeScaling, RopeStyle, RowAttn, Tensor,
    TensorInfo,
};
use tf_quant::reference::ops as r;
use tf_testkit::rows::values;

const ROW_COUNTS: [usize; 8] = [1, 2, 3, 5, 8, 16, 33, 64];

/// Prints the seed when the test fails (cargo shows a failing test's stderr).
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
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 40
    });
    eprintln!("TF_SEED={seed}");
    (StdRng::seed_from_u64(seed), SeedGuard(seed))
}

/// Every ISA level with 1 and 3 threads.
fn backends() -> Vec<CpuBackend> {
    Isa::available().into_iter().flat_map(|isa| [1, 3].map(|t| CpuBackend::with_isa(t, Precision::Full, isa))).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// Row-exactness of a row op: `row` alone gives the same bits as at a random index among R-1 rows from `other`.
/// `op(backend, rows)` gets the rows' indices into the caller's pool of rows and returns `[R, cols]`.
fn check_row_exact(
    rng: &mut StdRng,
    backends: &[CpuBackend],
    pool_rows: usize,
    op: &dyn Fn(&CpuBackend, &[usize]) -> Tensor,
    what: &str,
) {
    for &count in &ROW_COUNTS {
        let target = rng.gen_range(0..pool_rows);
        let at = rng.gen_range(0..count);
        let rows: Vec<usize> = (0..count).map(|i| if i == at { target } else { rng.gen_range(0..pool_rows) }).collect();
        for be in backends {
            let solo = op(be, &[target]);
            let batch = op(be, &rows);
            same(batch.row(at), solo.row(0), &format!("{what}: {} row at {at} of {count}", be.describe()));
        }
    }
}

fn gather(x: &Tensor, rows: &[usize]) -> Tensor {
    let mut out = Tensor::zeros(rows.len(), x.cols);
    for (i, &r) in rows.iter().enumerate() {
        out.row_mut(i).copy_from_slice(x.row(r));
    }
    out
}

/// Raw little-endian bytes of `n` random finite values of `dtype` (F32, F16 or BF16), magnitudes about 2^-5..2^5.
fn float_bytes(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<u8> {
    (0..n)
        .flat_map(|_| {
            let v = values(rng, 1, 8.0)[0];
            match dtype {
                DType::F32 => v.to_le_bytes().to_vec(),
                DType::F16 => {
                    let h =
                        (rng.gen_range(0..2u16) << 15) | (rng.gen_range(10..=20u16) << 10) | rng.gen_range(0..1024u16);
                    h.to_le_bytes().to_vec()
                }
                DType::BF16 => ((v.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                _ => unreachable!(),
            }
        })
        .collect()
}

/// Uploads `bytes` as a `[n]` vector weight of `dtype`; returns it with the f32 values it stands for.
fn vector_weight(be: &CpuBackend, bytes: &[u8], n: usize, dtype: DType) -> (tf_core::Weight, Vec<f32>) {
    let info = TensorInfo { name: "norm".into(), dtype, shape: vec![n as u64] };
    let exact = tf_quant::dequantize_to_vec(dtype, bytes, n).unwrap();
    (be.upload(&info, bytes).unwrap(), exact)
}

#[test]
fn rms_norm_matches_reference_and_is_row_exact() {
    let (mut rng, _g) = rng();
    let bes = backends();
    for &(group, groups) in &[(64, 1), (896, 1), (67, 3), (128, 4), (1, 5), (15, 2), (2048, 1)] {
        let cols = group * groups;
        let n = 70;
        let x = Tensor::host(n, cols, values(&mut rng, n * cols, 3.0));
        let dtype = [DType::F32, DType::F16, DType::BF16][rng.gen_range(0..3)];
        let w_bytes = float_bytes(&mut rng, group, dtype);
        let eps = [1e-5f32, 1e-6, 0.0][rng.gen_range(0..3)];
        // Weights uploaded per backend; the same values for all.
        let weights: Vec<_> = bes.iter().map(|be| vector_weight(be, &w_bytes, group, dtype)).collect();
        let want = r::rms_norm(&x, &weights[0].1, group, eps);
        for (be, (w, _)) in bes.iter().zip(&weights) {
            let got = be.rms_norm(&x, w, group, eps);
            same(&got.host, &want.host, &format!("rms_norm {} group {group}×{groups} {dtype}", be.describe()));
            // A second call hits the converted-weight cache.
            same(&be.rms_norm(&x, w, group, eps).host, &want.host, "rms_norm again");
        }
        let op = |be: &CpuBackend, rows: &[usize]| {
            let i = bes.iter().position(|b| std::ptr::eq(b, be)).unwrap();
            be.rms_norm(&gather(&x, rows), &weights[i].0, group, eps)
        };
        check_row_exact(&mut rng, &bes, n, &op, &format!("rms_norm group {group}"));
    }
}

fn random_rope(rng: &mut StdRng, head_dim: usize) -> Rope {
    let rot_dims = [head_dim, head_dim / 2 / 2 * 2, 2][rng.gen_range(0..3)].max(2);
    let scaling = match rng.gen_range(0..4) {
        0 => RopeScaling::None,
        1 => RopeScaling::Linear { factor: rng.gen_range(1.0..8.0) },
        2 => RopeScaling::Yarn {
            factor: 32.0,
            original_context: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: rng.gen(),
            mscale: 0.1 * 32f64.ln() + 1.0,
        },
        _ => RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 },
    };
    let style = if rng.gen() { RopeStyle::Normal } else { RopeStyle::Neox };
    Rope { theta: [10_000.0, 500_000.0, 1_000_000.0][rng.gen_range(0..3)], rot_dims, style, scaling }
}

fn random_positions(rng: &mut StdRng, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| match rng.gen_range(0..10) {
            0 => rng.gen_range(100_000..300_000), // past the cached table (128 Ki)
            1 => rng.gen_range(0..4),
            _ => rng.gen_range(0..5000),
        })
        .collect()
}

#[test]
fn rope_matches_reference_and_is_row_exact() {
    let (mut rng, _g) = rng();
    let bes = backends();
    for &(head_dim, heads) in &[(64, 4), (128, 2), (80, 3), (6, 5), (256, 1)] {
        for _ in 0..4 {
            let rope = random_rope(&mut rng, head_dim);
            let n = 50;
            let cols = heads * head_dim;
            let x = Tensor::host(n, cols, values(&mut rng, n * cols, 4.0));
            let positions = random_positions(&mut rng, n);
            let mut want = x.clone();
            r::rope(&mut want, &positions, head_dim, &rope);
            for be in &bes {
                let mut got = x.clone();
                be.rope(&mut got, &positions, head_dim, &rope);
                same(&got.host, &want.host, &format!("rope {} {rope:?} head_dim {head_dim}", be.describe()));
            }
            let op = |be: &CpuBackend, rows: &[usize]| {
                let mut t = gather(&x, rows);
                let pos: Vec<u32> = rows.iter().map(|&i| positions[i]).collect();
                be.rope(&mut t, &pos, head_dim, &rope);
                t
            };
            check_row_exact(&mut rng, &bes, n, &op, &format!("rope {rope:?}"));
        }
    }
}

#[test]
fn rope_is_accurate_against_f64() {
    let (mut rng, _g) = rng();
    let be = CpuBackend::new(2, Precision::Full);
    let head_dim = 128;
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        let rope = Rope { theta: 10_000.0, rot_dims: 96, style, scaling: RopeScaling::None };
        let positions: Vec<u32> = (0..200).map(|_| rng.gen_range(0..40_000)).collect();
        let x = Tensor::host(200, head_dim, values(&mut rng, 200 * head_dim, 2.0));
        let mut y = x.clone();
        be.rope(&mut y, &positions, head_dim, &rope);
        for (row, &p) in positions.iter().enumerate() {
            let (xr, yr) = (x.row(row), y.row(row));
            for i in 0..48 {
                let (i0, i1) = if style == RopeStyle::Normal { (2 * i, 2 * i + 1) } else { (i, i + 48) };
                let angle = p as f64 * 10_000f64.powf(-(2.0 * i as f64) / 96.0);
                let (x0, x1) = (xr[i0] as f64, xr[i1] as f64);
                let y0 = x0 * angle.cos() - x1 * angle.sin();
                let y1 = x0 * angle.sin() + x1 * angle.cos();
                let tol = 4e-7 * (x0.abs() + x1.abs()) + 1e-30;
                assert!((yr[i0] as f64 - y0).abs() <= tol, "rope y0 at pos {p} pair {i}: {} vs {y0}", yr[i0]);
                assert!((yr[i1] as f64 - y1).abs() <= tol, "rope y1 at pos {p} pair {i}: {} vs {y1}", yr[i1]);
            }
            assert_eq!(bits(&xr[96..]), bits(&yr[96..]), "dimensions past rot_dims are copied");
        }
    }
    // Llama 3.1 scaling: the frequency rule on its three ranges.
    let rope = Rope {
        theta: 500_000.0,
        rot_dims: 128,
        style: RopeStyle::Neox,
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 8192.0,
        },
    };
    let freqs = r::rope_freqs(&rope);
    let base = r::rope_freqs(&Rope { scaling: RopeScaling::None, ..rope });
    assert_eq!(freqs[0], base[0], "high frequencies are kept");
    assert_eq!(freqs[63], base[63] / 8.0, "low frequencies are divided by the factor");
    let wl = |f: f64| 2.0 * std::f64::consts::PI / f;
    let mid = (0..64).find(|&i| wl(base[i]) >= 2048.0 && wl(base[i]) <= 8192.0).expect("a smoothed frequency");
    assert!(freqs[mid] < base[mid] && freqs[mid] > base[mid] / 8.0, "smoothed frequency in between");
}

#[test]
fn glu_add_scale_match_reference_and_are_row_exact() {
    let (mut rng, _g) = rng();
    let bes = backends();
    for &cols in &[1, 7, 8, 9, 64, 100, 4864] {
        let n = 40;
        let mut gate = values(&mut rng, n * cols, 12.0);
        // Large and extreme inputs: the edges of exp's range.
        for v in gate.iter_mut().step_by(17) {
            *v = rng.gen_range(-150.0..150.0);
        }
        let gate = Tensor::host(n, cols, gate);
        let up = Tensor::host(n, cols, values(&mut rng, n * cols, 3.0));
        // The clamped SwiGLU with up values past its limit too.
        let up_wide = Tensor::host(n, cols, values(&mut rng, n * cols, 12.0));
        let clamp = GluAct::SwigluClamp { alpha: 1.702, limit: 7.0 };
        for act in [GluAct::Silu, GluAct::GeluTanh, clamp] {
            let upv = if act == clamp { &up_wide } else { &up };
            let mut want = vec![0f32; n * cols];
            r::glu(&gate.host, &upv.host, act, &mut want);
            for be in &bes {
                same(&be.glu(&gate, upv, act).host, &want, &format!("glu {act:?} {} cols {cols}", be.describe()));
            }
            let op = |be: &CpuBackend, rows: &[usize]| be.glu(&gather(&gate, rows), &gather(upv, rows), act);
            check_row_exact(&mut rng, &bes, n, &op, &format!("glu {act:?}"));
        }
        let s: f32 = rng.gen_range(-3.0..3.0);
        let mut want_add = gate.host.clone();
        r::add(&mut want_add, &up.host);
        let mut want_scale = gate.host.clone();
        r::scale(&mut want_scale, s);
        for be in &bes {
            let mut a = gate.clone();
            be.add(&mut a, &up);
            same(&a.host, &want_add, "add");
            let mut x = gate.clone();
            be.scale(&mut x, s);
            same(&x.host, &want_scale, "scale");
            let sel: Vec<usize> = (0..5).map(|_| rng.gen_range(0..n)).collect();
            same(&be.select_rows(&gate, &sel).host, &gather(&gate, &sel).host, "select_rows");
            assert_eq!(bits(&be.to_host(&gate)), bits(&gate.host));
        }
    }
}

/// The mixture-of-experts combine: the reference's bits, and each destination row's result depends only on its
/// own contributions (the same row alone, with only its entries in their order, gives the same bits).
#[test]
fn add_rows_scaled_matches_reference_and_is_row_exact() {
    let (mut rng, _g) = rng();
    let bes = backends();
    for &cols in &[1, 7, 64, 100] {
        for &r_rows in &ROW_COUNTS {
            let n = rng.gen_range(1..3 * r_rows + 2);
            let acc = Tensor::host(r_rows, cols, values(&mut rng, r_rows * cols, 4.0));
            let y = Tensor::host(n, cols, values(&mut rng, n * cols, 4.0));
            let rows: Vec<usize> = (0..n).map(|_| rng.gen_range(0..r_rows)).collect();
            let scales: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.5..1.5)).collect();
            let mut want = acc.clone();
            r::add_rows_scaled(&mut want, &y, &rows, &scales);
            for be in &bes {
                let mut got = acc.clone();
                be.add_rows_scaled(&mut got, &y, &rows, &scales);
                same(&got.host, &want.host, &format!("add_rows_scaled {} [{r_rows}, {cols}] n {n}", be.describe()));
            }
            let be = &bes[0];
            for dst in 0..r_rows {
                let mine: Vec<usize> = (0..n).filter(|&i| rows[i] == dst).collect();
                let mut alone = gather(&acc, &[dst]);
                let ys = gather(&y, &mine);
                let sc: Vec<f32> = mine.iter().map(|&i| scales[i]).collect();
                be.add_rows_scaled(&mut alone, &ys, &vec![0; mine.len()], &sc);
                same(&alone.host, want.row(dst), &format!("add_rows_scaled row {dst} alone vs among {r_rows}"));
            }
        }
    }
}

#[test]
fn embed_rows_are_the_dequantized_table() {
    let (mut rng, _g) = rng();
    for be in backends() {
        let (vocab, hidden) = (50, 96);
        let bytes = float_bytes(&mut rng, vocab * hidden, DType::F16);
        let info = TensorInfo { name: "tok".into(), dtype: DType::F16, shape: vec![vocab as u64, hidden as u64] };
        let table = be.upload(&info, &bytes).unwrap();
        let exact = tf_quant::dequantize_to_vec(DType::F16, &bytes, vocab * hidden).unwrap();
        let ids: Vec<u32> = (0..300).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let out = be.embed(&table, &ids);
        for (i, &id) in ids.iter().enumerate() {
            same(out.row(i), &exact[id as usize * hidden..(id as usize + 1) * hidden], "embed row");
        }
        assert!(be.upload_f32("bad", &[3, 2], vec![0.0; 5]).is_err());
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Attention

/// A paged KV pool with sequences written through scrambled block tables, plus loose "draft" slots for tree rows.
struct World {
    spec: KvSpec,
    /// Per layer, `[slots, kv_heads, head_dim]` K and V as the test wrote them.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Per sequence: block table and length.
    tables: Vec<Vec<u32>>,
    lens: Vec<u32>,
    /// Slots outside every block table, holding data (for tree entries).
    draft_slots: Vec<u32>,
}

impl World {
    /// `lens` sequences; sequence 1 (when there are ≥ 2) is a copy of sequence 0 stored in other blocks.
    fn build(
        rng: &mut StdRng,
        bes: &[CpuBackend],
        lens: &[u32],
        bs: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> (World, Vec<tf_core::KvCache>) {
        let need: usize = lens.iter().map(|&l| (l as usize).div_ceil(bs)).sum();
        let blocks = need + 4 + rng.gen_range(0..4);
        let spec = KvSpec { layers: 2, blocks, block_size: bs, kv_heads, head_dim };
        let mut ids: Vec<u32> = (0..blocks as u32).collect();
        ids.shuffle(rng);
        let mut next = 0;
        let tables: Vec<Vec<u32>> = lens
            .iter()
            .map(|&l| {
                let t = ids[next..next + (l as usize).div_ceil(bs)].to_vec();
                next += t.len();
                t
            })
            .collect();
        let draft_slots: Vec<u32> =
            ids[next..].iter().flat_map(|&b| (0..bs as u32).map(move |o| b * bs as u32 + o)).collect();
        let width = kv_heads * head_dim;
        let slots = blocks * bs;
        let mut k = vec![vec![0f32; slots * width]; 2];
        let mut v = vec![vec![0f32; slots * width]; 2];
        for layer in 0..2 {
            let (kl, vl) = (&mut k[layer], &mut v[layer]);
            let mut content: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
            for (s, (table, &len)) in tables.iter().zip(lens).enumerate() {
                for p in 0..len as usize {
                    let (kr, vr) =
                        if s == 1 { content[p].clone() } else { (values(rng, width, 2.0), values(rng, width, 3.0)) };
                    let slot = table[p / bs] as usize * bs + p % bs;
                    kl[slot * width..(slot + 1) * width].copy_from_slice(&kr);
                    vl[slot * width..(slot + 1) * width].copy_from_slice(&vr);
                    if s == 0 {
                        content.push((kr, vr));
                    }
                }
            }
            for &slot in &draft_slots {
                let slot = slot as usize;
                kl[slot * width..(slot + 1) * width].copy_from_slice(&values(rng, width, 2.0));
                vl[slot * width..(slot + 1) * width].copy_from_slice(&values(rng, width, 3.0));
            }
        }
        // Write every slot through kv_write, in random row groups.
        let caches = bes
            .iter()
            .map(|be| {
                let mut cache = be.alloc_kv(spec).unwrap();
                for layer in 0..2 {
                    let mut order: Vec<u32> = (0..slots as u32).collect();
                    order.shuffle(rng);
                    for part in order.chunks(rng.gen_range(1..40)) {
                        let kt = Tensor::host(
                            part.len(),
                            width,
                            part.iter()
                                .flat_map(|&s| k[layer][s as usize * width..(s as usize + 1) * width].to_vec())
                                .collect(),
                        );
                        let vt = Tensor::host(
                            part.len(),
                            width,
                            part.iter()
                                .flat_map(|&s| v[layer][s as usize * width..(s as usize + 1) * width].to_vec())
                                .collect(),
                        );
                        be.kv_write(&mut cache, layer, &kt, &vt, part);
                    }
                }
                cache
            })
            .collect();
        (World { spec, k, v, tables, lens: lens.to_vec(), draft_slots }, caches)
    }

    fn layer(&self, l: usize) -> r::KvLayer<'_> {
        r::KvLayer {
            k: &self.k[l],
            v: &self.v[l],
            block_size: self.spec.block_size,
            kv_heads: self.spec.kv_heads,
            head_dim: self.spec.head_dim,
        }
    }

    fn slot(&self, seq: usize, p: u32) -> u32 {
        let bs = self.spec.block_size as u32;
        self.tables[seq][(p / bs) as usize] * bs + p % bs
    }

    /// A random row: causal (ctx = pos + 1), or a tree row over a prefix plus ancestors (some in draft slots).
    fn random_row(&self, rng: &mut StdRng) -> RowAttn {
        let seq = rng.gen_range(0..self.tables.len());
        let len = self.lens[seq];
        if rng.gen_bool(0.6) || len < 2 {
            let pos = rng.gen_range(0..len);
            return RowAttn { pos, seq, ctx: pos + 1, tree: vec![] };
        }
        let ctx = rng.gen_range(0..len);
        let mut tree = Vec::new();
        let mut p = ctx;
        let depth = rng.gen_range(1..12);
        while tree.len() < depth {
            let slot = if p < len && rng.gen_bool(0.5) {
                self.slot(seq, p)
            } else {
                self.draft_slots[rng.gen_range(0..self.draft_slots.len())]
            };
            tree.push((p, slot));
            p += rng.gen_range(1..3);
        }
        RowAttn { pos: tree.last().unwrap().0, seq, ctx, tree }
    }
}

fn random_params(rng: &mut StdRng, heads: usize, kv_heads: usize, head_dim: usize) -> AttnParams {
    AttnParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt() * rng.gen_range(0.5..2.0),
        window: if rng.gen_bool(0.4) { Some(rng.gen_range(1..400)) } else { None },
        softcap: if rng.gen_bool(0.3) { Some([50.0, 5.0][rng.gen_range(0..2)]) } else { None },
        sinks: if rng.gen_bool(0.4) { Some((0..heads).map(|_| rng.gen_range(-4.0..6.0)).collect()) } else { None },
    }
}

#[test]
fn attention_matches_reference_and_is_row_exact() {
    let (mut rng, _g) = rng();
    let bes = backends();
    for &(heads, kv_heads, head_dim, bs) in
        &[(4, 4, 64, 16), (8, 2, 32, 7), (6, 1, 19, 32), (2, 1, 128, 256), (4, 2, 9, 5)]
    {
        let lens: Vec<u32> = (0..4).map(|i| if i < 2 { 700 } else { rng.gen_range(1..600) }).collect();
        let (world, caches) = World::build(&mut rng, &bes, &lens, bs, kv_heads, head_dim);
        let width = heads * head_dim;
        for _ in 0..3 {
            let p = random_params(&mut rng, heads, kv_heads, head_dim);
            let layer = rng.gen_range(0..2);
            let n = 24;
            let rows: Vec<RowAttn> = (0..n).map(|_| world.random_row(&mut rng)).collect();
            let q = Tensor::host(n, width, values(&mut rng, n * width, 2.0));
            let meta = AttnMeta { block_tables: world.tables.clone(), rows: rows.clone() };
            let want = r::attention(&q, &world.layer(layer), &meta, &p);
            for (be, cache) in bes.iter().zip(&caches) {
                let got = be.attention(&q, cache, layer, &meta, &p);
                same(&got.host, &want.host, &format!("attention {} {p:?} bs {bs}", be.describe()));
            }
            // Row-exactness: the target row alone vs among other rows (other sequences, lengths, kinds).
            let op = |be: &CpuBackend, idx: &[usize]| {
                let c = &caches[bes.iter().position(|b| std::ptr::eq(b, be)).unwrap()];
                let m = AttnMeta {
                    block_tables: world.tables.clone(),
                    rows: idx.iter().map(|&i| rows[i].clone()).collect(),
                };
                be.attention(&gather(&q, idx), c, layer, &m, &p)
            };
            check_row_exact(&mut rng, &bes, n, &op, &format!("attention {p:?}"));

            // The twin sequence (same content, other blocks) gives the same bits; so does a tree row listing
            // positions ctx..=pos of the sequence itself versus the causal row at pos.
            let pos = rng.gen_range(0..700u32);
            let ctx = rng.gen_range(0..=pos);
            let as_tree =
                |seq: usize| RowAttn { pos, seq, ctx, tree: (ctx..=pos).map(|t| (t, world.slot(seq, t))).collect() };
            let variants = [
                RowAttn { pos, seq: 0, ctx: pos + 1, tree: vec![] },
                RowAttn { pos, seq: 1, ctx: pos + 1, tree: vec![] },
                as_tree(0),
                as_tree(1),
            ];
            let q1 = Tensor::host(1, width, values(&mut rng, width, 2.0));
            for (be, cache) in bes.iter().zip(&caches) {
                let outs: Vec<Tensor> = variants
                    .iter()
                    .map(|row| {
                        let m = AttnMeta { block_tables: world.tables.clone(), rows: vec![row.clone()] };
                        be.attention(&q1, cache, layer, &m, &p)
                    })
                    .collect();
                for (i, o) in outs.iter().enumerate().skip(1) {
                    same(&o.host, &outs[0].host, &format!("attention variant {i} at pos {pos} ctx {ctx} {p:?}"));
                }
                // A decode step alone (one row: its units take every kv head of a range of chunks) == reference.
                let m = AttnMeta { block_tables: world.tables.clone(), rows: vec![variants[0].clone()] };
                let want1 = r::attention(&q1, &world.layer(layer), &m, &p);
                same(&outs[0].host, &want1.host, &format!("one-row attention at pos {pos} {p:?}"));
            }
        }
    }
}

#[test]
fn attention_is_accurate_against_f64_softmax() {
    let (mut rng, _g) = rng();
    let bes = backends();
    let (heads, kv_heads, head_dim) = (4, 2, 64);
    let (world, caches) = World::build(&mut rng, &bes[..1], &[900, 900, 300], 16, kv_heads, head_dim);
    for _ in 0..4 {
        let p = random_params(&mut rng, heads, kv_heads, head_dim);
        let rows: Vec<RowAttn> = (0..16).map(|_| world.random_row(&mut rng)).collect();
        let q = Tensor::host(rows.len(), heads * head_dim, values(&mut rng, rows.len() * heads * head_dim, 2.0));
        let meta = AttnMeta { block_tables: world.tables.clone(), rows: rows.clone() };
        let got = bes[0].attention(&q, &caches[0], 0, &meta, &p);
        let kv = world.layer(0);
        for (ri, row) in rows.iter().enumerate() {
            let visits = r::visited_positions(row, &world.tables[row.seq], 16, p.window);
            for h in 0..heads {
                let qh = &q.row(ri)[h * head_dim..(h + 1) * head_dim];
                let kvh = h / (heads / kv_heads);
                let scores: Vec<f64> = visits
                    .iter()
                    .map(|&(_, slot)| {
                        let s = qh.iter().zip(kv.k_at(slot, kvh)).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                            * p.scale as f64;
                        p.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                    })
                    .collect();
                let sink = p.sinks.as_ref().map(|s| s[h] as f64);
                let m = scores.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let l: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                for d in 0..head_dim {
                    let want = if visits.is_empty() {
                        0.0
                    } else {
                        visits.iter().zip(&w).map(|(&(_, slot), &wi)| wi * kv.v_at(slot, kvh)[d] as f64).sum::<f64>()
                            / l
                    };
                    let g = got.row(ri)[h * head_dim + d] as f64;
                    assert!((g - want).abs() <= 2e-5 * 3.0, "attention row {ri} head {h} d {d}: {g} vs {want} ({p:?})");
                }
            }
        }
    }
}

#[test]
fn attention_edge_cases() {
    let (mut rng, _g) = rng();
    let bes = backends();
    let (world, caches) = World::build(&mut rng, &bes, &[300, 300], 8, 1, 16);
    let p =
        AttnParams { heads: 2, kv_heads: 1, head_dim: 16, scale: 0.25, window: Some(1), softcap: None, sinks: None };
    let q = Tensor::host(1, 32, values(&mut rng, 32, 1.0));
    for (be, cache) in bes.iter().zip(&caches) {
        // A window of 1 sees only the row itself: the output is its V (`fma(1, v, +0) / 1`, so -0.0 becomes +0.0).
        let m = AttnMeta {
            block_tables: world.tables.clone(),
            rows: vec![RowAttn { pos: 270, seq: 0, ctx: 271, tree: vec![] }],
        };
        let out = be.attention(&q, cache, 1, &m, &p);
        let v: Vec<f32> = world.layer(1).v_at(world.slot(0, 270), 0).iter().map(|&x| x + 0.0).collect();
        same(&out.host[..16], &v, "window 1");
        same(&out.host[16..], &v, "window 1, second head");
        // No visited position: zeros (no NaN).
        let m = AttnMeta {
            block_tables: world.tables.clone(),
            rows: vec![RowAttn { pos: 5, seq: 0, ctx: 0, tree: vec![] }],
        };
        assert!(be.attention(&q, cache, 0, &m, &p).host.iter().all(|&x| x == 0.0));
        // Zero rows.
        let m = AttnMeta { block_tables: world.tables.clone(), rows: vec![] };
        assert_eq!(be.attention(&Tensor::zeros(0, 32), cache, 0, &m, &p).rows, 0);
    }
}

/// The greedy rule written independently of `tf_core::argmax_row`: the maximum with NaN read as −∞, then the
/// first index holding it.
fn max_then_first(row: &[f32]) -> u32 {
    let read = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = row.iter().map(|&v| read(v)).fold(f32::NEG_INFINITY, f32::max);
    row.iter().position(|&v| read(v) == max).unwrap_or(0) as u32
}

#[test]
fn argmax_rows_is_the_row_rule() {
    let (mut rng, _guard) = rng();
    let be = CpuBackend::new(2, Precision::Full);
    for &cols in &[1usize, 2, 31, 1000, 4099] {
        for rows in 1..=20 {
            let data: Vec<f32> = (0..rows).flat_map(|_| tf_testkit::rows::argmax_row(&mut rng, cols)).collect();
            let x = Tensor::host(rows, cols, data);
            let got = be.argmax_rows(&x);
            let want: Vec<u32> = (0..rows).map(|r| max_then_first(x.row(r))).collect();
            assert_eq!(got, want, "{rows}×{cols}");
            let rule: Vec<u32> = (0..rows).map(|r| tf_core::argmax_row(x.row(r))).collect();
            assert_eq!(got, rule, "{rows}×{cols}: tf_core::argmax_row");
        }
    }
    assert!(be.argmax_rows(&Tensor::zeros(0, 7)).is_empty());
    assert_eq!(be.argmax_rows(&Tensor::zeros(3, 0)), vec![0; 3]);
}
