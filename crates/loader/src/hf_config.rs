//! Hugging Face `config.json` and `generation_config.json`.
//!
//! [`HfConfig`] reads the settings a decoder-only text model needs, validating them (no zero or absurd layer,
//! head or size counts; head counts that divide; a head size that exists). Multimodal configs that nest the
//! language model's settings in `text_config` (Gemma 3) are read from there; the token ids and dtype are
//! model-level settings and come from the top level when it has them. Gemma 3's text configs may omit fields
//! whose defaults live in `transformers` (`Gemma3TextConfig`: sizes, head counts, vocabulary, RoPE bases,
//! window, activation, token ids); those defaults are applied for `model_type` `gemma3_text` only. Everything
//! else stays available through [`HfConfig::raw`] and the typed getters.
//!
//! Newer `transformers` versions write `rope_parameters` (`rope_theta` plus the scaling keys, per attention
//! kind for Gemma 3) instead of `rope_theta` / `rope_scaling` / `rope_local_base_freq`; both spellings are read.

use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;

/// An error reading a config file: names the file, the field (when there is one) and the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (path or label) being read.
    pub file: String,
    /// The JSON key at fault, if any.
    pub field: Option<String>,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(k) => write!(f, "{}: field \"{}\": {}", self.file, k, self.problem),
            None => write!(f, "{}: {}", self.file, self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A token id or a list of them (`eos_token_id` is either in real configs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids (any of which ends generation, for `eos_token_id`).
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }

    /// The first id, if any.
    pub fn first(&self) -> Option<u32> {
        match self {
            TokenIds::One(id) => Some(*id),
            TokenIds::Many(ids) => ids.first().copied(),
        }
    }
}

/// The typed view of `rope_scaling` (keyed by `rope_type`, or the older `type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `"default"`: plain RoPE (some configs spell "no scaling" this way).
    Default,
    /// `"linear"`: positions divided by `factor`.
    Linear {
        /// Position divisor.
        factor: f64,
    },
    /// `"dynamic"`: dynamic NTK scaling.
    Dynamic {
        /// Context extension factor.
        factor: f64,
        /// Pre-extension context length, when given.
        original_max_position_embeddings: Option<u64>,
    },
    /// `"llama3"`: Llama 3.1+ frequency-band scaling.
    Llama3 {
        /// Scale for low frequencies.
        factor: f64,
        /// Wavelength band edges (as fractions of the original context).
        low_freq_factor: f64,
        /// See `low_freq_factor`.
        high_freq_factor: f64,
        /// Pre-extension context length.
        original_max_position_embeddings: u64,
    },
    /// `"yarn"`: YaRN.
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// Pre-extension context length, when given (else `max_position_embeddings` / factor by convention).
        original_max_position_embeddings: Option<u64>,
        /// Attention temperature factor, when given.
        attention_factor: Option<f64>,
        /// Ramp bounds, when given (defaults 32 and 1).
        beta_fast: Option<f64>,
        /// See `beta_fast`.
        beta_slow: Option<f64>,
    },
    /// Any other `rope_type` (`longrope`, `su`, ...): see `rope_scaling_raw`.
    Other {
        /// The type name as written.
        rope_type: String,
    },
}

/// Attention kind of one layer (Gemma 3 interleaves sliding-window and global layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Attends to every earlier position.
    Full,
    /// Attends to the last `sliding_window` positions.
    Sliding,
}

/// A model's `config.json`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// Model classes (`["LlamaForCausalLM"]`), from the top level.
    pub architectures: Vec<String>,
    /// The text model's `model_type` (`text_config.model_type` when nested, e.g. `gemma3_text`).
    pub model_type: String,
    /// The top-level `model_type` when it differs (e.g. `gemma3` for a multimodal config).
    pub outer_model_type: Option<String>,
    /// Residual stream width.
    pub hidden_size: u64,
    /// MLP inner width.
    pub intermediate_size: u64,
    /// Transformer blocks.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (defaults to `num_attention_heads`); divides `num_attention_heads`.
    pub num_key_value_heads: u64,
    /// Per-head size: `head_dim` when given, else `hidden_size / num_attention_heads`.
    pub head_dim: u64,
    /// Whether `head_dim` was given explicitly (or by a family default) rather than derived.
    pub head_dim_explicit: bool,
    /// Vocabulary size (embedding rows).
    pub vocab_size: u64,
    /// Trained context length, when given.
    pub max_position_embeddings: Option<u64>,
    /// Norm epsilon (`rms_norm_eps`, else `layer_norm_eps` / `layer_norm_epsilon`), when given.
    pub rms_norm_eps: Option<f64>,
    /// RoPE base (`rope_theta`, else `rope_parameters.rope_theta`), when given.
    pub rope_theta: Option<f64>,
    /// RoPE base of sliding-window layers (Gemma 3's `rope_local_base_freq`), when given.
    pub rope_local_base_freq: Option<f64>,
    /// Typed `rope_scaling` (None when absent or null).
    pub rope_scaling: Option<RopeScaling>,
    /// The raw `rope_scaling` object (or the scaling part of `rope_parameters`).
    pub rope_scaling_raw: Option<Value>,
    /// Whether the output head shares the embedding matrix (transformers' default: true).
    pub tie_word_embeddings: bool,
    /// Effective sliding window: None when absent, null, or disabled by `use_sliding_window: false` (Qwen2).
    pub sliding_window: Option<u64>,
    /// Per-layer attention kinds from `layer_types`, validated to have one entry per layer.
    pub layer_types: Option<Vec<LayerType>>,
    /// Gemma 3's `sliding_window_pattern` / `_sliding_window_pattern`: every Nth layer is global.
    pub sliding_window_pattern: Option<u64>,
    /// `attention_bias`, when given (Qwen2 has q/k/v biases without saying so).
    pub attention_bias: Option<bool>,
    /// The MLP activation (`hidden_act` or `hidden_activation`), when given.
    pub hidden_act: Option<String>,
    /// `torch_dtype` (or the newer `dtype`), when given.
    pub torch_dtype: Option<String>,
    /// Beginning-of-sequence id(s).
    pub bos_token_id: Option<TokenIds>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<TokenIds>,
    /// Padding id(s).
    pub pad_token_id: Option<TokenIds>,
    /// The whole file.
    pub raw: Value,
    /// The file this was read from (for later error messages).
    pub file: String,
}

/// Upper bounds on sizes that no real model exceeds; larger values mean a corrupt or hostile file.
const MAX_LAYERS: u64 = 1024;
const MAX_HEADS: u64 = 4096;
const MAX_HIDDEN: u64 = 1 << 18;
const MAX_INTERMEDIATE: u64 = 1 << 20;
const MAX_HEAD_DIM: u64 = 1 << 14;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_POSITIONS: u64 = 1 << 28;

/// Reads fields of one JSON object with errors naming the file and key.
struct Fields<'a> {
    /// The object being read.
    obj: &'a Map<String, Value>,
    /// Fallback object (the top level when reading `text_config`).
    outer: Option<&'a Map<String, Value>>,
    /// The file label for errors.
    file: &'a str,
    /// Key prefix for errors (`"text_config."` or empty).
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    fn error(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            field: Some(format!("{}{key}", self.prefix)),
            problem: problem.into(),
        }
    }

    /// The value of `key`, treating `null` as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// Like `get`, falling back to the outer object.
    fn get_or_outer(&self, key: &str) -> Option<&'a Value> {
        self.get(key).or_else(|| self.outer.and_then(|o| o.get(key)).filter(|v| !v.is_null()))
    }

    fn u64_of(&self, key: &str, v: &Value) -> Result<u64, ConfigError> {
        v.as_u64().ok_or_else(|| self.error(key, format!("expected a non-negative integer, found {v}")))
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.get(key).map(|v| self.u64_of(key, v)).transpose()
    }

    /// A required count in `1..=max`, with an optional family default when absent.
    fn count(&self, key: &str, max: u64, default: Option<u64>) -> Result<u64, ConfigError> {
        let v = match (self.opt_u64(key)?, default) {
            (Some(v), _) => v,
            (None, Some(d)) => d,
            (None, None) => return Err(self.error(key, "required field is missing")),
        };
        check_range(self, key, v, max)
    }

    fn opt_count(&self, key: &str, max: u64) -> Result<Option<u64>, ConfigError> {
        self.opt_u64(key)?.map(|v| check_range(self, key, v, max)).transpose()
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.error(key, format!("expected a finite number, found {v}"))),
            },
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.get_or_outer(key)
            .map(|v| v.as_bool().ok_or_else(|| self.error(key, format!("expected true or false, found {v}"))))
            .transpose()
    }

    fn opt_str(&self, key: &str, outer: bool) -> Result<Option<String>, ConfigError> {
        let v = if outer { self.get_outer_first(key) } else { self.get(key) };
        v.map(|v| v.as_str().map(str::to_owned).ok_or_else(|| self.error(key, format!("expected a string, found {v}"))))
            .transpose()
    }

    /// Like `get`, but the outer object wins: model-level settings (token ids, dtype) of a multimodal config
    /// live at the top level, while `text_config` may carry the text model's class defaults.
    fn get_outer_first(&self, key: &str) -> Option<&'a Value> {
        self.outer.and_then(|o| o.get(key)).filter(|v| !v.is_null()).or_else(|| self.get(key))
    }

    fn token_ids(&self, key: &str) -> Result<Option<TokenIds>, ConfigError> {
        self.get_outer_first(key).map(|v| token_ids_of(v).ok_or_else(|| self.error(key, bad_ids(v)))).transpose()
    }
}

fn bad_ids(v: &Value) -> String {
    format!("expected a token id or a list of token ids, found {v}")
}

fn check_range(f: &Fields, key: &str, v: u64, max: u64) -> Result<u64, ConfigError> {
    if v == 0 || v > max {
        Err(f.error(key, format!("{v} is out of range (expected 1..={max})")))
    } else {
        Ok(v)
    }
}

fn token_ids_of(v: &Value) -> Option<TokenIds> {
    let id = |v: &Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        Value::Array(items) => items.iter().map(id).collect::<Option<Vec<_>>>().map(TokenIds::Many),
        _ => id(v).map(TokenIds::One),
    }
}

/// `Gemma3TextConfig`'s defaults for fields that multimodal Gemma 3 configs leave out.
fn gemma3_text_default(key: &str) -> Option<u64> {
    Some(match key {
        "vocab_size" => 262_208,
        "hidden_size" => 2304,
        "intermediate_size" => 9216,
        "num_hidden_layers" => 26,
        "num_attention_heads" => 8,
        "num_key_value_heads" => 4,
        "head_dim" => 256,
        "max_position_embeddings" => 131_072,
        "sliding_window" => 4096,
        "sliding_window_pattern" => 6,
        _ => return None,
    })
}

/// Parses a JSON file, capping its size, with errors naming it.
fn read_json(path: &Path) -> Result<Value, ConfigError> {
    let file = path.display().to_string();
    let e = |p: String| ConfigError { file: file.clone(), field: None, problem: p };
    let meta = std::fs::metadata(path).map_err(|x| e(format!("cannot open: {x}")))?;
    if meta.len() > 16 << 20 {
        return Err(e(format!("file is {} bytes; config files are small", meta.len())));
    }
    let text = std::fs::read(path).map_err(|x| e(format!("cannot read: {x}")))?;
    serde_json::from_slice(&text).map_err(|x| e(format!("invalid JSON: {x}")))
}

fn parse_rope_scaling(f: &Fields, key: &str, v: &Value) -> Result<Option<RopeScaling>, ConfigError> {
    let obj = v.as_object().ok_or_else(|| f.error(key, format!("expected an object, found {v}")))?;
    let sub = Fields { obj, outer: None, file: f.file, prefix: "" };
    let kind = match sub.get("rope_type").or_else(|| sub.get("type")) {
        None => return Err(f.error(key, "has no \"rope_type\" (or \"type\")")),
        Some(t) => t.as_str().ok_or_else(|| f.error(key, format!("rope_type is not a string: {t}")))?.to_owned(),
    };
    let sub = Fields { prefix: &format!("{}{key}.", f.prefix), ..sub };
    let factor = || -> Result<f64, ConfigError> {
        match sub.opt_f64("factor")? {
            Some(x) if x > 0.0 && x <= 1e6 => Ok(x),
            Some(x) => Err(sub.error("factor", format!("{x} is out of range (expected 0 < factor <= 1e6)"))),
            None => Err(sub.error("factor", format!("required for rope_type \"{kind}\""))),
        }
    };
    let orig = || sub.opt_count("original_max_position_embeddings", MAX_POSITIONS);
    Ok(Some(match kind.as_str() {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: factor()?, original_max_position_embeddings: orig()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: sub
                .opt_f64("low_freq_factor")?
                .ok_or_else(|| sub.error("low_freq_factor", "required for rope_type \"llama3\""))?,
            high_freq_factor: sub
                .opt_f64("high_freq_factor")?
                .ok_or_else(|| sub.error("high_freq_factor", "required for rope_type \"llama3\""))?,
            original_max_position_embeddings: orig()?
                .ok_or_else(|| sub.error("original_max_position_embeddings", "required for rope_type \"llama3\""))?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: orig()?,
            attention_factor: sub.opt_f64("attention_factor")?,
            beta_fast: sub.opt_f64("beta_fast")?,
            beta_slow: sub.opt_f64("beta_slow")?,
        },
        _ => RopeScaling::Other { rope_type: kind },
    }))
}

impl HfConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<HfConfig, ConfigError> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// Reads and validates a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<HfConfig, ConfigError> {
        let path = path.as_ref();
        Self::from_value(read_json(path)?, &path.display().to_string())
    }

    /// Parses and validates config JSON text; `file` labels errors.
    pub fn from_json_str(text: &str, file: &str) -> Result<HfConfig, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError {
            file: file.to_owned(),
            field: None,
            problem: format!("invalid JSON: {e}"),
        })?;
        Self::from_value(v, file)
    }

    /// Validates an already parsed config; `file` labels errors.
    pub fn from_value(raw: Value, file: &str) -> Result<HfConfig, ConfigError> {
        let top_err = |p: &str| ConfigError { file: file.to_owned(), field: None, problem: p.to_owned() };
        let root = raw.as_object().ok_or_else(|| top_err("config is not a JSON object"))?;
        let top = Fields { obj: root, outer: None, file, prefix: "" };
        let (f, nested) = match root.get("text_config").filter(|v| !v.is_null()) {
            Some(Value::Object(tc)) => (Fields { obj: tc, outer: Some(root), file, prefix: "text_config." }, true),
            Some(v) => return Err(top.error("text_config", format!("expected an object, found {v}"))),
            None => (Fields { obj: root, outer: None, file, prefix: "" }, false),
        };
        let architectures = match root.get("architectures").filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| top.error("architectures", "expected a list of strings"))?,
            Some(v) => return Err(top.error("architectures", format!("expected a list of strings, found {v}"))),
        };
        let outer_type = top.opt_str("model_type", false)?;
        let inner_type = if nested { f.opt_str("model_type", false)? } else { None };
        let model_type = match (&inner_type, &outer_type) {
            (Some(t), _) => t.clone(),
            (None, Some(t)) if nested && t == "gemma3" => "gemma3_text".to_owned(),
            (None, Some(t)) => t.clone(),
            (None, None) => return Err(top.error("model_type", "required field is missing")),
        };
        let outer_model_type = outer_type.filter(|t| *t != model_type);
        let gemma3 = model_type == "gemma3_text";
        let dflt = |k: &str| if gemma3 { gemma3_text_default(k) } else { None };

        let hidden_size = f.count("hidden_size", MAX_HIDDEN, dflt("hidden_size"))?;
        let intermediate_size = f.count("intermediate_size", MAX_INTERMEDIATE, dflt("intermediate_size"))?;
        // Hybrid configs (Nemotron-H) list one entry per layer instead of a count.
        let listed_layers = match f.get("layers_block_type").or_else(|| f.get("hybrid_override_pattern")) {
            Some(Value::Array(a)) => Some(a.len() as u64),
            Some(Value::String(p)) => Some(p.chars().count() as u64),
            _ => None,
        };
        let num_hidden_layers =
            f.count("num_hidden_layers", MAX_LAYERS, dflt("num_hidden_layers").or(listed_layers))?;
        let num_attention_heads = f.count("num_attention_heads", MAX_HEADS, dflt("num_attention_heads"))?;
        let kv_default = dflt("num_key_value_heads").unwrap_or(num_attention_heads);
        let num_key_value_heads = f.count("num_key_value_heads", MAX_HEADS, Some(kv_default))?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(f.error(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let head_dim_given = f.opt_count("head_dim", MAX_HEAD_DIM)?.or(dflt("head_dim"));
        let head_dim = match head_dim_given {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(f.error(
                    "hidden_size",
                    format!(
                        "{hidden_size} is not divisible by num_attention_heads {num_attention_heads} and no head_dim \
                         is given"
                    ),
                ))
            }
        };
        let vocab_size = f.count("vocab_size", MAX_VOCAB, dflt("vocab_size"))?;
        let max_position_embeddings = match f.opt_count("max_position_embeddings", MAX_POSITIONS)? {
            Some(v) => Some(v),
            None => dflt("max_position_embeddings"),
        };

        let eps_key = ["rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps"]
            .into_iter()
            .find(|k| f.get(k).is_some());
        let rms_norm_eps = match eps_key {
            None if gemma3 => Some(1e-6),
            None => None,
            Some(k) => match f.opt_f64(k)? {
                Some(x) if x > 0.0 && x < 1.0 => Some(x),
                Some(x) => return Err(f.error(k, format!("{x} is out of range (expected 0 < eps < 1)"))),
                None => None,
            },
        };

        // RoPE: the classic keys, else `rope_parameters` (flat, or per attention kind for Gemma 3).
        let rp = f.get("rope_parameters");
        let (rp_main, rp_local) = match rp.and_then(Value::as_object) {
            Some(o) if o.contains_key("full_attention") => (o.get("full_attention"), o.get("sliding_attention")),
            Some(_) => (rp, None),
            None => (None, None),
        };
        let rope_theta = match f.opt_f64("rope_theta")? {
            Some(t) => Some(t),
            None => theta_of(&f, rp_main)?.or(if gemma3 { Some(1_000_000.0) } else { None }),
        };
        let rope_local_base_freq = match f.opt_f64("rope_local_base_freq")? {
            Some(t) => Some(t),
            None => theta_of(&f, rp_local)?.or(if gemma3 { Some(10_000.0) } else { None }),
        };
        for (k, t) in [("rope_theta", rope_theta), ("rope_local_base_freq", rope_local_base_freq)] {
            if let Some(t) = t.filter(|t| *t <= 0.0) {
                return Err(f.error(k, format!("{t} is out of range (expected > 0)")));
            }
        }
        let (scaling_key, scaling_raw) = match f.get("rope_scaling") {
            Some(v) => ("rope_scaling", Some(v)),
            None => ("rope_parameters", rp_main.filter(|v| rope_type_of(v).is_some_and(|t| t != "default"))),
        };
        let rope_scaling = match scaling_raw {
            Some(v) => parse_rope_scaling(&f, scaling_key, v)?,
            None => None,
        };

        let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(true);
        let use_sw = f.opt_bool("use_sliding_window")?;
        let sliding_window = match f.opt_count("sliding_window", MAX_POSITIONS)? {
            Some(_) if use_sw == Some(false) => None,
            Some(w) => Some(w),
            None => dflt("sliding_window"),
        };
        let pattern_key = if f.get("sliding_window_pattern").is_some() {
            "sliding_window_pattern"
        } else {
            "_sliding_window_pattern"
        };
        let sliding_window_pattern =
            f.opt_count(pattern_key, MAX_LAYERS)?.or(if gemma3 { dflt("sliding_window_pattern") } else { None });
        let layer_types = match f.get("layer_types") {
            None => None,
            Some(v) => Some(parse_layer_types(&f, v, num_hidden_layers)?),
        };
        let hidden_act = match f.opt_str("hidden_act", false)? {
            Some(a) => Some(a),
            None => f.opt_str("hidden_activation", false)?,
        }
        .or_else(|| gemma3.then(|| "gelu_pytorch_tanh".to_owned()));
        let ids = |key: &str, gemma3_default: u32| -> Result<Option<TokenIds>, ConfigError> {
            Ok(f.token_ids(key)?.or_else(|| gemma3.then_some(TokenIds::One(gemma3_default))))
        };
        let torch_dtype = match f.opt_str("torch_dtype", true)? {
            Some(d) => Some(d),
            None => f.opt_str("dtype", true)?,
        };
        Ok(HfConfig {
            architectures,
            model_type,
            outer_model_type,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            head_dim_explicit: head_dim_given.is_some(),
            vocab_size,
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
            rope_local_base_freq,
            rope_scaling,
            rope_scaling_raw: scaling_raw.cloned(),
            tie_word_embeddings,
            sliding_window,
            layer_types,
            sliding_window_pattern,
            attention_bias: f.opt_bool("attention_bias")?.or(gemma3.then_some(false)),
            hidden_act,
            torch_dtype,
            bos_token_id: ids("bos_token_id", 2)?,
            eos_token_id: ids("eos_token_id", 1)?,
            pad_token_id: ids("pad_token_id", 0)?,
            raw,
            file: file.to_owned(),
        })
    }

    /// The object the text settings were read from (`text_config` when nested, else the top level).
    pub fn text_json(&self) -> &Value {
        match self.raw.get("text_config") {
            Some(v) if v.is_object() => v,
            _ => &self.raw,
        }
    }

    /// A raw value from the text settings, falling back to the top level; `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.text_json().get(key).filter(|v| !v.is_null()).or_else(|| self.raw.get(key).filter(|v| !v.is_null()))
    }

    /// A numeric setting not covered by a field (e.g. `final_logit_softcapping`).
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// An integer setting not covered by a field.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// A boolean setting not covered by a field.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// The attention kind of every layer: `layer_types` when given; else, with a `sliding_window_pattern` N,
    /// every Nth layer (1-based) is full and the rest sliding; else, with a sliding window in effect, layers from
    /// `max_window_layers` on are sliding (Qwen2) or, without that key, all of them (Mistral); else all full.
    pub fn resolved_layer_types(&self) -> Vec<LayerType> {
        if let Some(t) = &self.layer_types {
            return t.clone();
        }
        let n = self.num_hidden_layers;
        match (self.sliding_window, self.sliding_window_pattern) {
            (Some(_), Some(p)) => {
                (0..n).map(|i| if (i + 1) % p == 0 { LayerType::Full } else { LayerType::Sliding }).collect()
            }
            (Some(_), None) => {
                let from = self.get_u64("max_window_layers").unwrap_or(0);
                (0..n).map(|i| if i >= from { LayerType::Sliding } else { LayerType::Full }).collect()
            }
            (None, _) => vec![LayerType::Full; n as usize],
        }
    }
}

fn rope_type_of(v: &Value) -> Option<&str> {
    v.get("rope_type").or_else(|| v.get("type")).and_then(Value::as_str)
}

fn theta_of(f: &Fields, v: Option<&Value>) -> Result<Option<f64>, ConfigError> {
    match v.and_then(|v| v.get("rope_theta")).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(t) => match t.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(f.error("rope_parameters", format!("rope_theta is not a finite number: {t}"))),
        },
    }
}

fn parse_layer_types(f: &Fields, v: &Value, layers: u64) -> Result<Vec<LayerType>, ConfigError> {
    let items = v.as_array().ok_or_else(|| f.error("layer_types", format!("expected a list, found {v}")))?;
    if items.len() as u64 != layers {
        return Err(f.error("layer_types", format!("has {} entries but num_hidden_layers is {layers}", items.len())));
    }
    items
        .iter()
        .map(|x| match x.as_str() {
            Some("full_attention") => Ok(LayerType::Full),
            Some("sliding_attention") => Ok(LayerType::Sliding),
            _ => Err(f.error("layer_types", format!("unknown layer type {x}"))),
        })
        .collect()
}

/// A model's `generation_config.json`: the sampling defaults its authors recommend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Sampling temperature (>= 0).
    pub temperature: Option<f64>,
    /// Nucleus mass in (0, 1].
    pub top_p: Option<f64>,
    /// Top-k cutoff (0 disables).
    pub top_k: Option<u64>,
    /// Min-p cutoff in [0, 1].
    pub min_p: Option<f64>,
    /// Repetition penalty (> 0; 1 disables).
    pub repetition_penalty: Option<f64>,
    /// Whether sampling is on (false means greedy in transformers).
    pub do_sample: Option<bool>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<TokenIds>,
    /// Beginning-of-sequence id(s).
    pub bos_token_id: Option<TokenIds>,
    /// Padding id(s).
    pub pad_token_id: Option<TokenIds>,
    /// Cap on generated tokens.
    pub max_new_tokens: Option<u64>,
    /// Cap on prompt + generated tokens.
    pub max_length: Option<u64>,
    /// The whole file.
    pub raw: Value,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; `Ok(None)` when the file does not exist.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Option<GenerationConfig>, ConfigError> {
        let p = dir.as_ref().join("generation_config.json");
        if !p.exists() {
            return Ok(None);
        }
        Self::from_file(&p).map(Some)
    }

    /// Reads and validates a `generation_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<GenerationConfig, ConfigError> {
        let path = path.as_ref();
        Self::from_value(read_json(path)?, &path.display().to_string())
    }

    /// Parses and validates generation config JSON text; `file` labels errors.
    pub fn from_json_str(text: &str, file: &str) -> Result<GenerationConfig, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError {
            file: file.to_owned(),
            field: None,
            problem: format!("invalid JSON: {e}"),
        })?;
        Self::from_value(v, file)
    }

    /// Validates an already parsed generation config; `file` labels errors.
    pub fn from_value(raw: Value, file: &str) -> Result<GenerationConfig, ConfigError> {
        let obj = raw.as_object().ok_or_else(|| ConfigError {
            file: file.to_owned(),
            field: None,
            problem: "generation config is not a JSON object".to_owned(),
        })?;
        let f = Fields { obj, outer: None, file, prefix: "" };
        let ranged = |k: &str, ok: fn(f64) -> bool, want: &str| -> Result<Option<f64>, ConfigError> {
            match f.opt_f64(k)? {
                Some(x) if !ok(x) => Err(f.error(k, format!("{x} is out of range (expected {want})"))),
                x => Ok(x),
            }
        };
        let do_sample = f.opt_bool("do_sample")?;
        Ok(GenerationConfig {
            temperature: ranged("temperature", |x| (0.0..=1e4).contains(&x), "0 <= temperature <= 1e4")?,
            top_p: ranged("top_p", |x| x > 0.0 && x <= 1.0, "0 < top_p <= 1")?,
            top_k: f.opt_u64("top_k")?,
            min_p: ranged("min_p", |x| (0.0..=1.0).contains(&x), "0 <= min_p <= 1")?,
            repetition_penalty: ranged("repetition_penalty", |x| x > 0.0, "> 0")?,
            do_sample,
            eos_token_id: f.token_ids("eos_token_id")?,
            bos_token_id: f.token_ids("bos_token_id")?,
            pad_token_id: f.token_ids("pad_token_id")?,
            max_new_tokens: f.opt_u64("max_new_tokens")?,
            max_length: f.opt_u64("max_length")?,
            raw,
        })
    }
}
