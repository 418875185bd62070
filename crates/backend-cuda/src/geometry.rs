//! Pure logic of the CUDA backend, built with or without the `cuda` feature: the kernel sources as one NVRTC
//! program, the dtype tags the kernels switch on, and launch geometry. None of it decides arithmetic: every grid
//! below only assigns whole outputs to threads (docs/cuda.md).

use tf_core::{DType, RowAttn};

/// The kernel sources, in the order they are concatenated into one NVRTC program (helpers first).
pub const SOURCES: [(&str, &str); 9] = [
    ("common.cu", include_str!("../kernels/common.cu")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("matmul_il.cu", include_str!("../kernels/matmul_il.cu")),
    ("matmul_q.cu", include_str!("../kernels/matmul_q.cu")),
    ("matmul_qt.cu", include_str!("../kernels/matmul_qt.cu")),
    ("matmul_qm.cu", include_str!("../kernels/matmul_qm.cu")),
    ("ops.cu", include_str!("../kernels/ops.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("mma.cu", include_str!("../kernels/mma.cu")),
];

/// Every `extern "C" __global__` kernel the backend loads.
pub const KERNELS: [&str; 135] = [
    "quantize_rows",
    "matmul_full",
    "matmul_f32w",
    "matmul_f16w",
    "matmul_bf16w",
    "matmul_f32w_il1",
    "matmul_f32w_ilg",
    "matmul_f16w_il1",
    "matmul_f16w_ilg",
    "matmul_bf16w_il1",
    "matmul_bf16w_ilg",
    "matmul_f32w_il1_many",
    "matmul_f16w_il1_many",
    "matmul_bf16w_il1_many",
    "matmul_f32w_il1_glu",
    "matmul_f16w_il1_glu",
    "matmul_bf16w_il1_glu",
    "matmul_f32w_il1_add",
    "matmul_f16w_il1_add",
    "matmul_bf16w_il1_add",
    "matmul_f32w_il1_add_d",
    "matmul_f16w_il1_add_d",
    "matmul_bf16w_il1_add_d",
    "matmul_f32w_il1_many_norm",
    "matmul_f16w_il1_many_norm",
    "matmul_bf16w_il1_many_norm",
    "matmul_f32w_il1_qkv_rope",
    "matmul_f16w_il1_qkv_rope",
    "matmul_bf16w_il1_qkv_rope",
    "matmul_f32w_il1_qkv_rope_w",
    "matmul_f16w_il1_qkv_rope_w",
    "matmul_bf16w_il1_qkv_rope_w",
    "matmul_f32w_il1_glu_norm",
    "matmul_f16w_il1_glu_norm",
    "matmul_bf16w_il1_glu_norm",
    "interleave_rows",
    "matmul_quant",
    "mmq_q4_0",
    "mmq_q4_1",
    "mmq_q5_0",
    "mmq_q8_0",
    "mmq_q4k",
    "mmq_q6k",
    "mmq_q5_1",
    "mmq_q5k",
    "mmq_q3k",
    "mmq_q2k",
    "mmq_glu_q8_0",
    "mmq_glu_q4_0",
    "mmq_glu_q4_1",
    "mmq_glu_q5_0",
    "mmq_glu_q4k",
    "mmqm_q4k",
    "mmqm_glu_q4k",
    "mmqm_many_q4k",
    "mmqm_q4k_ks",
    "mmqm_glu_q4k_ks",
    "mmqm_many_q4k_ks",
    "mmqm_q6k",
    "mmqm_glu_q6k",
    "mmqm_many_q6k",
    "mmqm_q6k_ks",
    "mmqm_glu_q6k_ks",
    "mmqm_many_q6k_ks",
    "mmq_glu_q6k",
    "mmq_glu_q5_1",
    "mmq_glu_q5k",
    "mmq_glu_q3k",
    "mmq_glu_q2k",
    "mmq_many_q8_0",
    "mmq_many_q4_0",
    "mmq_many_q4_1",
    "mmq_many_q5_0",
    "mmq_many_q4k",
    "mmq_many_q6k",
    "mmq_many_q5_1",
    "mmq_many_q5k",
    "mmq_many_q3k",
    "mmq_many_q2k",
    "mmqt_q4_0",
    "mmqt_q4_1",
    "mmqt_q5_0",
    "mmqt_q8_0",
    "mmqt_q4k",
    "mmqt_q6k",
    "mmqt_q5_1",
    "mmqt_q5k",
    "mmqt_q3k",
    "mmqt_q2k",
    "rms_norm",
    "add_rms_norm",
    "rope",
    "glu",
    "glu_clamp",
    "add",
    "scale",
    "embed",
    "embed_keys",
    "select_rows",
    "add_rows_scaled",
    "kv_write",
    "kv_write_late",
    "rope_kv_write",
    "kv_copy",
    "argmax_rows",
    "attention_chunk_s1",
    "attention_chunk_s2",
    "attention_chunk_s3",
    "attention_chunk_s4",
    "attention_chunk_s5",
    "attention_chunk_s6",
    "attention_chunk_s7",
    "attention_merge",
    "mma_bf16_s",
    "mma_f16_s",
    "mma_bf16_sn",
    "mma_f16_sn",
    "mma_bf16_s_many",
    "mma_f16_s_many",
    "mma_bf16_s_glu",
    "mma_f16_s_glu",
    "mma_bf16_sw",
    "mma_f16_sw",
    "mma_bf16_sw_many",
    "mma_f16_sw_many",
    "mma_bf16_s_h",
    "mma_f16_s_h",
    "mma_bf16_sw_h",
    "mma_f16_sw_h",
    "mma_bf16_sw_many_h",
    "mma_f16_sw_many_h",
    "mma_bf16_s_glu_h",
    "mma_f16_s_glu_h",
    "mma_bf16_l",
    "mma_f16_l",
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

/// Added to a float weight's tag when its rows are interleaved (`DT_INTERLEAVED` in kernels/common.cu).
pub const DT_INTERLEAVED: i32 = 256;

/// Or-ed into a bias tag: the tensor-core and `matmul_float` kernels add their outputs into y (`EPI_ADD` in
/// kernels/common.cu).
pub const EPI_ADD: i32 = 512;

/// Elements per interleaved block of a float weight type (16 lanes × one 16-byte vector each: 128 for F16 and
/// BF16, 64 for F32), or `None` for types that are never interleaved.
pub fn interleave_block(dtype: DType) -> Option<usize> {
    match dtype {
        DType::F32 => Some(64),
        DType::F16 | DType::BF16 => Some(128),
        _ => None,
    }
}

/// Where logical element `i` of an interleaved tensor with blocks of `block` elements is stored (`il_index` in
/// kernels/common.cu): within each block, lane j's elements `16t + j` become the j-th run of `block / 16`.
pub fn il_index(i: usize, block: usize) -> usize {
    let epv = block / 16;
    i - i % block + (i % 16) * epv + (i % block) / 16
}

/// Output columns per block of the one-row interleaved kernels for `n` outputs (a half-warp per column). Measured on
/// the H200 (one row, BF16, docs/perf-notes-cuda.md): 2, 4, 8 and 16 are within run-to-run noise (about ±8%) of each
/// other for the four MLP shapes of Qwen2.5 1.5B and 7B. Chosen by shape (here: fixed), never by row count; row
/// groups use `FULL_COLS` as matmul_float does.
pub fn il_cols(_n: usize) -> u32 {
    4
}

/// Widest row the one-row kernels norm in front of a projection (`IL_NORM_MAX_K` floats of shared memory in
/// kernels/matmul_il.cu): `Backend::norm_matmul_many` / `norm_matmul_glu` of wider rows norm in a kernel of their own.
pub const IL_NORM_MAX_K: usize = 4096;

/// The GLU kernel norms its own row (`_il1_glu_norm`) only for rows narrower than this; wider ones take `rms_norm`
/// first. Measured on the H200 (docs/perf-notes-cuda.md): fused, the 1.5B shape (K 1,536) decodes 2.6%
/// faster and the 7B (K 3,584) the same, while Llama-3-8B and Llama-2-7B (K 4,096) decode 1.2% and 1.4% slower.
pub const GLU_NORM_BELOW_K: usize = 4096;

/// `(grid, block)` of the interleaved float kernels for `rows × n` outputs, `cols` columns per block.
pub fn matmul_il_grid(rows: usize, n: usize, cols: u32) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(cols as usize) as u32, rows.div_ceil(FLOAT_ROWS as usize) as u32, 1), (16 * cols, 1, 1))
}

/// Rows per group of `matmul_full` (`FULL_ROWS` in kernels/matmul.cu) and of `matmul_quant` (`QUANT_ROWS`).
pub const FULL_ROWS: u32 = 8;
pub const QUANT_ROWS: u32 = 4;
/// Rows per block of the float-weight kernels (`FLOAT_ROWS`), looped inside the block in groups of `FLOAT_GROUP`.
pub const FLOAT_ROWS: u32 = 64;
/// Output columns per block of `matmul_full` (one per half-warp of its 128 threads).
pub const FULL_COLS: u32 = 8;
/// Largest head_dim the attention kernel holds (`MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 256;
/// The attention chunk kernel that runs `s` query heads per block (`attention_chunk_s<S>`, 1 ≤ s ≤ 7).
pub const ATTN_KERNELS: [&str; 7] = [
    "attention_chunk_s1",
    "attention_chunk_s2",
    "attention_chunk_s3",
    "attention_chunk_s4",
    "attention_chunk_s5",
    "attention_chunk_s6",
    "attention_chunk_s7",
];

/// (head, row, chunk) units from which attention runs several query heads per block: below it one head per block
/// keeps more SMs busy, which is what a latency-bound call needs (H200, 1.5B and 7B shapes: one row 25 vs 51 µs at
/// 256 positions; 16 rows × 8 chunks 125 vs 100 µs; 7B 16 rows × 1 chunk (448 units) 46.3 vs 36.7 µs, while one
/// row × 8 chunks (224) is 28 vs 40 µs).
pub const ATTN_GROUP_UNITS: usize = 448;

/// Query heads per attention block for `units` = rows × chunks of a call: the largest divisor of the KV group
/// (`heads / kv_heads`) that is at most `cap` (≤ 7, the kernel's shared-memory limit), so a block's heads share
/// one KV head; `cap = 0` chooses 7 when `heads × units ≥` [`ATTN_GROUP_UNITS`] and 1 below. The heads'
/// arithmetic does not depend on it.
pub fn attn_heads_per_block(heads: usize, kv_heads: usize, units: usize, cap: usize) -> usize {
    let cap = match cap {
        0 if heads * units >= ATTN_GROUP_UNITS => 7,
        0 => 1,
        c => c.min(7),
    };
    let group = if kv_heads == 0 || !heads.is_multiple_of(kv_heads) { 1 } else { heads / kv_heads };
    (1..=cap).rev().find(|s| group % s == 0).unwrap_or(1)
}

/// Threads per block of `rms_norm` / `add_rms_norm` over `n` values: one per `per / 2` values (`per` = the
/// kernels' `NORM_PER`, 4 unless a define sets it: one per two values) in whole warps, 32 to 1024. Each thread then
/// loads at most `per` elements; the sums of squares are the same 16 lanes' whatever the count.
pub fn norm_threads(n: usize, per: usize) -> u32 {
    (n.div_ceil(per.max(2) / 2).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// `NORM_PER` among kernel `defines` (`NAME=INTEGER`), else the kernels' default, 4.
pub fn norm_per(defines: &[String]) -> usize {
    define_value(defines, "NORM_PER").unwrap_or(4)
}

/// The last value of define `name` among kernel `defines` (`NAME=INTEGER`), if any.
pub fn define_value(defines: &[String], name: &str) -> Option<usize> {
    defines.iter().filter_map(|d| d.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).next_back()
}

/// The kernels' default `ATTN_VSPLIT` (kernels/attention.cu; tests/compile.rs checks they agree).
pub const ATTN_VSPLIT: usize = 2;

/// `ATTN_VSPLIT` among kernel `defines`, else [`ATTN_VSPLIT`]: blocks per head of the one-head attention kernel,
/// each taking `head_dim / n` of the V dimensions (kernels/attention.cu). 1, 2 or 4 (head_dim is a multiple of 16,
/// so each slice is whole float4s); anything else is refused.
pub fn attn_vsplit(defines: &[String]) -> Result<usize, String> {
    match define_value(defines, "ATTN_VSPLIT").unwrap_or(ATTN_VSPLIT) {
        n @ (1 | 2 | 4) => Ok(n),
        n => Err(format!("ATTN_VSPLIT={n}: expected 1, 2 or 4")),
    }
}

/// Threads per block of the attention kernel (`ATTN_THREADS`).
pub const ATTN_THREADS: u32 = 128;
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

/// Rows per block of the streaming checkpoint kernels (`QD_ROWS` in kernels/matmul_q.cu: each weight row is read
/// once per group) and their warps per block (`QD_WARPS`, one output column each).
pub const QD_ROWS: u32 = 8;
pub const QD_WARPS: u32 = 4;

/// `(grid, block)` of the streaming checkpoint kernels (`mmq_*`) for `rows × n` outputs.
pub fn mmq_grid(rows: usize, n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(QD_WARPS as usize) as u32, rows.div_ceil(QD_ROWS as usize) as u32, 1), (32 * QD_WARPS, 1, 1))
}

/// Warps per block of the tensor-core streaming kernels (`QM_WARPS` in kernels/matmul_qm.cu): `mmqm_*` give each
/// one column group (8 columns × 16 rows), `mmqm_*_ks` split one group's K across all of them (`QM_KSPLIT`).
pub const QM_WARPS: u32 = 4;

/// Most rows the tensor-core streaming kernels take (from `CudaTuning::quant_mma`); more go to the tiles. At 32 rows
/// a forward of the 7B Q4_K_M shape costs 19.8 ms on them against 29.6 ms on the tiles (H100, docs/benchmarks.md).
pub const QM_MAX_ROWS: usize = 64;

/// Column groups (of 8 columns) below which a weight (or the weights of one `mmqm_many` launch, side by side) takes
/// the K-split kernels `mmqm_*_ks`. With one warp per group, 16 rows of such a weight are under half of the
/// 2,112–3,168 warps an H100 holds at once at the unsplit kernels' 80–108 registers (the 7B's down, o and q/k/v:
/// 448–576 groups, 3.4–4.4 warps per SM; its down streamed 150 GB/s at 32 rows so), so each group's K goes to
/// `QM_WARPS` warps; wider weights (its gate/up: 2,368 groups) already fill the GPU and keep one warp per group,
/// without the shared-memory fold.
pub const QM_SPLIT_BELOW: usize = 1024;

/// Whether `n` columns run on the K-split tensor-core streaming kernels (`mmqm_*_ks`). The bits do not depend on it.
pub fn mmqm_splits(n: usize) -> bool {
    n.div_ceil(8) < QM_SPLIT_BELOW
}

/// The tensor-core streaming kernel families (kernels/matmul_qm.cu), each with its K-split form.
pub const MMQM_FAMILIES: [(&str, &str); 6] = [
    ("mmqm_q4k", "mmqm_q4k_ks"),
    ("mmqm_glu_q4k", "mmqm_glu_q4k_ks"),
    ("mmqm_many_q4k", "mmqm_many_q4k_ks"),
    ("mmqm_q6k", "mmqm_q6k_ks"),
    ("mmqm_glu_q6k", "mmqm_glu_q6k_ks"),
    ("mmqm_many_q6k", "mmqm_many_q6k_ks"),
];

/// The tensor-core streaming kernel of family `name` (one of [`MMQM_FAMILIES`]: `mmqm_<type>`, `mmqm_glu_<type>`,
/// `mmqm_many_<type>` for Q4_K and Q6_K) for `rows × n` outputs (`n`: the columns of all the launch's weights), its
/// grid and block: x the groups of 16 rows (side by side in launch order), y the blocks of `QM_WARPS` column groups
/// of 8, or of one group split `QM_WARPS` ways (`_ks`, [`mmqm_splits`]).
pub fn mmqm_launch(name: &'static str, rows: usize, n: usize) -> (&'static str, Dim3, Dim3) {
    let &(_, split) = MMQM_FAMILIES
        .iter()
        .find(|(family, _)| *family == name)
        .unwrap_or_else(|| unreachable!("no tensor-core streaming kernel {name}"));
    let (name, cols) = if mmqm_splits(n) { (split, 8) } else { (name, 8 * QM_WARPS as usize) };
    (name, (rows.div_ceil(16) as u32, n.div_ceil(cols) as u32, 1), (32 * QM_WARPS, 1, 1))
}

/// Rows and columns per block of the tensor-core checkpoint kernels (`QT_M`, `QT_N` in kernels/matmul_qt.cu).
pub const QT_M: u32 = 64;
pub const QT_N: u32 = 64;

/// `(grid, block)` of the tensor-core checkpoint kernels (`mmqt_*`) for `rows × n` outputs: 4 warps per tile.
pub fn mmqt_grid(rows: usize, n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((rows.div_ceil(QT_M as usize) as u32, n.div_ceil(QT_N as usize) as u32, 1), (128, 1, 1))
}

/// A CUDA grid or block size (x, y, z).
pub type Dim3 = (u32, u32, u32);

/// Elements per chunk of the tensor-core matmul (`MMA_CHUNK` in kernels/mma.cu): it runs when K is a multiple.
pub const MMA_CHUNK: usize = 32;
/// K-parts of the tensor-core matmul (`MMA_SPLIT`): chunk c belongs to part c % MMA_SPLIT, parts are added in
/// order. Part of the arithmetic: fixed for every shape and row count.
pub const MMA_SPLIT: u32 = 4;
/// Most rows of the small tensor-core kernels (`mma_*_s`: one 16-row tile).
pub const MMA_SMALL_ROWS: usize = 16;
/// Output columns per block of `mma_*_s` (`MMA_S_NT` · `MMA_S_NB` tiles of 8) and of `mma_*_s_glu` (`MMA_S_NB`
/// tiles: gate and up of the same columns).
pub const MMA_S_COLS: usize = 32;
pub const MMA_S_GLU_COLS: usize = 16;
/// Threads per block of `mma_*_s` and `mma_*_s_glu` (`MMA_S_NB` · `MMA_SPLIT` warps).
pub const MMA_S_THREADS: u32 = 256;
/// Below this many `mma_*_s` blocks (two per SM of an H200), a matrix takes the narrow kernel `mma_*_sn`: one
/// 8-column tile per block of `32 · MMA_SPLIT` threads (also the grouping of `mma_*_s_many`).
pub const MMA_SN_BELOW: usize = 264;

/// From this many rows (windows, up to [`MMA_SMALL_ROWS`]) narrow matrices take `mma_*_sw` (and q/k/v
/// `mma_*_sw_many`) instead of `_sn`: two column tiles per warp, so each row of x loaded from L1/L2 serves twice the
/// weight bytes (H200, 7B shape, tensor step: 8 rows 6.45 → 6.29 ms, 16 rows 7.45 → 7.05 ms; 4 rows 5.77 → 5.84).
pub const MMA_SW_FROM: usize = 8;
/// Columns and threads per block of `mma_*_sw` and `mma_*_sw_many` (`MMA_W_NT` tiles of 8, `MMA_SPLIT` warps).
pub const MMA_SW_COLS: usize = 16;
pub const MMA_SW_THREADS: u32 = 128;

/// Whether `rows` is a window whose activations come with a half copy (backend/half.rs) for the `_h` kernels.
pub fn half_rows(rows: usize) -> bool {
    (MMA_SW_FROM..=MMA_SMALL_ROWS).contains(&rows)
}

/// The tensor-core matmul kernel for `rows × n` outputs of BF16 (or F16) weights, its grid and block; `half`: x
/// comes with its half copy (only for [`half_rows`]), read by the `_h` kernels. The kernels differ only in how
/// outputs share loads and where x comes from (kernels/mma.cu), never in an output's arithmetic. The `_s*` kernels
/// (rows ≤ [`MMA_SMALL_ROWS`]) wait on the previous kernel themselves: launch them with programmatic dependence.
pub fn mma_launch(rows: usize, n: usize, f16: bool, half: bool) -> (&'static str, Dim3, Dim3) {
    let narrow = n.div_ceil(MMA_S_COLS) < MMA_SN_BELOW;
    let half = half && half_rows(rows);
    if (MMA_SW_FROM..=MMA_SMALL_ROWS).contains(&rows) && narrow {
        let name = match (f16, half) {
            (true, true) => "mma_f16_sw_h",
            (true, false) => "mma_f16_sw",
            (false, true) => "mma_bf16_sw_h",
            (false, false) => "mma_bf16_sw",
        };
        (name, (n.div_ceil(MMA_SW_COLS) as u32, 1, 1), (MMA_SW_THREADS, 1, 1))
    } else if rows <= MMA_SMALL_ROWS && narrow {
        let name = if f16 { "mma_f16_sn" } else { "mma_bf16_sn" };
        (name, (n.div_ceil(8) as u32, 1, 1), (32 * MMA_SPLIT, 1, 1))
    } else if rows <= MMA_SMALL_ROWS {
        let name = match (f16, half) {
            (true, true) => "mma_f16_s_h",
            (true, false) => "mma_f16_s",
            (false, true) => "mma_bf16_s_h",
            (false, false) => "mma_bf16_s",
        };
        (name, (n.div_ceil(MMA_S_COLS) as u32, 1, 1), (MMA_S_THREADS, 1, 1))
    } else {
        let name = if f16 { "mma_f16_l" } else { "mma_bf16_l" };
        (name, (n.div_ceil(32) as u32, rows.div_ceil(64) as u32, 1), (32 * MMA_SPLIT, 1, 1))
    }
}

/// The `_many` tensor-core kernel for up to three weights against `rows` ≤ [`MMA_SMALL_ROWS`] rows, its columns per
/// block (each weight gets ceil(N / columns) blocks) and threads per block; `half` as for [`mma_launch`].
pub fn mma_many_launch(rows: usize, f16: bool, half: bool) -> (&'static str, usize, u32) {
    let half = half && half_rows(rows);
    match (rows >= MMA_SW_FROM, f16, half) {
        (true, true, true) => ("mma_f16_sw_many_h", MMA_SW_COLS, MMA_SW_THREADS),
        (true, false, true) => ("mma_bf16_sw_many_h", MMA_SW_COLS, MMA_SW_THREADS),
        (true, true, false) => ("mma_f16_sw_many", MMA_SW_COLS, MMA_SW_THREADS),
        (true, false, false) => ("mma_bf16_sw_many", MMA_SW_COLS, MMA_SW_THREADS),
        (false, true, _) => ("mma_f16_s_many", 8, 32 * MMA_SPLIT),
        (false, false, _) => ("mma_bf16_s_many", 8, 32 * MMA_SPLIT),
    }
}

/// `(grid, block)` of an elementwise kernel over `n` items.
pub fn elementwise_grid(n: usize) -> ((u32, u32, u32), (u32, u32, u32)) {
    ((n.div_ceil(ELEMWISE_THREADS as usize).max(1) as u32, 1, 1), (ELEMWISE_THREADS, 1, 1))
}

/// Attention chunks hold this many consecutive absolute positions (`ATTN_CHUNK`, the reference's `ATTN_CHUNK`).
pub const ATTN_CHUNK: u32 = 256;

/// The attention chunks each row visits: `[rows.len(), cmax]` absolute chunk ids in increasing order, `-1` after a
/// row's last, and `cmax` (at least 1). A row visits its prefix positions `lo..ctx` (`lo` the first inside the
/// sliding window) and its tree positions inside the window; a chunk is listed when it holds any of them.
pub fn attn_chunks(rows: &[RowAttn], window: Option<u32>) -> (Vec<i32>, usize) {
    let lists: Vec<Vec<i32>> = rows
        .iter()
        .map(|row| {
            let lo = window.map_or(0, |w| (row.pos as i64 - w as i64 + 1).max(0));
            let mut ids: Vec<i32> = Vec::new();
            if lo < row.ctx as i64 {
                let (first, last) = (lo / ATTN_CHUNK as i64, (row.ctx as i64 - 1) / ATTN_CHUNK as i64);
                ids.extend((first..=last).map(|c| c as i32));
            }
            for &(p, _) in &row.tree {
                let inside = window.is_none_or(|w| (row.pos as i64 - p as i64) < w as i64);
                let c = (p / ATTN_CHUNK) as i32;
                if inside && ids.last() != Some(&c) {
                    ids.push(c);
                }
            }
            ids
        })
        .collect();
    let cmax = lists.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut table = vec![-1i32; rows.len() * cmax];
    for (r, ids) in lists.iter().enumerate() {
        table[r * cmax..r * cmax + ids.len()].copy_from_slice(ids);
    }
    (table, cmax)
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
        // `__global__ void __launch_bounds__(..)\nname(` (or `__maxnreg__(..)`) counts as `__global__ void name(`.
        let mut p = program();
        for attr in ["__launch_bounds__(", "__maxnreg__("] {
            while let Some(at) = p.find(attr) {
                let end = at + p[at..].find(')').expect("closing parenthesis") + 1;
                let next = end + p[end..].len() - p[end..].trim_start().len();
                p.replace_range(at..next, "");
            }
        }
        // kernels/matmul_qm.cu defines its entry points by `QM_ENTRIES(NAME, TY, ..)` lines, three each: mmqm_TY NAME,
        // mmqm_glu_TY NAME, mmqm_many_TY NAME; the macro's own body (three `__global__` with `##`) is not counted.
        let body = p.matches("extern \"C\" __global__ void QM_BOUNDS_##").count();
        assert_eq!(body, 3);
        let entries: Vec<String> = p
            .lines()
            .filter_map(|l| l.strip_prefix("QM_ENTRIES("))
            .flat_map(|args| {
                let a: Vec<&str> = args.split(',').map(str::trim).collect();
                ["mmqm_", "mmqm_glu_", "mmqm_many_"]
                    .map(|f| format!("extern \"C\" __global__ void {f}{}{}(", a[1], a[0]))
            })
            .collect();
        assert_eq!(entries.len(), 12);
        p.push_str(&entries.join("\n"));
        for k in KERNELS {
            let pat = format!("__global__ void {k}(");
            assert_eq!(p.matches(&pat).count(), 1, "kernel {k}");
        }
        assert_eq!(p.matches("extern \"C\" __global__").count() - body, KERNELS.len(), "a kernel missing from KERNELS");
    }

    #[test]
    fn attention_heads_per_block_divide_the_group() {
        assert_eq!(attn_heads_per_block(12, 2, 16 * 8, 0), 6);
        assert_eq!(attn_heads_per_block(12, 2, 3, 0), 1);
        assert_eq!(attn_heads_per_block(28, 4, 16 * 3, 0), 7);
        assert_eq!(attn_heads_per_block(28, 4, 16, 0), 7);
        assert_eq!(attn_heads_per_block(28, 4, 8, 0), 1);
        assert_eq!(attn_heads_per_block(32, 4, 1000, 0), 4);
        assert_eq!(attn_heads_per_block(32, 4, 1, 7), 4);
        assert_eq!(attn_heads_per_block(14, 2, 1, 5), 1);
        assert_eq!(attn_heads_per_block(9, 3, 1, 7), 3);
        assert_eq!(attn_heads_per_block(8, 8, 1000, 0), 1);
        assert_eq!(attn_heads_per_block(12, 2, 1000, 1), 1);
        assert_eq!((norm_threads(1, 4), norm_threads(128, 4), norm_threads(1536, 4)), (32, 64, 768));
        assert_eq!(norm_threads(3584, 4), 1024);
        assert_eq!((norm_threads(3584, 16), norm_threads(1536, 8), norm_threads(4096, 16)), (448, 384, 512));
        assert_eq!(norm_per(&[]), 4);
        assert_eq!(norm_per(&["IL_PIPE=1".into(), "NORM_PER=16".into()]), 16);
        assert_eq!(norm_per(&["NORM_PER_X=16".into()]), 4);
        assert_eq!(attn_vsplit(&[]), Ok(ATTN_VSPLIT));
        assert_eq!(attn_vsplit(&["ATTN_VSPLIT=4".into()]), Ok(4));
        assert!(attn_vsplit(&["ATTN_VSPLIT=3".into()]).is_err());
    }

    #[test]
    fn dtype_codes_match_the_kernel_tags() {
        let common = source("common.cu");
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
        // Types the CPU backend has and the kernels do not: `upload` refuses them by name at load.
        for d in [
            DType::IQ4NL,
            DType::IQ4XS,
            DType::IQ3S,
            DType::IQ3XXS,
            DType::MXFP4,
            DType::IQ2XXS,
            DType::IQ2XS,
            DType::IQ1S,
            DType::IQ2S,
        ] {
            assert!(dtype_code(d).is_none() && tf_quant::is_supported(d), "{d}");
        }
        assert!(common.contains(&format!("#define DT_INTERLEAVED {DT_INTERLEAVED}\n")));
        assert!(DT_INTERLEAVED > 14 && DT_INTERLEAVED.count_ones() == 1);
        assert!(common.contains(&format!("#define EPI_ADD {EPI_ADD}\n")));
        assert!(EPI_ADD > DT_INTERLEAVED && EPI_ADD.count_ones() == 1);
    }

    #[test]
    fn interleaving_is_the_lane_chain_permutation() {
        for (dtype, block) in [(DType::F32, 64), (DType::F16, 128), (DType::BF16, 128)] {
            assert_eq!(interleave_block(dtype), Some(block));
            let epv = block / 16;
            // physical[block·b + epv·j + t] = logical[block·b + 16t + j], over three blocks.
            let mut seen = vec![false; 3 * block];
            for b in 0..3 {
                for j in 0..16 {
                    for t in 0..epv {
                        let logical = block * b + 16 * t + j;
                        let physical = il_index(logical, block);
                        assert_eq!(physical, block * b + epv * j + t, "{dtype} element {logical}");
                        assert!(!seen[physical]);
                        seen[physical] = true;
                    }
                }
            }
            // Lane j's chain (k = j, j + 16, ...) is contiguous in runs of epv.
            for j in 0..16 {
                let chain: Vec<usize> = (j..3 * block).step_by(16).map(|k| il_index(k, block)).collect();
                for w in chain.chunks(epv) {
                    assert!(w.windows(2).all(|p| p[1] == p[0] + 1), "{dtype} lane {j}: {w:?}");
                    assert_eq!(w[0] % epv, 0);
                }
            }
        }
        assert_eq!(interleave_block(DType::Q8_0), None);
    }

    /// The kernel file `name` of [`SOURCES`].
    fn source(name: &str) -> &'static str {
        SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).expect("a kernel file")
    }

    #[test]
    fn row_group_sizes_match_the_kernels() {
        let m = source("matmul.cu");
        assert!(m.contains(&format!("#define FULL_ROWS {FULL_ROWS}\n")));
        assert!(m.contains(&format!("#define QUANT_ROWS {QUANT_ROWS}\n")));
        assert!(m.contains(&format!("#define FLOAT_ROWS {FLOAT_ROWS}\n")));
        assert!(source("attention.cu").contains(&format!("#define MAX_HEAD_DIM {MAX_HEAD_DIM}\n")));
        assert!(source("attention.cu").contains(&format!("#define ATTN_THREADS {ATTN_THREADS}\n")));
        assert!(source("mma.cu").contains(&format!("#define MMA_CHUNK {MMA_CHUNK}\n")));
        assert!(source("mma.cu").contains(&format!("#define MMA_SPLIT {MMA_SPLIT}\n")));
        let qm = source("matmul_qm.cu");
        assert!(qm.contains(&format!("#define QM_WARPS {QM_WARPS}\n")) && qm.contains("#define QM_KSPLIT QM_WARPS\n"));
        // The launches' blocks and grids match the template parameters of the entry points.
        let mma = source("mma.cu");
        assert!(mma.contains("mma_matmul<false, 4, 4, 1, 2>"));
        // `_s`: MMA_S_COLS = 8 · NT · NB columns on MMA_S_THREADS = 32 · NB · MMA_SPLIT threads; `_sn` and
        // `_s_many`: one tile (NT = NB = 1); `_s_glu`: NT = 2 (gate and up), NB tiles of columns.
        assert!(mma.contains("#define MMA_S_NT 2\n") && mma.contains("#define MMA_S_NB 2\n"));
        assert_eq!((MMA_S_COLS, MMA_S_GLU_COLS, MMA_S_THREADS), (8 * 2 * 2, 8 * 2, 32 * 2 * MMA_SPLIT));
        assert!(mma.contains("mma_small_many<false, 1, 1, MMA_SN_U>"));
        assert!(mma.contains("mma_small<false, 2, MMA_S_NB, MMA_S_U, true>"));
        // Windows: `_sw`/`_sw_many` MMA_W_NT tiles, one group of MMA_SPLIT warps.
        assert!(mma.contains("#define MMA_W_NT 2\n") && mma.contains("mma_small<false, MMA_W_NT, 1, MMA_W_U, false>"));
        assert!(mma.contains("mma_small_many<false, MMA_W_NT, 1, MMA_W_U>"));
        assert_eq!((MMA_SW_COLS, MMA_SW_THREADS), (8 * 2, 32 * MMA_SPLIT));
    }

    #[test]
    fn attention_chunks_are_the_chunks_of_the_visited_positions() {
        use tf_quant::reference::ops::visited_positions;
        assert!(source("attention.cu").contains(&format!("#define ATTN_CHUNK {ATTN_CHUNK}\n")));
        assert_eq!(ATTN_CHUNK, tf_quant::reference::ops::ATTN_CHUNK);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as u32
        };
        let table: Vec<u32> = (0..200).collect();
        for window in [None, Some(1), Some(7), Some(300), Some(1000)] {
            let rows: Vec<RowAttn> = (0..300)
                .map(|i| {
                    let ctx = if i % 7 == 0 { 0 } else { next(1500) };
                    let mut tree = Vec::new();
                    let mut p = ctx;
                    for _ in 0..next(4) {
                        p += next(300);
                        tree.push((p, p));
                        p += 1;
                    }
                    let pos = tree.last().map_or(ctx.saturating_sub(1), |t| t.0);
                    RowAttn { pos, seq: 0, ctx, tree }
                })
                .collect();
            let (chunks, cmax) = attn_chunks(&rows, window);
            for (r, row) in rows.iter().enumerate() {
                let mut want: Vec<i32> =
                    visited_positions(row, &table, 16, window).iter().map(|&(p, _)| (p / ATTN_CHUNK) as i32).collect();
                want.dedup();
                let got: Vec<i32> = chunks[r * cmax..(r + 1) * cmax].iter().copied().filter(|&c| c >= 0).collect();
                assert_eq!(got, want, "row {row:?} window {window:?}");
                assert!(chunks[r * cmax..r * cmax + got.len()].iter().all(|&c| c >= 0), "ids first, then -1");
            }
        }
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
            let (g, b) = mmq_grid(rows, n);
            assert!(g.0 as usize * QD_WARPS as usize >= n && g.1 as usize * QD_ROWS as usize >= rows);
            assert_eq!(b.0, 32 * QD_WARPS);
            for cols in [il_cols(n), 2, 4, 8, 16] {
                let (g, b) = matmul_il_grid(rows, n, cols);
                assert!(g.0 as usize * cols as usize >= n && g.1 as usize * FLOAT_ROWS as usize >= rows);
                assert_eq!(b.0, 16 * cols);
            }
        }
        for (rows, n) in [(1, 1), (16, 1536), (17, 9), (256, 8960), (3, 151936), (16, 18944)] {
            for (f16, half) in [(false, false), (true, false), (false, true), (true, true)] {
                let (name, g, b) = mma_launch(rows, n, f16, half);
                let narrow = rows <= MMA_SMALL_ROWS && n < 8448;
                let window = rows >= MMA_SW_FROM;
                // The `_h` kernels (x's half copy) for windows (`_s` and `_sw` groupings).
                let h = half && half_rows(rows);
                assert_eq!(name.ends_with("_h"), h, "{name}");
                let name = name.strip_suffix("_h").unwrap_or(name);
                let (rows_per, cols_per) = match rows <= MMA_SMALL_ROWS {
                    true if narrow && window => (16, MMA_SW_COLS),
                    true if narrow => (16, 8),
                    true => (16, MMA_S_COLS),
                    false => (64, 32),
                };
                assert!(name.ends_with(match rows <= MMA_SMALL_ROWS {
                    true if narrow && window => "_sw",
                    true if narrow => "_sn",
                    true => "_s",
                    false => "_l",
                }));
                assert_eq!(name.contains("f16") && !name.contains("bf16"), f16);
                assert!(g.0 as usize * cols_per >= n && g.1 as usize * rows_per >= rows);
                assert_eq!(b.0 % (32 * MMA_SPLIT), 0);
            }
        }
        // The tensor-core streaming kernels: the 7B's down, o (3,584 columns), q/k/v (4,608) and v alone (512) split
        // K, its gate/up (18,944) and output head (152,064) do not; every column group of every row group has a block.
        let shapes = [
            (8, 3584, true),
            (64, 4608, true),
            (16, 512, true),
            (17, 8184, true),
            (32, 8185, false),
            (9, 18944, false),
            (2, 152064, false),
        ];
        for (rows, n, split) in shapes {
            assert_eq!(mmqm_splits(n), split, "{n} columns");
            for (family, ks) in MMQM_FAMILIES {
                assert!(KERNELS.contains(&family) && KERNELS.contains(&ks) && ks.strip_suffix("_ks") == Some(family));
                let (name, g, b) = mmqm_launch(family, rows, n);
                assert_eq!(name, if split { ks } else { family });
                let cols = if split { 8 } else { 8 * QM_WARPS as usize };
                assert_eq!((g.0 as usize, g.1 as usize), (rows.div_ceil(16), n.div_ceil(cols)));
                assert_eq!(b.0, 32 * QM_WARPS);
            }
        }
        assert_eq!(elementwise_grid(0).0 .0, 1);
        assert_eq!(elementwise_grid(257).0 .0, 2);
        assert_eq!(nvrtc_arch(9, 0), "--gpu-architecture=compute_90");
    }
}
