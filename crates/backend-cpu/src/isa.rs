//! Instruction-set levels the CPU kernels are written for, detected at run time.

/// A SIMD level. Every level computes the same bits as `Scalar` (docs/arithmetic.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (x86_64).
    Avx2,
    /// AVX2 + FMA + F16C plus AVX-512 F/BW/VL/VNNI (x86_64): the int8 dot products of the legacy-type matmul kernels in
    /// 512-bit registers with `vpdpbusd`; every other kernel as at `Avx2`.
    Avx512,
}

impl Isa {
    /// The best level this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                let avx512 = std::is_x86_feature_detected!("f16c")
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512vnni");
                return if avx512 { Isa::Avx512 } else { Isa::Avx2 };
            }
        }
        Isa::Scalar
    }

    /// Every level usable on this CPU, lowest first (tests run each against `Scalar`).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= best).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}
