//! The scalar reference of every op: the executable definition of the canonical arithmetic
//! (docs/arithmetic.md). Slow and plain on purpose; fast kernels are tested bit for bit against it.

pub mod kv;
pub mod math;
pub mod matmul;
pub mod ops;
pub mod ssm;
