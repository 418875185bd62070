//! The CUDA backend (DESIGN.md §5, docs/cuda.md). With the `cuda` feature, [`CudaBackend`] implements every op of
//! `tf_core::Backend` on one GPU in the portable arithmetic: each kernel follows the canonical reduction order of
//! the scalar reference (`tf_quant::reference`) with the same fma/non-fma steps and our own transcendentals, so
//! its bits equal the CPU backend's, and every output row depends only on its input row (row-exact for any row
//! count). Kernels are `.cu` files under `kernels/`, embedded in the binary and compiled at start by NVRTC for the
//! GPU present; the driver and NVRTC are loaded dynamically, so building needs no CUDA installation.
//!
//! A second arithmetic, [`Arithmetic::Tensor`], runs the BF16/F16-weight matmuls on tensor cores (`kernels/mma.cu`):
//! row-exact for any row count, but not equal to the CPU.
//!
//! Tuning that changes speed only is one typed value, [`CudaTuning`]; its default is what the product runs.
//! Measurement probes and timing programs live apart, in crates/cuda-lab.
//!
//! Without the feature the crate holds only its pure logic ([`geometry`], [`Arithmetic`], [`CudaTuning`]): kernel
//! sources, dtype tags, launch geometry, the record of KV writes in flight.

pub mod geometry;
pub mod kernel_cache;
pub mod kv_writes;
pub mod tuning;

pub use tuning::{CudaTuning, KernelDefine, KERNEL_DEFINES};

/// The arithmetic of the CUDA backend's matmuls (docs/cuda.md). Each is row-exact with itself; only `Portable`
/// equals the CPU backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Arithmetic {
    /// Every op in the scalar reference's order on CUDA cores: bit-equal to the CPU backend.
    #[default]
    Portable,
    /// BF16 and F16 weight matmuls on tensor cores (activations rounded to the weight type per element, f32
    /// accumulation in one fixed K order, rows padded to 16-row tiles); every other op as `Portable`.
    Tensor,
}

impl Arithmetic {
    pub fn name(self) -> &'static str {
        match self {
            Arithmetic::Portable => "portable",
            Arithmetic::Tensor => "tensor",
        }
    }

    pub fn parse(s: &str) -> Option<Arithmetic> {
        match s {
            "portable" => Some(Arithmetic::Portable),
            "tensor" => Some(Arithmetic::Tensor),
            _ => None,
        }
    }
}

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
mod host_ids;

#[cfg(feature = "cuda")]
pub use backend::{available, CudaBackend, CudaKv, CudaTensor, CudaWeight};
