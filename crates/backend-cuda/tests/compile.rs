//! NVRTC compiles every kernel for the architectures we run on (needs libnvrtc, not a GPU).
#![cfg(feature = "cuda")]

use tf_backend_cuda::device::compile;
use tf_backend_cuda::geometry::{nvrtc_arch, KERNELS};

#[test]
fn nvrtc_compiles_every_kernel_for_hopper_and_ampere() {
    for (major, minor) in [(9, 0), (8, 0)] {
        let ptx = compile(&nvrtc_arch(major, minor)).unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
        for k in KERNELS {
            assert!(ptx.contains(&format!(".entry {k}(")), "sm_{major}{minor}: no entry {k}");
        }
        // --fmad=false: the only fused multiply-adds are the explicit fmaf() calls, which PTX spells fma.rn.f32;
        // a contracted a*b+c would show up as mad.f32 or an fma we did not write, so check no mad appears.
        assert!(!ptx.contains("mad.f32") && !ptx.contains("mad.rn.f32"), "contracted multiply-add in the PTX");
    }
}
