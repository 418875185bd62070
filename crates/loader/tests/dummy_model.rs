//! Dummy weights through the real model loader on the CPU: a tiny config.json in a temporary directory loads as
//! a model, a forward over a short causal sequence gives finite logits, the same seed gives the same logits bit
//! for bit and another seed different ones.

use tf_backend_cpu::CpuBackend;
use tf_core::{AttnMeta, Backend, DType, Precision, RowAttn};
use tf_loader::dummy::{config_dtype, DummyWeights};
use tf_loader::hf_config::HfConfig;
use tf_models::{load_model, Batch};

const BLOCK: usize = 16;

/// A tiny Qwen2-shaped config.json written to a temporary directory, read back as a user's would be.
fn config(dir: &std::path::Path) -> HfConfig {
    let json = r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 320, "tie_word_embeddings": false, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "hidden_act": "silu", "torch_dtype": "bfloat16"}"#;
    std::fs::write(dir.join("config.json"), json).unwrap();
    HfConfig::from_dir(dir).unwrap()
}

/// `n` causal rows of one sequence in block 0 (tokens `37·i mod 320`), every row's logits wanted.
fn causal_batch(n: u32, states: Vec<tf_core::StateIo>) -> Batch {
    Batch {
        tokens: (0..n).map(|i| i * 37 % 320).collect(),
        positions: (0..n).collect(),
        slots: (0..n).collect(),
        attn: AttnMeta {
            block_tables: vec![vec![0]],
            rows: (0..n).map(|p| RowAttn { pos: p, seq: 0, ctx: p + 1, tree: vec![] }).collect(),
        },
        logit_rows: (0..n as usize).collect(),
        fed: None,
        states,
    }
}

/// Logits of 9 causal rows (all at once) for dummy weights of `seed` in `dtype`.
fn logits(cfg: &HfConfig, dtype: DType, seed: u64) -> Vec<f32> {
    let be = CpuBackend::new(2, Precision::Checkpoint);
    let src = DummyWeights::new(cfg, dtype, seed).unwrap();
    let model = load_model(&be, &src, cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(model.vocab_size(), 320);
    let mut kv = be.alloc_kv(model.kv_spec(1, BLOCK)).unwrap();
    let batch = causal_batch(9, Vec::new());
    be.to_host(&model.forward(&be, &batch, &mut kv))
}

#[test]
fn dummy_weights_load_and_give_finite_reproducible_logits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    assert_eq!(config_dtype(&cfg).unwrap(), DType::BF16);
    for dtype in [DType::BF16, DType::Q8_0] {
        let a = logits(&cfg, dtype, 11);
        assert_eq!(a.len(), 9 * 320);
        assert!(a.iter().all(|v| v.is_finite()), "{dtype}: non-finite logits");
        // Not degenerate: the rows' logits spread.
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi - lo > 1e-3, "{dtype}: logits all equal ({lo}..{hi})");
        let b = logits(&cfg, dtype, 11);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{dtype}: same seed, other bits");
        let c = logits(&cfg, dtype, 12);
        assert!(a.iter().zip(&c).any(|(x, y)| x.to_bits() != y.to_bits()), "{dtype}: the seed changed nothing");
    }
}

/// The hybrid layout (Mamba-2, attention and MLP layers) loads through the real loader and runs with its
/// recurrent state chained over the rows: finite, spread logits, reproducible from the seed, in bf16 and Q8_0. Its
/// attention head size is Nemotron-H's `attention_head_dim` (32), not hidden / heads (16).
#[test]
fn nemotron_h_dummy_weights_load_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let json = r#"{"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 64,
        "intermediate_size": 96, "hybrid_override_pattern": "M*-M", "num_attention_heads": 4,
        "num_key_value_heads": 2, "attention_head_dim": 32, "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 2,
        "ssm_state_size": 8, "conv_kernel": 4, "vocab_size": 320, "max_position_embeddings": 512,
        "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2", "torch_dtype": "bfloat16"}"#;
    std::fs::write(dir.path().join("config.json"), json).unwrap();
    let cfg = HfConfig::from_dir(dir.path()).unwrap();
    let run = |dtype: DType, seed: u64| -> Vec<f32> {
        let be = CpuBackend::new(2, Precision::Checkpoint);
        let src = DummyWeights::new(&cfg, dtype, seed).unwrap();
        let model = load_model(&be, &src, &cfg).unwrap_or_else(|e| panic!("{e}"));
        let mut kv = be.alloc_kv(model.kv_spec(1, BLOCK)).unwrap();
        kv.states = Some(be.alloc_states(model.state_spec().unwrap().with_registers(1)).unwrap());
        // The recurrent state chained over the rows: row 0 from zeros, each later row from the one before it.
        let states = (0..9)
            .map(|r| tf_core::StateIo {
                src: if r == 0 { tf_core::StateSrc::Zero } else { tf_core::StateSrc::Row(r - 1) },
                dst: None,
            })
            .collect();
        let batch = causal_batch(9, states);
        be.to_host(&model.forward(&be, &batch, &mut kv))
    };
    for dtype in [DType::BF16, DType::Q8_0] {
        let a = run(dtype, 3);
        assert!(a.iter().all(|v| v.is_finite()), "{dtype}: non-finite logits");
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi - lo > 1e-3, "{dtype}: logits all equal ({lo}..{hi})");
        assert!(
            a.iter().zip(&run(dtype, 3)).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{dtype}: same seed, other bits"
        );
    }
}
