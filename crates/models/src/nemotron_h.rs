//! `nemotron_h`: NVIDIA's hybrid decoder (Nemotron-H, Nemotron Nano 2). Each layer is one mixer behind a
//! pre-norm and a residual: a Mamba-2 mixer (a recurrent state per sequence), attention without positional
//! encoding, or a squared-ReLU MLP; the config lists them per layer (`layers_block_type`, or the older
//! `hybrid_override_pattern` of `M`, `*`, `-`).
//!
//! Mamba-2 mixer, per row: `in_proj` gives the gate `z [I]`, `xBC [I + 2·G·N]` and `dt [heads]`; `xBC` goes
//! through the depthwise causal convolution and SiLU ([`Backend::ssm_conv`], its window in the state), then the
//! selective scan with the D skip, the `silu(z)` gate and a group RMSNorm ([`Backend::ssm_scan`], its SSM state in
//! the state); `out_proj` back to the residual. The state a row reads and where it goes are the batch's
//! [`Batch::states`], so a verify window keeps one state per row and the engine commits the accepted one.
//!
//! Safetensors and GGUF (llama.cpp's `nemotron_h`: `blk.{l}.ssm_*` tensors, the layer kinds in the per-layer
//! `head_count_kv` / `feed_forward_length` arrays, `ssm.*` keys). Two conversions of llama.cpp's converter are
//! undone so both formats load the same bits: the Q/K rows of attention layers are permuted per head as for RoPE
//! (though the architecture has none), and `A_log` is stored as `A = -exp(A_log)` (see `a_log_of`).

use crate::layers::{self, logits, trace};
use crate::model::{Batch, Model, ModelError};
use tf_core::{
    AttnParams, Backend, ConfigFormat, ConfigView, KvCache, KvSpec, SsmParams, StateSpec, Tensor, TensorInfo, Weight,
    WeightSource,
};

/// The shape and constants of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    pub hidden: usize,
    pub vocab: usize,
    pub context: usize,
    pub eps: f32,
    pub kinds: Vec<LayerKind>,
    /// Attention heads, KV heads and head size.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// MLP inner width.
    pub ffn: usize,
    /// Mamba-2: heads, channels per head, B/C groups, state size, convolution width, step floor.
    pub ssm_heads: usize,
    pub ssm_head_dim: usize,
    pub groups: usize,
    pub d_state: usize,
    pub conv_kernel: usize,
    pub conv_bias: bool,
    pub dt_min: f32,
    pub tie_embeddings: bool,
}

/// What a layer's mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Mamba,
    Attention,
    Mlp,
}

fn bad(key: &str, what: impl std::fmt::Display) -> ModelError {
    ModelError(format!("nemotron_h config: {key}: {what}"))
}

impl HybridConfig {
    pub fn from_view(cfg: &dyn ConfigView) -> Result<HybridConfig, ModelError> {
        if cfg.format() == ConfigFormat::Gguf {
            return Self::from_gguf(cfg);
        }
        let u = |k: &str| cfg.get_u64(k).map(|v| v as usize).ok_or_else(|| bad(k, "missing"));
        let kinds: Vec<LayerKind> = match cfg.get_str_array("layers_block_type") {
            Some(list) => list
                .iter()
                .map(|t| match t.as_str() {
                    "mamba" | "linear_attention" => Ok(LayerKind::Mamba),
                    "attention" | "full_attention" => Ok(LayerKind::Attention),
                    "mlp" => Ok(LayerKind::Mlp),
                    "moe" => Err(bad("layers_block_type", "mixture-of-experts layers are not supported yet")),
                    other => Err(bad("layers_block_type", format!("unknown layer type {other:?}"))),
                })
                .collect::<Result<_, _>>()?,
            None => {
                let p = cfg.get_str("hybrid_override_pattern").ok_or_else(|| bad("layers_block_type", "missing"))?;
                p.chars()
                    .map(|c| match c {
                        'M' => Ok(LayerKind::Mamba),
                        '*' => Ok(LayerKind::Attention),
                        '-' => Ok(LayerKind::Mlp),
                        'E' => Err(bad("hybrid_override_pattern", "mixture-of-experts layers are not supported yet")),
                        other => Err(bad("hybrid_override_pattern", format!("unknown layer code {other:?}"))),
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        if kinds.is_empty() || kinds.len() > 1024 {
            return Err(bad("layers_block_type", format!("{} layers", kinds.len())));
        }
        let hidden = u("hidden_size")?;
        let heads = u("num_attention_heads")?;
        let kv_heads = cfg.get_u64("num_key_value_heads").map_or(heads, |v| v as usize);
        // Nemotron-H's own configs name it `attention_head_dim` (read first: the config reader derives a `head_dim`
        // of hidden / heads when none is written).
        let head_dim = cfg
            .get_u64("attention_head_dim")
            .or_else(|| cfg.get_u64("head_dim"))
            .map_or(hidden / heads.max(1), |v| v as usize);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(bad("num_key_value_heads", format!("{kv_heads} vs {heads} heads")));
        }
        let act = cfg.get_str("mlp_hidden_act").unwrap_or_else(|| "relu2".into());
        if act != "relu2" {
            return Err(bad("mlp_hidden_act", format!("{act:?} (supported: relu2)")));
        }
        for key in ["use_bias", "mamba_proj_bias", "mlp_bias", "attention_bias"] {
            if cfg.get_bool(key) == Some(true) {
                return Err(bad(key, "projection biases are not supported"));
            }
        }
        let act = cfg.get_str("mamba_hidden_act").unwrap_or_else(|| "silu".into());
        if act != "silu" {
            return Err(bad("mamba_hidden_act", format!("{act:?} (supported: silu)")));
        }
        let ssm_heads = u("mamba_num_heads")?;
        let groups = u("n_groups")?;
        if groups == 0 || !ssm_heads.is_multiple_of(groups) {
            return Err(bad("n_groups", format!("{groups} does not divide mamba_num_heads {ssm_heads}")));
        }
        let c = HybridConfig {
            hidden,
            vocab: u("vocab_size")?,
            context: cfg.get_u64("max_position_embeddings").map_or(4096, |v| v as usize),
            eps: cfg.get_f64("layer_norm_epsilon").or_else(|| cfg.get_f64("rms_norm_eps")).unwrap_or(1e-5) as f32,
            kinds,
            heads,
            kv_heads,
            head_dim,
            ffn: u("intermediate_size")?,
            ssm_heads,
            ssm_head_dim: u("mamba_head_dim")?,
            groups,
            d_state: u("ssm_state_size")?,
            conv_kernel: u("conv_kernel")?,
            conv_bias: cfg.get_bool("use_conv_bias").unwrap_or(true),
            dt_min: cfg.get_f64("time_step_min").unwrap_or(0.001) as f32,
            tie_embeddings: cfg.get_bool("tie_word_embeddings").unwrap_or(false),
        };
        if c.conv_kernel == 0 || c.d_state == 0 || c.ssm_head_dim == 0 || c.hidden == 0 {
            return Err(bad("conv_kernel/ssm_state_size/mamba_head_dim", "must be positive"));
        }
        Ok(c)
    }

    /// The configuration from llama.cpp's `nemotron_h` metadata. A layer's kind is llama.cpp's rule: recurrent
    /// where both `head_count_kv` and `feed_forward_length` are 0, else attention where `feed_forward_length` is 0,
    /// else MLP. What GGUF does not carry: the step floor (`time_step_min`, transformers' default 0.001, which
    /// llama.cpp does not apply) and whether the convolution has a bias (the loader takes it when the file has
    /// one).
    fn from_gguf(cfg: &dyn ConfigView) -> Result<HybridConfig, ModelError> {
        let arch = cfg.architecture().unwrap_or_default();
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| cfg.get_u64(&key(k)).map(|v| v as usize).ok_or_else(|| bad(&key(k), "missing"));
        let layers = u("block_count")?;
        if layers == 0 || layers > 1024 {
            return Err(bad(&key("block_count"), format!("{layers} layers")));
        }
        // A per-layer value: an array of one entry per layer, or one number for all.
        let per_layer = |k: &str| -> Result<Vec<usize>, ModelError> {
            match cfg.get_f64_array(&key(k)) {
                Some(v) if v.len() == layers => Ok(v.into_iter().map(|x| x as usize).collect()),
                Some(v) => Err(bad(&key(k), format!("{} entries for {layers} layers", v.len()))),
                None => Ok(vec![u(k)?; layers]),
            }
        };
        let (kv, ff) = (per_layer("attention.head_count_kv")?, per_layer("feed_forward_length")?);
        let kinds: Vec<LayerKind> = kv
            .iter()
            .zip(&ff)
            .map(|(&kv, &ff)| match (kv, ff) {
                (0, 0) => LayerKind::Mamba,
                (_, 0) => LayerKind::Attention,
                _ => LayerKind::Mlp,
            })
            .collect();
        // One value for the layers that use it.
        let uniform = |k: &str, v: &[usize]| -> Result<usize, ModelError> {
            let mut used = v.iter().copied().filter(|&x| x > 0);
            let first = used.next().unwrap_or(0);
            match used.find(|&x| x != first) {
                Some(other) => Err(bad(&key(k), format!("differs between layers ({first} and {other})"))),
                None => Ok(first),
            }
        };
        let kv_heads = uniform("attention.head_count_kv", &kv)?;
        let ffn = uniform("feed_forward_length", &ff)?;
        if cfg.get_u64(&key("expert_count")).is_some_and(|e| e > 0) {
            return Err(bad(&key("expert_count"), "mixture-of-experts layers are not supported yet"));
        }
        if cfg.get_f64(&key("attention.scale")).is_some() {
            return Err(bad(&key("attention.scale"), "an explicit attention scale is not supported"));
        }
        let hidden = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        if heads == 0 || (kv_heads > 0 && !heads.is_multiple_of(kv_heads)) {
            return Err(bad(&key("attention.head_count_kv"), format!("{kv_heads} vs {heads} heads")));
        }
        let head_dim = cfg.get_u64(&key("attention.key_length")).map_or(hidden / heads, |v| v as usize);
        if let Some(v) = cfg.get_u64(&key("attention.value_length")).filter(|&v| v as usize != head_dim) {
            return Err(bad(&key("attention.value_length"), format!("{v} differs from key length {head_dim}")));
        }
        if kinds.contains(&LayerKind::Attention) && !head_dim.is_multiple_of(2) {
            // llama.cpp's converter permutes Q/K rows in pairs within each head.
            return Err(bad(&key("attention.key_length"), format!("{head_dim} is odd")));
        }
        let ssm_heads = u("ssm.time_step_rank")?;
        let inner = u("ssm.inner_size")?;
        let groups = u("ssm.group_count")?;
        if ssm_heads == 0 || !inner.is_multiple_of(ssm_heads) {
            return Err(bad(&key("ssm.inner_size"), format!("{inner} is not a multiple of {ssm_heads} heads")));
        }
        if groups == 0 || !ssm_heads.is_multiple_of(groups) {
            return Err(bad(&key("ssm.group_count"), format!("{groups} does not divide {ssm_heads} heads")));
        }
        let vocab = match cfg.get_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => cfg
                .get_str_array("tokenizer.ggml.tokens")
                .map(|t| t.len())
                .ok_or_else(|| bad("tokenizer.ggml.tokens", "missing (and no vocab_size to size the embedding by)"))?,
        };
        let c = HybridConfig {
            hidden,
            vocab,
            context: cfg.get_u64(&key("context_length")).map_or(4096, |v| v as usize),
            eps: cfg
                .get_f64(&key("attention.layer_norm_rms_epsilon"))
                .or_else(|| cfg.get_f64(&key("attention.layer_norm_epsilon")))
                .unwrap_or(1e-5) as f32,
            kinds,
            heads,
            kv_heads: kv_heads.max(1),
            head_dim,
            ffn,
            ssm_heads,
            ssm_head_dim: inner / ssm_heads,
            groups,
            d_state: u("ssm.state_size")?,
            conv_kernel: u("ssm.conv_kernel")?,
            conv_bias: true,
            dt_min: 0.001,
            tie_embeddings: true,
        };
        if c.conv_kernel == 0 || c.d_state == 0 || c.ssm_head_dim == 0 || c.hidden == 0 || c.head_dim == 0 {
            return Err(bad(&key("ssm.conv_kernel/ssm.state_size/ssm.inner_size"), "must be positive"));
        }
        Ok(c)
    }

    /// Mamba-2 inner width `I = heads · head_dim`.
    pub fn inner(&self) -> usize {
        self.ssm_heads * self.ssm_head_dim
    }

    /// Channels of the convolution: `x`, `B` and `C`.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.groups * self.d_state
    }
}

/// One Mamba-2 mixer.
struct Mamba {
    /// The three parts of `in_proj`: `z [I, H]`, `xbc [conv_dim, H]`, `dt [heads, H]`.
    in_z: Weight,
    in_xbc: Weight,
    in_dt: Weight,
    /// `conv [conv_dim, K]` and its bias `[conv_dim]` (host f32).
    conv: Vec<f32>,
    conv_bias: Option<Vec<f32>>,
    /// `[heads]` each.
    a_log: Vec<f32>,
    d: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated group norm `[I]`.
    norm: Vec<f32>,
    /// `out_proj [H, I]`.
    out: Weight,
    /// Its index among the recurrent layers (the state's layer), and among all layers.
    state_layer: usize,
    layer: usize,
}

enum Mixer {
    Mamba(Mamba),
    /// q `[Nq·Dh, H]`, k and v `[Nkv·Dh, H]`, o `[H, Nq·Dh]`; `kv_layer` its index among attention layers.
    Attention {
        q: Weight,
        k: Weight,
        v: Weight,
        o: Weight,
        kv_layer: usize,
    },
    /// up `[F, H]`, down `[H, F]`.
    Mlp {
        up: Weight,
        down: Weight,
    },
}

struct Layer {
    /// `[H]`.
    norm: Weight,
    mixer: Mixer,
}

pub struct NemotronH {
    cfg: HybridConfig,
    /// `[V, H]`.
    embd: Weight,
    layers: Vec<Layer>,
    /// `[H]`.
    output_norm: Weight,
    /// `[V, H]`.
    output: Weight,
    attn: AttnParams,
    kv_layers: usize,
    state_layers: usize,
}

/// Reads the checkpoint's tensors.
struct Reader<'a> {
    be: &'a dyn Backend,
    src: &'a dyn WeightSource,
}

impl Reader<'_> {
    fn err(&self, tensor: &str, what: impl std::fmt::Display) -> ModelError {
        ModelError(format!("{} tensor {tensor:?}: {what}", self.src.format()))
    }

    fn has(&self, tensor: &str) -> bool {
        self.src.info(tensor).is_some()
    }

    fn info(&self, tensor: &str, shape: &[usize]) -> Result<&TensorInfo, ModelError> {
        let info = self.src.info(tensor).ok_or_else(|| self.err(tensor, "missing"))?;
        if info.shape.iter().map(|&d| d as usize).ne(shape.iter().copied()) {
            return Err(self.err(tensor, format!("has shape {:?}, expected {shape:?}", info.shape)));
        }
        Ok(info)
    }

    fn matrix(&self, tensor: &str, shape: [usize; 2]) -> Result<Weight, ModelError> {
        self.rows(tensor, shape, &[shape[0]]).map(|mut v| v.remove(0))
    }

    /// The bytes of a matrix `[out, in]` and the bytes of one row (rows are whole blocks in every stored type).
    fn row_bytes(&self, tensor: &str, shape: [usize; 2]) -> Result<(&TensorInfo, &[u8], usize), ModelError> {
        let info = self.info(tensor, &shape)?;
        let bytes = self.src.bytes(tensor).map_err(|e| ModelError(e.to_string()))?;
        let per_row = bytes.len() / shape[0].max(1);
        let row = TensorInfo { name: tensor.to_owned(), dtype: info.dtype, shape: vec![1, shape[1] as u64] };
        if row.nbytes() != per_row as u64 || per_row * shape[0] != bytes.len() {
            return Err(self.err(tensor, format!("{} bytes do not split into {} rows", bytes.len(), shape[0])));
        }
        Ok((info, bytes, per_row))
    }

    /// A matrix `[out, in]` split by output rows into consecutive parts of `parts` rows each (each part a
    /// contiguous byte range).
    fn rows(&self, tensor: &str, shape: [usize; 2], parts: &[usize]) -> Result<Vec<Weight>, ModelError> {
        let (info, bytes, per_row) = self.row_bytes(tensor, shape)?;
        let mut at = 0;
        let mut out = Vec::with_capacity(parts.len());
        for &n in parts {
            let part =
                TensorInfo { name: tensor.to_owned(), dtype: info.dtype, shape: vec![n as u64, shape[1] as u64] };
            let w = self.be.upload(&part, &bytes[at * per_row..(at + n) * per_row]).map_err(|e| self.err(tensor, e))?;
            out.push(w);
            at += n;
        }
        Ok(out)
    }

    /// A matrix `[out, in]` whose row `r` is the stored row `order[r]` (bytes moved, no value changed).
    fn gathered(&self, tensor: &str, shape: [usize; 2], order: &[usize]) -> Result<Weight, ModelError> {
        let (info, bytes, per_row) = self.row_bytes(tensor, shape)?;
        let moved: Vec<u8> = order.iter().flat_map(|&r| &bytes[r * per_row..(r + 1) * per_row]).copied().collect();
        self.be.upload(info, &moved).map_err(|e| self.err(tensor, e))
    }

    fn values(&self, tensor: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.info(tensor, shape)?;
        let bytes = self.src.bytes(tensor).map_err(|e| ModelError(e.to_string()))?;
        let halves = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        Ok(match info.dtype {
            tf_core::DType::F32 => {
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
            tf_core::DType::BF16 => halves.map(|h| f32::from_bits((h as u32) << 16)).collect(),
            tf_core::DType::F16 => halves.map(crate::load::f16_to_f32).collect(),
            other => return Err(self.err(tensor, format!("is {other}; expected a float type"))),
        })
    }

    fn vector(&self, tensor: &str, len: usize) -> Result<Weight, ModelError> {
        let v = self.values(tensor, &[len])?;
        self.be.upload_f32(tensor, &[len], v).map_err(|e| self.err(tensor, e))
    }
}

/// The decay rate `A = -exp(A_log)` of a safetensors `A_log`: `exp` in f64, rounded once to f32 (the value
/// llama.cpp's converter stores in a GGUF, up to its f32 `exp`'s last bit).
fn a_of_a_log(a_log: f32) -> f32 {
    -((a_log as f64).exp() as f32)
}

/// The `A_log` the scan takes for a decay rate `A < 0`: `ln(-A)` in f64, rounded once to f32. Both formats load
/// through it (a safetensors `A_log` becomes [`a_of_a_log`] first), so a GGUF holding that `A` gives the scan the
/// same bits as the safetensors checkpoint (docs/arithmetic.md, "Recurrent state").
fn a_log_of(a: f32) -> f32 {
    ((-a) as f64).ln() as f32
}

/// Llama.cpp's converter permutes the Q and K rows of each head as it does for RoPE (`LlamaModel.permute`: rows
/// `(i, i + d/2)` become rows `(2i, 2i + 1)`); this architecture has no RoPE, so the transformers order is
/// restored: row `h·d + t·d/2 + i` of the result is stored row `h·d + 2i + t`.
fn unpermute_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|r| {
            let (h, j) = (r / head_dim, r % head_dim);
            h * head_dim + 2 * (j % half) + j / half
        })
        .collect()
}

/// Loads a `nemotron_h` checkpoint (safetensors or GGUF).
pub fn load(be: &dyn Backend, src: &dyn WeightSource, view: &dyn ConfigView) -> Result<Box<dyn Model>, ModelError> {
    let cfg = HybridConfig::from_view(view)?;
    let gguf = view.format() == ConfigFormat::Gguf;
    let rd = Reader { be, src };
    let (h, i, cd, heads) = (cfg.hidden, cfg.inner(), cfg.conv_dim(), cfg.ssm_heads);
    // A layer tensor's name: transformers' (under `backbone.layers.{l}.`) or llama.cpp's (under `blk.{l}.`).
    let p = |l: usize, hf: &str, gg: &str| match gguf {
        true => format!("blk.{l}.{gg}"),
        false => format!("backbone.layers.{l}.{hf}"),
    };
    let top = |hf: &str, gg: &str| if gguf { gg.to_owned() } else { hf.to_owned() };
    let (mut kv_layers, mut state_layers) = (0, 0);
    let mut layers = Vec::with_capacity(cfg.kinds.len());
    for (l, kind) in cfg.kinds.iter().enumerate() {
        if gguf {
            let biases = ["ssm_in", "ssm_out", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"];
            if let Some(b) = biases.iter().map(|t| p(l, "", &format!("{t}.bias"))).find(|t| rd.has(t)) {
                return Err(rd.err(&b, "projection biases are not supported"));
            }
        }
        let mixer = match kind {
            LayerKind::Mamba => {
                let proj =
                    rd.rows(&p(l, "mixer.in_proj.weight", "ssm_in.weight"), [i + cd + heads, h], &[i, cd, heads])?;
                let [in_z, in_xbc, in_dt]: [Weight; 3] = proj.try_into().expect("three parts");
                // GGUF: conv [conv_dim, K] (squeezed), A and D [heads, 1], the norm [groups, I / groups].
                let (k, g) = (cfg.conv_kernel, cfg.groups);
                let (conv_shape, per_head, norm_shape) = match gguf {
                    true => (vec![cd, k], vec![heads, 1], vec![g, i / g]),
                    false => (vec![cd, 1, k], vec![heads], vec![i]),
                };
                let conv_bias = p(l, "mixer.conv1d.bias", "ssm_conv1d.bias");
                let a: Vec<f32> = match gguf {
                    true => rd.values(&p(l, "", "ssm_a"), &per_head)?,
                    false => rd.values(&p(l, "mixer.A_log", ""), &[heads])?.into_iter().map(a_of_a_log).collect(),
                };
                if let Some(bad) = a.iter().find(|a| !(**a < 0.0 && a.is_finite())) {
                    return Err(rd.err(&p(l, "mixer.A_log", "ssm_a"), format!("decay rate A = {bad} is not negative")));
                }
                let m = Mamba {
                    in_z,
                    in_xbc,
                    in_dt,
                    conv: rd.values(&p(l, "mixer.conv1d.weight", "ssm_conv1d.weight"), &conv_shape)?,
                    conv_bias: match cfg.conv_bias && (!gguf || rd.has(&conv_bias)) {
                        true => Some(rd.values(&conv_bias, &[cd])?),
                        false => None,
                    },
                    a_log: a.into_iter().map(a_log_of).collect(),
                    d: rd.values(&p(l, "mixer.D", "ssm_d"), &per_head)?,
                    dt_bias: rd.values(&p(l, "mixer.dt_bias", "ssm_dt.bias"), &[heads])?,
                    norm: rd.values(&p(l, "mixer.norm.weight", "ssm_norm.weight"), &norm_shape)?,
                    out: rd.matrix(&p(l, "mixer.out_proj.weight", "ssm_out.weight"), [h, i])?,
                    state_layer: state_layers,
                    layer: l,
                };
                state_layers += 1;
                Mixer::Mamba(m)
            }
            LayerKind::Attention => {
                let (q, kv) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
                let (qn, kn) =
                    (p(l, "mixer.q_proj.weight", "attn_q.weight"), p(l, "mixer.k_proj.weight", "attn_k.weight"));
                let (wq, wk) = match gguf {
                    true => (
                        rd.gathered(&qn, [q, h], &unpermute_order(cfg.heads, cfg.head_dim))?,
                        rd.gathered(&kn, [kv, h], &unpermute_order(cfg.kv_heads, cfg.head_dim))?,
                    ),
                    false => (rd.matrix(&qn, [q, h])?, rd.matrix(&kn, [kv, h])?),
                };
                let a = Mixer::Attention {
                    q: wq,
                    k: wk,
                    v: rd.matrix(&p(l, "mixer.v_proj.weight", "attn_v.weight"), [kv, h])?,
                    o: rd.matrix(&p(l, "mixer.o_proj.weight", "attn_output.weight"), [h, q])?,
                    kv_layer: kv_layers,
                };
                kv_layers += 1;
                a
            }
            LayerKind::Mlp => Mixer::Mlp {
                up: rd.matrix(&p(l, "mixer.up_proj.weight", "ffn_up.weight"), [cfg.ffn, h])?,
                down: rd.matrix(&p(l, "mixer.down_proj.weight", "ffn_down.weight"), [h, cfg.ffn])?,
            },
        };
        layers.push(Layer { norm: rd.vector(&p(l, "norm.weight", "attn_norm.weight"), h)?, mixer });
    }
    let embd = rd.matrix(&top("backbone.embeddings.weight", "token_embd.weight"), [cfg.vocab, h])?;
    let head = top("lm_head.weight", "output.weight");
    let output = match src.info(&head) {
        Some(_) => rd.matrix(&head, [cfg.vocab, h])?,
        None if cfg.tie_embeddings => embd.clone(),
        None => return Err(rd.err(&head, "missing (and tie_word_embeddings is false)")),
    };
    let attn = AttnParams {
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
        window: None,
        softcap: None,
        sinks: None,
    };
    Ok(Box::new(NemotronH {
        output_norm: rd.vector(&top("backbone.norm_f.weight", "output_norm.weight"), h)?,
        output,
        embd,
        layers,
        attn,
        kv_layers,
        state_layers,
        cfg,
    }))
}

impl NemotronH {
    fn mamba(&self, be: &dyn Backend, x: &mut Tensor, h: &Tensor, m: &Mamba, batch: &Batch, kv: &KvCache) {
        let st = kv.states.as_ref().expect("nemotron_h: the KV cache has no state registers (Backend::alloc_states)");
        let [z, xbc, dt]: [Tensor; 3] = be
            .matmul_many(h, &[(&m.in_z, None), (&m.in_xbc, None), (&m.in_dt, None)])
            .try_into()
            .expect("three projections"); // [R, I], [R, conv_dim], [R, heads]
        let conv = be.ssm_conv(&xbc, &m.conv, m.conv_bias.as_deref(), st, m.state_layer, &batch.states); // [R, conv_dim]
        trace("ssm_conv", m.layer, &conv);
        let params = SsmParams {
            a_log: &m.a_log,
            d: &m.d,
            dt_bias: &m.dt_bias,
            dt_min: self.cfg.dt_min,
            eps: self.cfg.eps,
            norm_group: self.cfg.inner() / self.cfg.groups,
        };
        let y = be.ssm_scan(&conv, &dt, &z, &m.norm, &params, st, m.state_layer, &batch.states); // [R, I]
        trace("ssm_out", m.layer, &y);
        be.matmul_add(&y, &m.out, None, x);
    }
}

impl Model for NemotronH {
    fn family(&self) -> &'static str {
        "nemotron_h"
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab
    }

    fn context_length(&self) -> usize {
        self.cfg.context
    }

    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: self.kv_layers, blocks, block_size, kv_heads: self.cfg.kv_heads, head_dim: self.cfg.head_dim }
    }

    fn state_spec(&self) -> Option<StateSpec> {
        (self.state_layers > 0).then_some(StateSpec {
            layers: self.state_layers,
            conv_dim: self.cfg.conv_dim(),
            conv_kernel: self.cfg.conv_kernel,
            heads: self.cfg.ssm_heads,
            head_dim: self.cfg.ssm_head_dim,
            d_state: self.cfg.d_state,
            groups: self.cfg.groups,
            registers: 0,
        })
    }

    fn weight_bytes_per_token(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.norm.nbytes()
                    + match &l.mixer {
                        Mixer::Mamba(m) => {
                            let host = m.conv.len() + m.norm.len() + 3 * m.a_log.len();
                            m.in_z.nbytes() + m.in_xbc.nbytes() + m.in_dt.nbytes() + m.out.nbytes() + 4 * host as u64
                        }
                        Mixer::Attention { q, k, v, o, .. } => q.nbytes() + k.nbytes() + v.nbytes() + o.nbytes(),
                        Mixer::Mlp { up, down } => up.nbytes() + down.nbytes(),
                    }
            })
            .sum();
        layers + self.output_norm.nbytes() + layers::embed_and_head_bytes(&self.embd, &self.output)
    }

    fn forward(&self, be: &dyn Backend, batch: &Batch, kv: &mut KvCache) -> Tensor {
        layers::check_batch(batch);
        if self.state_layers > 0 {
            assert_eq!(batch.states.len(), batch.tokens.len(), "nemotron_h: one Batch::states entry per row");
        }
        let eps = self.cfg.eps;
        let mut x = layers::embed(be, &self.embd, batch); // [R, H]
        trace("inp_embd", layers::NO_LAYER, &x);
        for (l, layer) in self.layers.iter().enumerate() {
            let h = layers::rms_norm(be, &x, &layer.norm, eps); // [R, H]
            match &layer.mixer {
                Mixer::Mamba(m) => self.mamba(be, &mut x, &h, m, batch, kv),
                Mixer::Attention { q, k, v, o, kv_layer } => {
                    let [q, k, v]: [Tensor; 3] =
                        be.matmul_many(&h, &[(q, None), (k, None), (v, None)]).try_into().expect("q, k, v");
                    be.kv_write(kv, *kv_layer, &k, &v, &batch.slots);
                    let a = be.attention(&q, kv, *kv_layer, &batch.attn, &self.attn); // [R, Nq·Dh]
                    be.matmul_add(&a, o, None, &mut x);
                }
                Mixer::Mlp { up, down } => {
                    let u = be.relu_sq(&be.matmul(&h, up, None)); // [R, F]
                    be.matmul_add(&u, down, None, &mut x);
                }
            }
            trace("l_out", l, &x);
        }
        logits(be, &x, &self.output_norm, &self.output, eps, batch)
    }
}
