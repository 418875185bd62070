//! Checkpoint-precision matmuls of quantized weights: the rows are quantized once per input (`quantize_rows`, shared
//! by every weight of a `matmul_many`), then Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights
//! take the streaming kernels of kernels/matmul_q.cu (`mmq_*`: each weight row read once per group of `QD_ROWS`
//! rows) below `CudaTuning::quant_tiles` rows and the tensor-core kernels of kernels/matmul_qt.cu (`mmqt_*`: int8
//! `mma` tiles of 64 rows × 64 columns) from there, and the other types `matmul_quant`. Every kernel here gives the
//! reference's bits (docs/arithmetic.md), whatever the row count.

use super::{act_code, bias_arg, weight, CudaBackend, CudaTensor, CudaWeight};
use crate::device::Buf;
use crate::geometry::{matmul_quant_grid, mmq_grid, mmqm_launch, mmqt_grid, EPI_ADD, QM_MAX_ROWS};
use tf_core::{DType, GluAct, Precision, Tensor, Weight};
use tf_quant::reference::matmul::{checkpoint_block, sum_group};

/// The tensor-core kernel (kernels/matmul_qt.cu) of the streaming kernel `mmq`'s type.
fn tiles_kernel(mmq: &str) -> &'static str {
    match mmq {
        "mmq_q4_0" => "mmqt_q4_0",
        "mmq_q4_1" => "mmqt_q4_1",
        "mmq_q5_0" => "mmqt_q5_0",
        "mmq_q8_0" => "mmqt_q8_0",
        "mmq_q4k" => "mmqt_q4k",
        "mmq_q6k" => "mmqt_q6k",
        "mmq_q5_1" => "mmqt_q5_1",
        "mmq_q5k" => "mmqt_q5k",
        "mmq_q3k" => "mmqt_q3k",
        "mmq_q2k" => "mmqt_q2k",
        other => unreachable!("no tensor-core kernel for {other}"),
    }
}

/// Activation rows quantized per weight block (`quantize_rows`): int8 values, block scales, group sums.
pub(super) struct QuantRows {
    q: Buf,
    d: Buf,
    sums: Buf,
    rows: usize,
    k: usize,
}

impl CudaBackend {
    /// The streaming kernel of `cw`'s type, if it has one and `CudaTuning::quant_stream` is on: Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K rows in the file's block order (the kernels read 16-byte
    /// pieces from a 16-byte aligned start).
    fn mmq_kernel(&self, cw: &CudaWeight) -> Option<&'static str> {
        let kernel = match cw.dtype {
            DType::Q4_0 => "mmq_q4_0",
            DType::Q4_1 => "mmq_q4_1",
            DType::Q5_0 => "mmq_q5_0",
            DType::Q8_0 => "mmq_q8_0",
            DType::Q4K => "mmq_q4k",
            DType::Q6K => "mmq_q6k",
            DType::Q5_1 => "mmq_q5_1",
            DType::Q5K => "mmq_q5k",
            DType::Q3K => "mmq_q3k",
            DType::Q2K => "mmq_q2k",
            _ => return None,
        };
        let on = !self.tune.no_quant_stream.load(std::sync::atomic::Ordering::Relaxed);
        (on && !cw.interleaved && cw.buf.ptr.is_multiple_of(16)).then_some(kernel)
    }

    /// The tensor-core streaming kernels (kernels/matmul_qm.cu: `mmqm_<type>`, `mmqm_many_<type>`,
    /// `mmqm_glu_<type>`) that `rows` rows of streaming kernel `mmq`'s type run on: Q4_K and Q6_K, from
    /// `CudaTuning::quant_mma` to [`QM_MAX_ROWS`] rows, ahead of the tiles.
    fn mma_streams(&self, mmq: &str, rows: usize) -> Option<[&'static str; 3]> {
        let from = self.tune.quant_mma.load(std::sync::atomic::Ordering::Relaxed) as usize;
        let kernels = match mmq {
            "mmq_q4k" => ["mmqm_q4k", "mmqm_many_q4k", "mmqm_glu_q4k"],
            "mmq_q6k" => ["mmqm_q6k", "mmqm_many_q6k", "mmqm_glu_q6k"],
            _ => return None,
        };
        (from > 0 && (from..=QM_MAX_ROWS).contains(&rows) && self.gpu.cc.0 >= 8).then_some(kernels)
    }

    /// Whether the checkpoint matmul of `cw` adds into its output in its epilogue (the streaming and tensor-core
    /// kernels do; `matmul_quant` does not).
    pub(super) fn quant_adds(&self, cw: &CudaWeight) -> bool {
        self.checkpoint_rows(cw).is_some() && self.mmq_kernel(cw).is_some()
    }

    /// The block size the checkpoint matmul quantizes x to for `cw`, in this precision.
    pub(super) fn checkpoint_rows(&self, cw: &CudaWeight) -> Option<usize> {
        checkpoint_block(cw.dtype).filter(|_| self.precision == Precision::Checkpoint)
    }

    /// `x` (`rows × k` f32 at `xb`) quantized per `block` elements, as the reference's `quantize_row`.
    pub(super) fn quantize_rows(&self, xb: &Buf, rows: usize, k: usize, block: usize) -> QuantRows {
        let nblocks = k / block;
        let q = self.gpu.uninit(rows * k).unwrap_or_else(|e| panic!("{e}"));
        let d = self.alloc_f32(rows * nblocks);
        let sums = self.gpu.uninit(2 * rows * (k / sum_group(block))).unwrap_or_else(|e| panic!("{e}"));
        self.gpu
            .launch("quantize_rows")
            .pdl()
            .ptr(xb)
            .i32(k)
            .i32(block)
            .ptr(&q)
            .ptr(&d)
            .ptr(&sums)
            .go((nblocks as u32, rows as u32, 1), (32, 1, 1));
        QuantRows { q, d, sums, rows, k }
    }

    /// `out [rows, N] = x · wᵀ + bias` from x's quantized rows; with `add` (only where [`Self::quant_adds`])
    /// `out += x · wᵀ + bias` in the same launch, with `add`'s arithmetic.
    pub(super) fn quant_matmul(&self, qx: &QuantRows, cw: &CudaWeight, bias: Option<&Weight>, out: &Buf, add: bool) {
        let (rows, k, n) = (qx.rows, qx.k, cw.out_dim);
        assert_eq!(k, cw.in_dim, "quant_matmul: x width vs the weight's");
        assert!(!add || self.mmq_kernel(cw).is_some(), "quant_matmul: matmul_quant cannot add into its output");
        let (bias_ptr, bias_code) = bias_arg(bias, n);
        let bias_code = if add { bias_code | EPI_ADD } else { bias_code };
        let l = match self.mmq_kernel(cw) {
            Some(kernel) => {
                let tiles = self.tune.quant_tiles.load(std::sync::atomic::Ordering::Relaxed) as usize;
                let (kernel, (grid, blk)) = if let Some([mma, _, _]) = self.mma_streams(kernel, rows) {
                    let (kernel, grid, blk) = mmqm_launch(mma, rows, n);
                    (kernel, (grid, blk))
                } else if tiles > 0 && rows >= tiles && self.gpu.cc.0 >= 8 {
                    (tiles_kernel(kernel), mmqt_grid(rows, n))
                } else {
                    (kernel, mmq_grid(rows, n))
                };
                let l = self.gpu.launch(kernel).pdl().ptr(&qx.q).ptr(&qx.d).ptr(&qx.sums).i32(rows).i32(k);
                l.ptr(&cw.buf).i32(n).addr(bias_ptr).int(bias_code).ptr(out).go(grid, blk);
                return;
            }
            None => self.gpu.launch("matmul_quant"),
        };
        let (grid, blk) = matmul_quant_grid(rows, n);
        l.ptr(&qx.q)
            .ptr(&qx.d)
            .ptr(&qx.sums)
            .i32(rows)
            .i32(k)
            .ptr(&cw.buf)
            .int(cw.code)
            .i32(n)
            .addr(bias_ptr)
            .int(bias_code)
            .ptr(out)
            .go(grid, blk);
    }

    /// `matmul_many` of checkpoint-precision quantized weights that share a block size: x quantized once, then
    /// one matmul per weight (the same kernels and bits as one call each). None when the weights do not qualify.
    pub(super) fn quant_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Option<Vec<Tensor>> {
        let block = self.checkpoint_rows(weight(ws.first()?.0))?;
        let same = ws.iter().all(|(w, _)| {
            let c = weight(w);
            self.checkpoint_rows(c) == Some(block) && c.in_dim == x.cols && c.out_dim > 0
        });
        if !same || x.rows == 0 {
            return None;
        }
        let xs = self.input(x);
        let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let qx = self.quantize_rows(xb, x.rows, x.cols, block);
        if let Some(outs) = self.quant_many_launch(&qx, ws) {
            return Some(outs);
        }
        let outs = ws
            .iter()
            .map(|&(w, bias)| {
                let cw = weight(w);
                let out = self.alloc_f32(x.rows * cw.out_dim);
                self.quant_matmul(&qx, cw, bias, &out, false);
                self.tensor(x.rows, cw.out_dim, out)
            })
            .collect();
        Some(outs)
    }

    /// Whether `rows` rows against `cw` run on a streaming kernel (`mmq_*` or `mmqm_*`; not the tensor-core tiles or
    /// `matmul_quant`).
    fn streams(&self, cw: &CudaWeight, rows: usize) -> bool {
        let tiles = self.tune.quant_tiles.load(std::sync::atomic::Ordering::Relaxed) as usize;
        self.mmq_kernel(cw)
            .is_some_and(|k| self.mma_streams(k, rows).is_some() || !(tiles > 0 && rows >= tiles && self.gpu.cc.0 >= 8))
    }

    /// Two or three weights of one type on the streaming kernels as one launch of `mmq_many_<type>` (each output as
    /// `mmq_<type>`'s); None when they do not qualify.
    fn quant_many_launch(&self, qx: &QuantRows, ws: &[(&Weight, Option<&Weight>)]) -> Option<Vec<Tensor>> {
        let first = weight(ws.first()?.0);
        let kernel = match self.mmq_kernel(first)? {
            "mmq_q4_0" => "mmq_many_q4_0",
            "mmq_q4_1" => "mmq_many_q4_1",
            "mmq_q5_0" => "mmq_many_q5_0",
            "mmq_q8_0" => "mmq_many_q8_0",
            "mmq_q4k" => "mmq_many_q4k",
            "mmq_q6k" => "mmq_many_q6k",
            "mmq_q5_1" => "mmq_many_q5_1",
            "mmq_q5k" => "mmq_many_q5k",
            "mmq_q3k" => "mmq_many_q3k",
            "mmq_q2k" => "mmq_many_q2k",
            other => unreachable!("no mmq_many kernel for {other}"),
        };
        let fits = (2..=3).contains(&ws.len())
            && ws.iter().all(|(w, _)| weight(w).dtype == first.dtype && self.streams(weight(w), qx.rows));
        if !fits {
            return None;
        }
        let outs: Vec<Buf> = ws.iter().map(|(w, _)| self.alloc_f32(qx.rows * weight(w).out_dim)).collect();
        let columns: usize = ws.iter().map(|(w, _)| weight(w).out_dim).sum();
        let (kernel, grid, blk) = if let Some([_, many, _]) = self.mma_streams(self.mmq_kernel(first)?, qx.rows) {
            mmqm_launch(many, qx.rows, columns)
        } else {
            let blocks = ws.iter().map(|(w, _)| mmq_grid(qx.rows, weight(w).out_dim).0 .0).sum();
            let (grid, blk) = mmq_grid(qx.rows, 1);
            (kernel, (blocks, grid.1, 1), blk)
        };
        let mut l = self.gpu.launch(kernel).pdl().ptr(&qx.q).ptr(&qx.d).ptr(&qx.sums).i32(qx.rows).i32(qx.k);
        for (&(w, bias), out) in ws.iter().zip(&outs) {
            let cw = weight(w);
            let (bias_ptr, bias_code) = bias_arg(bias, cw.out_dim);
            l = l.ptr(&cw.buf).i32(cw.out_dim).addr(bias_ptr).int(bias_code).ptr(out);
        }
        if ws.len() == 2 {
            // No third weight: no columns, no blocks.
            l = l.addr(0).i32(0).addr(0).int(0).addr(0);
        }
        l.go(grid, blk);
        Some(ws.iter().zip(outs).map(|(&(w, _), out)| self.tensor(qx.rows, weight(w).out_dim, out)).collect())
    }

    /// `act(x · gateᵀ) * (x · upᵀ)` in one launch of `mmq_glu_<type>` when gate and up share a type on the streaming
    /// kernels (SiLU or GELU); None otherwise.
    pub(super) fn quant_glu(&self, x: &Tensor, gate: &Weight, up: &Weight, act: GluAct) -> Option<Tensor> {
        let (cg, cu) = (weight(gate), weight(up));
        let block = self.checkpoint_rows(cg)?;
        let kernel = match self.mmq_kernel(cg)? {
            "mmq_q4_0" => "mmq_glu_q4_0",
            "mmq_q4_1" => "mmq_glu_q4_1",
            "mmq_q5_0" => "mmq_glu_q5_0",
            "mmq_q8_0" => "mmq_glu_q8_0",
            "mmq_q4k" => "mmq_glu_q4k",
            "mmq_q6k" => "mmq_glu_q6k",
            "mmq_q5_1" => "mmq_glu_q5_1",
            "mmq_q5k" => "mmq_glu_q5k",
            "mmq_q3k" => "mmq_glu_q3k",
            "mmq_q2k" => "mmq_glu_q2k",
            other => unreachable!("no mmq_glu kernel for {other}"),
        };
        let fits = matches!(act, GluAct::Silu | GluAct::GeluTanh)
            && x.rows > 0
            && cu.dtype == cg.dtype
            && self.mmq_kernel(cu).is_some()
            && cg.out_dim == cu.out_dim
            && cg.out_dim > 0
            && cg.in_dim == x.cols
            && cu.in_dim == x.cols
            && self.streams(cg, x.rows);
        if !fits {
            return None;
        }
        let n = cg.out_dim;
        let xs = self.input(x);
        let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let qx = self.quantize_rows(xb, x.rows, x.cols, block);
        let out = self.alloc_f32(x.rows * n);
        let (kernel, grid, blk) = if let Some([_, _, glu]) = self.mma_streams(self.mmq_kernel(cg)?, x.rows) {
            mmqm_launch(glu, x.rows, n)
        } else {
            let (grid, blk) = mmq_grid(x.rows, n);
            (kernel, grid, blk)
        };
        let l = self.gpu.launch(kernel).pdl().ptr(&qx.q).ptr(&qx.d).ptr(&qx.sums).i32(x.rows).i32(x.cols);
        l.ptr(&cg.buf).ptr(&cu.buf).i32(n).int(act_code(act)).ptr(&out).go(grid, blk);
        Some(self.tensor(x.rows, n, out))
    }
}
