//! The GGUF path on exact goldens: each tiny HF checkpoint is converted to GGUF the way llama.cpp's
//! `convert_hf_to_gguf.py` does (tensor names, Q/K rows permuted for `llama`, each layer's experts stacked into one
//! `[E, out, in]` tensor per projection, Gemma norms stored as `1 + w`, Llama 3
//! RoPE scaling as a `rope_freqs` tensor, `{arch}.*` metadata) and loaded through `GgufFile`. Its logits must match
//! transformers' like the HF load does; where the conversion changes no arithmetic (qwen2, qwen3, qwen3moe, gemma3) they must
//! equal the HF load's bit for bit (gpt_oss too: its experts are split and transposed, which moves no value).

use crate::common::{argmax, first_bit_difference, hf_model, run_chunked};
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
        "llama3" | "mixtral" => "llama",
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
    if !matches!(family, "llama" | "llama3" | "mixtral") {
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
