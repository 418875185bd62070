//! Gemma 3 (text): the decoder with embeddings scaled by √H, a norm before *and after* both the attention and
//! the feed-forward block, per-head q/k norms, GeGLU (tanh GELU), attention scaled by
//! `query_pre_attn_scalar^-½`, and interleaved sliding-window layers (local RoPE base) and global layers. The
//! output head is the embedding table.
//!
//! Norms: transformers' `Gemma3RMSNorm` multiplies by `1 + w`. The `+1` is folded into the weights at load time
//! for `config.json` checkpoints (in f32, as transformers computes it). GGUF files already hold `1 + w`:
//! llama.cpp's converter adds 1 to every `*norm.weight` of `gemma3` (`Gemma3Model.norm_shift`) and its graph
//! multiplies by the stored weight, and transformers' GGUF loader subtracts the 1 again. Loading the 270M GGUF
//! with a second +1 moves its logits by most of their range (tests/all/gguf_reference.rs).

use crate::config::ModelConfig;
use crate::layers::{
    self, attention, glu_mlp, logits, residual, residual_norm, rms_norm, trace, AttnSpec, AttnWeights, GluMlp,
};
use crate::load::{self, Loader, Name, ATTN_NORM, OUTPUT_NORM};
use crate::model::{Batch, Model, ModelError};
use tf_core::{Backend, ConfigFormat, KvCache, KvSpec, Tensor, Weight, WeightSource};

// Gemma's norm names (the same transformers name, `post_attention_layernorm`, is the llama family's ffn norm).
const POST_ATTN_NORM: Name =
    Name { gguf: "blk.{}.post_attention_norm", hf: "model.layers.{}.post_attention_layernorm" };
const FFN_NORM: Name = Name { gguf: "blk.{}.ffn_norm", hf: "model.layers.{}.pre_feedforward_layernorm" };
const POST_FFW_NORM: Name = Name { gguf: "blk.{}.post_ffw_norm", hf: "model.layers.{}.post_feedforward_layernorm" };

/// One decoder layer. Every norm weight holds `1 + w`.
struct Layer {
    /// `[H]`.
    attn_norm: Weight,
    /// q `[Nq·Dh, H]`, k and v `[Nkv·Dh, H]`, o `[H, Nq·Dh]`, q/k norms `[Dh]`.
    attn: AttnWeights,
    /// `[H]`.
    post_attn_norm: Weight,
    /// `[H]`.
    ffn_norm: Weight,
    /// gate and up `[F, H]`, down `[H, F]`.
    mlp: GluMlp,
    /// `[H]`.
    post_ffw_norm: Weight,
}

pub struct Gemma3 {
    cfg: ModelConfig,
    /// `[V, H]`, also the output head.
    embd: Weight,
    /// √H rounded to f32 (transformers casts the normalizer to the activation type).
    embd_scale: f32,
    layers: Vec<Layer>,
    /// Per-layer attention parameters, window and RoPE (local base on sliding layers).
    specs: Vec<AttnSpec>,
    /// `[H]`.
    output_norm: Weight,
    /// `[V, H]`: the embedding table unless the checkpoint stores a head.
    output: Weight,
    vocab: usize,
}

/// Loads a Gemma 3 text checkpoint.
pub fn load(be: &dyn Backend, src: &dyn WeightSource, cfg: ModelConfig) -> Result<Box<dyn Model>, ModelError> {
    let ld = Loader::new(be, src, cfg.format);
    let shift = match cfg.format {
        ConfigFormat::HfConfig => 1.0,
        ConfigFormat::Gguf => 0.0,
    };
    let (embd, vocab) = load::embeddings(&ld, &cfg)?;
    let norm = |n: Name, l: usize| ld.norm(n, l, cfg.hidden, shift);
    let layers = (0..cfg.layers)
        .map(|l| {
            Ok(Layer {
                attn_norm: norm(ATTN_NORM, l)?,
                attn: load::attention(&ld, &cfg, l, shift)?,
                post_attn_norm: norm(POST_ATTN_NORM, l)?,
                ffn_norm: norm(FFN_NORM, l)?,
                mlp: load::glu_mlp(&ld, &cfg, l)?,
                post_ffw_norm: norm(POST_FFW_NORM, l)?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let output_norm = norm(OUTPUT_NORM, 0)?;
    let output = load::output_head(&ld, &cfg, &embd, vocab)?;
    let embd_scale = (cfg.hidden as f64).sqrt() as f32;
    Ok(Box::new(Gemma3 { specs: load::attn_specs(&cfg), cfg, embd, embd_scale, layers, output_norm, output, vocab }))
}

impl Model for Gemma3 {
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
        let norms = |l: &Layer| {
            layers::weight_bytes([
                Some(&l.attn_norm),
                Some(&l.post_attn_norm),
                Some(&l.ffn_norm),
                Some(&l.post_ffw_norm),
            ])
        };
        let layers: u64 = self.layers.iter().map(|l| l.attn.nbytes() + l.mlp.nbytes() + norms(l)).sum();
        layers + self.output_norm.nbytes() + layers::embed_and_head_bytes(&self.embd, &self.output)
    }

    fn forward(&self, be: &dyn Backend, batch: &Batch, kv: &mut KvCache) -> Tensor {
        layers::check_batch(batch);
        let eps = self.cfg.eps;
        let mut x = layers::embed(be, &self.embd, batch); // [R, H]
        be.scale(&mut x, self.embd_scale);
        trace("inp_scaled", layers::NO_LAYER, &x);
        // The next layer's attention input, when the previous layer's last residual add already normed it. The
        // post-norms act on the block outputs before their residual add, so only add-then-norm is fused.
        let mut next_h: Option<Tensor> = None;
        for (l, layer) in self.layers.iter().enumerate() {
            let h = next_h.take().unwrap_or_else(|| rms_norm(be, &x, &layer.attn_norm, eps));
            trace("attn_norm", l, &h);
            let attn_out = attention(be, &h, &layer.attn, &self.specs[l], l, batch, kv);
            let attn_out = rms_norm(be, &attn_out, &layer.post_attn_norm, eps);
            trace("attn_post_norm", l, &attn_out);
            let h = residual_norm(be, &mut x, &attn_out, &layer.ffn_norm, eps);
            trace("ffn_norm", l, &h);
            let ffn_out = glu_mlp(be, &h, &layer.mlp, self.cfg.act, l);
            let ffn_out = rms_norm(be, &ffn_out, &layer.post_ffw_norm, eps);
            trace("ffn_post_norm", l, &ffn_out);
            match self.layers.get(l + 1) {
                Some(next) => next_h = Some(residual_norm(be, &mut x, &ffn_out, &next.attn_norm, eps)),
                None => residual(be, &mut x, &ffn_out),
            }
            trace("l_out", l, &x);
        }
        logits(be, &x, &self.output_norm, &self.output, eps, batch)
    }
}
