//! Which KV rows attention may load before its `griddepcontrol.wait` (src/kv_writes.rs; kernels/attention.cu,
//! `ATTN_K_EARLY`): every call that writes the cache (kv_write, rope_kv_write, the fused q/k/v epilogue, kv_copy)
//! makes the positions it wrote unsafe, and every synchronizing download (to_host, argmax_rows, queued ids) or
//! synchronize makes them safe again (queued ids taken after a fed forward's event: only what came before it). Needs a CUDA device: without one this test fails (it never passes vacuously).
#![cfg(feature = "cuda")]

use tf_backend_cuda::CudaBackend;
use tf_core::{
    AttnMeta, Backend, DType, KvSpec, Precision, Rope, RopeKv, RopeScaling, RopeStyle, RowAttn, Tensor, TensorInfo,
    Weight,
};

fn weight(be: &dyn Backend, name: &str, shape: &[usize], seed: u32) -> Weight {
    let n: usize = shape.iter().product();
    // Small deterministic values (the test is about which rows count as written, not about their values).
    let bytes: Vec<u8> = (0..n)
        .flat_map(|i| ((((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 1000.0 - 0.5).to_le_bytes())
        .collect();
    let info = TensorInfo { name: name.into(), dtype: DType::F32, shape: shape.iter().map(|&d| d as u64).collect() };
    be.upload(&info, &bytes).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_cache_write_is_unsafe_until_the_host_synchronizes() {
    let g = CudaBackend::new(0, Precision::Full).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    g.tune(|t| {
        t.interleave = true;
        t.il_cols = 0;
    });
    let (hq, hk, hd, k) = (4, 2, 64, 256);
    let spec = KvSpec { layers: 2, blocks: 8, block_size: 4, kv_heads: hk, head_dim: hd };
    let mut kv = g.alloc_kv(spec).unwrap();
    // Sequence 0: blocks 5, 2, 7 (positions 0..4, 4..8, 8..12); one row at position 9.
    let table = vec![5u32, 2, 7];
    let slot = |p: u32| table[(p / 4) as usize] * 4 + p % 4;
    let meta =
        AttnMeta { block_tables: vec![table.clone()], rows: vec![RowAttn { pos: 9, seq: 0, ctx: 10, tree: vec![] }] };
    let bound = |kv: &tf_core::KvCache| g.attention_clean_bounds(kv, &meta)[0];
    assert_eq!(bound(&kv), 10, "a fresh cache: nothing in flight");

    // kv_write of positions 0..10 (both layers), then a download.
    let width = hk * hd;
    let all: Vec<u32> = (0..10).map(slot).collect();
    let kt = Tensor::host(10, width, vec![0.25; 10 * width]);
    for layer in 0..2 {
        g.kv_write(&mut kv, layer, &kt, &kt, &all);
    }
    assert_eq!(bound(&kv), 0, "kv_write of positions 0..10");
    let probe = g.matmul(&Tensor::host(1, k, vec![1.0; k]), &weight(&g, "p", &[8, k], 1), None);
    assert_eq!(g.to_host(&probe).len(), 8);
    assert_eq!(bound(&kv), 10, "after to_host");

    // rope_kv_write of position 6 (layer 1), then argmax_rows.
    let rope = Rope { theta: 1e4, rot_dims: hd, style: RopeStyle::Neox, scaling: RopeScaling::None };
    let (pos6, slot6) = ([6u32], [slot(6)]);
    let at = RopeKv { positions: &pos6, slots: &slot6, head_dim: hd, rope: &rope };
    let mut q = Tensor::host(1, hq * hd, vec![0.5; hq * hd]);
    let mut kk = Tensor::host(1, width, vec![0.5; width]);
    let v = Tensor::host(1, width, vec![0.5; width]);
    g.rope_kv_write(&mut q, &mut kk, &v, &mut kv, 1, &at);
    assert_eq!(bound(&kv), 6, "rope_kv_write of position 6");
    assert_eq!(g.argmax_rows(&probe).len(), 1);
    assert_eq!(bound(&kv), 10, "after argmax_rows");

    // The fused q/k/v projection with RoPE and the cache write in its epilogue (one row), position 3.
    let norm = weight(&g, "norm", &[k], 2);
    let ws = [weight(&g, "q", &[hq * hd, k], 3), weight(&g, "k", &[width, k], 4), weight(&g, "v", &[width, k], 5)];
    let (pos3, slot3) = ([3u32], [slot(3)]);
    let at = RopeKv { positions: &pos3, slots: &slot3, head_dim: hd, rope: &rope };
    let x = Tensor::host(1, k, vec![0.75; k]);
    let list = [(&ws[0], None), (&ws[1], None), (&ws[2], None)];
    let out = g.norm_qkv_rope_kv_write(&x, &norm, 1e-6, &list, &mut kv, 0, &at);
    assert_eq!(bound(&kv), 3, "norm_qkv_rope_kv_write of position 3");
    g.synchronize();
    assert_eq!(bound(&kv), 10, "after synchronize");
    drop(out);

    // kv_copy into position 7's slot (from a slot outside the table), and writes outside the sequence's blocks.
    g.kv_copy(&mut kv, &[0], &[slot(7)]);
    assert_eq!(bound(&kv), 7, "kv_copy into position 7");
    g.kv_write(&mut kv, 0, &kt, &kt, &[1, 2, 3, 4, 5, 6, 12, 13, 14, 15]);
    assert_eq!(bound(&kv), 7, "slots of blocks 0, 1 and 3 (not the sequence's) change nothing");
    assert_eq!(g.to_host(&probe).len(), 8);
    assert_eq!(bound(&kv), 10, "after to_host");

    // Queued ids (src/host_ids.rs): a forward fed by them sends them to the host behind an event; taking them
    // makes what was queued before that event safe, not what was queued after it.
    let k1 = Tensor::host(1, width, vec![0.5; width]);
    let ids = g.argmax_rows_queued(&probe);
    g.kv_write(&mut kv, 0, &k1, &k1, &[slot(5)]);
    let table_w = weight(&g, "embd", &[8, k], 6);
    let fed = g.embed_queued(&table_w, &ids);
    g.kv_write(&mut kv, 1, &k1, &k1, &[slot(8)]);
    assert_eq!(bound(&kv), 5, "writes of positions 5 and 8 in flight");
    assert_eq!(g.take_ids(&ids).len(), 1);
    assert_eq!(bound(&kv), 8, "after the queued ids: position 5's write (before the event) is done, 8's is not");
    assert_eq!(g.to_host(&fed).len(), k);
    assert_eq!(bound(&kv), 10, "after to_host");
    // Ids nobody fed are downloaded: a wait for the whole stream.
    let ids = g.argmax_rows_queued(&probe);
    g.kv_write(&mut kv, 1, &k1, &k1, &[slot(2)]);
    assert_eq!(bound(&kv), 2);
    assert_eq!(g.take_ids(&ids).len(), 1);
    assert_eq!(bound(&kv), 10, "after unfed queued ids");
}

/// The kernel's side of the bound: a row still being written when attention starts is not read before attention's
/// wait. Position 40's row is rewritten by `kv_write_late`, which lets the next kernel start at once and writes only
/// after spinning 200 µs; attention (one head per block, decode over positions 0..=40) starts during the spin. It
/// must see the new row: its output equals the CPU backend's on the same final cache, bit for bit. A kernel that
/// loaded position 40 before its wait would read the old row.
#[test]
fn attention_never_reads_a_row_before_its_writer_is_done() {
    use tf_backend_cpu::CpuBackend;
    use tf_core::AttnParams;
    let g = CudaBackend::new(0, Precision::Full).unwrap_or_else(|e| panic!("no CUDA backend: {e}"));
    let c = CpuBackend::new(2, Precision::Full);
    let (hq, hk, hd) = (4, 2, 64);
    let width = hk * hd;
    let spec = KvSpec { layers: 1, blocks: 8, block_size: 16, kv_heads: hk, head_dim: hd };
    let slots = spec.blocks * spec.block_size;
    let val = |i: usize, salt: usize| ((i * 7919 + salt * 104729) % 2003) as f32 / 1001.0 - 1.0;
    let fill = Tensor::host(slots, width, (0..slots * width).map(|i| val(i, 1)).collect());
    let all: Vec<u32> = (0..slots as u32).collect();
    let (mut kg, mut kc) = (g.alloc_kv(spec).unwrap(), c.alloc_kv(spec).unwrap());
    g.kv_write(&mut kg, 0, &fill, &fill, &all);
    c.kv_write(&mut kc, 0, &fill, &fill, &all);
    g.synchronize();
    // Sequence 0: blocks 3, 6, 1, ...; the row at position 40 (block 1, offset 8).
    let table = vec![3u32, 6, 1, 0];
    let p40 = [table[2] * 16 + 8];
    let meta =
        AttnMeta { block_tables: vec![table.clone()], rows: vec![RowAttn { pos: 40, seq: 0, ctx: 41, tree: vec![] }] };
    let p =
        AttnParams { heads: hq, kv_heads: hk, head_dim: hd, scale: 0.125, window: None, softcap: None, sinks: None };
    g.tune(|t| t.attn_heads = 1);
    // q on the device already (an upload between the write and attention would order them), through one op.
    let qh = Tensor::host(1, hq * hd, (0..hq * hd).map(|i| val(i, 2)).collect());
    let qd = g.select_rows(&qh, &[0]);
    // A first late write and attention: the metadata (with position 40 unsafe) is uploaded and cached here, so
    // the second attention below follows its write with nothing queued between them.
    let first = Tensor::host(1, width, (0..width).map(|i| val(i, 3)).collect());
    g.kv_write_late(&mut kg, 0, &first, &first, &p40, 200_000);
    drop(g.attention(&qd, &kg, 0, &meta, &p));
    assert_eq!(g.attention_clean_bounds(&kg, &meta), vec![40], "position 40 in flight");
    let second = Tensor::host(1, width, (0..width).map(|i| val(i, 4)).collect());
    let (ks, vs) = (g.select_rows(&second, &[0]), g.select_rows(&second, &[0]));
    g.kv_write_late(&mut kg, 0, &ks, &vs, &p40, 200_000);
    let got = g.to_host(&g.attention(&qd, &kg, 0, &meta, &p));
    c.kv_write(&mut kc, 0, &second, &second, &p40);
    let want = c.to_host(&c.attention(&qh, &kc, 0, &meta, &p));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "element {i}: {a:e} (CUDA) vs {b:e} (CPU, the row as last written)");
    }
}
