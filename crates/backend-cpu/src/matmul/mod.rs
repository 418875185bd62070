//! Row-exact matmul kernels: `y [R, N] = x [R, K] · wᵀ (+ bias)` for a weight `w [N, K]` of any supported type,
//! in both precision modes, bit-equal to `tf_quant::reference::matmul::matmul_ref` (docs/arithmetic.md).
//!
//! Work layout (none of it changes a bit of any output row):
//! - threads (the [`Pool`]) take chunks of whole tiles of output columns, about four chunks per thread (at most
//!   [`CHUNK_COLS`] columns each for wide weights), and write their columns of `y` in place; a reduction is
//!   never split;
//! - inside a chunk, tiles of [`TILE_COLS`] weight rows (16 for the 16-lane checkpoint kernels); for each tile
//!   the R activation rows are walked in groups of `RT` rows (8, 4, 2 or 1, the largest that fits what is left),
//!   each group computing a `C × RT` block of outputs (`C·RT` = 8 or 16 lanes in checkpoint mode, 4 pairs of
//!   registers in full mode) while the weight tile stays in cache. The per-output arithmetic is
//!   the same whatever `C` and `RT` are: lanes never mix.
//! - checkpoint mode quantizes each activation row once per call ([`act::ActQ`]); full mode dequantizes each
//!   weight row of a tile once into a scratch buffer reused by every row group.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_dequant;
#[cfg(target_arch = "x86_64")]
mod avx2_full;
#[cfg(target_arch = "x86_64")]
mod avx2_kquant;
#[cfg(target_arch = "x86_64")]
mod avx2_legacy;
#[cfg(target_arch = "x86_64")]
mod avx2_wide;
#[cfg(target_arch = "x86_64")]
mod avx512_iquant;
#[cfg(target_arch = "x86_64")]
mod avx512_iquant2;
#[cfg(target_arch = "x86_64")]
mod avx512_iquant_rows;
#[cfg(target_arch = "x86_64")]
mod avx512_kquant;
#[cfg(target_arch = "x86_64")]
mod avx512_legacy;
#[cfg(target_arch = "x86_64")]
mod avx512_wide;
#[cfg(all(test, target_arch = "x86_64"))]
mod iquant_test_util;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_full;
#[cfg(target_arch = "aarch64")]
mod neon_kquant;
#[cfg(target_arch = "aarch64")]
mod neon_legacy;
mod scalar;

use std::borrow::Cow;
use std::cell::RefCell;
#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

use tf_core::{BackendError, DType, Precision, SharedBytes, Tensor, TensorInfo};
use tf_quant::reference::matmul::checkpoint_block;

use crate::isa::Isa;
use crate::pool::{Pool, SendPtr};
use act::ActQ;

/// Most output columns per thread task on wide weights. A chunk is a unit of work, never a unit of arithmetic.
pub const CHUNK_COLS: usize = 64;
/// Weight rows (output columns) per cache tile inside a chunk.
pub const TILE_COLS: usize = 8;

/// A weight on the CPU: a matrix `[out, in]` (outer dimensions flattened into `out`) or a vector `[n]`
/// (`out = 1`, `in = n`), with its raw GGUF bytes (F32 kept as f32 values).
pub struct CpuWeight {
    dtype: DType,
    /// Outermost first, as given.
    shape: Vec<usize>,
    out_dim: usize,
    in_dim: usize,
    /// Bytes of one row (`in / block_size * block_bytes`); 4·in for F32.
    row_bytes: usize,
    /// `[out * row_bytes]` raw little-endian bytes for every type but F32, 8-aligned so that block views borrow:
    /// in place in the mapped checkpoint, or a copy. Empty for F32.
    raw: Raw,
    /// `[out * in]` values for F32. Empty otherwise.
    f32s: Vec<f32>,
    /// The same blocks in the AVX-512 wide layout (`[out.div_ceil(16)]` groups of 16 rows), made by the first
    /// checkpoint matmul on AVX-512 and read by every later one instead of `raw` ([`CpuWeight::packed_bytes`]).
    #[cfg(target_arch = "x86_64")]
    packed: OnceLock<Option<avx512_wide::Packed>>,
    /// The same blocks in the AVX2 wide layout (`[out.div_ceil(8)]` groups of 8 rows), made by the first
    /// checkpoint matmul on AVX2 (a CPU without AVX-512) and read by every later one instead of `raw`.
    #[cfg(target_arch = "x86_64")]
    packed8: OnceLock<Option<avx2_wide::Packed>>,
    /// Whether either copy may be made ([`CpuWeight::unpacked`]).
    may_pack: bool,
}

/// Where a weight's bytes live.
enum Raw {
    /// A copy, in u64s for alignment.
    Owned(Vec<u64>),
    /// In place in the shared owner (8-aligned, checked at upload).
    Mapped(SharedBytes),
}

impl std::fmt::Debug for CpuWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuWeight({} {:?})", self.dtype, self.shape)
    }
}

impl CpuWeight {
    /// A checkpoint tensor from its raw bytes (copied). Errors on unsupported types and inconsistent lengths.
    pub fn from_bytes(info: &TensorInfo, bytes: &[u8]) -> Result<CpuWeight, BackendError> {
        let (dtype, shape, out_dim, in_dim, row_bytes) = Self::layout(info, bytes.len())?;
        let (raw, f32s) = if dtype == DType::F32 {
            let v = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (Raw::Owned(Vec::new()), v)
        } else {
            let mut raw = vec![0u64; bytes.len().div_ceil(8)];
            // SAFETY: `raw` holds at least `bytes.len()` bytes; u64 has no invalid bit patterns.
            unsafe { std::slice::from_raw_parts_mut(raw.as_mut_ptr() as *mut u8, bytes.len()) }.copy_from_slice(bytes);
            (Raw::Owned(raw), Vec::new())
        };
        Ok(CpuWeight::new(dtype, shape, out_dim, in_dim, row_bytes, raw, f32s))
    }

    /// A checkpoint tensor used in place from a shared owner (the mapped file) when its bytes are 8-aligned and
    /// not F32; otherwise as [`CpuWeight::from_bytes`].
    pub fn from_shared(info: &TensorInfo, bytes: SharedBytes) -> Result<CpuWeight, BackendError> {
        let (dtype, shape, out_dim, in_dim, row_bytes) = Self::layout(info, bytes.as_slice().len())?;
        if dtype == DType::F32 || bytes.as_slice().as_ptr().align_offset(8) != 0 {
            return CpuWeight::from_bytes(info, bytes.as_slice());
        }
        Ok(CpuWeight::new(dtype, shape, out_dim, in_dim, row_bytes, Raw::Mapped(bytes), Vec::new()))
    }

    fn new(
        dtype: DType,
        shape: Vec<usize>,
        out_dim: usize,
        in_dim: usize,
        row_bytes: usize,
        raw: Raw,
        f32s: Vec<f32>,
    ) -> CpuWeight {
        CpuWeight {
            dtype,
            shape,
            out_dim,
            in_dim,
            row_bytes,
            raw,
            f32s,
            #[cfg(target_arch = "x86_64")]
            packed: OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            packed8: OnceLock::new(),
            may_pack: true,
        }
    }

    /// Whether the bytes are used in place (not copied).
    pub fn is_in_place(&self) -> bool {
        matches!(self.raw, Raw::Mapped(_))
    }

    /// This weight without the wide-layout copies: its checkpoint matmuls on AVX-512 and AVX2 read the blocks as
    /// stored, with the tile kernels (the same bits; for comparisons and tests).
    pub fn unpacked(mut self) -> CpuWeight {
        self.may_pack = false;
        self
    }

    /// The wide layout of this weight for a checkpoint matmul on `isa`, made on first use: with AVX-512, a matrix of
    /// a type with a wide kernel (Q4_K, Q6_K, Q4_1, Q5_0, Q8_0, IQ4_XS, IQ4_NL, MXFP4) is copied once into it (the
    /// same bytes, moved), and a mapped weight's file pages are then released (read back from the file only if a row
    /// is gathered or dequantized), so the weight stays resident once.
    #[cfg(target_arch = "x86_64")]
    fn packed_for(&self, isa: Isa) -> Option<&avx512_wide::Packed> {
        if isa != Isa::Avx512 || !self.may_pack || self.out_dim < 2 {
            return None;
        }
        self.packed
            .get_or_init(|| {
                // A mapped source is released as it is copied, so the weight is never resident twice over more
                // than a few MB.
                let mut done = |r: std::ops::Range<usize>| {
                    if let Raw::Mapped(b) = &self.raw {
                        b.release_part(r);
                    }
                };
                avx512_wide::pack(self.dtype, self.bytes(), self.out_dim, self.row_bytes, &mut done)
            })
            .as_ref()
    }

    /// The AVX2 wide layout of this weight for a checkpoint matmul on `isa`, made on first use: on `Isa::Avx2` with
    /// F16C, a matrix of a type with an AVX2 wide kernel (Q4_K, Q5_K, Q6_K, Q4_1, Q5_0, Q8_0) is copied once into it,
    /// releasing a mapped weight's file pages as [`CpuWeight::packed_for`] does.
    #[cfg(target_arch = "x86_64")]
    fn packed8_for(&self, isa: Isa) -> Option<&avx2_wide::Packed> {
        if isa != Isa::Avx2 || !self.may_pack || self.out_dim < 2 {
            return None;
        }
        self.packed8
            .get_or_init(|| {
                let mut done = |r: std::ops::Range<usize>| {
                    if let Raw::Mapped(b) = &self.raw {
                        b.release_part(r);
                    }
                };
                avx2_wide::pack(self.dtype, self.bytes(), self.out_dim, self.row_bytes, &mut done)
            })
            .as_ref()
    }

    /// Bytes of the wide-layout copies (0 until a checkpoint matmul on AVX-512 or AVX2 has made one).
    pub fn packed_bytes(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let wide = self.packed.get().and_then(|p| p.as_ref()).map_or(0, |p| p.bytes());
            let wide8 = self.packed8.get().and_then(|p| p.as_ref()).map_or(0, |p| p.bytes());
            wide + wide8
        }
        #[cfg(not(target_arch = "x86_64"))]
        0
    }

    /// Checks `info` against `len` bytes → (dtype, shape, out, in, row bytes).
    fn layout(info: &TensorInfo, len: usize) -> Result<(DType, Vec<usize>, usize, usize, usize), BackendError> {
        let err =
            |what: String| BackendError(format!("tensor '{}' ({} {:?}): {what}", info.name, info.dtype, info.shape));
        let dtype = info.dtype;
        if !tf_quant::is_supported(dtype) {
            return Err(err(format!("the CPU backend has no kernels for {dtype}")));
        }
        let shape: Vec<usize> = info
            .shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| err("dimension too large".into())))
            .collect::<Result<_, _>>()?;
        let in_dim = shape.last().copied().unwrap_or(1);
        let out_dim = if shape.len() >= 2 { shape[..shape.len() - 1].iter().product() } else { 1 };
        let bs = dtype.block_size();
        if in_dim % bs != 0 {
            return Err(err(format!("rows of {in_dim} elements are not whole blocks of {bs}")));
        }
        let row_bytes = in_dim / bs * dtype.block_bytes();
        let total = out_dim.checked_mul(row_bytes).ok_or_else(|| err("too large".into()))?;
        if len != total {
            return Err(err(format!("expected {total} bytes, got {len}")));
        }
        Ok((dtype, shape, out_dim, in_dim, row_bytes))
    }

    /// An F32 weight from values (`shape` outermost first). Panics if the lengths disagree (programming error).
    pub fn from_f32(shape: &[usize], values: Vec<f32>) -> CpuWeight {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "CpuWeight::from_f32: shape {shape:?}");
        let in_dim = shape.last().copied().unwrap_or(1);
        let out_dim = if shape.len() >= 2 { shape[..shape.len() - 1].iter().product() } else { 1 };
        CpuWeight {
            dtype: DType::F32,
            shape: shape.to_vec(),
            out_dim,
            in_dim,
            row_bytes: 4 * in_dim,
            raw: Raw::Owned(Vec::new()),
            f32s: values,
            #[cfg(target_arch = "x86_64")]
            packed: OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            packed8: OnceLock::new(),
            may_pack: false,
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows (`out`).
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Elements per row (`in`).
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// The raw bytes of every row (not for F32).
    fn bytes(&self) -> &[u8] {
        match &self.raw {
            // SAFETY: `v` holds at least `out_dim * row_bytes` initialized bytes (see `from_bytes`).
            Raw::Owned(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr() as *const u8, self.out_dim * self.row_bytes)
            },
            Raw::Mapped(b) => b.as_slice(),
        }
    }

    /// The raw bytes of row `r` (not for F32).
    fn row_bytes_of(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Row `r` dequantized into `out` (`[in]`), bit-equal to `tf_quant::dequantize`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.out_dim, "row {r} of a weight with {} rows", self.out_dim);
        assert_eq!(out.len(), self.in_dim, "row_f32: output length");
        if self.dtype == DType::F32 {
            out.copy_from_slice(&self.f32s[r * self.in_dim..(r + 1) * self.in_dim]);
        } else {
            tf_quant::dequantize(self.dtype, self.row_bytes_of(r), out).expect("validated at load");
        }
    }

    /// The whole weight dequantized (`[out * in]`), for small vectors such as norms and biases.
    pub fn as_f32_vec(&self) -> Vec<f32> {
        if self.dtype == DType::F32 {
            return self.f32s.clone();
        }
        tf_quant::dequantize_to_vec(self.dtype, self.bytes(), self.out_dim * self.in_dim).expect("validated at load")
    }
}

thread_local! {
    /// Full mode: `[TILE_COLS][K]` dequantized weight rows of the current tile.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// How one weight's share of a call computes: full (f32 dot16) or checkpoint with the quantized activations.
enum Job<'a> {
    Full { x: &'a [f32] },
    Quant { act: &'a ActQ, kernel: Kernel },
}

/// Rows per group for `left` remaining rows: the largest of 8, 4, 2, 1 not above `left` (capped at `max`).
fn row_group(left: usize, max: usize) -> usize {
    [8, 4, 2, 1].into_iter().find(|&g| g <= left && g <= max).unwrap_or(1)
}

/// `y = x · wᵀ (+ bias)`: `x [R, K]`, `w [N, K]`, `bias [N]` → `[R, N]`. Row-exact: each output row depends only
/// on its input row, the weights, `precision` (and never on `R`, the pool's thread count or `isa`).
/// Panics when the shapes disagree (a programming error in the model).
pub fn matmul(
    pool: &Pool,
    isa: Isa,
    precision: Precision,
    x: &Tensor,
    w: &CpuWeight,
    bias: Option<&CpuWeight>,
) -> Tensor {
    matmul_many(pool, isa, precision, x, &[(w, bias)]).pop().expect("one result per weight")
}

/// [`matmul`] of one `x` with several weights (`[(w, bias)]`, each `[N_i, K]`) → one `[R, N_i]` per weight, with
/// the same bits as separate calls: the activations are quantized once per block size, and one pool dispatch
/// covers every weight's chunks (the wide kernels request the next weight's first groups while finishing one).
pub fn matmul_many(
    pool: &Pool,
    isa: Isa,
    precision: Precision,
    x: &Tensor,
    ws: &[(&CpuWeight, Option<&CpuWeight>)],
) -> Vec<Tensor> {
    let (rows, k) = (x.rows, x.cols);
    assert_eq!(x.host.len(), rows * k, "matmul: x has no host data of [{rows}, {k}]");
    assert!(isa.usable(), "matmul: {} kernels on a CPU without them", isa.name());
    for (w, _) in ws {
        assert_eq!(
            w.in_dim, k,
            "matmul: x is [{rows}, {k}] but the weight {:?} ({}) expects {} input columns",
            w.shape, w.dtype, w.in_dim
        );
    }
    // The quantized activations, once per checkpoint block size among the weights.
    let mut acts: Vec<(usize, ActQ)> = Vec::new();
    if precision == Precision::Checkpoint && rows > 0 {
        for (w, _) in ws {
            if let Some(block) = checkpoint_block(w.dtype) {
                if !acts.iter().any(|(b, _)| *b == block) {
                    acts.push((block, ActQ::new(isa, &x.host, rows, k, block)));
                }
            }
        }
    }
    let act_for = |block: usize| &acts.iter().find(|(b, _)| *b == block).expect("quantized above").1;
    let mut ys: Vec<Vec<f32>> = Vec::with_capacity(ws.len());
    let mut plans: Vec<Plan> = Vec::with_capacity(ws.len());
    let mut tasks = 0;
    for &(w, bias) in ws {
        let n = w.out_dim;
        // `[n]` bias values, borrowed when the bias is stored as f32.
        let bias: Option<Cow<[f32]>> = bias.map(|b| {
            assert_eq!(b.out_dim * b.in_dim, n, "matmul: bias {:?} for a weight with {n} outputs", b.shape);
            if b.dtype == DType::F32 {
                Cow::Borrowed(&b.f32s[..])
            } else {
                Cow::Owned(b.as_f32_vec())
            }
        });
        let job = match checkpoint_block(w.dtype) {
            Some(block) if precision == Precision::Checkpoint && rows > 0 => {
                Job::Quant { act: act_for(block), kernel: pick_quant_kernel(isa, w) }
            }
            _ => Job::Full { x: &x.host },
        };
        // `[rows][n]`, written in place by the chunks (disjoint column ranges).
        let mut y = vec![0f32; rows * n];
        let out = Out { ptr: SendPtr(y.as_mut_ptr()), rows, stride: n };
        ys.push(y);
        // Chunks are whole tiles of the kernel's width.
        let tile = match &job {
            Job::Quant { kernel: Kernel::Lanes16(_), .. } => 16,
            #[cfg(target_arch = "x86_64")]
            Job::Quant { kernel: Kernel::Wide, .. } => 16,
            #[cfg(target_arch = "x86_64")]
            Job::Quant { kernel: Kernel::Wide8, .. } => avx2_wide::LANES,
            #[cfg(target_arch = "x86_64")]
            Job::Quant { kernel: Kernel::Chunk(_), .. } => 16,
            _ => TILE_COLS,
        };
        let tiles = n.div_ceil(tile);
        let count = if rows == 0 || n == 0 {
            0
        } else if pool.threads() == 1 {
            1
        } else {
            (4 * pool.threads()).max(tiles.div_ceil(CHUNK_COLS / tile)).min(tiles)
        };
        plans.push(Plan { w, bias, job, out, tile, tiles, first: tasks, count });
        tasks += count;
    }
    pool.run(tasks, &|t| {
        let i = plans.partition_point(|p| p.first + p.count <= t);
        let (p, t) = (&plans[i], t - plans[i].first);
        let (w, n, out) = (p.w, p.w.out_dim, &p.out);
        let (c0, c1) = (t * p.tiles / p.count * p.tile, ((t + 1) * p.tiles / p.count * p.tile).min(n));
        match &p.job {
            Job::Full { x } => chunk_full(isa, w, x, c0, c1, out),
            Job::Quant { act, kernel: Kernel::Lanes8(kernel) } => chunk_quant(*kernel, w, act, c0, c1, out),
            Job::Quant { act, kernel: Kernel::Lanes16(kernel) } => chunk_quant(*kernel, w, act, c0, c1, out),
            #[cfg(target_arch = "x86_64")]
            Job::Quant { act, kernel: Kernel::Wide } => {
                let packed = w.packed_for(isa).expect("picked for a packed weight");
                // The next weight's layout, if it is packed too: its first groups are requested while this
                // weight's last ones are computed.
                let next = plans.get(i + 1).and_then(|q| match q.job {
                    Job::Quant { kernel: Kernel::Wide, .. } => q.w.packed_for(isa),
                    _ => None,
                });
                avx512_wide::chunk(packed, next, act, c0, c1, out)
            }
            #[cfg(target_arch = "x86_64")]
            Job::Quant { act, kernel: Kernel::Wide8 } => {
                let packed = w.packed8_for(isa).expect("picked for a packed weight");
                let next = plans.get(i + 1).and_then(|q| match q.job {
                    Job::Quant { kernel: Kernel::Wide8, .. } => q.w.packed8_for(isa),
                    _ => None,
                });
                avx2_wide::chunk(packed, next, act, c0, c1, out)
            }
            #[cfg(target_arch = "x86_64")]
            Job::Quant { act, kernel: Kernel::Chunk(kernel) } => kernel(w, act, c0, c1, out),
        }
        if let Some(b) = &p.bias {
            for r in 0..rows {
                for c in c0..c1 {
                    // SAFETY: this task owns columns `c0..c1` of every row of this weight's output.
                    unsafe { out.add(r, c, b[c]) };
                }
            }
        }
    });
    drop(plans);
    ys.into_iter().zip(ws).map(|(y, (w, _))| Tensor::host(rows, w.out_dim, y)).collect()
}

/// One weight's share of a [`matmul_many`] call: its tasks are `first..first + count` of the dispatch.
struct Plan<'a> {
    w: &'a CpuWeight,
    bias: Option<Cow<'a, [f32]>>,
    job: Job<'a>,
    out: Out,
    /// Columns per tile, tiles in all.
    tile: usize,
    tiles: usize,
    first: usize,
    count: usize,
}

/// The output `[rows][stride]` of one matmul, shared by its tasks; each task writes only its own columns.
struct Out {
    ptr: SendPtr<f32>,
    rows: usize,
    stride: usize,
}

impl Out {
    /// `y[r][c] = v`.
    ///
    /// # Safety
    /// No other thread accesses `y[r][c]` during the call (tasks own disjoint columns).
    #[inline]
    unsafe fn set(&self, r: usize, c: usize, v: f32) {
        assert!(r < self.rows && c < self.stride, "matmul output ({r}, {c}) out of range");
        *self.ptr.get().add(r * self.stride + c) = v;
    }

    /// `y[r][c] += v`.
    ///
    /// # Safety
    /// As [`Out::set`].
    #[inline]
    unsafe fn add(&self, r: usize, c: usize, v: f32) {
        assert!(r < self.rows && c < self.stride, "matmul output ({r}, {c}) out of range");
        *self.ptr.get().add(r * self.stride + c) += v;
    }
}

/// Full mode over output columns `c0..c1` of `out`.
fn chunk_full(isa: Isa, w: &CpuWeight, x: &[f32], c0: usize, c1: usize, out: &Out) {
    let k = w.in_dim;
    let rows = out.rows;
    // `[rows]` activation rows.
    let xrows: Vec<&[f32]> = x.chunks_exact(k).collect();
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if w.dtype != DType::F32 {
            scratch.resize(TILE_COLS * k, 0.0);
        }
        for t0 in (c0..c1).step_by(TILE_COLS) {
            let t1 = (t0 + TILE_COLS).min(c1);
            // `[t1 - t0]` weight rows of this tile, each `[k]` f32.
            let wrows: Vec<&[f32]> = if w.dtype == DType::F32 {
                (t0..t1).map(|c| &w.f32s[c * k..(c + 1) * k]).collect()
            } else {
                for (c, dst) in (t0..t1).zip(scratch.chunks_exact_mut(k)) {
                    dequant_row(isa, w.dtype, w.row_bytes_of(c), dst);
                }
                scratch.chunks_exact(k).take(t1 - t0).collect()
            };
            let mut r0 = 0;
            while r0 < rows {
                let rt = row_group(rows - r0, 4);
                let c = 4 / rt;
                for s0 in (0..t1 - t0).step_by(c) {
                    // Lane (ci, ri) = column t0 + s0 + ci (clamped into the tile), row r0 + ri.
                    let cols: [&[f32]; 4] = std::array::from_fn(|i| wrows[(s0 + i).min(t1 - t0 - 1)]);
                    let xs: [&[f32]; 4] = std::array::from_fn(|i| xrows[r0 + i.min(rt - 1)]);
                    let res = dot16_tile(isa, c, rt, &cols, &xs);
                    for ci in 0..c.min(t1 - t0 - s0) {
                        for ri in 0..rt {
                            // SAFETY: this task owns columns `c0..c1`.
                            unsafe { out.set(r0 + ri, t0 + s0 + ci, res[ci * rt + ri]) };
                        }
                    }
                }
                r0 += rt;
            }
        }
    });
}

/// A weight row dequantized, bit-equal to `tf_quant::dequantize` (AVX2 for the common types).
fn dequant_row(isa: Isa, dtype: DType, bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `Isa::Avx2` is only ever selected when the CPU has AVX2 and FMA.
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && unsafe { avx2_dequant::dequant_row(dtype, bytes, out) } {
        return;
    }
    let _ = isa;
    tf_quant::dequantize(dtype, bytes, out).expect("validated at load");
}

/// `dot16` of the first `c` weight rows with the first `rt` activation rows (`c · rt = 4`): lane `ci · rt + ri`.
fn dot16_tile(isa: Isa, c: usize, rt: usize, w: &[&[f32]; 4], x: &[&[f32]; 4]) -> [f32; 4] {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only ever selected when the CPU has AVX2 and FMA; all rows are `[k]`.
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2_full::dot16_tile(c, rt, w, x) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `Isa::Neon` is only ever selected on aarch64 with NEON; all rows are `[k]`.
        Isa::Neon => unsafe { neon_full::dot16_tile(c, rt, w, x) },
        _ => scalar::dot16_tile(c, rt, w, x),
    }
}

/// Checkpoint mode over output columns `c0..c1` of `out`, with an `L`-lane kernel (tiles of `L` weight rows).
fn chunk_quant<const L: usize>(kernel: TileKernel<L>, w: &CpuWeight, act: &ActQ, c0: usize, c1: usize, out: &Out) {
    let rows = act.rows;
    // The first tile's rows, all at once: the kernels prefetch each next tile while computing one, but the first
    // tile of a chunk would otherwise arrive line by line as the kernel touches it.
    // The weight's bytes, looked up once (a mapped weight's slice is not free to form per tile).
    let (bytes, rb) = (w.bytes(), w.row_bytes);
    crate::simd::prefetch_l2(&bytes[c0 * rb..(c0 + L).min(c1) * rb]);
    for t0 in (c0..c1).step_by(L) {
        let t1 = (t0 + L).min(c1);
        let mut r0 = 0;
        while r0 < rows {
            let rt = row_group(rows - r0, 8);
            let c = L / rt;
            for s0 in (t0..t1).step_by(c) {
                // Lane (ci, ri) = column s0 + ci (clamped into the tile), row r0 + ri.
                let cols: [&[u8]; L] = std::array::from_fn(|i| {
                    let c = (s0 + i).min(t1 - 1);
                    &bytes[c * rb..(c + 1) * rb]
                });
                let res = kernel(&cols, act, r0, rt);
                for ci in 0..c.min(t1 - s0) {
                    for ri in 0..rt {
                        // SAFETY: this task owns columns `c0..c1`.
                        unsafe { out.set(r0 + ri, s0 + ci, res[ci * rt + ri]) };
                    }
                }
            }
            r0 += rt;
        }
    }
}

/// A checkpoint tile kernel: weight rows `cols[0..8 / rt]` × activation rows `r0..r0 + rt` → 8 lanes, lane
/// `ci · rt + ri`.
pub(crate) type QuantKernel = TileKernel<8>;

/// A checkpoint tile kernel of `L` lanes: weight rows `cols[0..L / rt]` × activation rows `r0..r0 + rt`, lane
/// `ci · rt + ri`.
pub(crate) type TileKernel<const L: usize> = fn(cols: &[&[u8]; L], act: &ActQ, r0: usize, rt: usize) -> [f32; L];

/// [`QuantKernel`] with 16 lanes: weight rows `cols[0..16 / rt]` × activation rows `r0..r0 + rt`, lane
/// `ci · rt + ri` (`rt` = 8, 4, 2 or 1: two weight rows at least, which is what the AVX-512 kernels pair).
pub(crate) type QuantKernel16 = TileKernel<16>;

/// A checkpoint kernel of either width.
#[derive(Clone, Copy)]
enum Kernel {
    Lanes8(QuantKernel),
    /// The AVX-512 legacy kernels (x86_64 only).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Lanes16(QuantKernel16),
    /// The wide AVX-512 kernel of a packed weight (x86_64 only): 16 weight rows per register lane group.
    #[cfg(target_arch = "x86_64")]
    Wide,
    /// The wide AVX2 kernel of a packed weight (x86_64 only): 8 weight rows per register lane group.
    #[cfg(target_arch = "x86_64")]
    Wide8,
    /// A kernel that computes a whole chunk of columns (`c0` a multiple of 16) of the weight as stored (x86_64
    /// only: the AVX-512 i-quant kernels).
    #[cfg(target_arch = "x86_64")]
    Chunk(ChunkKernel),
}

/// Checkpoint mode over output columns `c0..c1` of `out` for every activation row.
#[cfg(target_arch = "x86_64")]
type ChunkKernel = fn(w: &CpuWeight, act: &ActQ, c0: usize, c1: usize, out: &Out);

/// The checkpoint kernel for `w` on `isa`, any row count (every choice gives the same bits).
fn pick_quant_kernel(isa: Isa, w: &CpuWeight) -> Kernel {
    let dtype = w.dtype;
    #[cfg(target_arch = "x86_64")]
    if w.packed_for(isa).is_some() {
        return Kernel::Wide;
    }
    #[cfg(target_arch = "x86_64")]
    if w.packed8_for(isa).is_some() {
        return Kernel::Wide8;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        if let Some(k) = avx512_legacy::kernel16(dtype) {
            return Kernel::Lanes16(k);
        }
        if let Some(k) = avx512_iquant::chunk_kernel(dtype).or_else(|| avx512_iquant2::chunk_kernel(dtype)) {
            return Kernel::Chunk(k);
        }
        if let Some(k) = avx512_kquant::kernel(dtype) {
            return Kernel::Lanes8(k);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        if let Some(k) = avx2_legacy::kernel(dtype).or_else(|| avx2_kquant::kernel(dtype)) {
            return Kernel::Lanes8(k);
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        if let Some(k) = neon_legacy::kernel(dtype).or_else(|| neon_kquant::kernel(dtype)) {
            return Kernel::Lanes8(k);
        }
    }
    let _ = isa;
    Kernel::Lanes8(scalar::quant_kernel(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A weight kept in place in a shared owner computes the same bits as its copy; a misaligned range or F32
    /// is copied.
    #[test]
    fn shared_weights_are_used_in_place_with_the_same_bits() {
        use std::sync::Arc;
        let (out, inn) = (24usize, 64usize);
        let info = TensorInfo { name: "w".into(), dtype: DType::Q8_0, shape: vec![out as u64, inn as u64] };
        let row_bytes = inn / 32 * DType::Q8_0.block_bytes();
        // `[8 + out * row_bytes]`: an 8-byte header, then the weight; a block's f16 scale is kept finite.
        let mut file = vec![0u8; 8 + out * row_bytes];
        for (i, b) in file.iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        for blk in (8..file.len()).step_by(DType::Q8_0.block_bytes()) {
            file[blk + 1] = 0x2c; // scale ≈ 0.06
        }
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(file.clone());
        let at = |start: usize| SharedBytes::new(owner.clone(), start..start + out * row_bytes).unwrap();
        let shared = CpuWeight::from_shared(&info, at(8)).unwrap();
        let copied = CpuWeight::from_bytes(&info, &file[8..]).unwrap();
        assert!(shared.is_in_place() && !copied.is_in_place());
        assert!(!CpuWeight::from_shared(&info, at(3)).unwrap().is_in_place(), "misaligned bytes are copied");
        let pool = Pool::new(2);
        let x = Tensor::host(3, inn, (0..3 * inn).map(|i| (i as f32 * 0.37).sin()).collect());
        for precision in [Precision::Checkpoint, Precision::Full] {
            let a = matmul(&pool, Isa::detect(), precision, &x, &shared, None);
            let b = matmul(&pool, Isa::detect(), precision, &x, &copied, None);
            assert!(a.host.iter().zip(&b.host).all(|(p, q)| p.to_bits() == q.to_bits()), "{precision:?}");
            assert!(a.host.iter().all(|v| v.is_finite()));
        }
        // On AVX-512 (and on AVX2 with F16C) the first checkpoint matmul copies the weight into the wide layout and
        // releases every byte of the mapped source, in order, once; the results keep their bits and the copy is as
        // large as the source (plus the last group's padding rows).
        let released = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = released.clone();
        let hook: tf_core::Release = Arc::new(move |r| log.lock().unwrap().push(r));
        let watched = CpuWeight::from_shared(&info, at(8).with_release(hook)).unwrap();
        let got = matmul(&pool, Isa::detect(), Precision::Checkpoint, &x, &watched, None);
        let want = matmul(&pool, Isa::detect(), Precision::Checkpoint, &x, &copied, None);
        assert!(got.host.iter().zip(&want.host).all(|(p, q)| p.to_bits() == q.to_bits()));
        let ranges = released.lock().unwrap().clone();
        #[cfg(target_arch = "x86_64")]
        let lanes = match Isa::detect() {
            Isa::Avx512 => Some(16),
            Isa::Avx2 if avx2_wide::usable() => Some(8),
            _ => None,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let lanes: Option<usize> = None;
        if let Some(lanes) = lanes {
            let (start, end) = (8, 8 + out * row_bytes);
            assert_eq!(ranges.first().map(|r| r.start), Some(start), "{ranges:?}");
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "{ranges:?}");
            assert_eq!(ranges.last().map(|r| r.end), Some(end), "{ranges:?}");
            assert_eq!(watched.packed_bytes(), out.div_ceil(lanes) * lanes * row_bytes);
            matmul(&pool, Isa::detect(), Precision::Checkpoint, &x, &watched, None);
            assert_eq!(released.lock().unwrap().len(), ranges.len(), "packed once");
        } else {
            assert!(ranges.is_empty() && watched.packed_bytes() == 0);
        }
        // A wrong length is refused either way.
        let short = SharedBytes::new(owner.clone(), 8..8 + out * row_bytes - 1).unwrap();
        assert!(CpuWeight::from_shared(&info, short).is_err());
        assert!(SharedBytes::new(owner, 0..file.len() + 1).is_none());
    }

    #[test]
    fn row_groups() {
        assert_eq!(row_group(64, 8), 8);
        assert_eq!(row_group(7, 8), 4);
        assert_eq!(row_group(3, 8), 2);
        assert_eq!(row_group(1, 8), 1);
        assert_eq!(row_group(9, 4), 4);
    }

    #[test]
    fn weight_validation() {
        let info = TensorInfo { name: "w".into(), dtype: DType::Q4_0, shape: vec![2, 64] };
        assert!(CpuWeight::from_bytes(&info, &[0u8; 72]).is_ok());
        let e = CpuWeight::from_bytes(&info, &[0u8; 71]).unwrap_err();
        assert!(e.0.contains("72") && e.0.contains("71"), "{e}");
        let info = TensorInfo { name: "w".into(), dtype: DType::Q4_0, shape: vec![2, 48] };
        assert!(CpuWeight::from_bytes(&info, &[0u8; 54]).unwrap_err().0.contains("whole blocks"));
        let info = TensorInfo { name: "w".into(), dtype: DType::I32, shape: vec![4] };
        assert!(CpuWeight::from_bytes(&info, &[0u8; 16]).is_err());
        let w = CpuWeight::from_f32(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let mut row = [0f32; 3];
        w.row_f32(1, &mut row);
        assert_eq!(row, [4., 5., 6.]);
        assert_eq!((w.out_dim(), w.in_dim(), w.shape()), (2, 3, &[2usize, 3][..]));
    }

    #[test]
    #[should_panic(expected = "expects 4 input columns")]
    fn shape_mismatch_panics() {
        let pool = Pool::new(1);
        let w = CpuWeight::from_f32(&[2, 4], vec![0.0; 8]);
        matmul(&pool, Isa::Scalar, Precision::Full, &Tensor::zeros(1, 3), &w, None);
    }
}
