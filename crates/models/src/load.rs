//! Loading weights: tensor names in both formats, shape checks with errors that name the tensor, f32 conversion
//! of norms and biases (with constants folded in at load time), and the blocks every family loads the same way.

use crate::config::ModelConfig;
use crate::layers::{AttnSpec, AttnWeights, GluMlp, Linear};
use crate::model::ModelError;
use tf_core::{AttnParams, Backend, ConfigFormat, DType, Rope, RopeScaling, Weight, WeightSource};

/// A tensor's name in each format, without the `.weight` / `.bias` suffix; `{}` stands for the layer index.
#[derive(Clone, Copy, Debug)]
pub struct Name {
    pub gguf: &'static str,
    pub hf: &'static str,
}

const fn name(gguf: &'static str, hf: &'static str) -> Name {
    Name { gguf, hf }
}

// The tensors every family names the same way (llama.cpp's `LLM_TENSOR` names and transformers' module paths).
pub const TOKEN_EMBD: Name = name("token_embd", "model.embed_tokens");
pub const OUTPUT_NORM: Name = name("output_norm", "model.norm");
pub const OUTPUT: Name = name("output", "lm_head");
pub const ATTN_Q: Name = name("blk.{}.attn_q", "model.layers.{}.self_attn.q_proj");
pub const ATTN_K: Name = name("blk.{}.attn_k", "model.layers.{}.self_attn.k_proj");
pub const ATTN_V: Name = name("blk.{}.attn_v", "model.layers.{}.self_attn.v_proj");
pub const ATTN_OUT: Name = name("blk.{}.attn_output", "model.layers.{}.self_attn.o_proj");
pub const ATTN_Q_NORM: Name = name("blk.{}.attn_q_norm", "model.layers.{}.self_attn.q_norm");
pub const ATTN_K_NORM: Name = name("blk.{}.attn_k_norm", "model.layers.{}.self_attn.k_norm");
pub const FFN_GATE: Name = name("blk.{}.ffn_gate", "model.layers.{}.mlp.gate_proj");
pub const FFN_UP: Name = name("blk.{}.ffn_up", "model.layers.{}.mlp.up_proj");
pub const FFN_DOWN: Name = name("blk.{}.ffn_down", "model.layers.{}.mlp.down_proj");
/// The pre-attention norm (both families call it `input_layernorm` in transformers).
pub const ATTN_NORM: Name = name("blk.{}.attn_norm", "model.layers.{}.input_layernorm");
/// Llama 3 frequency factors (GGUF only).
const ROPE_FREQS: Name = name("rope_freqs", "");

/// Reads tensors of one checkpoint onto a backend, by [`Name`], checking shapes.
pub struct Loader<'a> {
    be: &'a dyn Backend,
    src: &'a dyn WeightSource,
    format: ConfigFormat,
    /// What stands for `model.` in this checkpoint's transformers names (`model.language_model.` in a
    /// multimodal Gemma 3 checkpoint).
    hf_prefix: String,
}

impl<'a> Loader<'a> {
    pub fn new(be: &'a dyn Backend, src: &'a dyn WeightSource, format: ConfigFormat) -> Loader<'a> {
        let embd = "embed_tokens.weight";
        let hf_prefix = match src.info(&format!("model.{embd}")) {
            Some(_) => "model.".to_owned(),
            None => src
                .tensors()
                .iter()
                .find_map(|t| t.name.strip_suffix(embd).filter(|p| p.is_empty() || p.ends_with('.')))
                .unwrap_or("model.")
                .to_owned(),
        };
        Loader { be, src, format, hf_prefix }
    }

    /// The full tensor name of `n` in layer `l`, with `suffix` (`weight` or `bias`).
    pub fn name(&self, n: Name, l: usize, suffix: &str) -> String {
        let base = match self.format {
            ConfigFormat::Gguf => n.gguf.replace("{}", &l.to_string()),
            ConfigFormat::HfConfig => {
                let hf = n.hf.replace("{}", &l.to_string());
                match hf.strip_prefix("model.") {
                    Some(rest) => format!("{}{rest}", self.hf_prefix),
                    None => hf,
                }
            }
        };
        format!("{base}.{suffix}")
    }

    pub fn has(&self, n: Name, l: usize, suffix: &str) -> bool {
        self.src.info(&self.name(n, l, suffix)).is_some()
    }

    fn err(&self, tensor: &str, problem: impl std::fmt::Display) -> ModelError {
        ModelError(format!("{} tensor {tensor:?}: {problem}", self.src.format()))
    }

    /// Checks that `tensor` exists with `shape` and returns its info.
    fn checked(&self, tensor: &str, shape: &[usize]) -> Result<&'a tf_core::TensorInfo, ModelError> {
        let info = self.src.info(tensor).ok_or_else(|| self.err(tensor, "missing"))?;
        if info.shape.iter().map(|&d| d as usize).ne(shape.iter().copied()) {
            return Err(self.err(tensor, format!("has shape {:?}, expected {shape:?}", info.shape)));
        }
        Ok(info)
    }

    /// A matrix `[out, in]` uploaded as stored (any type the backend supports).
    pub fn matrix(&self, n: Name, l: usize, shape: [usize; 2]) -> Result<Weight, ModelError> {
        self.matrix_named(&self.name(n, l, "weight"), shape)
    }

    /// [`Loader::matrix`] by full tensor name.
    pub fn matrix_named(&self, tensor: &str, shape: [usize; 2]) -> Result<Weight, ModelError> {
        let info = self.checked(tensor, &shape)?;
        // In place from the mapped file where the source can share it (no second copy in memory).
        if let Some(shared) = self.src.shared_bytes(tensor) {
            return self.be.upload_shared(info, shared).map_err(|e| self.err(tensor, e));
        }
        let bytes = self.src.bytes(tensor).map_err(|e| ModelError(e.to_string()))?;
        self.be.upload(info, bytes).map_err(|e| self.err(tensor, e))
    }

    /// A stack of matrices `[n, out, in]` (GGUF's per-layer expert tensors) as `n` matrices `[out, in]`, each
    /// uploaded from its own contiguous part of the tensor's bytes.
    pub fn expert_slices(&self, tensor: &str, shape: [usize; 3]) -> Result<Vec<Weight>, ModelError> {
        let info = self.checked(tensor, &shape)?;
        let bytes = self.src.bytes(tensor).map_err(|e| ModelError(e.to_string()))?;
        let per = bytes.len() / shape[0].max(1);
        (0..shape[0])
            .map(|e| {
                let part = tf_core::TensorInfo {
                    name: format!("{tensor}[{e}]"),
                    dtype: info.dtype,
                    shape: vec![shape[1] as u64, shape[2] as u64],
                };
                if part.nbytes() != per as u64 {
                    return Err(
                        self.err(tensor, format!("{} bytes do not split into {} experts", bytes.len(), shape[0]))
                    );
                }
                self.be.upload(&part, &bytes[e * per..(e + 1) * per]).map_err(|err| self.err(tensor, err))
            })
            .collect()
    }

    /// A transformers tensor name with this checkpoint's prefix in place of `model.`.
    pub fn hf_name(&self, name: &str) -> String {
        match name.strip_prefix("model.") {
            Some(rest) => format!("{}{rest}", self.hf_prefix),
            None => name.to_owned(),
        }
    }

    /// Whether the checkpoint has the transformers tensor `name` (prefix applied).
    pub fn has_hf(&self, name: &str) -> bool {
        self.src.info(&self.hf_name(name)).is_some()
    }

    /// The values of a float tensor of `shape`, widened to f32.
    pub fn f32_values(&self, tensor: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.checked(tensor, shape)?;
        let bytes = self.src.bytes(tensor).map_err(|e| ModelError(e.to_string()))?;
        let pairs = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        Ok(match info.dtype {
            DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::F16 => pairs.map(f16_to_f32).collect(),
            DType::BF16 => pairs.map(|h| f32::from_bits((h as u32) << 16)).collect(),
            other => return Err(self.err(tensor, format!("is {other}; expected a float type"))),
        })
    }

    /// A vector `[len]` (`suffix` `weight` or `bias`) as f32 with `shift` added to every value (Gemma's
    /// `1 + w` norms, folded at load time), uploaded with `upload_f32`.
    pub fn vector(&self, n: Name, l: usize, suffix: &str, len: usize, shift: f32) -> Result<Weight, ModelError> {
        let tensor = self.name(n, l, suffix);
        let mut values = self.f32_values(&tensor, &[len])?;
        if shift != 0.0 {
            values.iter_mut().for_each(|v| *v += shift);
        }
        self.be.upload_f32(&tensor, &[len], values).map_err(|e| self.err(&tensor, e))
    }

    /// f32 `values` of `shape` computed at load time, uploaded under the checkpoint tensor name `tensor`.
    pub fn upload_f32(&self, tensor: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, ModelError> {
        self.be.upload_f32(tensor, shape, values).map_err(|e| self.err(tensor, e))
    }

    /// A norm weight `[len]` (see [`Loader::vector`] for `shift`).
    pub fn norm(&self, n: Name, l: usize, len: usize, shift: f32) -> Result<Weight, ModelError> {
        self.vector(n, l, "weight", len, shift)
    }

    /// A projection `[out, in]` with a bias `[out]` when `bias` is true, or (`None`) when the checkpoint has one.
    pub fn linear(&self, n: Name, l: usize, shape: [usize; 2], bias: Option<bool>) -> Result<Linear, ModelError> {
        let w = self.matrix(n, l, shape)?;
        let want = bias.unwrap_or_else(|| self.has(n, l, "bias"));
        let b = if want { Some(self.vector(n, l, "bias", shape[0], 0.0)?) } else { None };
        Ok(Linear { w, b })
    }
}

/// IEEE half to single (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalize.
            let shift = m.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((m << shift) & 0x3ff) << 13)
        }
        (31, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The attention block of layer `l`: projections (biases required when `cfg.qkv_bias`, else used when the
/// checkpoint has them) and, with `cfg.qk_norm`, the q/k norms with `norm_shift` folded in.
pub fn attention(ld: &Loader, cfg: &ModelConfig, l: usize, norm_shift: f32) -> Result<AttnWeights, ModelError> {
    let (h, q_dim, kv_dim) = (cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let norm = |n: Name| ld.norm(n, l, cfg.head_dim, norm_shift);
    let bias = cfg.qkv_bias.then_some(true); // required when the family has them, else loaded when present
    Ok(AttnWeights {
        q: ld.linear(ATTN_Q, l, [q_dim, h], bias)?,   // [Nq·Dh, H]
        k: ld.linear(ATTN_K, l, [kv_dim, h], bias)?,  // [Nkv·Dh, H]
        v: ld.linear(ATTN_V, l, [kv_dim, h], bias)?,  // [Nkv·Dh, H]
        o: ld.linear(ATTN_OUT, l, [h, q_dim], None)?, // [H, Nq·Dh]
        q_norm: if cfg.qk_norm { Some(norm(ATTN_Q_NORM)?) } else { None }, // [Dh]
        k_norm: if cfg.qk_norm { Some(norm(ATTN_K_NORM)?) } else { None }, // [Dh]
    })
}

/// The gated feed-forward block of layer `l`.
pub fn glu_mlp(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<GluMlp, ModelError> {
    Ok(GluMlp {
        gate: ld.matrix(FFN_GATE, l, [cfg.ffn, cfg.hidden])?, // [F, H]
        up: ld.matrix(FFN_UP, l, [cfg.ffn, cfg.hidden])?,     // [F, H]
        down: ld.matrix(FFN_DOWN, l, [cfg.hidden, cfg.ffn])?, // [H, F]
    })
}

/// The token embedding table `[V, H]` and V. The table decides V; a config that declares another is an error.
pub fn embeddings(ld: &Loader, cfg: &ModelConfig) -> Result<(Weight, usize), ModelError> {
    let tensor = ld.name(TOKEN_EMBD, 0, "weight");
    let rows = match ld.src.info(&tensor) {
        Some(info) if info.shape.len() == 2 => info.shape[0] as usize,
        Some(info) => {
            return Err(ld.err(&tensor, format!("has shape {:?}, expected [vocab, {}]", info.shape, cfg.hidden)))
        }
        None => return Err(ld.err(&tensor, "missing")),
    };
    if let Some(v) = cfg.vocab.filter(|&v| v != rows) {
        return Err(ld.err(&tensor, format!("has {rows} rows but the config declares a vocabulary of {v}")));
    }
    Ok((ld.matrix(TOKEN_EMBD, 0, [rows, cfg.hidden])?, rows))
}

/// The output head `[V, H]`: the stored one, else the embedding table when the config allows tying.
pub fn output_head(ld: &Loader, cfg: &ModelConfig, embd: &Weight, vocab: usize) -> Result<Weight, ModelError> {
    if ld.has(OUTPUT, 0, "weight") {
        ld.matrix(OUTPUT, 0, [vocab, cfg.hidden])
    } else if cfg.tie_embeddings {
        Ok(embd.clone())
    } else {
        Err(ld.err(&ld.name(OUTPUT, 0, "weight"), "missing (and tie_word_embeddings is false)"))
    }
}

/// The attention parameters, window and RoPE of every layer.
pub fn attn_specs(cfg: &ModelConfig) -> Vec<AttnSpec> {
    (0..cfg.layers)
        .map(|l| AttnSpec {
            params: AttnParams {
                heads: cfg.heads,
                kv_heads: cfg.kv_heads,
                head_dim: cfg.head_dim,
                scale: cfg.attn_scale,
                window: cfg.windows[l],
                softcap: cfg.attn_softcap,
                sinks: None,
            },
            rope: *cfg.rope_for(l),
            eps: cfg.eps,
        })
        .collect()
}

/// GGUF Llama 3.x checkpoints carry their RoPE scaling as a `rope_freqs` tensor of per-frequency divisors
/// (llama.cpp's converter computes it from the `llama3` `rope_scaling` and writes no scaling metadata). The
/// divisors are turned back into [`RopeScaling::Llama3`]; a table that no Llama 3 rule produces is refused rather
/// than silently ignored.
pub fn rope_freqs_scaling(ld: &Loader, rope: &Rope) -> Result<Option<RopeScaling>, ModelError> {
    if ld.format != ConfigFormat::Gguf || !ld.has(ROPE_FREQS, 0, "weight") {
        return Ok(None);
    }
    let tensor = ld.name(ROPE_FREQS, 0, "weight");
    let divisors = ld.f32_values(&tensor, &[rope.rot_dims / 2])?;
    if divisors.iter().all(|&d| d == 1.0) {
        return Ok(None);
    }
    match llama3_from_divisors(&divisors, rope.theta, rope.rot_dims) {
        Some(s) => Ok(Some(s)),
        None => Err(ld.err(&tensor, "frequency factors that do not follow the Llama 3 rule are not supported")),
    }
}

/// The Llama 3 divisor of the frequency with wavelength `wl` (transformers' `_compute_llama3_parameters`).
fn llama3_divisor(wl: f64, factor: f64, low: f64, high: f64, orig: f64) -> f64 {
    if wl < orig / high {
        1.0
    } else if wl > orig / low {
        factor
    } else {
        let smooth = (orig / wl - low) / (high - low);
        1.0 / ((1.0 - smooth) / factor + smooth)
    }
}

/// Finds Llama 3 parameters that reproduce `divisors` (one per rotated pair). The rule depends only on `factor`
/// (the largest divisor) and the band edges `orig / low` and `orig / high` (as wavelengths); the usual
/// (1, 4, 8192) is tried first, else the edges are solved from the divisors inside the band (inside it, the
/// blend `s = (1/d − 1/factor) / (1 − 1/factor)` is linear in 1/wavelength).
fn llama3_from_divisors(divisors: &[f32], theta: f64, rot_dims: usize) -> Option<RopeScaling> {
    let factor = divisors.iter().fold(1.0f32, |a, &b| a.max(b)) as f64;
    // 1/wavelength of each pair, decreasing.
    let inv_wl: Vec<f64> = (0..divisors.len())
        .map(|i| theta.powf(-((2 * i) as f64) / rot_dims as f64) / (2.0 * std::f64::consts::PI))
        .collect();
    let close = |a: f64, b: f64| ((a - b) / b).abs() < 1e-4;
    let scaling = |low: f64, high: f64, orig: f64| RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_context: orig,
    };
    let fits = |low: f64, high: f64, orig: f64| {
        divisors.iter().zip(&inv_wl).all(|(&d, &u)| close(d as f64, llama3_divisor(1.0 / u, factor, low, high, orig)))
    };
    if fits(1.0, 4.0, 8192.0) {
        return Some(scaling(1.0, 4.0, 8192.0));
    }
    let band: Vec<(usize, f64)> = (0..divisors.len())
        .filter(|&i| !close(divisors[i] as f64, 1.0) && !close(divisors[i] as f64, factor))
        .map(|i| (i, (1.0 / divisors[i] as f64 - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    // Band edges in 1/wavelength: `inv_low` = low / orig, `inv_high` = high / orig.
    let (inv_low, inv_high) = match band.as_slice() {
        [] => {
            let last_one = (0..divisors.len()).rev().find(|&i| close(divisors[i] as f64, 1.0));
            let a = last_one.map_or(inv_wl[0] * 2.0, |i| inv_wl[i]);
            let b = divisors.iter().position(|&d| close(d as f64, factor)).map_or(a / 4.0, |i| inv_wl[i]);
            ((a + 2.0 * b) / 3.0, (2.0 * a + b) / 3.0)
        }
        [(i, s)] => {
            let next = inv_wl.get(i + 1).copied().unwrap_or(inv_wl[*i] / 2.0);
            let inv_low = (inv_wl[*i] + next) / 2.0;
            (inv_low, inv_low + (inv_wl[*i] - inv_low) / s)
        }
        [(i, s1), .., (j, s2)] => {
            let alpha = (s1 - s2) / (inv_wl[*i] - inv_wl[*j]);
            let beta = s1 - alpha * inv_wl[*i];
            (-beta / alpha, (1.0 - beta) / alpha)
        }
    };
    if !(inv_low > 0.0 && inv_high > inv_low && inv_high.is_finite()) {
        return None;
    }
    let (orig, high) = (1.0 / inv_low, inv_high / inv_low);
    // The solved edges carry the f32 rounding of the divisors; released parameters are round numbers.
    let (orig_r, high_r) = (orig.round(), (high * 1024.0).round() / 1024.0);
    if fits(1.0, high_r, orig_r) {
        return Some(scaling(1.0, high_r, orig_r));
    }
    fits(1.0, high, orig).then(|| scaling(1.0, high, orig))
}

#[cfg(test)]
mod tests {
    use super::{f16_to_f32, llama3_divisor, llama3_from_divisors};
    use tf_core::RopeScaling;

    /// The divisors llama.cpp's converter writes for a `llama3` rope_scaling.
    fn divisors(theta: f64, rot: usize, factor: f64, low: f64, high: f64, orig: f64) -> Vec<f32> {
        (0..rot / 2)
            .map(|i| {
                let wl = 2.0 * std::f64::consts::PI * theta.powf((2 * i) as f64 / rot as f64);
                llama3_divisor(wl, factor, low, high, orig) as f32
            })
            .collect()
    }

    #[test]
    fn llama3_divisors_round_trip() {
        // Llama 3.2 1B: recognized with its own parameters.
        let d = divisors(500_000.0, 64, 32.0, 1.0, 4.0, 8192.0);
        let want =
            RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192.0 };
        assert_eq!(llama3_from_divisors(&d, 500_000.0, 64), Some(want));
        // Other parameters (several, one or no divisors inside the band): parameters that give the same divisor
        // for every frequency (the same parameters when the band has two or more divisors).
        for (theta, rot, factor, low, high, orig) in [
            (10_000.0, 128, 8.0, 1.0, 4.0, 4096.0),
            (10_000.0, 16, 8.0, 1.0, 4.0, 32.0),
            (10_000.0, 16, 8.0, 1.0, 2.0, 9.0),
        ] {
            let d = divisors(theta, rot, factor, low, high, orig);
            let Some(RopeScaling::Llama3 { factor: f, low_freq_factor: l, high_freq_factor: h, original_context: o }) =
                llama3_from_divisors(&d, theta, rot)
            else {
                panic!("no fit for {theta} {rot} {factor} {low} {high} {orig}")
            };
            assert_eq!(f, factor);
            for (a, b) in divisors(theta, rot, f, l, h, o).iter().zip(&d) {
                assert!((a - b).abs() <= 1e-6 * b, "{theta} {rot} {factor} {low} {high} {orig}: {a} vs {b}");
            }
        }
        let d = divisors(10_000.0, 128, 8.0, 1.0, 4.0, 4096.0);
        let want =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 4096.0 };
        assert_eq!(llama3_from_divisors(&d, 10_000.0, 128), Some(want));
        assert_eq!(llama3_from_divisors(&[1.0, 3.0, 2.0, 8.0], 10_000.0, 8), None);
    }

    #[test]
    fn half_widening() {
        for (h, f) in [(0x3c00u16, 1.0f32), (0xc000, -2.0), (0x0001, 5.960_464_5e-8), (0x7bff, 65504.0), (0, 0.0)] {
            assert_eq!(f16_to_f32(h), f, "{h:#x}");
        }
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
    }
}
