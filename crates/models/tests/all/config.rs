//! `ModelConfig` from both formats (real hub configs and the real GGUF files), family dispatch, and load errors
//! that name the tensor at fault.

use crate::naive::Naive;
use std::path::Path;
use tf_core::{ConfigFormat, RopeScaling, RopeStyle, TensorInfo, WeightSource, WeightsError};
use tf_loader::gguf::GgufFile;
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;
use tf_models::{family_for_config, load_model, ModelConfig};

fn hf(name: &str) -> HfConfig {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../loader/tests/fixtures/hf").join(name);
    HfConfig::from_file(p).unwrap()
}

fn model_config(cfg: &dyn tf_core::ConfigView) -> ModelConfig {
    ModelConfig::from_view(cfg, family_for_config(cfg).unwrap()).unwrap()
}

/// Gemma 3 270M the same whichever format it comes in (except the RoPE style and format tag).
fn check_gemma3_270m(c: &ModelConfig) {
    assert_eq!(c.family, "gemma3");
    assert_eq!((c.hidden, c.ffn, c.layers, c.heads, c.kv_heads, c.head_dim), (640, 2048, 18, 4, 1, 256));
    assert_eq!(c.vocab, Some(262_144));
    assert_eq!(c.context, 32_768);
    let globals: Vec<usize> = (0..18).filter(|&l| c.windows[l].is_none()).collect();
    assert_eq!(globals, [5, 11, 17]);
    assert!(c.windows.iter().flatten().all(|&w| w == 512));
    assert_eq!((c.rope.theta, c.rope_for(0).theta, c.rope_for(5).theta), (1e6, 1e4, 1e6));
    assert_eq!(c.rope.style, RopeStyle::Neox);
    assert_eq!(c.attn_scale, 1.0 / 16.0);
    assert!(c.qk_norm && !c.qkv_bias);
    assert_eq!(c.eps, 1e-6);
}

#[test]
fn gemma3_270m_hf_and_gguf() {
    let c = model_config(&hf("gemma3-270m-it.config.json"));
    assert_eq!(c.format, ConfigFormat::HfConfig);
    check_gemma3_270m(&c);
    check_gemma3_270m(&model_config(&hf("gemma3-270m-it.v5.config.json")));
    let file = GgufFile::open(tf_testkit::model_path("gemma3")).unwrap();
    let c = model_config(&file);
    assert_eq!(c.format, ConfigFormat::Gguf);
    check_gemma3_270m(&c);
}

#[test]
fn gemma3_4b_scaling_on_global_layers_only() {
    for name in ["gemma3-4b-it.config.json", "gemma3-4b-it.v5.config.json"] {
        let c = model_config(&hf(name));
        assert_eq!(c.family, "gemma3");
        assert_eq!(c.layers, 34);
        assert_eq!(c.rope.scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!(c.rope_for(0).scaling, RopeScaling::None);
        assert_eq!(c.rope_for(5).scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!(c.windows[0], Some(1024));
    }
}

#[test]
fn llama_and_qwen_configs() {
    let c = model_config(&hf("llama3.2-1b-instruct.config.json"));
    assert_eq!((c.family, c.rope.style, c.qkv_bias, c.qk_norm), ("llama", RopeStyle::Neox, false, false));
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 }
    );
    assert!(c.windows.iter().all(Option::is_none));
    let c = model_config(&hf("qwen2.5-0.5b-instruct.config.json"));
    assert_eq!((c.family, c.rope.style, c.qkv_bias, c.qk_norm), ("qwen2", RopeStyle::Neox, true, false));
    assert!(c.windows.iter().all(Option::is_none), "use_sliding_window is false");

    let file = GgufFile::open(tf_testkit::model_path("smollm2")).unwrap();
    let c = model_config(&file);
    assert_eq!((c.family, c.rope.style), ("llama", RopeStyle::Normal), "GGUF llama Q/K are permuted");
    assert_eq!((c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab), (576, 30, 9, 3, 64, Some(49152)));
    assert_eq!(c.rope.theta, 100_000.0);
    let file = GgufFile::open(tf_testkit::model_path("qwen05")).unwrap();
    let c = model_config(&file);
    assert_eq!((c.family, c.rope.style, c.qkv_bias), ("qwen2", RopeStyle::Neox, true));
    assert_eq!((c.hidden, c.ffn, c.layers, c.heads, c.kv_heads, c.vocab), (896, 4864, 24, 14, 2, Some(151_936)));
}

#[test]
fn unknown_architecture_is_named() {
    let c = HfConfig::from_json_str(
        r#"{"model_type": "bert", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100}"#,
        "bert.json",
    )
    .unwrap();
    let e = family_for_config(&c).unwrap_err().to_string();
    assert!(e.contains("\"bert\"") && e.contains("gemma3"), "{e}");
}

/// Found by fuzzing (`fuzz/`, target `gguf`): a tiny GGUF file declaring 11,010 layers (up to 2^28 passed) made
/// reading its config allocate a per-layer table of that size before any tensor was looked up. GGUF metadata is
/// now held to `config.json`'s bound of 1024 layers.
#[test]
fn absurd_layer_counts_are_refused_before_allocating() {
    use tf_loader::gguf::GgufValue;
    let header = |layers: u32| {
        let bytes = tf_loader::gguf_writer::GgufWriter::new()
            .kv("general.architecture", GgufValue::String("llama".into()))
            .kv("llama.block_count", GgufValue::U32(layers))
            .kv("llama.embedding_length", GgufValue::U32(8))
            .kv("llama.feed_forward_length", GgufValue::U32(16))
            .kv("llama.attention.head_count", GgufValue::U32(2))
            .to_bytes();
        tf_loader::gguf::parse_header(&bytes, "c.gguf").unwrap()
    };
    for layers in [1025, 11_010, 1 << 28] {
        let md = header(layers).metadata;
        let e = ModelConfig::from_view(&md, family_for_config(&md).unwrap()).unwrap_err().to_string();
        assert!(e.contains(&format!("llama.block_count = {layers} is more than 1024 layers")), "{e}");
    }
    assert_eq!(model_config(&header(1024).metadata).layers, 1024);
}

/// A source that hides one tensor or reports a wrong shape for it.
struct Tampered {
    inner: SafetensorsModel,
    infos: Vec<TensorInfo>,
}

impl WeightSource for Tampered {
    fn format(&self) -> &str {
        "safetensors"
    }
    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }
    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        self.inner.bytes(name)
    }
}

fn tampered(f: impl Fn(&mut Vec<TensorInfo>)) -> String {
    tampered_in("qwen3", f)
}

/// The load error of the tiny `family` checkpoint with its tensor list changed by `f`.
fn tampered_in(family: &str, f: impl Fn(&mut Vec<TensorInfo>)) -> String {
    let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
    let inner = SafetensorsModel::open_dir(&dir).unwrap();
    let mut infos = inner.tensors().to_vec();
    f(&mut infos);
    let src = Tampered { inner, infos };
    let cfg = HfConfig::from_dir(&dir).unwrap();
    match load_model(&Naive, &src, &cfg) {
        Ok(_) => panic!("a tampered checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn load_errors_name_the_tensor() {
    let e = tampered(|t| t.retain(|i| i.name != "model.layers.1.self_attn.k_norm.weight"));
    assert!(e.contains("\"model.layers.1.self_attn.k_norm.weight\"") && e.contains("missing"), "{e}");
    let e = tampered(|t| {
        let i = t.iter_mut().find(|i| i.name == "model.layers.0.mlp.up_proj.weight").unwrap();
        i.shape.reverse();
    });
    assert!(e.contains("\"model.layers.0.mlp.up_proj.weight\"") && e.contains("shape [64, 96]"), "{e}");
    let e = tampered(|t| t.retain(|i| i.name != "lm_head.weight"));
    assert!(e.contains("\"lm_head.weight\"") && e.contains("tie_word_embeddings is false"), "{e}");
}

/// gpt-oss's released safetensors hold MXFP4 experts (`gate_up_proj_blocks` / `_scales`): refused by name. Missing
/// sinks are named like any missing tensor.
#[test]
fn gpt_oss_mxfp4_experts_and_missing_sinks_are_named() {
    let e = tampered_in("gpt_oss", |t| {
        let i = t.iter_mut().find(|i| i.name == "model.layers.0.mlp.experts.gate_up_proj").unwrap();
        i.name = "model.layers.0.mlp.experts.gate_up_proj_blocks".into();
    });
    assert!(e.contains("gate_up_proj_blocks") && e.contains("MXFP4"), "{e}");
    let e = tampered_in("gpt_oss", |t| t.retain(|i| i.name != "model.layers.2.self_attn.sinks"));
    assert!(e.contains("model.layers.2.self_attn.sinks") && e.contains("missing"), "{e}");
}
