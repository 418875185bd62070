//! The CUDA backend (DESIGN.md §5, docs/cuda.md). With the `cuda` feature, [`CudaBackend`] implements every op of
//! `tf_core::Backend` on one GPU in the portable arithmetic: each kernel follows the canonical reduction order of
//! the scalar reference (`tf_quant::reference`) with the same fma/non-fma steps and our own transcendentals, so
//! its bits equal the CPU backend's, and every output row depends only on its input row (row-exact for any row
//! count). Kernels are `.cu` files under `kernels/`, embedded in the binary and compiled at start by NVRTC for the
//! GPU present; the driver and NVRTC are loaded dynamically, so building needs no CUDA installation.
//!
//! Without the feature the crate holds only its pure logic ([`geometry`]): kernel sources, dtype tags, launch
//! geometry.

pub mod geometry;

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
mod graph;

#[cfg(feature = "cuda")]
pub use backend::{available, CudaBackend, CudaKv, CudaTensor, CudaWeight};
