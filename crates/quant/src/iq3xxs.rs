//! IQ3_XXS: super-blocks of 256 in 8 sub-blocks of 32, each element a grid value (4..=62) with a sign; groups of
//! 4 elements take one entry of GGML's 256-entry grid [`IQ3XXS_GRID`] (`iq3xxs_grid`), each group of 8 elements
//! its signs from 7 stored bits through [`KSIGNS_IQ2XS`] (`ksigns_iq2xs`: the eighth bit is the parity).

use bytemuck::{Pod, Zeroable};
use half::f16;
use tf_core::DType;

use crate::float::f16_to_f32;
use crate::{QuantBlock, QK_K};

/// IQ3_XXS: `x = ((d * (0.5 + sc)) * 0.5) * grid * sign` with a 4-bit sub-block scale `sc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockIQ3XXS {
    /// Super-block scale.
    pub d: f16,
    /// Bytes 0..64: the grid index of each group of 4 elements (group `g` is `qs[g]`). Bytes 64..96: per
    /// sub-block `j` a little-endian u32 `aux`: its scale `aux >> 28`, and for its group of 8 elements `k` (0..4)
    /// the sign index `(aux >> 7 k) & 127`.
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);

/// GGML's `iq3xxs_grid`: entry `i` holds the 4 values of a group, byte `k` (little-endian) for element `k`.
pub const IQ3XXS_GRID: [u32; 256] = [
    0x04040404, 0x04040414, 0x04040424, 0x04040c0c, 0x04040c1c, 0x04040c3e, 0x04041404, 0x04041414, 0x04041c0c,
    0x04042414, 0x04043e1c, 0x04043e2c, 0x040c040c, 0x040c041c, 0x040c0c04, 0x040c0c14, 0x040c140c, 0x040c142c,
    0x040c1c04, 0x040c1c14, 0x040c240c, 0x040c2c24, 0x040c3e04, 0x04140404, 0x04140414, 0x04140424, 0x04140c0c,
    0x04141404, 0x04141414, 0x04141c0c, 0x04141c1c, 0x04141c3e, 0x04142c0c, 0x04142c3e, 0x04143e2c, 0x041c040c,
    0x041c043e, 0x041c0c04, 0x041c0c14, 0x041c142c, 0x041c3e04, 0x04240c1c, 0x04241c3e, 0x04242424, 0x04242c3e,
    0x04243e1c, 0x04243e2c, 0x042c040c, 0x042c043e, 0x042c1c14, 0x042c2c14, 0x04341c2c, 0x04343424, 0x043e0c04,
    0x043e0c24, 0x043e0c34, 0x043e241c, 0x043e340c, 0x0c04040c, 0x0c04041c, 0x0c040c04, 0x0c040c14, 0x0c04140c,
    0x0c04141c, 0x0c041c04, 0x0c041c14, 0x0c041c24, 0x0c04243e, 0x0c042c04, 0x0c0c0404, 0x0c0c0414, 0x0c0c0c0c,
    0x0c0c1404, 0x0c0c1414, 0x0c14040c, 0x0c14041c, 0x0c140c04, 0x0c140c14, 0x0c14140c, 0x0c141c04, 0x0c143e14,
    0x0c1c0404, 0x0c1c0414, 0x0c1c1404, 0x0c1c1c0c, 0x0c1c2434, 0x0c1c3434, 0x0c24040c, 0x0c24042c, 0x0c242c04,
    0x0c2c1404, 0x0c2c1424, 0x0c2c2434, 0x0c2c3e0c, 0x0c34042c, 0x0c3e1414, 0x0c3e2404, 0x14040404, 0x14040414,
    0x14040c0c, 0x14040c1c, 0x14041404, 0x14041414, 0x14041434, 0x14041c0c, 0x14042414, 0x140c040c, 0x140c041c,
    0x140c042c, 0x140c0c04, 0x140c0c14, 0x140c140c, 0x140c1c04, 0x140c341c, 0x140c343e, 0x140c3e04, 0x14140404,
    0x14140414, 0x14140c0c, 0x14140c3e, 0x14141404, 0x14141414, 0x14141c3e, 0x14142404, 0x14142c2c, 0x141c040c,
    0x141c0c04, 0x141c0c24, 0x141c3e04, 0x141c3e24, 0x14241c2c, 0x14242c1c, 0x142c041c, 0x142c143e, 0x142c240c,
    0x142c3e24, 0x143e040c, 0x143e041c, 0x143e0c34, 0x143e242c, 0x1c04040c, 0x1c040c04, 0x1c040c14, 0x1c04140c,
    0x1c04141c, 0x1c042c04, 0x1c04342c, 0x1c043e14, 0x1c0c0404, 0x1c0c0414, 0x1c0c1404, 0x1c0c1c0c, 0x1c0c2424,
    0x1c0c2434, 0x1c14040c, 0x1c14041c, 0x1c140c04, 0x1c14142c, 0x1c142c14, 0x1c143e14, 0x1c1c0c0c, 0x1c1c1c1c,
    0x1c241c04, 0x1c24243e, 0x1c243e14, 0x1c2c0404, 0x1c2c0434, 0x1c2c1414, 0x1c2c2c2c, 0x1c340c24, 0x1c341c34,
    0x1c34341c, 0x1c3e1c1c, 0x1c3e3404, 0x24040424, 0x24040c3e, 0x24041c2c, 0x24041c3e, 0x24042c1c, 0x24042c3e,
    0x240c3e24, 0x24141404, 0x24141c3e, 0x24142404, 0x24143404, 0x24143434, 0x241c043e, 0x241c242c, 0x24240424,
    0x24242c0c, 0x24243424, 0x242c142c, 0x242c241c, 0x242c3e04, 0x243e042c, 0x243e0c04, 0x243e0c14, 0x243e1c04,
    0x2c040c14, 0x2c04240c, 0x2c043e04, 0x2c0c0404, 0x2c0c0434, 0x2c0c1434, 0x2c0c2c2c, 0x2c140c24, 0x2c141c14,
    0x2c143e14, 0x2c1c0414, 0x2c1c2c1c, 0x2c240c04, 0x2c24141c, 0x2c24143e, 0x2c243e14, 0x2c2c0414, 0x2c2c1c0c,
    0x2c342c04, 0x2c3e1424, 0x2c3e2414, 0x34041424, 0x34042424, 0x34042434, 0x34043424, 0x340c140c, 0x340c340c,
    0x34140c3e, 0x34143424, 0x341c1c04, 0x341c1c34, 0x34242424, 0x342c042c, 0x342c2c14, 0x34341c1c, 0x343e041c,
    0x343e140c, 0x3e04041c, 0x3e04042c, 0x3e04043e, 0x3e040c04, 0x3e041c14, 0x3e042c14, 0x3e0c1434, 0x3e0c2404,
    0x3e140c14, 0x3e14242c, 0x3e142c14, 0x3e1c0404, 0x3e1c0c2c, 0x3e1c1c1c, 0x3e1c3404, 0x3e24140c, 0x3e24240c,
    0x3e2c0404, 0x3e2c0414, 0x3e2c1424, 0x3e341c04,
];

/// GGML's `ksigns_iq2xs`: 7 sign bits plus the parity bit; bit `i` set means element `i` of the 8 is negative.
pub const KSIGNS_IQ2XS: [u8; 128] = [
    0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15, 144, 17, 18, 147, 20, 149, 150, 23, 24, 153,
    154, 27, 156, 29, 30, 159, 160, 33, 34, 163, 36, 165, 166, 39, 40, 169, 170, 43, 172, 45, 46, 175, 48, 177, 178,
    51, 180, 53, 54, 183, 184, 57, 58, 187, 60, 189, 190, 63, 192, 65, 66, 195, 68, 197, 198, 71, 72, 201, 202, 75,
    204, 77, 78, 207, 80, 209, 210, 83, 212, 85, 86, 215, 216, 89, 90, 219, 92, 221, 222, 95, 96, 225, 226, 99, 228,
    101, 102, 231, 232, 105, 106, 235, 108, 237, 238, 111, 240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123,
    252, 125, 126, 255,
];

impl BlockIQ3XXS {
    /// Sub-block `j`'s packed scale and sign word.
    #[inline]
    fn aux(&self, j: usize) -> u32 {
        u32::from_le_bytes(self.qs[64 + 4 * j..68 + 4 * j].try_into().unwrap())
    }

    /// The grid value (4..=62, unsigned) of element `e`.
    #[inline]
    pub fn grid_value(&self, e: usize) -> u8 {
        (IQ3XXS_GRID[self.qs[e / 4] as usize] >> (8 * (e % 4))) as u8
    }

    /// Whether element `e` is negative.
    #[inline]
    pub fn negative(&self, e: usize) -> bool {
        let (j, k) = (e / 32, (e % 32) / 8);
        (KSIGNS_IQ2XS[((self.aux(j) >> (7 * k)) & 127) as usize] >> (e % 8)) & 1 != 0
    }

    /// The 4-bit scale of sub-block `j` (0..8); the sub-block's multiplier is `(0.5 + sc) * 0.5`.
    #[inline]
    pub fn scale(&self, j: usize) -> u8 {
        (self.aux(j) >> 28) as u8
    }
}

impl QuantBlock for BlockIQ3XXS {
    const DTYPE: DType = DType::IQ3XXS;
    const BLOCK: usize = QK_K;

    /// Per sub-block `db = (d * (0.5 + f32(sc))) * 0.5`; then `x = (db * f32(grid)) * ±1` (gguf-py
    /// `db * grid * signs`; the product by −1 as a negation that leaves a NaN as it is, as x86 does).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out: &mut [f32; QK_K] =
            out.try_into().expect("dequantize: `out` must hold exactly one super-block (256 elements)");
        let d = f16_to_f32(self.d);
        for (j, out) in out.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + self.scale(j) as f32) * 0.5;
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

    /// The sign table has an even number of bits set in every entry (the eighth is the parity of the seven), and
    /// GGML's tables start with these entries.
    #[test]
    fn tables() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(s & 127, i as u8);
            assert_eq!(s.count_ones() % 2, 0, "{i}");
        }
        assert_eq!(IQ3XXS_GRID[..3], [0x04040404, 0x04040414, 0x04040424]);
    }
}
