//! The facts `tensorfold info` prints about a model, gathered from GGUF metadata or a Hugging Face directory.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use tf_core::{DType, WeightSource};
use tf_loader::gguf::GgufFile;
use tf_loader::hf_config::HfConfig;
use tf_loader::safetensors::SafetensorsModel;

/// Context length used for the KV-cache part of "memory needed" when the model's own is larger.
pub const DEFAULT_CONTEXT: u64 = 4096;

/// What `info` reports. Missing facts are `None` and print as "?".
#[derive(Clone, Debug, Default, Serialize)]
pub struct ModelFacts {
    pub path: String,
    /// "GGUF v3", "safetensors (2 shards)".
    pub format: String,
    /// The architecture name the file declares (`general.architecture` or `architectures[0]`).
    pub architecture: Option<String>,
    /// Our family serving it, if any.
    pub family: Option<String>,
    pub name: Option<String>,
    pub parameters: u64,
    /// Tensor count per element type, e.g. {"Q4_K": 120, "F32": 49}.
    pub tensor_types: BTreeMap<String, usize>,
    pub layers: Option<u64>,
    pub hidden: Option<u64>,
    pub ffn: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub context: Option<u64>,
    pub vocab: Option<u64>,
    pub rope_theta: Option<f64>,
    pub tokenizer: Option<String>,
    pub chat_template: bool,
    /// Bytes of weights as stored.
    pub weight_bytes: u64,
    /// K and V bytes per token of context, stored as `kv_type`.
    pub kv_bytes_per_token: Option<u64>,
    /// How the KV cache stores K and V for these sizes (`f32` unless [`ModelFacts::with_kv_type`] set another).
    pub kv_type: String,
    /// Context used for `memory_bytes` (the model's context, capped at `DEFAULT_CONTEXT`).
    pub memory_context: u64,
    /// Weights plus a KV cache of `kv_type` for `memory_context` tokens.
    pub memory_bytes: u64,
}

impl ModelFacts {
    fn finish(&mut self) {
        if let (Some(l), Some(kvh), Some(hd)) = (self.layers, self.kv_heads, self.head_dim) {
            self.kv_bytes_per_token = Some(2 * l * kvh * hd * 4);
        }
        self.kv_type = tf_backend_cpu::KvType::F32.name().to_owned();
        self.memory_context = self.context.unwrap_or(DEFAULT_CONTEXT).min(DEFAULT_CONTEXT);
        self.memory_bytes = self.weight_bytes + self.kv_bytes_per_token.unwrap_or(0) * self.memory_context;
        self.family = self
            .architecture
            .as_deref()
            .and_then(|a| tf_models::family_for_architecture(a).or_else(|| tf_models::family_for_hf_architecture(a)))
            .map(|f| f.name.to_owned());
    }

    /// The same facts with the KV cache sized as `ty` stores it (`kv_bytes_per_token`, `memory_bytes`).
    pub fn with_kv_type(mut self, ty: tf_backend_cpu::KvType) -> ModelFacts {
        if self.kv_bytes_per_token.is_some() {
            self.kv_bytes_per_token = self.kv_bytes_per_token_as(ty);
        }
        self.kv_type = ty.name().to_owned();
        self.memory_bytes = self.weight_bytes + self.kv_bytes_per_token.unwrap_or(0) * self.memory_context;
        self
    }

    /// K and V bytes per token of context stored as `ty`.
    pub fn kv_bytes_per_token_as(&self, ty: tf_backend_cpu::KvType) -> Option<u64> {
        let (l, kvh, hd) = (self.layers?, self.kv_heads?, self.head_dim?);
        Some(2 * l * kvh * ty.row_bytes(hd as usize) as u64)
    }

    fn count_tensors(&mut self, src: &dyn WeightSource) {
        for t in src.tensors() {
            *self.tensor_types.entry(t.dtype.name().to_owned()).or_default() += 1;
            self.parameters += t.numel();
            self.weight_bytes += t.nbytes();
        }
    }

    /// Facts from an open GGUF file (metadata keys `{arch}.*`, `tokenizer.*`, `general.*`).
    pub fn from_gguf(g: &GgufFile) -> ModelFacts {
        let md = g.metadata();
        let arch = g.architecture().unwrap_or("").to_owned();
        let key = |k: &str| format!("{arch}.{k}");
        let mut f = ModelFacts {
            path: g.path().to_owned(),
            format: format!("GGUF v{}", g.version()),
            architecture: (!arch.is_empty()).then(|| arch.clone()),
            name: md.get_str("general.name").map(str::to_owned),
            layers: md.get_u64(&key("block_count")),
            hidden: md.get_u64(&key("embedding_length")),
            ffn: md.get_u64(&key("feed_forward_length")),
            heads: md.get_u64(&key("attention.head_count")),
            context: md.get_u64(&key("context_length")),
            rope_theta: md.get_f64(&key("rope.freq_base")),
            chat_template: md.get_str("tokenizer.chat_template").is_some(),
            ..Default::default()
        };
        f.kv_heads = md.get_u64(&key("attention.head_count_kv")).or(f.heads);
        f.head_dim = md.get_u64(&key("attention.key_length")).or_else(|| match (f.hidden, f.heads) {
            (Some(h), Some(n)) if n > 0 => Some(h / n),
            _ => None,
        });
        f.vocab =
            md.get_array("tokenizer.ggml.tokens").map(|a| a.len() as u64).or_else(|| md.get_u64(&key("vocab_size")));
        f.tokenizer = md.get_str("tokenizer.ggml.model").map(|m| match md.get_str("tokenizer.ggml.pre") {
            Some(pre) => format!("{m} (pre: {pre})"),
            None => m.to_owned(),
        });
        f.count_tensors(g);
        f.finish();
        f
    }

    /// Facts from a Hugging Face-style directory: `config.json`, safetensors weights, tokenizer files.
    pub fn from_hf_dir(dir: &Path) -> Result<ModelFacts, String> {
        let cfg = HfConfig::from_dir(dir).map_err(|e| e.to_string())?;
        let st = SafetensorsModel::open_dir(dir).map_err(|e| e.to_string())?;
        let shards = st.shards().len();
        let format = if shards == 1 { "safetensors".into() } else { format!("safetensors ({shards} shards)") };
        Ok(ModelFacts::from_config(dir, &cfg, &st, format))
    }

    /// Facts of `--load-format dummy`: the config at `config` (a `config.json` or a directory holding one) with
    /// random weights of `dtype` (default: the config's `torch_dtype`).
    pub fn from_dummy(config: &Path, dtype: Option<DType>) -> Result<ModelFacts, String> {
        let (dir, _, cfg, dtype) = crate::session::dummy_config(config, dtype)?;
        let src = tf_loader::dummy::DummyWeights::new(&cfg, dtype, 0).map_err(|e| e.to_string())?;
        Ok(ModelFacts::from_config(dir, &cfg, &src, format!("dummy weights ({dtype})")))
    }

    /// Facts from a Hugging Face config and the weights `src` of the directory `dir`.
    fn from_config(dir: &Path, cfg: &HfConfig, src: &dyn WeightSource, format: String) -> ModelFacts {
        let tokenizer_config: Option<serde_json::Value> =
            std::fs::read_to_string(dir.join("tokenizer_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        let has_template = dir.join("chat_template.jinja").is_file()
            || dir.join("chat_template.json").is_file()
            || tokenizer_config.as_ref().is_some_and(|c| !c["chat_template"].is_null());
        let mut f = ModelFacts {
            path: dir.display().to_string(),
            format,
            architecture: cfg.architectures.first().cloned().or_else(|| Some(cfg.model_type.clone())),
            name: dir.file_name().map(|n| n.to_string_lossy().into_owned()),
            layers: Some(cfg.num_hidden_layers),
            hidden: Some(cfg.hidden_size),
            ffn: Some(cfg.intermediate_size),
            heads: Some(cfg.num_attention_heads),
            kv_heads: Some(cfg.num_key_value_heads),
            head_dim: Some(cfg.head_dim),
            context: cfg.max_position_embeddings,
            vocab: Some(cfg.vocab_size),
            rope_theta: cfg.rope_theta,
            tokenizer: dir.join("tokenizer.json").is_file().then(|| "tokenizer.json".to_owned()),
            chat_template: has_template,
            ..Default::default()
        };
        f.count_tensors(src);
        f.finish();
        if f.family.is_none() {
            f.family = tf_models::family_for_hf_architecture(&cfg.model_type).map(|fam| fam.name.to_owned());
        }
        f
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
        let types: Vec<String> = {
            let mut v: Vec<(&String, &usize)> = self.tensor_types.iter().collect();
            // Most common first, then by name.
            v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            v.into_iter().map(|(t, n)| format!("{t}×{n}")).collect()
        };
        let family = match (&self.family, &self.architecture) {
            (Some(f), _) => f.clone(),
            (None, Some(a)) => format!("unsupported (architecture '{a}')"),
            (None, None) => "unknown (no architecture in the file)".into(),
        };
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<14}{v}\n"));
        line("model", self.path.clone());
        if let Some(n) = &self.name {
            line("name", n.clone());
        }
        line("format", self.format.clone());
        line("family", family);
        line("parameters", format!("{} ({})", human_count(self.parameters), self.parameters));
        line("tensor types", types.join(", "));
        line("layers", opt(self.layers));
        line("hidden", opt(self.hidden));
        line("ffn", opt(self.ffn));
        line(
            "heads",
            format!("{} query, {} key/value, head dim {}", opt(self.heads), opt(self.kv_heads), opt(self.head_dim)),
        );
        line("context", opt(self.context));
        line("vocab", opt(self.vocab));
        if let Some(t) = self.rope_theta {
            line("rope theta", t.to_string());
        }
        line("tokenizer", self.tokenizer.clone().unwrap_or_else(|| "?".into()));
        line("chat template", if self.chat_template { "yes" } else { "no" }.into());
        let kv = match self.kv_bytes_per_token {
            Some(b) => format!(
                " + KV {} ({} per token, {}) for {} tokens",
                human_bytes(b * self.memory_context),
                human_bytes(b),
                self.kv_type,
                self.memory_context
            ),
            None => String::new(),
        };
        line("memory", format!("{} = weights {}{kv}", human_bytes(self.memory_bytes), human_bytes(self.weight_bytes)));
        s
    }
}

/// Whether `name` is a quantized GGML type, for summaries.
pub fn is_quant_name(name: &str) -> bool {
    DType::ALL.iter().any(|d| d.name() == name && d.is_quantized())
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_count(134_515_008), "134.5M");
        assert_eq!(human_count(1_543_714_304), "1.54B");
        assert!(is_quant_name("Q4_K") && !is_quant_name("F32"));
    }
}
