//! NVRTC compiles every kernel for the architectures we run on (needs libnvrtc, not a GPU).
#![cfg(feature = "cuda")]

use tf_backend_cuda::device::{compile, compile_with};
use tf_backend_cuda::geometry::{nvrtc_arch, ATTN_VSPLIT, KERNELS};

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

#[test]
fn the_tuning_defines_compile_and_bad_ones_are_refused() {
    let arch = nvrtc_arch(9, 0);
    for defines in [
        vec!["IL_PIPE=1"],
        vec!["IL_PIPE=1", "IL_DEPTH=4"],
        vec!["IL_PIPE=0", "PRE_WAIT=0"],
        vec!["IL_PIPE=0", "IL_DEPTH=12"],
        vec!["IL1_DEPTH=8", "GLU_DEPTH=6"],
        vec!["BULK_PF=2"],
        vec!["IL1_DEPTH=8", "MANY_DEPTH=6"],
        vec!["NORM_PER=16"],
        vec!["QM_PF=0"],
        vec!["QM_PF=16"],
    ] {
        let defines: Vec<String> = defines.into_iter().map(String::from).collect();
        let ptx = compile_with(&arch, &defines).unwrap_or_else(|e| panic!("{defines:?}: {e}"));
        assert!(ptx.contains(".entry matmul_bf16w_il1("), "{defines:?}");
    }
    for bad in ["IL_PIPE", "il_pipe=1", "IL_PIPE=x", "=1", "A=1 -include x"] {
        let err = compile_with(&arch, &[bad.to_string()]).expect_err(bad);
        assert!(err.0.contains("NAME=INTEGER"), "{bad}: {}", err.0);
    }
}

#[test]
fn the_host_reads_the_kernels_default_attention_split() {
    // The host sizes attention's grid by geometry::ATTN_VSPLIT when no define sets it: the kernels compiled
    // without the define must be the kernels compiled with that value (and not those with another).
    let arch = nvrtc_arch(9, 0);
    let plain = compile(&arch).unwrap();
    assert_eq!(plain, compile_with(&arch, &[format!("ATTN_VSPLIT={ATTN_VSPLIT}")]).unwrap());
    let other = if ATTN_VSPLIT == 1 { 2 } else { 1 };
    assert_ne!(plain, compile_with(&arch, &[format!("ATTN_VSPLIT={other}")]).unwrap());
}
