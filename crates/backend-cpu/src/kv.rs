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

/// A zeroed `Vec<f32>` of `n` elements from `alloc_zeroed`, every page touched at once (the OS hands out zero
/// pages lazily; touching them now makes the pool resident from the start, so the process's RSS is the memory it
/// holds and no decode step waits on first-touch page faults), or an error instead of an abort when memory runs
/// out.
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
    const PAGE_FLOATS: usize = 4096 / std::mem::size_of::<f32>();
    for i in (0..n).step_by(PAGE_FLOATS) {
        // SAFETY: `i < n`, inside the allocation; a volatile write so the touch is not folded into the
        // allocation.
        unsafe { std::ptr::write_volatile(ptr.add(i), 0.0) };
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

impl CpuKv {
    /// Copies every layer's K and V of slot `src[i]` to `dst[i]`, in order.
    pub fn copy(&self, src: &[u32], dst: &[u32]) {
        assert_eq!(src.len(), dst.len(), "kv_copy: {} sources for {} destinations", src.len(), dst.len());
        let width = self.spec.kv_heads * self.spec.head_dim;
        let total = self.slots();
        for layer in &self.layers {
            let mut l = layer.write().unwrap_or_else(|e| e.into_inner());
            for (&a, &b) in src.iter().zip(dst) {
                let (a, b) = (a as usize, b as usize);
                assert!(a < total && b < total, "kv_copy: slot {a} or {b} outside the pool of {total}");
                l.k.copy_within(a * width..(a + 1) * width, b * width);
                l.v.copy_within(a * width..(a + 1) * width, b * width);
            }
        }
    }
}

/// The CPU storage of `kv` (panics on a cache from another backend).
pub fn cpu_kv(kv: &KvCache) -> &CpuKv {
    kv.storage.downcast_ref::<CpuKv>().expect("KvCache was not allocated by the CPU backend")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_moves_every_layer_bit_for_bit_in_order() {
        let spec = KvSpec { layers: 3, blocks: 4, block_size: 4, kv_heads: 2, head_dim: 3 };
        let kv = CpuKv::alloc(spec).unwrap();
        let width = 6;
        let slots: Vec<u32> = (0..16).collect();
        for layer in 0..3 {
            let vals = |salt: f32| -> Tensor {
                let v = (0..16 * width)
                    .map(|i| f32::from_bits((i as u32).wrapping_mul(2654435761) ^ salt.to_bits()))
                    .collect();
                Tensor::host(16, width, v)
            };
            kv.write(layer, &vals(layer as f32 + 1.0), &vals(-(layer as f32) - 7.0), &slots);
        }
        let before: Vec<(Vec<f32>, Vec<f32>)> = (0..3).map(|l| (kv.read(l).k.clone(), kv.read(l).v.clone())).collect();
        // 9 → 2 then 2 → 5: applied in order, so slot 5 gets slot 9's values.
        kv.copy(&[9, 2, 14], &[2, 5, 0]);
        for (l, (k0, v0)) in before.iter().enumerate() {
            let g = kv.read(l);
            let row =
                |x: &[f32], s: usize| x[s * width..(s + 1) * width].iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(row(&g.k, 2), row(k0, 9));
            assert_eq!(row(&g.k, 5), row(k0, 9));
            assert_eq!(row(&g.v, 0), row(v0, 14));
            assert_eq!(row(&g.v, 9), row(v0, 9));
            for s in [1, 3, 4, 6, 7, 8, 10, 15] {
                assert_eq!(row(&g.k, s), row(k0, s));
                assert_eq!(row(&g.v, s), row(v0, s));
            }
        }
    }
}
