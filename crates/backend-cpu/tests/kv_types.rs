//! The KV storage types f16 and q8_0 of `CpuBackend` (docs/arithmetic.md "KV storage types"), and f32 through the
//! same paths:
//! 1. what `kv_write` stores equals the reference's rounding of each row (`tf_quant::reference::kv`), whatever rows
//!    share the call, and `kv_copy` moves it bit for bit;
//! 2. attention over a paged cache (scrambled block tables, GQA, windows, softcaps, sinks, tree rows) equals the
//!    reference attention over the reference's own rounding of the same values, at every ISA level and thread
//!    count;
//! 3. row-exactness: a row alone equals the same row among 1..=63 other rows.
//!
//! Random data from a fresh seed per run (time-based), printed on failure; set `TF_SEED` to replay one.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tf_backend_cpu::{CpuBackend, CpuKv, Isa, KvType};
use tf_core::{AttnMeta, AttnParams, Backend, KvCache, KvSpec, Precision, RowAttn, Tensor};
use tf_quant::reference::kv::{self as rk, KvData, KvView, Q8_0_BLOCK};
use tf_testkit::rows::values;

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

/// Every ISA level with 1, 2 and 4 threads, storing `ty`.
fn backends(ty: KvType) -> Vec<CpuBackend> {
    Isa::available()
        .into_iter()
        .flat_map(|isa| [1, 2, 4].map(|t| CpuBackend::with_isa(t, Precision::Full, isa).with_kv_type(ty)))
        .collect()
}

#[track_caller]
fn same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: element {i} differs: {:e} ({:#x}) vs {:e} ({:#x})", a[i], a[i].to_bits(), b[i], b[i].to_bits());
    }
}

/// The reference's storage of one layer's K (or V) `[slots, width]` as `ty`, rounded slot row by slot row.
enum Stored {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Q8_0 { d: Vec<u16>, q: Vec<i8> },
}

impl Stored {
    fn encode(ty: KvType, x: &[f32], width: usize) -> Stored {
        match ty {
            KvType::F32 => Stored::F32(x.to_vec()),
            KvType::F16 => {
                let mut h = vec![0u16; x.len()];
                for (xr, hr) in x.chunks(width).zip(h.chunks_mut(width)) {
                    rk::encode_f16(xr, hr);
                }
                Stored::F16(h)
            }
            KvType::Q8_0 => {
                let (mut d, mut q) = (vec![0u16; x.len() / Q8_0_BLOCK], vec![0i8; x.len()]);
                for ((xr, qr), dr) in x.chunks(width).zip(q.chunks_mut(width)).zip(d.chunks_mut(width / Q8_0_BLOCK)) {
                    rk::encode_q8_0(xr, dr, qr);
                }
                Stored::Q8_0 { d, q }
            }
        }
    }

    fn data(&self) -> KvData<'_> {
        match self {
            Stored::F32(x) => KvData::F32(x),
            Stored::F16(x) => KvData::F16(x),
            Stored::Q8_0 { d, q } => KvData::Q8_0 { d, q },
        }
    }
}

/// The `CpuKv` behind a cache.
fn store(c: &KvCache) -> &CpuKv {
    c.storage.downcast_ref::<CpuKv>().expect("a CPU cache")
}

/// Every slot of `layer` read back from the backend's cache: `(K, V)`, each `[slots, width]`.
fn read_back(c: &KvCache, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let s = store(c);
    let g = s.read(layer);
    s.view(&g).decode_all()
}

/// A paged pool: `lens` sequences written through shuffled block tables, plus loose slots for tree rows.
struct World {
    spec: KvSpec,
    /// Per layer, the f32 values written: K and V `[slots, kv_heads·head_dim]`.
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    tables: Vec<Vec<u32>>,
    lens: Vec<u32>,
    loose: Vec<u32>,
}

impl World {
    fn new(rng: &mut StdRng, lens: &[u32], bs: usize, kv_heads: usize, head_dim: usize) -> World {
        let need: usize = lens.iter().map(|&l| (l as usize).div_ceil(bs)).sum();
        let blocks = need + 3;
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
        let loose = ids[next..].iter().flat_map(|&b| (0..bs as u32).map(move |o| b * bs as u32 + o)).collect();
        let n = blocks * bs * kv_heads * head_dim;
        // Values of a wide range of magnitudes per row, so q8_0 blocks get varied scales.
        let mut vals = |scale: f32| -> Vec<f32> {
            let mut x = values(rng, n, scale);
            for c in x.chunks_mut(Q8_0_BLOCK) {
                let f = [1.0, 1e-3, 40.0, 0.0][rng.gen_range(0..4)];
                c.iter_mut().for_each(|v| *v *= f);
            }
            x
        };
        let (k, v) = ((0..2).map(|_| vals(2.0)).collect(), (0..2).map(|_| vals(3.0)).collect());
        World { spec, k, v, tables, lens: lens.to_vec(), loose }
    }

    fn width(&self) -> usize {
        self.spec.kv_heads * self.spec.head_dim
    }

    /// A cache of `be` with every slot written through `kv_write` in shuffled groups of 1..40 rows.
    fn cache(&self, rng: &mut StdRng, be: &CpuBackend) -> KvCache {
        let mut c = be.alloc_kv(self.spec).unwrap();
        let w = self.width();
        let slots = self.spec.blocks * self.spec.block_size;
        for layer in 0..2 {
            let mut order: Vec<u32> = (0..slots as u32).collect();
            order.shuffle(rng);
            for part in order.chunks(rng.gen_range(1..40)) {
                let rows = |x: &[f32]| {
                    let v = part.iter().flat_map(|&s| x[s as usize * w..(s as usize + 1) * w].to_vec()).collect();
                    Tensor::host(part.len(), w, v)
                };
                be.kv_write(&mut c, layer, &rows(&self.k[layer]), &rows(&self.v[layer]), part);
            }
        }
        c
    }

    fn slot(&self, seq: usize, p: u32) -> u32 {
        let bs = self.spec.block_size as u32;
        self.tables[seq][(p / bs) as usize] * bs + p % bs
    }

    /// A causal row, or a tree row over a prefix plus positions in the sequence's own or loose slots.
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
        for _ in 0..rng.gen_range(1..10) {
            let slot = if p < len && rng.gen_bool(0.5) {
                self.slot(seq, p)
            } else {
                self.loose[rng.gen_range(0..self.loose.len())]
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
        window: if rng.gen_bool(0.3) { Some(rng.gen_range(1..400)) } else { None },
        softcap: if rng.gen_bool(0.3) { Some(30.0) } else { None },
        sinks: if rng.gen_bool(0.3) { Some((0..heads).map(|_| rng.gen_range(-4.0..6.0)).collect()) } else { None },
    }
}

#[test]
fn kv_write_stores_the_reference_rounding_of_each_row() {
    let (mut rng, _g) = rng();
    for ty in KvType::ALL {
        for &(kv_heads, head_dim) in &[(1, 32), (2, 64), (3, 128)] {
            let world = World::new(&mut rng, &[40, 25], 8, kv_heads, head_dim);
            let w = world.width();
            let be = CpuBackend::with_isa(2, Precision::Full, Isa::detect()).with_kv_type(ty);
            let mut c = world.cache(&mut rng, &be);
            for layer in 0..2 {
                let (k, v) = read_back(&c, layer);
                let (rk_, rv) = (Stored::encode(ty, &world.k[layer], w), Stored::encode(ty, &world.v[layer], w));
                let (mut wk, mut wv) = (vec![0f32; k.len()], vec![0f32; v.len()]);
                rk_.data().decode(0, &mut wk);
                rv.data().decode(0, &mut wv);
                same(&k, &wk, &format!("{ty:?} K layer {layer} kv_heads {kv_heads} head_dim {head_dim}"));
                same(&v, &wv, &format!("{ty:?} V layer {layer} kv_heads {kv_heads} head_dim {head_dim}"));
                if ty != KvType::F32 {
                    assert!(k.iter().zip(&world.k[layer]).any(|(a, b)| a != b), "{ty:?} rounds");
                }
            }
            // kv_copy: slot a's stored row moves to slot b in every layer.
            let total = (world.spec.blocks * world.spec.block_size) as u32;
            let (a, b) = (rng.gen_range(0..total), rng.gen_range(0..total));
            let before: Vec<_> = (0..2).map(|l| read_back(&c, l)).collect();
            be.kv_copy(&mut c, &[a], &[b]);
            for (l, (k0, v0)) in before.iter().enumerate() {
                let (k, v) = read_back(&c, l);
                let row = |x: &[f32], s: u32| x[s as usize * w..(s as usize + 1) * w].to_vec();
                same(&row(&k, b), &row(k0, a), &format!("{ty:?} kv_copy K"));
                same(&row(&v, b), &row(v0, a), &format!("{ty:?} kv_copy V"));
            }
        }
    }
}

#[test]
fn attention_matches_reference_and_is_row_exact_for_every_kv_type() {
    let (mut rng, _g) = rng();
    for ty in KvType::ALL {
        let bes = backends(ty);
        // Head dims 80 and 40 (f32 and f16 only: q8_0 needs whole blocks of 32): an f16 cache is read where it is
        // stored for multiples of 16, through 16-value steps past the last 32, and read back otherwise.
        let shapes = [(4, 4, 64, 16), (9, 3, 64, 7), (8, 1, 32, 32), (4, 2, 128, 5), (2, 1, 80, 6), (3, 3, 40, 11)];
        for &(heads, kv_heads, head_dim, bs) in shapes.iter().filter(|s| ty != KvType::Q8_0 || s.2 % Q8_0_BLOCK == 0) {
            let lens: Vec<u32> = (0..3).map(|i| if i == 0 { 600 } else { rng.gen_range(1..500) }).collect();
            let world = World::new(&mut rng, &lens, bs, kv_heads, head_dim);
            let caches: Vec<KvCache> = bes.iter().map(|be| world.cache(&mut rng, be)).collect();
            let (width, kw) = (heads * head_dim, world.width());
            for _ in 0..2 {
                let p = random_params(&mut rng, heads, kv_heads, head_dim);
                let layer = rng.gen_range(0..2);
                let stored = (Stored::encode(ty, &world.k[layer], kw), Stored::encode(ty, &world.v[layer], kw));
                let view = KvView { k: stored.0.data(), v: stored.1.data(), block_size: bs, kv_heads, head_dim };
                let n = 64;
                let rows: Vec<RowAttn> = (0..n).map(|_| world.random_row(&mut rng)).collect();
                // q [64, heads·head_dim]
                let q = Tensor::host(n, width, values(&mut rng, n * width, 2.0));
                let meta = AttnMeta { block_tables: world.tables.clone(), rows: rows.clone() };
                let want = rk::attention(&q, &view, &meta, &p);
                for (be, c) in bes.iter().zip(&caches) {
                    let got = be.attention(&q, c, layer, &meta, &p);
                    same(&got.host, &want.host, &format!("{ty:?} attention {} {p:?} bs {bs}", be.describe()));
                }
                // Row 0 alone vs among 1..=63 other rows at a random index.
                let alone = bes[0].attention(
                    &Tensor::host(1, width, q.row(0).to_vec()),
                    &caches[0],
                    layer,
                    &AttnMeta { block_tables: world.tables.clone(), rows: vec![rows[0].clone()] },
                    &p,
                );
                for others in [1, 2, 7, 15, 32, 63] {
                    let mut idx: Vec<usize> = (1..n).collect();
                    idx.shuffle(&mut rng);
                    idx.truncate(others);
                    let at = rng.gen_range(0..=others);
                    idx.insert(at, 0);
                    // qs [others + 1, heads·head_dim]
                    let qs = Tensor::host(idx.len(), width, idx.iter().flat_map(|&i| q.row(i).to_vec()).collect());
                    let m = AttnMeta {
                        block_tables: world.tables.clone(),
                        rows: idx.iter().map(|&i| rows[i].clone()).collect(),
                    };
                    for (be, c) in bes.iter().zip(&caches) {
                        let got = be.attention(&qs, c, layer, &m, &p);
                        same(got.row(at), &alone.host, &format!("{ty:?} row alone vs at {at} of {}", idx.len()));
                    }
                }
            }
        }
    }
}

#[test]
fn kv_types_differ_from_f32_and_store_fewer_bytes() {
    let (mut rng, _g) = rng();
    let world = World::new(&mut rng, &[300], 16, 2, 64);
    let (heads, width) = (4, 4 * 64);
    let p = AttnParams { heads, kv_heads: 2, head_dim: 64, scale: 0.125, window: None, softcap: None, sinks: None };
    // A small query keeps the bound below rigorous: K values reach 80 (blocks scaled by 40), so a q8_0 key is off by
    // at most 80 / 254 per element, which moves a score by at most 0.125 · Σ|q| · 80 / 254 ≤ 0.0126 here (|q| ≤
    // 0.005, 64 dims); the softmax weights then move by a factor within e^(±0.025), and each V value by at most
    // max |V| / 254, so an output moves by less than max |V| · (1 / 254 + e^0.025 − 1) < max |V| / 30. With a large
    // query a rounding can flip which key dominates, and no bound short of max |V| holds.
    let q = Tensor::host(1, width, values(&mut rng, width, 0.005));
    let meta = AttnMeta {
        block_tables: world.tables.clone(),
        rows: vec![RowAttn { pos: 299, seq: 0, ctx: 300, tree: vec![] }],
    };
    let out: Vec<Vec<f32>> = KvType::ALL
        .into_iter()
        .map(|ty| {
            let be = CpuBackend::with_isa(1, Precision::Full, Isa::detect()).with_kv_type(ty);
            let c = world.cache(&mut rng, &be);
            be.attention(&q, &c, 0, &meta, &p).host
        })
        .collect();
    assert_ne!(out[0], out[1], "f16 KV equals f32 KV");
    assert_ne!(out[0], out[2], "q8_0 KV equals f32 KV");
    assert_ne!(out[1], out[2], "q8_0 KV equals f16 KV");
    // Close to f32 all the same (the bound above; a wrong scale or block misses it by far).
    let vmax = world.v[0].iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in out[0].iter().zip(&out[2]).enumerate() {
        assert!((a - b).abs() <= vmax / 20.0, "q8_0 element {i}: {b} vs f32 {a} (max |V| {vmax})");
    }
    assert_eq!(KvType::F32.bytes_per_token(30, 3, 64), 2 * 30 * 3 * 64 * 4);
    assert_eq!(KvType::F16.bytes_per_token(30, 3, 64) * 2, KvType::F32.bytes_per_token(30, 3, 64));
    assert_eq!(KvType::Q8_0.bytes_per_token(30, 3, 64), 2 * 30 * 3 * 2 * 34);
}
