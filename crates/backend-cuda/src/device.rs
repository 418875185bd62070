//! The device: one CUDA context and stream, the kernels compiled by NVRTC for the GPU present (once per process
//! and architecture), device buffers passed to kernels as raw pointers, and launches.
//!
//! Every op runs on the one stream, in order, so buffers need no events: cudarc's event tracking is turned off
//! and a kernel argument is the buffer's device address. The stream is a created one (not the legacy default
//! stream).

use crate::geometry::{nvrtc_arch, program, KERNELS};
use crate::kernel_cache::KernelCache;
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tf_core::BackendError;

/// PTX of the program per architecture flag and defines, compiled once per process.
static PTX: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();

/// Compiles the kernels for `arch` (an NVRTC `--gpu-architecture=` flag) with the options the exact arithmetic
/// needs: no fma contraction, IEEE division and square root, denormals kept. Works without a GPU (NVRTC only).
pub fn compile(arch: &str) -> Result<String, BackendError> {
    compile_with(arch, &[])
}

/// [`compile`] with preprocessor defines `NAME=INTEGER` (`crate::CudaTuning::defines`, such as `IL_PIPE=0` in
/// kernels/matmul_il.cu; none changes an output's bits).
pub fn compile_with(arch: &str, defines: &[String]) -> Result<String, BackendError> {
    for d in defines {
        let ok = d.split_once('=').is_some_and(|(n, v)| {
            !n.is_empty()
                && n.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && v.parse::<i64>().is_ok()
        });
        if !ok {
            return Err(BackendError(format!("kernel define {d:?}: expected NAME=INTEGER (NAME in A-Z, 0-9, _)")));
        }
    }
    let key = std::iter::once(arch.to_string()).chain(defines.iter().cloned()).collect::<Vec<_>>().join(" ");
    let cache = PTX.get_or_init(Default::default);
    if let Some(p) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let mut options = vec![arch.to_string(), "--std=c++17".into()];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    let opts = CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: Some(false),
        options,
        ..Default::default()
    };
    // The PTX of an earlier run with the same sources, options and NVRTC (src/kernel_cache.rs).
    let src = program();
    let version = nvrtc_version()?;
    let disk = KernelCache::from_env();
    let disk_key = KernelCache::key(&src, &[format!("{opts:?}")], &version);
    if let Some(ptx) = disk.as_ref().and_then(|d| d.get(&disk_key)) {
        cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, ptx.clone());
        return Ok(ptx);
    }
    let ptx = std::panic::catch_unwind(|| compile_ptx_with_opts(src, opts))
        .map_err(|_| BackendError("NVRTC could not be loaded (is libnvrtc on the library path?)".into()))?
        .map_err(|e| BackendError(format!("NVRTC failed to compile the CUDA kernels: {e:?}")))?
        .to_src();
    if let Some(d) = &disk {
        let _ = d.put(&disk_key, &ptx); // a cache that cannot be written only costs the next start this compile
    }
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, ptx.clone());
    Ok(ptx)
}

/// "nvrtc MAJOR.MINOR" of the NVRTC library found, or the error that it cannot be loaded.
fn nvrtc_version() -> Result<String, BackendError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers; the dynamic loader panics (caught) if libnvrtc is missing.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        cudarc::nvrtc::sys::nvrtcVersion(&mut major as *mut _, &mut minor as *mut _)
    }))
    .map_err(|_| BackendError("NVRTC could not be loaded (is libnvrtc on the library path?)".into()))?;
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(BackendError(format!("NVRTC version query failed: {r:?}")));
    }
    Ok(format!("nvrtc {major}.{minor}"))
}

/// Lets the device's default memory pool keep freed memory instead of returning it to the driver at each
/// synchronization (every op allocates its output stream-ordered; the pool's default threshold of 0 would
/// re-map that memory after every `to_host`).
fn keep_pool_memory(ctx: &CudaContext) -> Result<(), BackendError> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: plain driver calls on this context's device with valid out-pointers.
    let r = unsafe {
        ctx.bind_to_thread().map_err(err("bind"))?;
        let r = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device());
        if r == sys::CUresult::CUDA_SUCCESS {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            )
        } else {
            r
        }
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(BackendError(format!("CUDA memory pool setup: {r:?}")));
    }
    Ok(())
}

/// A timing event recorded on the stream ([`Gpu::mark`]), destroyed on drop.
pub struct Mark(sys::CUevent);

// SAFETY: an event handle may be used from any thread of the process; these are only recorded, waited on and
// destroyed.
unsafe impl Send for Mark {}

impl Drop for Mark {
    fn drop(&mut self) {
        // SAFETY: an event created by `Gpu::mark`, not used after this.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// A device buffer of `bytes` bytes and its address.
pub struct Buf {
    /// Owns the allocation.
    slice: Option<CudaSlice<u8>>,
    /// Where the allocation goes back on drop (else it is freed, in stream order).
    pool: Option<Arc<Mutex<Pool>>>,
    pub ptr: u64,
    pub bytes: usize,
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let (Some(slice), Some(pool)) = (self.slice.take(), &self.pool) {
            pool.lock().unwrap_or_else(|e| e.into_inner()).put(slice);
        }
    }
}

/// Freed activation buffers by size, handed to later allocations of the same size (a decode step allocates the
/// same sizes every step). Every op runs on the one stream, so a buffer taken here is written only after the
/// kernels that used it before, like a stream-ordered allocation; it saves the driver's allocation and free calls
/// (two per op) on the host.
#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<usize, Vec<CudaSlice<u8>>>,
    held: usize,
}

/// Largest buffer the pool keeps, and most bytes it holds.
const POOL_MAX_BUF: usize = 64 << 20;
const POOL_MAX_HELD: usize = 1 << 30;

impl Pool {
    fn take(&mut self, bytes: usize) -> Option<CudaSlice<u8>> {
        let s = self.free.get_mut(&bytes)?.pop()?;
        self.held -= bytes;
        Some(s)
    }

    fn put(&mut self, s: CudaSlice<u8>) {
        let n = s.len();
        if n <= POOL_MAX_BUF && self.held + n <= POOL_MAX_HELD {
            self.held += n;
            self.free.entry(n).or_default().push(s);
        }
    }
}

/// Page-locked host memory that downloads land in (the DMA engine writes it directly; a copy into pageable memory
/// goes through the driver's own small staging buffers at a fraction of the bus speed), grown on demand and freed
/// with the device, and the events that mark its chunks as arrived.
struct HostStage {
    ptr: *mut u8,
    cap: usize,
    events: Vec<sys::CUevent>,
}

// SAFETY: the staging memory and events are only used under `Gpu::stage`'s mutex, with the context bound.
unsafe impl Send for HostStage {}

/// Bytes per chunk of a download: chunk c + 1 crosses the bus while the host copies chunk c out of the stage.
const STAGE_CHUNK: usize = 1 << 20;
/// Most threads that copy a download out of the stage, and bytes per thread below which fewer are used (on the
/// H200 host 4 threads beat 1 and 8 for 9.7 MB of logits).
const COPY_THREADS: usize = 4;
const COPY_THREAD_BYTES: usize = 2 << 20;

/// The context, its stream and the loaded kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    pub name: String,
    pub cc: (i32, i32),
    /// The pinned download stage.
    stage: Mutex<HostStage>,
    /// Freed activation buffers for reuse.
    pool: Arc<Mutex<Pool>>,
    /// Whether launches marked [`Launch::pdl`] use programmatic dependent launch (compute capability 9.0+).
    pdl: bool,
    /// The kernels' `NORM_PER` (a define; 4 by default): elements per thread of the norms, for their launches.
    pub norm_per: usize,
    /// The kernels' `ATTN_VSPLIT` (a define; 2 by default): blocks per head of the one-head attention kernel.
    pub attn_vsplit: usize,
    /// Streaming multiprocessors.
    sms: u32,
    /// Waits for the whole stream (downloads, [`Gpu::sync`]) started, and one more than the highest number of a
    /// completed one (src/kv_writes.rs).
    waits_started: AtomicU64,
    waits_done: AtomicU64,
    /// (kernel, threads per block) → blocks resident on the whole GPU at once ([`Gpu::resident_blocks`]).
    resident: Mutex<HashMap<(&'static str, u32), u32>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let st = self.stage.get_mut().unwrap_or_else(|e| e.into_inner());
        if st.ptr.is_null() && st.events.is_empty() {
            return;
        }
        // SAFETY: the stage and events were created in this context and nothing uses them any more (the stream is
        // idle: every download waits for its copies).
        unsafe {
            if self.ctx.bind_to_thread().is_ok() {
                let _ = self.stream.synchronize();
                if !st.ptr.is_null() {
                    sys::cuMemFreeHost(st.ptr.cast());
                }
                for &e in &st.events {
                    sys::cuEventDestroy_v2(e);
                }
            }
        }
    }
}

fn err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> BackendError + '_ {
    move |e| BackendError(format!("CUDA {what}: {e:?}"))
}

impl Gpu {
    /// Opens device `ordinal`: loads libcuda (dynamically), compiles (with `defines`, see [`compile_with`]) and
    /// loads the kernels.
    pub fn open(ordinal: usize, defines: &[String]) -> Result<Gpu, BackendError> {
        let attn_vsplit = crate::geometry::attn_vsplit(defines).map_err(BackendError)?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| BackendError("the CUDA driver (libcuda) could not be loaded".into()))?
            .map_err(err("device open"))?;
        // SAFETY: every buffer is used on the one stream below, in issue order, so no cross-stream events are
        // needed; nothing else in the process shares these buffers.
        unsafe { ctx.disable_event_tracking() };
        let cc = ctx.compute_capability().map_err(err("compute capability"))?;
        let name = ctx.name().map_err(err("device name"))?;
        let ptx = compile_with(&nvrtc_arch(cc.0, cc.1), defines)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(err("module load"))?;
        let mut funcs = HashMap::new();
        for k in KERNELS {
            funcs.insert(k, module.load_function(k).map_err(err(k))?);
        }
        let stream = ctx.new_stream().map_err(err("stream"))?;
        keep_pool_memory(&ctx)?;
        let stage = Mutex::new(HostStage { ptr: std::ptr::null_mut(), cap: 0, events: Vec::new() });
        let pool = Arc::new(Mutex::new(Pool::default()));
        let pdl = cc.0 >= 9;
        let norm_per = crate::geometry::norm_per(defines);
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(err("multiprocessor count"))?
            .max(1) as u32;
        let resident = Mutex::new(HashMap::new());
        Ok(Gpu {
            ctx,
            stream,
            funcs,
            name,
            cc,
            stage,
            pool,
            pdl,
            norm_per,
            attn_vsplit,
            sms,
            resident,
            waits_started: AtomicU64::new(0),
            waits_done: AtomicU64::new(0),
        })
    }

    /// How many blocks of `threads` threads of kernel `name` the GPU holds at once (the occupancy calculator's
    /// blocks per multiprocessor, with the kernel's registers and static shared memory, times the multiprocessors;
    /// at least 1): the grid of kernels whose blocks loop over their work.
    pub fn resident_blocks(&self, name: &'static str, threads: u32) -> u32 {
        let mut m = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((name, threads)).or_insert_with(|| {
            let f = self.funcs.get(name).unwrap_or_else(|| panic!("kernel {name} not loaded"));
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .unwrap_or_else(|e| panic!("CUDA occupancy of {name}: {e:?}"));
            (per_sm * self.sms).max(1)
        })
    }

    /// Number of CUDA devices, or 0 when the driver cannot be loaded. cudarc panics when libcuda is missing; that
    /// panic is caught and its message kept off stderr (callers say what is missing in one line). The panic hook
    /// is swapped under a lock so concurrent probes restore the real one.
    pub fn device_count() -> usize {
        static PROBE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = PROBE.lock().unwrap_or_else(|p| p.into_inner());
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let n = std::panic::catch_unwind(CudaContext::device_count);
        std::panic::set_hook(hook);
        n.ok().and_then(|r| r.ok()).map_or(0, |n| n.max(0) as usize)
    }

    /// Makes the context current on this thread (cudarc's own calls do it; raw driver calls need it too).
    pub(crate) fn bind(&self) {
        self.ctx.bind_to_thread().unwrap_or_else(|e| panic!("CUDA context: {e:?}"));
    }

    /// A zeroed buffer of `bytes` bytes (at least 1, so every buffer has an address).
    pub fn zeros(&self, bytes: usize) -> Result<Buf, BackendError> {
        if let Some(slice) = self.pooled(bytes) {
            let b = self.wrap(slice, bytes);
            self.memset0(&b);
            return Ok(b);
        }
        let slice = self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(err("alloc"))?;
        Ok(self.wrap(slice, bytes))
    }

    /// A freed buffer of exactly `bytes` bytes (at least 1) from the pool.
    fn pooled(&self, bytes: usize) -> Option<CudaSlice<u8>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).take(bytes.max(1))
    }

    /// A buffer of `bytes` bytes left uninitialized, for outputs a kernel writes entirely.
    pub fn uninit(&self, bytes: usize) -> Result<Buf, BackendError> {
        // SAFETY: u8 has no invalid bit patterns; callers only hand it to kernels that write every byte before
        // anything reads it.
        if let Some(slice) = self.pooled(bytes) {
            return Ok(self.wrap(slice, bytes));
        }
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.map_err(err("alloc"))?;
        Ok(self.wrap(slice, bytes))
    }

    /// A buffer holding a copy of `data`.
    pub fn upload(&self, data: &[u8]) -> Result<Buf, BackendError> {
        if data.is_empty() {
            return self.zeros(0);
        }
        if let Some(slice) = self.pooled(data.len()) {
            let b = self.wrap(slice, data.len());
            // SAFETY: a live device buffer of data.len() bytes; the source is pageable, so the call returns once
            // the driver has staged the bytes and `data` may go away.
            self.bind();
            let r =
                unsafe { sys::cuMemcpyHtoDAsync_v2(b.ptr, data.as_ptr().cast(), data.len(), self.stream.cu_stream()) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA upload");
            return Ok(b);
        }
        let slice = self.stream.clone_htod(data).map_err(err("upload"))?;
        Ok(self.wrap(slice, data.len()))
    }

    fn wrap(&self, slice: CudaSlice<u8>, bytes: usize) -> Buf {
        let ptr = {
            let (p, _sync) = slice.device_ptr(&self.stream);
            p
        };
        Buf { slice: Some(slice), pool: Some(self.pool.clone()), ptr, bytes }
    }

    /// The buffer's bytes on the host (waits for the work queued before it).
    pub fn download(&self, buf: &Buf, out: &mut [u8]) {
        // SAFETY: `out` is a live, writable host buffer of out.len() bytes.
        unsafe { self.download_into(buf, out.as_mut_ptr(), out.len()) }
    }

    /// Copies the first `len` bytes of `buf` to `dst` (waits for the work queued before it). The bytes cross the
    /// bus into the pinned stage in chunks of `STAGE_CHUNK`, each followed by an event; the host copies a chunk
    /// out as soon as its event completes, while the next ones are still in flight. Large downloads (logits of a
    /// window: 16 × 152k × 4 B) are copied out by up to `COPY_THREADS` threads, chunk c by thread c mod threads:
    /// writing fresh host pages (page faults) is the slow part there.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes (it may be uninitialized).
    pub unsafe fn download_into(&self, buf: &Buf, dst: *mut u8, len: usize) {
        assert!(len <= buf.bytes, "download of {len} bytes from a buffer of {}", buf.bytes);
        if len == 0 {
            return;
        }
        let mut st = self.stage.lock().unwrap_or_else(|e| e.into_inner());
        self.bind();
        let wait = self.waits_started.fetch_add(1, Ordering::SeqCst);
        let chunks = len.div_ceil(STAGE_CHUNK);
        let range = |c: usize| (c * STAGE_CHUNK, STAGE_CHUNK.min(len - c * STAGE_CHUNK));
        // SAFETY: driver calls in the bound context; the stage holds at least `len` bytes (grown first), each async
        // copy reads a live device buffer of at least `len` bytes (asserted) and writes its own range of the stage,
        // and the host reads a range only after that range's event has completed.
        unsafe {
            if st.cap < len {
                if !st.ptr.is_null() {
                    self.sync();
                    sys::cuMemFreeHost(st.ptr.cast());
                    st.ptr = std::ptr::null_mut();
                    st.cap = 0;
                }
                let cap = len.next_multiple_of(STAGE_CHUNK);
                let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
                let r = sys::cuMemAllocHost_v2(&mut p, cap);
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA pinned host allocation of {cap} bytes");
                st.ptr = p.cast();
                st.cap = cap;
            }
            while st.events.len() < chunks {
                let mut e: sys::CUevent = std::ptr::null_mut();
                let r = sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32);
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event");
                st.events.push(e);
            }
            let s = self.stream.cu_stream();
            for c in 0..chunks {
                let (off, n) = range(c);
                let r = sys::cuMemcpyDtoHAsync_v2(st.ptr.add(off).cast(), buf.ptr + off as u64, n, s);
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA download");
                let r = sys::cuEventRecord(st.events[c], s);
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event record");
            }
        }
        // Addresses as integers so the copy-out threads may hold them.
        let (stage, out) = (st.ptr as usize, dst as usize);
        let events: Vec<usize> = st.events[..chunks].iter().map(|&e| e as usize).collect();
        let copy_out = |first: usize, step: usize| -> sys::CUresult {
            for c in (first..chunks).step_by(step) {
                let (off, n) = range(c);
                // SAFETY: as above; chunk ranges are disjoint, so threads never write the same bytes.
                unsafe {
                    let r = sys::cuEventSynchronize(events[c] as sys::CUevent);
                    if r != sys::CUresult::CUDA_SUCCESS {
                        return r;
                    }
                    std::ptr::copy_nonoverlapping((stage as *const u8).add(off), (out as *mut u8).add(off), n);
                }
            }
            sys::CUresult::CUDA_SUCCESS
        };
        let threads = (len / COPY_THREAD_BYTES).clamp(1, COPY_THREADS).min(chunks);
        let results: Vec<sys::CUresult> = if threads == 1 {
            vec![copy_out(0, 1)]
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = (1..threads)
                    .map(|t| {
                        let copy_out = &copy_out;
                        sc.spawn(move || {
                            self.bind();
                            copy_out(t, threads)
                        })
                    })
                    .collect();
                let mut rs = vec![copy_out(0, threads)];
                rs.extend(handles.into_iter().map(|h| h.join().expect("download copy thread")));
                rs
            })
        };
        if let Some(r) = results.into_iter().find(|&r| r != sys::CUresult::CUDA_SUCCESS) {
            // A kernel queued before the download failed: report it as `sync` does.
            self.sync();
            panic!("CUDA download: {r:?}");
        }
        // Every chunk's event completed, so did everything queued before the first copy.
        self.waits_done.fetch_max(wait + 1, Ordering::SeqCst);
    }

    /// Copies `bytes` bytes from `src` to `dst` on the stream.
    pub fn copy(&self, src: &Buf, dst: &mut Buf, bytes: usize) {
        assert!(bytes <= src.bytes && bytes <= dst.bytes, "device copy out of bounds");
        if bytes == 0 {
            return;
        }
        // SAFETY: both are live device buffers of at least `bytes` bytes (asserted), ordered on the one stream.
        self.bind();
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, self.stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA copy");
    }

    /// Zeroes `b` on the stream.
    fn memset0(&self, b: &Buf) {
        // SAFETY: a live device buffer of b.bytes bytes, on the one stream.
        self.bind();
        let r = unsafe { sys::cuMemsetD8Async(b.ptr, 0, b.bytes, self.stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA memset");
    }

    /// Records a timing event on the stream (for measuring GPU time between two points without waiting).
    pub fn mark(&self) -> Mark {
        self.bind();
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: driver calls in the bound context with a valid out-pointer; the event is recorded on our stream.
        unsafe {
            let r = sys::cuEventCreate(&mut e, 0);
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event");
            let r = sys::cuEventRecord(e, self.stream.cu_stream());
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event record");
        }
        Mark(e)
    }

    /// Milliseconds of GPU time from `a` to `b` (both complete: call after a synchronization).
    pub fn elapsed_ms(&self, a: &Mark, b: &Mark) -> f32 {
        self.bind();
        let mut ms = 0f32;
        // SAFETY: two recorded timing events of this context.
        let r = unsafe { sys::cuEventElapsedTime_v2(&mut ms, a.0, b.0) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "CUDA event elapsed time");
        ms
    }

    /// Waits for every queued op; panics with the CUDA error of a failed kernel.
    pub fn sync(&self) {
        let wait = self.waits_started.fetch_add(1, Ordering::SeqCst);
        self.stream.synchronize().unwrap_or_else(|e| panic!("CUDA error: {e:?}"));
        self.waits_done.fetch_max(wait + 1, Ordering::SeqCst);
    }

    /// The ticket of work launched before this call: the number of waits for the whole stream started so far. A
    /// wait numbered this or higher starts after the call, so it waits for that work (src/kv_writes.rs).
    pub fn write_ticket(&self) -> u64 {
        self.waits_started.load(Ordering::SeqCst)
    }

    /// Numbers a wait for everything queued so far that completes later ([`Gpu::wait_done`]; src/host_ids.rs):
    /// an event recorded now.
    pub(crate) fn wait_begin(&self) -> u64 {
        self.waits_started.fetch_add(1, Ordering::SeqCst)
    }

    /// The wait `w` of [`Gpu::wait_begin`] completed: so did the work queued before it.
    pub(crate) fn wait_done(&self, w: u64) {
        self.waits_done.fetch_max(w + 1, Ordering::SeqCst);
    }

    /// One more than the highest number of a completed wait for the whole stream (0 before any).
    pub fn waits_done(&self) -> u64 {
        self.waits_done.load(Ordering::SeqCst)
    }

    /// Starts a launch of `func`, a kernel of another module loaded in this context (measurement programs,
    /// crates/cuda-lab), on the stream.
    pub fn launch_fn<'a>(&'a self, name: &'static str, func: &'a CudaFunction) -> Launch<'a> {
        Launch { gpu: self, name, func, args: Vec::new(), pdl: false }
    }

    /// Streaming multiprocessors of the GPU.
    pub fn multiprocessors(&self) -> u32 {
        self.sms
    }

    /// Starts a launch of kernel `name`; add arguments with [`Launch::ptr`], [`Launch::i32`] and the like, then
    /// [`Launch::go`].
    pub fn launch(&self, name: &'static str) -> Launch<'_> {
        let f = self.funcs.get(name).unwrap_or_else(|| panic!("kernel {name} not loaded"));
        Launch { gpu: self, name, func: f, args: Vec::new(), pdl: false }
    }
}

/// One kernel argument, kept alive until the launch.
pub enum Arg {
    U64(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// A kernel launch being built.
pub struct Launch<'a> {
    gpu: &'a Gpu,
    name: &'static str,
    func: &'a CudaFunction,
    args: Vec<Arg>,
    /// Launch with programmatic dependence on the previous kernel ([`Launch::pdl`]).
    pdl: bool,
}

impl Launch<'_> {
    pub fn ptr(mut self, b: &Buf) -> Self {
        self.args.push(Arg::U64(b.ptr));
        self
    }

    /// A device address (a buffer plus an offset).
    pub fn addr(mut self, p: u64) -> Self {
        self.args.push(Arg::U64(p));
        self
    }

    /// A null pointer (an absent optional input).
    pub fn null(mut self) -> Self {
        self.args.push(Arg::U64(0));
        self
    }

    pub fn i32(mut self, v: usize) -> Self {
        self.args
            .push(Arg::I32(i32::try_from(v).unwrap_or_else(|_| panic!("{}: argument {v} exceeds i32", self.name))));
        self
    }

    pub fn int(mut self, v: i32) -> Self {
        self.args.push(Arg::I32(v));
        self
    }

    pub fn i64(mut self, v: usize) -> Self {
        self.args.push(Arg::I64(v as i64));
        self
    }

    pub fn f32(mut self, v: f32) -> Self {
        self.args.push(Arg::F32(v));
        self
    }

    /// Lets the kernel start before the previous kernel in the stream has finished (programmatic dependent launch,
    /// sm_90+): only for kernels that call `griddep_wait()` before reading anything an earlier kernel wrote and
    /// before writing anything (kernels/common.cu).
    pub fn pdl(mut self) -> Self {
        self.pdl = true;
        self
    }

    /// Launches on the stream with `grid` blocks of `block` threads; panics on a launch error.
    pub fn go(self, grid: (u32, u32, u32), block: (u32, u32, u32)) {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return;
        }
        if self.pdl && self.gpu.pdl {
            return self.go_pdl(grid, block);
        }
        let mut b = self.gpu.stream.launch_builder(self.func);
        for a in &self.args {
            match a {
                Arg::U64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: 0 };
        // SAFETY: the argument list matches the kernel's signature (each call site mirrors the .cu declaration)
        // and every pointer is a live buffer sized for the launch's grid (checked by the caller's shape asserts).
        unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("CUDA launch of {}: {e:?}", self.name));
    }
}

impl Launch<'_> {
    /// [`Launch::go`] through `cuLaunchKernelEx` with programmatic stream serialization allowed.
    fn go_pdl(mut self, grid: (u32, u32, u32), block: (u32, u32, u32)) {
        use sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION as PSS;
        self.gpu.bind();
        let mut params: Vec<*mut std::ffi::c_void> = self
            .args
            .iter_mut()
            .map(|a| match a {
                Arg::U64(v) => v as *mut u64 as *mut std::ffi::c_void,
                Arg::I32(v) => v as *mut i32 as *mut std::ffi::c_void,
                Arg::I64(v) => v as *mut i64 as *mut std::ffi::c_void,
                Arg::F32(v) => v as *mut f32 as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a zeroed attribute is a valid plain-data value; the id and the union member set below match.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = PSS;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: 0,
            hStream: self.gpu.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` points at this launch's arguments, which live until the call returns and match the
        // kernel's signature (as in `go`); the stream and function belong to the bound context.
        let r =
            unsafe { sys::cuLaunchKernelEx(&cfg, self.func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            panic!("CUDA launch of {} (programmatic): {r:?}", self.name);
        }
    }
}
