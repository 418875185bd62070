//! The KV cache kept in the L2 cache's persisting part (`TF_CUDA_KV_L2=1`, a measurement knob; docs/cuda.md): the
//! one-row decode streams every weight once per step through the 50 MB L2, which evicts the K and V rows that
//! attention reads each step, so its first reads wait on DRAM behind the next projections' weight stream. With the
//! knob, the cache's K and V are one allocation, the context sets aside part of L2 for persisting lines, and every
//! launch carries an access-policy window over the cache: its lines are evicted only by other persisting lines.
//! Where the bytes go changes, not what any kernel computes.

use crate::device::{Buf, Gpu};
use cudarc::driver::sys;
use tf_core::BackendError;

/// An access-policy window: base address, bytes, and the fraction of its lines that persist.
#[derive(Clone, Copy, Debug)]
pub struct L2Window {
    pub base: u64,
    pub bytes: usize,
    pub hit_ratio: f32,
}

impl L2Window {
    /// The window as a launch attribute.
    pub fn attribute(&self) -> sys::CUlaunchAttribute {
        // SAFETY: a zeroed attribute is a valid plain-data value; the id and the union member set below match.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW;
        attr.value.accessPolicyWindow = sys::CUaccessPolicyWindow {
            base_ptr: self.base as *mut std::ffi::c_void,
            num_bytes: self.bytes,
            hitRatio: self.hit_ratio,
            hitProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
            missProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
        };
        attr
    }
}

/// Whether the KV cache is kept in L2 (`TF_CUDA_KV_L2=1`).
pub fn kv_l2_wanted() -> bool {
    std::env::var("TF_CUDA_KV_L2").is_ok_and(|v| v == "1")
}

impl Gpu {
    /// Sets aside as much of L2 for persisting lines as `b` needs (at most the device's limit) and makes every
    /// later launch, and the stream, carry a window over `b` (at most the device's largest window; the share of its
    /// lines that persist is what the set-aside holds). Returns the window.
    pub fn persist_in_l2(&self, b: &Buf) -> Result<L2Window, BackendError> {
        let err = |what: &str, e| BackendError(format!("L2 persisting window ({what}): {e:?}"));
        let max_set_aside = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
            .map_err(|e| err("max persisting size", e))? as usize;
        let max_window = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)
            .map_err(|e| err("max window", e))? as usize;
        if max_set_aside == 0 || max_window == 0 {
            return Err(BackendError("this GPU has no persisting L2".into()));
        }
        let set_aside = b.bytes.min(max_set_aside);
        self.ctx
            .set_limit(sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, set_aside)
            .map_err(|e| err("set-aside", e))?;
        let bytes = b.bytes.min(max_window);
        let w = L2Window { base: b.ptr, bytes, hit_ratio: (set_aside as f32 / bytes as f32).min(1.0) };
        let attr = w.attribute();
        self.bind();
        // SAFETY: the stream belongs to the bound context; the value is the union member the id names.
        let r = unsafe {
            sys::cuStreamSetAttribute(
                self.stream.cu_stream(),
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                &attr.value,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(BackendError(format!("L2 persisting window (stream attribute): {r:?}")));
        }
        *self.l2_window.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
        if std::env::var_os("TF_CUDA_KV_L2_SAY").is_some() {
            eprintln!(
                "L2: {} MB set aside (device max {} MB), window {} MB (max {} MB), hit ratio {:.2}",
                set_aside >> 20,
                max_set_aside >> 20,
                bytes >> 20,
                max_window >> 20,
                w.hit_ratio
            );
        }
        Ok(w)
    }
}
