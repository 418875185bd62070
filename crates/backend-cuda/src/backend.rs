//! [`CudaBackend`]: every op of `tf_core::Backend` on one GPU, in the portable arithmetic (bit-equal to the
//! scalar reference and so to the CPU backend) or the tensor one (BF16/F16 matmuls on tensor cores). Host code here only checks shapes, uploads small per-call
//! metadata (positions, slots, block tables, RoPE table rows) and launches the kernels of `kernels/`.

use crate::device::{Buf, Gpu};
use crate::geometry::{dtype_code, elementwise_grid, interleave_block, norm_threads, DT_INTERLEAVED};
use crate::host_ids::Slots;

// The matmul paths (one weight, several, gate/up with the GLU): backend/matmul.rs.
mod attention;
mod half;
mod matmul;
mod quant;
mod queued;
mod tuning;
use crate::{Arithmetic, CudaTuning, KernelDefine};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tf_core::{
    AttnMeta, AttnParams, Backend, BackendError, DType, GluAct, KvCache, KvSpec, Precision, QueuedIds, Rope, RopeKv,
    RopeStyle, Storage, Tensor, TensorInfo, Weight,
};
use tf_quant::reference::ops::{rope_cos_sin_scaled, rope_freqs, rope_mscale};
use tuning::Knobs;

/// An activation on the device: `rows × cols` f32, row-major (`[rows * cols]`).
pub struct CudaTensor {
    pub buf: Buf,
    /// The same values rounded to the tensor arithmetic's half type (`[rows * cols]` u16; f16 when the flag is set,
    /// else bf16), written by the producing kernel for windows (backend/half.rs); in-place ops drop it.
    pub half: Option<(Buf, bool)>,
}

/// A weight on the device in its checkpoint format: `[out, in]` (or a vector `[n]`), raw GGUF blocks; float
/// matrices of the portable arithmetic may be stored interleaved instead (`interleaved`).
pub struct CudaWeight {
    pub dtype: DType,
    /// The kernels' tag of `dtype`.
    pub code: i32,
    pub out_dim: usize,
    pub in_dim: usize,
    /// `[out * row_bytes]` raw little-endian bytes, in the checkpoint's element order unless `interleaved`.
    pub buf: Buf,
    /// The elements of each block of [`interleave_block`] elements are permuted so that each of dot16's 16 lane
    /// chains is contiguous (`il_index` in kernels/common.cu): set at upload when interleaving is on
    /// (`CudaTuning::interleave`, the default), in the portable arithmetic only, for F32/F16/BF16 tensors of two
    /// or more dimensions whose rows are whole blocks. Every kernel reading such a weight reads through the map:
    /// the matmul's `_il*` kernels by construction, the others by [`Self::tag`].
    pub interleaved: bool,
}

impl CudaWeight {
    /// The tag that kernels reading single elements (`deq_elem`: embedding rows, norm weights, biases) take:
    /// `code`, plus `DT_INTERLEAVED` for an interleaved weight.
    pub fn tag(&self) -> i32 {
        if self.interleaved {
            self.code | DT_INTERLEAVED
        } else {
            self.code
        }
    }
}

/// The paged KV store: K and V each `[layers, slots, kv_heads * head_dim]` f32.
pub struct CudaKv {
    pub spec: KvSpec,
    pub k: Buf,
    pub v: Buf,
    /// The cache writes no completed wait for the stream has covered yet (src/kv_writes.rs).
    writes: Mutex<crate::kv_writes::KvWrites>,
}

impl CudaKv {
    fn width(&self) -> usize {
        self.spec.kv_heads * self.spec.head_dim
    }

    fn slots(&self) -> usize {
        self.spec.blocks * self.spec.block_size
    }

    /// Floats per layer of K (and of V).
    fn layer_len(&self) -> usize {
        self.slots() * self.width()
    }
}

/// The CUDA backend: one device, one stream, a precision mode and an arithmetic.
pub struct CudaBackend {
    gpu: Gpu,
    precision: Precision,
    arithmetic: Arithmetic,
    uploads: Mutex<Uploads>,
    /// The tuning in force but the kernel defines ([`CudaBackend::tune`]).
    tune: Knobs,
    /// The kernel defines the kernels were compiled with.
    defines: Vec<KernelDefine>,
    /// The half type of the tensor arithmetic's matrices, for window activations' half copies (backend/half.rs).
    half_kind: AtomicU8,
    /// Pinned, device-mapped host slots for queued ids (src/host_ids.rs).
    id_slots: Arc<Slots>,
}

/// The last per-call metadata uploaded, reused while the next call asks for the same (every layer of a forward
/// passes the same positions, slots and attention metadata).
#[derive(Default)]
struct Uploads {
    /// positions, RoPE parameters → cos and sin table rows `[R, rot_dims / 2]`.
    rope: Option<(Vec<u32>, Rope, Arc<RopeTables>)>,
    /// KV slots of a kv_write `[R]`.
    slots: Option<(Vec<u32>, Arc<Buf>)>,
    /// Attention metadata, the KV store (its K address) and its writes' key (src/kv_writes.rs) → the flattened
    /// buffers.
    attn: Option<(AttnMeta, KvSpec, AttnKey, Arc<AttnBufs>)>,
    /// The chunk lists of that metadata per sliding window: (window, `[R, cmax]` chunk ids, cmax).
    chunks: Vec<(Option<u32>, Arc<Buf>, usize)>,
}

/// The KV store's K address and [`crate::kv_writes::KvWrites::key`].
type AttnKey = (u64, u64, u64);

/// cos and sin table rows `[R, rot_dims / 2]` of one call's positions.
type RopeTables = (Buf, Buf);

/// Flattened attention metadata on the device.
struct AttnBufs {
    /// `[R, 6]` i32: position, sequence, ctx, tree offset, tree length, clean (prefix positions below it were
    /// written by kernels that a completed wait for the stream covered: src/kv_writes.rs).
    rows: Buf,
    /// `[Σ table lengths]` u32: every block table, concatenated.
    bt: Buf,
    /// `[sequences]` i32: start of each block table in `bt`.
    bt_off: Buf,
    /// `[Σ tree lengths, 2]` u32: (position, slot) pairs.
    tree: Buf,
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn u32_bytes(v: &[u32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// The `act` argument of the GLU kernels: 0 = SiLU, 1 = GELU (tanh form). The clamped SwiGLU has no fused
/// kernels: `matmul_glu` and `norm_matmul_glu` run it as their unfused composition (the `glu_clamp` kernel).
fn act_code(act: GluAct) -> i32 {
    match act {
        GluAct::Silu => 0,
        GluAct::GeluTanh => 1,
        GluAct::SwigluClamp { .. } => panic!("the clamped SwiGLU has no fused GLU kernel"),
    }
}

/// A matmul's optional bias for `n` outputs as kernel arguments: (address, type tag), or (0, 0) without one.
fn bias_arg(bias: Option<&Weight>, n: usize) -> (u64, i32) {
    match bias {
        Some(b) => {
            let cb = weight(b);
            assert_eq!(cb.out_dim * cb.in_dim, n, "matmul: bias {:?} for {n} outputs", b.shape);
            (cb.buf.ptr, cb.tag())
        }
        None => (0, 0),
    }
}

fn weight(w: &Weight) -> &CudaWeight {
    w.storage.downcast_ref::<CudaWeight>().unwrap_or_else(|| panic!("weight {} was not uploaded by CUDA", w.name))
}

fn cuda_kv(kv: &KvCache) -> &CudaKv {
    kv.storage.downcast_ref::<CudaKv>().expect("KvCache was not allocated by the CUDA backend")
}

/// Whether a CUDA device can be opened (the driver loads and reports at least one device).
pub fn available() -> bool {
    Gpu::device_count() > 0
}

impl CudaBackend {
    /// Opens device `ordinal` and compiles the kernels for it (NVRTC, once per process and architecture), in the
    /// portable arithmetic.
    pub fn new(ordinal: usize, precision: Precision) -> Result<CudaBackend, BackendError> {
        CudaBackend::with_arithmetic(ordinal, precision, Arithmetic::Portable)
    }

    /// Opens device `ordinal` in `arithmetic`; `Tensor` needs compute capability 8.0 or later (mma.sync with
    /// bf16 operands).
    pub fn with_arithmetic(
        ordinal: usize,
        precision: Precision,
        arithmetic: Arithmetic,
    ) -> Result<CudaBackend, BackendError> {
        CudaBackend::with_tuning(ordinal, precision, arithmetic, CudaTuning::default())
    }

    /// [`CudaBackend::with_arithmetic`] with `tuning` instead of the defaults (`tensorfold bench` and the lab; the
    /// kernels are compiled with its defines).
    pub fn with_tuning(
        ordinal: usize,
        precision: Precision,
        arithmetic: Arithmetic,
        tuning: CudaTuning,
    ) -> Result<CudaBackend, BackendError> {
        let gpu = Gpu::open(ordinal, &tuning.define_strings())?;
        if arithmetic == Arithmetic::Tensor && gpu.cc.0 < 8 {
            return Err(BackendError(format!(
                "the tensor arithmetic needs compute capability 8.0 or later; {} is sm_{}{}",
                gpu.name, gpu.cc.0, gpu.cc.1
            )));
        }
        let gpu_ctx = gpu.ctx.clone();
        Ok(CudaBackend {
            gpu,
            precision,
            arithmetic,
            uploads: Mutex::new(Uploads::default()),
            tune: Knobs::new(&tuning),
            defines: tuning.defines,
            half_kind: AtomicU8::new(half::HALF_NONE),
            id_slots: Arc::new(Slots::new(gpu_ctx)),
        })
    }

    /// Rows of the table for host ids (`embed`, kernels/ops.cu).
    fn embed_impl(&self, table: &Weight, ids: &[u32]) -> Tensor {
        let t = weight(table);
        let hidden = t.in_dim;
        for &id in ids {
            assert!((id as usize) < t.out_dim, "embed: id {id} of a table with {} rows", t.out_dim);
        }
        let out = self.alloc_f32(ids.len() * hidden);
        if !ids.is_empty() {
            let idb = self.upload_or_panic(u32_bytes(ids));
            let (g, b) = elementwise_grid(ids.len() * hidden);
            self.gpu.launch("embed").ptr(&t.buf).int(t.tag()).i32(hidden).ptr(&idb).i32(ids.len()).ptr(&out).go(g, b);
        }
        self.tensor(ids.len(), hidden, out)
    }

    /// The arithmetic of the matmuls.
    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    /// The device name ("NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// The device, for measurement programs (crates/cuda-lab): timing events, launches of their own kernels on
    /// the backend's stream.
    #[doc(hidden)]
    pub fn device(&self) -> &Gpu {
        &self.gpu
    }

    /// [`tf_core::Backend::kv_write`] through `kv_write_late` (kernels/ops.cu): a programmatic launch that lets the
    /// next kernel start at once and writes only `spin_ns` after its wait, so that the rows are still old while a
    /// dependent kernel runs its code before `griddepcontrol.wait`. Recorded like every cache write. For tests of
    /// what attention may load before its wait (tests/kv_writes.rs).
    #[doc(hidden)]
    pub fn kv_write_late(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32], spin_ns: i32) {
        self.kv_write_with(kv, layer, k, v, slots, Some(spin_ns))
    }

    /// [`Backend::kv_write`]; with `late_ns`, through the test kernel `kv_write_late` instead ([`Self::kv_write_late`]).
    fn kv_write_with(
        &self,
        kv: &mut KvCache,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        slots: &[u32],
        late_ns: Option<i32>,
    ) {
        let width = self.kv_write_checks(kv, layer, k, v, slots);
        let store = cuda_kv(kv);
        if slots.is_empty() || width == 0 {
            return;
        }
        let (ks, vs) = (self.input(k), self.input(v));
        let kb = &ks.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let vb = &vs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let sb = self.slots_buf(slots);
        let off = (layer * store.layer_len() * 4) as u64;
        let l = self.gpu.launch(if late_ns.is_some() { "kv_write_late" } else { "kv_write" });
        let l = l.addr(store.k.ptr + off).addr(store.v.ptr + off).ptr(kb).ptr(vb).i32(width).ptr(&sb).i32(slots.len());
        match late_ns {
            // One block: it lets the next kernel start at once and writes after the spin.
            Some(ns) => l.pdl().int(ns).go((1, 1, 1), (256, 1, 1)),
            None => {
                let (g, b) = elementwise_grid(slots.len() * width);
                l.go(g, b)
            }
        }
        self.kv_written(store, slots);
    }

    /// Each row's clean bound (src/kv_writes.rs) that attention on `kv` would upload now: prefix positions below it
    /// may be loaded before the kernel's wait (`ATTN_K_EARLY`). For tests.
    #[doc(hidden)]
    pub fn attention_clean_bounds(&self, kv: &KvCache, meta: &AttnMeta) -> Vec<u32> {
        let store = cuda_kv(kv);
        let writes = store.writes.lock().unwrap_or_else(|e| e.into_inner());
        writes.clean_bounds(self.gpu.waits_done(), meta, store.spec.block_size)
    }

    /// Waits for all queued work (for timing).
    pub fn synchronize(&self) {
        self.gpu.sync()
    }

    fn uploads(&self) -> MutexGuard<'_, Uploads> {
        self.uploads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn upload_or_panic(&self, bytes: &[u8]) -> Buf {
        self.gpu.upload(bytes).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An output of `n` floats (uninitialized: every kernel writes all of its output).
    fn alloc_f32(&self, n: usize) -> Buf {
        self.gpu.uninit(4 * n).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tensor(&self, rows: usize, cols: usize, buf: Buf) -> Tensor {
        self.tensor_half(rows, cols, buf, None)
    }

    /// A tensor with its half copy (or none).
    fn tensor_half(&self, rows: usize, cols: usize, buf: Buf, half: Option<(Buf, bool)>) -> Tensor {
        Tensor { rows, cols, host: Vec::new(), device: Some(Arc::new(CudaTensor { buf, half })) }
    }

    /// The device storage of `x`, uploading a host tensor.
    fn input(&self, x: &Tensor) -> Storage {
        match &x.device {
            Some(s) => {
                assert!(s.is::<CudaTensor>(), "{x:?} belongs to another backend");
                s.clone()
            }
            None => {
                assert_eq!(x.host.len(), x.rows * x.cols, "{x:?}: host data length");
                Arc::new(CudaTensor { buf: self.upload_or_panic(f32_bytes(&x.host)), half: None })
            }
        }
    }

    /// `x`'s device buffer for writing in place: uploaded if on the host, copied first if shared with a clone; its
    /// half copy dropped (it would go stale).
    fn make_unique<'a>(&self, x: &'a mut Tensor) -> &'a CudaTensor {
        let n = x.rows * x.cols;
        let fresh = match &x.device {
            None => Some(Arc::new(CudaTensor { buf: self.upload_or_panic(f32_bytes(&x.host)), half: None }) as Storage),
            Some(s) if Arc::strong_count(s) > 1 => {
                let src = s.downcast_ref::<CudaTensor>().expect("tensor of another backend");
                let mut buf = self.alloc_f32(n);
                self.gpu.copy(&src.buf, &mut buf, 4 * n);
                Some(Arc::new(CudaTensor { buf, half: None }) as Storage)
            }
            Some(_) => None,
        };
        if let Some(s) = fresh {
            x.device = Some(s);
            x.host = Vec::new();
        }
        let s = x.device.as_mut().expect("a device tensor");
        Arc::get_mut(s).and_then(|s| s.downcast_mut::<CudaTensor>()).expect("tensor of another backend").half = None;
        x.device.as_ref().and_then(|s| s.downcast_ref::<CudaTensor>()).expect("tensor of another backend")
    }

    /// Checks attention metadata against the KV shape and flattens it onto the device, with each row's clean bound
    /// (`clean[r]`).
    fn attn_bufs(&self, meta: &AttnMeta, spec: KvSpec, clean: &[u32]) -> AttnBufs {
        // Flattened metadata: rows [R, 6] = (pos, seq, ctx, tree offset, tree length, clean), block tables, tree
        // pairs.
        let mut bt: Vec<u32> = Vec::new();
        let mut bt_off: Vec<i32> = Vec::with_capacity(meta.block_tables.len());
        for t in &meta.block_tables {
            bt_off.push(i32::try_from(bt.len()).expect("block tables too large"));
            for &b in t {
                assert!((b as usize) < spec.blocks, "attention: block {b} outside the pool of {}", spec.blocks);
            }
            bt.extend_from_slice(t);
        }
        let mut rows: Vec<i32> = Vec::with_capacity(6 * meta.rows.len());
        let mut tree: Vec<u32> = Vec::new();
        for (row, &clean) in meta.rows.iter().zip(clean) {
            assert!(row.seq < meta.block_tables.len(), "attention: row seq {} without a block table", row.seq);
            let need = (row.ctx as usize).div_ceil(spec.block_size);
            let have = meta.block_tables[row.seq].len();
            assert!(need <= have, "attention: ctx {} needs {need} blocks, the block table has {have}", row.ctx);
            let mut last = row.ctx.checked_sub(1);
            let t0 = tree.len() / 2;
            for &(pos, slot) in &row.tree {
                assert!(last.is_none_or(|l| pos > l), "attention: tree positions must increase past ctx");
                assert!(
                    (slot as usize) < spec.blocks * spec.block_size,
                    "attention: tree slot {slot} outside the pool"
                );
                last = Some(pos);
                tree.extend_from_slice(&[pos, slot]);
            }
            let as_i32 = |v: usize| i32::try_from(v).expect("attention metadata exceeds i32");
            rows.extend_from_slice(&[
                as_i32(row.pos as usize),
                as_i32(row.seq),
                as_i32(row.ctx as usize),
                as_i32(t0),
                as_i32(row.tree.len()),
                as_i32(clean.min(row.ctx) as usize),
            ]);
        }
        AttnBufs {
            rows: self.upload_or_panic(bytemuck::cast_slice(&rows)),
            bt: self.upload_or_panic(u32_bytes(&bt)),
            bt_off: self.upload_or_panic(bytemuck::cast_slice(&bt_off)),
            tree: self.upload_or_panic(u32_bytes(&tree)),
        }
    }

    /// The cos and sin rows (`[positions.len(), rot_dims / 2]` each) of `positions`, uploaded once per forward
    /// (cached across the layers).
    fn rope_tables(&self, positions: &[u32], rope: &Rope) -> Arc<(Buf, Buf)> {
        let half = rope.rot_dims / 2;
        let mut up = self.uploads();
        match &up.rope {
            Some((p, r, t)) if p == positions && r == rope => t.clone(),
            _ => {
                let (freqs, mscale) = (rope_freqs(rope), rope_mscale(rope));
                let rows = positions.len();
                let (mut cos, mut sin) = (vec![0f32; rows * half], vec![0f32; rows * half]);
                for (r, &p) in positions.iter().enumerate() {
                    let (c, s) = (&mut cos[r * half..(r + 1) * half], &mut sin[r * half..(r + 1) * half]);
                    rope_cos_sin_scaled(&freqs, mscale, p, c, s);
                }
                let t = Arc::new((self.upload_or_panic(f32_bytes(&cos)), self.upload_or_panic(f32_bytes(&sin))));
                up.rope = Some((positions.to_vec(), *rope, t.clone()));
                t
            }
        }
    }

    /// The KV slots of a forward's rows, uploaded once per forward (cached across the layers).
    fn slots_buf(&self, slots: &[u32]) -> Arc<Buf> {
        let mut up = self.uploads();
        match &up.slots {
            Some((s, b)) if s == slots => b.clone(),
            _ => {
                let b = Arc::new(self.upload_or_panic(u32_bytes(slots)));
                up.slots = Some((slots.to_vec(), b.clone()));
                b
            }
        }
    }

    /// Records that kernels just launched write `slots` of `store` (src/kv_writes.rs): called after the launch, so
    /// that the ticket it reads is one no earlier wait for the stream can satisfy.
    fn kv_written(&self, store: &CudaKv, slots: &[u32]) {
        let (ticket, done) = (self.gpu.write_ticket(), self.gpu.waits_done());
        let mut w = store.writes.lock().unwrap_or_else(|e| e.into_inner());
        w.record(ticket, done, slots.iter().copied(), store.spec.block_size);
    }

    /// Checks of `kv_write`'s arguments (shared with `rope_kv_write`); the layer's row width.
    fn kv_write_checks(&self, kv: &KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) -> usize {
        let store = cuda_kv(kv);
        let width = store.width();
        assert!(layer < store.spec.layers, "kv_write: layer {layer} of {}", store.spec.layers);
        assert!(k.cols == width && v.cols == width, "kv_write: k/v cols {}/{} vs {width}", k.cols, v.cols);
        assert!(k.rows == slots.len() && v.rows == slots.len(), "kv_write: rows vs {} slots", slots.len());
        for &s in slots {
            assert!((s as usize) < store.slots(), "kv_write: slot {s} outside the pool of {}", store.slots());
        }
        width
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        format!("cuda ({}, sm_{}{}, {})", self.gpu.name, self.gpu.cc.0, self.gpu.cc.1, self.arithmetic.name())
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    /// 1,024: a 2k prompt of the 7B Q4_K_M shape prefills 30% faster in chunks of 1,024 than of 256 (H200,
    /// docs/benchmarks.md), and a round's activations stay in the hundreds of MB.
    fn default_round_rows(&self) -> usize {
        1024
    }

    fn upload(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Weight, BackendError> {
        let err =
            |what: String| BackendError(format!("tensor '{}' ({} {:?}): {what}", info.name, info.dtype, info.shape));
        let dtype = info.dtype;
        let code = dtype_code(dtype).ok_or_else(|| err(format!("the CUDA backend has no kernels for {dtype}")))?;
        let shape: Vec<usize> = info
            .shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| err("dimension too large".into())))
            .collect::<Result<_, _>>()?;
        let in_dim = shape.last().copied().unwrap_or(1);
        let out_dim = if shape.len() >= 2 { shape[..shape.len() - 1].iter().product() } else { 1 };
        let bs = dtype.block_size();
        if in_dim % bs != 0 {
            return Err(err(format!("rows of {in_dim} elements are not whole blocks of {bs}")));
        }
        let total = out_dim.checked_mul(in_dim / bs * dtype.block_bytes()).ok_or_else(|| err("too large".into()))?;
        if bytes.len() != total {
            return Err(err(format!("expected {total} bytes, got {}", bytes.len())));
        }
        let buf = self.gpu.upload(bytes)?;
        // Float matrices of the portable arithmetic, when interleaving is on: permuted in place on the device
        // (kernels/matmul_il.cu, interleave_rows). The tensor arithmetic's kernels read the checkpoint order, so
        // nothing is permuted there.
        let interleaved = self.arithmetic == Arithmetic::Portable
            && !self.tune.no_interleave.load(Ordering::Relaxed)
            && shape.len() >= 2
            && interleave_block(dtype).is_some_and(|b| in_dim.is_multiple_of(b) && in_dim > 0 && out_dim > 0);
        if interleaved {
            let nblk = bytes.len() / 256;
            let (g, b) = elementwise_grid(16 * nblk);
            let epv = 16 / dtype.block_bytes();
            self.gpu.launch("interleave_rows").ptr(&buf).i64(nblk).int(epv as i32).go(g, b);
        }
        self.note_matrix_type(dtype, shape.len());
        let w = CudaWeight { dtype, code, out_dim, in_dim, buf, interleaved };
        Ok(Weight { name: info.name.clone(), dtype, shape, storage: Arc::new(w) })
    }

    fn upload_f32(&self, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, BackendError> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(values.len()) {
            return Err(BackendError(format!("{name}: {} values for shape {shape:?}", values.len())));
        }
        let info =
            TensorInfo { name: name.to_string(), dtype: DType::F32, shape: shape.iter().map(|&d| d as u64).collect() };
        self.upload(&info, f32_bytes(&values))
    }

    fn embed(&self, table: &Weight, ids: &[u32]) -> Tensor {
        self.embed_impl(table, ids)
    }

    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Tensor {
        self.matmul_impl(x, w, bias)
    }

    fn matmul_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        self.matmul_many_impl(x, ws)
    }

    fn rms_norm(&self, x: &Tensor, w: &Weight, group: usize, eps: f32) -> Tensor {
        let cw = weight(w);
        assert!(group > 0 && x.cols.is_multiple_of(group), "rms_norm: cols {} not a multiple of group {group}", x.cols);
        assert_eq!(cw.out_dim * cw.in_dim, group, "rms_norm: weight length");
        let out = self.alloc_f32(x.rows * x.cols);
        // Whole-row norms feed matmuls: a window's gets a half copy.
        let half = if group == x.cols { self.half_out(x.rows, x.cols) } else { None };
        if x.rows > 0 && x.cols > 0 {
            let xs = self.input(x);
            let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
            self.gpu
                .launch("rms_norm")
                .pdl()
                .ptr(xb)
                .i32(x.cols)
                .i32(group)
                .ptr(&cw.buf)
                .int(cw.tag())
                .f32(eps)
                .ptr(&out)
                .addr(half.as_ref().map_or(0, |h| h.0.ptr))
                .int(half.as_ref().is_some_and(|h| h.1) as i32)
                .go(((x.cols / group) as u32, x.rows as u32, 1), (norm_threads(group, self.gpu.norm_per), 1, 1));
        }
        self.tensor_half(x.rows, x.cols, out, half)
    }

    fn rope(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope) {
        assert_eq!(positions.len(), x.rows, "rope: one position per row");
        assert!(
            head_dim > 0 && x.cols.is_multiple_of(head_dim),
            "rope: cols {} not a multiple of head_dim {head_dim}",
            x.cols
        );
        assert!(rope.rot_dims <= head_dim, "rope: rot_dims {} > head_dim {head_dim}", rope.rot_dims);
        if x.rows == 0 {
            return;
        }
        let half = rope.rot_dims / 2;
        let tables = self.rope_tables(positions, rope);
        let (cb, sb) = (&tables.0, &tables.1);
        let (rows, cols) = (x.rows, x.cols);
        let xt = self.make_unique(x);
        let (g, b) = elementwise_grid(rows * (cols / head_dim) * half);
        self.gpu
            .launch("rope")
            .ptr(&xt.buf)
            .i32(rows)
            .i32(cols)
            .i32(head_dim)
            .i32(half)
            .ptr(cb)
            .ptr(sb)
            .int(i32::from(rope.style == RopeStyle::Neox))
            .go(g, b);
    }

    fn rope_kv_write(&self, q: &mut Tensor, k: &mut Tensor, v: &Tensor, kv: &mut KvCache, layer: usize, at: &RopeKv) {
        let (hd, rope) = (at.head_dim, at.rope);
        assert!(at.positions.len() == q.rows && at.positions.len() == k.rows, "rope_kv_write: one position per row");
        assert!(
            hd > 0 && q.cols.is_multiple_of(hd) && k.cols.is_multiple_of(hd),
            "rope_kv_write: q/k cols {}/{} not multiples of head_dim {hd}",
            q.cols,
            k.cols
        );
        assert!(rope.rot_dims <= hd, "rope_kv_write: rot_dims {} > head_dim {hd}", rope.rot_dims);
        let width = self.kv_write_checks(kv, layer, k, v, at.slots);
        let rows = q.rows;
        if rows == 0 || width == 0 {
            // Nothing to write; q may still have columns to rotate.
            return self.rope(q, at.positions, hd, rope);
        }
        let half = rope.rot_dims / 2;
        let tables = self.rope_tables(at.positions, rope);
        let sb = self.slots_buf(at.slots);
        let store = cuda_kv(kv);
        let off = (layer * store.layer_len() * 4) as u64;
        let (kptr, vptr) = (store.k.ptr + off, store.v.ptr + off);
        let vs = self.input(v);
        let vb = &vs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let qb = self.make_unique(q).buf.ptr;
        let kb = self.make_unique(k).buf.ptr;
        let units = rows * (q.cols / hd) * half + rows * (k.cols / hd) * (half + hd - 2 * half) + rows * width;
        let (g, b) = elementwise_grid(units);
        self.gpu
            .launch("rope_kv_write")
            .pdl()
            .addr(qb)
            .addr(kb)
            .ptr(vb)
            .i32(rows)
            .i32(q.cols)
            .i32(k.cols)
            .i32(hd)
            .i32(half)
            .ptr(&tables.0)
            .ptr(&tables.1)
            .int(i32::from(rope.style == RopeStyle::Neox))
            .addr(kptr)
            .addr(vptr)
            .ptr(&sb)
            .go(g, b);
        self.kv_written(store, at.slots);
    }

    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError> {
        let n = spec
            .layers
            .checked_mul(spec.blocks)
            .and_then(|v| v.checked_mul(spec.block_size))
            .and_then(|v| v.checked_mul(spec.kv_heads * spec.head_dim))
            .and_then(|v| v.checked_mul(4))
            .ok_or_else(|| BackendError(format!("KV cache {spec:?} is too large")))?;
        let kv = CudaKv { spec, k: self.gpu.zeros(n)?, v: self.gpu.zeros(n)?, writes: Mutex::default() };
        Ok(KvCache { spec, storage: Arc::new(kv), states: None })
    }

    fn kv_write(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) {
        self.kv_write_with(kv, layer, k, v, slots, None)
    }

    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]) {
        let store = cuda_kv(kv);
        assert_eq!(src.len(), dst.len(), "kv_copy: {} sources for {} destinations", src.len(), dst.len());
        for (&a, &b) in src.iter().zip(dst) {
            assert!((a.max(b) as usize) < store.slots(), "kv_copy: slot {a} or {b} outside the pool");
        }
        if src.is_empty() || store.spec.layers == 0 {
            return;
        }
        let (sb, db) = (self.upload_or_panic(u32_bytes(src)), self.upload_or_panic(u32_bytes(dst)));
        self.gpu
            .launch("kv_copy")
            .ptr(&store.k)
            .ptr(&store.v)
            .i64(store.layer_len())
            .i32(store.width())
            .ptr(&sb)
            .ptr(&db)
            .i32(src.len())
            .go((store.spec.layers as u32, 2, 1), (256, 1, 1));
        self.kv_written(store, dst);
    }

    fn attention(&self, q: &Tensor, kv: &KvCache, layer: usize, meta: &AttnMeta, p: &AttnParams) -> Tensor {
        self.attention_impl(q, kv, layer, meta, p)
    }

    fn glu(&self, gate: &Tensor, up: &Tensor, act: GluAct) -> Tensor {
        assert!(gate.rows == up.rows && gate.cols == up.cols, "glu: gate {gate:?} vs up {up:?}");
        let n = gate.rows * gate.cols;
        let out = self.alloc_f32(n);
        if n > 0 {
            let (gs, us) = (self.input(gate), self.input(up));
            let gb = &gs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
            let ub = &us.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
            let (g, b) = elementwise_grid(n);
            if let GluAct::SwigluClamp { alpha, limit } = act {
                self.gpu.launch("glu_clamp").ptr(gb).ptr(ub).i64(n).f32(alpha).f32(limit).ptr(&out).go(g, b);
            } else {
                self.gpu.launch("glu").ptr(gb).ptr(ub).i64(n).int(act_code(act)).ptr(&out).go(g, b);
            }
        }
        self.tensor(gate.rows, gate.cols, out)
    }

    fn matmul_glu(&self, x: &Tensor, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        if let GluAct::SwigluClamp { .. } = act {
            let [g, u]: [Tensor; 2] =
                self.matmul_many(x, &[(gate, None), (up, None)]).try_into().expect("one result per weight");
            return self.glu(&g, &u, act);
        }
        self.matmul_glu_impl(x, gate, up, act)
    }

    fn matmul_add(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, acc: &mut Tensor) {
        self.matmul_add_impl(x, w, bias, acc)
    }

    fn norm_matmul_many(&self, x: &Tensor, norm: &Weight, eps: f32, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        self.norm_matmul_many_impl(x, norm, eps, ws)
    }

    fn norm_qkv_rope_kv_write(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        ws: &[(&Weight, Option<&Weight>); 3],
        kv: &mut KvCache,
        layer: usize,
        at: &RopeKv,
    ) -> [Tensor; 3] {
        self.norm_qkv_rope_impl(x, norm, eps, ws, kv, layer, at)
    }

    fn norm_matmul_glu(&self, x: &Tensor, norm: &Weight, eps: f32, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        if let GluAct::SwigluClamp { .. } = act {
            let h = self.rms_norm(x, norm, x.cols, eps);
            return self.matmul_glu(&h, gate, up, act);
        }
        self.norm_matmul_glu_impl(x, norm, eps, gate, up, act)
    }

    fn add(&self, a: &mut Tensor, b: &Tensor) {
        assert!(a.rows == b.rows && a.cols == b.cols, "add: {a:?} += {b:?}");
        let n = a.rows * a.cols;
        if n == 0 {
            return;
        }
        let bs = self.input(b);
        let bb = &bs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let at = self.make_unique(a);
        let (g, blk) = elementwise_grid(n);
        self.gpu.launch("add").ptr(&at.buf).ptr(bb).i64(n).go(g, blk);
    }

    fn add_rms_norm(&self, a: &mut Tensor, b: &Tensor, w: &Weight, eps: f32) -> Tensor {
        assert!(a.rows == b.rows && a.cols == b.cols, "add_rms_norm: {a:?} += {b:?}");
        let cw = weight(w);
        assert_eq!(cw.out_dim * cw.in_dim, a.cols, "add_rms_norm: weight length");
        let (rows, cols) = (a.rows, a.cols);
        let out = self.alloc_f32(rows * cols);
        let half = self.half_out(rows, cols);
        if rows > 0 && cols > 0 {
            let bs = self.input(b);
            let bb = &bs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
            let at = self.make_unique(a);
            self.gpu
                .launch("add_rms_norm")
                .pdl()
                .ptr(&at.buf)
                .ptr(bb)
                .i32(cols)
                .ptr(&cw.buf)
                .int(cw.tag())
                .f32(eps)
                .ptr(&out)
                .addr(half.as_ref().map_or(0, |h| h.0.ptr))
                .int(half.as_ref().is_some_and(|h| h.1) as i32)
                .go((rows as u32, 1, 1), (norm_threads(cols, self.gpu.norm_per), 1, 1));
        }
        self.tensor_half(rows, cols, out, half)
    }

    fn scale(&self, x: &mut Tensor, s: f32) {
        let n = x.rows * x.cols;
        if n == 0 {
            return;
        }
        let xt = self.make_unique(x);
        let (g, b) = elementwise_grid(n);
        self.gpu.launch("scale").ptr(&xt.buf).i64(n).f32(s).go(g, b);
    }

    fn select_rows(&self, x: &Tensor, rows: &[usize]) -> Tensor {
        for &r in rows {
            assert!(r < x.rows, "select_rows: row {r} of {}", x.rows);
        }
        let out = self.alloc_f32(rows.len() * x.cols);
        if !rows.is_empty() && x.cols > 0 {
            let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
            let ib = self.upload_or_panic(u32_bytes(&idx));
            let xs = self.input(x);
            let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
            let (g, b) = elementwise_grid(rows.len() * x.cols);
            self.gpu.launch("select_rows").ptr(xb).i32(x.cols).ptr(&ib).i32(rows.len()).ptr(&out).go(g, b);
        }
        self.tensor(rows.len(), x.cols, out)
    }

    fn add_rows_scaled(&self, acc: &mut Tensor, y: &Tensor, rows: &[usize], scales: &[f32]) {
        assert_eq!(y.cols, acc.cols, "add_rows_scaled: columns");
        assert!(rows.len() == y.rows && scales.len() == y.rows, "add_rows_scaled: one row and scale per row of y");
        for &r in rows {
            assert!(r < acc.rows, "add_rows_scaled: row {r} of {}", acc.rows);
        }
        if rows.is_empty() || acc.cols == 0 {
            return;
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let ib = self.upload_or_panic(u32_bytes(&idx));
        let sb = self.upload_or_panic(&scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>());
        let cols = acc.cols;
        let ys = self.input(y);
        let yb = &ys.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let at = self.make_unique(acc);
        let (g, b) = elementwise_grid(cols);
        self.gpu.launch("add_rows_scaled").ptr(&at.buf).ptr(yb).i32(cols).ptr(&ib).ptr(&sb).i32(rows.len()).go(g, b);
    }

    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        match &x.device {
            None => x.host.clone(),
            Some(s) => {
                let t = s.downcast_ref::<CudaTensor>().expect("tensor of another backend");
                let n = x.rows * x.cols;
                let mut out: Vec<f32> = Vec::with_capacity(n);
                // SAFETY: the download writes all 4n bytes of the reserved capacity before the length is set (no
                // zero-filling first: for a window's logits that alone costs ~0.5 ms).
                unsafe {
                    self.gpu.download_into(&t.buf, out.as_mut_ptr().cast(), 4 * n);
                    out.set_len(n);
                }
                out
            }
        }
    }

    /// `argmax_rows` (kernels/ops.cu, backend/queued.rs): `R` keys downloaded instead of `R × cols` floats.
    fn argmax_rows(&self, x: &Tensor) -> Vec<u32> {
        self.argmax_rows_impl(x)
    }

    /// True: the argmax is queued on the stream; a forward fed by it reads it on the device (src/host_ids.rs).
    fn queues_ids(&self) -> bool {
        true
    }

    fn argmax_rows_queued(&self, x: &Tensor) -> QueuedIds {
        self.argmax_rows_queued_impl(x)
    }

    fn embed_queued(&self, table: &Weight, ids: &QueuedIds) -> Tensor {
        self.embed_queued_impl(table, ids)
    }

    fn take_ids(&self, ids: &QueuedIds) -> Vec<u32> {
        self.take_ids_impl(ids)
    }
}
