//! Shared layers: the building blocks every family file is written in. Each is a short function over
//! `&dyn Backend`, so a family's forward pass reads as a list of named steps, and every step is row-exact because
//! every backend op is.
//!
//! Shapes: `R` rows (tokens of any mix of sequences), `H` hidden, `Dh` head size, `Nq`/`Nkv` query/key-value
//! heads, `F` feed-forward width.

use crate::model::Batch;
use tf_core::{AttnParams, Backend, GluAct, KvCache, Rope, RopeKv, Tensor, Weight};

/// Names an intermediate of layer `layer` (`usize::MAX` for tensors outside the layer stack), so a failing golden
/// can be bisected. A no-op unless the `trace` feature is on; then it hands the tensor to the hook installed with
/// `set_trace_hook` on this thread.
#[inline(always)]
pub fn trace(name: &str, layer: usize, t: &Tensor) {
    #[cfg(feature = "trace")]
    hook::call(name, layer, t);
    #[cfg(not(feature = "trace"))]
    let _ = (name, layer, t);
}

/// Marks a tensor that belongs to no layer (embeddings, final norm, logits).
pub const NO_LAYER: usize = usize::MAX;

#[cfg(feature = "trace")]
pub use hook::set_trace_hook;

#[cfg(feature = "trace")]
mod hook {
    use std::cell::RefCell;
    use tf_core::Tensor;

    /// Receives (name, layer, tensor) for every traced intermediate.
    pub type TraceHook = Box<dyn FnMut(&str, usize, &Tensor)>;

    thread_local! {
        static HOOK: RefCell<Option<TraceHook>> = const { RefCell::new(None) };
    }

    /// Installs (or with `None` removes) this thread's trace hook.
    pub fn set_trace_hook(hook: Option<TraceHook>) {
        HOOK.with(|h| *h.borrow_mut() = hook);
    }

    pub(super) fn call(name: &str, layer: usize, t: &Tensor) {
        HOOK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f(name, layer, t)
            }
        });
    }
}

/// Panics unless every per-row list of `batch` has one entry per row and every logit row exists (a programming
/// error in the caller, like a shape mismatch in a backend op).
pub fn check_batch(batch: &Batch) {
    let r = batch.tokens.len();
    assert!(
        batch.positions.len() == r && batch.slots.len() == r && batch.attn.rows.len() == r,
        "batch rows: {r} tokens, {} positions, {} slots, {} attention rows",
        batch.positions.len(),
        batch.slots.len(),
        batch.attn.rows.len()
    );
    assert!(batch.logit_rows.iter().all(|&i| i < r), "batch logit rows {:?} out of {r} rows", batch.logit_rows);
    if let Some(fed) = &batch.fed {
        assert_eq!(fed.rows, r, "batch rows: {r} tokens, {} queued ids", fed.rows);
    }
}

/// The rows of the embedding table `embd [V, H]` for the batch's tokens (or its queued ids) → `[R, H]`.
pub fn embed(be: &dyn Backend, embd: &Weight, batch: &Batch) -> Tensor {
    match &batch.fed {
        Some(ids) => be.embed_queued(embd, ids),
        None => be.embed(embd, &batch.tokens),
    }
}

/// A projection `y = x · wᵀ + b`.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub w: Weight,
    /// `[out]` f32, if the checkpoint has one.
    pub b: Option<Weight>,
}

/// `x [R, in] → [R, out]`.
pub fn linear(be: &dyn Backend, x: &Tensor, p: &Linear) -> Tensor {
    be.matmul(x, &p.w, p.b.as_ref())
}

/// RMSNorm over the whole row: `x [R, H]`, `w [H]`.
pub fn rms_norm(be: &dyn Backend, x: &Tensor, w: &Weight, eps: f32) -> Tensor {
    be.rms_norm(x, w, x.cols, eps)
}

/// The residual connection `x += delta`.
pub fn residual(be: &dyn Backend, x: &mut Tensor, delta: &Tensor) {
    be.add(x, delta);
}

/// The residual connection `x += delta` and the RMSNorm of the new `x` that follows it (`w [H]`), in one backend
/// op ([`Backend::add_rms_norm`]: the same bits as [`residual`] then [`rms_norm`]).
pub fn residual_norm(be: &dyn Backend, x: &mut Tensor, delta: &Tensor, w: &Weight, eps: f32) -> Tensor {
    be.add_rms_norm(x, delta, w, eps)
}

/// Bytes of `ws` as uploaded ([`Weight::nbytes`]); `None` entries (absent biases, norms) count nothing.
pub fn weight_bytes<'a>(ws: impl IntoIterator<Item = Option<&'a Weight>>) -> u64 {
    ws.into_iter().flatten().map(Weight::nbytes).sum()
}

/// The weights of one self-attention block.
#[derive(Clone, Debug)]
pub struct AttnWeights {
    /// `[Nq·Dh, H]`, bias `[Nq·Dh]`.
    pub q: Linear,
    /// `[Nkv·Dh, H]`, bias `[Nkv·Dh]`.
    pub k: Linear,
    /// `[Nkv·Dh, H]`, bias `[Nkv·Dh]`.
    pub v: Linear,
    /// `[H, Nq·Dh]`.
    pub o: Linear,
    /// Per-head RMSNorm of q before RoPE: `[Dh]`.
    pub q_norm: Option<Weight>,
    /// Per-head RMSNorm of k before RoPE: `[Dh]`.
    pub k_norm: Option<Weight>,
}

/// How one layer attends: heads, scale, window, RoPE and the q/k-norm epsilon.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    pub params: AttnParams,
    pub rope: Rope,
    pub eps: f32,
}

impl AttnWeights {
    /// Bytes of every weight of the block.
    pub fn nbytes(&self) -> u64 {
        let (q, k, v, o) = (&self.q, &self.k, &self.v, &self.o);
        weight_bytes([Some(&q.w), q.b.as_ref(), Some(&k.w), k.b.as_ref(), Some(&v.w), v.b.as_ref(), Some(&o.w)])
            + weight_bytes([o.b.as_ref(), self.q_norm.as_ref(), self.k_norm.as_ref()])
    }
}

/// Self-attention of layer `layer` over the paged KV cache: projects `x [R, H]` (already normed) to q, k, v,
/// applies the optional q/k norms and RoPE at each row's own position, writes k and v into each row's slot,
/// attends as `batch.attn` says, and projects back → `[R, H]`.
pub fn attention(
    be: &dyn Backend,
    x: &Tensor,
    w: &AttnWeights,
    spec: &AttnSpec,
    layer: usize,
    batch: &Batch,
    kv: &mut KvCache,
) -> Tensor {
    let qkv = be.matmul_many(x, &qkv_weights(w));
    let attn = attend(be, qkv, w, spec, layer, batch, kv); // [R, Nq·Dh]
    linear(be, &attn, &w.o) // [R, H]
}

/// The pre-norm attention block with its residual connection: `x += o(attention(rms_norm(x, norm)))` for
/// `x [R, H]`, `norm [H]`. The same bits as [`rms_norm`], [`attention`] and [`residual`] in turn, through the
/// backend's fused ops ([`Backend::norm_qkv_rope_kv_write`] without q/k norms, else
/// [`Backend::norm_matmul_many`]; [`Backend::matmul_add`]); with the `trace` feature, those three in turn, so every
/// intermediate can be traced.
#[allow(clippy::too_many_arguments)]
pub fn attention_residual(
    be: &dyn Backend,
    x: &mut Tensor,
    norm: &Weight,
    eps: f32,
    w: &AttnWeights,
    spec: &AttnSpec,
    layer: usize,
    batch: &Batch,
    kv: &mut KvCache,
) {
    if cfg!(feature = "trace") {
        let h = rms_norm(be, x, norm, eps);
        trace("attn_norm", layer, &h);
        let out = attention(be, &h, w, spec, layer, batch, kv);
        trace("attn_out", layer, &out);
        return residual(be, x, &out);
    }
    let attn = if w.q_norm.is_none() && w.k_norm.is_none() {
        // No q/k norms between the projections and RoPE: up to the cache write in one call.
        let at = RopeKv {
            positions: &batch.positions,
            slots: &batch.slots,
            head_dim: spec.params.head_dim,
            rope: &spec.rope,
        };
        let [q, _k, _v] = be.norm_qkv_rope_kv_write(x, norm, eps, &qkv_weights(w), kv, layer, &at);
        be.attention(&q, kv, layer, &batch.attn, &spec.params) // [R, Nq·Dh]
    } else {
        let qkv = be.norm_matmul_many(x, norm, eps, &qkv_weights(w));
        attend(be, qkv, w, spec, layer, batch, kv) // [R, Nq·Dh]
    };
    be.matmul_add(&attn, &w.o.w, w.o.b.as_ref(), x);
}

/// q, k and v with their biases, in that order.
fn qkv_weights(w: &AttnWeights) -> [(&Weight, Option<&Weight>); 3] {
    [(&w.q.w, w.q.b.as_ref()), (&w.k.w, w.k.b.as_ref()), (&w.v.w, w.v.b.as_ref())]
}

/// From the projections `[q, k, v]` to the attention heads `[R, Nq·Dh]`: the optional q/k norms, RoPE at each
/// row's position, k and v into the rows' slots, then attention as `batch.attn` says.
fn attend(
    be: &dyn Backend,
    qkv: Vec<Tensor>,
    w: &AttnWeights,
    spec: &AttnSpec,
    layer: usize,
    batch: &Batch,
    kv: &mut KvCache,
) -> Tensor {
    let dh = spec.params.head_dim;
    let [q, k, v]: [Tensor; 3] = qkv.try_into().expect("one result per weight");
    let (mut q, mut k) = (q, k); // [R, Nq·Dh], [R, Nkv·Dh]
                                 // v: [R, Nkv·Dh]
    trace("q", layer, &q);
    trace("k", layer, &k);
    trace("v", layer, &v);
    if let Some(n) = &w.q_norm {
        q = be.rms_norm(&q, n, dh, spec.eps);
        trace("q_normed", layer, &q);
    }
    if let Some(n) = &w.k_norm {
        k = be.rms_norm(&k, n, dh, spec.eps);
        trace("k_normed", layer, &k);
    }
    // RoPE of q and k, then k and v into the cache, in one call.
    let at = RopeKv { positions: &batch.positions, slots: &batch.slots, head_dim: dh, rope: &spec.rope };
    be.rope_kv_write(&mut q, &mut k, &v, kv, layer, &at);
    trace("q_rope", layer, &q);
    trace("k_rope", layer, &k);
    let attn = be.attention(&q, kv, layer, &batch.attn, &spec.params); // [R, Nq·Dh]
    trace("attn_heads", layer, &attn);
    attn
}

/// A gated feed-forward block.
#[derive(Clone, Debug)]
pub struct GluMlp {
    /// `[F, H]`.
    pub gate: Weight,
    /// `[F, H]`.
    pub up: Weight,
    /// `[H, F]`.
    pub down: Weight,
}

impl GluMlp {
    /// Bytes of gate, up and down.
    pub fn nbytes(&self) -> u64 {
        weight_bytes([Some(&self.gate), Some(&self.up), Some(&self.down)])
    }
}

/// What one decode step reads of an embedding table `embd [V, H]` and the output head `output [V, H]` (the
/// same table when tied): one row of the table, and the head.
pub fn embed_and_head_bytes(embd: &Weight, output: &Weight) -> u64 {
    embd.nbytes() / embd.out_dim().max(1) as u64 + output.nbytes()
}

/// `down(act(gate(x)) * up(x))`: `x [R, H] → [R, H]`.
pub fn glu_mlp(be: &dyn Backend, x: &Tensor, w: &GluMlp, act: GluAct, layer: usize) -> Tensor {
    let h = be.matmul_glu(x, &w.gate, &w.up, act); // [R, F]
    trace("ffn_act", layer, &h);
    be.matmul(&h, &w.down, None) // [R, H]
}

/// The pre-norm feed-forward block with its residual connection: `x += glu_mlp(rms_norm(x, norm))` for `x [R, H]`,
/// `norm [H]`. The same bits as [`rms_norm`], [`glu_mlp`] and [`residual`] in turn, through the backend's fused
/// ops ([`Backend::norm_matmul_glu`], [`Backend::matmul_add`]); with the `trace` feature, those three in turn.
pub fn glu_mlp_residual(
    be: &dyn Backend,
    x: &mut Tensor,
    norm: &Weight,
    eps: f32,
    w: &GluMlp,
    act: GluAct,
    layer: usize,
) {
    if cfg!(feature = "trace") {
        let h = rms_norm(be, x, norm, eps);
        trace("ffn_norm", layer, &h);
        let out = glu_mlp(be, &h, w, act, layer);
        trace("ffn_out", layer, &out);
        return residual(be, x, &out);
    }
    let h = be.norm_matmul_glu(x, norm, eps, &w.gate, &w.up, act); // [R, F]
    trace("ffn_act", layer, &h);
    be.matmul_add(&h, &w.down, None, x);
}

/// The last step of every decoder: keep the rows whose logits are wanted, norm them and project to the
/// vocabulary. Selecting before the norm is the same bits as after (both ops are row-exact) and cheaper.
/// `x [R, H]`, `norm [H]`, `head [V, H]` → `[batch.logit_rows.len(), V]`.
pub fn logits(be: &dyn Backend, x: &Tensor, norm: &Weight, head: &Weight, eps: f32, batch: &Batch) -> Tensor {
    // Every row in order (a decode step): no copy.
    let normed = if batch.logit_rows.iter().copied().eq(0..x.rows) {
        rms_norm(be, x, norm, eps)
    } else {
        let rows = be.select_rows(x, &batch.logit_rows); // [L, H]
        rms_norm(be, &rows, norm, eps)
    };
    trace("result_norm", NO_LAYER, &normed);
    let logits = be.matmul(&normed, head, None); // [L, V]
    trace("result_output", NO_LAYER, &logits);
    logits
}
