//! The soak (bench/soak.py) in its CI form: 64 clients for 60 s against `tensorfold serve` on SmolLM2 — chat,
//! completions and Responses, streamed and not, disconnects mid-prefill and mid-stream, prefix-heavy resends,
//! prompts longer than the context. The script asserts no 5xx, RSS flat within 5% after its warm-up, the server
//! idle with no KV block held at the end, the stored responses within their bound, and every completed reply
//! equal to the same request sent alone (token_sha); it prints "ALL OK" when all hold. The 10-minute form and
//! its numbers are in docs/benchmarks.md.

mod support;

use std::process::Command;
use support::{test_python, Server};

#[test]
fn sixty_seconds_of_mixed_traffic_with_disconnects_leave_the_server_as_it_was() {
    let server = Server::start(&[
        "--context",
        "1024",
        "--max-queue",
        "256",
        "--store-max-entries",
        "32",
        "--store-max-mib",
        "1",
    ]);
    let script = tf_testkit::repo_root().join("bench/soak.py");
    let out = Command::new(test_python())
        .arg(&script)
        .args(["--base-url", &server.base(), "--pid", &server.pid().to_string()])
        .args([
            "--clients",
            "64",
            "--seconds",
            "60",
            "--warmup",
            "20",
            "--store-max-entries",
            "32",
            "--store-max-mib",
            "1",
        ])
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run bench/soak.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "the soak failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
    server.stop_cleanly();
}
