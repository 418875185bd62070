//! Checkpoint-precision matmuls of quantized weights: the rows are quantized once per input (`quantize_rows`, shared
//! by every weight of a `matmul_many`), then Q8_0, Q4_K and Q6_K weights take the streaming kernels of
//! kernels/matmul_q.cu (`mmq_*`: each weight row read once per group of [`QD_ROWS`] rows) and the other types
//! `matmul_quant`. Every kernel here gives the reference's bits (docs/arithmetic.md), whatever the row count.

use super::{bias_arg, weight, CudaBackend, CudaTensor, CudaWeight};
use crate::device::Buf;
use crate::geometry::{matmul_quant_grid, mmq_grid};
use tf_core::{DType, Precision, Tensor, Weight};
use tf_quant::reference::matmul::{checkpoint_block, sum_group};

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
    /// Q5_0, Q8_0, Q4_K or Q6_K rows in the file's block order (the kernels read 16-byte pieces from a 16-byte aligned start).
    fn mmq_kernel(&self, cw: &CudaWeight) -> Option<&'static str> {
        let kernel = match cw.dtype {
            DType::Q4_0 => "mmq_q4_0",
            DType::Q4_1 => "mmq_q4_1",
            DType::Q5_0 => "mmq_q5_0",
            DType::Q8_0 => "mmq_q8_0",
            DType::Q4K => "mmq_q4k",
            DType::Q6K => "mmq_q6k",
            _ => return None,
        };
        let on = !self.tune.no_quant_stream.load(std::sync::atomic::Ordering::Relaxed);
        (on && !cw.interleaved && cw.buf.ptr.is_multiple_of(16)).then_some(kernel)
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

    /// `out [rows, N] = x · wᵀ + bias` from x's quantized rows.
    pub(super) fn quant_matmul(&self, qx: &QuantRows, cw: &CudaWeight, bias: Option<&Weight>, out: &Buf) {
        let (rows, k, n) = (qx.rows, qx.k, cw.out_dim);
        assert_eq!(k, cw.in_dim, "quant_matmul: x width vs the weight's");
        let (bias_ptr, bias_code) = bias_arg(bias, n);
        let l = match self.mmq_kernel(cw) {
            Some(kernel) => {
                let (grid, blk) = mmq_grid(rows, n);
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
        let outs = ws
            .iter()
            .map(|&(w, bias)| {
                let cw = weight(w);
                let out = self.alloc_f32(x.rows * cw.out_dim);
                self.quant_matmul(&qx, cw, bias, &out);
                self.tensor(x.rows, cw.out_dim, out)
            })
            .collect();
        Some(outs)
    }
}
