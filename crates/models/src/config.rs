//! `ModelConfig`: the hyper-parameters of a decoder, read from GGUF metadata or a Hugging Face `config.json`
//! through [`ConfigView`].
//!
//! GGUF keys are `{arch}.…` (`llama.block_count`); `config.json` keys are the transformers names, already
//! resolved by the loader (defaults applied, `layer_types` listed for every layer). Family-specific facts that
//! neither format writes down (Gemma 3's sliding pattern and local RoPE base in GGUF, the RoPE pair layout) are
//! decided here, in one place, with the reason next to each.

use crate::model::ModelError;
use crate::registry::Family;
use tf_core::{ConfigFormat, ConfigView, GluAct, Rope, RopeScaling, RopeStyle};

/// Most layers a configuration may declare (the bound `config.json` files are read with, for GGUF metadata too).
/// Released decoders have at most a few hundred; a larger count is a corrupt or hostile file, refused before
/// per-layer tables are sized by it.
const MAX_LAYERS: usize = 1024;

/// Everything the shared decoder needs to know about a checkpoint's shape and arithmetic.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The family (registry name: `llama`, `qwen2`, `qwen3`, `gemma3`).
    pub family: &'static str,
    /// Where the configuration came from; decides the tensor names.
    pub format: ConfigFormat,
    /// Residual width.
    pub hidden: usize,
    /// Feed-forward inner width.
    pub ffn: usize,
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Per-head size of q, k and v.
    pub head_dim: usize,
    /// Vocabulary size declared by the config (checked against the embedding table at load).
    pub vocab: Option<usize>,
    /// Trained context length.
    pub context: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE of full-attention layers.
    pub rope: Rope,
    /// RoPE of sliding-window layers (Gemma 3 uses a smaller base there); `rope` when absent.
    pub rope_local: Option<Rope>,
    /// Sliding window of each layer (None = full attention).
    pub windows: Vec<Option<u32>>,
    /// q·k multiplier.
    pub attn_scale: f32,
    /// Attention logit soft-capping.
    pub attn_softcap: Option<f32>,
    /// q/k/v projections carry biases (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Feed-forward activation.
    pub act: GluAct,
    /// Whether the output head may share the embedding table when no head is stored.
    pub tie_embeddings: bool,
    /// The mixture-of-experts feed-forward (Qwen3-MoE, Mixtral); `None` for a dense model.
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts feed-forward: a router picks `used` of `experts` experts per token (the highest router
/// probabilities, ties to the lower expert id) and the token's output is their outputs weighted by those
/// probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts in each sparse layer.
    pub experts: usize,
    /// Experts each token goes through (top-k).
    pub used: usize,
    /// Feed-forward width of each expert.
    pub ffn: usize,
    /// The chosen experts' probabilities are divided by their sum (Qwen3-MoE with `norm_topk_prob`, Mixtral, and
    /// llama.cpp for both); otherwise they are the softmax over all experts as is.
    pub norm_topk: bool,
    /// Per layer: a sparse (mixture-of-experts) layer, or a dense feed-forward of [`ModelConfig::ffn`].
    pub sparse: Vec<bool>,
}

impl ModelConfig {
    /// The RoPE of layer `l`.
    pub fn rope_for(&self, l: usize) -> &Rope {
        match (&self.rope_local, self.windows[l]) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        }
    }

    /// Reads the configuration of a checkpoint of `family`.
    pub fn from_view(cfg: &dyn ConfigView, family: &Family) -> Result<ModelConfig, ModelError> {
        let r = Reader { cfg, arch: cfg.architecture().unwrap_or_default() };
        let gguf = cfg.format() == ConfigFormat::Gguf;
        let gemma3 = family.name == "gemma3";
        let key = |g: &'static str, h: &'static str| Key { gguf: g, hf: h };

        let hidden = r.count(key("embedding_length", "hidden_size"))?;
        let ffn = r.count(key("feed_forward_length", "intermediate_size"))?;
        let layers_key = key("block_count", "num_hidden_layers");
        let layers = r.count(layers_key)?;
        if layers > MAX_LAYERS {
            // Per-layer tables are sized by this count before any tensor is looked up.
            return Err(r.err(&format!("{} = {layers} is more than {MAX_LAYERS} layers", r.name(layers_key))));
        }
        let heads = r.count(key("attention.head_count", "num_attention_heads"))?;
        let kv_heads = r.opt_count(key("attention.head_count_kv", "num_key_value_heads"))?.unwrap_or(heads);
        if heads % kv_heads != 0 {
            return Err(r.err(&format!("{kv_heads} key/value heads do not divide {heads} query heads")));
        }
        let head_dim = match r.opt_count(key("attention.key_length", "head_dim"))? {
            Some(d) => d,
            None if hidden % heads == 0 => hidden / heads,
            None => return Err(r.err(&format!("hidden size {hidden} is not a multiple of {heads} heads"))),
        };
        if let Some(v) = r.opt_count(key("attention.value_length", "v_head_dim"))? {
            if v != head_dim {
                return Err(r.err(&format!("value head size {v} differs from key head size {head_dim}")));
            }
        }
        let vocab = match r.opt_count(key("vocab_size", "vocab_size"))? {
            Some(v) => Some(v),
            None if gguf => cfg.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()),
            None => None,
        };
        let context = r.opt_count(key("context_length", "max_position_embeddings"))?.unwrap_or(2048);
        let eps = r.f64(key("attention.layer_norm_rms_epsilon", "rms_norm_eps"))?.unwrap_or(1e-6) as f32;

        // RoPE. llama.cpp's converter permutes the Q/K rows of `llama`-arch checkpoints so that GGUF llama rotates
        // adjacent pairs (`LLAMA_ROPE_TYPE_NORM`); every other case here keeps the Hugging Face half-split layout
        // (`LLAMA_ROPE_TYPE_NEOX` for qwen2, qwen3 and gemma3 in llama.cpp).
        let style = if gguf && family.name == "llama" { RopeStyle::Normal } else { RopeStyle::Neox };
        let theta = r.f64(key("rope.freq_base", "rope_theta"))?.unwrap_or(10_000.0);
        let rot_dims = if gguf {
            cfg.get_u64(&r.gguf_key("rope.dimension_count")).map_or(head_dim, |d| d as usize)
        } else {
            cfg.get_f64("partial_rotary_factor").map_or(head_dim, |f| (head_dim as f64 * f).round() as usize)
        };
        if rot_dims == 0 || rot_dims > head_dim || rot_dims % 2 != 0 {
            return Err(r.err(&format!("rotary dimensions {rot_dims} do not fit head size {head_dim}")));
        }
        let scaling = r.rope_scaling()?;
        let rope = Rope { theta, rot_dims, style, scaling };

        // Sliding windows: Gemma 3 in GGUF says only the window; llama.cpp fixes the pattern (every 6th layer
        // global) and the local base (10 000) for the architecture. `config.json` lists `layer_types`.
        let window = r.opt_count(key("attention.sliding_window", "sliding_window"))?.map(|w| w as u32);
        let windows: Vec<Option<u32>> = match (gguf, window) {
            (_, None) => vec![None; layers],
            // gpt-oss in GGUF: llama.cpp's pattern for the architecture, sliding on even layers (as the
            // transformers default `layer_types`).
            (true, Some(w)) if family.name == "gpt_oss" => {
                (0..layers).map(|l| if l % 2 == 0 { Some(w) } else { None }).collect()
            }
            (true, Some(w)) if gemma3 => {
                let p = cfg.get_u64(&r.gguf_key("attention.sliding_window_pattern")).unwrap_or(6).max(1) as usize;
                (0..layers).map(|l| if (l + 1) % p == 0 { None } else { Some(w) }).collect()
            }
            (true, Some(w)) => vec![Some(w); layers],
            (false, Some(w)) => {
                let types = cfg.get_str_array("layer_types").unwrap_or_else(|| vec![String::new(); layers]);
                if types.len() != layers {
                    return Err(r.err(&format!("layer_types has {} entries for {layers} layers", types.len())));
                }
                types.iter().map(|t| (t == "sliding_attention").then_some(w)).collect()
            }
        };
        let rope_local = if gemma3 {
            let base = if gguf { cfg.get_f64(&r.gguf_key("rope.freq_base_swa")) } else { None };
            let local = base.or_else(|| cfg.get_f64("rope_local_base_freq")).unwrap_or(10_000.0);
            Some(Rope { theta: local, scaling: RopeScaling::None, ..rope })
        } else {
            None
        };

        // Attention scale: Gemma 3 scales by query_pre_attn_scalar^-0.5. GGUF does not store that scalar;
        // llama.cpp uses the head size, except for the 27B (62 layers), whose scalar is hidden / heads. A GGUF
        // `{arch}.attention.scale` (llama.cpp's key for an explicit q·k multiplier) overrides all of this.
        let explicit_scale = if gguf { cfg.get_f64(&r.gguf_key("attention.scale")) } else { None };
        let scalar = if gemma3 && gguf {
            if layers == 62 {
                (hidden / heads) as f64
            } else {
                head_dim as f64
            }
        } else if gemma3 {
            cfg.get_f64("query_pre_attn_scalar").unwrap_or(256.0)
        } else {
            head_dim as f64
        };
        let attn_scale = explicit_scale.unwrap_or_else(|| scalar.powf(-0.5)) as f32;
        let attn_softcap = if gguf {
            cfg.get_f64(&r.gguf_key("attn_logit_softcapping"))
        } else {
            cfg.get_f64("attn_logit_softcapping")
        }
        .map(|c| c as f32);
        let final_softcap = if gguf {
            cfg.get_f64(&r.gguf_key("final_logit_softcapping"))
        } else {
            cfg.get_f64("final_logit_softcapping")
        };
        if final_softcap.is_some() {
            return Err(r.err("final logit soft-capping is not supported"));
        }

        let act = if gemma3 {
            GluAct::GeluTanh
        } else if family.name == "gpt_oss" {
            // gpt-oss's clamped SwiGLU; llama.cpp fixes alpha 1.702 and limit 7 for the architecture.
            let f = |k: &str, d: f64| if gguf { d } else { cfg.get_f64(k).unwrap_or(d) };
            GluAct::SwigluClamp { alpha: f("swiglu_alpha", 1.702) as f32, limit: f("swiglu_limit", 7.0) as f32 }
        } else {
            GluAct::Silu
        };
        if !gguf {
            let name = cfg.get_str("hidden_act").unwrap_or_else(|| "silu".to_owned());
            let want = if gemma3 { ["gelu_pytorch_tanh", "gelu_tanh"] } else { ["silu", "swish"] };
            if !want.contains(&name.as_str()) {
                return Err(r.err(&format!("activation {name:?} is not supported for {}", family.name)));
            }
            if cfg.get_bool("mlp_bias") == Some(true) {
                return Err(r.err("mlp_bias is not supported"));
            }
        }
        let bias_flag = if gguf { None } else { cfg.get_bool("attention_bias") };
        let moe = r.moe(layers, ffn)?;
        Ok(ModelConfig {
            family: family.name,
            format: cfg.format(),
            hidden,
            ffn,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab,
            context,
            eps,
            rope,
            rope_local,
            windows,
            attn_scale,
            attn_softcap,
            qkv_bias: family.name == "qwen2" || bias_flag == Some(true),
            qk_norm: matches!(family.name, "qwen3" | "qwen3moe") || gemma3,
            act,
            tie_embeddings: if gguf { true } else { cfg.get_bool("tie_word_embeddings").unwrap_or(true) },
            moe,
        })
    }
}

/// A setting's key in each format: GGUF without the `{arch}.` prefix, and the `config.json` name.
#[derive(Clone, Copy)]
struct Key {
    gguf: &'static str,
    hf: &'static str,
}

struct Reader<'a> {
    cfg: &'a dyn ConfigView,
    arch: String,
}

impl Reader<'_> {
    fn gguf(&self) -> bool {
        self.cfg.format() == ConfigFormat::Gguf
    }

    fn gguf_key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn name(&self, k: Key) -> String {
        if self.gguf() {
            self.gguf_key(k.gguf)
        } else {
            k.hf.to_owned()
        }
    }

    fn err(&self, problem: &str) -> ModelError {
        ModelError(format!("{} config: {problem}", self.arch))
    }

    fn opt_count(&self, k: Key) -> Result<Option<usize>, ModelError> {
        let name = self.name(k);
        match self.cfg.get_u64(&name) {
            None => Ok(None),
            Some(0) => Err(self.err(&format!("{name} is 0"))),
            Some(v) if v > 1 << 28 => Err(self.err(&format!("{name} = {v} is out of range"))),
            Some(v) => Ok(Some(v as usize)),
        }
    }

    fn count(&self, k: Key) -> Result<usize, ModelError> {
        self.opt_count(k)?.ok_or_else(|| self.err(&format!("{} is missing", self.name(k))))
    }

    fn f64(&self, k: Key) -> Result<Option<f64>, ModelError> {
        let name = self.name(k);
        match self.cfg.get_f64(&name) {
            Some(v) if !(v.is_finite() && v > 0.0) => Err(self.err(&format!("{name} = {v} is out of range"))),
            v => Ok(v),
        }
    }

    /// The mixture-of-experts settings, if the checkpoint has experts. GGUF: `{arch}.expert_count`,
    /// `expert_used_count`, `expert_feed_forward_length` (else `feed_forward_length`), `expert_weights_norm`
    /// (llama.cpp normalizes the top-k weights of these families unless told otherwise), every layer sparse.
    /// `config.json`: Qwen3-MoE's `num_experts`, `moe_intermediate_size`, `norm_topk_prob`,
    /// `decoder_sparse_step` and `mlp_only_layers`, or Mixtral's `num_local_experts` (its weights are always
    /// normalized: a softmax over the top-k logits); `num_experts_per_tok` for both.
    fn moe(&self, layers: usize, ffn: usize) -> Result<Option<MoeConfig>, ModelError> {
        let (experts, used) = if self.gguf() {
            (self.opt_count(Key { gguf: "expert_count", hf: "" })?, Key { gguf: "expert_used_count", hf: "" })
        } else {
            let e = match self.opt_count(Key { gguf: "", hf: "num_experts" })? {
                Some(e) => Some(e),
                None => self.opt_count(Key { gguf: "", hf: "num_local_experts" })?,
            };
            (e, Key { gguf: "", hf: "num_experts_per_tok" })
        };
        let Some(experts) = experts else { return Ok(None) };
        let used = self.count(used)?;
        if used > experts {
            return Err(self.err(&format!("{used} experts per token of {experts}")));
        }
        // Qwen3-MoE names its expert width `moe_intermediate_size` (transformers 5 also writes `num_local_experts`
        // into its config.json); Mixtral's experts are `intermediate_size` wide.
        let mixtral = !self.gguf() && self.cfg.get_u64("moe_intermediate_size").is_none();
        let (expert_ffn, norm_topk, sparse) = if self.gguf() {
            let f = self.opt_count(Key { gguf: "expert_feed_forward_length", hf: "" })?.unwrap_or(ffn);
            let norm = self.cfg.get_bool(&self.gguf_key("expert_weights_norm")).unwrap_or(true);
            (f, norm, vec![true; layers])
        } else if mixtral {
            (ffn, true, vec![true; layers])
        } else {
            let f = self.count(Key { gguf: "", hf: "moe_intermediate_size" })?;
            let step = self.opt_count(Key { gguf: "", hf: "decoder_sparse_step" })?.unwrap_or(1);
            let dense: Vec<usize> =
                self.cfg.get_f64_array("mlp_only_layers").unwrap_or_default().into_iter().map(|l| l as usize).collect();
            let sparse = (0..layers).map(|l| !dense.contains(&l) && (l + 1) % step == 0).collect();
            (f, self.cfg.get_bool("norm_topk_prob").unwrap_or(false), sparse)
        };
        Ok(Some(MoeConfig { experts, used, ffn: expert_ffn, norm_topk, sparse }))
    }

    /// YaRN of `factor`. `config.json`: `rope_scaling.original_max_position_embeddings`, `beta_fast` (32),
    /// `beta_slow` (1), `truncate` (true), and the magnitude `attention_factor`, else transformers' default
    /// `0.1·ln(factor) + 1` (DeepSeek's `mscale` / `mscale_all_dim` ratio is not supported). GGUF:
    /// `{arch}.rope.scaling.original_context_length`, `yarn_beta_fast` / `yarn_beta_slow` and `attn_factor` under
    /// `rope.scaling.` (the same defaults). GGUF has no `truncate`: llama.cpp always rounds the ramp bounds outwards,
    /// which is taken for every architecture but gpt-oss, whose reference implementation (OpenAI's, and the
    /// `truncate: false` of its `config.json`) does not round them.
    fn yarn(&self, factor: f64) -> Result<RopeScaling, ModelError> {
        let f = |hf: &str, gguf: &str| {
            if self.gguf() {
                self.cfg.get_f64(&self.gguf_key(&format!("rope.scaling.{gguf}")))
            } else {
                self.cfg.get_f64(&format!("rope_scaling.{hf}"))
            }
        };
        let Some(original_context) = f("original_max_position_embeddings", "original_context_length") else {
            return Err(self.err("YaRN RoPE scaling needs the original context length"));
        };
        if !self.gguf() && self.cfg.get_f64("rope_scaling.mscale_all_dim").is_some() {
            return Err(self.err("YaRN with mscale_all_dim is not supported"));
        }
        let truncate = if self.gguf() {
            self.arch != "gpt-oss"
        } else {
            self.cfg.get_bool("rope_scaling.truncate").unwrap_or(true)
        };
        let default_mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
        let yarn = RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast: f("beta_fast", "yarn_beta_fast").unwrap_or(32.0),
            beta_slow: f("beta_slow", "yarn_beta_slow").unwrap_or(1.0),
            truncate,
            mscale: f("attention_factor", "attn_factor").unwrap_or(default_mscale),
        };
        match yarn {
            RopeScaling::Yarn { original_context, beta_fast, beta_slow, mscale, .. }
                if [original_context, beta_fast, beta_slow, mscale].iter().all(|v| v.is_finite() && *v > 0.0) =>
            {
                Ok(yarn)
            }
            _ => Err(self.err(&format!("YaRN RoPE scaling {yarn:?} is out of range"))),
        }
    }

    /// `{arch}.rope.scaling.*` or `rope_scaling.*`. Llama 3 scaling in GGUF is a `rope_freqs` tensor, handled at
    /// load time (`load::rope_freqs_scaling`).
    fn rope_scaling(&self) -> Result<RopeScaling, ModelError> {
        let (kind, factor) = if self.gguf() {
            let kind = self.cfg.get_str(&self.gguf_key("rope.scaling.type"));
            (kind, self.cfg.get_f64(&self.gguf_key("rope.scaling.factor")))
        } else {
            (self.cfg.get_str("rope_scaling.rope_type"), self.cfg.get_f64("rope_scaling.factor"))
        };
        let factor_ok = |f: Option<f64>| match f {
            Some(f) if f.is_finite() && f > 0.0 => Ok(f),
            _ => Err(self.err(&format!("RoPE scaling factor {f:?} is missing or out of range"))),
        };
        match kind.as_deref() {
            None | Some("none") | Some("default") => Ok(RopeScaling::None),
            Some("linear") => Ok(RopeScaling::Linear { factor: factor_ok(factor)? }),
            Some("yarn") => self.yarn(factor_ok(factor)?),
            Some("llama3") if !self.gguf() => {
                let f = |k: &str| self.cfg.get_f64(&format!("rope_scaling.{k}"));
                let (Some(low), Some(high), Some(orig)) =
                    (f("low_freq_factor"), f("high_freq_factor"), f("original_max_position_embeddings"))
                else {
                    return Err(self.err("llama3 RoPE scaling needs low/high_freq_factor and the original context"));
                };
                Ok(RopeScaling::Llama3 {
                    factor: factor_ok(factor)?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_context: orig,
                })
            }
            Some(other) => Err(self.err(&format!("RoPE scaling {other:?} is not supported"))),
        }
    }
}
