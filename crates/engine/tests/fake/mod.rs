//! A fake model and a minimal backend for engine tests without weights.
//!
//! The fake "KV cache" stores `(token, position)` per slot. `forward` writes every row's pair into its slot,
//! then, for each logit row, reads the row's context `0..ctx` back through the block table, checks each slot
//! holds the expected position, and returns logits that are a hash of the whole token history. So the logits
//! equal [`reference_logits`] of the true prefix exactly when tokens, positions, slots, block tables and context
//! lengths are all right — a plumbing error changes tokens or panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tf_core::{
    mix, AttnMeta, AttnParams, Backend, BackendError, GluAct, KvCache, KvSpec, Precision, Rope, Tensor, TensorInfo,
    Weight,
};
use tf_engine::{
    EngineConfig, EngineError, EngineEvent, EngineHandle, EventSink, Flow, GenOutput, GenRequest, Priority,
};
use tf_models::{Batch, Model};

type Slots = Mutex<Vec<Option<(u32, u32)>>>;

/// The `Backend` methods a test wrapper around a backend in `self.inner` forwards unchanged; the wrapper writes
/// `to_host` and whatever it observes or changes.
#[allow(unused_macros)]
macro_rules! forward_backend_to_inner {
    () => {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn precision(&self) -> tf_core::Precision {
            self.inner.precision()
        }
        fn upload(&self, info: &tf_core::TensorInfo, bytes: &[u8]) -> Result<tf_core::Weight, tf_core::BackendError> {
            self.inner.upload(info, bytes)
        }
        fn upload_f32(
            &self,
            name: &str,
            shape: &[usize],
            values: Vec<f32>,
        ) -> Result<tf_core::Weight, tf_core::BackendError> {
            self.inner.upload_f32(name, shape, values)
        }
        fn embed(&self, table: &tf_core::Weight, ids: &[u32]) -> tf_core::Tensor {
            self.inner.embed(table, ids)
        }
        fn matmul(&self, x: &tf_core::Tensor, w: &tf_core::Weight, bias: Option<&tf_core::Weight>) -> tf_core::Tensor {
            self.inner.matmul(x, w, bias)
        }
        fn rms_norm(&self, x: &tf_core::Tensor, w: &tf_core::Weight, group: usize, eps: f32) -> tf_core::Tensor {
            self.inner.rms_norm(x, w, group, eps)
        }
        fn rope(&self, x: &mut tf_core::Tensor, positions: &[u32], head_dim: usize, rope: &tf_core::Rope) {
            self.inner.rope(x, positions, head_dim, rope)
        }
        fn alloc_kv(&self, spec: tf_core::KvSpec) -> Result<tf_core::KvCache, tf_core::BackendError> {
            self.inner.alloc_kv(spec)
        }
        fn kv_write(
            &self,
            kv: &mut tf_core::KvCache,
            layer: usize,
            k: &tf_core::Tensor,
            v: &tf_core::Tensor,
            slots: &[u32],
        ) {
            self.inner.kv_write(kv, layer, k, v, slots)
        }
        fn kv_copy(&self, kv: &mut tf_core::KvCache, src: &[u32], dst: &[u32]) {
            self.inner.kv_copy(kv, src, dst)
        }
        fn attention(
            &self,
            q: &tf_core::Tensor,
            kv: &tf_core::KvCache,
            layer: usize,
            meta: &tf_core::AttnMeta,
            p: &tf_core::AttnParams,
        ) -> tf_core::Tensor {
            self.inner.attention(q, kv, layer, meta, p)
        }
        fn glu(&self, gate: &tf_core::Tensor, up: &tf_core::Tensor, act: tf_core::GluAct) -> tf_core::Tensor {
            self.inner.glu(gate, up, act)
        }
        fn add(&self, a: &mut tf_core::Tensor, b: &tf_core::Tensor) {
            self.inner.add(a, b)
        }
        fn scale(&self, x: &mut tf_core::Tensor, s: f32) {
            self.inner.scale(x, s)
        }
        fn select_rows(&self, x: &tf_core::Tensor, rows: &[usize]) -> tf_core::Tensor {
            self.inner.select_rows(x, rows)
        }
    };
}

/// Only `alloc_kv` and `to_host` are real; the fake model calls nothing else.
pub struct FakeBackend;

impl Backend for FakeBackend {
    fn describe(&self) -> String {
        "fake".into()
    }
    fn precision(&self) -> Precision {
        Precision::Full
    }
    fn upload(&self, _: &TensorInfo, _: &[u8]) -> Result<Weight, BackendError> {
        unimplemented!("fake backend: upload")
    }
    fn upload_f32(&self, _: &str, _: &[usize], _: Vec<f32>) -> Result<Weight, BackendError> {
        unimplemented!("fake backend: upload_f32")
    }
    fn embed(&self, _: &Weight, _: &[u32]) -> Tensor {
        unimplemented!("fake backend: embed")
    }
    fn matmul(&self, _: &Tensor, _: &Weight, _: Option<&Weight>) -> Tensor {
        unimplemented!("fake backend: matmul")
    }
    fn rms_norm(&self, _: &Tensor, _: &Weight, _: usize, _: f32) -> Tensor {
        unimplemented!("fake backend: rms_norm")
    }
    fn rope(&self, _: &mut Tensor, _: &[u32], _: usize, _: &Rope) {
        unimplemented!("fake backend: rope")
    }
    fn alloc_kv(&self, spec: KvSpec) -> Result<KvCache, BackendError> {
        let slots: Slots = Mutex::new(vec![None; spec.blocks * spec.block_size]);
        Ok(KvCache { spec, storage: Arc::new(slots), states: None })
    }
    fn kv_write(&self, _: &mut KvCache, _: usize, _: &Tensor, _: &Tensor, _: &[u32]) {
        unimplemented!("fake backend: kv_write")
    }
    fn kv_copy(&self, kv: &mut KvCache, src: &[u32], dst: &[u32]) {
        let slots = kv.storage.downcast_ref::<Slots>().expect("fake KV storage");
        let mut slots = slots.lock().unwrap();
        for (&a, &b) in src.iter().zip(dst) {
            slots[b as usize] = slots[a as usize];
        }
    }
    fn attention(&self, _: &Tensor, _: &KvCache, _: usize, _: &AttnMeta, _: &AttnParams) -> Tensor {
        unimplemented!("fake backend: attention")
    }
    fn glu(&self, _: &Tensor, _: &Tensor, _: GluAct) -> Tensor {
        unimplemented!("fake backend: glu")
    }
    fn add(&self, _: &mut Tensor, _: &Tensor) {
        unimplemented!("fake backend: add")
    }
    fn scale(&self, _: &mut Tensor, _: f32) {
        unimplemented!("fake backend: scale")
    }
    fn select_rows(&self, _: &Tensor, _: &[usize]) -> Tensor {
        unimplemented!("fake backend: select_rows")
    }
    fn to_host(&self, x: &Tensor) -> Vec<f32> {
        x.host.clone()
    }
}

/// Logits for the next token after `history`: f32 in [−4, 4), a hash of the whole history.
pub fn reference_logits(history: &[u32], vocab: usize) -> Vec<f32> {
    let h = history.iter().fold(0x1234_5678u64, |h, &t| mix(h ^ u64::from(t)).wrapping_add(1));
    (0..vocab as u64)
        .map(|v| (mix(h ^ v.wrapping_mul(0x9E37)) >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0)
        .collect()
}

/// Serial generation straight from the definition — no KV, no windows, the keyed sampler on
/// [`reference_logits`] of the true history — ending at a stop id (included) or `max_tokens`: what every engine
/// path must reproduce token for token.
pub fn reference_reply(req: &tf_engine::GenRequest, seed: u64, vocab: usize) -> Vec<u32> {
    let mut history = req.prompt.clone();
    let mut reply = Vec::new();
    while reply.len() < req.max_tokens {
        let logits = reference_logits(&history, vocab);
        let t = tf_engine::sample(&logits, &req.params, seed, history.len() as u64, &reply).token;
        reply.push(t);
        history.push(t);
        if req.stop_ids.contains(&t) {
            break;
        }
    }
    reply
}

pub struct FakeModel {
    pub vocab: usize,
    pub context: usize,
    /// Forward calls, rows fed and logit rows returned so far.
    pub forwards: AtomicUsize,
    pub rows: AtomicUsize,
    pub logit_rows: AtomicUsize,
    /// Largest number of rows in one call.
    pub widest: AtomicUsize,
    /// Tree-window rows (rows with their own ancestor list) run in a forward shared by several sequences.
    pub shared_tree_rows: AtomicUsize,
    /// While set, `forward` panics (a device error in the middle of a forward).
    pub fail: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeModel {
    pub fn new(vocab: usize, context: usize) -> FakeModel {
        FakeModel {
            vocab,
            context,
            forwards: AtomicUsize::new(0),
            rows: AtomicUsize::new(0),
            logit_rows: AtomicUsize::new(0),
            widest: AtomicUsize::new(0),
            shared_tree_rows: AtomicUsize::new(0),
            fail: Default::default(),
        }
    }

    pub fn reset_counts(&self) {
        for c in [&self.forwards, &self.rows, &self.logit_rows, &self.widest, &self.shared_tree_rows] {
            c.store(0, Ordering::SeqCst);
        }
    }
}

impl Model for FakeModel {
    fn family(&self) -> &'static str {
        "fake"
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn context_length(&self) -> usize {
        self.context
    }
    fn kv_spec(&self, blocks: usize, block_size: usize) -> KvSpec {
        KvSpec { layers: 1, blocks, block_size, kv_heads: 1, head_dim: 1 }
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0 // no weights
    }
    fn forward(&self, be: &dyn Backend, batch: &Batch, kv: &mut KvCache) -> Tensor {
        let n = batch.tokens.len();
        assert!(!self.fail.load(Ordering::SeqCst), "fake device error: out of memory in the middle of a forward");
        assert!(n > 0 && batch.positions.len() == n && batch.slots.len() == n && batch.attn.rows.len() == n);
        self.forwards.fetch_add(1, Ordering::SeqCst);
        self.rows.fetch_add(n, Ordering::SeqCst);
        self.logit_rows.fetch_add(batch.logit_rows.len(), Ordering::SeqCst);
        self.widest.fetch_max(n, Ordering::SeqCst);
        if batch.attn.block_tables.len() > 1 {
            let tree_rows = batch.attn.rows.iter().filter(|r| !r.tree.is_empty()).count();
            self.shared_tree_rows.fetch_add(tree_rows, Ordering::SeqCst);
        }
        let bs = kv.spec.block_size;
        let slots = kv.storage.downcast_ref::<Slots>().expect("fake KV storage");
        let mut slots = slots.lock().unwrap();
        // Rows fed by an earlier forward's queued argmax read it where the backend keeps it.
        let fed = batch.fed.as_ref().map(|q| be.take_ids(q));
        if let Some(f) = &fed {
            assert_eq!(f.len(), n, "queued ids for every row");
        }
        for r in 0..n {
            let token = fed.as_ref().map_or(batch.tokens[r], |f| f[r]);
            slots[batch.slots[r] as usize] = Some((token, batch.positions[r]));
        }
        let mut out = Vec::with_capacity(batch.logit_rows.len() * self.vocab);
        for &r in &batch.logit_rows {
            let row = &batch.attn.rows[r];
            assert_eq!(row.pos, batch.positions[r], "row {r}: RowAttn.pos");
            let table = &batch.attn.block_tables[row.seq];
            // The committed prefix through the block table, then a tree row's (position, slot) pairs: together
            // exactly positions 0..=pos, in order.
            let mut visits: Vec<(usize, usize)> =
                (0..row.ctx as usize).map(|p| (p, table[p / bs] as usize * bs + p % bs)).collect();
            visits.extend(row.tree.iter().map(|&(p, s)| (p as usize, s as usize)));
            if row.tree.is_empty() {
                assert_eq!(row.ctx, row.pos + 1, "row {r}: causal context");
            } else {
                assert_eq!(row.tree.last().unwrap().0, row.pos, "row {r}: a tree row ends with itself");
            }
            let history: Vec<u32> = visits
                .iter()
                .enumerate()
                .map(|(i, &(p, slot))| {
                    assert_eq!(p, i, "row {r}: visit {i} is position {p}");
                    let (tok, pos) = slots[slot].unwrap_or_else(|| panic!("position {p}: slot {slot} never written"));
                    assert_eq!(pos as usize, p, "slot {slot} holds position {pos}, expected {p}");
                    tok
                })
                .collect();
            out.extend(reference_logits(&history, self.vocab));
        }
        Tensor::host(batch.logit_rows.len(), self.vocab, out)
    }
}

/// A sink that forwards the final output (or error) of a request to a channel.
pub fn collecting(tx: mpsc::Sender<Result<GenOutput, EngineError>>) -> EventSink {
    Box::new(move |ev| {
        match ev {
            EngineEvent::Done(out) => {
                let _ = tx.send(Ok(out));
            }
            EngineEvent::Error(e) => {
                let _ = tx.send(Err(e));
            }
            _ => {}
        }
        Flow::Continue
    })
}

/// Submits `req` with a sink that blocks on its first token until `release` is sent (or `wait` passes); returns
/// once it runs, with the release and the channel of its final event. It holds the engine inside the sink, so
/// tests order events by channels alone.
pub fn gate(
    h: &EngineHandle,
    req: GenRequest,
    wait: Duration,
) -> (mpsc::Sender<()>, mpsc::Receiver<Result<GenOutput, EngineError>>) {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (running_tx, running_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let mut first = true;
    let mut rest = collecting(done_tx);
    let sink: EventSink = Box::new(move |ev| {
        if first && matches!(ev, EngineEvent::Token(_)) {
            first = false;
            let _ = running_tx.send(());
            let _ = release_rx.recv_timeout(wait);
        }
        rest(ev)
    });
    h.submit(req, Priority::Interactive, sink).unwrap();
    running_rx.recv_timeout(wait).expect("the gate request runs");
    (release_tx, done_rx)
}

/// The engine settings the handle tests run the fake model with: 64 blocks of 8, windows of 4, no proposer, the
/// prefix cache on, `parallel` streams of at most 32 rows a round.
pub fn engine_config(max_waiting: usize, parallel: usize) -> EngineConfig {
    EngineConfig {
        kv_blocks: 64,
        block_size: 8,
        max_waiting,
        max_window: 4,
        proposer: None,
        min_drafts: 1,
        prefix_cache: true,
        run_ahead: true,
        token_limit: None,
        parallel,
        max_rows: 32,
    }
}
