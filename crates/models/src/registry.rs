//! The family registry: which architectures TensorFold recognizes, what they are, and how to load them.

use crate::config::ModelConfig;
use crate::model::{Model, ModelError};
use crate::{gemma3, gptoss, llama, nemotron_h};
use tf_core::{Backend, ConfigFormat, ConfigView, WeightSource};

/// A model family: one shared decoder file (with config flags for its variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Our name, equal to the GGUF `general.architecture` value.
    pub name: &'static str,
    /// Other GGUF architecture names served by this family.
    pub gguf_aliases: &'static [&'static str],
    /// Hugging Face `config.json` `architectures` entries served by this family.
    pub hf_architectures: &'static [&'static str],
    /// Hugging Face `model_type` values served by this family.
    pub hf_model_types: &'static [&'static str],
    /// The models users know it by.
    pub examples: &'static str,
    /// What distinguishes it from the plain decoder.
    pub notes: &'static str,
}

pub const FAMILIES: &[Family] = &[
    Family {
        name: "llama",
        gguf_aliases: &["mistral"],
        hf_architectures: &["LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"],
        hf_model_types: &["llama", "mistral", "mixtral"],
        examples: "Llama 2, Llama 3.x, SmolLM2, Mistral 7B, Mixtral 8x7B",
        notes: "RMSNorm, RoPE (incl. Llama 3 scaling), SwiGLU, grouped-query attention; mixture of experts (Mixtral)",
    },
    Family {
        name: "qwen2",
        gguf_aliases: &[],
        hf_architectures: &["Qwen2ForCausalLM"],
        hf_model_types: &["qwen2"],
        examples: "Qwen2, Qwen2.5, Qwen2.5-Coder",
        notes: "llama decoder with q/k/v biases, NeoX RoPE",
    },
    Family {
        name: "qwen3",
        gguf_aliases: &[],
        hf_architectures: &["Qwen3ForCausalLM"],
        hf_model_types: &["qwen3"],
        examples: "Qwen3 dense",
        notes: "llama decoder with per-head q/k RMSNorm, NeoX RoPE",
    },
    Family {
        name: "qwen3moe",
        gguf_aliases: &[],
        hf_architectures: &["Qwen3MoeForCausalLM"],
        hf_model_types: &["qwen3_moe"],
        examples: "Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B",
        notes: "qwen3 decoder with mixture-of-experts feed-forward layers (top-k routing, normalized weights)",
    },
    Family {
        name: "gemma3",
        gguf_aliases: &[],
        hf_architectures: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
        hf_model_types: &["gemma3", "gemma3_text"],
        examples: "Gemma 3 (text)",
        notes: "scaled embeddings, pre/post norms, q/k norms, sliding-window layers, GeGLU",
    },
    Family {
        name: "gpt_oss",
        gguf_aliases: &["gpt-oss"],
        hf_architectures: &["GptOssForCausalLM"],
        hf_model_types: &["gpt_oss"],
        examples: "gpt-oss-20b, gpt-oss-120b",
        notes: "attention sinks, q/k/v/o biases, alternating sliding/full layers, YaRN RoPE, mixture of experts \
                with router and expert biases and the clamped SwiGLU",
    },
    Family {
        name: "nemotron_h",
        gguf_aliases: &[],
        hf_architectures: &["NemotronHForCausalLM"],
        hf_model_types: &["nemotron_h"],
        examples: "Nemotron-H 4B/8B/47B, NVIDIA Nemotron Nano 2",
        notes: "hybrid: Mamba-2 layers with a recurrent state, attention without positional encoding, squared-ReLU \
                MLP layers",
    },
];

/// The family for a GGUF `general.architecture` value.
pub fn family_for_architecture(arch: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == arch || f.gguf_aliases.contains(&arch))
}

/// The family for a Hugging Face `architectures` entry or `model_type`.
pub fn family_for_hf_architecture(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.hf_architectures.contains(&name) || f.hf_model_types.contains(&name))
}

/// The family of a checkpoint's configuration: GGUF `general.architecture`, or the `config.json` `model_type`
/// (then its `architectures` entries).
pub fn family_for_config(cfg: &dyn ConfigView) -> Result<&'static Family, ModelError> {
    let arch = cfg.architecture().ok_or_else(|| ModelError("the config names no architecture".to_owned()))?;
    let found = match cfg.format() {
        ConfigFormat::Gguf => family_for_architecture(&arch),
        ConfigFormat::HfConfig => family_for_hf_architecture(&arch).or_else(|| {
            let classes = cfg.get_str_array("architectures").unwrap_or_default();
            classes.iter().find_map(|c| family_for_hf_architecture(c))
        }),
    };
    found.ok_or_else(|| {
        let known: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        ModelError(format!("architecture {arch:?} is not supported (known families: {})", known.join(", ")))
    })
}

/// Loads a checkpoint: reads its configuration, picks the family and builds the model on `be`.
pub fn load_model(
    be: &dyn Backend,
    src: &dyn WeightSource,
    cfg: &dyn ConfigView,
) -> Result<Box<dyn Model>, ModelError> {
    let family = family_for_config(cfg)?;
    if family.name == "nemotron_h" {
        return nemotron_h::load(be, src, cfg);
    }
    let config = ModelConfig::from_view(cfg, family)?;
    match family.name {
        "llama" | "qwen2" | "qwen3" | "qwen3moe" => llama::load(be, src, config),
        "gemma3" => gemma3::load(be, src, config),
        "gpt_oss" => gptoss::load(be, src, config),
        other => Err(ModelError(format!("family '{other}' has no constructor"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(family_for_architecture("mistral").unwrap().name, "llama");
        assert_eq!(family_for_architecture("qwen2").unwrap().name, "qwen2");
        assert!(family_for_architecture("bert").is_none());
        assert_eq!(family_for_hf_architecture("Qwen3ForCausalLM").unwrap().name, "qwen3");
        assert_eq!(family_for_hf_architecture("gemma3_text").unwrap().name, "gemma3");
        assert_eq!(family_for_architecture("gpt-oss").unwrap().name, "gpt_oss");
        assert_eq!(family_for_hf_architecture("gpt_oss").unwrap().name, "gpt_oss");
        assert_eq!(family_for_hf_architecture("GptOssForCausalLM").unwrap().name, "gpt_oss");
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
    }
}
