//! What the benchmark examples share.

/// The calling thread's CPU time in seconds (Linux; `TF_BENCH_CPU=1` in the examples).
#[cfg(target_os = "linux")]
pub fn thread_cpu_s() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid `timespec` on 64-bit Linux; clock 3 is CLOCK_THREAD_CPUTIME_ID.
    let rc = unsafe { clock_gettime(3, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// The calling thread's CPU time: Linux only.
#[cfg(not(target_os = "linux"))]
pub fn thread_cpu_s() -> f64 {
    panic!("TF_BENCH_CPU needs Linux")
}
