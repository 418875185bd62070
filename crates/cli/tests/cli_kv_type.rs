//! `--kv-type` on `serve` with SmolLM2-135M (30 layers, 3 kv heads of head dim 64): the KV pool it sizes and
//! prints reflects the storage type (f32 4 bytes a value, f16 2, q8_0 34 bytes per 32 values), a q8_0 server
//! passes its drafting self-check and answers, and a model whose head dim is not a multiple of 32 is refused
//! with q8_0 in one line; with the `cuda` feature, `--backend cuda` refuses f16 and q8_0.

mod support;

use serde_json::json;
use std::process::Command;
use support::Server;

/// K and V bytes per token of SmolLM2-135M stored with `bytes_per_32` bytes per 32 values.
fn smollm2_bytes_per_token(bytes_per_32: usize) -> usize {
    let (layers, kv_heads, head_dim) = (30, 3, 64);
    2 * layers * kv_heads * head_dim / 32 * bytes_per_32
}

/// The startup line's "KV pool SIZE UNIT (N tokens" as (SIZE in bytes, UNIT in bytes, N) and the whole line.
fn pool(server: &Server) -> (f64, f64, usize, String) {
    let out = server.output();
    let line = out.lines().find(|l| l.contains("KV pool ")).unwrap_or_else(|| panic!("no KV pool line:\n{out}"));
    let rest = &line[line.find("KV pool ").unwrap() + "KV pool ".len()..];
    let mut words = rest.split_whitespace();
    let (num, unit) = (words.next().unwrap(), words.next().unwrap());
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        u => panic!("unit {u} in {line}"),
    };
    let bytes = num.parse::<f64>().unwrap() * scale;
    let tokens = words.next().unwrap().trim_start_matches('(').parse().unwrap();
    (bytes, scale, tokens, line.to_owned())
}

#[test]
fn kv_type_sizes_the_pool_and_q8_0_serves() {
    // Default pool (one context of 512 tokens): the same tokens, the bytes of each type.
    let mut sizes = Vec::new();
    for (ty, per_32) in [("f32", 128), ("f16", 64), ("q8_0", 34)] {
        let s = Server::start(&["--kv-type", ty, "--context", "512", "--parallel", "1", "--no-live-line"]);
        let (bytes, unit, tokens, line) = pool(&s);
        let want = (tokens * smollm2_bytes_per_token(per_32)) as f64;
        // The size is printed with one decimal.
        assert!((bytes - want).abs() <= 0.051 * unit, "{ty}: {line} (want {want} bytes)");
        assert_eq!(tokens, 512, "{ty}: {line}");
        assert_eq!(line.contains(&format!("{ty} KV")), ty != "f32", "{ty}: {line}");
        sizes.push(bytes);
        s.get_json("/health");
        if ty == "q8_0" {
            let out = s.output();
            assert!(out.contains("self-check passed"), "q8_0 drafting self-check:\n{out}");
            let body = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0});
            let r = s.post_json("/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["usage"]["completion_tokens"], 8, "{}", r.text());
        }
        s.stop_cleanly();
    }
    assert!(sizes[2] < sizes[1] && sizes[1] < sizes[0], "pool bytes f32, f16, q8_0: {sizes:?}");

    // --kv-pool-gib: the same bytes hold more tokens (whole blocks of 16).
    let gib = 0.05f64;
    for (ty, per_32) in [("f32", 128), ("q8_0", 34)] {
        let s = Server::start(&["--kv-type", ty, "--context", "512", "--kv-pool-gib", "0.05", "--no-live-line"]);
        let (_, _, tokens, line) = pool(&s);
        let per_block = smollm2_bytes_per_token(per_32) * 16;
        let want = (gib * (1u64 << 30) as f64 / per_block as f64) as usize * 16;
        assert_eq!(tokens, want, "{ty}: {line}");
        s.get_json("/health");
        s.stop_cleanly();
    }
}

#[test]
fn q8_0_refuses_a_head_dim_that_is_not_a_multiple_of_32() {
    // fixtures/tiny/qwen3: head dim 16.
    let model = tf_testkit::repo_root().join("fixtures/tiny/qwen3");
    let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
        .args(["run", model.to_str().unwrap(), "--load-format", "dummy", "--kv-type", "q8_0", "-p", "hi"])
        .args(["--max-tokens", "2", "--threads", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("head_dim 16 is not a multiple of 32"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
}

/// With the `cuda` feature, `--backend cuda` refuses a KV type other than f32 before touching a device.
#[cfg(feature = "cuda")]
#[test]
fn cuda_refuses_a_kv_type_other_than_f32() {
    let model = tf_testkit::model_path("smollm2");
    for ty in ["f16", "q8_0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
            .args(["run", model.to_str().unwrap(), "--backend", "cuda", "--kv-type", ty, "-p", "hi"])
            .args(["--max-tokens", "2"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{ty}: {err}");
        assert!(err.contains(&format!("--kv-type {ty}: the CUDA backend stores its KV cache in f32 only")), "{err}");
    }
}
