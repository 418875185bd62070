//! Half-precision to f32 conversions that match NumPy bit for bit.
//!
//! gguf-py converts f16 with `ndarray.view(np.float16).astype(np.float32)`. For every finite value and the
//! infinities that conversion is exact, as is any IEEE conversion. For NaNs NumPy keeps the payload as it is
//! (the 10 mantissa bits move to the top of the f32 mantissa) and does **not** set the quiet bit, so a
//! signalling f16 NaN stays a signalling f32 NaN (`0x7c01` becomes `0x7f802000`). The `half` crate (and the
//! F16C instruction) quiet it instead (`0x7fc02000`). [`f16_to_f32`] follows NumPy.
//!
//! bf16 is the top half of an f32, so [`bf16_to_f32`] is a shift, exactly like gguf-py's
//! `(int16 as int32) << 16` reinterpretation.

use half::{bf16, f16};

/// `(0x7c00 << 13)`: the f16 exponent field, moved to where the f32 exponent starts.
const SHIFTED_EXP: u32 = 0x0f80_0000;
/// `113 << 23` is 2^-14 as an f32, the smallest normal f16. Used to normalize f16 subnormals.
const MAGIC: u32 = 113 << 23;

/// Converts the bits of an f16 to an f32, exactly as NumPy's `astype(np.float32)` does.
///
/// Branch-free apart from selects, so loops over it vectorize.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    // Exponent and mantissa shifted into their f32 positions; the exponent is still biased by 15.
    let mag = (h & 0x7fff) << 13;
    let exp = mag & SHIFTED_EXP;
    // Normal numbers: rebias the exponent from 15 to 127.
    let normal = mag + ((127 - 15) << 23);
    // Inf/NaN: exponent becomes all ones, mantissa (payload) kept as it is.
    let inf_nan = mag + ((255 - 31) << 23);
    // Zero/subnormal: build 2^-14 * (1 + m/1024) and subtract 2^-14, which is exact.
    let sub = (f32::from_bits(mag + MAGIC) - f32::from_bits(MAGIC)).to_bits();
    let bits = if exp == SHIFTED_EXP {
        inf_nan
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// [`f16_bits_to_f32`] of a [`half::f16`].
#[inline(always)]
pub fn f16_to_f32(h: f16) -> f32 {
    f16_bits_to_f32(h.to_bits())
}

/// Converts a bf16 to an f32 (exact, NaN payloads kept).
#[inline(always)]
pub fn bf16_to_f32(h: bf16) -> f32 {
    f32::from_bits((h.to_bits() as u32) << 16)
}

/// Converts little-endian f16 bytes to f32. `bytes.len() == 2 * out.len()` is checked by the caller.
pub(crate) fn f16_bytes_to_f32(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 2);
    match bytemuck::try_cast_slice::<u8, u16>(bytes) {
        // Aligned: a plain slice loop, which vectorizes.
        Ok(halves) => {
            for (o, &h) in out.iter_mut().zip(halves) {
                *o = f16_bits_to_f32(h);
            }
        }
        Err(_) => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
}

/// Converts little-endian bf16 bytes to f32. `bytes.len() == 2 * out.len()` is checked by the caller.
pub(crate) fn bf16_bytes_to_f32(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 2);
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

/// Copies little-endian f32 bytes bit for bit. `bytes.len() == 4 * out.len()` is checked by the caller.
pub(crate) fn f32_bytes_to_f32(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_matches_half_for_every_non_nan_and_numpy_for_nans() {
        for h in 0..=u16::MAX {
            let ours = f16_bits_to_f32(h).to_bits();
            let is_nan = h & 0x7c00 == 0x7c00 && h & 0x03ff != 0;
            if is_nan {
                // NumPy: sign, all-ones exponent, payload shifted up, quiet bit untouched.
                let expect = ((h as u32 & 0x8000) << 16) | 0x7f80_0000 | ((h as u32 & 0x03ff) << 13);
                assert_eq!(ours, expect, "f16 bits {h:#06x}");
            } else {
                assert_eq!(ours, f16::from_bits(h).to_f32().to_bits(), "f16 bits {h:#06x}");
            }
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f16_bits_to_f32(0x3c00), 1.0);
        assert_eq!(f16_bits_to_f32(0xc000), -2.0);
        assert_eq!(f16_bits_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_bits_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_bits_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_bits_to_f32(0xfc00), f32::NEG_INFINITY);
        assert_eq!(f16_bits_to_f32(0x7c01).to_bits(), 0x7f80_2000);
        assert_eq!(f16_bits_to_f32(0x7e00).to_bits(), 0x7fc0_0000);
    }

    #[test]
    fn bf16_is_a_shift() {
        for h in 0..=u16::MAX {
            let b = h.to_le_bytes();
            let mut out = [0f32];
            bf16_bytes_to_f32(&b, &mut out);
            assert_eq!(out[0].to_bits(), (h as u32) << 16);
            assert_eq!(bf16_to_f32(bf16::from_bits(h)).to_bits(), (h as u32) << 16);
        }
    }
}
