//! Every tensor of the four real GGUF models dequantizes to exactly the f32 values the `gguf` Python package
//! produces (fixtures/dequant/<model>.json: SHA-256 of each tensor's f32 little-endian bytes, made by
//! tools/reference). Also checks each tensor's type and GGML dims against the fixture, so the reader's view of
//! the file is checked by an independent reader.

use sha2::{Digest, Sha256};
use tf_core::WeightSource;
use tf_loader::gguf::GgufFile;

fn check_model(short: &str) {
    let path = tf_testkit::model_path(short);
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let fx = tf_testkit::fixture(&format!("dequant/{short}.json"));
    let tensors = fx["tensors"].as_array().expect("fixture 'tensors' list");
    assert_eq!(tensors.len(), g.tensors().len(), "{short}: tensor count");
    let mut mismatches = Vec::new();
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor(name).unwrap_or_else(|| panic!("{short}: tensor {name} missing"));
        assert_eq!(info.info.dtype.name(), t["type"].as_str().unwrap(), "{short}: {name} type");
        let ne: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(info.ne, ne, "{short}: {name} dims");
        let values = tf_loader::tensor_f32(&g, g.path(), name).unwrap_or_else(|e| panic!("{e}"));
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = format!("{:x}", Sha256::digest(&bytes));
        if got != t["sha256"].as_str().unwrap() {
            let sum: f64 = values.iter().map(|&v| v as f64).sum();
            mismatches.push(format!("{name} ({}): sum {sum} vs reference {}", info.info.dtype, t["sum"]));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{short}: {} tensors differ from gguf-py:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn smollm2_matches_gguf_py() {
    check_model("smollm2");
}

#[test]
fn qwen05_matches_gguf_py() {
    check_model("qwen05");
}

#[test]
fn qwen15_matches_gguf_py() {
    check_model("qwen15");
}

#[test]
fn gemma3_matches_gguf_py() {
    check_model("gemma3");
}
