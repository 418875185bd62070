//! `--backend` as every model-loading command takes it: in a build without the `cuda` feature, `--backend cuda`
//! fails with one clear line on stderr (no panic, no backtrace), for `serve` as for `run` and `bench`. (With the
//! feature, the device tests cover `--backend cuda`.)
#![cfg(not(feature = "cuda"))]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs tensorfold with `args` and returns (success, stderr); a command still running after 60 s (a server that
/// ignored the flag and started) is killed and counts as a failure of the test.
fn tensorfold(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?} still running after 60 s: --backend was ignored");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (status.success(), err)
}

#[test]
fn backend_cuda_without_the_feature_is_a_one_line_error() {
    let model = tf_testkit::repo_root().join("fixtures/tiny/llama");
    let model = model.to_str().unwrap();
    for cmd in [
        vec!["serve", model, "--backend", "cuda", "--port", "0", "--no-live-line"],
        vec!["run", model, "--backend", "cuda", "-p", "hi", "--max-tokens", "2"],
        vec!["bench", model, "--backend", "cuda", "--prompt-tokens", "4", "--gen-tokens", "2", "--runs", "1"],
    ] {
        let (ok, err) = tensorfold(&cmd);
        assert!(!ok, "{cmd:?} succeeded");
        assert!(err.contains("built without CUDA"), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{cmd:?}: not one line: {err}");
    }
}
