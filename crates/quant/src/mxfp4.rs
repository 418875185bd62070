//! MXFP4 (GGML type 39, the expert weights of gpt-oss): blocks of 32 FP4 (E2M1) values sharing one E8M0 scale
//! byte (OCP Microscaling Formats v1.0).
//!
//! As GGML and gguf-py store it, the E2M1 values are doubled into the integers of [`KVALUES_MXFP4`] (−12..=12)
//! and the scale halved to match ([`e8m0_to_f32_half`]), so `x = e8m0_half(e) * kvalues[q]` is the value the
//! spec defines (`2^(e − 127) · e2m1(q)`). Nibble order as the legacy 4-bit types: byte `j` of `qs` holds element
//! `j` in its low nibble and element `j + 16` in its high nibble.

use bytemuck::{Pod, Zeroable};
use tf_core::DType;

use crate::{QuantBlock, QK};

/// The 16 E2M1 values, doubled (GGML's `kvalues_mxfp4`): codes 0..8 are `0, 0.5, 1, 1.5, 2, 3, 4, 6` times 2,
/// codes 8..16 the same negated (code 8, E2M1's −0, is the integer 0).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4: `x = e8m0_to_f32_half(e) * kvalues[q]` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// E8M0 scale: the power of two `2^(e − 127)` (halved by [`e8m0_to_f32_half`]).
    pub e: u8,
    /// 32 4-bit codes: `qs[j] & 15` is element `j`, `qs[j] >> 4` element `j + 16`.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMXFP4>() == 17);

/// Half the value of the E8M0 byte `e`, `2^(e − 128)`, as the f32 bits GGML's `ggml_e8m0_to_fp32_half` and
/// gguf-py's `e8m0_to_fp32_half` form: `0x00200000 << e` for `e < 2` (the subnormals 2^-128 and 2^-127), else
/// `(e − 1) << 23`. Always a finite power of two: `e = 255`, which the OCP format reserves for NaN, gives 2^127
/// here as in GGML and gguf-py.
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

impl QuantBlock for BlockMXFP4 {
    const DTYPE: DType = DType::MXFP4;
    const BLOCK: usize = QK;

    /// `x = d * f32(kvalues[q])` with `d = e8m0_to_f32_half(e)`: one f32 product (gguf-py `d * qs`). `d` is a
    /// power of two and `kvalues[q]` a small integer, so the product is exact unless it overflows to ±Inf
    /// (`e = 255` and `|kvalues[q]| ≥ 2`) or falls below 2^-149 (never: `d ≥ 2^-128`); code 8 gives `+0.0`.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out: &mut [f32; QK] = out.try_into().expect("dequantize: `out` must hold exactly one block (32 elements)");
        let d = e8m0_to_f32_half(self.e);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((&b, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * KVALUES_MXFP4[(b & 15) as usize] as f32;
            *h = d * KVALUES_MXFP4[(b >> 4) as usize] as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scale of every byte against `2^(e − 128)` computed in f64 (exact), and the E2M1 table against the
    /// format's definition (sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 is subnormal).
    #[test]
    fn scales_and_table_follow_the_formats() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128);
            assert_eq!(e8m0_to_f32_half(e) as f64, want, "e = {e}");
        }
        for (code, &k) in KVALUES_MXFP4.iter().enumerate() {
            let (sign, exp, man) = (code >> 3, (code >> 1) & 3, code & 1);
            let mag = if exp == 0 { 0.5 * man as f64 } else { 2f64.powi(exp as i32 - 1) * (1.0 + 0.5 * man as f64) };
            let v = if sign == 1 { -mag } else { mag };
            assert_eq!(k as f64, 2.0 * v, "code {code}");
        }
    }

    /// Hand-built blocks: every code in both nibbles, at the smallest, a middle and the largest scale.
    #[test]
    fn hand_built_blocks() {
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = (j as u8) | ((15 - j as u8) << 4);
        }
        for e in [0u8, 1, 127, 128, 254, 255] {
            let b = BlockMXFP4 { e, qs };
            let mut out = [0f32; 32];
            b.dequantize(&mut out);
            let d = 2f64.powi(e as i32 - 128);
            for j in 0..16 {
                for (got, code) in [(out[j], j), (out[j + 16], 15 - j)] {
                    // Exact in f64; the f32 cast rounds only to overflow.
                    let want = (d * KVALUES_MXFP4[code] as f64) as f32;
                    assert_eq!(got.to_bits(), want.to_bits(), "e = {e}, code {code}");
                }
            }
        }
    }
}
