//! The CUDA lab: what measures the CUDA backend and is never part of the product (DESIGN.md §9). The server and the
//! CLI never depend on this crate.
//!
//! - [`probes`] (feature `cuda`): kernels of `kernels/probes.cu`, compiled into a module of their own and launched
//!   on a backend's stream: one launch boundary, one grid barrier, a persistent dependent chain, a spin.
//! - `examples/bench.rs`: decode timings of real shapes with random weights, per-op times, kernel variants
//!   ([`tf_backend_cuda::CudaTuning`]), the probes.
//! - `examples/skeleton.rs`: the decode step's matmuls alone against the bandwidth floor.
//! - `examples/ptx.rs`: the kernels' PTX for `ptxas -v` (scripts/ptxas-check.sh).
//!
//! Without the feature the crate holds only [`timing_bf16_bytes`], so default builds and CI need no CUDA.

#[cfg(feature = "cuda")]
pub mod probes;

/// `n` bf16 values as little-endian bytes for timing: random patterns near ±2⁻⁶ from an xorshift seeded by `seed`.
/// The values never change a timing; they are nonzero and varied so that nothing about them is special to the
/// hardware.
pub fn timing_bf16_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (0x3c80u16 | (s as u16 & 0x807f)).to_le_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn timing_bytes_are_nonzero_bf16_near_a_64th() {
        let b = super::timing_bf16_bytes(1000, 7);
        assert_eq!(b.len(), 2000);
        for c in b.chunks_exact(2) {
            let v = u16::from_le_bytes([c[0], c[1]]);
            assert_eq!(v & 0x7f80, 0x3c80, "{v:#06x}: exponent of 2^-6");
        }
        assert_ne!(super::timing_bf16_bytes(8, 1), super::timing_bf16_bytes(8, 2));
    }
}
