//! IQ2_XXS: super-blocks of 256 in 8 sub-blocks of 32, each element a grid value (8, 25 or 43) with a sign;
//! groups of 8 elements take one entry of GGML's 256-entry grid [`IQ2XXS_GRID`] (`iq2xxs_grid`) and their signs
//! from 7 stored bits through [`KSIGNS_IQ2XS`] (`ksigns_iq2xs`: the eighth bit is the parity).

use bytemuck::{Pod, Zeroable};
use half::f16;
use tf_core::DType;

use crate::float::f16_to_f32;
use crate::{QuantBlock, KSIGNS_IQ2XS, QK_K};

/// IQ2_XXS: `x = ((d * (0.5 + sc)) * 0.25) * grid * sign` with a 4-bit sub-block scale `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ2XXS {
    /// Super-block scale.
    pub d: f16,
    /// Per sub-block `j`, the little-endian u16 words `4 j..4 j + 4` read as two u32: the first holds the grid
    /// index of its group of 8 elements `k` (0..4) in byte `k`; the second (`aux`) the sub-block's scale
    /// `aux >> 28` and the sign index of group `k` in `(aux >> 7 k) & 127`.
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);

/// GGML's `iq2xxs_grid`: entry `i` holds the 8 values of a group, byte `k` (little-endian) for element `k`.
#[rustfmt::skip]
pub const IQ2XXS_GRID: [u64; 256] = [
    0x0808080808080808, 0x080808080808082b, 0x0808080808081919, 0x0808080808082b08, 0x0808080808082b2b,
    0x0808080808190819, 0x0808080808191908, 0x08080808082b0808, 0x08080808082b082b, 0x08080808082b2b08,
    0x08080808082b2b2b, 0x0808080819080819, 0x0808080819081908, 0x0808080819190808, 0x0808080819192b08,
    0x08080808192b0819, 0x08080808192b1908, 0x080808082b080808, 0x080808082b08082b, 0x080808082b082b2b,
    0x080808082b2b082b, 0x0808081908080819, 0x0808081908081908, 0x0808081908190808, 0x0808081908191919,
    0x0808081919080808, 0x080808192b081908, 0x080808192b192b08, 0x0808082b08080808, 0x0808082b0808082b,
    0x0808082b082b082b, 0x0808082b2b08082b, 0x0808190808080819, 0x0808190808081908, 0x0808190808190808,
    0x08081908082b0819, 0x08081908082b1908, 0x0808190819080808, 0x080819081908082b, 0x0808190819082b08,
    0x08081908192b0808, 0x080819082b080819, 0x080819082b081908, 0x080819082b190808, 0x080819082b2b1908,
    0x0808191908080808, 0x080819190808082b, 0x0808191908082b08, 0x08081919082b0808, 0x080819191908192b,
    0x08081919192b2b19, 0x080819192b080808, 0x080819192b190819, 0x0808192b08082b19, 0x0808192b08190808,
    0x0808192b19080808, 0x0808192b2b081908, 0x0808192b2b2b1908, 0x08082b0808080808, 0x08082b0808081919,
    0x08082b0808082b08, 0x08082b0808191908, 0x08082b08082b2b08, 0x08082b0819080819, 0x08082b0819081908,
    0x08082b0819190808, 0x08082b081919082b, 0x08082b082b082b08, 0x08082b1908081908, 0x08082b1919080808,
    0x08082b2b0808082b, 0x08082b2b08191908, 0x0819080808080819, 0x0819080808081908, 0x0819080808190808,
    0x08190808082b0819, 0x0819080819080808, 0x08190808192b0808, 0x081908082b081908, 0x081908082b190808,
    0x081908082b191919, 0x0819081908080808, 0x0819081908082b08, 0x08190819082b0808, 0x0819081919190808,
    0x0819081919192b2b, 0x081908192b080808, 0x0819082b082b1908, 0x0819082b19081919, 0x0819190808080808,
    0x0819190808082b08, 0x08191908082b0808, 0x08191908082b1919, 0x0819190819082b19, 0x081919082b080808,
    0x0819191908192b08, 0x08191919192b082b, 0x0819192b08080808, 0x0819192b0819192b, 0x08192b0808080819,
    0x08192b0808081908, 0x08192b0808190808, 0x08192b0819080808, 0x08192b082b080819, 0x08192b1908080808,
    0x08192b1908081919, 0x08192b192b2b0808, 0x08192b2b19190819, 0x082b080808080808, 0x082b08080808082b,
    0x082b080808082b2b, 0x082b080819081908, 0x082b0808192b0819, 0x082b08082b080808, 0x082b08082b08082b,
    0x082b0819082b2b19, 0x082b081919082b08, 0x082b082b08080808, 0x082b082b0808082b, 0x082b190808080819,
    0x082b190808081908, 0x082b190808190808, 0x082b190819080808, 0x082b19081919192b, 0x082b191908080808,
    0x082b191919080819, 0x082b1919192b1908, 0x082b192b2b190808, 0x082b2b0808082b08, 0x082b2b08082b0808,
    0x082b2b082b191908, 0x082b2b2b19081908, 0x1908080808080819, 0x1908080808081908, 0x1908080808190808,
    0x1908080808192b08, 0x19080808082b0819, 0x19080808082b1908, 0x1908080819080808, 0x1908080819082b08,
    0x190808081919192b, 0x19080808192b0808, 0x190808082b080819, 0x190808082b081908, 0x190808082b190808,
    0x1908081908080808, 0x19080819082b0808, 0x19080819192b0819, 0x190808192b080808, 0x190808192b081919,
    0x1908082b08080819, 0x1908082b08190808, 0x1908082b19082b08, 0x1908082b1919192b, 0x1908082b192b2b08,
    0x1908190808080808, 0x1908190808082b08, 0x19081908082b0808, 0x190819082b080808, 0x190819082b192b19,
    0x190819190819082b, 0x19081919082b1908, 0x1908192b08080808, 0x19082b0808080819, 0x19082b0808081908,
    0x19082b0808190808, 0x19082b0819080808, 0x19082b0819081919, 0x19082b1908080808, 0x19082b1919192b08,
    0x19082b19192b0819, 0x19082b192b08082b, 0x19082b2b19081919, 0x19082b2b2b190808, 0x1919080808080808,
    0x1919080808082b08, 0x1919080808190819, 0x1919080808192b19, 0x19190808082b0808, 0x191908082b080808,
    0x191908082b082b08, 0x1919081908081908, 0x191908191908082b, 0x191908192b2b1908, 0x1919082b2b190819,
    0x191919082b190808, 0x191919082b19082b, 0x1919191908082b2b, 0x1919192b08080819, 0x1919192b19191908,
    0x19192b0808080808, 0x19192b0808190819, 0x19192b0808192b19, 0x19192b08192b1908, 0x19192b1919080808,
    0x19192b2b08082b08, 0x192b080808081908, 0x192b080808190808, 0x192b080819080808, 0x192b0808192b2b08,
    0x192b081908080808, 0x192b081919191919, 0x192b082b08192b08, 0x192b082b192b0808, 0x192b190808080808,
    0x192b190808081919, 0x192b191908190808, 0x192b19190819082b, 0x192b19192b081908, 0x192b2b081908082b,
    0x2b08080808080808, 0x2b0808080808082b, 0x2b08080808082b2b, 0x2b08080819080819, 0x2b0808082b08082b,
    0x2b08081908081908, 0x2b08081908192b08, 0x2b08081919080808, 0x2b08082b08190819, 0x2b08190808080819,
    0x2b08190808081908, 0x2b08190808190808, 0x2b08190808191919, 0x2b08190819080808, 0x2b081908192b0808,
    0x2b08191908080808, 0x2b0819191908192b, 0x2b0819192b191908, 0x2b08192b08082b19, 0x2b08192b19080808,
    0x2b08192b192b0808, 0x2b082b080808082b, 0x2b082b1908081908, 0x2b082b2b08190819, 0x2b19080808081908,
    0x2b19080808190808, 0x2b190808082b1908, 0x2b19080819080808, 0x2b1908082b2b0819, 0x2b1908190819192b,
    0x2b1908192b080808, 0x2b19082b19081919, 0x2b19190808080808, 0x2b191908082b082b, 0x2b19190819081908,
    0x2b19191919190819, 0x2b192b082b080819, 0x2b192b19082b0808, 0x2b2b08080808082b, 0x2b2b080819190808,
    0x2b2b08082b081919, 0x2b2b081908082b19, 0x2b2b082b08080808, 0x2b2b190808192b08, 0x2b2b2b0819190808,
    0x2b2b2b1908081908,
];

impl BlockIQ2XXS {
    /// Sub-block `j`'s word `w` (0: grid indices, 1: scale and signs) as a u32.
    #[inline]
    fn word(&self, j: usize, w: usize) -> u32 {
        self.qs[4 * j + 2 * w] as u32 | (self.qs[4 * j + 2 * w + 1] as u32) << 16
    }

    /// The grid value (8, 25 or 43, unsigned) of element `e`.
    #[inline]
    pub fn grid_value(&self, e: usize) -> u8 {
        let (j, k) = (e / 32, (e % 32) / 8);
        let index = (self.word(j, 0) >> (8 * k)) & 255;
        (IQ2XXS_GRID[index as usize] >> (8 * (e % 8))) as u8
    }

    /// Whether element `e` is negative.
    #[inline]
    pub fn negative(&self, e: usize) -> bool {
        let (j, k) = (e / 32, (e % 32) / 8);
        (KSIGNS_IQ2XS[((self.word(j, 1) >> (7 * k)) & 127) as usize] >> (e % 8)) & 1 != 0
    }

    /// The 4-bit scale of sub-block `j` (0..8); the sub-block's multiplier is `(0.5 + sc) * 0.25`.
    #[inline]
    pub fn scale(&self, j: usize) -> u8 {
        (self.word(j, 1) >> 28) as u8
    }
}

impl QuantBlock for BlockIQ2XXS {
    const DTYPE: DType = DType::IQ2XXS;
    const BLOCK: usize = QK_K;

    /// Per sub-block `db = (d * (0.5 + f32(sc))) * 0.25`; then `x = (db * f32(grid)) * ±1` (gguf-py
    /// `db * grid * signs`; the product by −1 as a negation that leaves a NaN as it is, as x86 does).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] =
            out.try_into().expect("dequantize: `out` must hold exactly one super-block (256 elements)");
        let d = f16_to_f32(self.d);
        for (j, out) in out.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + self.scale(j) as f32) * 0.25;
            for (i, o) in out.iter_mut().enumerate() {
                let e = 32 * j + i;
                let v = db * self.grid_value(e) as f32;
                *o = if self.negative(e) && !v.is_nan() { -v } else { v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every grid byte is one of the three values, the entries are distinct, and GGML's table starts and ends
    /// with these entries.
    #[test]
    fn grid() {
        for (i, &g) in IQ2XXS_GRID.iter().enumerate() {
            assert!(g.to_le_bytes().iter().all(|b| [8, 25, 43].contains(b)), "{i}: {g:#x}");
            assert!(!IQ2XXS_GRID[..i].contains(&g), "{i}");
        }
        assert_eq!(IQ2XXS_GRID[..3], [0x0808080808080808, 0x080808080808082b, 0x0808080808081919]);
        assert_eq!(IQ2XXS_GRID[255], 0x2b2b2b1908081908);
    }

    /// A hand-built block: grid index, sign index and scale of every group read back from their bit fields.
    #[test]
    fn hand_built_block() {
        let mut b = BlockIQ2XXS { d: f16::from_f32(2.0), qs: [0; 32] };
        for j in 0..8 {
            let idx = u32::from_le_bytes([(j * 4) as u8, (j * 4 + 1) as u8, 255, 7]);
            let aux = ((j as u32 + 8) << 28) | (1 << 7) | (127 << 21);
            for (w, v) in [idx, aux].into_iter().enumerate() {
                b.qs[4 * j + 2 * w] = v as u16;
                b.qs[4 * j + 2 * w + 1] = (v >> 16) as u16;
            }
        }
        let mut out = [0f32; 256];
        b.dequantize(&mut out);
        for (e, &o) in out.iter().enumerate() {
            let (j, k, i) = (e / 32, (e % 32) / 8, e % 8);
            let idx = [4 * j, 4 * j + 1, 255, 7][k];
            let g = (IQ2XXS_GRID[idx] >> (8 * i)) as u8 as f32;
            // Group 1: sign index 1 (ksigns 129: elements 0 and 7); group 3: index 127 (ksigns 255: all).
            let neg = (k == 1 && (i == 0 || i == 7)) || k == 3;
            let want = 2.0 * (0.5 + (j + 8) as f32) * 0.25 * g;
            assert_eq!(o, if neg { -want } else { want }, "element {e}");
        }
    }
}
