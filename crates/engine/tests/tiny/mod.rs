//! The tiny random checkpoints under `fixtures/tiny/` (made with transformers) on the CPU backend, and a mixed set
//! of requests for them: greedy and seeded sampled, repetitive prompts whose context copies accept and random ones.

use tf_backend_cpu::CpuBackend;
use tf_engine::{GenRequest, SamplingParams};
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{load_model, Model};

/// Loads `fixtures/tiny/<family>`.
pub fn load(be: &CpuBackend, family: &str) -> Box<dyn Model> {
    let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
    let cfg = HfConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let st = SafetensorsModel::open_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    load_model(be, &st, &cfg).unwrap_or_else(|e| panic!("{family}: {e}"))
}

/// Eight requests of 24 tokens: prompts of 5 to 67 tokens, odd ones repetitive; every third greedy, the others
/// sampled with their own seed.
pub fn requests(vocab: u32) -> Vec<GenRequest> {
    (0..8u32)
        .map(|i| {
            let len = [5usize, 31, 12, 60][i as usize % 4] + i as usize;
            let prompt: Vec<u32> = if i % 2 == 1 {
                [9u32, 40, 77, 9, 40].iter().cycle().take(len).copied().collect()
            } else {
                (0..len as u32).map(|j| (j * 37 + i * 11 + 3) % vocab).collect()
            };
            let params = if i % 3 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams { temperature: 0.9, top_k: 20, seed: Some(i as u64), ..SamplingParams::default() }
            };
            GenRequest::new(prompt, params, 24)
        })
        .collect()
}
