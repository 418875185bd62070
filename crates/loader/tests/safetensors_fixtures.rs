//! The safetensors reader against files written by the Python `safetensors` package (see
//! `fixtures/make_safetensors.py`): bytes and decoded values must equal what numpy wrote, and broken
//! checkpoint directories must give errors naming the file, the tensor and the problem.

use half::{bf16, f16};
use serde_json::Value;
use std::path::{Path, PathBuf};
use tf_core::{DType, WeightSource};
use tf_loader::safetensors::{SafetensorsFile, SafetensorsModel};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected(name: &str) -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    match serde_json::from_str(&text).unwrap() {
        Value::Object(m) => m,
        _ => panic!("{name} is not an object"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes element `i` of `bytes` as a float (f64) or integer (as i128 in a string) per dtype.
fn decode(dtype: DType, bytes: &[u8], i: usize) -> Result<f64, i128> {
    let at = |n: usize| &bytes[i * n..(i + 1) * n];
    match dtype {
        DType::F32 => Ok(f32::from_le_bytes(at(4).try_into().unwrap()) as f64),
        DType::F16 => Ok(f16::from_bits(u16::from_le_bytes(at(2).try_into().unwrap())).to_f64()),
        DType::BF16 => Ok(bf16::from_bits(u16::from_le_bytes(at(2).try_into().unwrap())).to_f64()),
        DType::F64 => Ok(f64::from_le_bytes(at(8).try_into().unwrap())),
        DType::I64 => Err(i64::from_le_bytes(at(8).try_into().unwrap()) as i128),
        DType::I32 => Err(i32::from_le_bytes(at(4).try_into().unwrap()) as i128),
        DType::U8 => Err(at(1)[0] as i128),
        d => panic!("no decoder for {d}"),
    }
}

/// Checks every tensor of `src` against the expected JSON: dtype, shape, raw bytes, and values.
fn check_against(src: &dyn WeightSource, exp: &serde_json::Map<String, Value>) {
    assert_eq!(src.tensors().len(), exp.len(), "tensor count");
    for (name, e) in exp {
        let info = src.info(name).unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(info.dtype.name(), e["dtype"].as_str().unwrap(), "{name} dtype");
        let shape: Vec<u64> = e["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(info.shape, shape, "{name} shape");
        let bytes = src.bytes(name).unwrap();
        assert_eq!(bytes.len() as u64, info.nbytes(), "{name} length");
        assert_eq!(hex(bytes), e["hex"].as_str().unwrap(), "{name} bytes");
        for (i, v) in e["values"].as_array().unwrap().iter().enumerate() {
            let want = v.as_str().unwrap();
            match decode(info.dtype, bytes, i) {
                Ok(got) => {
                    let want: f64 = want.parse().unwrap();
                    assert_eq!(got.to_bits(), want.to_bits(), "{name}[{i}]: got {got}, numpy wrote {want}");
                }
                Err(got) => assert_eq!(got.to_string(), want, "{name}[{i}]"),
            }
        }
    }
}

#[test]
fn single_file_matches_numpy() {
    let st = SafetensorsFile::open(fixtures().join("st_single.safetensors")).unwrap();
    assert_eq!(st.format(), "safetensors");
    check_against(&st, &expected("st_single.expected.json"));
    assert_eq!(st.metadata().get("format").map(String::as_str), Some("pt"));
    // File order is data order; the writer sorts by alignment, so I64 comes first.
    assert_eq!(st.tensors()[0].name, "positions");
    let starts: Vec<usize> = st.tensors().iter().map(|t| st.file_range(&t.name).unwrap().start).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
    // Zero-dim and zero-size tensors.
    assert_eq!(st.info("scalar").unwrap().shape, Vec::<u64>::new());
    assert_eq!(st.bytes("scalar").unwrap(), &3.5f32.to_le_bytes());
    assert_eq!(st.bytes("empty").unwrap().len(), 0);
    // Special f16 values survived.
    let f = st.bytes("layer.f16").unwrap();
    let v: Vec<f16> = f.chunks(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect();
    assert!(v[1].is_sign_negative() && v[1] == f16::ZERO);
    assert_eq!(v[4], f16::MAX);
    assert!(v[6].is_infinite() && v[7].is_infinite() && v[7].is_sign_negative());
    assert!(!v[8].is_normal() && v[8] != f16::ZERO);
    let e = st.bytes("nope").unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("nope"));
}

#[test]
fn single_file_through_open_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixtures().join("st_single.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let m = SafetensorsModel::open_dir(dir.path()).unwrap();
    assert_eq!(m.shards().len(), 1);
    check_against(&m, &expected("st_single.expected.json"));
}

#[test]
fn sharded_checkpoint_matches_numpy() {
    let dir = fixtures().join("st_sharded");
    let m = SafetensorsModel::open_dir(&dir).unwrap();
    assert_eq!(m.shards().len(), 2);
    check_against(&m, &expected("st_sharded.expected.json"));
    assert!(m.shard_of("model.embed_tokens.weight").unwrap().path().ends_with("model-00001-of-00002.safetensors"));
    assert!(m
        .shard_of("model.layers.1.mlp.up_proj.weight")
        .unwrap()
        .path()
        .ends_with("model-00002-of-00002.safetensors"));
    let total: u64 = m.tensors().iter().map(|t| t.nbytes()).sum();
    assert_eq!(m.index_metadata().unwrap()["total_size"].as_u64(), Some(total));
    assert_eq!(m.info("model.layers.0.self_attn.k_proj.weight").unwrap().shape, vec![8, 16]);
    // Names are unique across the model.
    let mut names: Vec<&str> = m.tensors().iter().map(|t| t.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), m.tensors().len());
}

/// A copy of the sharded fixture in a temp dir, for breaking.
fn sharded_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("st_sharded")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

fn edit_index(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn missing_shard_is_named() {
    let dir = sharded_copy();
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert!(e.file.ends_with("model.safetensors.index.json"), "{e}");
    assert!(e.problem.contains("model-00002-of-00002.safetensors") && e.problem.contains("missing"), "{e}");
    assert!(e.tensor.is_some());
}

#[test]
fn index_naming_a_tensor_the_shard_lacks() {
    let dir = sharded_copy();
    edit_index(dir.path(), |m| {
        m.insert("lm_head.weight".into(), "model-00001-of-00002.safetensors".into());
    });
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("lm_head.weight"), "{e}");
    assert!(e.problem.contains("does not contain"), "{e}");
}

#[test]
fn index_placing_a_tensor_in_the_wrong_shard() {
    let dir = sharded_copy();
    edit_index(dir.path(), |m| {
        m.insert("model.norm.weight".into(), "model-00001-of-00002.safetensors".into());
    });
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("model.norm.weight"), "{e}");
}

/// Writes a minimal safetensors file of F32 tensors of one element each.
fn write_f32_file(path: &Path, names: &[&str]) {
    let entries: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("\"{n}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}", 4 * i, 4 * i + 4))
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(names.iter().enumerate().flat_map(|(i, _)| (i as f32).to_le_bytes()));
    std::fs::write(path, out).unwrap();
}

#[test]
fn duplicate_tensor_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    write_f32_file(&dir.path().join("a.safetensors"), &["x", "shared"]);
    write_f32_file(&dir.path().join("b.safetensors"), &["shared", "y"]);
    let index = r#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#;
    std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert_eq!(e.tensor.as_deref(), Some("shared"), "{e}");
    assert!(e.file.ends_with("b.safetensors") && e.problem.contains("also appears in shard"), "{e}");
    assert!(e.problem.contains("a.safetensors"), "{e}");
    // Without the duplicate, tensors the index does not list are still served.
    write_f32_file(&dir.path().join("b.safetensors"), &["z", "y"]);
    let m = SafetensorsModel::open_dir(dir.path()).unwrap();
    assert_eq!(m.tensors().len(), 4);
    assert_eq!(m.bytes("y").unwrap(), &1f32.to_le_bytes());
}

#[test]
fn hostile_index_entries() {
    for (shard, want) in [
        (Value::from("../model-00001-of-00002.safetensors"), "plain relative path"),
        (Value::from("/etc/passwd"), "plain relative path"),
        (Value::from(7), "not a file name"),
    ] {
        let dir = sharded_copy();
        edit_index(dir.path(), |m| {
            m.insert("model.norm.weight".into(), shard.clone());
        });
        let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
        assert!(e.problem.contains(want), "{shard}: {e}");
    }
    let dir = sharded_copy();
    edit_index(dir.path(), |m| m.clear());
    assert!(SafetensorsModel::open_dir(dir.path()).unwrap_err().problem.contains("empty"));
    std::fs::write(dir.path().join("model.safetensors.index.json"), "{\"weight_map\": ").unwrap();
    assert!(SafetensorsModel::open_dir(dir.path()).unwrap_err().problem.contains("not valid JSON"));
}

#[test]
fn corrupt_shard_is_named() {
    let dir = sharded_copy();
    let p = dir.path().join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1).unwrap();
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert!(e.file.ends_with("model-00002-of-00002.safetensors"), "{e}");
    assert!(e.tensor.is_some() && e.problem.contains("past the data section"), "{e}");
}

#[test]
fn empty_dir_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert!(e.problem.contains("model.safetensors.index.json") && e.problem.contains("no .safetensors"), "{e}");
    std::fs::copy(fixtures().join("st_single.safetensors"), dir.path().join("weights.safetensors")).unwrap();
    let e = SafetensorsModel::open_dir(dir.path()).unwrap_err();
    assert!(e.problem.contains("weights.safetensors"), "{e}");
}
