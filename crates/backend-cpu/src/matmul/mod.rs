//! Row-exact matmul kernels (in progress).
