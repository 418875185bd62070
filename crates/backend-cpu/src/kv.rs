//! The CPU paged KV store: per layer, f32 K and V of `[slots, kv_heads, head_dim]` with
//! `slots = blocks · block_size` (slot `s`, kv head `h` at `(s · kv_heads + h) · head_dim`).
//!
//! `Backend::kv_write` takes `&mut KvCache` but the storage sits behind a shared `Arc<dyn Any>`, so each layer is
//! an `RwLock`: writes take it exclusively, attention reads share it. The lock is uncontended in practice (the
//! engine calls the backend from one thread), so its cost is one atomic operation per call and layer.

use std::sync::{RwLock, RwLockReadGuard};
use tf_core::{BackendError, KvCache, KvSpec, Tensor};
use tf_quant::reference::ops::KvLayer;

/// One layer's K and V, each `[slots, kv_heads, head_dim]`.
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The storage behind a CPU [`KvCache`].
pub struct CpuKv {
    pub spec: KvSpec,
    layers: Vec<RwLock<LayerKv>>,
}

/// A zeroed `Vec<f32>` of `n` elements from `alloc_zeroed` (the OS hands out zero pages lazily, so a large
/// cache costs no time until it is written), or an error instead of an abort when memory runs out.
fn zeroed_f32(n: usize) -> Result<Vec<f32>, BackendError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n)
        .map_err(|_| BackendError(format!("KV cache of {n} floats per layer is too large")))?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
    if ptr.is_null() {
        return Err(BackendError(format!("out of memory allocating {} bytes of KV cache", layout.size())));
    }
    // SAFETY: `ptr` comes from the global allocator with `Layout::array::<f32>(n)`, the layout `Vec<f32>` uses
    // for capacity `n`; all `n` elements are initialized (all-zero bits are `0.0f32`).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

impl CpuKv {
    /// Floats per layer for K (and for V).
    fn layer_len(spec: &KvSpec) -> Option<usize> {
        spec.blocks.checked_mul(spec.block_size)?.checked_mul(spec.kv_heads)?.checked_mul(spec.head_dim)
    }

    pub fn alloc(spec: KvSpec) -> Result<CpuKv, BackendError> {
        let n = Self::layer_len(&spec).ok_or_else(|| BackendError(format!("KV cache {spec:?} is too large")))?;
        let mut layers = Vec::with_capacity(spec.layers);
        for _ in 0..spec.layers {
            layers.push(RwLock::new(LayerKv { k: zeroed_f32(n)?, v: zeroed_f32(n)? }));
        }
        Ok(CpuKv { spec, layers })
    }

    /// Token slots in the pool.
    pub fn slots(&self) -> usize {
        self.spec.blocks * self.spec.block_size
    }

    /// Shared access to one layer (for attention).
    pub fn read(&self, layer: usize) -> RwLockReadGuard<'_, LayerKv> {
        assert!(layer < self.layers.len(), "kv: layer {layer} of {}", self.layers.len());
        self.layers[layer].read().unwrap_or_else(|e| e.into_inner())
    }

    /// The reference's view of a read-locked layer.
    pub fn view<'a>(&self, l: &'a LayerKv) -> KvLayer<'a> {
        KvLayer {
            k: &l.k,
            v: &l.v,
            block_size: self.spec.block_size,
            kv_heads: self.spec.kv_heads,
            head_dim: self.spec.head_dim,
        }
    }

    /// Writes rows `k [R, kv_heads·head_dim]`, `v [R, kv_heads·head_dim]` into `slots[r]` of `layer`.
    pub fn write(&self, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]) {
        let width = self.spec.kv_heads * self.spec.head_dim;
        assert!(layer < self.layers.len(), "kv_write: layer {layer} of {}", self.layers.len());
        assert!(
            k.cols == width && v.cols == width,
            "kv_write: k/v cols {}/{} vs kv_heads·head_dim {width}",
            k.cols,
            v.cols
        );
        assert!(
            k.rows == slots.len() && v.rows == slots.len(),
            "kv_write: rows {}/{} vs {} slots",
            k.rows,
            v.rows,
            slots.len()
        );
        let total = self.slots();
        let mut l = self.layers[layer].write().unwrap_or_else(|e| e.into_inner());
        for (r, &slot) in slots.iter().enumerate() {
            let s = slot as usize;
            assert!(s < total, "kv_write: slot {s} outside the pool of {total}");
            l.k[s * width..(s + 1) * width].copy_from_slice(k.row(r));
            l.v[s * width..(s + 1) * width].copy_from_slice(v.row(r));
        }
    }
}

/// The CPU storage of `kv` (panics on a cache from another backend).
pub fn cpu_kv(kv: &KvCache) -> &CpuKv {
    kv.storage.downcast_ref::<CpuKv>().expect("KvCache was not allocated by the CPU backend")
}
