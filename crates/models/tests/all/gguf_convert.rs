//! The GGUF path on exact goldens: each tiny HF checkpoint is converted to GGUF the way llama.cpp's
//! `convert_hf_to_gguf.py` does (tensor names, Q/K rows permuted for `llama`, each layer's experts stacked into one
//! `[E, out, in]` tensor per projection, Gemma norms stored as `1 + w`, Llama 3
//! RoPE scaling as a `rope_freqs` tensor, `{arch}.*` metadata) and loaded through `GgufFile`. Its logits must match
//! transformers' like the HF load does; where the conversion changes no arithmetic (qwen2, qwen3, qwen3moe, gemma3) they must
//! equal the HF load's bit for bit (gpt_oss too: its experts are split and transposed, which moves no value).
//! Mistral converts as `llama` with a sliding window key. nemotron_h (Mamba-2 layers with a recurrent state) has
//! its own converter below and runs with states chained through registers; its GGUF load equals the HF load bit
//! for bit.

use crate::common::{argmax, first_bit_difference, hf_model, run_chunked, run_with_states};
use tf_backend_cpu::CpuBackend;
use tf_core::{DType, Precision, WeightSource};
use tf_loader::gguf::{GgufArray, GgufFile, GgufValue};
use tf_loader::gguf_writer::GgufWriter;
use tf_loader::hf_config::{HfConfig, LayerType, RopeScaling as HfScaling};
use tf_loader::safetensors::SafetensorsModel;
use tf_models::load_model;

/// llama.cpp's name for a transformers tensor name of `arch`.
fn gguf_name(arch: &str, hf: &str) -> String {
    let (stem, suffix) = hf.rsplit_once('.').unwrap();
    let plain = match stem {
        "model.embed_tokens" => "token_embd".to_owned(),
        "model.norm" => "output_norm".to_owned(),
        "lm_head" => "output".to_owned(),
        // gpt-oss's sinks have no `.weight`; llama.cpp's converter adds it.
        _ if suffix == "sinks" => {
            let n = stem.strip_prefix("model.layers.").unwrap().split('.').next().unwrap();
            return format!("blk.{n}.attn_sinks.weight");
        }
        _ => {
            let rest = stem.strip_prefix("model.layers.").unwrap();
            let (n, module) = rest.split_once('.').unwrap();
            let t = match module {
                "input_layernorm" => "attn_norm",
                "post_attention_layernorm" if matches!(arch, "gemma3" | "gpt-oss") => "post_attention_norm",
                "post_attention_layernorm" | "pre_feedforward_layernorm" => "ffn_norm",
                "post_feedforward_layernorm" => "post_ffw_norm",
                "self_attn.q_proj" => "attn_q",
                "self_attn.k_proj" => "attn_k",
                "self_attn.v_proj" => "attn_v",
                "self_attn.o_proj" => "attn_output",
                "self_attn.q_norm" => "attn_q_norm",
                "self_attn.k_norm" => "attn_k_norm",
                "mlp.gate_proj" => "ffn_gate",
                "mlp.up_proj" => "ffn_up",
                "mlp.down_proj" => "ffn_down",
                "mlp.gate" | "block_sparse_moe.gate" | "mlp.router" => "ffn_gate_inp",
                other => panic!("unmapped tensor {other}"),
            };
            format!("blk.{n}.{t}")
        }
    };
    format!("{plain}.{suffix}")
}

/// llama.cpp's `LlamaModel.permute`: within each head, rows (i, i + d/2) become rows (2i, 2i + 1).
fn permute(w: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let cols = w.len() / rows;
    let d = rows / heads;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for j in 0..d / 2 {
            for t in 0..2 {
                let (dst, src) = (h * d + 2 * j + t, h * d + t * (d / 2) + j);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// One expert's matrix of a stacked GGUF tensor: its index, values and `[out, in]` shape.
type Expert = (usize, Vec<f32>, Vec<u64>);

/// Writes `fixtures/tiny/<family>` as a GGUF file and returns its path.
fn convert(family: &str) -> std::path::PathBuf {
    let dir = tf_testkit::repo_root().join("fixtures/tiny").join(family);
    let cfg = HfConfig::from_dir(&dir).unwrap();
    let st = SafetensorsModel::open_dir(&dir).unwrap();
    let arch = match family {
        "llama3" | "mixtral" | "mistral" => "llama",
        "gpt_oss" => "gpt-oss",
        f => f,
    };
    let (heads, kv_heads, head_dim) =
        (cfg.num_attention_heads as usize, cfg.num_key_value_heads as usize, cfg.head_dim as usize);
    let k = |key: &str| format!("{arch}.{key}");
    let u = |v: u64| GgufValue::U32(v as u32);
    let mut w = GgufWriter::new()
        .kv("general.architecture", GgufValue::String(arch.into()))
        .kv(&k("block_count"), u(cfg.num_hidden_layers))
        .kv(&k("context_length"), u(cfg.max_position_embeddings.unwrap()))
        .kv(&k("embedding_length"), u(cfg.hidden_size))
        .kv(&k("feed_forward_length"), u(cfg.intermediate_size))
        .kv(&k("attention.head_count"), u(cfg.num_attention_heads))
        .kv(&k("attention.head_count_kv"), u(cfg.num_key_value_heads))
        .kv(&k("attention.key_length"), u(cfg.head_dim))
        .kv(&k("attention.value_length"), u(cfg.head_dim))
        .kv(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(cfg.rms_norm_eps.unwrap() as f32))
        .kv(&k("rope.freq_base"), GgufValue::F32(cfg.rope_theta.unwrap() as f32))
        .kv(&k("rope.dimension_count"), u(cfg.head_dim))
        .kv(
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::String((0..cfg.vocab_size).map(|i| format!("<t{i}>")).collect())),
        );
    if let Some(experts) = cfg.get_f64("num_local_experts").or(cfg.get_f64("num_experts")) {
        w = w
            .kv(&k("expert_count"), u(experts as u64))
            .kv(&k("expert_used_count"), u(cfg.get_f64("num_experts_per_tok").unwrap() as u64));
        if let Some(f) = cfg.get_f64("moe_intermediate_size") {
            w = w.kv(&k("expert_feed_forward_length"), u(f as u64));
        }
    }
    if family == "mistral" {
        // llama.cpp's converter writes no window for the `llama` architecture (llama.cpp attends to the whole
        // context); the key is llama.cpp's name for one, which our reader applies to every layer of a `llama` GGUF.
        w = w.kv(&k("attention.sliding_window"), u(cfg.sliding_window.unwrap()));
    }
    if arch == "gpt-oss" {
        // convert_hf_to_gguf.py's GptOssModel: the expert width, the window, YaRN's factor and original context.
        let Some(HfScaling::Yarn { factor, original_max_position_embeddings, .. }) = cfg.rope_scaling else {
            panic!("gpt_oss fixture without YaRN")
        };
        w = w
            .kv(&k("expert_feed_forward_length"), u(cfg.intermediate_size))
            .kv(&k("attention.sliding_window"), u(cfg.sliding_window.unwrap()))
            .kv(&k("rope.scaling.type"), GgufValue::String("yarn".into()))
            .kv(&k("rope.scaling.factor"), GgufValue::F32(factor as f32))
            .kv(&k("rope.scaling.original_context_length"), u(original_max_position_embeddings.unwrap()));
        // The experts: gate_up_proj [E, H, 2F] (gate in the even columns, up in the odd) to [E, F, H] each,
        // down_proj [E, F, H] to [E, H, F]; the biases split the same way.
        let (e, h, f) = (
            cfg.get_f64("num_local_experts").unwrap() as usize,
            cfg.hidden_size as usize,
            cfg.intermediate_size as usize,
        );
        for l in 0..cfg.num_hidden_layers {
            let t = |n: &str| tf_loader::tensor_f32(&st, "tiny", &format!("model.layers.{l}.mlp.experts.{n}")).unwrap();
            let (gu, gub, dn, dnb) = (t("gate_up_proj"), t("gate_up_proj_bias"), t("down_proj"), t("down_proj_bias"));
            let split = |odd: usize| -> Vec<f32> {
                (0..e)
                    .flat_map(|x| (0..f).flat_map(move |j| (0..h).map(move |c| (x, j, c))))
                    .map(|(x, j, c)| gu[(x * h + c) * 2 * f + 2 * j + odd])
                    .collect()
            };
            let down: Vec<f32> = (0..e)
                .flat_map(|x| (0..h).flat_map(move |c| (0..f).map(move |j| (x, c, j))))
                .map(|(x, c, j)| dn[(x * f + j) * h + c])
                .collect();
            let bias = |odd: usize| -> Vec<f32> { gub.iter().skip(odd).step_by(2).copied().collect() };
            let (ne_gu, ne_d) = ([h as u64, f as u64, e as u64], [f as u64, h as u64, e as u64]);
            w = w
                .tensor_f32(&format!("blk.{l}.ffn_gate_exps.weight"), &ne_gu, &split(0))
                .tensor_f32(&format!("blk.{l}.ffn_up_exps.weight"), &ne_gu, &split(1))
                .tensor_f32(&format!("blk.{l}.ffn_down_exps.weight"), &ne_d, &down)
                .tensor_f32(&format!("blk.{l}.ffn_gate_exps.bias"), &[f as u64, e as u64], &bias(0))
                .tensor_f32(&format!("blk.{l}.ffn_up_exps.bias"), &[f as u64, e as u64], &bias(1))
                .tensor_f32(&format!("blk.{l}.ffn_down_exps.bias"), &[h as u64, e as u64], &dnb);
        }
    }
    if arch == "gemma3" {
        let types = cfg.resolved_layer_types();
        let pattern = types.iter().position(|t| *t == LayerType::Full).unwrap() + 1;
        w = w
            .kv(&k("attention.sliding_window"), u(cfg.sliding_window.unwrap()))
            .kv(&k("attention.sliding_window_pattern"), u(pattern as u64))
            .kv(&k("rope.freq_base_swa"), GgufValue::F32(cfg.rope_local_base_freq.unwrap() as f32));
        // llama.cpp assumes query_pre_attn_scalar = head_dim (true of the released models, not of this one).
        let scalar = cfg.get_f64("query_pre_attn_scalar").unwrap();
        if scalar != cfg.head_dim as f64 {
            w = w.kv(&k("attention.scale"), GgufValue::F32(scalar.powf(-0.5) as f32));
        }
    }
    if let Some(HfScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) =
        cfg.rope_scaling
    {
        // convert_hf_to_gguf.py: LlamaModel.generate_extra_tensors.
        let theta = cfg.rope_theta.unwrap();
        let (orig, low_wl, high_wl) = (
            original_max_position_embeddings as f64,
            original_max_position_embeddings as f64 / low_freq_factor,
            original_max_position_embeddings as f64 / high_freq_factor,
        );
        let divisors: Vec<f32> = (0..head_dim / 2)
            .map(|i| {
                let wl = 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / head_dim as f64);
                if wl < high_wl {
                    1.0
                } else if wl > low_wl {
                    factor as f32
                } else {
                    let s = (orig / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 / ((1.0 - s) / factor + s)) as f32
                }
            })
            .collect();
        w = w.tensor_f32("rope_freqs.weight", &[divisors.len() as u64], &divisors);
    }
    // Experts: convert_hf_to_gguf.py stacks each projection of a layer's experts into one [E, out, in] tensor
    // (`blk.{l}.ffn_{gate,up,down}_exps`).
    let mut stacks: std::collections::BTreeMap<String, Vec<Expert>> = Default::default();
    for info in st.tensors().iter().filter(|_| arch != "gpt-oss") {
        let Some((head, rest)) = info.name.split_once(".experts.") else { continue };
        let (e, proj) = rest.split_once('.').unwrap();
        let l = head.strip_prefix("model.layers.").unwrap().split('.').next().unwrap();
        let kind = match proj {
            "gate_proj.weight" | "w1.weight" => "gate",
            "up_proj.weight" | "w3.weight" => "up",
            "down_proj.weight" | "w2.weight" => "down",
            other => panic!("unmapped expert tensor {other}"),
        };
        let values = tf_loader::tensor_f32(&st, "tiny", &info.name).unwrap();
        stacks.entry(format!("blk.{l}.ffn_{kind}_exps.weight")).or_default().push((
            e.parse().unwrap(),
            values,
            info.shape.clone(),
        ));
    }
    for (name, mut experts) in stacks {
        experts.sort_by_key(|x| x.0);
        let shape = &experts[0].2;
        let ne = [shape[1], shape[0], experts.len() as u64];
        let values: Vec<f32> = experts.iter().flat_map(|x| x.1.iter().copied()).collect();
        w = w.tensor_f32(&name, &ne, &values);
    }
    for info in st.tensors().iter().filter(|t| !t.name.contains(".experts.")) {
        let mut values = tf_loader::tensor_f32(&st, "tiny", &info.name).unwrap();
        let rows = info.shape[0] as usize;
        if arch == "llama" && info.name.contains("self_attn.q_proj") {
            values = permute(&values, rows, heads);
        } else if arch == "llama" && info.name.contains("self_attn.k_proj") {
            values = permute(&values, rows, kv_heads);
        }
        if arch == "gemma3" && info.name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        let ne: Vec<u64> = info.shape.iter().rev().copied().collect();
        assert_eq!(info.dtype, DType::F32);
        w = w.tensor_f32(&gguf_name(arch, &info.name), &ne, &values);
    }
    let path = std::env::temp_dir().join(format!("tf-models-{family}-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

fn check(family: &str) {
    let path = convert(family);
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let r = tf_testkit::fixture(&format!("tiny/{family}/reference.json"));
    let ids: Vec<u32> = r["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let be = CpuBackend::new(2, Precision::Full);
    let from_gguf = load_model(&be, &file, &file).unwrap_or_else(|e| panic!("{family} gguf: {e}"));
    let from_hf = hf_model(&be, &tf_testkit::repo_root().join("fixtures/tiny").join(family));
    let gguf_logits = run_chunked(&be, from_gguf.as_ref(), &ids, &[ids.len()]);
    let hf_logits = run_chunked(&be, from_hf.as_ref(), &ids, &[ids.len()]);
    let hex = r["logits_f32_hex"].as_array().unwrap();
    let mut worst = 0f32;
    for (p, (ours, want)) in gguf_logits.iter().zip(hex).enumerate() {
        let want = want.as_str().unwrap();
        let want: Vec<f32> = (0..want.len() / 8)
            .map(|i| f32::from_bits(u32::from_str_radix(&want[8 * i..8 * i + 8], 16).unwrap()))
            .collect();
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        worst = ours.iter().zip(&want).fold(worst, |m, (a, b)| m.max((a - b).abs() / scale));
        assert_eq!(argmax(ours), argmax(&want), "{family}: argmax at {p}");
    }
    eprintln!("{family} via GGUF: worst logit error {worst:.2e} × max|logit|");
    assert!(worst <= 1e-4, "{family} via GGUF: logits off by {worst:.2e} × max|logit|");
    if !matches!(family, "llama" | "llama3" | "mixtral" | "mistral") {
        assert_eq!(first_bit_difference(&gguf_logits, &hf_logits), None, "{family}: GGUF and HF loads differ");
    }
}

#[test]
fn llama_permuted_normal_rope() {
    check("llama");
}

#[test]
fn llama3_rope_freqs() {
    check("llama3");
}

#[test]
fn qwen2_biases() {
    check("qwen2");
}

#[test]
fn qwen3_qk_norm() {
    check("qwen3");
}

#[test]
fn qwen3moe_stacked_experts() {
    check("qwen3moe");
}

#[test]
fn mixtral_as_llama_with_experts() {
    check("mixtral");
}

/// Mistral as a `llama` GGUF with `llama.attention.sliding_window` (8, shorter than the prompt).
#[test]
fn mistral_as_llama_with_window() {
    check("mistral");
}

#[test]
fn gemma3_folded_norms_and_windows() {
    check("gemma3");
}

/// gpt-oss as llama.cpp names it: `attn_sinks`, `post_attention_norm`, the router as `ffn_gate_inp` with a bias,
/// stacked experts with biases, the window pattern of the architecture (sliding on even layers) and YaRN metadata
/// (ramp bounds not rounded, as the architecture's reference, although llama.cpp rounds them).
#[test]
fn gpt_oss_sinks_biased_experts_yarn() {
    check("gpt_oss");
}

/// Writes `fixtures/tiny/nemotron_h` as a GGUF file the way llama.cpp's converter does for `NemotronHForCausalLM`
/// (`NemotronHModel` over `GraniteHybridModel` and `Mamba2Model`), and returns its path:
/// - the layer kinds only as per-layer arrays: `head_count_kv` (the KV heads on attention layers, else 0) and
///   `feed_forward_length` (the MLP width on MLP layers, else 0); a layer with both 0 is a Mamba-2 layer;
/// - `ssm.*`: `conv_kernel`, `state_size`, `group_count`, `inner_size` (heads · head size) and `time_step_rank`
///   (the Mamba heads); `context_length` 2^20 (no positional encoding); key/value length the head size;
/// - Mamba-2 tensors: `in_proj` as `ssm_in`; `conv1d.weight [conv_dim, 1, K]` squeezed to `ssm_conv1d [conv_dim,
///   K]` (GGUF `ne [K, conv_dim]`); `dt_bias` as `ssm_dt.bias`; `A_log` as `ssm_a = -exp(A_log)` and `D` as
///   `ssm_d`, both `[heads, 1]`; the gated norm reshaped to `[groups, I / groups]`; `out_proj` as `ssm_out`;
/// - attention: Q and K rows permuted per head as for a RoPE llama (`undo_permute` is set for the architecture);
/// - the pre-mixer norm of every layer as `attn_norm`; `up_proj`/`down_proj` as `ffn_up`/`ffn_down`.
///
/// `-exp(A_log)` is taken in f64 and rounded once to f32 (llama.cpp's converter takes torch's f32 `exp`, which
/// is within an ulp of that).
fn convert_nemotron_h(st: &dyn WeightSource) -> std::path::PathBuf {
    let dir = tf_testkit::repo_root().join("fixtures/tiny/nemotron_h");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("config.json: {k}"));
    // The layer pattern as llama.cpp reads `hybrid_override_pattern`: M (Mamba-2), * (attention), - (MLP).
    let pattern: Vec<char> = cfg["layers_block_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match t.as_str().unwrap() {
            "mamba" | "linear_attention" => 'M',
            "attention" | "full_attention" => '*',
            "mlp" => '-',
            other => panic!("layer type {other}"),
        })
        .collect();
    let layers = pattern.len();
    let (heads, kv_heads, head_dim) = (n("num_attention_heads"), n("num_key_value_heads"), n("head_dim"));
    let (ssm_heads, groups, inner) = (n("mamba_num_heads"), n("n_groups"), n("mamba_num_heads") * n("mamba_head_dim"));
    let eps = cfg["layer_norm_epsilon"].as_f64().unwrap() as f32;
    let per_layer = |c: char, v: u64| {
        GgufValue::Array(GgufArray::I32(pattern.iter().map(|&p| if p == c { v as i32 } else { 0 }).collect()))
    };
    let k = |key: &str| format!("nemotron_h.{key}");
    let u = |v: u64| GgufValue::U32(v as u32);
    let mut w = GgufWriter::new()
        .kv("general.architecture", GgufValue::String("nemotron_h".into()))
        .kv(&k("block_count"), u(layers as u64))
        .kv(&k("context_length"), u(1 << 20))
        .kv(&k("embedding_length"), u(n("hidden_size")))
        .kv(&k("feed_forward_length"), per_layer('-', n("intermediate_size")))
        .kv(&k("attention.head_count"), u(heads))
        .kv(&k("attention.head_count_kv"), per_layer('*', kv_heads))
        .kv(&k("attention.key_length"), u(head_dim))
        .kv(&k("attention.value_length"), u(head_dim))
        .kv(&k("attention.layer_norm_epsilon"), GgufValue::F32(eps))
        .kv(&k("attention.layer_norm_rms_epsilon"), GgufValue::F32(eps))
        .kv(&k("rope.scaling.finetuned"), GgufValue::Bool(false))
        .kv(&k("ssm.conv_kernel"), u(n("conv_kernel")))
        .kv(&k("ssm.state_size"), u(n("ssm_state_size")))
        .kv(&k("ssm.group_count"), u(groups))
        .kv(&k("ssm.inner_size"), u(inner))
        .kv(&k("ssm.time_step_rank"), u(ssm_heads))
        .kv(
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::String((0..n("vocab_size")).map(|i| format!("<t{i}>")).collect())),
        );
    for info in st.tensors() {
        let mut values = tf_loader::tensor_f32(st, "tiny", &info.name).unwrap();
        assert_eq!(info.dtype, DType::F32);
        let mut ne: Vec<u64> = info.shape.iter().rev().copied().collect();
        let name = match info.name.as_str() {
            "backbone.embeddings.weight" => "token_embd.weight".to_owned(),
            "backbone.norm_f.weight" => "output_norm.weight".to_owned(),
            "lm_head.weight" => "output.weight".to_owned(),
            full => {
                let rest = full.strip_prefix("backbone.layers.").unwrap();
                let (l, t) = rest.split_once('.').unwrap();
                let gg = match t {
                    "norm.weight" => "attn_norm.weight",
                    "mixer.in_proj.weight" => "ssm_in.weight",
                    "mixer.conv1d.weight" => {
                        ne = vec![info.shape[2], info.shape[0]];
                        "ssm_conv1d.weight"
                    }
                    "mixer.conv1d.bias" => "ssm_conv1d.bias",
                    "mixer.dt_bias" => "ssm_dt.bias",
                    "mixer.A_log" => {
                        values.iter_mut().for_each(|a| *a = -((*a as f64).exp() as f32));
                        ne = vec![1, info.shape[0]];
                        "ssm_a"
                    }
                    "mixer.D" => {
                        ne = vec![1, info.shape[0]];
                        "ssm_d"
                    }
                    "mixer.norm.weight" => {
                        ne = vec![inner / groups, groups];
                        "ssm_norm.weight"
                    }
                    "mixer.out_proj.weight" => "ssm_out.weight",
                    "mixer.q_proj.weight" => {
                        values = permute(&values, info.shape[0] as usize, heads as usize);
                        "attn_q.weight"
                    }
                    "mixer.k_proj.weight" => {
                        values = permute(&values, info.shape[0] as usize, kv_heads as usize);
                        "attn_k.weight"
                    }
                    "mixer.v_proj.weight" => "attn_v.weight",
                    "mixer.o_proj.weight" => "attn_output.weight",
                    "mixer.up_proj.weight" => "ffn_up.weight",
                    "mixer.down_proj.weight" => "ffn_down.weight",
                    other => panic!("unmapped tensor {other}"),
                };
                format!("blk.{l}.{gg}")
            }
        };
        w = w.tensor_f32(&name, &ne, &values);
    }
    // One file per conversion (tests run in parallel).
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tf-models-nemotron_h-{}-{n}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// A safetensors checkpoint with some tensors' values replaced (f32).
struct Replaced {
    inner: SafetensorsModel,
    values: std::collections::HashMap<String, Vec<u8>>,
}

impl WeightSource for Replaced {
    fn format(&self) -> &str {
        self.inner.format()
    }

    fn tensors(&self) -> &[tf_core::TensorInfo] {
        self.inner.tensors()
    }

    fn bytes(&self, name: &str) -> Result<&[u8], tf_core::WeightsError> {
        match self.values.get(name) {
            Some(v) => Ok(v),
            None => self.inner.bytes(name),
        }
    }
}

/// The tiny nemotron_h converted to GGUF and loaded from both files: the layer kinds, state and KV shapes agree,
/// and the logits (the state chained through registers, filled whole and in chunks of 5) are equal bit for bit;
/// returns the GGUF load's logits.
fn nemotron_h_both_loads(st: &dyn WeightSource) -> Vec<Vec<f32>> {
    let dir = tf_testkit::repo_root().join("fixtures/tiny/nemotron_h");
    let path = convert_nemotron_h(st);
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let r = tf_testkit::fixture("tiny/nemotron_h/reference.json");
    let ids: Vec<u32> = r["input_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let be = CpuBackend::new(2, Precision::Full);
    let from_gguf = load_model(&be, &file, &file).unwrap_or_else(|e| panic!("nemotron_h gguf: {e}"));
    assert_eq!(from_gguf.family(), "nemotron_h");
    let from_hf = load_model(&be, st, &HfConfig::from_dir(&dir).unwrap()).unwrap();
    assert_eq!(from_gguf.state_spec(), from_hf.state_spec());
    assert_eq!(from_gguf.kv_spec(4, 16), from_hf.kv_spec(4, 16));
    let hf_logits = run_with_states(&be, from_hf.as_ref(), &ids, &[ids.len()]);
    for chunks in [&[ids.len()][..], &[5]] {
        let gguf_logits = run_with_states(&be, from_gguf.as_ref(), &ids, chunks);
        assert_eq!(first_bit_difference(&gguf_logits, &hf_logits), None, "chunks {chunks:?}: GGUF and HF loads differ");
    }
    hf_logits
}

/// nemotron_h from llama.cpp's GGUF: the layer kinds from the per-layer arrays, the Mamba-2 tensors reshaped, A
/// stored as `-exp(A_log)`, Q/K permuted. The GGUF load equals the safetensors load bit for bit, and transformers'
/// logits within 1e-4 × max|logit|.
#[test]
fn nemotron_h_mamba2_layers() {
    let st = SafetensorsModel::open_dir(tf_testkit::repo_root().join("fixtures/tiny/nemotron_h")).unwrap();
    let logits = nemotron_h_both_loads(&st);
    let r = tf_testkit::fixture("tiny/nemotron_h/reference.json");
    let mut worst = 0f32;
    for (p, (ours, want)) in logits.iter().zip(r["logits_f32_hex"].as_array().unwrap()).enumerate() {
        let want = want.as_str().unwrap();
        let want: Vec<f32> = (0..want.len() / 8)
            .map(|i| f32::from_bits(u32::from_str_radix(&want[8 * i..8 * i + 8], 16).unwrap()))
            .collect();
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        worst = ours.iter().zip(&want).fold(worst, |m, (a, b)| m.max((a - b).abs() / scale));
        assert_eq!(argmax(ours), argmax(&want), "nemotron_h: argmax at {p}");
    }
    eprintln!("nemotron_h via GGUF: worst logit error {worst:.2e} × max|logit|");
    assert!(worst <= 1e-4, "nemotron_h via GGUF: logits off by {worst:.2e} × max|logit|");
}

/// Decay rates whose `A_log` does not survive `ln(-A)` after `A = -exp(A_log)` is rounded to f32, so far that the
/// scan's `exp(A_log)` changes (found here with the scan's own `exp`), still load to the same bits from both
/// formats.
#[test]
fn nemotron_h_decay_rates_load_equal() {
    use tf_quant::reference::math::exp;
    let dir = tf_testkit::repo_root().join("fixtures/tiny/nemotron_h");
    let inner = SafetensorsModel::open_dir(&dir).unwrap();
    let a_logs: Vec<(String, usize)> = inner
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with("A_log"))
        .map(|t| (t.name.clone(), t.shape[0] as usize)) // [heads]
        .collect();
    let wanted: usize = a_logs.iter().map(|x| x.1).sum();
    assert!(wanted > 0);
    // A_log in [-0.6, 2.7) (A from -0.55 to -15) where exp(A_log) and exp(ln(-A)) differ, spread over the range.
    let round_trip = |a: f32| (((a as f64).exp() as f32) as f64).ln() as f32;
    let moved: Vec<f32> =
        (0..3300).map(|i| -0.6 + 0.001 * i as f32).filter(|&a| exp(a) != exp(round_trip(a))).collect();
    assert!(moved.len() >= wanted, "{} of the A_log values move the scan's exp", moved.len());
    let mut pick = moved.iter().step_by(moved.len() / wanted).copied();
    let values = a_logs
        .into_iter()
        .map(|(name, n)| (name, (0..n).flat_map(|_| pick.next().unwrap().to_le_bytes()).collect::<Vec<u8>>()))
        .collect();
    nemotron_h_both_loads(&Replaced { inner, values });
}
