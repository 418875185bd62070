//! A persistent thread pool with low dispatch cost for the ~400 small parallel ops of a one-row forward.
//!
//! `threads - 1` workers live as long as the pool; the calling thread is participant 0. A job is a closure over
//! task indices `0..tasks`, split into one contiguous range per participant; each participant claims the tasks
//! of its own range in order (so consecutive tasks on one thread touch consecutive memory and its prefetches of
//! the next tile serve itself), then helps with the other ranges. Each range has its own atomic cursor, so a
//! task runs exactly once on whichever thread gets it (tasks are units of work, never of arithmetic: which
//! thread runs a task changes no bit). Workers wait for the next job by spinning for [`SPIN`], then park on a condvar;
//! publishing a job is one atomic store when nobody sleeps.
//!
//! Lifetimes: the job's closure lives on the caller's stack. A worker may only touch it after joining the job
//! (a CAS on [`Shared::gate`] that succeeds only while the job is open); the caller closes the job once every task
//! is claimed and then waits until the joined workers have left, so a late worker never sees a dead closure.
//!
//! One job at a time: a second thread calling [`Pool::run`] while a job is in flight (or a task calling it
//! again) runs its tasks on its own thread, in order — slower, same bits. A panicking task is caught on the
//! thread that ran it and resumed on the caller once the job is over.

use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks. Decode ops arrive every few microseconds; between tokens
/// (sampling, the engine) the workers park.
const SPIN: Duration = Duration::from_micros(200);
/// After this long a spinning worker also yields its core at every check (other processes may need it: the
/// machine is shared, and a spinning worker must not starve the thread whose op it waits for).
const SPIN_HOT: Duration = Duration::from_micros(20);
/// Spins of a caller waiting for joined workers before it starts yielding (a worker may have been preempted).
const WAIT_SPINS: u32 = 1 << 10;

/// `gate` layout: bits 0..32 the workers inside the current job, bit 32 "open", bits 33.. the job's sequence.
const OPEN: u64 = 1 << 32;
const SEQ_SHIFT: u32 = 33;
const INSIDE: u64 = OPEN - 1;

/// The closure of the current job, its lifetime erased (see the module docs for why this is sound).
type Task = dyn Fn(usize) + Sync;

fn noop(_: usize) {}
/// The job before the first one (never run: no worker joins before a job is opened).
const NOOP: &Task = &noop;

struct Job {
    f: *const Task,
    tasks: usize,
}

struct Shared {
    /// Sequence, open flag and joined-worker count of the current job.
    gate: AtomicU64,
    /// Written by the caller before it opens the gate; read by workers after joining.
    job: UnsafeCell<Job>,
    /// `[threads]`: the next task to claim in each participant's range.
    cursors: Box<[Cursor]>,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Held by the thread whose job is in flight.
    submit: Mutex<()>,
    /// The first panic of the current job's tasks.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `job` is written only by the thread holding `submit` while the gate is closed and no worker is inside,
// and read only by workers that joined through the gate (Acquire after the caller's Release).
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw closure pointer is only dereferenced under the gate protocol.
unsafe impl Send for Shared {}

/// The pool. `threads` counts the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads)
    }
}

impl Pool {
    /// A pool of `threads` participants (`0` means [`default_threads`]), `threads - 1` of them new threads.
    pub fn new(threads: usize) -> Pool {
        let threads = if threads == 0 { default_threads() } else { threads };
        let shared = Arc::new(Shared {
            gate: AtomicU64::new(0),
            job: UnsafeCell::new(Job { f: NOOP as *const Task, tasks: 0 }),
            cursors: (0..threads).map(|_| Cursor(AtomicUsize::new(0))).collect(),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            submit: Mutex::new(()),
            panic: Mutex::new(None),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("tf-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("cannot start the CPU backend's threads")
            })
            .collect();
        Pool { shared, threads, workers }
    }

    /// Participants, the calling thread included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` once for every `i` in `0..tasks`, on the pool's threads and the caller's; returns when all
    /// have finished. A panic in a task is resumed here after every other task has run or been skipped.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        let guard = if self.threads > 1 && tasks > 1 { self.shared.submit.try_lock().ok() } else { None };
        let Some(_guard) = guard else {
            (0..tasks).for_each(f);
            return;
        };
        let s = &*self.shared;
        // SAFETY: erases the lifetime only; the gate protocol keeps every use of the pointer inside this call.
        let erased = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f as *const _) };
        // SAFETY: we hold `submit`, the gate is closed and no worker is inside (the previous job waited for them).
        unsafe {
            *s.job.get() = Job { f: erased, tasks };
        }
        let parts = s.cursors.len();
        for (p, c) in s.cursors.iter().enumerate() {
            c.0.store(p * tasks / parts, Ordering::Relaxed);
        }
        let seq = (s.gate.load(Ordering::Relaxed) >> SEQ_SHIFT) + 1;
        s.gate.store((seq << SEQ_SHIFT) | OPEN, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        claim(s, f, tasks, 0);
        // Every task is claimed: close the job, then wait for the joined workers to finish theirs.
        let mut g = s.gate.fetch_and(!OPEN, Ordering::AcqRel) & !OPEN;
        let mut spins = 0u32;
        while g & INSIDE != 0 {
            spins += 1;
            if spins < WAIT_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            g = s.gate.load(Ordering::Acquire);
        }
        let panic = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }

    /// Runs `f(i, chunk)` over the consecutive chunks of `chunk` elements of `data` (the last may be shorter).
    pub fn for_chunks_mut<T: Send>(&self, data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        assert!(chunk > 0, "for_chunks_mut: empty chunks");
        let len = data.len();
        let base = SendPtr(data.as_mut_ptr());
        self.run(len.div_ceil(chunk), &|i| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: chunks of distinct `i` are disjoint and inside `data`, which outlives the job.
            f(i, unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) })
        });
    }

    /// `(0..n).map(f).collect()`, the calls spread over the pool.
    pub fn map<T: Send>(&self, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        self.for_chunks_mut(&mut out, 1, |i, slot| slot[0] = Some(f(i)));
        out.into_iter().map(|v| v.expect("every task ran")).collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that may cross threads (the users guarantee disjoint access).
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: only used for disjoint writes from the tasks of one job (see the users).
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper rather than the raw field).
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// A cursor on its own cache line (the participants' cursors are written by different threads).
#[repr(align(64))]
struct Cursor(AtomicUsize);

/// Claims and runs tasks until none is left, participant `me`'s range first, then the others' in turn; a panic
/// is kept for the caller (and this thread stops claiming).
fn claim(s: &Shared, f: &(dyn Fn(usize) + Sync), tasks: usize, me: usize) {
    let parts = s.cursors.len();
    let r = catch_unwind(AssertUnwindSafe(|| {
        for k in 0..parts {
            let who = (me + k) % parts;
            let end = (who + 1) * tasks / parts;
            loop {
                let i = s.cursors[who].0.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                f(i);
            }
        }
    }));
    if let Err(p) = r {
        s.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(p);
    }
}

fn worker(s: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a job newer than `seen`: spin, then park.
        let start = Instant::now();
        let mut g = s.gate.load(Ordering::Acquire);
        let mut n = 0u32;
        while (g >> SEQ_SHIFT) == seen || g & OPEN == 0 {
            if s.shutdown.load(Ordering::Relaxed) {
                return;
            }
            std::hint::spin_loop();
            n += 1;
            if !n.is_multiple_of(64) {
                g = s.gate.load(Ordering::Acquire);
                continue;
            }
            let waited = start.elapsed();
            if waited > SPIN_HOT {
                std::thread::yield_now();
            }
            if waited > SPIN {
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                let mut l = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    g = s.gate.load(Ordering::SeqCst);
                    let fresh = (g >> SEQ_SHIFT) != seen && g & OPEN != 0;
                    if fresh || s.shutdown.load(Ordering::SeqCst) {
                        break;
                    }
                    l = s.wake.wait(l).unwrap_or_else(|e| e.into_inner());
                }
                drop(l);
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                n = 0;
            }
            g = s.gate.load(Ordering::Acquire);
        }
        // Join while the job is still open; a job closed meanwhile is skipped.
        let q = g >> SEQ_SHIFT;
        seen = q;
        let joined = loop {
            if g >> SEQ_SHIFT != q || g & OPEN == 0 {
                break false;
            }
            match s.gate.compare_exchange_weak(g, g + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break true,
                Err(now) => g = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: we are inside the open job: the caller keeps `f` alive until we leave.
        let job = unsafe { &*s.job.get() };
        // SAFETY: as above.
        claim(s, unsafe { &*job.f }, job.tasks, me);
        s.gate.fetch_sub(1, Ordering::Release);
    }
}

/// One thread per physical core this process may run on: the logical CPUs it may use (affinity and cgroup quota,
/// as `available_parallelism` counts them) divided by the hardware threads per core. Two hyper-threads of one core
/// share its execution units and caches, so a second thread per core slows the memory-bound matmuls down.
/// Falls back to the logical count where the topology cannot be read (non-Linux systems).
pub fn default_threads() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut siblings = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.strip_prefix("cpu").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
                if let Ok(s) = std::fs::read_to_string(entry.path().join("topology/thread_siblings_list")) {
                    siblings.push(s.trim().to_string());
                }
            }
        }
    }
    physical_threads(logical, &siblings)
}

/// `logical` usable CPUs divided by the threads per core that `siblings` (each CPU's `thread_siblings_list`, one
/// entry per CPU) shows, rounded up, at least 1; `logical` when `siblings` is empty.
fn physical_threads(logical: usize, siblings: &[String]) -> usize {
    let cores = siblings.iter().collect::<std::collections::HashSet<_>>().len();
    if cores == 0 {
        return logical.max(1);
    }
    let per_core = siblings.len().div_ceil(cores).max(1);
    logical.div_ceil(per_core).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_threads_count_cores_not_hyperthreads() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // 4 cores with 2 threads each, all usable: 4.
        assert_eq!(physical_threads(8, &list(&["0,4", "1,5", "2,6", "3,7", "0,4", "1,5", "2,6", "3,7"])), 4);
        // The same machine with a quota of 3 CPUs: 2.
        assert_eq!(physical_threads(3, &list(&["0-1", "0-1", "2-3", "2-3", "4-5", "4-5", "6-7", "6-7"])), 2);
        // No SMT: every CPU is a core.
        assert_eq!(physical_threads(2, &list(&["0", "1"])), 2);
        // No topology: the logical count.
        assert_eq!(physical_threads(6, &[]), 6);
        assert!(default_threads() >= 1);
    }
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads);
            for tasks in [0, 1, 2, 3, 7, 64, 1000] {
                for _ in 0..20 {
                    let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                    pool.run(tasks, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{threads} threads, {tasks} tasks");
                }
            }
        }
    }

    #[test]
    fn parked_workers_wake_and_nested_calls_run_inline() {
        let pool = Pool::new(3);
        std::thread::sleep(SPIN * 5);
        let v = pool.map(100, |i| {
            // A nested job runs on this thread (the pool is busy) and still covers every task.
            let inner = pool.map(3, |j| j * 10);
            i * 2 + inner[2]
        });
        assert_eq!(v, (0..100).map(|i| i * 2 + 20).collect::<Vec<_>>());
        let mut data = vec![0u32; 1001];
        pool.for_chunks_mut(&mut data, 10, |c, chunk| {
            chunk.iter_mut().enumerate().for_each(|(j, x)| *x = (c * 10 + j) as u32)
        });
        assert!(data.iter().enumerate().all(|(i, &x)| x == i as u32));
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(50, &|i| assert!(i != 17, "task 17"))));
        assert!(r.is_err());
        assert_eq!(pool.map(9, |i| i * i), (0..9).map(|i| i * i).collect::<Vec<_>>());
    }

    #[test]
    fn concurrent_callers_each_get_all_their_tasks() {
        let pool = Arc::new(Pool::new(2));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let v = pool.map(17, |i| i + t);
                        assert_eq!(v, (0..17).map(|i| i + t).collect::<Vec<_>>());
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
