//! Prints the PTX of the kernels as the backend compiles them (NVRTC, no GPU needed), for `ptxas -v` register
//! and spill counts of a variant before it goes to the device: `ptx [ARCH] [NAME=INTEGER ...]`, ARCH e.g.
//! `sm_90` (default), then kernel defines (`tf_backend_cuda::KERNEL_DEFINES`: kernels/matmul_il.cu `IL_PIPE`,
//! `IL_DEPTH`, ...; kernels/common.cu `PRE_WAIT`).
//! `scripts/ptxas-check.sh` runs it and ptxas.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arch = args.first().map_or("sm_90", String::as_str);
    let (major, minor) = arch
        .strip_prefix("sm_")
        .and_then(|v| v.parse::<i32>().ok())
        .map(|v| (v / 10, v % 10))
        .unwrap_or_else(|| panic!("ARCH: sm_XY, not {arch:?}"));
    let flag = tf_backend_cuda::geometry::nvrtc_arch(major, minor);
    let defines: Vec<String> = args
        .iter()
        .skip(1)
        .map(|d| tf_backend_cuda::KernelDefine::parse(d).map(|d| d.to_string()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    match tf_backend_cuda::device::compile_with(&flag, &defines) {
        Ok(ptx) => print!("{ptx}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
