//! State of CUDA-graph decode steps ([`crate::CudaBackend::graph_forward`], docs/cuda.md): the mode the device
//! is in, the arenas that replace stream-ordered allocations and per-call uploads while a forward is captured or
//! replayed, and the signature of the launches a forward issues.
//!
//! In `Capture` and `Replay` modes every output buffer is carved from the activation arena and every metadata
//! upload is written into a host staging buffer at the offset it has in the metadata arena; the staging buffer
//! goes to the device in one copy before the graph runs. The carve order follows the op order, so a forward with
//! the same op sequence gets the same addresses, and the launches' signature (kernel, grid, arguments) tells
//! whether a captured graph is the same computation.

use cudarc::driver::CudaSlice;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Bytes of the activation arena (outputs of one forward: a few MiB for one decode row of a 7B model).
pub const ACT_ARENA: usize = 256 << 20;
/// Bytes of the metadata arena (positions, slots, RoPE rows, block tables, chunk lists of one forward).
pub const META_ARENA: usize = 16 << 20;
/// Alignment of every carved buffer.
const ALIGN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ops launch as they are called; buffers come from the stream-ordered pool.
    Eager,
    /// The stream is being captured: launches are recorded into the graph, buffers come from the arenas.
    Capture,
    /// Ops do their host work only (shape checks, metadata into the staging buffer); nothing is launched.
    Replay,
}

/// The arenas and the signature of the forward in progress.
pub struct Arena {
    pub mode: Mode,
    /// `[ACT_ARENA]` bytes on the device (allocated on first use, kept for the backend's life).
    act: Option<CudaSlice<u8>>,
    act_ptr: u64,
    act_used: usize,
    /// `[META_ARENA]` bytes on the device; `staging` is its host image for the forward in progress.
    meta: Option<CudaSlice<u8>>,
    pub meta_ptr: u64,
    pub staging: Vec<u8>,
    /// Hash of every launch and copy of the forward in progress, in order.
    pub sig: Vec<u64>,
    /// An arena ran out: the forward's addresses are not valid (the step runs eagerly instead).
    pub overflow: bool,
}

impl Arena {
    pub fn new() -> Arena {
        Arena {
            mode: Mode::Eager,
            act: None,
            act_ptr: 0,
            act_used: 0,
            meta: None,
            meta_ptr: 0,
            staging: Vec::new(),
            sig: Vec::new(),
            overflow: false,
        }
    }

    /// Whether the arenas exist; `install` gives them their device memory.
    pub fn ready(&self) -> bool {
        self.act.is_some() && self.meta.is_some()
    }

    pub fn install(&mut self, act: CudaSlice<u8>, act_ptr: u64, meta: CudaSlice<u8>, meta_ptr: u64) {
        self.act = Some(act);
        self.act_ptr = act_ptr;
        self.meta = Some(meta);
        self.meta_ptr = meta_ptr;
    }

    /// Starts a forward in `mode`: empty arenas, staging and signature.
    pub fn begin(&mut self, mode: Mode) {
        self.mode = mode;
        self.act_used = 0;
        self.staging.clear();
        self.sig.clear();
        self.overflow = false;
    }

    /// A buffer of `bytes` in the activation arena (its address; the arena's start after an overflow).
    pub fn carve(&mut self, bytes: usize) -> u64 {
        let at = self.act_used;
        let end = at + bytes.max(1).div_ceil(ALIGN) * ALIGN;
        if end > ACT_ARENA {
            self.overflow = true;
            return self.act_ptr;
        }
        self.act_used = end;
        self.act_ptr + at as u64
    }

    /// `data` staged for the metadata arena; its device address.
    pub fn stage(&mut self, data: &[u8]) -> u64 {
        let at = self.staging.len();
        let end = at + data.len().max(1).div_ceil(ALIGN) * ALIGN;
        if end > META_ARENA {
            self.overflow = true;
            return self.meta_ptr;
        }
        self.staging.extend_from_slice(data);
        self.staging.resize(end, 0);
        self.meta_ptr + at as u64
    }

    /// Adds one launch or copy to the signature.
    pub fn record(&mut self, what: impl Hash) {
        let mut h = DefaultHasher::new();
        what.hash(&mut h);
        self.sig.push(h.finish());
    }
}
