//! `config.json` / `generation_config.json` parsing on configs in the shape of real hub models (transformers
//! 4.x spelling), the same configs re-saved by transformers 5 (`*.v5.config.json`, see `fixtures/hf/resave_v5.py`),
//! and broken variants.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tf_loader::hf_config::{ConfigError, GenerationConfig, HfConfig, LayerType, RopeScaling, TokenIds};

fn hf(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
}

fn load(name: &str) -> HfConfig {
    HfConfig::from_file(hf(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// The typed fields, without the raw JSON and the file name (which differ between spellings).
fn typed(c: &HfConfig) -> HfConfig {
    HfConfig {
        raw: Value::Null,
        file: String::new(),
        rope_scaling_raw: None,
        layer_types: Some(c.resolved_layer_types()),
        pad_token_id: None,
        ..c.clone()
    }
}

#[test]
fn llama3_2_1b() {
    let c = load("llama3.2-1b-instruct.config.json");
    assert_eq!(c.architectures, ["LlamaForCausalLM"]);
    assert_eq!(c.model_type, "llama");
    assert_eq!(c.outer_model_type, None);
    assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (2048, 8192, 16));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (32, 8, 64));
    assert!(c.head_dim_explicit);
    assert_eq!(c.vocab_size, 128256);
    assert_eq!(c.max_position_embeddings, Some(131072));
    assert_eq!(c.rms_norm_eps, Some(1e-5));
    assert_eq!(c.rope_theta, Some(500000.0));
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        })
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(c.attention_bias, Some(false));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(c.bos_token_id, Some(TokenIds::One(128000)));
    assert_eq!(c.eos_token_id.as_ref().unwrap().to_vec(), [128001, 128008, 128009]);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.resolved_layer_types(), vec![LayerType::Full; 16]);
    assert_eq!(c.hidden_act.as_deref(), Some("silu"));
    assert_eq!(c.get_u64("pretraining_tp"), Some(1));
    let v5 = load("llama3.2-1b-instruct.v5.config.json");
    assert_eq!(typed(&v5), typed(&c));
}

#[test]
fn qwen2_5_0_5b() {
    let c = load("qwen2.5-0.5b-instruct.config.json");
    assert_eq!(c.model_type, "qwen2");
    assert_eq!((c.num_attention_heads, c.num_key_value_heads), (14, 2));
    assert_eq!(c.head_dim, 64);
    assert!(!c.head_dim_explicit);
    assert_eq!(c.sliding_window, None, "use_sliding_window: false disables the window");
    assert_eq!(c.attention_bias, None);
    assert_eq!(c.rope_theta, Some(1e6));
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.eos_token_id, Some(TokenIds::One(151645)));
    // With the window switched on, layers from max_window_layers (21) on slide.
    let on = HfConfig::from_json_str(
        &std::fs::read_to_string(hf("qwen2.5-0.5b-instruct.config.json"))
            .unwrap()
            .replace("\"use_sliding_window\": false", "\"use_sliding_window\": true"),
        "qwen",
    )
    .unwrap();
    assert_eq!(on.sliding_window, Some(32768));
    let types = on.resolved_layer_types();
    assert_eq!((types[20], types[21], types.len()), (LayerType::Full, LayerType::Sliding, 24));
    let v5 = load("qwen2.5-0.5b-instruct.v5.config.json");
    assert_eq!(v5.rope_scaling, None, "rope_type default is no scaling");
    assert_eq!(typed(&v5), typed(&c));
}

#[test]
fn gemma3_270m_text() {
    let c = load("gemma3-270m-it.config.json");
    assert_eq!(c.model_type, "gemma3_text");
    assert_eq!((c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim), (640, 4, 1, 256));
    assert_eq!(c.sliding_window, Some(512));
    assert_eq!(c.sliding_window_pattern, Some(6));
    assert_eq!(c.rope_theta, Some(1e6));
    assert_eq!(c.rope_local_base_freq, Some(1e4));
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.hidden_act.as_deref(), Some("gelu_pytorch_tanh"));
    assert_eq!(c.pad_token_id, Some(TokenIds::One(0)));
    let types = c.layer_types.clone().unwrap();
    assert_eq!(types.len(), 18);
    for (i, t) in types.iter().enumerate() {
        assert_eq!(*t == LayerType::Full, (i + 1) % 6 == 0, "layer {i}");
    }
    assert_eq!(c.get_f64("query_pre_attn_scalar"), Some(256.0));
    assert_eq!(c.get("final_logit_softcapping"), None);
    let v5 = load("gemma3-270m-it.v5.config.json");
    assert_eq!(typed(&v5), typed(&c));
}

#[test]
fn gemma3_4b_multimodal_reads_text_config_with_defaults() {
    let c = load("gemma3-4b-it.config.json");
    assert_eq!(c.architectures, ["Gemma3ForConditionalGeneration"]);
    assert_eq!(c.model_type, "gemma3_text");
    assert_eq!(c.outer_model_type.as_deref(), Some("gemma3"));
    assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (2560, 10240, 34));
    // Omitted in the file; Gemma3TextConfig's defaults (transformers writes them in the v5 file).
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (8, 4, 256));
    assert_eq!(c.vocab_size, 262208);
    assert_eq!(c.rms_norm_eps, Some(1e-6));
    assert_eq!(c.max_position_embeddings, Some(131072));
    assert_eq!(c.rope_theta, Some(1e6));
    assert_eq!(c.rope_local_base_freq, Some(1e4));
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.sliding_window, Some(1024));
    // From the top level.
    assert_eq!(c.eos_token_id, Some(TokenIds::Many(vec![1, 106])));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    let types = c.resolved_layer_types();
    assert_eq!(types.len(), 34);
    assert_eq!(types.iter().filter(|t| **t == LayerType::Full).count(), 5);
    assert_eq!(types[5], LayerType::Full);
    assert_eq!(c.text_json()["sliding_window"], 1024);
    let v5 = load("gemma3-4b-it.v5.config.json");
    assert_eq!(typed(&v5), typed(&c));
}

#[test]
fn generation_configs() {
    let g = GenerationConfig::from_file(hf("qwen2.5-0.5b-instruct.generation_config.json")).unwrap();
    assert_eq!(g.temperature, Some(0.7));
    assert_eq!(g.top_p, Some(0.8));
    assert_eq!(g.top_k, Some(20));
    assert_eq!(g.repetition_penalty, Some(1.1));
    assert_eq!(g.do_sample, Some(true));
    assert_eq!(g.eos_token_id, Some(TokenIds::Many(vec![151645, 151643])));
    assert_eq!(g.pad_token_id.as_ref().and_then(TokenIds::first), Some(151643));
    assert_eq!(g.min_p, None);
    let g = GenerationConfig::from_file(hf("llama3.2-1b-instruct.generation_config.json")).unwrap();
    assert_eq!((g.temperature, g.top_p, g.top_k), (Some(0.6), Some(0.9), None));
    let g = GenerationConfig::from_file(hf("gemma3-4b-it.generation_config.json")).unwrap();
    assert_eq!((g.top_k, g.top_p), (Some(64), Some(0.95)));
    assert_eq!(g.raw["cache_implementation"], "hybrid");
    let g =
        GenerationConfig::from_json_str(r#"{"max_new_tokens": 256, "max_length": 4096, "min_p": 0.05}"#, "g").unwrap();
    assert_eq!((g.max_new_tokens, g.max_length, g.min_p), (Some(256), Some(4096), Some(0.05)));
}

#[test]
fn checkpoint_dir_configs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/st_sharded");
    let c = HfConfig::from_dir(&dir).unwrap();
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.vocab_size, c.head_dim), (16, 2, 32, 4));
    let g = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    assert_eq!(g.top_k, Some(20));
    assert_eq!(GenerationConfig::from_dir(dir.join("nope")).unwrap(), None);
}

fn llama() -> Value {
    serde_json::from_str(&std::fs::read_to_string(hf("llama3.2-1b-instruct.config.json")).unwrap()).unwrap()
}

fn with(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Result<HfConfig, ConfigError> {
    let mut v = llama();
    edit(v.as_object_mut().unwrap());
    HfConfig::from_value(v, "edited/config.json")
}

fn fails(edit: impl FnOnce(&mut serde_json::Map<String, Value>), field: &str, problem: &str) {
    let e = with(edit).expect_err(field);
    assert_eq!(e.file, "edited/config.json");
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    assert!(e.problem.contains(problem), "{e}");
}

#[test]
fn absurd_values_are_refused() {
    fails(|m| drop(m.remove("hidden_size")), "hidden_size", "missing");
    fails(|m| drop(m.insert("num_hidden_layers".into(), json!(0))), "num_hidden_layers", "out of range");
    fails(|m| drop(m.insert("num_hidden_layers".into(), json!(1u64 << 40))), "num_hidden_layers", "out of range");
    fails(|m| drop(m.insert("num_attention_heads".into(), json!(100000))), "num_attention_heads", "out of range");
    fails(|m| drop(m.insert("num_attention_heads".into(), json!(-4))), "num_attention_heads", "non-negative integer");
    fails(|m| drop(m.insert("num_key_value_heads".into(), json!(5))), "num_key_value_heads", "does not divide");
    fails(|m| drop(m.insert("vocab_size".into(), json!("128256"))), "vocab_size", "non-negative integer");
    fails(|m| drop(m.insert("vocab_size".into(), json!(1u64 << 40))), "vocab_size", "out of range");
    fails(|m| drop(m.insert("rms_norm_eps".into(), json!(0.0))), "rms_norm_eps", "out of range");
    fails(|m| drop(m.insert("rope_theta".into(), json!(-1.0))), "rope_theta", "out of range");
    fails(|m| drop(m.insert("eos_token_id".into(), json!("</s>"))), "eos_token_id", "token id");
    fails(|m| drop(m.insert("eos_token_id".into(), json!([1, -2]))), "eos_token_id", "token id");
    fails(|m| drop(m.insert("tie_word_embeddings".into(), json!("yes"))), "tie_word_embeddings", "true or false");
    fails(|m| drop(m.insert("layer_types".into(), json!(["full_attention"]))), "layer_types", "entries");
    fails(
        |m| {
            m.remove("head_dim");
            m.insert("hidden_size".into(), json!(2000));
            m.insert("num_attention_heads".into(), json!(24));
            m.insert("num_key_value_heads".into(), json!(8));
        },
        "hidden_size",
        "not divisible",
    );
    fails(
        |m| drop(m["rope_scaling"].as_object_mut().unwrap().remove("low_freq_factor")),
        "rope_scaling.low_freq_factor",
        "required",
    );
    fails(|m| drop(m.insert("rope_scaling".into(), json!({"rope_type": "linear"}))), "rope_scaling.factor", "required");
    fails(|m| drop(m.insert("rope_scaling".into(), json!({"factor": 2.0}))), "rope_scaling", "rope_type");
    fails(
        |m| drop(m.insert("rope_scaling".into(), json!({"type": "linear", "factor": -2.0}))),
        "rope_scaling.factor",
        "out of range",
    );
    fails(|m| drop(m.remove("model_type")), "model_type", "missing");
    // Without head_dim the head size is derived.
    let c = with(|m| drop(m.remove("head_dim"))).unwrap();
    assert_eq!((c.head_dim, c.head_dim_explicit), (64, false));
    // num_key_value_heads defaults to the head count.
    assert_eq!(with(|m| drop(m.remove("num_key_value_heads"))).unwrap().num_key_value_heads, 32);
}

#[test]
fn rope_scaling_kinds() {
    let rope = |v: Value| with(|m| drop(m.insert("rope_scaling".into(), v))).unwrap().rope_scaling;
    assert_eq!(
        rope(json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})),
        Some(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: Some(32768),
            attention_factor: None,
            beta_fast: None,
            beta_slow: None
        })
    );
    assert_eq!(
        rope(json!({"rope_type": "dynamic", "factor": 2.0})),
        Some(RopeScaling::Dynamic { factor: 2.0, original_max_position_embeddings: None })
    );
    assert_eq!(
        rope(json!({"rope_type": "longrope", "short_factor": [1.0]})),
        Some(RopeScaling::Other { rope_type: "longrope".into() })
    );
    assert_eq!(rope(Value::Null), None);
    let c = with(|m| drop(m.insert("rope_scaling".into(), json!({"rope_type": "linear", "factor": 2.0})))).unwrap();
    assert_eq!(c.rope_scaling_raw.unwrap()["factor"], 2.0);
}

#[test]
fn invalid_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, "{\"hidden_size\": 12,").unwrap();
    let e = HfConfig::from_file(&p).unwrap_err();
    assert!(e.file.ends_with("config.json") && e.problem.contains("invalid JSON"), "{e}");
    std::fs::write(&p, "[1, 2]").unwrap();
    assert!(HfConfig::from_file(&p).unwrap_err().problem.contains("not a JSON object"));
    let e = HfConfig::from_dir(dir.path().join("missing")).unwrap_err();
    assert!(e.problem.contains("cannot open"), "{e}");
    let e = GenerationConfig::from_json_str(r#"{"top_p": 1.5}"#, "generation_config.json").unwrap_err();
    assert_eq!(e.field.as_deref(), Some("top_p"));
    assert!(e.to_string().starts_with("generation_config.json: field \"top_p\""), "{e}");
    assert!(GenerationConfig::from_json_str(r#"{"temperature": -1}"#, "g").is_err());
    assert!(GenerationConfig::from_json_str(r#"{"top_k": 1.5}"#, "g").is_err());
    assert!(GenerationConfig::from_json_str(r#"{"repetition_penalty": 0}"#, "g").is_err());
    assert!(GenerationConfig::from_json_str(r#"{"eos_token_id": [1, "x"]}"#, "g").is_err());
    assert!(GenerationConfig::from_json_str(r#"{"do_sample": 1}"#, "g").is_err());
    assert_eq!(GenerationConfig::from_json_str(r#"{"top_k": null}"#, "g").unwrap().top_k, None);
}
