//! Half copies of window activations (the tensor arithmetic, 8..=16 rows): the kernel that produces an activation
//! a tensor-core matmul will read (RMSNorm, the gate/up + GLU kernel) also writes it rounded to the weights' half
//! type (`round_half` in kernels/common.cu: the same cvt.rn the matmul applies to f32 activations), and the `_h`
//! tensor-core kernels read those 2 bytes per element instead of 4 (kernels/mma.cu, `XH`). The bits cannot move:
//! rounding once in the producer or in the consumer is the same rounding (tests/tensor.rs compares both).

use super::{CudaBackend, CudaTensor};
use crate::device::Buf;
use crate::geometry::half_rows;
use crate::Arithmetic;
use std::sync::atomic::Ordering;
use tf_core::DType;

/// No tensor-arithmetic matrix uploaded yet / all BF16 / all F16 / both (then no copies are made).
pub(super) const HALF_NONE: u8 = 0;
const HALF_BF16: u8 = 1;
const HALF_F16: u8 = 2;
const HALF_MIXED: u8 = 3;

impl CudaBackend {
    /// Records the type of an uploaded matrix: copies are made in the half type of every BF16/F16 matrix the
    /// tensor arithmetic multiplies, and not at all when there are both.
    pub(super) fn note_matrix_type(&self, dtype: DType, dims: usize) {
        let kind = match dtype {
            DType::BF16 => HALF_BF16,
            DType::F16 => HALF_F16,
            _ => return,
        };
        if self.arithmetic != Arithmetic::Tensor || dims < 2 {
            return;
        }
        let _ = self.half_kind.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
            Some(if cur == HALF_NONE || cur == kind { kind } else { HALF_MIXED })
        });
    }

    /// A half copy for an activation of `rows × cols` that the `_h` tensor-core kernels will read (a window of
    /// [`half_rows`] rows in the tensor arithmetic): `(buffer, f16)`.
    pub(super) fn half_out(&self, rows: usize, cols: usize) -> Option<(Buf, bool)> {
        if self.arithmetic != Arithmetic::Tensor || !half_rows(rows) || cols == 0 {
            return None;
        }
        let f16 = match self.half_kind.load(Ordering::Relaxed) {
            HALF_BF16 => false,
            HALF_F16 => true,
            _ => return None,
        };
        Some((self.gpu.uninit(2 * rows * cols).unwrap_or_else(|e| panic!("{e}")), f16))
    }

    /// The address of `x`'s half copy when it is in the type of weights `dtype` (a kernel's `xh`), else 0.
    pub(super) fn half_arg(x: &CudaTensor, dtype: DType) -> u64 {
        match &x.half {
            Some((buf, f16)) if *f16 == (dtype == DType::F16) && matches!(dtype, DType::F16 | DType::BF16) => buf.ptr,
            _ => 0,
        }
    }
}
