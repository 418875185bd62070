//! The 4-bit i-quants IQ4_NL and IQ4_XS: 4-bit indices into GGML's fixed non-linear table
//! [`KVALUES_IQ4NL`] (`kvalues_iq4nl` in `ggml-common.h`), scaled per block (IQ4_NL) or per sub-block of 32
//! (IQ4_XS).
//!
//! Nibble order in both: within each 32 elements, byte `j` of their 16 bytes holds element `j` in its low
//! nibble and element `j + 16` in its high nibble (as the legacy 4-bit types).

use bytemuck::{Pod, Zeroable};
use half::f16;
use tf_core::DType;

use crate::float::f16_to_f32;
use crate::{QuantBlock, QK, QK_K};

/// The 16 values a 4-bit index of IQ4_NL and IQ4_XS selects (GGML's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// IQ4_NL: `x = d * kvalues[q]` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// Scale.
    pub d: f16,
    /// 32 4-bit indices: `qs[j] & 15` is element `j`, `qs[j] >> 4` element `j + 16`.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// IQ4_XS: 8 sub-blocks of 32; `x = (d * (ls - 32)) * kvalues[q]` with a 6-bit sub-block scale `ls`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// Super-block scale.
    pub d: f16,
    /// High 2 bits of the sub-block scales: bits `2 j..2 j + 2` of this little-endian u16 belong to sub-block `j`.
    pub scales_h: [u8; 2],
    /// Low 4 bits of the sub-block scales: `scales_l[j / 2] >> 4 (j % 2)` for sub-block `j`.
    pub scales_l: [u8; QK_K / 64],
    /// 256 4-bit indices: sub-block `j` is `qs[16 j..16 j + 16]`, packed as in [`BlockIQ4NL`].
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// The 8 sub-block scales of an IQ4_XS block with the bias of 32 removed (`-32..=31`):
/// `(scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2 j) & 3) << 4`, minus 32.
#[inline]
pub fn iq4xs_scales(scales_h: [u8; 2], scales_l: &[u8; 4]) -> [i8; 8] {
    let h = u16::from_le_bytes(scales_h);
    std::array::from_fn(|j| {
        let low = (scales_l[j / 2] >> (4 * (j % 2))) & 15;
        let high = ((h >> (2 * j)) & 3) as u8;
        (low | (high << 4)) as i8 - 32
    })
}

impl QuantBlock for BlockIQ4NL {
    const DTYPE: DType = DType::IQ4NL;
    const BLOCK: usize = QK;

    /// `x = d * f32(kvalues[q])`: one f32 product (gguf-py `d * qs`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().expect("dequantize: `out` must hold exactly one block (32 elements)");
        let d = f16_to_f32(self.d);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((&b, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * KVALUES_IQ4NL[(b & 15) as usize] as f32;
            *h = d * KVALUES_IQ4NL[(b >> 4) as usize] as f32;
        }
    }
}

impl QuantBlock for BlockIQ4XS {
    const DTYPE: DType = DType::IQ4XS;
    const BLOCK: usize = QK_K;

    /// Per sub-block `dl = d * f32(ls - 32)`; then `x = dl * f32(kvalues[q])` (gguf-py `dl * qs`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] =
            out.try_into().expect("dequantize: `out` must hold exactly one super-block (256 elements)");
        let d = f16_to_f32(self.d);
        let sc = iq4xs_scales(self.scales_h, &self.scales_l);
        for ((qs, out), &sc) in self.qs.chunks_exact(16).zip(out.chunks_exact_mut(32)).zip(&sc) {
            let dl = d * sc as f32;
            let (lo, hi) = out.split_at_mut(16);
            for ((&b, l), h) in qs.iter().zip(lo).zip(hi) {
                *l = dl * KVALUES_IQ4NL[(b & 15) as usize] as f32;
                *h = dl * KVALUES_IQ4NL[(b >> 4) as usize] as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-built blocks: every index, scale bits in both halves, the signs of the biased scales.
    #[test]
    fn hand_built_blocks() {
        let mut b = BlockIQ4NL { d: f16::from_f32(0.5), qs: [0; 16] };
        for j in 0..16 {
            b.qs[j] = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut out = [0f32; 32];
        b.dequantize(&mut out);
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * KVALUES_IQ4NL[j] as f32);
            assert_eq!(out[j + 16], 0.5 * KVALUES_IQ4NL[15 - j] as f32);
        }
        // Sub-block j's scale: low nibble j + 1 (of scales_l[j / 2]), high bits j % 4: ls = (j % 4) * 16 + j + 1.
        let scales_l = [0x21, 0x43, 0x65, 0x87];
        let h: u16 = (0..8).map(|j| ((j % 4) as u16) << (2 * j)).sum();
        let ls: [i32; 8] = std::array::from_fn(|j| (j as i32 % 4) * 16 + j as i32 + 1);
        assert_eq!(iq4xs_scales(h.to_le_bytes(), &scales_l), ls.map(|l| (l - 32) as i8));
        let mut qs = [0u8; 128];
        for (i, q) in qs.iter_mut().enumerate() {
            *q = (i * 7 % 256) as u8;
        }
        let x = BlockIQ4XS { d: f16::from_f32(0.25), scales_h: h.to_le_bytes(), scales_l, qs };
        let mut out = [0f32; 256];
        x.dequantize(&mut out);
        for (e, &o) in out.iter().enumerate() {
            let (j, l) = (e / 32, e % 32);
            let byte = qs[16 * j + l % 16];
            let q = if l < 16 { byte & 15 } else { byte >> 4 };
            assert_eq!(o, 0.25 * (ls[j] - 32) as f32 * KVALUES_IQ4NL[q as usize] as f32, "element {e}");
        }
    }
}
