//! GGUF quant blocks and their dequantization.
//!
//! Every GGML block type has a `#[repr(C)]` struct with GGML's exact byte layout (size asserted at compile
//! time) that implements [`QuantBlock`]. [`dequantize`] turns the raw little-endian bytes of a tensor (for
//! example straight from an mmap'd GGUF file, aligned or not) into f32.
//!
//! # Bit-exactness
//!
//! Dequantization is bit for bit what gguf-py 0.19.0 (`gguf/quants.py`, NumPy) produces: the same f16 to f32
//! conversion (see [`f16_bits_to_f32`]), every product and difference computed in f32 in the same order and association,
//! never fused into an FMA. Each block type documents its formula next to its `dequantize`. Q8_1 and Q8_K have
//! no gguf-py dequantizer; they follow GGML's C reference (`d * q`). IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ1_S and MXFP4 follow gguf-py's (MXFP4's scale is an E8M0 byte, see [`e8m0_to_f32_half`]).
//!
//! For finite scales the order is in fact not what decides the bits: an f16 scale has 11 significant bits and
//! the small integers it meets (sub-block scales, mins, quants) at most 8, so every intermediate product is
//! exact in f32 and only the last operation rounds. Every output is therefore the correctly rounded f32 of the
//! exact formula, whatever the association or FMA contraction (the same holds for GGML's C and CUDA code).
//! What must match is the f16 conversion of NaNs (NumPy keeps signalling NaNs signalling) and, for Inf/NaN
//! scales, NaN propagation, which the fixture test checks on x86_64.
//!
//! Block structs assume a little-endian host, as GGUF files are little-endian.

mod float;
mod iq1s;
mod iq2s;
mod iq2xs;
mod iq2xxs;
mod iq3s;
mod iq3xxs;
mod iquants;
mod kquants;
mod legacy;
mod mxfp4;
pub mod reference;

use std::borrow::Cow;
use std::fmt;
use std::mem::size_of;

use bytemuck::Pod;
use tf_core::DType;

pub use float::{bf16_to_f32, f16_bits_to_f32, f16_to_f32};
pub use iq1s::{BlockIQ1S, IQ1S_DELTA, IQ1S_GRID};
pub use iq2s::{BlockIQ2S, IQ2S_GRID};
pub use iq2xs::{BlockIQ2XS, IQ2XS_GRID};
pub use iq2xxs::{BlockIQ2XXS, IQ2XXS_GRID};
pub use iq3s::{BlockIQ3S, IQ3S_GRID};
pub use iq3xxs::{BlockIQ3XXS, IQ3XXS_GRID, KSIGNS_IQ2XS};
pub use iquants::{iq4xs_scales, BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL};
pub use kquants::{q3k_scales, q4k_scale_min, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK};
pub use mxfp4::{e8m0_to_f32_half, BlockMXFP4, KVALUES_MXFP4};

#[cfg(target_endian = "big")]
compile_error!("tf-quant reads GGUF's little-endian blocks in place and needs a little-endian target");

/// A GGML quant block: `BLOCK` elements stored in `size_of::<Self>() == DTYPE.block_bytes()` bytes.
pub trait QuantBlock: Pod {
    /// The GGML type of this block.
    const DTYPE: DType;
    /// Elements per block (`DTYPE.block_size()`).
    const BLOCK: usize;

    /// Dequantizes this block into `out`, which must hold exactly `BLOCK` elements (panics otherwise).
    fn dequantize(&self, out: &mut [f32]);
}

/// Why a dequantization was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// The type has no dequantization here (integer types, F64, ...).
    Unsupported(DType),
    /// The element count is not a whole number of blocks.
    PartialBlock { dtype: DType, numel: usize },
    /// The byte length does not match the element count.
    ByteLength { dtype: DType, numel: usize, expected: usize, got: usize },
    /// The byte size of the element count does not fit in `usize`.
    TooLarge { dtype: DType, numel: usize },
    /// A byte length that is not a whole number of blocks.
    PartialBlockBytes { dtype: DType, len: usize },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QuantError::Unsupported(dtype) => {
                write!(f, "dequantization of {dtype} is not supported")
            }
            QuantError::PartialBlock { dtype, numel } => {
                write!(f, "{numel} elements of {dtype} are not a whole number of blocks of {}", dtype.block_size())
            }
            QuantError::ByteLength { dtype, numel, expected, got } => {
                write!(f, "{numel} elements of {dtype} take {expected} bytes, but {got} bytes were given")
            }
            QuantError::TooLarge { dtype, numel } => {
                write!(f, "{numel} elements of {dtype} are too large to address")
            }
            QuantError::PartialBlockBytes { dtype, len } => {
                write!(f, "{len} bytes are not a whole number of {dtype} blocks of {} bytes", dtype.block_bytes())
            }
        }
    }
}

impl std::error::Error for QuantError {}

/// Checks that `numel` elements of `dtype` are whole blocks taking exactly `len` bytes.
fn check_len(dtype: DType, len: usize, numel: usize) -> Result<(), QuantError> {
    let bs = dtype.block_size();
    let blocks = numel / bs;
    if blocks * bs != numel {
        return Err(QuantError::PartialBlock { dtype, numel });
    }
    let expected = blocks.checked_mul(dtype.block_bytes()).ok_or(QuantError::TooLarge { dtype, numel })?;
    if len != expected {
        return Err(QuantError::ByteLength { dtype, numel, expected, got: len });
    }
    Ok(())
}

/// Whether [`dequantize`] handles `dtype`.
pub fn is_supported(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::Q2K
            | DType::Q3K
            | DType::Q4K
            | DType::Q5K
            | DType::Q6K
            | DType::Q8K
            | DType::IQ4NL
            | DType::IQ4XS
            | DType::IQ3S
            | DType::IQ3XXS
            | DType::MXFP4
            | DType::IQ2XXS
            | DType::IQ2XS
            | DType::IQ1S
            | DType::IQ2S
    )
}

/// Dequantizes `bytes` (little-endian GGUF data of type `dtype`, any alignment) into `out`.
///
/// `out.len()` must be a whole number of blocks and `bytes.len()` exactly
/// `out.len() / dtype.block_size() * dtype.block_bytes()`. F32 is copied bit for bit, F16 and BF16 are
/// converted exactly (NaN payloads kept, as NumPy does).
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !is_supported(dtype) {
        return Err(QuantError::Unsupported(dtype));
    }
    check_len(dtype, bytes.len(), out.len())?;
    match dtype {
        DType::F32 => float::f32_bytes_to_f32(bytes, out),
        DType::F16 => float::f16_bytes_to_f32(bytes, out),
        DType::BF16 => float::bf16_bytes_to_f32(bytes, out),
        DType::Q4_0 => dequantize_bytes::<BlockQ4_0>(bytes, out),
        DType::Q4_1 => dequantize_bytes::<BlockQ4_1>(bytes, out),
        DType::Q5_0 => dequantize_bytes::<BlockQ5_0>(bytes, out),
        DType::Q5_1 => dequantize_bytes::<BlockQ5_1>(bytes, out),
        DType::Q8_0 => dequantize_bytes::<BlockQ8_0>(bytes, out),
        DType::Q8_1 => dequantize_bytes::<BlockQ8_1>(bytes, out),
        DType::Q2K => dequantize_bytes::<BlockQ2K>(bytes, out),
        DType::Q3K => dequantize_bytes::<BlockQ3K>(bytes, out),
        DType::Q4K => dequantize_bytes::<BlockQ4K>(bytes, out),
        DType::Q5K => dequantize_bytes::<BlockQ5K>(bytes, out),
        DType::Q6K => dequantize_bytes::<BlockQ6K>(bytes, out),
        DType::Q8K => dequantize_bytes::<BlockQ8K>(bytes, out),
        DType::IQ4NL => dequantize_bytes::<BlockIQ4NL>(bytes, out),
        DType::IQ4XS => dequantize_bytes::<BlockIQ4XS>(bytes, out),
        DType::IQ3S => dequantize_bytes::<BlockIQ3S>(bytes, out),
        DType::IQ3XXS => dequantize_bytes::<BlockIQ3XXS>(bytes, out),
        DType::MXFP4 => dequantize_bytes::<BlockMXFP4>(bytes, out),
        DType::IQ2XXS => dequantize_bytes::<BlockIQ2XXS>(bytes, out),
        DType::IQ2XS => dequantize_bytes::<BlockIQ2XS>(bytes, out),
        DType::IQ1S => dequantize_bytes::<BlockIQ1S>(bytes, out),
        DType::IQ2S => dequantize_bytes::<BlockIQ2S>(bytes, out),
        _ => unreachable!("is_supported covers every arm"),
    }
    Ok(())
}

/// [`dequantize`] into a new vector of `numel` elements. Lengths are checked before anything is allocated.
pub fn dequantize_to_vec(dtype: DType, bytes: &[u8], numel: usize) -> Result<Vec<f32>, QuantError> {
    if !is_supported(dtype) {
        return Err(QuantError::Unsupported(dtype));
    }
    check_len(dtype, bytes.len(), numel)?;
    let mut out = vec![0f32; numel];
    dequantize(dtype, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes typed blocks into `out`, which must hold exactly `blocks.len() * B::BLOCK` elements.
pub fn dequantize_blocks<B: QuantBlock>(blocks: &[B], out: &mut [f32]) -> Result<(), QuantError> {
    let numel = out.len();
    check_len(B::DTYPE, std::mem::size_of_val(blocks), numel)?;
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::BLOCK)) {
        b.dequantize(o);
    }
    Ok(())
}

/// Views `bytes` as blocks: borrowed when `bytes` is aligned for `B`, copied otherwise.
/// `bytes.len()` must be a whole number of blocks.
pub fn cast_blocks<B: QuantBlock>(bytes: &[u8]) -> Result<Cow<'_, [B]>, QuantError> {
    let size = size_of::<B>();
    if bytes.len() / size * size != bytes.len() {
        return Err(QuantError::PartialBlockBytes { dtype: B::DTYPE, len: bytes.len() });
    }
    Ok(match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => Cow::Borrowed(blocks),
        Err(_) => Cow::Owned(bytes.chunks_exact(size).map(bytemuck::pod_read_unaligned).collect()),
    })
}

/// Dequantizes already length-checked bytes, in place when aligned and one copied block at a time otherwise.
fn dequantize_bytes<B: QuantBlock>(bytes: &[u8], out: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => {
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::BLOCK)) {
                b.dequantize(o);
            }
        }
        Err(_) => {
            for (raw, o) in bytes.chunks_exact(size_of::<B>()).zip(out.chunks_exact_mut(B::BLOCK)) {
                let b: B = bytemuck::pod_read_unaligned(raw);
                b.dequantize(o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_traits<B: QuantBlock>() {
        assert_eq!(size_of::<B>(), B::DTYPE.block_bytes(), "{}", B::DTYPE);
        assert_eq!(B::BLOCK, B::DTYPE.block_size(), "{}", B::DTYPE);
        assert!(is_supported(B::DTYPE));
    }

    #[test]
    fn block_sizes_match_core() {
        check_traits::<BlockQ4_0>();
        check_traits::<BlockQ4_1>();
        check_traits::<BlockQ5_0>();
        check_traits::<BlockQ5_1>();
        check_traits::<BlockQ8_0>();
        check_traits::<BlockQ8_1>();
        check_traits::<BlockQ2K>();
        check_traits::<BlockQ3K>();
        check_traits::<BlockQ4K>();
        check_traits::<BlockQ5K>();
        check_traits::<BlockQ6K>();
        check_traits::<BlockQ8K>();
        check_traits::<BlockIQ4NL>();
        check_traits::<BlockIQ4XS>();
        check_traits::<BlockIQ3S>();
        check_traits::<BlockIQ3XXS>();
        check_traits::<BlockMXFP4>();
        check_traits::<BlockIQ2XXS>();
        check_traits::<BlockIQ2XS>();
        check_traits::<BlockIQ1S>();
        check_traits::<BlockIQ2S>();
    }

    fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn unaligned_equals_aligned_for_every_type() {
        for dtype in DType::ALL.into_iter().filter(|&d| is_supported(d)) {
            let numel = 4 * dtype.block_size().max(8);
            let n_bytes = numel / dtype.block_size() * dtype.block_bytes();
            let bytes = pseudo_random_bytes(n_bytes, dtype.block_bytes() as u64);
            // A buffer aligned to 8 so that offset 0 is aligned for every block and offset 1 is not.
            let mut storage = vec![0u64; n_bytes / 8 + 2];
            let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
            raw[..n_bytes].copy_from_slice(&bytes);
            let aligned = dequantize_to_vec(dtype, &raw[..n_bytes], numel).unwrap();
            raw.copy_within(0..n_bytes, 1);
            let unaligned = dequantize_to_vec(dtype, &raw[1..n_bytes + 1], numel).unwrap();
            let a: Vec<u32> = aligned.iter().map(|x| x.to_bits()).collect();
            let u: Vec<u32> = unaligned.iter().map(|x| x.to_bits()).collect();
            assert_eq!(a, u, "{dtype}");
        }
    }

    #[test]
    fn length_errors_are_reported_not_panicked() {
        let bytes = vec![0u8; 144 * 2];
        let mut out = vec![0f32; 512];
        assert_eq!(dequantize(DType::Q4K, &bytes, &mut out), Ok(()));
        assert_eq!(
            dequantize(DType::Q4K, &bytes[..287], &mut out),
            Err(QuantError::ByteLength { dtype: DType::Q4K, numel: 512, expected: 288, got: 287 })
        );
        assert_eq!(
            dequantize(DType::Q4K, &bytes, &mut out[..256]),
            Err(QuantError::ByteLength { dtype: DType::Q4K, numel: 256, expected: 144, got: 288 })
        );
        assert_eq!(
            dequantize(DType::Q4K, &bytes, &mut out[..300]),
            Err(QuantError::PartialBlock { dtype: DType::Q4K, numel: 300 })
        );
        assert_eq!(
            dequantize_to_vec(DType::Q4_0, &bytes, 33),
            Err(QuantError::PartialBlock { dtype: DType::Q4_0, numel: 33 })
        );
        assert_eq!(
            dequantize_to_vec(DType::F16, &[0u8; 3], 1),
            Err(QuantError::ByteLength { dtype: DType::F16, numel: 1, expected: 2, got: 3 })
        );
        assert_eq!(
            dequantize_to_vec(DType::Q8_0, &[], usize::MAX / 32 * 32),
            Err(QuantError::TooLarge { dtype: DType::Q8_0, numel: usize::MAX / 32 * 32 })
        );
        assert_eq!(dequantize_to_vec(DType::I32, &[0u8; 4], 1), Err(QuantError::Unsupported(DType::I32)));
        assert_eq!(dequantize_to_vec(DType::Q6K, &[], 0), Ok(vec![]));
        let msg = dequantize_to_vec(DType::Q4_0, &bytes, 33).unwrap_err().to_string();
        assert!(msg.contains("33") && msg.contains("Q4_0") && msg.contains("32"), "{msg}");
        let msg = QuantError::ByteLength { dtype: DType::Q4K, numel: 256, expected: 144, got: 143 }.to_string();
        assert!(msg.contains("144") && msg.contains("143"), "{msg}");
    }

    #[test]
    fn plain_floats() {
        let v = [1.5f32, -0.0, f32::from_bits(0x7f80_0001), 3.0e-40];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = dequantize_to_vec(DType::F32, &bytes, 4).unwrap();
        let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, v.map(f32::to_bits));

        let out = dequantize_to_vec(DType::F16, &[0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00], 3).unwrap();
        assert_eq!(out, [1.0, -2.0, 2f32.powi(-24)]);
        let out = dequantize_to_vec(DType::BF16, &[0x80, 0x3f, 0xc0, 0xbf], 2).unwrap();
        assert_eq!(out, [1.0, -1.5]);
    }

    #[test]
    fn cast_blocks_borrows_or_copies() {
        let mut storage = vec![0u64; 40];
        let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
        raw[0] = 0x00;
        raw[1] = 0x3c; // d = 1.0 of block 0 at offset 0
        let aligned = cast_blocks::<BlockQ8_0>(&raw[..68]).unwrap();
        assert!(matches!(aligned, Cow::Borrowed(_)));
        assert_eq!(aligned.len(), 2);
        assert_eq!(aligned[0].d.to_f32(), 1.0);
        raw.copy_within(0..68, 1);
        let copied = cast_blocks::<BlockQ8_0>(&raw[1..69]).unwrap();
        assert!(matches!(copied, Cow::Owned(_)));
        assert_eq!(copied[0].d.to_f32(), 1.0);
        assert_eq!(
            cast_blocks::<BlockQ8_0>(&raw[..67]).unwrap_err(),
            QuantError::PartialBlockBytes { dtype: DType::Q8_0, len: 67 }
        );
        let mut out = vec![0f32; 64];
        dequantize_blocks(&copied, &mut out).unwrap();
        assert!(dequantize_blocks(&copied, &mut out[..32]).is_err());
    }
}
