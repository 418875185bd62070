//! `pull` through hf-hub's real HTTP path against a local stand-in for the hub: the repo-info API and the
//! `resolve/` file endpoint with the headers hf-hub reads (`x-repo-commit`, `etag`, `content-range`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tf_core::WeightSource;
use tf_loader::hub::{parse_repo_spec, pull, PullOptions};
use tf_loader::safetensors::SafetensorsModel;

const SHA: &str = "aaaabbbbccccddddeeeeffff0000111122223333";

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    /// Request path.
    path: String,
    /// The Authorization header, if any.
    auth: Option<String>,
}

/// Serves `files` of repo `repo` at commit `SHA` until the test ends; returns the base URL and the request log.
fn serve(repo: &'static str, files: BTreeMap<String, Vec<u8>>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            let (mut range, mut auth) = (None, None);
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap_or(("", ""));
                match k.to_ascii_lowercase().as_str() {
                    "range" => range = Some(v.trim().to_owned()),
                    "authorization" => auth = Some(v.trim().to_owned()),
                    _ => {}
                }
            }
            log2.lock().unwrap().push(Seen { path: path.clone(), auth });
            let info_path = format!("/api/models/{repo}/revision/main");
            let resolve = format!("/{repo}/resolve/{SHA}/");
            let (status, headers, body): (&str, Vec<String>, Vec<u8>) = if path == info_path {
                let siblings: Vec<String> = files.keys().map(|f| format!("{{\"rfilename\":\"{f}\"}}")).collect();
                let body = format!("{{\"sha\":\"{SHA}\",\"siblings\":[{}]}}", siblings.join(","));
                ("200 OK", vec!["content-type: application/json".into()], body.into_bytes())
            } else if let Some(data) = path.strip_prefix(&resolve).and_then(|f| files.get(f)) {
                let start: usize = range
                    .as_deref()
                    .and_then(|r| r.strip_prefix("bytes="))
                    .and_then(|r| r.split('-').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let end = if range.as_deref() == Some("bytes=0-0") { 1.min(data.len()) } else { data.len() };
                let etag = format!(
                    "{:016x}",
                    data.iter().fold(0xcbf29ce484222325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100000001b3))
                );
                let headers = vec![
                    format!("x-repo-commit: {SHA}"),
                    format!("etag: \"{etag}\""),
                    format!("content-range: bytes {start}-{}/{}", end.max(1) - 1, data.len()),
                ];
                ("206 Partial Content", headers, data[start.min(end)..end].to_vec())
            } else {
                ("404 Not Found", vec![], b"not found".to_vec())
            };
            let mut out = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
            for h in headers {
                out.push_str(&h);
                out.push_str("\r\n");
            }
            out.push_str("\r\n");
            let _ = stream.write_all(out.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    (base, log)
}

fn fixture_repo() -> BTreeMap<String, Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/st_sharded");
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        files.insert(e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap());
    }
    files.insert("README.md".into(), b"# tiny".to_vec());
    files.insert("original/consolidated.00.pth".into(), b"not for us".to_vec());
    files
}

fn downloads(log: &Mutex<Vec<Seen>>) -> Vec<String> {
    log.lock().unwrap().iter().filter(|s| s.path.contains("/resolve/")).map(|s| s.path.clone()).collect()
}

#[test]
fn pull_downloads_a_sharded_checkpoint_into_the_cache() {
    let (base, log) = serve("Org/Tiny", fixture_repo());
    let cache = tempfile::tempdir().unwrap();
    let opts = PullOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        endpoint: Some(base),
        token: Some("hf_secret".into()),
        ..Default::default()
    };
    let spec = parse_repo_spec("Org/Tiny").unwrap();
    let dir = pull(&spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let repo = cache.path().join("models--Org--Tiny");
    assert_eq!(dir, repo.join("snapshots").join(SHA));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), SHA);
    assert_eq!(std::fs::read_dir(repo.join("refs")).unwrap().count(), 1, "only refs/main");
    assert!(std::fs::symlink_metadata(dir.join("config.json")).unwrap().file_type().is_symlink());
    assert!(!dir.join("README.md").exists() && !dir.join("original").exists());
    // The downloaded checkpoint opens and matches the fixture.
    let m = SafetensorsModel::open_dir(&dir).unwrap();
    let orig =
        SafetensorsModel::open_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/st_sharded")).unwrap();
    assert_eq!(m.tensors().len(), orig.tensors().len());
    for t in orig.tensors() {
        assert_eq!(m.bytes(&t.name).unwrap(), orig.bytes(&t.name).unwrap(), "{}", t.name);
    }
    // The token went along.
    assert!(log.lock().unwrap().iter().all(|s| s.auth.as_deref() == Some("Bearer hf_secret")));
    // A second pull lists the repo again but downloads nothing.
    let n = downloads(&log).len();
    assert_eq!(pull(&spec, &opts).unwrap(), dir);
    assert_eq!(downloads(&log).len(), n, "files already cached were fetched again");
}

#[test]
fn pull_picks_one_gguf() {
    let mut files = BTreeMap::new();
    for q in ["Q4_K_M", "Q8_0", "IQ2_XS"] {
        files.insert(format!("tiny-{q}.gguf"), format!("GGUF {q}").into_bytes());
    }
    files.insert("mmproj-F16.gguf".into(), b"projector".to_vec());
    let (base, log) = serve("Org/Tiny-GGUF", files);
    let cache = tempfile::tempdir().unwrap();
    let opts = PullOptions { cache_dir: Some(cache.path().to_path_buf()), endpoint: Some(base), ..Default::default() };
    let got = pull(&parse_repo_spec("Org/Tiny-GGUF").unwrap(), &opts).unwrap();
    assert_eq!(std::fs::read(&got).unwrap(), b"GGUF Q4_K_M");
    let got = pull(&parse_repo_spec("Org/Tiny-GGUF:q8_0").unwrap(), &opts).unwrap();
    assert_eq!(std::fs::read(&got).unwrap(), b"GGUF Q8_0");
    let d = downloads(&log);
    assert!(d.iter().all(|p| !p.contains("mmproj") && !p.contains("IQ2")), "{d:?}");
    let e = pull(&parse_repo_spec("Org/Tiny-GGUF:nope.gguf").unwrap(), &opts).unwrap_err();
    assert!(e.to_string().contains("no file 'nope.gguf'"), "{e}");
}
