//! `Model::weight_bytes_per_token` against a count made from the checkpoint's tensor list: every matrix as
//! stored, every vector (norms, biases: uploaded as f32) at 4 bytes an element, the embedding table one row
//! unless the checkpoint has no output head (then the table is the head, read whole, plus the row).

use tf_core::{Precision, WeightSource};
use tf_loader::safetensors::SafetensorsModel;
use tf_models::Model;

use crate::common::hf_model;

fn from_file(st: &SafetensorsModel) -> u64 {
    let embed = "model.embed_tokens.weight";
    let tied = st.info("lm_head.weight").is_none();
    st.tensors()
        .iter()
        .map(|t| match t.shape.len() {
            1 => 4 * t.numel(),
            _ if t.name == embed => t.nbytes() / t.shape[0] + if tied { t.nbytes() } else { 0 },
            _ => t.nbytes(),
        })
        .sum()
}

#[test]
fn weight_bytes_per_token_counts_the_head_and_one_embedding_row() {
    let be = tf_backend_cpu::CpuBackend::new(2, Precision::Full);
    for family in ["llama", "llama3", "qwen2", "qwen3", "gemma3"] {
        let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
        let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let model: Box<dyn Model> = hf_model(&be, &dir);
        let total: u64 = st.tensors().iter().map(|t| t.nbytes()).sum();
        let want = from_file(&st);
        assert_eq!(model.weight_bytes_per_token(), want, "{family}");
        // An untied table is most of what a step does not read; a tied one is read whole.
        let table = st.info("model.embed_tokens.weight").expect("an embedding table").nbytes();
        if st.info("lm_head.weight").is_some() {
            assert!(want < total - table + table / 10, "{family}: {want} of {total}");
        } else {
            assert!(want > table, "{family}: {want}, table {table}");
        }
    }
}

/// gpt-oss (every layer sparse): the dense tensors as above, plus `used` of the `E` experts of every layer, each
/// expert's share of the stacked `mlp.experts.*` tensors (f32 here, so uploaded as stored) with its biases.
#[test]
fn gpt_oss_weight_bytes_per_token_counts_the_used_experts() {
    let be = tf_backend_cpu::CpuBackend::new(2, Precision::Full);
    let dir = tf_testkit::repo_root().join("fixtures/tiny/gpt_oss");
    let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let (used, experts) = (cfg["num_experts_per_tok"].as_u64().unwrap(), cfg["num_local_experts"].as_u64().unwrap());
    let (mut dense, mut stacked) = (0u64, 0u64);
    for t in st.tensors() {
        if t.name.contains(".mlp.experts.") {
            stacked += t.nbytes();
        } else if t.shape.len() == 1 || t.name.ends_with(".sinks") {
            dense += 4 * t.numel();
        } else if t.name == "model.embed_tokens.weight" {
            dense += t.nbytes() / t.shape[0];
        } else {
            dense += t.nbytes();
        }
    }
    let model: Box<dyn Model> = hf_model(&be, &dir);
    assert_eq!(model.weight_bytes_per_token(), dense + stacked / experts * used);
}
