//! The legacy GGML quants: 32 elements per block, one f16 scale (and for the `_1` types an f16 offset).
//!
//! Nibble order in all 4- and 5-bit types: byte `j` of `qs` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble.

use bytemuck::{Pod, Zeroable};
use half::f16;
use tf_core::DType;

use crate::float::f16_to_f32;
use crate::QuantBlock;

/// Elements per legacy block.
pub const QK: usize = 32;

/// Q4_0: `x = d * (q - 8)` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// 32 unsigned 4-bit values: `qs[j] & 15` is element `j`, `qs[j] >> 4` element `j + 16`.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// Q4_1: `x = d * q + m` with 4-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Offset (the block minimum).
    pub m: f16,
    /// 32 unsigned 4-bit values, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Q5_0: `x = d * (q - 16)` with 5-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// The 5th bit of each element, as a little-endian u32: bit `i` belongs to element `i`.
    pub qh: [u8; 4],
    /// The low 4 bits of the 32 elements, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// Q5_1: `x = d * q + m` with 5-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Offset (the block minimum).
    pub m: f16,
    /// The 5th bit of each element, as a little-endian u32: bit `i` belongs to element `i`.
    pub qh: [u8; 4],
    /// The low 4 bits of the 32 elements, packed as in [`BlockQ4_0`].
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// Q8_0: `x = d * q` with signed 8-bit `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// 32 signed 8-bit values, in element order.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q8_1: `x = d * q` with signed 8-bit `q`; GGML's activation format for Q4_1/Q5_1 dot products.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`, precomputed for dot products with offset types; not used by dequantization.
    pub s: f16,
    /// 32 signed 8-bit values, in element order.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// Views `out` as one legacy block (panics on another length, as [`QuantBlock::dequantize`] documents).
#[inline(always)]
fn block_out(out: &mut [f32]) -> &mut [f32; QK] {
    out.try_into().expect("dequantize: `out` must hold exactly one block (32 elements)")
}

/// The 5th bits of a Q5 block as values 0 or 16, element by element (bit `i` of little-endian `qh`).
#[inline(always)]
fn high_bits(qh: [u8; 4]) -> [u8; QK] {
    let mut out = [0u8; QK];
    for (o, &b) in out.chunks_exact_mut(8).zip(&qh) {
        // Byte k of `x` is bit k of `b` in place (0 or 1 << k); adding 0x7f sets that byte's top bit iff it is
        // non-zero, without a carry into the next byte.
        let x = (b as u64 * 0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
        let bits = ((x + 0x7f7f_7f7f_7f7f_7f7f) >> 7) & 0x0101_0101_0101_0101;
        o.copy_from_slice(&(bits << 4).to_le_bytes());
    }
    out
}

impl QuantBlock for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;
    const BLOCK: usize = QK;

    /// `x = d * f32(q - 8)`: one f32 product (gguf-py `d * qs.astype(f32)`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((&b, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * ((b & 0x0f) as i32 - 8) as f32;
            *h = d * ((b >> 4) as i32 - 8) as f32;
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    const BLOCK: usize = QK;

    /// `x = (d * f32(q)) + m`: an f32 product, rounded, then an f32 sum (gguf-py `(d * qs) + m`).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((&b, l), h) in self.qs.iter().zip(lo).zip(hi) {
            *l = d * (b & 0x0f) as f32 + m;
            *h = d * (b >> 4) as f32 + m;
        }
    }
}

impl QuantBlock for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
    const BLOCK: usize = QK;

    /// `x = d * f32(q - 16)` with `q = low nibble | bit i of qh << 4`: one f32 product.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let high = high_bits(self.qh);
        let (lo, hi) = out.split_at_mut(QK / 2);
        let (high_lo, high_hi) = high.split_at(QK / 2);
        let bits = high_lo.iter().zip(high_hi);
        for (((&b, l), h), (&h0, &h1)) in self.qs.iter().zip(lo).zip(hi).zip(bits) {
            let q0 = ((b & 0x0f) | h0) as i32;
            let q1 = ((b >> 4) | h1) as i32;
            *l = d * (q0 - 16) as f32;
            *h = d * (q1 - 16) as f32;
        }
    }
}

impl QuantBlock for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
    const BLOCK: usize = QK;

    /// `x = (d * f32(q)) + m` with `q = low nibble | bit i of qh << 4`: product rounded, then the sum.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let high = high_bits(self.qh);
        let (lo, hi) = out.split_at_mut(QK / 2);
        let (high_lo, high_hi) = high.split_at(QK / 2);
        let bits = high_lo.iter().zip(high_hi);
        for (((&b, l), h), (&h0, &h1)) in self.qs.iter().zip(lo).zip(hi).zip(bits) {
            let q0 = (b & 0x0f) | h0;
            let q1 = (b >> 4) | h1;
            *l = d * q0 as f32 + m;
            *h = d * q1 as f32 + m;
        }
    }
}

impl QuantBlock for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
    const BLOCK: usize = QK;

    /// `x = d * f32(q)`: one f32 product (gguf-py writes `x * d`; the same IEEE result).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

impl QuantBlock for BlockQ8_1 {
    const DTYPE: DType = DType::Q8_1;
    const BLOCK: usize = QK;

    /// `x = d * f32(q)`, `s` unused. gguf-py has no Q8_1; this is GGML's definition of the format.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let out = block_out(out);
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequantize_to_vec;

    /// Reads the f16 at byte `at` with the `half` crate (not our NumPy-compatible conversion).
    fn f16_at(b: &[u8], at: usize) -> f32 {
        f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
    }

    /// Element `i` of one raw legacy block, decoded from GGML's byte layout one element at a time.
    fn reference_element(dtype: DType, b: &[u8], i: usize) -> f32 {
        // Where the 4 low bits of element i live: byte j = i % 16, low nibble for i < 16, else high.
        let nibble = |qs: usize| -> u32 {
            let byte = b[qs + i % 16] as u32;
            if i < 16 {
                byte & 15
            } else {
                byte >> 4
            }
        };
        let high_bit = |qh: usize| -> u32 { ((b[qh + i / 8] >> (i % 8)) & 1) as u32 };
        match dtype {
            DType::Q4_0 => f16_at(b, 0) * (nibble(2) as f32 - 8.0),
            DType::Q4_1 => f16_at(b, 0) * nibble(4) as f32 + f16_at(b, 2),
            DType::Q5_0 => f16_at(b, 0) * ((nibble(6) + 16 * high_bit(2)) as f32 - 16.0),
            DType::Q5_1 => f16_at(b, 0) * (nibble(8) + 16 * high_bit(4)) as f32 + f16_at(b, 2),
            DType::Q8_0 => f16_at(b, 0) * (b[2 + i] as i8) as f32,
            DType::Q8_1 => f16_at(b, 0) * (b[4 + i] as i8) as f32,
            _ => unreachable!(),
        }
    }

    /// Random blocks with finite scales, dequantized by the fast path and the reference, compared bitwise.
    #[test]
    fn matches_reference_decoder() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for dtype in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1] {
            let size = dtype.block_bytes();
            for _ in 0..200 {
                let mut b = vec![0u8; size];
                rng.fill(&mut b[..]);
                // Finite f16 scale and offset (the reference uses `half`, which differs on NaN payloads).
                for at in [0, 2] {
                    b[at + 1] &= 0xbf;
                }
                let fast = dequantize_to_vec(dtype, &b, QK).unwrap();
                for (i, x) in fast.iter().enumerate() {
                    let r = reference_element(dtype, &b, i);
                    assert_eq!(x.to_bits(), r.to_bits(), "{dtype} element {i}, seed {seed}, block {b:02x?}");
                }
            }
        }
    }

    #[test]
    fn q8_0_hand_values() {
        let block = BlockQ8_0 { d: f16::from_f32(0.5), qs: std::array::from_fn(|i| i as i8 - 16) };
        let mut out = [0f32; 32];
        block.dequantize(&mut out);
        let expect: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 2.0).collect();
        assert_eq!(out.to_vec(), expect);
        let block = BlockQ8_0 { d: f16::from_f32(-3.0), qs: [-128; 32] };
        block.dequantize(&mut out);
        assert_eq!(out, [384.0; 32]);
    }

    #[test]
    fn q4_0_hand_values() {
        // Low nibble j, high nibble 15 - j.
        let block = BlockQ4_0 { d: f16::from_f32(2.0), qs: std::array::from_fn(|j| j as u8 | ((15 - j as u8) << 4)) };
        let mut out = [0f32; 32];
        block.dequantize(&mut out);
        assert_eq!(out[..16], [-16., -14., -12., -10., -8., -6., -4., -2., 0., 2., 4., 6., 8., 10., 12., 14.]);
        assert_eq!(out[16..], [14., 12., 10., 8., 6., 4., 2., 0., -2., -4., -6., -8., -10., -12., -14., -16.]);
    }

    #[test]
    fn q4_1_and_q5_hand_values() {
        let mut out = [0f32; 32];
        let qs = [0x51u8; 16]; // element j: 1, element j + 16: 5
        BlockQ4_1 { d: f16::from_f32(0.25), m: f16::from_f32(-1.0), qs }.dequantize(&mut out);
        assert_eq!(out[..16], [-0.75; 16]);
        assert_eq!(out[16..], [0.25; 16]);

        // qh = 0x8000_0001: element 0 and element 31 get the 5th bit.
        let qh = 0x8000_0001u32.to_le_bytes();
        BlockQ5_0 { d: f16::from_f32(1.0), qh, qs }.dequantize(&mut out);
        assert_eq!(out[0], 17.0 - 16.0);
        assert_eq!(out[1..16], [1.0 - 16.0; 15]);
        assert_eq!(out[16..31], [5.0 - 16.0; 15]);
        assert_eq!(out[31], 21.0 - 16.0);

        BlockQ5_1 { d: f16::from_f32(0.5), m: f16::from_f32(10.0), qh, qs }.dequantize(&mut out);
        assert_eq!(out[0], 17.0 * 0.5 + 10.0);
        assert_eq!(out[1], 0.5 + 10.0);
        assert_eq!(out[31], 21.0 * 0.5 + 10.0);

        let block = BlockQ8_1 { d: f16::from_f32(0.125), s: f16::from_f32(99.0), qs: [8; 32] };
        block.dequantize(&mut out);
        assert_eq!(out, [1.0; 32]);
    }
}
