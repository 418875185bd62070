//! [`ConfigView`] for the two configuration formats: GGUF metadata ([`Metadata`], [`GgufFile`]) and Hugging Face
//! `config.json` ([`HfConfig`]).
//!
//! GGUF keys are read as written (`llama.block_count`). For `config.json`, the keys `HfConfig` validates come
//! from its typed fields, so family code sees the resolved values: defaults (Gemma 3's), `head_dim` derived from
//! the hidden size, the effective `sliding_window` (None when `use_sliding_window` is false), `rope_theta` /
//! `rope_local_base_freq` also when written as `rope_parameters`, and `layer_types` resolved for every layer
//! (`"full_attention"` / `"sliding_attention"`). `rope_scaling.<key>` reads the scaling object (or the scaling
//! part of `rope_parameters`); `rope_scaling.rope_type` also answers for the older `type` spelling. Any other key
//! reads the text settings (`text_config` when nested), falling back to the top level.

use crate::gguf::{GgufArray, GgufFile, Metadata};
use crate::hf_config::{HfConfig, LayerType, TokenIds};
use serde_json::Value;
use tf_core::{ConfigFormat, ConfigView};

impl ConfigView for Metadata {
    fn format(&self) -> ConfigFormat {
        ConfigFormat::Gguf
    }

    fn architecture(&self) -> Option<String> {
        Metadata::get_str(self, "general.architecture").map(str::to_owned)
    }

    fn get_u64(&self, key: &str) -> Option<u64> {
        Metadata::get_u64(self, key)
    }

    fn get_f64(&self, key: &str) -> Option<f64> {
        Metadata::get_f64(self, key)
    }

    fn get_str(&self, key: &str) -> Option<String> {
        Metadata::get_str(self, key).map(str::to_owned)
    }

    fn get_bool(&self, key: &str) -> Option<bool> {
        Metadata::get_bool(self, key)
    }

    fn get_f64_array(&self, key: &str) -> Option<Vec<f64>> {
        Some(match self.get_array(key)? {
            GgufArray::U8(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::I8(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::U16(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::I16(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::U32(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::I32(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::U64(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::I64(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::F32(v) => v.iter().map(|&x| x as f64).collect(),
            GgufArray::F64(v) => v.clone(),
            GgufArray::Bool(_) | GgufArray::String(_) | GgufArray::Array(_) => return None,
        })
    }

    fn get_str_array(&self, key: &str) -> Option<Vec<String>> {
        Metadata::get_str_array(self, key).map(<[String]>::to_vec)
    }
}

impl ConfigView for GgufFile {
    fn format(&self) -> ConfigFormat {
        ConfigFormat::Gguf
    }

    fn architecture(&self) -> Option<String> {
        self.metadata().architecture()
    }

    fn get_u64(&self, key: &str) -> Option<u64> {
        self.metadata().get_u64(key)
    }

    fn get_f64(&self, key: &str) -> Option<f64> {
        self.metadata().get_f64(key)
    }

    fn get_str(&self, key: &str) -> Option<String> {
        ConfigView::get_str(self.metadata(), key)
    }

    fn get_bool(&self, key: &str) -> Option<bool> {
        self.metadata().get_bool(key)
    }

    fn get_f64_array(&self, key: &str) -> Option<Vec<f64>> {
        self.metadata().get_f64_array(key)
    }

    fn get_str_array(&self, key: &str) -> Option<Vec<String>> {
        ConfigView::get_str_array(self.metadata(), key)
    }
}

/// A resolved `config.json` value: a typed `HfConfig` field where there is one, else the raw JSON.
enum HfValue<'a> {
    U64(u64),
    F64(f64),
    Bool(bool),
    Str(&'a str),
    Ids(&'a TokenIds),
    Json(&'a Value),
}

impl HfConfig {
    fn resolve(&self, key: &str) -> Option<HfValue<'_>> {
        use HfValue::*;
        let opt_u = |v: Option<u64>| v.map(U64);
        Some(match key {
            "hidden_size" => U64(self.hidden_size),
            "intermediate_size" => U64(self.intermediate_size),
            "num_hidden_layers" => U64(self.num_hidden_layers),
            "num_attention_heads" => U64(self.num_attention_heads),
            "num_key_value_heads" => U64(self.num_key_value_heads),
            "head_dim" => U64(self.head_dim),
            "vocab_size" => U64(self.vocab_size),
            "max_position_embeddings" => return opt_u(self.max_position_embeddings),
            "rms_norm_eps" => return self.rms_norm_eps.map(F64),
            "rope_theta" => return self.rope_theta.map(F64),
            "rope_local_base_freq" => return self.rope_local_base_freq.map(F64),
            "sliding_window" => return opt_u(self.sliding_window),
            "sliding_window_pattern" => return opt_u(self.sliding_window_pattern),
            "tie_word_embeddings" => Bool(self.tie_word_embeddings),
            "attention_bias" => return self.attention_bias.map(Bool),
            "hidden_act" | "hidden_activation" => return self.hidden_act.as_deref().map(Str),
            "model_type" => Str(&self.model_type),
            "torch_dtype" | "dtype" => return self.torch_dtype.as_deref().map(Str),
            "bos_token_id" => return self.bos_token_id.as_ref().map(Ids),
            "eos_token_id" => return self.eos_token_id.as_ref().map(Ids),
            "pad_token_id" => return self.pad_token_id.as_ref().map(Ids),
            _ => match key.strip_prefix("rope_scaling.") {
                Some("rope_type") => {
                    let raw = self.rope_scaling_raw.as_ref()?;
                    return raw.get("rope_type").or_else(|| raw.get("type")).filter(|v| !v.is_null()).map(Json);
                }
                Some(sub) => return self.rope_scaling_raw.as_ref()?.get(sub).filter(|v| !v.is_null()).map(Json),
                None => Json(self.get(key)?),
            },
        })
    }
}

impl ConfigView for HfConfig {
    fn format(&self) -> ConfigFormat {
        ConfigFormat::HfConfig
    }

    /// The text model's `model_type` (`gemma3_text` for a nested Gemma 3 config).
    fn architecture(&self) -> Option<String> {
        Some(self.model_type.clone())
    }

    fn get_u64(&self, key: &str) -> Option<u64> {
        match self.resolve(key)? {
            HfValue::U64(v) => Some(v),
            HfValue::Ids(ids) => ids.first().map(u64::from),
            HfValue::Json(v) => v.as_u64(),
            _ => None,
        }
    }

    fn get_f64(&self, key: &str) -> Option<f64> {
        match self.resolve(key)? {
            HfValue::U64(v) => Some(v as f64),
            HfValue::F64(v) => Some(v),
            HfValue::Json(v) => v.as_f64(),
            _ => None,
        }
    }

    fn get_str(&self, key: &str) -> Option<String> {
        match self.resolve(key)? {
            HfValue::Str(s) => Some(s.to_owned()),
            HfValue::Json(v) => v.as_str().map(str::to_owned),
            _ => None,
        }
    }

    fn get_bool(&self, key: &str) -> Option<bool> {
        match self.resolve(key)? {
            HfValue::Bool(b) => Some(b),
            HfValue::Json(v) => v.as_bool(),
            _ => None,
        }
    }

    fn get_f64_array(&self, key: &str) -> Option<Vec<f64>> {
        match self.resolve(key)? {
            HfValue::Ids(ids) => Some(ids.to_vec().into_iter().map(f64::from).collect()),
            HfValue::Json(Value::Array(items)) => items.iter().map(Value::as_f64).collect(),
            _ => None,
        }
    }

    /// `architectures` as written; `layer_types` resolved for every layer.
    fn get_str_array(&self, key: &str) -> Option<Vec<String>> {
        match key {
            "architectures" => Some(self.architectures.clone()),
            "layer_types" => Some(
                self.resolved_layer_types()
                    .into_iter()
                    .map(|t| match t {
                        LayerType::Full => "full_attention".to_owned(),
                        LayerType::Sliding => "sliding_attention".to_owned(),
                    })
                    .collect(),
            ),
            _ => match self.resolve(key)? {
                HfValue::Json(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hf_typed_and_raw_keys() {
        let raw = json!({
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "eos_token_id": [1, 106],
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 6,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 3,
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
                }
            }
        });
        let c = HfConfig::from_value(raw, "test").unwrap();
        assert_eq!(ConfigView::architecture(&c).as_deref(), Some("gemma3_text"));
        assert_eq!(ConfigView::get_u64(&c, "hidden_size"), Some(640));
        assert_eq!(ConfigView::get_u64(&c, "vocab_size"), Some(262_208)); // the Gemma 3 default
        assert_eq!(ConfigView::get_f64(&c, "rope_theta"), Some(1e6));
        assert_eq!(ConfigView::get_f64(&c, "rope_local_base_freq"), Some(1e4));
        assert_eq!(ConfigView::get_f64(&c, "rms_norm_eps"), Some(1e-6));
        assert_eq!(ConfigView::get_u64(&c, "query_pre_attn_scalar"), Some(256));
        assert_eq!(ConfigView::get_str(&c, "rope_scaling.rope_type").as_deref(), Some("linear"));
        assert_eq!(ConfigView::get_f64(&c, "rope_scaling.factor"), Some(8.0));
        assert_eq!(ConfigView::get_f64_array(&c, "eos_token_id"), Some(vec![1.0, 106.0]));
        assert_eq!(ConfigView::get_bool(&c, "tie_word_embeddings"), Some(true));
        let types = ConfigView::get_str_array(&c, "layer_types").unwrap();
        assert_eq!(types[2], "full_attention");
        assert_eq!(types[0], "sliding_attention");
        assert_eq!(types.len(), 6);
        assert_eq!(ConfigView::get_u64(&c, "no_such_key"), None);
    }
}
