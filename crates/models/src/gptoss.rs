//! gpt-oss (openai/gpt-oss-20b, -120b): the pre-norm decoder with attention sinks, q/k/v/o biases, sliding-window
//! and full-attention layers alternating, YaRN RoPE, and a mixture of experts in every layer (router with a bias,
//! softmax over the top-k logits, experts with biases and the clamped SwiGLU).
//!
//! Per layer: `x += attn(norm(x))` with each head's sink logit in its softmax (`AttnParams::sinks`), then
//! `x += moe(norm(x))` (`moe.rs`); then the final norm and the output head. The arithmetic of the sinks, the clamped
//! SwiGLU and YaRN lives in the backend ops (docs/arithmetic.md).

use crate::config::ModelConfig;
use crate::layers::{self, attention_residual, logits, trace, AttnSpec, AttnWeights};
use crate::load::{self, Loader, Name, ATTN_NORM, OUTPUT_NORM};
use crate::model::{Batch, Model, ModelError};
use crate::moe::{self, MoeMlp};
use std::sync::Arc;
use tf_core::{Backend, ConfigFormat, KvCache, KvSpec, Tensor, Weight, WeightSource};

/// The pre-feed-forward norm: transformers' `post_attention_layernorm`, llama.cpp's `post_attention_norm`.
const FFN_NORM: Name = Name { gguf: "blk.{}.post_attention_norm", hf: "model.layers.{}.post_attention_layernorm" };

/// One decoder layer.
struct Layer {
    /// `[H]`.
    attn_norm: Weight,
    /// q `[Nq·Dh, H]`, k and v `[Nkv·Dh, H]`, o `[H, Nq·Dh]`, each with a bias.
    attn: AttnWeights,
    /// `[H]`.
    ffn_norm: Weight,
    /// Router `[E, H]` + bias `[E]`; per expert gate and up `[Fe, H]` + `[Fe]`, down `[H, Fe]` + `[H]`.
    mlp: MoeMlp,
}

pub struct GptOss {
    cfg: ModelConfig,
    /// `[V, H]`.
    embd: Weight,
    layers: Vec<Layer>,
    /// Per-layer attention parameters (with the layer's sinks `[Nq]`) and RoPE.
    specs: Vec<AttnSpec>,
    /// `[H]`.
    output_norm: Weight,
    /// `[V, H]`.
    output: Weight,
    vocab: usize,
}

/// The sink logits of layer `l` (`[Nq]`): transformers `self_attn.sinks`, GGUF `blk.{l}.attn_sinks.weight`.
fn sinks(ld: &Loader, cfg: &ModelConfig, l: usize) -> Result<Arc<[f32]>, ModelError> {
    let name = match cfg.format {
        ConfigFormat::Gguf => format!("blk.{l}.attn_sinks.weight"),
        ConfigFormat::HfConfig => ld.hf_name(&format!("model.layers.{l}.self_attn.sinks")),
    };
    Ok(ld.f32_values(&name, &[cfg.heads])?.into())
}

/// Loads a `gpt_oss` checkpoint.
pub fn load(be: &dyn Backend, src: &dyn WeightSource, cfg: ModelConfig) -> Result<Box<dyn Model>, ModelError> {
    let ld = Loader::new(be, src, cfg.format);
    let moe_cfg = cfg.moe.as_ref().ok_or_else(|| ModelError("gpt_oss config: no experts".to_owned()))?;
    let (embd, vocab) = load::embeddings(&ld, &cfg)?;
    let mut specs = load::attn_specs(&cfg);
    let mut layers = Vec::with_capacity(cfg.layers);
    for (l, spec) in specs.iter_mut().enumerate() {
        spec.params.sinks = Some(sinks(&ld, &cfg, l)?);
        layers.push(Layer {
            attn_norm: ld.norm(ATTN_NORM, l, cfg.hidden, 0.0)?,
            attn: load::attention(&ld, &cfg, l, 0.0)?,
            ffn_norm: ld.norm(FFN_NORM, l, cfg.hidden, 0.0)?,
            mlp: moe::load_biased(&ld, &cfg, moe_cfg, l)?,
        });
    }
    let output_norm = ld.norm(OUTPUT_NORM, 0, cfg.hidden, 0.0)?;
    let output = load::output_head(&ld, &cfg, &embd, vocab)?;
    Ok(Box::new(GptOss { specs, cfg, embd, layers, output_norm, output, vocab }))
}

impl Model for GptOss {
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
                l.attn.nbytes()
                    + l.mlp.bytes_per_token()
                    + layers::weight_bytes([Some(&l.attn_norm), Some(&l.ffn_norm)])
                    + 4 * self.cfg.heads as u64 // the sinks, f32
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
            moe::moe_mlp_residual(be, &mut x, &layer.ffn_norm, eps, &layer.mlp, self.cfg.act, l);
            trace("l_out", l, &x);
        }
        logits(be, &x, &self.output_norm, &self.output, eps, batch)
    }
}
