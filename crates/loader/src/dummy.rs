//! Random weights with the tensor names and shapes a Hugging Face `config.json` implies, and no weight files
//! (`--load-format dummy`): for timing real shapes (Qwen2.5-7B, Llama-3-8B) where the real weights cannot be
//! brought. The arithmetic per byte is the same for any values, so speeds measured on them are real speeds; the
//! text they produce is noise.
//!
//! The layout is the plain pre-norm decoder's (`model_type` `llama`, `mistral`, `qwen2`, `qwen3`, `qwen3_moe`):
//! per layer input and post-attention norms, q/k/v/o projections (q/k/v biases for qwen2 or `attention_bias`,
//! per-head q/k norms for qwen3 and qwen3_moe), gate/up/down projections, or in Qwen3-MoE's sparse layers a router
//! and `num_experts` experts of `moe_intermediate_size`; the embedding table, the final norm and `lm_head` unless
//! the embeddings are tied. Nemotron-H (`nemotron_h`) has its own layout of Mamba-2, attention and MLP layers
//! ([`nemotron_h_specs`]).
//!
//! Deterministic from a seed: the bytes are generated in fixed chunks, each from its own generator keyed by
//! (seed, tensor index, chunk index), so any thread count gives the same bits.

use crate::hf_config::HfConfig;
use std::sync::Mutex;
use tf_core::{DType, TensorInfo, WeightSource, WeightsError};

/// Bytes generated from one keyed generator (a whole number of blocks of every supported type).
const CHUNK_BYTES: usize = 1 << 21;

/// What a tensor is for, which decides its value distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Projections and embeddings: small values around zero.
    Matrix,
    /// RMSNorm weights: values in [0.5, 1.5).
    Norm,
    /// Biases: small values around zero.
    Bias,
}

/// Random weights for the tensors of one config; a [`WeightSource`] of format `"dummy"`.
pub struct DummyWeights {
    infos: Vec<TensorInfo>,
    /// The bytes of `infos[i]`, `infos[i].nbytes()` long.
    data: Vec<Vec<u8>>,
    seed: u64,
    dtype: DType,
}

/// The weight types dummy matrices can have: the float types of HF checkpoints and the common GGUF blocks.
pub const DUMMY_DTYPES: [DType; 18] = [
    DType::BF16,
    DType::F16,
    DType::F32,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4NL,
    DType::IQ4XS,
    DType::IQ2XXS,
    DType::IQ2XS,
    DType::IQ2S,
];

/// The matrix type a config asks for: `torch_dtype` (or `dtype`), bf16 when it says nothing.
pub fn config_dtype(cfg: &HfConfig) -> Result<DType, WeightsError> {
    match cfg.torch_dtype.as_deref() {
        None | Some("bfloat16") => Ok(DType::BF16),
        Some("float16") => Ok(DType::F16),
        Some("float32") => Ok(DType::F32),
        Some(other) => {
            Err(WeightsError::new(&cfg.file, None, format!("dummy weights: torch_dtype {other:?} unsupported")))
        }
    }
}

impl DummyWeights {
    /// Weights for `cfg` with matrices of type `dtype` (one of [`DUMMY_DTYPES`]; norms and biases take it too
    /// when it is a float type, else f32, as GGUF keeps them), generated from `seed`.
    pub fn new(cfg: &HfConfig, dtype: DType, seed: u64) -> Result<DummyWeights, WeightsError> {
        let file = cfg.file.as_str();
        let err = |p: String| WeightsError::new(file, None, format!("dummy weights: {p}"));
        if !DUMMY_DTYPES.contains(&dtype) {
            return Err(err(format!("no random generator for {dtype}")));
        }
        let mt = cfg.model_type.as_str();
        if !matches!(mt, "llama" | "mistral" | "qwen2" | "qwen3" | "qwen3_moe" | "nemotron_h") {
            return Err(err(format!(
                "model_type {mt:?} has no dummy layout (llama, mistral, qwen2, qwen3, qwen3_moe, nemotron_h)"
            )));
        }
        let small = if matches!(dtype, DType::BF16 | DType::F16 | DType::F32) { dtype } else { DType::F32 };
        if mt == "nemotron_h" {
            return Ok(Self::generate(nemotron_h_specs(cfg, dtype, small).map_err(err)?, seed, dtype));
        }
        // Qwen3-MoE: experts, their width, and which layers are sparse (`mlp_only_layers`, `decoder_sparse_step`).
        let count = |k: &str| cfg.get_f64(k).map(|x| x as usize);
        let moe = if mt == "qwen3_moe" {
            let e =
                count("num_experts").or(count("num_local_experts")).ok_or_else(|| err("num_experts missing".into()))?;
            let fe = count("moe_intermediate_size").ok_or_else(|| err("moe_intermediate_size missing".into()))?;
            if fe % dtype.block_size() != 0 {
                return Err(err(format!("moe_intermediate_size {fe} is not a whole number of {dtype} blocks")));
            }
            let dense: Vec<usize> = tf_core::ConfigView::get_f64_array(cfg, "mlp_only_layers")
                .unwrap_or_default()
                .into_iter()
                .map(|l| l as usize)
                .collect();
            let step = count("decoder_sparse_step").unwrap_or(1).max(1);
            Some((e, fe, dense, step))
        } else {
            None
        };
        let (h, f, v) = (cfg.hidden_size as usize, cfg.intermediate_size as usize, cfg.vocab_size as usize);
        let (nq, nkv, dh) = (cfg.num_attention_heads as usize, cfg.num_key_value_heads as usize, cfg.head_dim as usize);
        let bias = mt == "qwen2" || cfg.attention_bias == Some(true);
        let block = dtype.block_size();
        for (what, k) in [("hidden_size", h), ("intermediate_size", f), ("heads × head_dim", nq * dh)] {
            if k % block != 0 {
                return Err(err(format!("{what} {k} is not a whole number of {dtype} blocks of {block}")));
            }
        }
        // (name, dtype, shape outermost-first, role). Embeddings and lm_head [V, H]; norms [H]; q [Nq·Dh, H],
        // k and v [Nkv·Dh, H], their biases [out]; qwen3's q/k norms [Dh]; o [H, Nq·Dh]; gate and up [F, H];
        // down [H, F].
        let mut specs: Vec<Spec> = vec![
            ("model.embed_tokens.weight".into(), dtype, vec![v, h], Role::Matrix),
            ("model.norm.weight".into(), small, vec![h], Role::Norm),
        ];
        if !cfg.tie_word_embeddings {
            specs.push(("lm_head.weight".into(), dtype, vec![v, h], Role::Matrix));
        }
        for l in 0..cfg.num_hidden_layers as usize {
            let p = format!("model.layers.{l}.");
            specs.push((format!("{p}input_layernorm.weight"), small, vec![h], Role::Norm));
            specs.push((format!("{p}post_attention_layernorm.weight"), small, vec![h], Role::Norm));
            for (n, out) in [("q", nq * dh), ("k", nkv * dh), ("v", nkv * dh)] {
                specs.push((format!("{p}self_attn.{n}_proj.weight"), dtype, vec![out, h], Role::Matrix));
                if bias {
                    specs.push((format!("{p}self_attn.{n}_proj.bias"), small, vec![out], Role::Bias));
                }
            }
            if matches!(mt, "qwen3" | "qwen3_moe") {
                specs.push((format!("{p}self_attn.q_norm.weight"), small, vec![dh], Role::Norm));
                specs.push((format!("{p}self_attn.k_norm.weight"), small, vec![dh], Role::Norm));
            }
            specs.push((format!("{p}self_attn.o_proj.weight"), dtype, vec![h, nq * dh], Role::Matrix));
            match &moe {
                Some((e, fe, dense, step)) if !dense.contains(&l) && (l + 1) % step == 0 => {
                    // Router [E, H] (kept in a float type, as GGUF files keep it); per expert gate and up [Fe, H],
                    // down [H, Fe].
                    specs.push((format!("{p}mlp.gate.weight"), small, vec![*e, h], Role::Matrix));
                    for x in 0..*e {
                        let q = format!("{p}mlp.experts.{x}.");
                        specs.push((format!("{q}gate_proj.weight"), dtype, vec![*fe, h], Role::Matrix));
                        specs.push((format!("{q}up_proj.weight"), dtype, vec![*fe, h], Role::Matrix));
                        specs.push((format!("{q}down_proj.weight"), dtype, vec![h, *fe], Role::Matrix));
                    }
                }
                _ => {
                    specs.push((format!("{p}mlp.gate_proj.weight"), dtype, vec![f, h], Role::Matrix));
                    specs.push((format!("{p}mlp.up_proj.weight"), dtype, vec![f, h], Role::Matrix));
                    specs.push((format!("{p}mlp.down_proj.weight"), dtype, vec![h, f], Role::Matrix));
                }
            }
        }
        Ok(Self::generate(specs, seed, dtype))
    }

    /// The bytes of every (name, type, shape, role), each (tensor, chunk) from its own generator.
    fn generate(specs: Vec<Spec>, seed: u64, dtype: DType) -> DummyWeights {
        let mut infos = Vec::with_capacity(specs.len());
        let mut data = Vec::with_capacity(specs.len());
        let mut roles = Vec::with_capacity(specs.len());
        for (name, dt, shape, role) in specs {
            let info = TensorInfo { name, dtype: dt, shape: shape.iter().map(|&d| d as u64).collect() };
            data.push(vec![0u8; info.nbytes() as usize]);
            infos.push(info);
            roles.push(role);
        }
        // Every (tensor, chunk) is one job with its own generator; workers take jobs in any order.
        let mut jobs: Vec<(u64, DType, Role, &mut [u8])> = Vec::new();
        for (t, buf) in data.iter_mut().enumerate() {
            for (c, chunk) in buf.chunks_mut(CHUNK_BYTES).enumerate() {
                let key = mix(mix(seed ^ 0x5DEE_CE66_D1CE_4E5B) ^ ((t as u64) << 32 | c as u64));
                jobs.push((key, infos[t].dtype, roles[t], chunk));
            }
        }
        let jobs = Mutex::new(jobs);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(32);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).pop();
                    let Some((key, dt, role, out)) = job else { break };
                    fill(dt, role, &mut Rng(key | 1), out);
                });
            }
        });
        DummyWeights { infos, data, seed, dtype }
    }

    /// Bytes of all tensors together.
    pub fn total_bytes(&self) -> usize {
        self.data.iter().map(Vec::len).sum()
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The matrix type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

impl WeightSource for DummyWeights {
    fn format(&self) -> &str {
        "dummy"
    }

    fn tensors(&self) -> &[TensorInfo] {
        &self.infos
    }

    fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let i = self.infos.iter().position(|t| t.name == name);
        i.map(|i| &self.data[i][..]).ok_or_else(|| WeightsError::new("dummy", Some(name), "no such tensor"))
    }
}

/// One tensor to generate: name, type, shape (outermost first), role.
type Spec = (String, DType, Vec<usize>, Role);

/// Nemotron-H's layout (`layers_block_type` or `hybrid_override_pattern`): per layer a norm and one mixer under
/// `backbone.layers.{l}.mixer.`: Mamba-2 (`in_proj [I + conv_dim + heads, H]`, `conv1d` `[conv_dim, 1, K]` and its
/// bias, `A_log`, `D`, `dt_bias` `[heads]`, the gated norm `[I]`, `out_proj [H, I]`), attention (q `[Nq·Dh, H]`,
/// k and v `[Nkv·Dh, H]`, o `[H, Nq·Dh]`) or a squared-ReLU MLP (up `[F, H]`, down `[H, F]`); the embeddings, the
/// final norm and `lm_head`. The per-head SSM vectors are kept in `small` (a float type) as checkpoints keep them.
fn nemotron_h_specs(cfg: &HfConfig, dtype: DType, small: DType) -> Result<Vec<Spec>, String> {
    let count = |k: &str| cfg.get_f64(k).map(|x| x as usize).ok_or_else(|| format!("{k} missing"));
    let kinds: Vec<char> = match tf_core::ConfigView::get_str_array(cfg, "layers_block_type") {
        Some(list) => list
            .iter()
            .map(|t| match t.as_str() {
                "mamba" | "linear_attention" => Ok('M'),
                "attention" | "full_attention" => Ok('*'),
                "mlp" => Ok('-'),
                other => Err(format!("layer type {other:?} has no dummy layout")),
            })
            .collect::<Result<_, _>>()?,
        None => tf_core::ConfigView::get_str(cfg, "hybrid_override_pattern")
            .ok_or("layers_block_type missing")?
            .chars()
            .collect(),
    };
    let (h, f, v) = (cfg.hidden_size as usize, cfg.intermediate_size as usize, cfg.vocab_size as usize);
    let (nq, nkv) = (cfg.num_attention_heads as usize, cfg.num_key_value_heads as usize);
    // Nemotron-H's own configs name the attention head size `attention_head_dim`.
    let dh = count("attention_head_dim").unwrap_or(cfg.head_dim as usize);
    let (heads, hd, groups, ds, k) = (
        count("mamba_num_heads")?,
        count("mamba_head_dim")?,
        count("n_groups")?,
        count("ssm_state_size")?,
        count("conv_kernel")?,
    );
    let (inner, block) = (heads * hd, dtype.block_size());
    let cd = inner + 2 * groups * ds;
    for (what, n) in
        [("hidden_size", h), ("intermediate_size", f), ("mamba inner width", inner), ("heads × head_dim", nq * dh)]
    {
        if n % block != 0 {
            return Err(format!("{what} {n} is not a whole number of {dtype} blocks of {block}"));
        }
    }
    let mut specs: Vec<Spec> = vec![
        ("backbone.embeddings.weight".into(), dtype, vec![v, h], Role::Matrix),
        ("backbone.norm_f.weight".into(), small, vec![h], Role::Norm),
        ("lm_head.weight".into(), dtype, vec![v, h], Role::Matrix),
    ];
    for (l, kind) in kinds.iter().enumerate() {
        let p = format!("backbone.layers.{l}.");
        specs.push((format!("{p}norm.weight"), small, vec![h], Role::Norm));
        let m = format!("{p}mixer.");
        match kind {
            'M' => {
                specs.push((format!("{m}in_proj.weight"), dtype, vec![inner + cd + heads, h], Role::Matrix));
                specs.push((format!("{m}conv1d.weight"), small, vec![cd, 1, k], Role::Matrix));
                specs.push((format!("{m}conv1d.bias"), small, vec![cd], Role::Bias));
                specs.push((format!("{m}A_log"), small, vec![heads], Role::Norm));
                specs.push((format!("{m}D"), small, vec![heads], Role::Norm));
                specs.push((format!("{m}dt_bias"), small, vec![heads], Role::Bias));
                specs.push((format!("{m}norm.weight"), small, vec![inner], Role::Norm));
                specs.push((format!("{m}out_proj.weight"), dtype, vec![h, inner], Role::Matrix));
            }
            '*' => {
                for (n, out) in [("q", nq * dh), ("k", nkv * dh), ("v", nkv * dh)] {
                    specs.push((format!("{m}{n}_proj.weight"), dtype, vec![out, h], Role::Matrix));
                }
                specs.push((format!("{m}o_proj.weight"), dtype, vec![h, nq * dh], Role::Matrix));
            }
            '-' => {
                specs.push((format!("{m}up_proj.weight"), dtype, vec![f, h], Role::Matrix));
                specs.push((format!("{m}down_proj.weight"), dtype, vec![h, f], Role::Matrix));
            }
            other => return Err(format!("layer code {other:?} has no dummy layout")),
        }
    }
    Ok(specs)
}

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xorshift64 (state never zero).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A small f16 scale (2^-9 .. 2^-6) with random mantissa and sign.
fn f16_scale(r: &mut Rng) -> [u8; 2] {
    let x = r.next();
    let h = (((x % 4) as u16 + 6) << 10) | ((x >> 8) as u16 & 0x3ff) | ((x >> 30) as u16 & 0x8000);
    h.to_le_bytes()
}

/// A float value of `role`'s distribution.
fn value(role: Role, r: &mut Rng) -> f32 {
    match role {
        Role::Norm => 1.0 + 0.5 * r.signed(),
        Role::Matrix | Role::Bias => 0.05 * r.signed(),
    }
}

/// Fills `out` (whole elements or blocks of `dtype`) with random values of `role`.
fn fill(dtype: DType, role: Role, r: &mut Rng, out: &mut [u8]) {
    match (dtype, role) {
        // Matrices in bf16/f16: exponents of 2^-8 .. 2^-5, random mantissa and sign, straight from the bits.
        (DType::BF16, Role::Matrix) => {
            for c in out.chunks_exact_mut(2) {
                let x = r.next();
                let b = (((x % 4) as u16 + 119) << 7) | ((x >> 8) as u16 & 0x7f) | ((x >> 30) as u16 & 0x8000);
                c.copy_from_slice(&b.to_le_bytes());
            }
        }
        (DType::F16, Role::Matrix) => {
            for c in out.chunks_exact_mut(2) {
                let x = r.next();
                let b = (((x % 4) as u16 + 7) << 10) | ((x >> 8) as u16 & 0x3ff) | ((x >> 30) as u16 & 0x8000);
                c.copy_from_slice(&b.to_le_bytes());
            }
        }
        (DType::BF16, _) => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(value(role, r)).to_le_bytes());
            }
        }
        (DType::F16, _) => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(value(role, r)).to_le_bytes());
            }
        }
        (DType::F32, _) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&value(role, r).to_le_bytes());
            }
        }
        // Quant blocks: random quants and sub-scales, small random f16 super-scales at their offsets.
        _ => {
            for c in out.chunks_mut(8) {
                let v = r.next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
            // Byte offsets of the f16 scales in a block: d (and m or dmin after it).
            let fields: &[usize] = match dtype {
                DType::Q4_0
                | DType::Q5_0
                | DType::Q8_0
                | DType::IQ4NL
                | DType::IQ4XS
                | DType::IQ2XXS
                | DType::IQ2XS
                | DType::IQ2S => &[0],
                DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
                DType::Q2K => &[80, 82],
                DType::Q3K => &[108],
                DType::Q6K => &[208],
                _ => unreachable!("checked against DUMMY_DTYPES"),
            };
            for blk in out.chunks_exact_mut(dtype.block_bytes()) {
                for &at in fields {
                    blk[at..at + 2].copy_from_slice(&f16_scale(r));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(model_type: &str, tied: bool) -> HfConfig {
        let json = format!(
            r#"{{"architectures": ["X"], "model_type": "{model_type}", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
            "tie_word_embeddings": {tied}, "max_position_embeddings": 256, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}}"#
        );
        HfConfig::from_json_str(&json, "config.json").unwrap()
    }

    #[test]
    fn names_and_shapes_follow_the_config() {
        let q = DummyWeights::new(&cfg("qwen2", false), DType::BF16, 1).unwrap();
        let info = |n: &str| q.info(n).unwrap_or_else(|| panic!("{n} missing")).clone();
        assert_eq!(info("model.embed_tokens.weight").shape, [300, 64]);
        assert_eq!(info("lm_head.weight").shape, [300, 64]);
        assert_eq!(info("model.layers.1.self_attn.k_proj.weight").shape, [32, 64]);
        assert_eq!(info("model.layers.1.self_attn.k_proj.bias").shape, [32]);
        assert_eq!(info("model.layers.0.mlp.down_proj.weight").shape, [64, 96]);
        for t in q.tensors() {
            assert_eq!(q.bytes(&t.name).unwrap().len() as u64, t.nbytes(), "{}", t.name);
        }
        let l = DummyWeights::new(&cfg("llama", true), DType::Q8_0, 1).unwrap();
        assert!(l.info("lm_head.weight").is_none() && l.info("model.layers.0.self_attn.q_proj.bias").is_none());
        assert_eq!(l.info("model.norm.weight").unwrap().dtype, DType::F32);
        let q3 = DummyWeights::new(&cfg("qwen3", true), DType::BF16, 1).unwrap();
        assert_eq!(q3.info("model.layers.1.self_attn.q_norm.weight").unwrap().shape, [16]);
        assert!(DummyWeights::new(&cfg("gemma3_text", true), DType::BF16, 1).is_err());
        assert!(DummyWeights::new(&cfg("llama", true), DType::Q4K, 1).is_err(), "64 is not a block of 256");
    }

    #[test]
    fn the_seed_decides_every_byte() {
        for dt in [DType::BF16, DType::F32, DType::Q4_0, DType::IQ4NL] {
            let a = DummyWeights::new(&cfg("qwen2", false), dt, 7).unwrap();
            let b = DummyWeights::new(&cfg("qwen2", false), dt, 7).unwrap();
            let c = DummyWeights::new(&cfg("qwen2", false), dt, 8).unwrap();
            assert_eq!(a.data, b.data, "{dt}");
            for (x, y) in a.data.iter().zip(&c.data) {
                assert_ne!(x, y, "{dt}: another seed gave the same tensor");
            }
            // Tensors differ from each other too (every chunk has its own key).
            let q = a.bytes("model.layers.0.self_attn.q_proj.weight").unwrap();
            let q1 = a.bytes("model.layers.1.self_attn.q_proj.weight").unwrap();
            assert_ne!(q, q1);
        }
    }

    /// The 2-bit i-quants on a shape of whole 256-blocks: every matrix has its type's bytes and dequantizes to
    /// finite values (the f16 scales are small and finite).
    #[test]
    fn iq2_matrices_dequantize_to_finite_values() {
        let json = r#"{"architectures": ["X"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
            "tie_word_embeddings": false, "max_position_embeddings": 256, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}"#;
        let c = HfConfig::from_json_str(json, "config.json").unwrap();
        for dt in [DType::IQ2XXS, DType::IQ2XS, DType::IQ2S] {
            let w = DummyWeights::new(&c, dt, 5).unwrap();
            let q = w.info("model.layers.0.mlp.down_proj.weight").unwrap();
            assert_eq!(q.dtype, dt);
            let bytes = w.bytes(&q.name).unwrap();
            assert_eq!(bytes.len() as u64, dt.bytes_for(256 * 512).unwrap());
            let vals = tf_quant::dequantize_to_vec(dt, bytes, 256 * 512).unwrap();
            assert!(vals.iter().all(|v| v.is_finite()), "{dt}");
            assert!(vals.iter().any(|&v| v != 0.0), "{dt}");
        }
    }

    #[test]
    fn float_values_are_finite_and_in_range() {
        let w = DummyWeights::new(&cfg("qwen2", false), DType::F32, 3).unwrap();
        for t in w.tensors() {
            let vals: Vec<f32> =
                w.bytes(&t.name).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let (lo, hi) = if t.name.contains("norm") { (0.5, 1.5) } else { (-0.05, 0.05) };
            assert!(vals.iter().all(|&v| v >= lo && v <= hi), "{}", t.name);
        }
    }
}
