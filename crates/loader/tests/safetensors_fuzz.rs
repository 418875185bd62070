//! Mutation fuzzing of the safetensors reader: thousands of corrupted variants of the valid fixtures must each
//! give `Ok` or `Err`, never a panic, and every `Ok` source's tensors must be readable within bounds.
//!
//! The seed is printed; it is fresh each run unless `TF_FUZZ_SEED` is set. `TF_FUZZ_ITERS` sets the number of
//! random mutations (default 4000; the truncation sweep and the header-length cases run in addition).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use tf_core::WeightSource;
use tf_loader::safetensors::{SafetensorsFile, SafetensorsModel};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn seed() -> u64 {
    match std::env::var("TF_FUZZ_SEED") {
        Ok(s) => s.trim().parse().expect("TF_FUZZ_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    }
}

#[global_allocator]
static A: tf_testkit::alloc::Counting = tf_testkit::alloc::Counting;

fn iters() -> usize {
    std::env::var("TF_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(4000)
}

/// Opens `path` and checks every invariant an `Ok` source promises. Returns whether it opened.
fn open_and_check(path: &Path, file_len: usize) -> bool {
    let Ok(st) = SafetensorsFile::open(path) else { return false };
    let mut ranges = Vec::new();
    for t in st.tensors() {
        let bytes = st.bytes(&t.name).expect("listed tensor must be readable");
        assert_eq!(bytes.len() as u64, t.nbytes(), "{}: length", t.name);
        let r = st.file_range(&t.name).unwrap();
        assert!(r.start >= st.data_start() && r.end <= file_len, "{}: {r:?} outside data", t.name);
        assert_eq!(st.info(&t.name), Some(t));
        if !r.is_empty() {
            ranges.push(r);
        }
    }
    ranges.sort_by_key(|r| r.start);
    assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start), "overlapping ranges {ranges:?}");
    true
}

/// Runs one case; on a panic, keeps the file for reproduction and records what happened.
fn run_case(bytes: &[u8], work: &Path, what: &str, failures: &mut Vec<String>, opened: &mut usize) {
    std::fs::write(work, bytes).unwrap();
    let (r, largest) =
        tf_testkit::alloc::largest_allocation(|| catch_unwind(AssertUnwindSafe(|| open_and_check(work, bytes.len()))));
    // serde_json reads the header into a buffer of its own size; nothing may allocate more than the file.
    if largest > bytes.len() + (64 << 10) {
        failures.push(format!("{what}: an allocation of {largest} bytes for a {}-byte file", bytes.len()));
    }
    match r {
        Ok(true) => *opened += 1,
        Ok(false) => {}
        Err(_) => {
            let keep = std::env::temp_dir().join(format!("tf_fuzz_failure_{}.safetensors", failures.len()));
            let _ = std::fs::write(&keep, bytes);
            failures.push(format!("{what} (kept as {})", keep.display()));
        }
    }
}

/// Header JSON and data section of a valid file.
fn split(file: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&file[8..8 + n]).unwrap(), file[8 + n..].to_vec())
}

fn join(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Numbers that stress bounds and overflow checks.
fn nasty_number(rng: &mut StdRng, data_len: u64) -> Value {
    match rng.gen_range(0..12) {
        0 => Value::from(u64::MAX),
        1 => Value::from(u64::MAX - rng.gen_range(0..16)),
        2 => Value::from(1u64 << rng.gen_range(0..64)),
        3 => Value::from(data_len + rng.gen_range(0..4)),
        4 => Value::from(data_len.saturating_sub(rng.gen_range(0..4))),
        5 => Value::from(-(rng.gen_range(1..1000) as i64)),
        6 => Value::from(rng.gen_range(0.0..10.0)),
        7 => Value::from("12"),
        8 => Value::Null,
        9 => Value::from(0),
        _ => Value::from(rng.gen_range(0..=data_len + 8)),
    }
}

/// One structural edit of the header JSON (offsets, shapes, dtypes, entries).
fn mutate_json(rng: &mut StdRng, header: &mut Value, data_len: u64) -> String {
    let obj = header.as_object_mut().unwrap();
    // Only well-formed entries are edited structurally (earlier edits may have broken some).
    let well_formed = |v: &Value| {
        v["shape"].is_array() && v["dtype"].is_string() && v["data_offsets"].as_array().is_some_and(|a| a.len() == 2)
    };
    let names: Vec<String> =
        obj.iter().filter(|(k, v)| *k != "__metadata__" && well_formed(v)).map(|(k, _)| k.clone()).collect();
    if names.is_empty() {
        return "no well-formed entry left".into();
    }
    let name = names[rng.gen_range(0..names.len())].clone();
    let other = names[rng.gen_range(0..names.len())].clone();
    let other_offsets = obj[&other]["data_offsets"].clone();
    let entry = obj.get_mut(&name).unwrap();
    match rng.gen_range(0..10) {
        0 => {
            let i = rng.gen_range(0..2);
            entry["data_offsets"][i] = nasty_number(rng, data_len);
            format!("{name}.data_offsets[{i}] = {}", entry["data_offsets"][i])
        }
        1 => {
            // Overlap with another tensor: same or shifted range.
            let shift = rng.gen_range(0..4u64);
            let at = |v: &Value, i: usize| v[i].as_u64().unwrap_or(0);
            let b = at(&other_offsets, 0).saturating_add(shift);
            let len = at(&entry["data_offsets"], 1).saturating_sub(at(&entry["data_offsets"], 0));
            entry["data_offsets"] = Value::from(vec![b, b.saturating_add(len)]);
            format!("{name} moved onto {other} + {shift}")
        }
        2 => {
            let o = entry["data_offsets"].clone();
            entry["data_offsets"] = Value::from(vec![o[1].clone(), o[0].clone()]);
            format!("{name}.data_offsets swapped")
        }
        3 => {
            let dims = entry["shape"].as_array_mut().unwrap();
            if dims.is_empty() || rng.gen_bool(0.3) {
                dims.push(nasty_number(rng, data_len));
            } else {
                let i = rng.gen_range(0..dims.len());
                dims[i] = nasty_number(rng, data_len);
            }
            format!("{name}.shape = {}", entry["shape"])
        }
        4 => {
            let d = ["F32", "BF16", "F16", "I64", "U8", "F64", "bool", "F8_E4M3", "", "f32", "U64"];
            entry["dtype"] = Value::from(d[rng.gen_range(0..d.len())]);
            format!("{name}.dtype = {}", entry["dtype"])
        }
        5 => {
            let keys = ["dtype", "shape", "data_offsets"];
            let k = keys[rng.gen_range(0..3)];
            entry.as_object_mut().unwrap().remove(k);
            format!("{name}.{k} removed")
        }
        6 => {
            *entry = nasty_number(rng, data_len);
            format!("{name} = {entry}")
        }
        7 => {
            entry["shape"] = Value::from(vec![1u64 << 32, 1u64 << 32, rng.gen_range(1..8u64)]);
            format!("{name}.shape overflowing")
        }
        8 => {
            obj.insert("__metadata__".into(), serde_json::json!({"a": 1}));
            "metadata with a number".into()
        }
        _ => {
            entry["data_offsets"] = Value::from(vec![Value::from(0); rng.gen_range(0..4)]);
            format!("{name}.data_offsets wrong arity")
        }
    }
}

#[test]
fn mutated_files_never_panic() {
    let seed = seed();
    println!("safetensors fuzz seed: {seed} (rerun with TF_FUZZ_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let sources: Vec<Vec<u8>> = [
        "st_single.safetensors",
        "st_sharded/model-00001-of-00002.safetensors",
        "st_sharded/model-00002-of-00002.safetensors",
    ]
    .iter()
    .map(|p| std::fs::read(fixtures().join(p)).unwrap())
    .collect();
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("case.safetensors");
    let (mut failures, mut opened, mut cases) = (Vec::new(), 0usize, 0usize);

    // Every truncation of the single-file fixture, and around the header of the shards.
    for (si, src) in sources.iter().enumerate() {
        let n = u64::from_le_bytes(src[..8].try_into().unwrap()) as usize;
        let lens: Vec<usize> =
            if si == 0 { (0..=src.len()).collect() } else { (0..n + 24).chain([src.len() - 1]).collect() };
        for len in lens {
            run_case(&src[..len], &work, &format!("source {si} truncated to {len}"), &mut failures, &mut opened);
            cases += 1;
        }
    }
    // Header length field set to huge, off-by-one and small values.
    for (si, src) in sources.iter().enumerate() {
        let real = u64::from_le_bytes(src[..8].try_into().unwrap());
        let len = src.len() as u64;
        for v in
            [u64::MAX, u64::MAX - 7, 1 << 63, 1 << 32, 100_000_001, len - 7, len - 8, len, real + 1, real - 1, 0, 1, 2]
        {
            let mut b = src.clone();
            b[..8].copy_from_slice(&v.to_le_bytes());
            run_case(&b, &work, &format!("source {si} header length {v}"), &mut failures, &mut opened);
            cases += 1;
        }
    }
    // Random mutations.
    for it in 0..iters() {
        let si = rng.gen_range(0..sources.len());
        let src = &sources[si];
        let hlen = u64::from_le_bytes(src[..8].try_into().unwrap()) as usize;
        let (bytes, what) = match rng.gen_range(0..6) {
            0 => {
                let mut b = src.clone();
                let flips = rng.gen_range(1..5);
                for _ in 0..flips {
                    let i = rng.gen_range(0..8 + hlen);
                    b[i] ^= rng.gen_range(1..=255u8);
                }
                (b, format!("{flips} header byte flips"))
            }
            1 => {
                let mut b = src.clone();
                let i = rng.gen_range(8..8 + hlen);
                let tokens = b"{}[]\",:0123456789-e.\\ \x00\xff";
                b[i] = tokens[rng.gen_range(0..tokens.len())];
                (b, format!("header byte {i} set to a JSON token"))
            }
            2 => {
                let mut b = src.clone();
                b[..8].copy_from_slice(&rng.gen::<u64>().to_le_bytes());
                (b, "random header length".to_owned())
            }
            3 | 4 => {
                let (mut header, data) = split(src);
                let edits = rng.gen_range(1..4);
                let mut what = Vec::new();
                for _ in 0..edits {
                    what.push(mutate_json(&mut rng, &mut header, data.len() as u64));
                }
                let mut b = join(&header.to_string(), &data);
                if rng.gen_bool(0.2) {
                    let cut = rng.gen_range(0..b.len());
                    b.truncate(cut);
                    what.push(format!("truncated to {cut}"));
                }
                (b, what.join("; "))
            }
            _ => {
                // Text-level splice: duplicate a key, delete or insert a run of header bytes.
                let (header, data) = split(src);
                let mut h = header.to_string();
                let what = match rng.gen_range(0..3) {
                    0 => {
                        let name = header.as_object().unwrap().keys().next_back().unwrap().clone();
                        let dup = format!("\"{name}\":{},", header[&name]);
                        h.insert_str(1, &dup);
                        format!("duplicate key {name}")
                    }
                    1 => {
                        let a = rng.gen_range(0..h.len());
                        let b = (a + rng.gen_range(1..16)).min(h.len());
                        h.replace_range(a..b, "");
                        format!("header bytes {a}..{b} deleted")
                    }
                    _ => {
                        let a = rng.gen_range(0..h.len());
                        h.insert_str(a, ["{", "}", "\"x\":", "[0,1]", "null", "\\u0000", "1e999"][rng.gen_range(0..7)]);
                        format!("token inserted at {a}")
                    }
                };
                let h = h.into_bytes();
                let mut b = (h.len() as u64).to_le_bytes().to_vec();
                b.extend_from_slice(&h);
                b.extend_from_slice(&data);
                (b, what)
            }
        };
        run_case(&bytes, &work, &format!("iter {it}, source {si}: {what}"), &mut failures, &mut opened);
        cases += 1;
    }
    println!("{cases} cases, {opened} opened, {} panicked", failures.len());
    assert!(failures.is_empty(), "seed {seed}: panics on\n{}", failures.join("\n"));
    // The mutations must not all be rejected trivially: the unmutated tails of the sweep open.
    assert!(opened > 0);
}

/// Mutated index files over valid shards: open_dir gives Ok or Err, never a panic.
#[test]
fn mutated_indexes_never_panic() {
    let seed = seed() ^ 0x9e37_79b9_7f4a_7c15;
    println!("index fuzz seed: {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("st_sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let index_path = dir.path().join("model.safetensors.index.json");
    let original: Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let shard_names =
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "missing.safetensors", "..", "", "/"];
    let mut failures = Vec::new();
    for it in 0..iters() / 8 {
        let mut v = original.clone();
        let map = v["weight_map"].as_object_mut().unwrap();
        let keys: Vec<String> = map.keys().cloned().collect();
        let k = keys[rng.gen_range(0..keys.len())].clone();
        let what = match rng.gen_range(0..5) {
            0 => {
                map[&k] = Value::from(shard_names[rng.gen_range(0..shard_names.len())]);
                format!("{k} -> {}", map[&k])
            }
            1 => {
                map.remove(&k);
                format!("{k} removed")
            }
            2 => {
                map.insert(format!("{k}.extra"), Value::from(shard_names[rng.gen_range(0..2)]));
                format!("{k}.extra added")
            }
            3 => {
                map[&k] = Value::from(rng.gen::<u32>());
                format!("{k} -> number")
            }
            _ => {
                v["weight_map"] = Value::from(vec![1, 2]);
                "weight_map not an object".into()
            }
        };
        let mut text = v.to_string();
        if rng.gen_bool(0.1) {
            text.truncate(rng.gen_range(0..text.len()));
        }
        std::fs::write(&index_path, &text).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(m) = SafetensorsModel::open_dir(dir.path()) {
                for t in m.tensors() {
                    assert_eq!(m.bytes(&t.name).unwrap().len() as u64, t.nbytes());
                }
            }
        }));
        if r.is_err() {
            failures.push(format!("iter {it}: {what}"));
        }
    }
    assert!(failures.is_empty(), "seed {seed}: panics on\n{}", failures.join("\n"));
}

/// A tensor name holding control characters (what fuzzing the GGUF reader found, `fuzz/` target `gguf`) is
/// escaped in the error, which stays on one line.
#[test]
fn names_with_control_characters_give_one_line_errors() {
    let header = r#"{"a\nb\u0000": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}"#;
    let file = join(header, &[0]);
    let e = tf_loader::safetensors::parse_header(Path::new("x.safetensors"), &file).unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains(['\n', '\0']), "{msg:?}");
    assert!(msg.contains("tensor 'a\\nb\\u{0}'"), "{msg:?}");
}
