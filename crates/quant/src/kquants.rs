//! The GGML K-quants: 256-element super-blocks split into 16 or 8 sub-blocks with their own small scales.
//!
//! Common layout idea: the super-block is processed in halves of 128 elements (Q2_K, Q3_K, Q6_K) or quarters of
//! 64 (Q4_K, Q5_K); within each, one byte array is read several times with growing bit shifts, each shift
//! giving the next 32 (or 16) consecutive elements.

use bytemuck::{Pod, Zeroable};
use half::f16;
use tf_core::DType;

use crate::float::f16_to_f32;
use crate::QuantBlock;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// Q2_K: 16 sub-blocks of 16; `x = (d * sc) * q - (dmin * m)` with 2-bit `q` and 4-bit `sc`, `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per sub-block `j` (16 elements): `scales[j] & 15` is its scale, `scales[j] >> 4` its min.
    pub scales: [u8; QK_K / 16],
    /// 2-bit values. Element `128 h + 32 s + l` (h < 2, s < 4, l < 32) is `(qs[32 h + l] >> 2 s) & 3`.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the sub-block scales.
    pub d: f16,
    /// Super-block scale of the sub-block mins.
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Q3_K: 16 sub-blocks of 16; `x = (d * (sc - 32)) * q` with signed 3-bit `q` in -4..=3 and 6-bit `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of each 3-bit value: element `32 b + l` (b < 8, l < 32) uses bit `b` of `hmask[l]`; a clear bit
    /// subtracts 4.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits. Element `128 h + 32 s + l` (h < 2, s < 4, l < 32) is `(qs[32 h + l] >> 2 s) & 3`.
    pub qs: [u8; QK_K / 4],
    /// 16 6-bit sub-block scales (biased by 32), unpacked by [`q3k_scales`]: low 4 bits of scale `j` in
    /// `scales[j % 8]` (low nibble for j < 8, high for j >= 8), high 2 bits at shift `2 (j / 4)` of `scales[8 + j % 4]`.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Q4_K: 8 sub-blocks of 32; `x = (d * sc) * q - (dmin * m)` with 4-bit `q` and 6-bit `sc`, `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales.
    pub d: f16,
    /// Super-block scale of the sub-block mins.
    pub dmin: f16,
    /// 8 6-bit scales and 8 6-bit mins, unpacked by [`q4k_scale_min`].
    pub scales: [u8; 12],
    /// 4-bit values. Element `64 c + 32 n + l` (c < 4, n < 2, l < 32) is `(qs[32 c + l] >> 4 n) & 15`.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Q5_K: 8 sub-blocks of 32; `x = (d * sc) * q - (dmin * m)` with 5-bit `q` and 6-bit `sc`, `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the sub-block scales.
    pub d: f16,
    /// Super-block scale of the sub-block mins.
    pub dmin: f16,
    /// 8 6-bit scales and 8 6-bit mins, packed as in [`BlockQ4K`].
    pub scales: [u8; 12],
    /// 5th bit: element `32 j + l` (j < 8, l < 32) uses bit `j` of `qh[l]`.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, packed as the 4-bit values of [`BlockQ4K`].
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// Q6_K: 16 sub-blocks of 16; `x = (d * sc) * (q - 32)` with 6-bit `q` and signed 8-bit `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits. For element `128 h + 32 t + l` (h < 2, t < 4, l < 32): byte `ql[64 h + 32 (t % 2) + l]`,
    /// low nibble for t < 2, high nibble for t >= 2.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits: element `128 h + 32 t + l` uses `(qh[32 h + l] >> 2 t) & 3`.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales, signed.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// Q8_K: `x = d * q` with signed 8-bit `q`; GGML's activation format for K-quant dot products.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (an f32, unlike every other block).
    pub d: f32,
    /// 256 signed 8-bit values, in element order.
    pub qs: [i8; QK_K],
    /// Sums of each group of 16 `qs`, for dot products; not used by dequantization.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// The 16 sub-block scales of a [`BlockQ3K`], with the bias of 32 removed (`-32..=31`).
#[inline]
pub fn q3k_scales(packed: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = if j < 8 { packed[j] & 0x0f } else { packed[j - 8] >> 4 };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The 8 sub-block scales and 8 mins of a [`BlockQ4K`] or [`BlockQ5K`], each 6 bits.
///
/// Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4; bytes 8..12 hold the low 4 bits of
/// scales 4..8 (low nibble) and mins 4..8 (high nibble), whose top 2 bits are the top bits of bytes 0..4 and 4..8.
#[inline]
pub fn q4k_scale_min(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn, mix) = (&packed[0..4], &packed[4..8], &packed[8..12]);
    let scales =
        std::array::from_fn(|j| if j < 4 { sc[j] & 0x3f } else { (mix[j - 4] & 0x0f) | ((sc[j - 4] >> 2) & 0x30) });
    let mins =
        std::array::from_fn(|j| if j < 4 { mn[j] & 0x3f } else { (mix[j - 4] >> 4) | ((mn[j - 4] >> 2) & 0x30) });
    (scales, mins)
}

/// Views `out` as one super-block (panics on another length, as [`QuantBlock::dequantize`] documents).
#[inline(always)]
fn block_out(out: &mut [f32]) -> &mut [f32; QK_K] {
    out.try_into().expect("dequantize: `out` must hold exactly one super-block (256 elements)")
}

impl QuantBlock for BlockQ2K {
    const DTYPE: DType = DType::Q2K;
    const BLOCK: usize = QK_K;

    /// Per sub-block `dl = d * f32(sc & 15)`, `ml = dmin * f32(sc >> 4)`; then `x = dl * f32(q) - ml`, each
    /// step an f32 operation rounded on its own (gguf-py `dl * qs - ml`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (h, (qs, out)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(128)).enumerate() {
            for (s, out) in out.chunks_exact_mut(32).enumerate() {
                for (k, (qs, out)) in qs.chunks_exact(16).zip(out.chunks_exact_mut(16)).enumerate() {
                    let sc = self.scales[8 * h + 2 * s + k];
                    let dl = d * (sc & 0x0f) as f32;
                    let ml = dmin * (sc >> 4) as f32;
                    for (o, &q) in out.iter_mut().zip(qs) {
                        *o = dl * ((q >> (2 * s)) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

impl QuantBlock for BlockQ3K {
    const DTYPE: DType = DType::Q3K;
    const BLOCK: usize = QK_K;

    /// Per sub-block `dl = d * f32(sc - 32)`; then `x = dl * f32(q)` with `q = low2 - (high bit clear ? 4 : 0)`
    /// (gguf-py `dl * q`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        for (h, (qs, out)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(128)).enumerate() {
            for (s, out) in out.chunks_exact_mut(32).enumerate() {
                let bit = 4 * h + s;
                for k in 0..2 {
                    let dl = d * scales[8 * h + 2 * s + k] as f32;
                    let range = 16 * k..16 * k + 16;
                    for ((o, &q), &hm) in out[range.clone()].iter_mut().zip(&qs[range.clone()]).zip(&self.hmask[range])
                    {
                        let low = ((q >> (2 * s)) & 3) as i32;
                        let high = ((hm >> bit) & 1) as i32;
                        *o = dl * (low - 4 + 4 * high) as f32;
                    }
                }
            }
        }
    }
}

impl QuantBlock for BlockQ4K {
    const DTYPE: DType = DType::Q4K;
    const BLOCK: usize = QK_K;

    /// Per sub-block `ds = d * f32(sc)`, `dm = dmin * f32(m)`; then `x = ds * f32(q) - dm` (gguf-py `d * qs - dm`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        let (sc, mn) = q4k_scale_min(&self.scales);
        for (c, (qs, out)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
            for (n, out) in out.chunks_exact_mut(32).enumerate() {
                let ds = d * sc[2 * c + n] as f32;
                let dm = dmin * mn[2 * c + n] as f32;
                for (o, &q) in out.iter_mut().zip(qs) {
                    *o = ds * ((q >> (4 * n)) & 0x0f) as f32 - dm;
                }
            }
        }
    }
}

impl QuantBlock for BlockQ5K {
    const DTYPE: DType = DType::Q5K;
    const BLOCK: usize = QK_K;

    /// Per sub-block `ds = d * f32(sc)`, `dm = dmin * f32(m)`; then `x = ds * f32(q) - dm` with 5-bit `q`
    /// (gguf-py `d * q - dm`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        let (sc, mn) = q4k_scale_min(&self.scales);
        for (c, (qs, out)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
            for (n, out) in out.chunks_exact_mut(32).enumerate() {
                let j = 2 * c + n;
                let ds = d * sc[j] as f32;
                let dm = dmin * mn[j] as f32;
                for ((o, &q), &hb) in out.iter_mut().zip(qs).zip(&self.qh) {
                    let q = ((q >> (4 * n)) & 0x0f) | (((hb >> j) & 1) << 4);
                    *o = ds * q as f32 - dm;
                }
            }
        }
    }
}

impl QuantBlock for BlockQ6K {
    const DTYPE: DType = DType::Q6K;
    const BLOCK: usize = QK_K;

    /// Per sub-block `ds = d * f32(sc)`; then `x = ds * f32(q - 32)` (gguf-py `d * q`, with `d = d * scales`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        for (h, ((ql, qh), out)) in
            self.ql.chunks_exact(64).zip(self.qh.chunks_exact(32)).zip(out.chunks_exact_mut(128)).enumerate()
        {
            for (t, out) in out.chunks_exact_mut(32).enumerate() {
                let low = &ql[32 * (t % 2)..32 * (t % 2) + 32];
                let low_shift = 4 * (t / 2);
                for k in 0..2 {
                    let ds = d * self.scales[8 * h + 2 * t + k] as f32;
                    let range = 16 * k..16 * k + 16;
                    for ((o, &lo), &hi) in out[range.clone()].iter_mut().zip(&low[range.clone()]).zip(&qh[range]) {
                        let q = ((lo >> low_shift) & 0x0f) | (((hi >> (2 * t)) & 3) << 4);
                        *o = ds * (q as i32 - 32) as f32;
                    }
                }
            }
        }
    }
}

impl QuantBlock for BlockQ8K {
    const DTYPE: DType = DType::Q8K;
    const BLOCK: usize = QK_K;

    /// `x = d * f32(q)`, `bsums` unused. gguf-py has no Q8_K; this is GGML's `dequantize_row_q8_K`.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests;
