//! The CUDA backend's matmul paths: one weight (`matmul_impl`: checkpoint, tensor-core, interleaved, float and
//! any-type kernels), several weights against one row in one launch (`matmul_many_impl`), and gate/up with the
//! GLU in one launch (`matmul_glu_impl`). Kernels: kernels/matmul.cu, kernels/matmul_il.cu and kernels/mma.cu.

use super::tuning::{ALWAYS, NEVER};
use super::{act_code, bias_arg, cuda_kv, weight, CudaBackend, CudaTensor, CudaWeight};
use crate::device::{Buf, Launch};
use crate::geometry::{
    half_rows, matmul_float_grid, matmul_full_grid, matmul_il_grid, mma_launch, mma_many_launch, EPI_ADD,
    GLU_NORM_BELOW_K, IL_NORM_MAX_K, MMA_CHUNK, MMA_SMALL_ROWS, MMA_S_GLU_COLS, MMA_S_THREADS,
};
use crate::Arithmetic;
use std::sync::atomic::Ordering;
use tf_core::{
    norm_qkv_then_rope_kv_write, Backend, DType, GluAct, KvCache, Precision, RopeKv, RopeStyle, Tensor, Weight,
};
use tf_quant::reference::matmul::checkpoint_block;

impl CudaBackend {
    pub(super) fn matmul_impl(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Tensor {
        let cw = weight(w);
        let (rows, k, n) = (x.rows, cw.in_dim, cw.out_dim);
        assert_eq!(
            x.cols, k,
            "matmul: x is [{rows}, {}] but the weight {:?} ({}) expects {k}",
            x.cols, w.shape, w.dtype
        );
        let out = self.alloc_f32(rows * n);
        if rows > 0 && n > 0 {
            self.matmul_launch(x, cw, bias, &out, false);
        }
        self.tensor(rows, n, out)
    }

    /// Whether `x · wᵀ` runs on the tensor cores (kernels/mma.cu): the tensor arithmetic, BF16 or F16 weights, K
    /// a multiple of the chunk.
    fn mma_path(&self, cw: &CudaWeight) -> bool {
        self.arithmetic == Arithmetic::Tensor
            && matches!(cw.dtype, DType::F16 | DType::BF16)
            && cw.in_dim.is_multiple_of(MMA_CHUNK)
    }

    /// `out [rows, N] = x · wᵀ + bias`, or with `add` (only where [`Self::epi_add`]) `out += x · wᵀ + bias` in
    /// the same launch; at least one row and one column.
    fn matmul_launch(&self, x: &Tensor, cw: &CudaWeight, bias: Option<&Weight>, out: &Buf, add: bool) {
        let (rows, k, n) = (x.rows, cw.in_dim, cw.out_dim);
        let (bias_ptr, bias_code) = bias_arg(bias, n);
        let xs = self.input(x);
        let xt = xs.downcast_ref::<CudaTensor>().expect("cuda tensor");
        let xb = &xt.buf;
        // The `_h` tensor-core kernels take x's half copy last.
        let mut xh = None;
        let (kernel, grid, blk, pdl, code) = match self.checkpoint_rows(cw) {
            Some(block) => {
                // x quantized per block, then the streaming kernel of the type or matmul_quant (quant.rs).
                let qx = self.quantize_rows(xb, rows, k, block);
                return self.quant_matmul(&qx, cw, bias, out, add);
            }
            None if self.mma_path(cw) => {
                // Tensor cores (kernels/mma.cu); the kernel only groups outputs by row count, never changes
                // their arithmetic. The small kernels request their first weights before waiting on the previous
                // kernel.
                let h = Self::half_arg(xt, cw.dtype);
                let (kernel, grid, blk) = mma_launch(rows, n, cw.dtype == DType::F16, h != 0);
                if kernel.ends_with("_h") {
                    xh = Some(h);
                }
                (kernel, grid, blk, rows <= MMA_SMALL_ROWS, None)
            }
            None if cw.interleaved => {
                // One row: the one-row kernel (which requests its first weights before waiting on the previous
                // kernel); else matmul_float's row groups reading the interleaved places. The same fma sequence
                // per output either way (kernels/matmul_il.cu).
                let kernel = match (cw.dtype, rows) {
                    (DType::F32, 1) => "matmul_f32w_il1",
                    (DType::F32, _) => "matmul_f32w_ilg",
                    (DType::F16, 1) => "matmul_f16w_il1",
                    (DType::F16, _) => "matmul_f16w_ilg",
                    (_, 1) => "matmul_bf16w_il1",
                    _ => "matmul_bf16w_ilg",
                };
                let (grid, blk) = match rows {
                    1 => matmul_il_grid(rows, n, self.tune.il1_cols(n)),
                    _ => matmul_float_grid(rows, n),
                };
                (kernel, grid, blk, rows == 1, None)
            }
            None if matches!(cw.dtype, DType::F32 | DType::F16 | DType::BF16) => {
                let kernel = match cw.dtype {
                    DType::F32 => "matmul_f32w",
                    DType::F16 => "matmul_f16w",
                    _ => "matmul_bf16w",
                };
                let (grid, blk) = matmul_float_grid(rows, n);
                (kernel, grid, blk, false, None)
            }
            None => {
                // Any type: the dtype tag follows the weight.
                let (grid, blk) = matmul_full_grid(rows, n);
                ("matmul_full", grid, blk, false, Some(cw.code))
            }
        };
        // Every kernel above takes (x, R, K, w, [dtype,] N, bias, bias type, y); the mma and matmul_float kernels
        // read EPI_ADD in the bias type as "add into y".
        let epi = kernel.starts_with("mma_") || kernel.ends_with('w') || kernel.ends_with("_ilg");
        assert!(!add || epi, "matmul_launch: {kernel} cannot add into its output");
        let bias_code = if add { bias_code | EPI_ADD } else { bias_code };
        let launch = self.gpu.launch(kernel);
        let launch = if pdl { launch.pdl() } else { launch };
        let launch = launch.ptr(xb).i32(rows).i32(k).ptr(&cw.buf);
        let launch = match code {
            Some(c) => launch.int(c),
            None => launch,
        };
        let launch = launch.i32(n).addr(bias_ptr).int(bias_code).ptr(out);
        match xh {
            Some(h) => launch.addr(h).go(grid, blk),
            None => launch.go(grid, blk),
        }
    }

    /// Whether `x` against weights `ws` runs on the small tensor-core kernels: the tensor arithmetic, up to
    /// [`MMA_SMALL_ROWS`] rows, BF16 or F16 weights of one type whose K (= x.cols) is a multiple of the chunk.
    fn mma_small(&self, x: &Tensor, ws: &[&Weight]) -> bool {
        let Some(first) = ws.first().map(|w| weight(w)) else { return false };
        self.arithmetic == Arithmetic::Tensor
            && (1..=MMA_SMALL_ROWS).contains(&x.rows)
            && matches!(first.dtype, DType::F16 | DType::BF16)
            && x.cols.is_multiple_of(MMA_CHUNK)
            && ws.iter().all(|w| {
                let c = weight(w);
                c.dtype == first.dtype && c.in_dim == x.cols && c.out_dim > 0 && !c.interleaved
            })
    }

    /// `acc += x · wᵀ + b`: one row against an interleaved float weight in one launch of `_il1_add` (the one-row
    /// kernel adding its outputs to `acc`); anything else: [`Self::matmul_impl`], then `add`.
    pub(super) fn matmul_add_impl(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, acc: &mut Tensor) {
        let cw = weight(w);
        let n = cw.out_dim;
        assert!(acc.rows == x.rows && acc.cols == n, "matmul_add: {acc:?} += {x:?} · {:?}ᵀ", w.shape);
        let one_row_il = x.rows == 1 && self.one_row_il(x, cw) && n > 0;
        if !one_row_il && x.rows > 0 && n > 0 && self.epi_add(x, cw) {
            // The tensor-core kernels and matmul_float's row groups add into acc in their epilogue (one launch,
            // add's arithmetic).
            assert_eq!(x.cols, cw.in_dim, "matmul_add: {x:?} · {:?}ᵀ", w.shape);
            let at = self.make_unique(acc);
            return self.matmul_launch(x, cw, bias, &at.buf, true);
        }
        if !one_row_il {
            let y = self.matmul_impl(x, w, bias);
            return self.add(acc, &y);
        }
        let (kernel, deep) = match cw.dtype {
            DType::F32 => ("matmul_f32w_il1_add", "matmul_f32w_il1_add_d"),
            DType::F16 => ("matmul_f16w_il1_add", "matmul_f16w_il1_add_d"),
            _ => ("matmul_bf16w_il1_add", "matmul_bf16w_il1_add_d"),
        };
        let (bias_ptr, bias_code) = bias_arg(bias, n);
        let xs = self.input(x);
        let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let at = self.make_unique(acc);
        let (grid, blk) = matmul_il_grid(1, n, self.tune.il1_cols(n));
        // Few columns leave each lane a long chain of dependent batches: the deeper kernel where its grid still fits
        // the GPU at once (its 212 registers hold 8 warps per SM).
        let kernel = match self.tune.add_deep.load(Ordering::Relaxed) {
            NEVER => kernel,
            ALWAYS => deep,
            _ if grid.0 <= self.gpu.resident_blocks(deep, blk.0) => deep,
            _ => kernel,
        };
        // (x, R, K, w, N, bias, bias type, y) as `_il1`; y is the residual row, read then written.
        self.gpu
            .launch(kernel)
            .pdl()
            .ptr(xb)
            .i32(1)
            .i32(x.cols)
            .ptr(&cw.buf)
            .i32(n)
            .addr(bias_ptr)
            .int(bias_code)
            .ptr(&at.buf)
            .go(grid, blk);
    }

    /// Whether [`Self::matmul_launch`] of `x` against `cw` picks a kernel that can add into its output (`EPI_ADD`):
    /// a tensor-core kernel, `matmul_float`'s row groups (float weights, unless one row of an interleaved weight:
    /// `_il1`), or a checkpoint matmul on the streaming or tensor-core quantized kernels (not `matmul_quant`).
    fn epi_add(&self, x: &Tensor, cw: &CudaWeight) -> bool {
        let quant = self.precision == Precision::Checkpoint && checkpoint_block(cw.dtype).is_some();
        if quant {
            return self.quant_adds(cw);
        }
        let float = matches!(cw.dtype, DType::F32 | DType::F16 | DType::BF16) && !(x.rows == 1 && cw.interleaved);
        self.mma_path(cw) || float
    }

    /// Whether `x`'s rows against `cw` can run on the interleaved one-row kernels: an interleaved weight (the
    /// portable arithmetic) of x's width. Every one-row kernel takes its block width from `Knobs::il1_cols`.
    fn one_row_il(&self, x: &Tensor, cw: &CudaWeight) -> bool {
        cw.interleaved && cw.in_dim == x.cols
    }

    /// [`Self::matmul_many_impl`] of the RMSNorm of `x` (`norm [cols]`, eps): one row with the weights on the
    /// one-row kernels (`_il1_many_norm`, every block norming the row into shared memory first) and at most
    /// [`IL_NORM_MAX_K`] wide: one launch; anything else: `rms_norm`, then matmul_many.
    pub(super) fn norm_matmul_many_impl(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        ws: &[(&Weight, Option<&Weight>)],
    ) -> Vec<Tensor> {
        if self.tune.norm_fuse.load(Ordering::Relaxed) & 1 != 0
            && self.many_il1(x, ws)
            && Self::norm_in_prologue(x, norm)
        {
            return self.many_il1_launch(x, ws, Some((norm, eps)));
        }
        let h = self.rms_norm(x, norm, x.cols, eps);
        self.matmul_many_impl(&h, ws)
    }

    /// [`Backend::norm_qkv_rope_kv_write`]: one row with q/k/v on the one-row kernels and the whole head rotated:
    /// `rms_norm`, then one launch of `_il1_qkv_rope` (the projections rotate q and k and write k and v into the
    /// cache in their epilogue, with `rope_kv_write`'s arithmetic). Anything else, q/k/v norming their own row
    /// (`CudaTuning::norm_fuse` bit 0) or `CudaTuning::qkv_rope` off: the projections, then `rope_kv_write`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_qkv_rope_impl(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        ws: &[(&Weight, Option<&Weight>); 3],
        kv: &mut KvCache,
        layer: usize,
        at: &RopeKv,
    ) -> [Tensor; 3] {
        let (hd, rope) = (at.head_dim, at.rope);
        let cols = self.tune.il1_cols(weight(ws[0].0).out_dim);
        let (nq, nk, nv) = (weight(ws[0].0).out_dim, weight(ws[1].0).out_dim, weight(ws[2].0).out_dim);
        let fused = !self.tune.no_qkv_rope.load(Ordering::Relaxed)
            && self.tune.norm_fuse.load(Ordering::Relaxed) & 1 == 0
            && self.many_il1(x, ws)
            && hd > 0
            && hd.is_multiple_of(2)
            && rope.rot_dims == hd
            && nq.is_multiple_of(hd)
            && nk.is_multiple_of(hd)
            && nk == nv
            && cols.is_multiple_of(2)
            && at.positions.len() == 1
            && at.slots.len() == 1;
        if !fused {
            return norm_qkv_then_rope_kv_write(self, x, norm, eps, ws, kv, layer, at);
        }
        let store = cuda_kv(kv);
        assert!(layer < store.spec.layers, "norm_qkv_rope_kv_write: layer {layer} of {}", store.spec.layers);
        assert_eq!(nk, store.width(), "norm_qkv_rope_kv_write: k/v width vs the cache's");
        let slot = at.slots[0] as usize;
        assert!(slot < store.slots(), "norm_qkv_rope_kv_write: slot {slot} outside the pool of {}", store.slots());
        let off = (layer * store.layer_len() * 4) as u64;
        let (kptr, vptr) = (store.k.ptr + off, store.v.ptr + off);
        let tables = self.rope_tables(at.positions, rope);
        let sb = self.slots_buf(at.slots);
        let h = self.rms_norm(x, norm, x.cols, eps);
        let (kernel, wide) = match weight(ws[0].0).dtype {
            DType::F32 => ("matmul_f32w_il1_qkv_rope", "matmul_f32w_il1_qkv_rope_w"),
            DType::F16 => ("matmul_f16w_il1_qkv_rope", "matmul_f16w_il1_qkv_rope_w"),
            _ => ("matmul_bf16w_il1_qkv_rope", "matmul_bf16w_il1_qkv_rope_w"),
        };
        let neox = i32::from(rope.style == RopeStyle::Neox);
        // The arguments of `_il1_many`, then head_dim, half, cos, sin, neox, the layer's K and V, slots.
        let blocks = |n| matmul_il_grid(1, n, cols).0 .0;
        // The default's blocks are each one dependent chain of weight batches: a grid the GPU cannot hold at once
        // ends a whole chain after the first blocks do. The shallower kernel holds more of them.
        let kernel = match self.tune.qkv_wide.load(Ordering::Relaxed) {
            NEVER => kernel,
            ALWAYS => wide,
            _ if blocks(nq) + blocks(nk) + blocks(nv) > self.gpu.resident_blocks(kernel, 16 * cols) => wide,
            _ => kernel,
        };
        let outs = self.launch_many(kernel, &h, false, ws, blocks, 16 * cols, None, |l| {
            l.i32(hd).i32(hd / 2).ptr(&tables.0).ptr(&tables.1).int(neox).addr(kptr).addr(vptr).ptr(&sb)
        });
        self.kv_written(store, at.slots);
        outs.try_into().expect("one result per weight")
    }

    /// Whether the one-row kernels can norm `x` themselves: at most [`IL_NORM_MAX_K`] wide and a multiple of 4,
    /// the norm weight a plain F32, F16 or BF16 vector of that length (read four elements at a time).
    fn norm_in_prologue(x: &Tensor, norm: &Weight) -> bool {
        let cn = weight(norm);
        x.cols <= IL_NORM_MAX_K
            && x.cols.is_multiple_of(4)
            && cn.out_dim * cn.in_dim == x.cols
            && matches!(cn.dtype, DType::F32 | DType::F16 | DType::BF16)
            && !cn.interleaved
    }

    /// Whether one row against `ws` runs as one launch of `_il1_many`: two or three interleaved float weights of
    /// one type and K.
    fn many_il1(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> bool {
        let first = ws.first().map(|(w, _)| weight(w));
        x.rows == 1
            && (2..=3).contains(&ws.len())
            && first.is_some_and(|f| {
                self.one_row_il(x, f)
                    && ws.iter().all(|(w, _)| {
                        let c = weight(w);
                        c.interleaved && c.dtype == f.dtype && c.in_dim == f.in_dim && c.out_dim > 0
                    })
            })
    }

    /// One launch of `_il1_many` (or `_il1_many_norm` with a norm) for [`Self::many_il1`]'s case.
    fn many_il1_launch(
        &self,
        x: &Tensor,
        ws: &[(&Weight, Option<&Weight>)],
        norm: Option<(&Weight, f32)>,
    ) -> Vec<Tensor> {
        let first = weight(ws[0].0);
        let kernel = match (first.dtype, norm.is_some()) {
            (DType::F32, false) => "matmul_f32w_il1_many",
            (DType::F16, false) => "matmul_f16w_il1_many",
            (_, false) => "matmul_bf16w_il1_many",
            (DType::F32, true) => "matmul_f32w_il1_many_norm",
            (DType::F16, true) => "matmul_f16w_il1_many_norm",
            (_, true) => "matmul_bf16w_il1_many_norm",
        };
        let cols = self.tune.il1_cols(first.out_dim); // one block width for every weight of the launch
        self.launch_many(kernel, x, false, ws, |n| matmul_il_grid(1, n, cols).0 .0, 16 * cols, norm, |l| l)
    }

    pub(super) fn matmul_many_impl(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        if (2..=3).contains(&ws.len()) && self.mma_small(x, &ws.iter().map(|(w, _)| *w).collect::<Vec<_>>()) {
            return self.mma_many(x, ws);
        }
        // One row against two or three interleaved float weights of one type (q/k/v, gate/up in decode): one launch
        // of `_il1_many`, each block running `_il1` for its weight (kernels/matmul_il.cu). Anything else: one call
        // each.
        if self.many_il1(x, ws) {
            return self.many_il1_launch(x, ws, None);
        }
        // Quantized weights of one block size in checkpoint precision: x quantized once for all of them.
        if let Some(outs) = self.quant_many(x, ws) {
            return outs;
        }
        ws.iter().map(|&(w, b)| self.matmul_impl(x, w, b)).collect()
    }

    /// Up to three weights against the same up to 16 rows on the tensor cores in one launch (`mma_*_s_many`, or
    /// `mma_*_sw_many` for windows): each block runs the one-weight kernel's code for its weight (the arithmetic of
    /// every `mma_*` kernel).
    fn mma_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        let dtype = weight(ws[0].0).dtype;
        let h = x.device.as_ref().and_then(|s| s.downcast_ref::<CudaTensor>()).map_or(0, |t| Self::half_arg(t, dtype));
        let (kernel, cols, threads) = mma_many_launch(x.rows, dtype == DType::F16, h != 0);
        self.launch_many(kernel, x, true, ws, |n| n.div_ceil(cols) as u32, threads, None, |l| l)
    }

    /// One launch of a `_many` kernel (launched with programmatic dependence) for two or three weights against
    /// `x`: arguments (x, [R if `pass_rows`,] K, nb0, nb1, then (w, N, bias, bias type, y) per weight, an absent
    /// third one with no blocks[, x's half copy for an `_h` kernel][, the norm weight, its tag and eps for a `_norm`
    /// kernel]); `blocks(N)` blocks of `threads` for each weight, side by side.
    #[allow(clippy::too_many_arguments)]
    fn launch_many(
        &self,
        kernel: &'static str,
        x: &Tensor,
        pass_rows: bool,
        ws: &[(&Weight, Option<&Weight>)],
        blocks_of: impl Fn(usize) -> u32,
        threads: u32,
        norm: Option<(&Weight, f32)>,
        tail: impl for<'l> FnOnce(Launch<'l>) -> Launch<'l>,
    ) -> Vec<Tensor> {
        let xs = self.input(x);
        let xt = xs.downcast_ref::<CudaTensor>().expect("cuda tensor");
        let xb = &xt.buf;
        let mut outs = Vec::with_capacity(ws.len());
        let mut args = Vec::with_capacity(3);
        let mut blocks = Vec::with_capacity(3);
        for &(w, bias) in ws {
            let cw = weight(w);
            let n = cw.out_dim;
            let (bias_ptr, bias_code) = bias_arg(bias, n);
            let out = self.alloc_f32(x.rows * n);
            args.push((cw.buf.ptr, n, bias_ptr, bias_code, out.ptr));
            blocks.push(blocks_of(n));
            outs.push((n, out));
        }
        while args.len() < 3 {
            // An absent third weight: no blocks, never read.
            args.push((0, 0, 0, 0, 0));
            blocks.push(0);
        }
        let l = self.gpu.launch(kernel).pdl().ptr(xb);
        let l = if pass_rows { l.i32(x.rows) } else { l };
        let mut l = l.i32(x.cols).int(blocks[0] as i32).int(blocks[1] as i32);
        for &(w, n, b, bdt, y) in &args {
            l = l.addr(w).i32(n).addr(b).int(bdt).addr(y);
        }
        if kernel.ends_with("_h") {
            l = l.addr(Self::half_arg(xt, weight(ws[0].0).dtype));
        }
        let total: u32 = blocks.iter().sum();
        let mut grid = total;
        if let Some((nw, eps)) = norm {
            // Each block norms the row once, then loops over the blocks' work (all of it resident at once).
            let cn = weight(nw);
            assert_eq!(cn.out_dim * cn.in_dim, x.cols, "norm_matmul_many: norm weight length");
            l = l.ptr(&cn.buf).int(cn.tag()).f32(eps).int(total as i32);
            grid = total.min(self.gpu.resident_blocks(kernel, threads));
        }
        tail(l).go((grid, 1, 1), (threads, 1, 1));
        outs.into_iter().map(|(n, out)| self.tensor(x.rows, n, out)).collect()
    }

    /// [`Self::matmul_glu_impl`] of the RMSNorm of `x` (`norm [cols]`, eps): on the one-row GLU kernel
    /// (`_il1_glu_norm`, every block norming the row into shared memory first) when x is narrower than
    /// [`GLU_NORM_BELOW_K`]; anything else: `rms_norm`, then matmul_glu.
    pub(super) fn norm_matmul_glu_impl(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        gate: &Weight,
        up: &Weight,
        act: GluAct,
    ) -> Tensor {
        if self.tune.norm_fuse.load(Ordering::Relaxed) & 2 != 0
            && self.glu_il1(x, gate, up)
            && x.cols < GLU_NORM_BELOW_K
            && Self::norm_in_prologue(x, norm)
        {
            return self.glu_il1_launch(x, gate, up, act, Some((norm, eps)));
        }
        let h = self.rms_norm(x, norm, x.cols, eps);
        self.matmul_glu_impl(&h, gate, up, act)
    }

    /// Whether one row against gate and up runs on `_il1_glu`: interleaved, of one type, x's width and the same
    /// column count.
    fn glu_il1(&self, x: &Tensor, gate: &Weight, up: &Weight) -> bool {
        let (cg, cu) = (weight(gate), weight(up));
        x.rows == 1
            && self.one_row_il(x, cg)
            && self.one_row_il(x, cu)
            && cg.dtype == cu.dtype
            && cg.out_dim == cu.out_dim
            && cg.out_dim > 0
    }

    pub(super) fn matmul_glu_impl(&self, x: &Tensor, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        if self.mma_small(x, &[gate, up]) && weight(gate).out_dim == weight(up).out_dim {
            // Gate and up of the same columns in one block, then the GLU (kernels/mma.cu, `_s_glu`).
            // The output feeds the down-projection: a window's gets a half copy.
            let n = weight(gate).out_dim;
            let out = self.alloc_f32(x.rows * n);
            let half = self.half_out(x.rows, n).filter(|h| h.1 == (weight(gate).dtype == DType::F16));
            let xs = self.input(x);
            let xt = xs.downcast_ref::<CudaTensor>().expect("cuda tensor");
            let xh = Self::half_arg(xt, weight(gate).dtype);
            let kernel = match (weight(gate).dtype == DType::F16, xh != 0 && half_rows(x.rows)) {
                (true, true) => "mma_f16_s_glu_h",
                (true, false) => "mma_f16_s_glu",
                (false, true) => "mma_bf16_s_glu_h",
                (false, false) => "mma_bf16_s_glu",
            };
            let l = self
                .gpu
                .launch(kernel)
                .pdl()
                .ptr(&xt.buf)
                .i32(x.rows)
                .i32(x.cols)
                .ptr(&weight(gate).buf)
                .ptr(&weight(up).buf)
                .i32(n)
                .int(act_code(act))
                .ptr(&out)
                .addr(half.as_ref().map_or(0, |h| h.0.ptr));
            let l = if kernel.ends_with("_h") { l.addr(xh) } else { l };
            l.go((n.div_ceil(MMA_S_GLU_COLS) as u32, 1, 1), (MMA_S_THREADS, 1, 1));
            return self.tensor_half(x.rows, n, out, half);
        }
        // Quantized gate and up of one type on the streaming kernels: one launch computing both and the GLU
        // (kernels/matmul_q.cu, `mmq_glu_*`).
        if let Some(out) = self.quant_glu(x, gate, up, act) {
            return out;
        }
        // One row against interleaved gate and up of one type: one launch computing both and the GLU
        // (kernels/matmul_il.cu, `_il1_glu`); anything else: matmul_many, then glu.
        if !self.glu_il1(x, gate, up) {
            let [g, u]: [Tensor; 2] =
                self.matmul_many(x, &[(gate, None), (up, None)]).try_into().expect("one result per weight");
            return self.glu(&g, &u, act);
        }
        self.glu_il1_launch(x, gate, up, act, None)
    }

    /// One launch of `_il1_glu` (or `_il1_glu_norm` with a norm) for [`Self::glu_il1`]'s case.
    fn glu_il1_launch(
        &self,
        x: &Tensor,
        gate: &Weight,
        up: &Weight,
        act: GluAct,
        norm: Option<(&Weight, f32)>,
    ) -> Tensor {
        let (cg, cu) = (weight(gate), weight(up));
        let n = cg.out_dim;
        let out = self.alloc_f32(n);
        let xs = self.input(x);
        let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        let kernel = match (cg.dtype, norm.is_some()) {
            (DType::F32, false) => "matmul_f32w_il1_glu",
            (DType::F16, false) => "matmul_f16w_il1_glu",
            (_, false) => "matmul_bf16w_il1_glu",
            (DType::F32, true) => "matmul_f32w_il1_glu_norm",
            (DType::F16, true) => "matmul_f16w_il1_glu_norm",
            (_, true) => "matmul_bf16w_il1_glu_norm",
        };
        let cols = self.tune.il1_cols(n);
        let l = self
            .gpu
            .launch(kernel)
            .pdl()
            .ptr(xb)
            .i32(x.cols)
            .ptr(&cg.buf)
            .ptr(&cu.buf)
            .i32(n)
            .int(act_code(act))
            .ptr(&out);
        let blocks = n.div_ceil(cols as usize) as u32;
        match norm {
            Some((nw, eps)) => {
                // Each block norms the row once, then loops over the column groups (all of it resident at once).
                let cn = weight(nw);
                assert_eq!(cn.out_dim * cn.in_dim, x.cols, "norm_matmul_glu: norm weight length");
                let grid = blocks.min(self.gpu.resident_blocks(kernel, 32 * cols));
                l.ptr(&cn.buf).int(cn.tag()).f32(eps).go((grid, 1, 1), (32 * cols, 1, 1));
            }
            None => l.go((blocks, 1, 1), (32 * cols, 1, 1)),
        }
        self.tensor(1, n, out)
    }
}
