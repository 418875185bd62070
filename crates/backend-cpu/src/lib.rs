//! The CPU backend (in progress).

pub mod isa;
pub mod matmul;
