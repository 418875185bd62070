//! Shared harness for the `tensorfold serve` integration tests: start the server on an OS-picked port, wait for
//! its "listening on" line (bounded, through a channel, never by sleeping), speak raw HTTP/1.1 to it, and stop it
//! with SIGTERM, asserting that it exits cleanly within a bound.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the server may take to load the model and bind its port.
pub const START_BOUND: Duration = Duration::from_secs(120);
/// How long the server may take to exit after SIGTERM.
pub const STOP_BOUND: Duration = Duration::from_secs(30);
/// How long one HTTP exchange may take (a read that stalls this long fails the test).
pub const IO_BOUND: Duration = Duration::from_secs(60);

/// The model id the server reports when started without `--name`: the GGUF file's stem.
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct-q4_1";

/// A running `tensorfold serve`. Dropping it sends SIGTERM and waits (bounded), then SIGKILLs if needed.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

enum Line {
    Text(String),
    Eof,
}

fn forward(
    stream: impl Read + Send + 'static,
    tag: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    tx: mpsc::Sender<Line>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end_matches(['\r', '\n']).to_owned();
                    eprintln!("[server {tag}] {line}");
                    log.lock().unwrap().push(format!("{tag}: {line}"));
                    let _ = tx.send(Line::Text(line));
                }
            }
        }
        let _ = tx.send(Line::Eof);
    });
}

impl Server {
    /// Starts `tensorfold serve <smollm2> --host 127.0.0.1 --port 0 --threads 2 EXTRA...` and waits until it
    /// prints `listening on http://127.0.0.1:PORT` on stderr. Panics with everything it printed if it exits
    /// first or does not get there within [`START_BOUND`].
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model("smollm2", extra)
    }

    /// [`Server::start`] with another of the real models (a short name of `tf_testkit::MODELS`).
    pub fn start_model(short: &str, extra: &[&str]) -> Server {
        Server::start_at(&tf_testkit::model_path(short), extra)
    }

    /// [`Server::start`] with the model at `model` (a GGUF file or a Hugging Face directory).
    pub fn start_at(model: &std::path::Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensorfold"))
            .arg("serve")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0", "--threads", "2"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tensorfold serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        // Only stderr carries the readiness line; stdout is forwarded so nothing blocks on a full pipe.
        let (tx_out, _rx_out) = mpsc::channel();
        forward(child.stdout.take().unwrap(), "stdout", log.clone(), tx_out);
        forward(child.stderr.take().unwrap(), "stderr", log.clone(), tx);
        let deadline = Instant::now() + START_BOUND;
        let marker = "listening on http://127.0.0.1:";
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let why = match rx.recv_timeout(left) {
                Ok(Line::Text(line)) => match line.find(marker) {
                    Some(at) => {
                        let digits: String =
                            line[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
                        match digits.parse::<u16>() {
                            Ok(p) if p != 0 => break p,
                            _ => format!("no port in the listening line {line:?}"),
                        }
                    }
                    None => continue,
                },
                Ok(Line::Eof) | Err(RecvTimeoutError::Disconnected) => "stderr closed (the server exited)".to_owned(),
                Err(RecvTimeoutError::Timeout) => format!("no listening line within {START_BOUND:?}"),
            };
            let _ = child.kill();
            let status = child.wait();
            let seen = log.lock().unwrap().join("\n");
            panic!("tensorfold serve {extra:?} did not start: {why}; exit: {status:?}\noutput so far:\n{seen}");
        };
        Server { child: Some(child), port, log }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server already stopped").id()
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Everything the server printed so far, one line each, prefixed by stream.
    pub fn output(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The server's resident set size in bytes, from /proc/PID/status (VmRSS).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc/PID/status");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
        let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS value");
        kb * 1024
    }

    /// Sends the signal `sig` (a `kill` name: TERM, HUP, INT).
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill").args([&format!("-{sig}"), &pid]).status().expect("run kill");
        assert!(status.success(), "kill -{sig} {pid} failed");
    }

    /// Waits until the server has printed `needle` at least `times` times in all, at most `bound`; panics with
    /// the output otherwise. (Polls the captured output; the line itself is the event waited for.)
    pub fn wait_output(&self, needle: &str, times: usize, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            if self.log.lock().unwrap().iter().filter(|l| l.contains(needle)).count() >= times {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not print {needle:?} ({times}×) within {bound:?}\noutput:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send_term(&self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
    }

    /// Sends SIGTERM and waits for the process to exit, asserting that it does so within [`STOP_BOUND`]
    /// (the polling only bounds the wait; the exit itself is what we wait for).
    pub fn stop_and_wait(&mut self) -> ExitStatus {
        self.send_term();
        self.wait_exit()
    }

    /// Waits (bounded by [`STOP_BOUND`]) for the process to exit on its own, after signals already sent.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("server already stopped");
        let deadline = Instant::now() + STOP_BOUND;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!("the server did not exit within {STOP_BOUND:?}\noutput:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server and asserts a clean exit: status 0 and no panic on its output.
    pub fn stop_cleanly(mut self) {
        let status = self.stop_and_wait();
        let out = self.output();
        assert!(status.success(), "the server exited with {status} after SIGTERM\noutput:\n{out}");
        assert!(!out.contains("panicked"), "the server panicked at some point\noutput:\n{out}");
    }

    /// GET `path`, asserting 200 and a JSON body.
    pub fn get_json(&self, path: &str) -> serde_json::Value {
        let r = http(self.port, "GET", path, &[], b"");
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        r.json()
    }

    /// POST a JSON body to `path`.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> Resp {
        http(self.port, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }

    /// Polls GET /health until `ok(health)` holds, at most `bound`; panics with the last health seen.
    pub fn wait_health(
        &self,
        bound: Duration,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + bound;
        loop {
            let h = self.get_json("/health");
            if ok(&h) {
                return h;
            }
            assert!(Instant::now() < deadline, "/health did not reach {what} within {bound:?}: {h}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One value of a Prometheus metric without labels (or the first sample of it), from GET /metrics.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let r = http(self.port, "GET", "/metrics", &[], b"");
        assert_eq!(r.status, 200, "GET /metrics: {}", r.text());
        metric_value(&r.text(), name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(None) = child.try_wait() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + STOP_BOUND;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// The first sample of metric `name` (exact name, optionally followed by labels) in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let rest = if rest.starts_with('{') { &rest[rest.find('}')? + 1..] } else { rest };
        if !rest.starts_with(' ') {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// An HTTP response read off the wire.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: body is not JSON ({e}): {:?}", self.status, self.text()))
    }
}

/// Writes a full request (head and body) on a fresh connection and reads the response until the server closes
/// it. Large bodies are written from a second thread, so a server that answers early (413) and closes is read
/// rather than deadlocked on; write errors are ignored (the response, or its absence, is what counts).
pub fn exchange(port: u16, request: Vec<u8>) -> std::io::Result<Resp> {
    exchange_with(port, request, false)
}

/// [`exchange`], optionally half-closing the connection after the request (for byte sequences that are not a
/// complete request, which an HTTP server may rightly keep waiting on).
pub fn exchange_with(port: u16, request: Vec<u8>, half_close: bool) -> std::io::Result<Resp> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(IO_BOUND))?;
    stream.set_write_timeout(Some(IO_BOUND))?;
    let writer = if request.len() > 1 << 20 {
        let mut w = stream.try_clone()?;
        Some(std::thread::spawn(move || {
            let _ = w.write_all(&request);
            let _ = w.flush();
        }))
    } else {
        let _ = stream.write_all(&request);
        if half_close {
            let _ = stream.shutdown(Shutdown::Write);
        }
        None
    };
    let mut raw = Vec::new();
    let read = read_to_close(&mut stream, &mut raw);
    if let Some(w) = writer {
        let _ = stream.shutdown(Shutdown::Both);
        let _ = w.join();
    }
    if raw.is_empty() {
        read?;
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed without a response"));
    }
    parse_response(&raw)
}

/// Reads until EOF, bounded by [`IO_BOUND`] per read and overall. A reset after some bytes ends the read.
fn read_to_close(stream: &mut TcpStream, raw: &mut Vec<u8>) -> std::io::Result<()> {
    let deadline = Instant::now() + IO_BOUND;
    let mut buf = [0u8; 16384];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "response not finished in time"));
        }
    }
}

/// Parses a raw HTTP/1.1 response: status line, headers, body (de-chunked when chunked).
pub fn parse_response(mut raw: &[u8]) -> std::io::Result<Resp> {
    // Interim 1xx responses (100 Continue) come before the real one.
    while raw.starts_with(b"HTTP/1.1 1") {
        match raw.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(end) => raw = &raw[end + 4..],
            None => break,
        }
    }
    let bad = |why: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{why}: {:?}", String::from_utf8_lossy(&raw[..raw.len().min(300)])),
        )
    };
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| bad("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.split(' ');
    if !parts.next().unwrap_or("").starts_with("HTTP/1.") {
        return Err(bad("not an HTTP/1.x status line"));
    }
    let status: u16 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| bad("no status code"))?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))).collect();
    let mut body = raw[head_end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    } else if let Some(len) =
        headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.parse().ok())
    {
        body.truncate(len);
    }
    Ok(Resp { status, headers, body })
}

/// Decodes a chunked transfer-encoded body (a body cut short after its last full chunk is accepted).
pub fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return Some(out);
        };
        let size_text = std::str::from_utf8(&data[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        if data.len() < size {
            out.extend_from_slice(data);
            return Some(out);
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or(&[]);
    }
}

/// Builds a request with `Host`, `Connection: close` and `Content-Length` (when there is a body or the method is
/// POST), plus `headers`.
pub fn build_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a fresh connection; panics when no response comes back.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    exchange(port, build_request(method, path, headers, body))
        .unwrap_or_else(|e| panic!("{method} {path}: no response: {e}"))
}

/// The data payloads of the SSE events in a body (`data: ...` lines), in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.trim_start().to_owned()).collect()
}

/// The Python interpreter that has the packages of crates/cli/tests/py/requirements.txt: `$TF_TEST_PYTHON`, else
/// `<repo>/.venv-test/bin/python`. Panics (the tests never skip) when neither can import `openai`.
pub fn test_python() -> PathBuf {
    let mut tried = Vec::new();
    let candidates = std::env::var_os("TF_TEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::iter::once(tf_testkit::repo_root().join(".venv-test/bin/python")));
    for py in candidates {
        match Command::new(&py).args(["-c", "import openai; print(openai.__version__)"]).output() {
            Ok(out) if out.status.success() => return py,
            Ok(out) => tried.push(format!("{}: {}", py.display(), String::from_utf8_lossy(&out.stderr).trim())),
            Err(e) => tried.push(format!("{}: {e}", py.display())),
        }
    }
    panic!(
        "no Python with the `openai` package: run scripts/test.sh (it creates .venv-test and exports \
         TF_TEST_PYTHON), or set TF_TEST_PYTHON to a python that has crates/cli/tests/py/requirements.txt \
         installed.\ntried:\n{}",
        tried.join("\n")
    );
}

/// Runs `crates/cli/tests/py/SCRIPT --base-url <server>/v1 --model MODEL ARGS...` with [`test_python`], echoes
/// its output, and asserts that it exits 0 after printing "ALL OK" (the server's output is in the failure).
pub fn run_python(server: &Server, script: &str, model: &str, args: &[&str]) {
    let path = tf_testkit::repo_root().join("crates/cli/tests/py").join(script);
    let started = Instant::now();
    let out = Command::new(test_python())
        .arg(&path)
        .args(["--base-url", &format!("{}/v1", server.base()), "--model", model])
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        // The SDKs read these; the scripts pass their own.
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .env_remove("ANTHROPIC_BASE_URL")
        .output()
        .expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- {script} {args:?} ({:.1} s)\n{stdout}", started.elapsed().as_secs_f64());
    if !stderr.is_empty() {
        println!("--- python stderr\n{stderr}");
    }
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "{script} {args:?} failed ({}):\n{stdout}\n{stderr}\n--- server output\n{}",
        out.status,
        server.output()
    );
}
