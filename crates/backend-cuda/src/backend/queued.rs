//! The argmax and the embedding of queued ids (src/host_ids.rs): `Backend::argmax_rows`, `argmax_rows_queued`,
//! `embed_queued` and `take_ids` on CUDA.

use super::{weight, CudaBackend, CudaTensor};
use crate::device::Buf;
use crate::host_ids::{self, Queued};
use std::sync::Arc;
use tf_core::{QueuedIds, Tensor, Weight};

impl CudaBackend {
    /// `argmax_rows` (kernels/ops.cu) of `x`'s rows into `[R, slices]` u64 keys, one per slice of 2,048 columns
    /// (each the slice's best (value, id) as an ordered key); returns them and `slices`.
    fn argmax_keys(&self, x: &Tensor) -> (Buf, usize) {
        let xs = self.input(x);
        let xb = &xs.downcast_ref::<CudaTensor>().expect("cuda tensor").buf;
        // 256 threads (whole warps, no more than the row needs), 8 columns each per slice.
        let threads = x.cols.next_multiple_of(32).min(256) as u32;
        let per = 8 * threads as usize;
        let slices = x.cols.div_ceil(per);
        // Every slice writes its key: no zeroing.
        let keys = self.gpu.uninit(8 * x.rows * slices).unwrap_or_else(|e| panic!("{e}"));
        self.gpu
            .launch("argmax_rows")
            .pdl()
            .ptr(xb)
            .i32(x.cols)
            .i32(per)
            .ptr(&keys)
            .go((slices as u32, x.rows as u32, 1), (threads, 1, 1));
        (keys, slices)
    }

    /// `R × slices` keys downloaded instead of `R × cols` floats.
    pub(super) fn argmax_rows_impl(&self, x: &Tensor) -> Vec<u32> {
        if x.rows == 0 || x.cols == 0 {
            return vec![0; x.rows];
        }
        let (keys, slices) = self.argmax_keys(x);
        host_ids::download_ids(&self.gpu, &keys, x.rows, slices)
    }

    pub(super) fn argmax_rows_queued_impl(&self, x: &Tensor) -> QueuedIds {
        if x.rows == 0 || x.cols == 0 {
            return QueuedIds { rows: x.rows, host: Some(vec![0; x.rows]), device: None };
        }
        let (keys, slices) = self.argmax_keys(x);
        let q = Queued::new(keys, x.rows, slices, self.id_slots.clone());
        QueuedIds { rows: x.rows, host: None, device: Some(Arc::new(q)) }
    }

    fn queued<'q>(&self, ids: &'q QueuedIds) -> Option<&'q Queued> {
        let d = ids.device.as_ref()?;
        Some(d.downcast_ref::<Queued>().expect("queued ids of another backend"))
    }

    /// `embed_keys` (kernels/ops.cu): the table rows of the queued ids, read on the device; the ids go to the
    /// host at the same time.
    pub(super) fn embed_queued_impl(&self, table: &Weight, ids: &QueuedIds) -> Tensor {
        let Some(q) = self.queued(ids) else {
            return self.embed_impl(table, ids.host.as_deref().expect("queued ids hold host values or keys"));
        };
        let t = weight(table);
        let hidden = t.in_dim;
        let out = self.alloc_f32(q.rows * hidden);
        q.send(&self.gpu, |host_ids| {
            self.gpu
                .launch("embed_keys")
                .pdl()
                .ptr(&t.buf)
                .int(t.tag())
                .i32(hidden)
                .ptr(&q.keys)
                .i32(q.slices)
                .i32(t.out_dim)
                .ptr(&out)
                .addr(host_ids)
                .go((hidden.div_ceil(256) as u32, q.rows as u32, 1), (256, 1, 1))
        });
        self.tensor(q.rows, hidden, out)
    }

    pub(super) fn take_ids_impl(&self, ids: &QueuedIds) -> Vec<u32> {
        match self.queued(ids) {
            Some(q) => q.take(&self.gpu),
            None => ids.host.clone().expect("queued ids hold host values or keys"),
        }
    }
}
