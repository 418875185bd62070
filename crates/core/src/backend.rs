//! `Backend`: the one op interface every model calls. Coarse, fused, and **row-exact**: output row r of every op
//! is a pure function of input row r, the weights and (attention only) the keys/values that row attends to. It
//! never depends on how many rows share the call, their order, the thread count or the SIMD level
//! (DESIGN.md §2). The canonical reduction orders are defined by the scalar reference in `tf_quant::reference`.
//!
//! Data layout: activations are row-major `rows × cols` f32 matrices ([`Tensor`]); weight matrices are
//! `[out, in]` (PyTorch layout, GGUF `ne = [in, out]`), so `matmul(x, w)` computes `x · wᵀ`.

use crate::{DType, SharedBytes, TensorInfo};
use std::any::Any;
use std::sync::Arc;

/// Which arithmetic the matmuls use (DESIGN.md §2). Each mode is exact with itself; the two differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// The checkpoint's own math: activation rows quantized to int8 blocks (Q8_0 for 32-element weight blocks,
    /// Q8_K for 256-element K-quant blocks) times the integer weight blocks. Float weights (F32/F16/BF16) use
    /// the `full` path.
    #[default]
    Checkpoint,
    /// f32 activations × weights dequantized to f32.
    Full,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Checkpoint => "checkpoint",
            Precision::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Option<Precision> {
        match s {
            "checkpoint" => Some(Precision::Checkpoint),
            "full" => Some(Precision::Full),
            _ => None,
        }
    }
}

/// Backend-owned storage behind a [`Tensor`], [`Weight`] or [`KvCache`]; each backend downcasts its own.
pub type Storage = Arc<dyn Any + Send + Sync>;

/// An activation matrix: `rows × cols` f32, row-major.
#[derive(Clone)]
pub struct Tensor {
    pub rows: usize,
    pub cols: usize,
    /// Host data for the CPU backend; device backends keep their buffer in `device`.
    pub host: Vec<f32>,
    pub device: Option<Storage>,
}

impl Tensor {
    /// A host tensor. Panics if `data.len() != rows * cols` (a programming error, not input).
    pub fn host(rows: usize, cols: usize, data: Vec<f32>) -> Tensor {
        assert_eq!(data.len(), rows * cols, "tensor data length");
        Tensor { rows, cols, host: data, device: None }
    }

    pub fn zeros(rows: usize, cols: usize) -> Tensor {
        Tensor::host(rows, cols, vec![0.0; rows * cols])
    }

    /// Row `r` of a host tensor.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.host[r * self.cols..(r + 1) * self.cols]
    }

    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.host[r * self.cols..(r + 1) * self.cols]
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor[{}×{}{}]", self.rows, self.cols, if self.device.is_some() { ", device" } else { "" })
    }
}

/// A weight uploaded to a backend. `shape` is outermost-first: `[out, in]` for matrices, `[n]` for vectors.
#[derive(Clone)]
pub struct Weight {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub storage: Storage,
}

impl Weight {
    /// Rows of a matrix (`out`), or 1 for a vector.
    pub fn out_dim(&self) -> usize {
        if self.shape.len() >= 2 {
            self.shape[..self.shape.len() - 1].iter().product()
        } else {
            1
        }
    }

    /// The contiguous (innermost) dimension (`in`).
    pub fn in_dim(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }

    /// Bytes of the weight as uploaded (its dtype's blocks over every element).
    pub fn nbytes(&self) -> u64 {
        self.dtype.bytes_for(self.shape.iter().product::<usize>() as u64).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Weight({} {} {:?})", self.name, self.dtype, self.shape)
    }
}

/// The shape of a paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub layers: usize,
    /// Number of blocks in the pool.
    pub blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvSpec {
    /// Bytes of K and V for one token slot over all layers (f32 storage).
    pub fn bytes_per_slot(&self) -> usize {
        2 * self.layers * self.kv_heads * self.head_dim * 4
    }
}

/// A paged KV store allocated by a backend: `layers × (blocks·block_size) slots × kv_heads × head_dim` for K and
/// for V. Slot `s` of a sequence's position `p` is `block_table[p / block_size] * block_size + p % block_size`.
pub struct KvCache {
    pub spec: KvSpec,
    pub storage: Storage,
    /// The recurrent-state registers of a hybrid model ([`Backend::alloc_states`]); `None` for attention-only
    /// models.
    pub states: Option<crate::state::StateCache>,
}

/// What one row attends to. Positions are visited in increasing absolute position order (the canonical order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowAttn {
    /// The row's own absolute position (for sliding windows).
    pub pos: u32,
    /// Index into [`AttnMeta::block_tables`]: the row's sequence.
    pub seq: usize,
    /// Attend the sequence's positions `0..ctx` through its block table (the committed prefix; for a causal
    /// prompt chunk, `pos + 1`).
    pub ctx: u32,
    /// Further (position, slot) pairs attended after the prefix, strictly increasing positions, all ≥ `ctx`:
    /// a tree window row's ancestors and itself. Empty for causal rows.
    pub tree: Vec<(u32, u32)>,
}

/// Attention metadata for one call: per-row attention lists over paged KV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttnMeta {
    /// One block table per sequence in the call: block ids in position order.
    pub block_tables: Vec<Vec<u32>>,
    pub rows: Vec<RowAttn>,
}

/// Per-layer attention parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnParams {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies q·k (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Sliding window: a row at position p attends only positions > p - window.
    pub window: Option<u32>,
    /// Logit soft-capping: s ← cap · tanh(s / cap).
    pub softcap: Option<f32>,
    /// Attention sinks (gpt-oss): one learned logit per query head `[heads]` that joins the softmax denominator
    /// and attends no value. `None` leaves the softmax as it is.
    pub sinks: Option<Arc<[f32]>>,
}

impl AttnParams {
    /// Checks `q [R, heads·head_dim]` and `meta` (one row each) against these parameters, and the KV layout
    /// (`kv_heads`, `head_dim`) a backend holds; panics with the op and the shapes on a mismatch.
    pub fn check(&self, q: &Tensor, meta: &AttnMeta, kv_heads: usize, head_dim: usize) {
        assert!(
            self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "attention: heads {} vs kv_heads {}",
            self.heads,
            self.kv_heads
        );
        assert_eq!(q.cols, self.heads * self.head_dim, "attention: q cols vs heads·head_dim");
        assert_eq!(meta.rows.len(), q.rows, "attention: one RowAttn per q row");
        assert!(kv_heads == self.kv_heads && head_dim == self.head_dim, "attention: kv layout vs params");
        if let Some(s) = &self.sinks {
            assert_eq!(s.len(), self.heads, "attention: one sink per query head");
        }
    }
}

/// How RoPE rotates pairs within a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-J / original Llama GGUF layout: pairs (2i, 2i+1).
    Normal,
    /// GPT-NeoX / HF layout: pairs (i, i + rot_dims/2).
    Neox,
}

/// RoPE frequency scaling variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1 frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
    /// YaRN (gpt-oss): frequencies blended between `freq / factor` and `freq` along a linear ramp over the pair
    /// index between the dimensions that make `beta_fast` and `beta_slow` rotations in `original_context`
    /// positions (rounded outwards when `truncate`), and cos/sin multiplied by `mscale` (transformers'
    /// `attention_factor`, `0.1·ln(factor) + 1` by default), which scales q·k by `mscale²`.
    Yarn {
        factor: f64,
        original_context: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        mscale: f64,
    },
}

/// RoPE parameters; backends build cos/sin tables from them once, in f64, rounded to f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    /// Rotated dimensions per head (≤ head_dim; the rest pass through).
    pub rot_dims: usize,
    pub style: RopeStyle,
    pub scaling: RopeScaling,
}

/// Where [`Backend::rope_kv_write`] rotates and writes: each row's position and KV slot, and the rotation.
#[derive(Clone, Copy, Debug)]
pub struct RopeKv<'a> {
    /// `positions[r]`: the position row r is rotated to.
    pub positions: &'a [u32],
    /// `slots[r]`: the KV slot row r's K and V go to.
    pub slots: &'a [u32],
    pub head_dim: usize,
    pub rope: &'a Rope,
}

/// Gated activations of the feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GluAct {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU as in Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
    /// `(u + 1) · g · sigmoid(alpha · g)` (not a plain `act(gate) * up`; docs/arithmetic.md gives the operations).
    SwigluClamp { alpha: f32, limit: f32 },
}

/// An error from a backend: an unsupported weight type or shape, or running out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError(pub String);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackendError {}

/// The one op interface. Every op is row-exact (module docs). Shapes are checked by the backend; a mismatch is
/// a programming error in the model and panics with the op and shapes.
pub trait Backend: Send + Sync {
    /// "cpu (avx2, 2 threads)" and the like.
    fn describe(&self) -> String;
    fn precision(&self) -> Precision;
    /// Rows per forward a server should allow by default (prompt chunks and windows share them): past about this
    /// many a row costs little less. 256 by default.
    fn default_round_rows(&self) -> usize {
        256
    }

    /// Uploads a checkpoint tensor as stored (`bytes` are its raw little-endian data).
    fn upload(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Weight, BackendError>;
    /// Uploads a checkpoint tensor whose bytes a shared owner holds (the mapped file): a backend that computes
    /// from host memory may keep them in place instead of copying. By default, [`Backend::upload`] of a copy.
    fn upload_shared(&self, info: &TensorInfo, bytes: SharedBytes) -> Result<Weight, BackendError> {
        self.upload(info, bytes.as_slice())
    }
    /// Uploads f32 values computed at load time (e.g. a norm weight with a constant folded in).
    fn upload_f32(&self, name: &str, shape: &[usize], values: Vec<f32>) -> Result<Weight, BackendError>;

    /// Rows of an embedding table `[vocab, hidden]` for `ids` → `[ids.len(), hidden]`.
    fn embed(&self, table: &Weight, ids: &[u32]) -> Tensor;
    /// `x [R, K] · wᵀ` for `w [N, K]` of any supported type, plus an optional f32 bias `[N]` → `[R, N]`.
    fn matmul(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>) -> Tensor;
    /// [`Backend::matmul`] of one `x` with several weights (`[(w, bias)]`, the same `K`) → one result per weight,
    /// with the same bits as separate calls (a backend may share work between them). By default, separate calls.
    fn matmul_many(&self, x: &Tensor, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        ws.iter().map(|&(w, b)| self.matmul(x, w, b)).collect()
    }
    /// RMSNorm over groups of `group` columns (`group == cols` for a plain norm, `head_dim` for per-head q/k
    /// norms), each scaled by `w [group]`.
    fn rms_norm(&self, x: &Tensor, w: &Weight, group: usize, eps: f32) -> Tensor;
    /// Rotates each `head_dim` group of every row by its position (`positions[r]`) in place.
    fn rope(&self, x: &mut Tensor, positions: &[u32], head_dim: usize, rope: &Rope);
    /// Allocates a zeroed KV cache.
    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError>;
    /// Writes rows of K and V (`[R, kv_heads·head_dim]`) of `layer` into `slots[r]`.
    fn kv_write(&self, kv: &mut KvCache, layer: usize, k: &Tensor, v: &Tensor, slots: &[u32]);
    /// Copies the K and V of every layer from slot `src[i]` to slot `dst[i]`, bit for bit (a tree window's
    /// accepted path moves from scratch slots into place). Pairs are applied in order.
    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]);
    /// Attention of `q [R, heads·head_dim]` over the KV each row attends (`meta.rows[r]`) → `[R, heads·head_dim]`.
    fn attention(&self, q: &Tensor, kv: &KvCache, layer: usize, meta: &AttnMeta, p: &AttnParams) -> Tensor;
    /// `act(gate) * up`, elementwise.
    fn glu(&self, gate: &Tensor, up: &Tensor, act: GluAct) -> Tensor;
    /// The feed-forward block's first half in one call: `glu(x · gateᵀ, x · upᵀ, act)` → `[R, F]`. By default
    /// [`Backend::matmul_many`] then [`Backend::glu`]; a backend that fuses them must give exactly those bits.
    fn matmul_glu(&self, x: &Tensor, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        let [g, u]: [Tensor; 2] =
            self.matmul_many(x, &[(gate, None), (up, None)]).try_into().expect("one result per weight");
        self.glu(&g, &u, act)
    }
    /// RoPE of `q` and `k` in place (`at.positions`, `at.head_dim`, `at.rope`), then the rotated `k` and `v` of
    /// `layer` into `at.slots`. By default [`Backend::rope`] twice and [`Backend::kv_write`]; a backend that fuses
    /// them must give exactly those bits.
    fn rope_kv_write(&self, q: &mut Tensor, k: &mut Tensor, v: &Tensor, kv: &mut KvCache, layer: usize, at: &RopeKv) {
        self.rope(q, at.positions, at.head_dim, at.rope);
        self.rope(k, at.positions, at.head_dim, at.rope);
        self.kv_write(kv, layer, k, v, at.slots);
    }
    /// The attention block from its input to the cache write, for blocks without q/k norms:
    /// `[q, k, v] = norm_matmul_many(x, norm, eps, ws)` (`ws` = q, k, v with their biases), then
    /// [`Backend::rope_kv_write`] of them → `[q, k, v]`, q and k rotated. By default those two calls; a backend that
    /// fuses them (the projections rotating their own outputs and writing the cache) must give exactly those bits.
    #[allow(clippy::too_many_arguments)]
    fn norm_qkv_rope_kv_write(
        &self,
        x: &Tensor,
        norm: &Weight,
        eps: f32,
        ws: &[(&Weight, Option<&Weight>); 3],
        kv: &mut KvCache,
        layer: usize,
        at: &RopeKv,
    ) -> [Tensor; 3] {
        norm_qkv_then_rope_kv_write(self, x, norm, eps, ws, kv, layer, at)
    }
    /// `a += b`, elementwise.
    fn add(&self, a: &mut Tensor, b: &Tensor);
    /// The residual add and the RMSNorm after it in one call: `a += b`, then the norm of the new `a` over whole
    /// rows (`w [cols]`) → `[R, cols]`. By default [`Backend::add`] then [`Backend::rms_norm`]; a backend that
    /// fuses them must give exactly those bits (the same per-element sum and the same reduction order).
    fn add_rms_norm(&self, a: &mut Tensor, b: &Tensor, w: &Weight, eps: f32) -> Tensor {
        self.add(a, b);
        self.rms_norm(a, w, a.cols, eps)
    }
    /// A projection and the residual add after it: `acc += x · wᵀ + b` (`acc [R, N]`). By default
    /// [`Backend::matmul`] then [`Backend::add`]; a backend that fuses them must give exactly those bits.
    fn matmul_add(&self, x: &Tensor, w: &Weight, bias: Option<&Weight>, acc: &mut Tensor) {
        let y = self.matmul(x, w, bias);
        self.add(acc, &y);
    }
    /// [`Backend::matmul_many`] of the RMSNorm of `x` over whole rows (`norm [cols]`): the attention block's
    /// first step. By default [`Backend::rms_norm`] then [`Backend::matmul_many`]; a backend that fuses them (each
    /// block norming the row it reads) must give exactly those bits.
    fn norm_matmul_many(&self, x: &Tensor, norm: &Weight, eps: f32, ws: &[(&Weight, Option<&Weight>)]) -> Vec<Tensor> {
        let h = self.rms_norm(x, norm, x.cols, eps);
        self.matmul_many(&h, ws)
    }
    /// [`Backend::matmul_glu`] of the RMSNorm of `x` over whole rows (`norm [cols]`): the feed-forward block's first
    /// step. By default [`Backend::rms_norm`] then [`Backend::matmul_glu`]; a backend that fuses them must give
    /// exactly those bits.
    fn norm_matmul_glu(&self, x: &Tensor, norm: &Weight, eps: f32, gate: &Weight, up: &Weight, act: GluAct) -> Tensor {
        let h = self.rms_norm(x, norm, x.cols, eps);
        self.matmul_glu(&h, gate, up, act)
    }
    /// `x *= s`, elementwise.
    fn scale(&self, x: &mut Tensor, s: f32);
    /// The listed rows, in that order.
    fn select_rows(&self, x: &Tensor, rows: &[usize]) -> Tensor;
    /// `acc[rows[i]] += scales[i] · y[i]` for every row `i` of `y [n, C]`, in order of `i`, each element one rounded
    /// product then one rounded sum (`acc [R, C]`; a row may be listed more than once). The mixture-of-experts
    /// combine. Reference: `tf_quant::reference::ops::add_rows_scaled`.
    fn add_rows_scaled(&self, acc: &mut Tensor, y: &Tensor, rows: &[usize], scales: &[f32]) {
        let _ = (acc, y, rows, scales);
        panic!("{} cannot combine expert outputs (Backend::add_rows_scaled)", self.describe());
    }
    /// The tensor's data on the host (row-major).
    fn to_host(&self, x: &Tensor) -> Vec<f32>;

    /// The squared ReLU, elementwise: `max(x, 0)²` (one rounding). A backend without it panics.
    fn relu_sq(&self, x: &Tensor) -> Tensor {
        let _ = x;
        panic!("{} has no squared-ReLU op", self.describe())
    }
    /// Allocates a recurrent-state register store (hybrid models). By default the backend has none.
    fn alloc_states(&self, spec: crate::state::StateSpec) -> Result<crate::state::StateCache, BackendError> {
        let _ = spec;
        Err(BackendError(format!("{} has no recurrent-state ops (hybrid models)", self.describe())))
    }
    /// The depthwise causal convolution and SiLU of recurrent layer `layer`, per row from the window its
    /// [`crate::state::StateIo`] names: `x [R, conv_dim]` → `[R, conv_dim]`; `w [conv_dim, kernel]`, `b [conv_dim]`
    /// (host f32). Each row's window after it goes to its `dst` register.
    fn ssm_conv(
        &self,
        x: &Tensor,
        w: &[f32],
        b: Option<&[f32]>,
        st: &crate::state::StateCache,
        layer: usize,
        io: &[crate::state::StateIo],
    ) -> Tensor {
        let _ = (x, w, b, st, layer, io);
        panic!("{} has no recurrent-state ops", self.describe())
    }
    /// The selective scan of recurrent layer `layer`, gated by `z` and group-normalized by `norm`:
    /// `xbc [R, conv_dim]` (the convolution's output), `dt [R, heads]`, `z [R, heads·head_dim]` →
    /// `[R, heads·head_dim]`. Each row's SSM state after it goes to its `dst` register.
    #[allow(clippy::too_many_arguments)]
    fn ssm_scan(
        &self,
        xbc: &Tensor,
        dt: &Tensor,
        z: &Tensor,
        norm: &[f32],
        p: &crate::state::SsmParams<'_>,
        st: &crate::state::StateCache,
        layer: usize,
        io: &[crate::state::StateIo],
    ) -> Tensor {
        let _ = (xbc, dt, z, norm, p, st, layer, io);
        panic!("{} has no recurrent-state ops", self.describe())
    }
    /// For each row of `x [R, V]`, [`argmax_row`] of it: the engine's greedy token, so that a greedy draw needs
    /// only `R` ids on the host instead of the whole logits. By default [`Backend::to_host`] then [`argmax_row`];
    /// a backend that computes it where the data is must give exactly those ids.
    fn argmax_rows(&self, x: &Tensor) -> Vec<u32> {
        let host = self.to_host(x);
        argmax_rows_of(&host, x.rows, x.cols)
    }
    /// Whether [`Backend::argmax_rows_queued`] returns before the ids exist (the backend queues work and runs it
    /// later): then a caller gains by queueing the next forward, fed by [`Backend::embed_queued`], before it takes
    /// the ids. False by default (a backend that computes as it is called would only run ahead of its caller).
    fn queues_ids(&self) -> bool {
        false
    }
    /// [`Backend::argmax_rows`] of `x`, left where the backend computes: for [`Backend::embed_queued`] (a later
    /// forward fed without the host) and [`Backend::take_ids`]. By default computed now.
    fn argmax_rows_queued(&self, x: &Tensor) -> QueuedIds {
        QueuedIds { rows: x.rows, host: Some(self.argmax_rows(x)), device: None }
    }
    /// [`Backend::embed`] of the queued ids (`ids.rows` rows, in order), without waiting for them on the host.
    /// By default [`Backend::take_ids`] then [`Backend::embed`].
    fn embed_queued(&self, table: &Weight, ids: &QueuedIds) -> Tensor {
        self.embed(table, &self.take_ids(ids))
    }
    /// The queued ids on the host (waits for them, not for work queued after them where the backend can tell).
    fn take_ids(&self, ids: &QueuedIds) -> Vec<u32> {
        ids.host.clone().expect("queued ids with neither host values nor the backend that queued them")
    }
}

/// Argmax ids of a forward's rows that may not exist yet ([`Backend::argmax_rows_queued`]): `host` when they were
/// computed at once, else the queueing backend's own handle in `device`.
#[derive(Clone)]
pub struct QueuedIds {
    pub rows: usize,
    pub host: Option<Vec<u32>>,
    pub device: Option<Storage>,
}

impl std::fmt::Debug for QueuedIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuedIds({} rows, host {:?}, device {})", self.rows, self.host, self.device.is_some())
    }
}

/// [`Backend::norm_qkv_rope_kv_write`]'s default, on `be`: [`Backend::norm_matmul_many`], then
/// [`Backend::rope_kv_write`] (for backends that fuse the call only sometimes).
#[allow(clippy::too_many_arguments)]
pub fn norm_qkv_then_rope_kv_write<B: Backend + ?Sized>(
    be: &B,
    x: &Tensor,
    norm: &Weight,
    eps: f32,
    ws: &[(&Weight, Option<&Weight>); 3],
    kv: &mut KvCache,
    layer: usize,
    at: &RopeKv,
) -> [Tensor; 3] {
    let [mut q, mut k, v]: [Tensor; 3] =
        be.norm_matmul_many(x, norm, eps, ws).try_into().expect("one result per weight");
    be.rope_kv_write(&mut q, &mut k, &v, kv, layer, at);
    [q, k, v]
}

/// The greedy rule of the engine's sampler (`tf_engine::sampler`: `penalized` without penalties, then its
/// `argmax`) on one row of f32 logits: NaN counts as −∞, and the result is the FIRST index whose value is strictly
/// greater than every earlier one. So ties go to the lower id, `-0.0` and `0.0` are equal (the first of them
/// wins), and a row with no value above −∞ (every value −∞ or NaN) gives 0; an empty row gives 0 too.
/// Equivalently: the lowest id among those holding the row's maximum, NaN read as −∞.
pub fn argmax_row(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        // NaN > x is false, so a NaN never takes the lead: it acts as −∞ (which never does either).
        if v > best_value {
            best = i;
            best_value = v;
        }
    }
    best as u32
}

/// [`argmax_row`] of every row of a row-major `[rows, cols]` host matrix (`cols == 0`: every id 0).
pub fn argmax_rows_of(data: &[f32], rows: usize, cols: usize) -> Vec<u32> {
    assert_eq!(data.len(), rows * cols, "argmax_rows: data length vs {rows}×{cols}");
    if cols == 0 {
        return vec![0; rows];
    }
    data.chunks_exact(cols).map(argmax_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule written another way: the maximum (NaN as −∞), then the first index holding it.
    fn max_then_first(row: &[f32]) -> u32 {
        let read = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
        let max = row.iter().map(|&v| read(v)).fold(f32::NEG_INFINITY, f32::max);
        row.iter().position(|&v| read(v) == max).unwrap_or(0) as u32
    }

    #[test]
    fn argmax_row_known_answers() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let cases: [(&[f32], u32); 14] = [
            (&[], 0),
            (&[7.0], 0),
            (&[0.0, 3.0, 1.0, 3.0], 1),
            (&[5.0, 5.0], 0),
            (&[nan, -1.0, nan], 1),
            (&[nan, nan, nan], 0),
            (&[f32::NEG_INFINITY, f32::NEG_INFINITY], 0),
            (&[nan, f32::NEG_INFINITY, nan], 0),
            (&[-1.0, -0.0, 0.0, -2.0], 1),
            (&[-1.0, 0.0, -0.0], 1),
            (&[1.0, inf, 2.0, inf], 1),
            (&[nan, inf], 1),
            (&[-3.0, -2.0, f32::from_bits(0xffc0_0000), -2.0], 1),
            (&[1.0, 1.0 + f32::EPSILON, 1.0 + f32::EPSILON], 1),
        ];
        for (row, want) in cases {
            assert_eq!(argmax_row(row), want, "{row:?}");
            assert_eq!(max_then_first(row), want, "{row:?} (the other formulation)");
        }
    }

    #[test]
    fn argmax_rows_of_splits_rows() {
        let data = [1.0, 2.0, 2.0, f32::NAN, f32::NAN, f32::NAN, -0.0, 0.0, -1.0];
        assert_eq!(argmax_rows_of(&data, 3, 3), vec![1, 0, 0]);
        assert_eq!(argmax_rows_of(&[], 4, 0), vec![0; 4]);
        assert!(argmax_rows_of(&[], 0, 5).is_empty());
    }
}
