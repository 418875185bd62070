//! Argmax ids that reach the host without a wait for the whole stream (`Backend::argmax_rows_queued`,
//! `embed_queued`, `take_ids`: the engine's run-ahead decoding, crates/engine/src/ahead.rs). The argmax keys stay in
//! a device buffer. The forward they feed reads them there (`embed_keys`, kernels/ops.cu), and its embedding kernel
//! also writes each id into a slot of pinned host memory mapped into the device's address space; an event recorded
//! right after that kernel completes while the fed forward runs, and the host waits for that event only.
//!
//! Ids nobody fed are downloaded as `argmax_rows` does (a wait for the stream).

use crate::device::{Buf, Gpu};
use cudarc::driver::{sys, CudaContext};
use std::sync::{Arc, Mutex, MutexGuard};

/// `cap` u32 of pinned, device-mapped host memory (`host` on the host, `dev` on the device) and the event
/// recorded after the kernel that writes them.
struct Slot {
    host: *mut u32,
    dev: u64,
    cap: usize,
    event: sys::CUevent,
}

// SAFETY: plain driver handles; a slot is used by one owner at a time (the free list's or one `Queued`'s mutex).
unsafe impl Send for Slot {}

/// Slots not in use (pinned allocations are slow, so they are kept), freed with the context they belong to.
pub(crate) struct Slots {
    ctx: Arc<CudaContext>,
    free: Mutex<Vec<Slot>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slots {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Slots {
        Slots { ctx, free: Mutex::new(Vec::new()) }
    }

    /// A free slot of at least `rows` ids, allocated when none fits.
    fn take(&self, gpu: &Gpu, rows: usize) -> Slot {
        let mut free = lock(&self.free);
        if let Some(i) = free.iter().position(|s| s.cap >= rows) {
            return free.swap_remove(i);
        }
        drop(free);
        let cap = rows.next_power_of_two().max(64);
        gpu.bind();
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut dev: sys::CUdeviceptr = 0;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: driver calls in the bound context with valid out-pointers.
        unsafe {
            let r = sys::cuMemHostAlloc(&mut host, cap * 4, sys::CU_MEMHOSTALLOC_DEVICEMAP);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA mapped host allocation of {} bytes", cap * 4);
            let r = sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA mapped host pointer");
            let r = sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event");
        }
        Slot { host: host.cast(), dev, cap, event }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|e| e.into_inner()));
        if free.is_empty() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: free slots belong to no queued ids; the kernels that wrote them completed before their owners
        // took the ids, or their owners dropped them: the stream is synchronized first for those.
        unsafe {
            let _ = sys::cuCtxSynchronize();
            for s in free {
                sys::cuMemFreeHost(s.host.cast());
                sys::cuEventDestroy_v2(s.event);
            }
        }
    }
}

/// The ids of `rows` rows from `argmax_rows`' keys `[rows, slices]` (kernels/ops.cu): each row's maximum key, whose
/// low half is 0xffffffff − id. Downloads them (a wait for the stream).
pub(crate) fn download_ids(gpu: &Gpu, keys: &Buf, rows: usize, slices: usize) -> Vec<u32> {
    let mut raw = vec![0u64; rows * slices];
    gpu.download(keys, bytemuck::cast_slice_mut(&mut raw));
    raw.chunks_exact(slices).map(|k| u32::MAX - *k.iter().max().expect("a slice") as u32).collect()
}

/// The device side of a `tf_core::QueuedIds`.
pub(crate) struct Queued {
    /// `[rows, slices]` u64 argmax keys (kernels/ops.cu `argmax_rows`).
    pub keys: Buf,
    pub rows: usize,
    pub slices: usize,
    /// Set when a fed forward's `embed_keys` sends the ids to the host: the slot and the number of the wait its
    /// event stands for ([`Gpu::wait_begin`]).
    sent: Mutex<Option<(Slot, u64)>>,
    slots: Arc<Slots>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let Some((slot, _)) = self.sent.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            // A later owner's kernel writes the slot after this one's in stream order, and reads it after its own
            // event: reuse at once is safe.
            lock(&self.slots.free).push(slot);
        }
    }
}

impl Queued {
    pub(crate) fn new(keys: Buf, rows: usize, slices: usize, slots: Arc<Slots>) -> Queued {
        Queued { keys, rows, slices, sent: Mutex::new(None), slots }
    }

    /// Launches `launch` (the fed forward's `embed_keys`, given the device address its ids go to, 0 for none) and,
    /// the first time, records the event the host will wait for.
    pub(crate) fn send(&self, gpu: &Gpu, launch: impl FnOnce(u64)) {
        let mut sent = lock(&self.sent);
        if sent.is_some() {
            launch(0);
            return;
        }
        let slot = self.slots.take(gpu, self.rows);
        launch(slot.dev);
        gpu.bind();
        // SAFETY: the event belongs to this context; it is recorded on the backend's one stream.
        let r = unsafe { sys::cuEventRecord(slot.event, gpu.stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event record");
        // Numbered after the launches it covers: every write launched before has a ticket at most this.
        let wait = gpu.wait_begin();
        *sent = Some((slot, wait));
    }

    /// The ids on the host: after the event of a fed forward's embedding, else downloaded (a wait for the stream).
    pub(crate) fn take(&self, gpu: &Gpu) -> Vec<u32> {
        let sent = lock(&self.sent);
        let Some((slot, wait)) = &*sent else {
            drop(sent);
            return download_ids(gpu, &self.keys, self.rows, self.slices);
        };
        gpu.bind();
        // SAFETY: the event was recorded after the kernel that wrote `rows` ids to the slot; once it completes
        // the writes are visible to the host. Volatile reads: the device wrote the memory.
        unsafe {
            let r = sys::cuEventSynchronize(slot.event);
            if r != sys::CUresult::CUDA_SUCCESS {
                // A kernel queued before it failed: report it as a download does.
                gpu.sync();
                panic!("CUDA queued ids: {r:?}");
            }
            gpu.wait_done(*wait);
            (0..self.rows).map(|i| std::ptr::read_volatile(slot.host.add(i))).collect()
        }
    }
}
