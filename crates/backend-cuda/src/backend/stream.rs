//! The GLU's output streamed to the down projection (`TF_CUDA_STREAM_DOWN=1`, a measurement knob; kernels/matmul_il.cu,
//! `seg_signal` / `seg_wait`): one row's GLU counts its outputs per segment of 128 and releases a flag per completed
//! segment; the down projection's `_il1_add` reading that row skips `griddepcontrol.wait` and acquires each batch's
//! segments before reading them, so it starts while the GLU's last blocks still run. Eager launches only (a graph
//! replays fixed epochs), and only when down's weight is 16-bit (one batch vector's block is one segment).

use super::CudaBackend;
use crate::device::Buf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tf_core::{DType, Storage, Tensor};

/// Segments of 128 outputs the counters cover (`SEG_MAX` in kernels/matmul_il.cu).
const SEG_MAX: usize = 1024;

#[derive(Default)]
pub(super) struct StreamDown {
    /// `TF_CUDA_STREAM_DOWN=1` ([`CudaBackend::set_stream_down`]).
    on: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// [2 · SEG_MAX] u32: the counts, then the flags (zeroed once).
    seg: Option<Buf>,
    /// The number of the last streamed GLU launch (flags hold the epoch that completed them).
    epoch: u32,
    /// The last streamed GLU output (held, so no other tensor can take its buffer) and its epoch.
    last: Option<(Storage, u32)>,
}

impl StreamDown {
    pub fn from_env() -> StreamDown {
        let on = std::env::var("TF_CUDA_STREAM_DOWN").is_ok_and(|v| v == "1");
        StreamDown { on: AtomicBool::new(on), ..Default::default() }
    }
}

impl CudaBackend {
    /// Whether later one-row GLU launches stream their output to the down projection that reads it (for tests and
    /// measurements; the same bits either way).
    #[doc(hidden)]
    pub fn set_stream_down(&self, on: bool) {
        self.stream_down.on.store(on, Ordering::Relaxed);
    }

    /// Before a one-row GLU launch of `n` outputs: the segment buffer's address and the launch's epoch when the
    /// GLU streams its output (else 0, 0).
    pub(super) fn stream_glu_begin(&self, n: usize) -> (u64, u32) {
        if !self.stream_down.on.load(Ordering::Relaxed) || !self.gpu.eager() || n.div_ceil(128) > SEG_MAX {
            return (0, 0);
        }
        let mut st = self.stream_down.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.seg.is_none() {
            st.seg = Some(self.gpu.zeros(2 * SEG_MAX * 4).unwrap_or_else(|e| panic!("{e}")));
        }
        st.epoch = st.epoch.wrapping_add(1).max(1);
        st.last = None;
        (st.seg.as_ref().map_or(0, |b| b.ptr), st.epoch)
    }

    /// After it: the GLU's output tensor, which a down projection may then read streamed.
    pub(super) fn stream_glu_end(&self, out: &Tensor, epoch: u32) {
        if epoch != 0 {
            let mut st = self.stream_down.state.lock().unwrap_or_else(|e| e.into_inner());
            st.last = out.device.clone().map(|d| (d, epoch));
        }
    }

    /// For a one-row `matmul_add` of `x` against a `dtype` weight: the segment buffer and epoch when x is the last
    /// streamed GLU output and the weight is 16-bit (else 0, 0: the kernel waits on the previous one as usual).
    pub(super) fn stream_down_take(&self, x: &Tensor, dtype: DType) -> (u64, u32) {
        if !self.stream_down.on.load(Ordering::Relaxed)
            || !matches!(dtype, DType::BF16 | DType::F16)
            || !self.gpu.eager()
        {
            return (0, 0);
        }
        let mut st = self.stream_down.state.lock().unwrap_or_else(|e| e.into_inner());
        match (&st.last, &x.device) {
            (Some((held, epoch)), Some(d)) if Arc::ptr_eq(held, d) => {
                let epoch = *epoch;
                st.last = None;
                (st.seg.as_ref().map_or(0, |b| b.ptr), epoch)
            }
            _ => (0, 0),
        }
    }
}
