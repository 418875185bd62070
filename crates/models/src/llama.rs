//! The plain pre-norm decoder, shared by `llama` (Llama 2/3, SmolLM2, Mistral, Mixtral), `qwen2` (q/k/v
//! biases), `qwen3` (per-head q/k RMSNorm) and `qwen3moe` (Qwen3 with mixture-of-experts layers). The variants are
//! `ModelConfig` flags (`qkv_bias`, `qk_norm`, the RoPE style and scaling, sliding windows, `moe`), never separate
//! files.
//!
//! Per layer: `x += attn(norm(x))`, `x += mlp(norm(x))` with a SwiGLU feed-forward, or a mixture of SwiGLU
//! experts in sparse layers; then the final norm and the output head (tied to the embeddings when the checkpoint
//! has none).

use crate::config::ModelConfig;
use crate::layers::{self, attention_residual, glu_mlp_residual, logits, trace, AttnSpec, AttnWeights, GluMlp};
use crate::load::{self, Loader, Name, ATTN_NORM, OUTPUT_NORM};
use crate::model::{Batch, Model, ModelError};
use crate::moe::{self, MoeMlp};
use tf_core::{Backend, ConfigFormat, KvCache, KvSpec, Tensor, Weight, WeightSource};

/// The pre-feed-forward norm: transformers calls it `post_attention_layernorm` in this family.
const FFN_NORM: Name = Name { gguf: "blk.{}.ffn_norm", hf: "model.layers.{}.post_attention_layernorm" };

/// One decoder layer.
struct Layer {
    /// `[H]`.
    attn_norm: Weight,
    /// q `[Nq·Dh, H]`, k and v `[Nkv·Dh, H]`, o `[H, Nq·Dh]`; biases (qwen2) and q/k norms `[Dh]` (qwen3).
    attn: AttnWeights,
    /// `[H]`.
    ffn_norm: Weight,
    mlp: Ffn,
}

/// A layer's feed-forward.
enum Ffn {
    /// gate and up `[F, H]`, down `[H, F]`.
    Dense(GluMlp),
    /// Router `[E, H]`; per expert gate and up `[Fe, H]`, down `[H, Fe]`.
    Sparse(MoeMlp),
}

pub struct Llama {
    cfg: ModelConfig,
    /// `[V, H]`.
    embd: Weight,
    layers: Vec<Layer>,
    /// Per-layer attention parameters and RoPE.
    specs: Vec<AttnSpec>,
    /// `[H]`.
    output_norm: Weight,
    /// `[V, H]` (the embedding table when tied).
    output: Weight,
    vocab: usize,
}

/// Loads a `llama`, `qwen2`, `qwen3` or `qwen3moe` checkpoint.
pub fn load(be: &dyn Backend, src: &dyn WeightSource, cfg: ModelConfig) -> Result<Box<dyn Model>, ModelError> {
    let mut cfg = cfg;
    let ld = Loader::new(be, src, cfg.format);
    if let Some(scaling) = load::rope_freqs_scaling(&ld, &cfg.rope)? {
        cfg.rope.scaling = scaling;
    }
    let (embd, vocab) = load::embeddings(&ld, &cfg)?;
    let layers = (0..cfg.layers)
        .map(|l| {
            Ok(Layer {
                attn_norm: ld.norm(ATTN_NORM, l, cfg.hidden, 0.0)?,
                attn: load::attention(&ld, &cfg, l, 0.0)?,
                ffn_norm: ld.norm(FFN_NORM, l, cfg.hidden, 0.0)?,
                mlp: match &cfg.moe {
                    // GGUF does not list dense layers of a sparse model: a layer without a router is dense.
                    Some(m)
                        if m.sparse[l]
                            && (cfg.format == ConfigFormat::HfConfig || ld.has(moe::ROUTER, l, "weight")) =>
                    {
                        Ffn::Sparse(moe::load(&ld, &cfg, m, l)?)
                    }
                    _ => Ffn::Dense(load::glu_mlp(&ld, &cfg, l)?),
                },
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let output_norm = ld.norm(OUTPUT_NORM, 0, cfg.hidden, 0.0)?;
    let output = load::output_head(&ld, &cfg, &embd, vocab)?;
    Ok(Box::new(Llama { specs: load::attn_specs(&cfg), cfg, embd, layers, output_norm, output, vocab }))
}

impl Model for Llama {
    fn family(&self) -> &'static str {
        self.cfg.family
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn context_length(&self) -> usize {
        self.cfg.context
    }

    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: self.cfg.layers, blocks, block_size, kv_heads: self.cfg.kv_heads, head_dim: self.cfg.head_dim }
    }

    fn weight_bytes_per_token(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.mlp {
                    Ffn::Dense(m) => m.nbytes(),
                    Ffn::Sparse(m) => m.bytes_per_token(),
                };
                l.attn.nbytes() + ffn + layers::weight_bytes([Some(&l.attn_norm), Some(&l.ffn_norm)])
            })
            .sum();
        layers + self.output_norm.nbytes() + layers::embed_and_head_bytes(&self.embd, &self.output)
    }

    fn forward(&self, be: &dyn Backend, batch: &Batch, kv: &mut KvCache) -> Tensor {
        layers::check_batch(batch);
        let eps = self.cfg.eps;
        let mut x = layers::embed(be, &self.embd, batch); // [R, H]
        trace("inp_embd", layers::NO_LAYER, &x);
        for (l, layer) in self.layers.iter().enumerate() {
            attention_residual(be, &mut x, &layer.attn_norm, eps, &layer.attn, &self.specs[l], l, batch, kv);
            match &layer.mlp {
                Ffn::Dense(m) => glu_mlp_residual(be, &mut x, &layer.ffn_norm, eps, m, self.cfg.act, l),
                Ffn::Sparse(m) => moe::moe_mlp_residual(be, &mut x, &layer.ffn_norm, eps, m, self.cfg.act, l),
            }
            trace("l_out", l, &x);
        }
        logits(be, &x, &self.output_norm, &self.output, eps, batch)
    }
}
