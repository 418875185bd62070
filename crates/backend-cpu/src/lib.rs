//! The CPU backend: [`CpuBackend`] implements `tf_core::Backend` with row-exact kernels, AVX2/AVX-512 or NEON
//! where the CPU has them and the scalar reference (`tf_quant::reference`) otherwise, threaded by a persistent
//! [`Pool`]. Every op gives the reference's bits whatever the ISA, the thread count or the number of rows in the
//! call (docs/arithmetic.md, DESIGN.md §2): threads split rows, (row, head) pairs or output columns, never a
//! reduction, and no kernel is chosen by row count.
//!
//! Modules: `matmul` (matmul, weights, embeddings), `attention`, `norm`, `rope`, `kv` (the paged KV store),
//! `math` (exp/tanh/silu/gelu vectors), `simd` (`dot16` and lane-wise slice operations).

mod attention;
pub mod isa;
mod kv;
#[cfg(target_arch = "x86_64")]
mod kv_dot;
mod math;
pub mod matmul;
mod norm;
pub mod pool;
mod rope;
mod simd;
mod ssm;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tf_core::{
    AttnMeta, AttnParams, Backend, BackendError, DType, GluAct, KvCache, KvSpec, Precision, Rope, SharedBytes, Tensor,
    TensorInfo, Weight,
};

pub use isa::Isa;
pub use kv::CpuKv;
pub use matmul::CpuWeight;
pub use pool::Pool;
pub use tf_quant::reference::kv::KvType;

/// Below this many elements an op runs on the calling thread (waking the pool costs more than the work).
const PAR_MIN: usize = 1 << 14;

/// Runs `f(r, row)` over the rows (`cols` wide) of `data`, on the pool when there is enough work.
pub(crate) fn for_rows(pool: &Pool, data: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if cols == 0 || data.is_empty() {
        return;
    }
    if data.len() < PAR_MIN || pool.threads() == 1 {
        data.chunks_mut(cols).enumerate().for_each(|(r, row)| f(r, row));
    } else {
        // About four tasks per thread, whole rows each.
        let per = data.len().div_ceil(cols).div_ceil(4 * pool.threads());
        pool.for_chunks_mut(data, per * cols, |i, rows| {
            rows.chunks_mut(cols).enumerate().for_each(|(j, row)| f(i * per + j, row))
        });
    }
}

/// Runs `f(offset, chunk)` over fixed chunks of `data` (for elementwise ops, where any split gives the same bits).
fn for_chunks(pool: &Pool, data: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    if data.len() < PAR_MIN || pool.threads() == 1 {
        f(0, data);
    } else {
        pool.for_chunks_mut(data, PAR_MIN, |i, c| f(i * PAR_MIN, c));
    }
}

/// The `CpuWeight` behind a weight (panics on a weight uploaded to another backend: a programming error).
fn cpu_weight(w: &Weight) -> &CpuWeight {
    w.storage
        .downcast_ref::<CpuWeight>()
        .unwrap_or_else(|| panic!("weight {} was not uploaded by the CPU backend", w.name))
}

/// f32 values of small vector weights (norms), converted once per weight. Entries are keyed by the storage's
/// address and hold a `Weak` to it: while the `Weak` lives the allocation cannot be reused, so a key never
/// aliases another weight; entries of dropped weights are pruned on the next miss.
#[derive(Default)]
struct VectorCache {
    map: Mutex<HashMap<usize, VectorEntry>>,
}

/// A weak handle on a vector weight's storage and its f32 values.
type VectorEntry = (Weak<dyn Any + Send + Sync>, Arc<Vec<f32>>);

impl VectorCache {
    fn get(&self, w: &Weight) -> Arc<Vec<f32>> {
        let key = Arc::as_ptr(&w.storage) as *const () as usize;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((weak, values)) = map.get(&key) {
            if weak.upgrade().is_some_and(|s| Arc::ptr_eq(&s, &w.storage)) {
                return values.clone();
            }
        }
        let values = Arc::new(cpu_weight(w).as_f32_vec());
        map.retain(|_, (weak, _)| weak.strong_count() > 0);
        map.insert(key, (Arc::downgrade(&w.storage), values.clone()));
        values
    }
}

/// The CPU backend: an ISA level, a precision mode, a KV storage type and a pool of `threads` threads (the
/// caller's included).
pub struct CpuBackend {
    pool: Pool,
    threads: usize,
    isa: Isa,
    precision: Precision,
    kv_type: KvType,
    rope: rope::RopeCache,
    vectors: VectorCache,
}

impl CpuBackend {
    /// A backend at the best ISA this CPU supports. `threads == 0` means one per physical core
    /// ([`pool::default_threads`]).
    pub fn new(threads: usize, precision: Precision) -> CpuBackend {
        CpuBackend::with_isa(threads, precision, Isa::detect())
    }

    /// A backend at a given ISA (tests compare every level). Panics when the CPU lacks `isa`.
    pub fn with_isa(threads: usize, precision: Precision, isa: Isa) -> CpuBackend {
        assert!(Isa::available().contains(&isa), "this CPU cannot run {}", isa.name());
        let threads = if threads == 0 { pool::default_threads() } else { threads };
        let pool = Pool::new(threads);
        let (rope, vectors) = (Default::default(), Default::default());
        CpuBackend { pool, threads, isa, precision, kv_type: KvType::F32, rope, vectors }
    }

    /// The backend storing its KV caches as `ty` (f32 unless set): each type is its own arithmetic
    /// (docs/arithmetic.md "KV storage types").
    pub fn with_kv_type(mut self, ty: KvType) -> CpuBackend {
        self.kv_type = ty;
        self
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        match self.kv_type {
            KvType::F32 => format!("cpu ({}, {} threads)", self.isa.name(), self.threads),
            ty => format!("cpu ({}, {} threads, {} KV)", self.isa.name(), self.threads, ty.name()),
        }
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn upload(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Weight, BackendError> {
        let w = CpuWeight::from_bytes(info, bytes)?;
        Ok(Weight { name: info.name.clone(), dtype: w.dtype(), shape: w.shape().to_vec(), storage: Arc::new(w) })
    }

    fn upload_shared(&self, info: &TensorInfo, bytes: SharedBytes) -> Result<Weight, BackendError> {
        let w = CpuWeight::from_shared(info, bytes)?;
        Ok(Weight { name: info.name.clone(), dtype: w.dtype(), shape: w.shape().to_vec(), storage: Arc::new(w) })
    }

    fn upload_f32(&self, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, BackendError> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(values.len()) {
            return Err(BackendError(format!("{name}: {} values for shape {shape:?}", values.len())));
        }
        let w = CpuWeight::from_f32(shape, values);
        Ok(Weight { name: name.to_string(), dtype: DType::F32, shape: shape.to_vec(), storage: Arc::new(w) })
    }

    fn embed(&self, table: &Weight, ids: &[u32]) -> Tensor {
        let t = cpu_weight(table);
        let hidden = t.in_dim();
        let mut out = Tensor::zeros(ids.len(), hidden);
        for_rows(&self.pool, &mut out.host, hidden, |r, row| t.row_f32(ids[r] as usize, row));
        out
    }

    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Tensor {
        matmul::matmul(&self.pool, self.isa, self.precision, x, cpu_weight(w), bias.map(cpu_weight))
    }

    fn matmul_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        let ws: Vec<_> = ws.iter().map(|&(w, b)| (cpu_weight(w), b.map(cpu_weight))).collect();
        matmul::matmul_many(&self.pool, self.isa, self.precision, x, &ws)
    }

    fn rms_norm(&self, x: &Tensor, w: &Weight, group: usize, eps: f32) -> Tensor {
        let values = self.vectors.get(w);
        norm::rms_norm(&self.pool, self.isa, x, &values, group, eps)
    }

    fn rope(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope) {
        rope::rope(&self.pool, &self.rope, x, positions, head_dim, rope)
    }

    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError> {
        Ok(KvCache { spec, storage: Arc::new(CpuKv::alloc(spec, self.kv_type)?), states: None })
    }

    fn kv_write(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) {
        kv::cpu_kv(kv).write(layer, k, v, slots)
    }

    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]) {
        kv::cpu_kv(kv).copy(src, dst)
    }

    fn attention(&self, q: &Tensor, kv: &KvCache, layer: usize, meta: &AttnMeta, p: &AttnParams) -> Tensor {
        let store = kv::cpu_kv(kv);
        let guard = store.read(layer);
        attention::attention(&self.pool, self.isa, q, &store.view(&guard), meta, p)
    }

    fn glu(&self, gate: &Tensor, up: &Tensor, act: GluAct) -> Tensor {
        assert!(
            gate.rows == up.rows && gate.cols == up.cols,
            "glu: gate [{}, {}] vs up [{}, {}]",
            gate.rows,
            gate.cols,
            up.rows,
            up.cols
        );
        let mut out = Tensor::zeros(gate.rows, gate.cols);
        for_chunks(&self.pool, &mut out.host, |o, c| {
            let n = c.len();
            math::glu(self.isa, &gate.host[o..o + n], &up.host[o..o + n], act, c)
        });
        out
    }

    fn add(&self, a: &mut Tensor, b: &Tensor) {
        assert!(a.rows == b.rows && a.cols == b.cols, "add: [{}, {}] += [{}, {}]", a.rows, a.cols, b.rows, b.cols);
        for_chunks(&self.pool, &mut a.host, |o, c| {
            let n = c.len();
            simd::add(self.isa, c, &b.host[o..o + n])
        });
    }

    fn scale(&self, x: &mut Tensor, s: f32) {
        for_chunks(&self.pool, &mut x.host, |_, c| simd::scale(self.isa, c, s));
    }

    fn select_rows(&self, x: &Tensor, rows: &[usize]) -> Tensor {
        let mut out = Tensor::zeros(rows.len(), x.cols);
        for (i, &r) in rows.iter().enumerate() {
            assert!(r < x.rows, "select_rows: row {r} of {}", x.rows);
            out.row_mut(i).copy_from_slice(x.row(r));
        }
        out
    }

    fn add_rows_scaled(&self, acc: &mut Tensor, y: &Tensor, rows: &[usize], scales: &[f32]) {
        assert_eq!(y.cols, acc.cols, "add_rows_scaled: columns");
        assert!(rows.len() == y.rows && scales.len() == y.rows, "add_rows_scaled: one row and scale per row of y");
        for (i, (&r, &s)) in rows.iter().zip(scales).enumerate() {
            assert!(r < acc.rows, "add_rows_scaled: row {r} of {}", acc.rows);
            // `a + s·v` element by element: the compiler keeps the product and the sum separately rounded (Rust
            // never contracts them into a fused multiply-add), as the reference does.
            for (a, &v) in acc.row_mut(r).iter_mut().zip(y.row(i)) {
                *a += s * v;
            }
        }
    }

    fn relu_sq(&self, x: &Tensor) -> Tensor {
        ssm::relu_sq(x)
    }

    fn alloc_states(&self, spec: tf_core::StateSpec) -> Result<tf_core::StateCache, BackendError> {
        Ok(tf_core::StateCache { spec, storage: Arc::new(ssm::CpuStates::alloc(spec)?) })
    }

    fn ssm_conv(
        &self,
        x: &Tensor,
        w: &[f32],
        b: Option<&[f32]>,
        st: &tf_core::StateCache,
        layer: usize,
        io: &[tf_core::StateIo],
    ) -> Tensor {
        ssm::ssm_conv(x, w, b, st, layer, io)
    }

    fn ssm_scan(
        &self,
        xbc: &Tensor,
        dt: &Tensor,
        z: &Tensor,
        norm: &[f32],
        p: &tf_core::SsmParams<'_>,
        st: &tf_core::StateCache,
        layer: usize,
        io: &[tf_core::StateIo],
    ) -> Tensor {
        ssm::ssm_scan(&self.pool, self.isa, xbc, dt, z, norm, p, st, layer, io)
    }

    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        x.host.clone()
    }

    /// The rule straight on the tensor's data (the default would copy it first).
    fn argmax_rows(&self, x: &Tensor) -> Vec<u32> {
        tf_core::argmax_rows_of(&x.host, x.rows, x.cols)
    }
}
