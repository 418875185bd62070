//! Pure logic of the CUDA backend, built with or without the `cuda` feature: the kernel sources as one NVRTC
//! program, the dtype tags the kernels switch on, and launch geometry. None of it decides arithmetic: every grid
//! below only assigns whole outputs to threads (docs/cuda.md).

use tf_core::DType;

/// The kernel sources, in the order they are concatenated into one NVRTC program (helpers first).
pub const SOURCES: [(&str, &str); 4] = [
    ("common.cu", include_str!("../kernels/common.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
];

/// Every `extern "C" __global__` kernel the backend loads.
pub const KERNELS: [&str; 16] = [
    "quantize_rows",
    "matmul_full",
    "matmul_f32w",
    "matmul_f16w",
    "matmul_bf16w",
    "matmul_quant",
    "rms_norm",
    "rope",
    "glu",
    "add",
    "scale",
    "embed",
    "select_rows",
    "kv_write",
    "kv_copy",
    "attention",
];

/// The whole program: every source, each preceded by a `#line` marker so NVRTC errors name the file.
pub fn program() -> String {
    let mut s = String::new();
    for (name, src) in SOURCES {
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The tag of `dtype` in the kernels (`DT_*` in kernels/common.cu), or `None` for types without kernels.
pub fn dtype_code(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::Q4_0 => 3,
        DType::Q4_1 => 4,
        DType::Q5_0 => 5,
        DType::Q5_1 => 6,
        DType::Q8_0 => 7,
        DType::Q8_1 => 8,
        DType::Q2K => 9,
        DType::Q3K => 10,
        DType::Q4K => 11,
        DType::Q5K => 12,
        DType::Q6K => 13,
        DType::Q8K => 14,
        _ => return None,
    })
}

/// Rows per group of `matmul_full` (`FULL_ROWS` in kernels/matmul.cu) and of `matmul_quant` (`QUANT_ROWS`).
pub const FULL_ROWS: u32 = 8;
pub const QUANT_ROWS: u32 = 4;
/// Rows per block of the float-weight kernels (`FLOAT_ROWS`), looped inside the block in groups of `FULL_ROWS`.
pub const FLOAT_ROWS: u32 = 64;
/// Output columns per block of `matmul_full` (one per half-warp of its 128 threads).
pub const FULL_COLS: u32 = 8;
/// Largest head_dim the attention kernel holds (`MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 256;
/// Threads per block of the elementwise kernels.
pub const ELEMWISE_THREADS: u32 = 256;

/// `(grid, block)` of `matmul_full` for `rows × n` outputs.
pub fn matmul_full_grid(rows: usize, n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(FULL_COLS as usize) as u32, rows.div_ceil(FULL_ROWS as usize) as u32, 1), (128, 1, 1))
}

/// `(grid, block)` of the float-weight kernels (`matmul_f32w`, `matmul_f16w`, `matmul_bf16w`).
pub fn matmul_float_grid(rows: usize, n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(FULL_COLS as usize) as u32, rows.div_ceil(FLOAT_ROWS as usize) as u32, 1), (128, 1, 1))
}

/// `(grid, block)` of `matmul_quant` for `rows × n` outputs.
pub fn matmul_quant_grid(rows: usize, n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n as u32, rows.div_ceil(QUANT_ROWS as usize) as u32, 1), (32, 1, 1))
}

/// `(grid, block)` of an elementwise kernel over `n` items.
pub fn elementwise_grid(n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(ELEMWISE_THREADS as usize).max(1) as u32, 1, 1), (ELEMWISE_THREADS, 1, 1))
}

/// The NVRTC virtual architecture for a device of compute capability `(major, minor)`, e.g. `compute_90`.
pub fn nvrtc_arch(major: i32, minor: i32) -> String {
    format!("--gpu-architecture=compute_{major}{minor}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_defined_once_in_the_sources() {
        let p = program();
        for k in KERNELS {
            let pat = format!("__global__ void {k}(");
            assert_eq!(p.matches(&pat).count(), 1, "kernel {k}");
        }
        assert_eq!(p.matches("extern \"C\" __global__").count(), KERNELS.len(), "a kernel missing from KERNELS");
    }

    #[test]
    fn dtype_codes_match_the_kernel_tags() {
        let common = SOURCES[0].1;
        for (d, tag) in [
            (DType::F32, "DT_F32"),
            (DType::F16, "DT_F16"),
            (DType::BF16, "DT_BF16"),
            (DType::Q4_0, "DT_Q4_0"),
            (DType::Q4_1, "DT_Q4_1"),
            (DType::Q5_0, "DT_Q5_0"),
            (DType::Q5_1, "DT_Q5_1"),
            (DType::Q8_0, "DT_Q8_0"),
            (DType::Q8_1, "DT_Q8_1"),
            (DType::Q2K, "DT_Q2K"),
            (DType::Q3K, "DT_Q3K"),
            (DType::Q4K, "DT_Q4K"),
            (DType::Q5K, "DT_Q5K"),
            (DType::Q6K, "DT_Q6K"),
            (DType::Q8K, "DT_Q8K"),
        ] {
            let line = format!("#define {tag} {}\n", dtype_code(d).unwrap());
            assert!(common.contains(&line), "{d}: {line:?}");
            assert!(tf_quant::is_supported(d), "{d}");
        }
        assert_eq!(dtype_code(DType::I32), None);
    }

    #[test]
    fn row_group_sizes_match_the_kernels() {
        let m = SOURCES[1].1;
        assert!(m.contains(&format!("#define FULL_ROWS {FULL_ROWS}\n")));
        assert!(m.contains(&format!("#define QUANT_ROWS {QUANT_ROWS}\n")));
        assert!(m.contains(&format!("#define FLOAT_ROWS {FLOAT_ROWS}\n")));
        assert!(SOURCES[3].1.contains(&format!("#define MAX_HEAD_DIM {MAX_HEAD_DIM}\n")));
    }

    #[test]
    fn grids_cover_every_output() {
        for (rows, n) in [(1, 1), (1, 1536), (3, 7), (256, 8960), (17, 9)] {
            let (g, b) = matmul_full_grid(rows, n);
            assert!(g.0 as usize * FULL_COLS as usize >= n && g.1 as usize * FULL_ROWS as usize >= rows);
            assert_eq!(b.0, 16 * FULL_COLS);
            let (g, _) = matmul_float_grid(rows, n);
            assert!(g.0 as usize * FULL_COLS as usize >= n && g.1 as usize * FLOAT_ROWS as usize >= rows);
            let (g, _) = matmul_quant_grid(rows, n);
            assert!(g.0 as usize == n && g.1 as usize * QUANT_ROWS as usize >= rows);
        }
        assert_eq!(elementwise_grid(0).0 .0, 1);
        assert_eq!(elementwise_grid(257).0 .0, 2);
        assert_eq!(nvrtc_arch(9, 0), "--gpu-architecture=compute_90");
    }
}
