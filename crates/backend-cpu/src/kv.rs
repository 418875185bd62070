//! The CPU paged KV store: per layer, K and V of `[slots, kv_heads, head_dim]` values with
//! `slots = blocks · block_size` (slot `s`, kv head `h` at `(s · kv_heads + h) · head_dim`), stored as the
//! backend's [`KvType`]: f32, f16 bits, or q8_0 (scales `[slots, kv_heads, head_dim / 32]` as f16 bits beside
//! `i8` quants `[slots, kv_heads, head_dim]`). Each row is rounded when written, from its own values only
//! (`tf_quant::reference::kv`), so the stored bits of a slot never depend on other rows.
//!
//! `Backend::kv_write` takes `&mut KvCache` but the storage sits behind a shared `Arc<dyn Any>`, so each layer is
//! an `RwLock`: writes take it exclusively, attention reads share it. The lock is uncontended in practice (the
//! engine calls the backend from one thread), so its cost is one atomic operation per call and layer.

use crate::isa::Isa;
use std::sync::{RwLock, RwLockReadGuard};
use tf_core::{BackendError, KvCache, KvSpec, Tensor};
use tf_quant::reference::kv::{encode_f16, encode_q8_0, KvData, KvType, KvView, Q8_0_BLOCK};

/// K or V of one layer in its storage type.
pub enum KvBuf {
    /// `[slots, kv_heads, head_dim]`.
    F32(Vec<f32>),
    /// `[slots, kv_heads, head_dim]` f16 bits.
    F16(Vec<u16>),
    /// Scales `d [slots, kv_heads, head_dim / 32]` (f16 bits), quants `q [slots, kv_heads, head_dim]`.
    Q8_0 { d: Vec<u16>, q: Vec<i8> },
}

impl KvBuf {
    /// A zeroed buffer of `n` values.
    fn zeroed(ty: KvType, n: usize) -> Result<KvBuf, BackendError> {
        Ok(match ty {
            KvType::F32 => KvBuf::F32(zeroed(n)?),
            KvType::F16 => KvBuf::F16(zeroed(n)?),
            KvType::Q8_0 => KvBuf::Q8_0 { d: zeroed(n / Q8_0_BLOCK)?, q: zeroed(n)? },
        })
    }

    fn data(&self) -> KvData<'_> {
        match self {
            KvBuf::F32(x) => KvData::F32(x),
            KvBuf::F16(x) => KvData::F16(x),
            KvBuf::Q8_0 { d, q } => KvData::Q8_0 { d, q },
        }
    }

    /// Rounds `x` (whole kv heads' rows) into values `start .. start + x.len()`.
    fn encode(&mut self, start: usize, x: &[f32]) {
        let end = start + x.len();
        match self {
            KvBuf::F32(b) => b[start..end].copy_from_slice(x),
            KvBuf::F16(b) => encode_f16(x, &mut b[start..end]),
            KvBuf::Q8_0 { d, q } => {
                encode_q8_0(x, &mut d[start / Q8_0_BLOCK..end / Q8_0_BLOCK], &mut q[start..end]);
            }
        }
    }

    /// Copies the stored values `a .. a + n` to `b .. b + n` (whole rows), bit for bit.
    fn copy_within(&mut self, a: usize, b: usize, n: usize) {
        match self {
            KvBuf::F32(x) => x.copy_within(a..a + n, b),
            KvBuf::F16(x) => x.copy_within(a..a + n, b),
            KvBuf::Q8_0 { d, q } => {
                let (ab, bb, nb) = (a / Q8_0_BLOCK, b / Q8_0_BLOCK, n / Q8_0_BLOCK);
                d.copy_within(ab..ab + nb, bb);
                q.copy_within(a..a + n, b);
            }
        }
    }
}

/// One layer's K and V, each `[slots, kv_heads, head_dim]` values.
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
}

/// The storage behind a CPU [`KvCache`].
pub struct CpuKv {
    pub spec: KvSpec,
    pub ty: KvType,
    layers: Vec<RwLock<LayerKv>>,
}

/// Element types whose all-zero bit pattern is the value zero.
trait ZeroBits: Copy {}
impl ZeroBits for f32 {}
impl ZeroBits for u16 {}
impl ZeroBits for i8 {}

/// A zeroed `Vec` of `n` elements from `alloc_zeroed`, every page touched at once (the OS hands out zero pages
/// lazily; touching them now makes the pool resident from the start, so the process's RSS is the memory it holds
/// and no decode step waits on first-touch page faults), or an error instead of an abort when memory runs out.
fn zeroed<T: ZeroBits>(n: usize) -> Result<Vec<T>, BackendError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n)
        .map_err(|_| BackendError(format!("KV cache of {n} values per layer is too large")))?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(BackendError(format!("out of memory allocating {} bytes of KV cache", layout.size())));
    }
    for i in (0..layout.size()).step_by(4096) {
        // SAFETY: `i < layout.size()`, inside the allocation; a volatile write so the touch is not folded into
        // the allocation.
        unsafe { std::ptr::write_volatile(ptr.add(i), 0u8) };
    }
    // SAFETY: `ptr` comes from the global allocator with `Layout::array::<T>(n)`, the layout `Vec<T>` uses for
    // capacity `n`; all `n` elements are initialized (all-zero bits are a zero `T`, by `ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(ptr as *mut T, n, n) })
}

impl CpuKv {
    /// Values per layer for K (and for V).
    fn layer_len(spec: &KvSpec) -> Option<usize> {
        spec.blocks.checked_mul(spec.block_size)?.checked_mul(spec.kv_heads)?.checked_mul(spec.head_dim)
    }

    /// A zeroed pool of `spec` stored as `ty` (an error when `ty` cannot store rows of `spec.head_dim`).
    pub fn alloc(spec: KvSpec, ty: KvType) -> Result<CpuKv, BackendError> {
        ty.check(spec.head_dim).map_err(BackendError)?;
        let n = Self::layer_len(&spec).ok_or_else(|| BackendError(format!("KV cache {spec:?} is too large")))?;
        let mut layers = Vec::with_capacity(spec.layers);
        for _ in 0..spec.layers {
            layers.push(RwLock::new(LayerKv { k: KvBuf::zeroed(ty, n)?, v: KvBuf::zeroed(ty, n)? }));
        }
        Ok(CpuKv { spec, ty, layers })
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
    pub fn view<'a>(&self, l: &'a LayerKv) -> KvView<'a> {
        KvView {
            k: l.k.data(),
            v: l.v.data(),
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
            l.k.encode(s * width, k.row(r));
            l.v.encode(s * width, v.row(r));
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
                l.k.copy_within(a * width, b * width, width);
                l.v.copy_within(a * width, b * width, width);
            }
        }
    }
}

/// Values `start .. start + out.len()` of `data` read back as f32, bit-equal to [`KvData::decode`] (whole q8_0
/// blocks). With AVX2 and F16C: f16 widened by `vcvtph2ps` (exact; it would quiet a signalling NaN, which the
/// f16 rounding never stores), q8_0 as `f16(d) · q` by lanes of 8, the same one rounded product.
pub(crate) fn read_back(isa: Isa, data: &KvData, start: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && std::is_x86_feature_detected!("f16c") {
        let end = start + out.len();
        match data {
            // SAFETY: the CPU has AVX2 and F16C (checked above); the slices have `out.len()` values.
            KvData::F16(h) => return unsafe { x86::f16_row(&h[start..end], out) },
            KvData::Q8_0 { d, q } => {
                assert!(start.is_multiple_of(Q8_0_BLOCK) && end.is_multiple_of(Q8_0_BLOCK), "q8_0: {start}..{end}");
                let ds = &d[start / Q8_0_BLOCK..end / Q8_0_BLOCK];
                // SAFETY: as above; `ds` has one scale per 32 values of `q[start..end]` and `out`.
                return unsafe { x86::q8_0_row(ds, &q[start..end], out) };
            }
            KvData::F32(_) => {}
        }
    }
    data.decode(start, out)
}

/// [`read_back`] of several rows of `width` values, row `i` from `starts[i]` into `out[i·width..(i + 1)·width]`,
/// with the CPU check and the dispatch done once for all of them.
pub(crate) fn read_back_rows(isa: Isa, data: &KvData, starts: &[usize], width: usize, out: &mut [f32]) {
    assert_eq!(out.len(), starts.len() * width, "read_back_rows: output length");
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && std::is_x86_feature_detected!("f16c") {
        match data {
            KvData::F16(h) => {
                assert!(starts.iter().all(|&s| s + width <= h.len()), "read_back_rows: rows outside the cache");
                // SAFETY: the CPU has AVX2 and F16C (checked above); every row lies inside `h` (checked).
                return unsafe { x86::f16_rows(h, starts, width, out) };
            }
            KvData::Q8_0 { d, q } => {
                for (&start, o) in starts.iter().zip(out.chunks_exact_mut(width)) {
                    let end = start + width;
                    assert!(start.is_multiple_of(Q8_0_BLOCK) && end.is_multiple_of(Q8_0_BLOCK), "q8_0: {start}..{end}");
                    // SAFETY: as above; one scale per 32 values of `q[start..end]` and `o`.
                    unsafe { x86::q8_0_row(&d[start / Q8_0_BLOCK..end / Q8_0_BLOCK], &q[start..end], o) };
                }
                return;
            }
            KvData::F32(_) => {}
        }
    }
    for (&start, o) in starts.iter().zip(out.chunks_exact_mut(width)) {
        read_back(isa, data, start, o);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use tf_quant::reference::kv::{f16_widen, Q8_0_BLOCK};

    /// `out[i] = f16 h[i]` (same lengths).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_row(h: &[u16], out: &mut [f32]) {
        assert_eq!(h.len(), out.len());
        let full = out.len() / 8 * 8;
        for i in (0..full).step_by(8) {
            // SAFETY: i + 8 <= len of both.
            unsafe {
                let v = _mm_loadu_si128(h.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(v));
            }
        }
        for (o, &v) in out[full..].iter_mut().zip(&h[full..]) {
            *o = f16_widen(v);
        }
    }

    /// `out[i·width + j] = f16 h[starts[i] + j]` for every row `i`.
    ///
    /// # Safety
    /// AVX2 and F16C; every `starts[i] + width <= h.len()`; `out.len() == starts.len() · width`.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_rows(h: &[u16], starts: &[usize], width: usize, out: &mut [f32]) {
        let full = width / 8 * 8;
        for (&start, o) in starts.iter().zip(out.chunks_exact_mut(width)) {
            let src = h.as_ptr().add(start);
            for i in (0..full).step_by(8) {
                let v = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm256_storeu_ps(o.as_mut_ptr().add(i), _mm256_cvtph_ps(v));
            }
            for (j, oj) in o.iter_mut().enumerate().skip(full) {
                *oj = f16_widen(*src.add(j));
            }
        }
    }

    /// `out[32b + j] = f16(d[b]) · q[32b + j]` (`q`, `out`: 32 values per scale).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn q8_0_row(d: &[u16], q: &[i8], out: &mut [f32]) {
        assert!(q.len() == out.len() && d.len() * Q8_0_BLOCK == q.len());
        for (b, &db) in d.iter().enumerate() {
            let s = _mm256_set1_ps(f16_widen(db));
            for j in (0..Q8_0_BLOCK).step_by(8) {
                let o = b * Q8_0_BLOCK + j;
                // SAFETY: o + 8 <= (b + 1) * 32 <= len of both.
                unsafe {
                    let v = _mm_loadl_epi64(q.as_ptr().add(o) as *const __m128i);
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                    _mm256_storeu_ps(out.as_mut_ptr().add(o), _mm256_mul_ps(s, f));
                }
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

    /// The stored bits of values `s·width .. (s + 1)·width` (q8_0: the row's scales, then its quants).
    fn raw(b: &KvBuf, s: usize, width: usize) -> Vec<u32> {
        let r = s * width..(s + 1) * width;
        match b {
            KvBuf::F32(x) => x[r].iter().map(|f| f.to_bits()).collect(),
            KvBuf::F16(x) => x[r].iter().map(|&h| h as u32).collect(),
            KvBuf::Q8_0 { d, q } => {
                let rd = r.start / Q8_0_BLOCK..r.end / Q8_0_BLOCK;
                d[rd].iter().map(|&h| h as u32).chain(q[r].iter().map(|&v| v as u8 as u32)).collect()
            }
        }
    }

    #[test]
    fn copy_moves_every_layer_bit_for_bit_in_order() {
        for ty in KvType::ALL {
            // head_dim 32 (one q8_0 block per head), 2 kv heads: rows of 64 values.
            let spec = KvSpec { layers: 3, blocks: 4, block_size: 4, kv_heads: 2, head_dim: 32 };
            let kv = CpuKv::alloc(spec, ty).unwrap();
            let width = 64;
            let slots: Vec<u32> = (0..16).collect();
            for layer in 0..3 {
                // [16, 64]: finite values of every magnitude.
                let vals = |salt: u32| -> Tensor {
                    let v = (0..16 * width)
                        .map(|i| {
                            let b = (i as u32).wrapping_mul(2654435761) ^ salt;
                            f32::from_bits((b & 0x807f_ffff) | ((b >> 24) % 200 + 20) << 23)
                        })
                        .collect();
                    Tensor::host(16, width, v)
                };
                kv.write(layer, &vals(layer as u32 + 1), &vals(layer as u32 * 77 + 7), &slots);
            }
            let before: Vec<Vec<(Vec<u32>, Vec<u32>)>> = (0..3)
                .map(|l| {
                    let g = kv.read(l);
                    (0..16).map(|s| (raw(&g.k, s, width), raw(&g.v, s, width))).collect()
                })
                .collect();
            // 9 → 2 then 2 → 5: applied in order, so slot 5 gets slot 9's values.
            kv.copy(&[9, 2, 14], &[2, 5, 0]);
            for (l, rows) in before.iter().enumerate() {
                let g = kv.read(l);
                assert_eq!(raw(&g.k, 2, width), rows[9].0, "{ty:?}");
                assert_eq!(raw(&g.k, 5, width), rows[9].0, "{ty:?}");
                assert_eq!(raw(&g.v, 0, width), rows[14].1, "{ty:?}");
                assert_eq!(raw(&g.v, 9, width), rows[9].1, "{ty:?}");
                for s in [1, 3, 4, 6, 7, 8, 10, 15] {
                    assert_eq!(raw(&g.k, s, width), rows[s].0, "{ty:?}");
                    assert_eq!(raw(&g.v, s, width), rows[s].1, "{ty:?}");
                }
            }
        }
    }

    #[test]
    fn read_back_equals_the_reference_at_every_isa() {
        // Every f16 bit pattern but the signalling NaNs (the f16 rounding never stores one): [65536 - 1022].
        let h: Vec<u16> =
            (0..=u16::MAX).filter(|&h| !(h & 0x7c00 == 0x7c00 && h & 0x3ff != 0 && h & 0x200 == 0)).collect();
        // q8_0: 64 blocks of every scale pattern class and quants -127..=127.
        let d: Vec<u16> = (0..64u16)
            .map(|b| [0u16, 0x0001, 0x03ff, 0x3c00, 0x7bff, 0x1234][b as usize % 6] ^ (b << 10 & 0x8000))
            .collect();
        let q: Vec<i8> = (0..64 * 32).map(|i| ((i * 37) % 255) as i8).map(|v| v.max(-127)).collect();
        let datas = [KvData::F16(&h[..h.len() / 8 * 8]), KvData::Q8_0 { d: &d, q: &q }];
        for data in datas {
            for (start, n) in [(0, data.len()), (32, 64), (96, 32)] {
                let mut want = vec![0f32; n]; // [n]
                data.decode(start, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; n]; // [n]
                    read_back(isa, &data, start, &mut got);
                    let (g, w): (Vec<u32>, Vec<u32>) =
                        (got.iter().map(|x| x.to_bits()).collect(), want.iter().map(|x| x.to_bits()).collect());
                    assert_eq!(g, w, "{:?} {start}+{n} at {}", data.kv_type(), isa.name());
                }
            }
        }
    }

    #[test]
    fn read_back_rows_equals_row_by_row_reads() {
        let h: Vec<u16> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 16) as u16 & 0x7bff).collect();
        let d: Vec<u16> = (0..64u16).map(|b| 0x2000 + b * 37).collect();
        let q: Vec<i8> = (0..64 * 32).map(|i| ((i * 53) % 255) as i8).map(|v| v.max(-127)).collect();
        // f16 rows of 20 values (8-lane steps and a tail of 4) and q8_0 rows of 64, at scattered starts.
        let cases = [
            (KvData::F16(&h), 20, vec![0, 100, 20, 4000, 333]),
            (KvData::Q8_0 { d: &d, q: &q }, 64, vec![0, 960, 64, 1984]),
        ];
        for (data, width, starts) in cases {
            let mut want = vec![0f32; starts.len() * width]; // [rows, width]
            for (&st, w) in starts.iter().zip(want.chunks_exact_mut(width)) {
                data.decode(st, w);
            }
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; starts.len() * width]; // [rows, width]
                read_back_rows(isa, &data, &starts, width, &mut got);
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{:?} at {}",
                    data.kv_type(),
                    isa.name()
                );
            }
        }
    }

    #[test]
    fn q8_0_refuses_partial_blocks() {
        let spec = KvSpec { layers: 1, blocks: 1, block_size: 4, kv_heads: 1, head_dim: 48 };
        assert!(CpuKv::alloc(spec, KvType::Q8_0).is_err());
        assert!(CpuKv::alloc(spec, KvType::F16).is_ok());
    }
}
