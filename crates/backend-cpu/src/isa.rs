//! Instruction-set levels the CPU kernels are written for, detected at run time.

/// A SIMD level. Every level computes the same bits as `Scalar` (docs/arithmetic.md).
///
/// The order (`<`) ranks the x86_64 levels (`Scalar < Avx2 < Avx512`); `Neon` is the aarch64 level and is only
/// ever available there, so never compare it with the x86 levels: ask [`Isa::usable`] instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (x86_64).
    Avx2,
    /// AVX2 + FMA + F16C plus AVX-512 F/BW/VL/VNNI (x86_64): the int8 dot products of the legacy-type and
    /// Q4_K/Q5_K/Q6_K matmul kernels in 512-bit registers with `vpdpbusd`; every other kernel as at `Avx2`.
    Avx512,
    /// Advanced SIMD (aarch64, where it is baseline): the checkpoint matmul kernels with `smull`/`smlal` +
    /// `sadalp` integer dot products (baseline ARMv8.0; the `sdot` instruction of FEAT_DotProd is not used), the
    /// full-mode and attention `dot16` in four-register lane sets, the activation quantization. Everything else runs
    /// the scalar code.
    Neon,
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
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Isa::Neon;
            }
        }
        Isa::Scalar
    }

    /// Every level usable on this CPU, lowest first (tests run each against `Scalar`).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detect();
        if best == Isa::Neon {
            return vec![Isa::Scalar, Isa::Neon];
        }
        [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= best).collect()
    }

    /// Whether this CPU can run the level's kernels (every level of [`Isa::available`]).
    pub fn usable(self) -> bool {
        let best = Isa::detect();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx512 => best != Isa::Neon && self <= best,
            Isa::Neon => best == Isa::Neon,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_levels_are_usable_and_the_others_not() {
        let avail = Isa::available();
        assert_eq!(avail[0], Isa::Scalar);
        assert_eq!(*avail.last().unwrap(), Isa::detect());
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
            assert_eq!(isa.usable(), avail.contains(&isa), "{isa:?}");
        }
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Isa::detect(), Isa::Neon, "NEON is baseline on aarch64");
        #[cfg(not(target_arch = "aarch64"))]
        assert!(!Isa::Neon.usable());
    }
}
