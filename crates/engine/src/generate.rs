//! The request and reply types, and [`Generator`]: one model on one backend over a paged KV cache, with the
//! checks, block reservations and forwards that the engine loop (`core.rs`, `round.rs`) runs requests with.
//!
//! The sampling position of a token is its absolute position, i.e. its index in `prompt + generated`; the
//! logits for position `p` come from the row at position `p − 1`. Every row is row-exact (DESIGN.md §2), so any
//! `prefill_chunk` gives the same logits bits and therefore the same tokens.

use crate::draft::{DraftConfig, DraftCounts};
use crate::kv_pool::{BlockRef, BlockTable, KvPool, PoolError};
use crate::logits::{fetch, Logits};
use crate::prefix_cache::PrefixCache;
use crate::sampler::{SamplingError, SamplingParams};
use crate::seq::Sequence;
use crate::state::StateMap;
use sha2::{Digest, Sha256};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tf_core::{
    derive_seed, AttnMeta, Backend, BackendError, ConstraintSpec, KvCache, RowAttn, Tensor, DEFAULT_SEED_SALT,
};
use tf_models::{Batch, Model};

/// One generation request.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Most tokens to generate (≥ 1); `prompt.len() + max_tokens` must fit the model's context.
    pub max_tokens: usize,
    /// Token ids that end the reply (EOS/EOT); the one that ends it is part of the output.
    pub stop_ids: Vec<u32>,
    /// Prompt rows per forward call (≥ 1). Any value gives the same bits.
    pub prefill_chunk: usize,
    /// Salt of the prompt-derived seed when `params.seed` is `None` (published default: `"0"`).
    pub seed_salt: String,
    /// Alternatives to report with every generated token (0 = none); see [`TokenEvent::top`].
    pub top_logprobs: usize,
    /// `Some(k)`: score the prompt too — [`GenOutput::prompt_logprobs`] gets ln P of every prompt token after
    /// the first, with `k` alternatives. Allows `max_tokens == 0` (score only).
    pub prompt_logprobs: Option<usize>,
    /// Set from anywhere to end the request at the next row boundary (finish reason `Cancelled`).
    pub cancel: Option<Arc<AtomicBool>>,
    /// Draft when the generator is set up to (`false`: one row per round, the serial reference).
    pub draft: bool,
    /// Report each generated token's logprob ([`TokenEvent::logprob`]). Off spares an `exp` per vocabulary entry
    /// per token (over a millisecond on a 152k vocabulary); the tokens are the same either way.
    pub logprobs: bool,
    /// A grammar the reply must follow (DESIGN.md §8): each drawn token comes from the ids its matcher allows
    /// after the sequence's own tokens.
    pub constraint: Option<Arc<dyn ConstraintSpec>>,
}

impl GenRequest {
    pub fn new(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize) -> GenRequest {
        GenRequest {
            prompt,
            params,
            max_tokens,
            stop_ids: Vec::new(),
            prefill_chunk: 64,
            seed_salt: DEFAULT_SEED_SALT.to_string(),
            top_logprobs: 0,
            prompt_logprobs: None,
            cancel: None,
            draft: true,
            logprobs: true,
            constraint: None,
        }
    }
}

/// What the token callback says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// End the reply after this token (finish reason `Cancelled`); the CLI uses it for stop strings.
    Stop,
}

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop id was generated (it is the last output token).
    Stop,
    /// `max_tokens` tokens were generated.
    Length,
    /// The callback returned [`Flow::Stop`], or the request's cancel flag was set.
    Cancelled,
}

/// ln P of one token, with the likeliest alternatives (temperature 1, after penalties).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f64,
    /// `(id, ln P)` likeliest first; as many as the request asked for.
    pub top: Vec<(u32, f64)>,
}

/// One generated token, as it is produced.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// Index in the reply (0 = first generated token).
    pub index: usize,
    /// Absolute position (= prompt length + index); the sampling key's position.
    pub position: usize,
    /// ln P(token) at temperature 1 after penalties (see [`crate::Draw::logprob`]); `None` unless the request
    /// asked for logprobs ([`GenRequest::logprobs`]).
    pub logprob: Option<f64>,
    /// Whether the token is one of the request's stop ids (it ends the reply).
    pub is_stop: bool,
    /// The request's `top_logprobs` likeliest tokens of this row, `(id, ln P)`, likeliest first.
    pub top: Vec<(u32, f64)>,
}

/// A finished reply.
#[derive(Clone, Debug, PartialEq)]
pub struct GenOutput {
    /// Generated ids, including the stop id that ended the reply.
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// [`token_sha`] of `tokens`.
    pub token_sha: String,
    /// Seconds filling the prompt, and decoding (first sample to the end).
    pub prefill_s: f64,
    pub decode_s: f64,
    pub prompt_tokens: usize,
    /// The seed the draws were keyed on (the request's, or the prompt-derived one).
    pub seed: u64,
    /// With `prompt_logprobs`: one entry per prompt token, `None` for the first (nothing predicts it).
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// Rounds, drafted and accepted tokens, narrowest window.
    pub counts: DraftCounts,
    /// Prompt tokens whose K/V came from the prefix cache (not filled again).
    pub cached_tokens: usize,
}

/// Why a request was refused or failed. Everything but `Backend` and `Model` is detected before any work.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineError {
    /// A malformed request (empty prompt, `max_tokens` 0, an id outside the vocabulary, ...).
    InvalidRequest(String),
    Sampling(SamplingError),
    /// Prompt + max_tokens beyond the model's context.
    ContextOverflow {
        prompt_tokens: usize,
        max_tokens: usize,
        context_length: usize,
    },
    /// The KV pool cannot hold the request.
    Pool(PoolError),
    Backend(BackendError),
    /// The model broke its contract (e.g. logits of the wrong shape).
    Model(String),
    /// Cancelled before it started (while waiting in the queue).
    Cancelled,
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::InvalidRequest(m) => write!(f, "invalid request: {m}"),
            EngineError::Sampling(e) => write!(f, "{e}"),
            EngineError::ContextOverflow { prompt_tokens, max_tokens, context_length } => write!(
                f,
                "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the model's context \
                 of {context_length} tokens"
            ),
            EngineError::Pool(e) => write!(f, "{e}"),
            EngineError::Backend(e) => write!(f, "backend: {e}"),
            EngineError::Model(m) => write!(f, "model: {m}"),
            EngineError::Cancelled => write!(f, "the request was cancelled"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<SamplingError> for EngineError {
    fn from(e: SamplingError) -> Self {
        EngineError::Sampling(e)
    }
}

impl From<PoolError> for EngineError {
    fn from(e: PoolError) -> Self {
        EngineError::Pool(e)
    }
}

impl From<BackendError> for EngineError {
    fn from(e: BackendError) -> Self {
        EngineError::Backend(e)
    }
}

/// First 12 hex chars of SHA-256 over the ids in decimal joined by `,` (DESIGN.md §4).
pub fn token_sha(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            h.update(b",");
        }
        h.update(id.to_string().as_bytes());
    }
    h.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// One model on one backend over a paged KV cache: what every round of the engine loop runs on.
pub struct Generator<'a> {
    pub(crate) be: &'a dyn Backend,
    pub(crate) model: &'a dyn Model,
    pub(crate) kv: KvCache,
    pub(crate) pool: KvPool,
    /// Drafting settings; `None`: every request decodes serially.
    pub(crate) drafting: Option<DraftConfig>,
    /// Full blocks kept after their request for later requests that start the same way; `None`: off.
    pub(crate) cache: Option<PrefixCache>,
    /// Greedy rows take their token from [`Backend::argmax_rows`] instead of downloaded logits (`logits.rs`).
    pub(crate) device_argmax: bool,
    /// Serial greedy decoding queues each step before the host has its token (`ahead.rs`) on a backend that
    /// queues ids.
    pub(crate) run_ahead: bool,
    /// The round queued ahead of the host whose ids are not taken yet (`ahead.rs`).
    pub(crate) in_flight: Option<crate::ahead::InFlight>,
    /// The last key given to a sequence ([`crate::Sequence`] identity across rounds).
    pub(crate) next_key: u64,
    /// With a head wider than the tokenizer's vocabulary (padding rows): the mask of the ids a draw may take
    /// (`Generator::set_token_limit`).
    pub(crate) limit_mask: Option<Vec<u32>>,
    /// A hybrid model's recurrent states: which register holds the state after which KV slot (`state.rs`).
    pub(crate) states: Option<StateMap>,
}

/// Tokens between the recurrent-state snapshots a hybrid model keeps for the prefix cache, by default: 256
/// rounded up to whole blocks.
pub fn default_snapshot_every(block_size: usize) -> usize {
    256usize.div_ceil(block_size) * block_size
}

/// Gives a KV cache the recurrent-state registers a hybrid model needs ([`Model::state_spec`]; nothing for
/// other models): one per snapshot position of the pool, and room for the states of running sequences and their
/// windows.
pub fn alloc_states(be: &dyn Backend, model: &dyn Model, kv: &mut KvCache) -> Result<(), EngineError> {
    let Some(spec) = model.state_spec() else { return Ok(()) };
    let registers = default_state_registers(kv.spec.blocks, kv.spec.block_size);
    kv.states = Some(be.alloc_states(spec.with_registers(registers))?);
    Ok(())
}

/// The state registers [`alloc_states`] gives a pool of `blocks` blocks: one per default snapshot position, and
/// room for running sequences' states and windows.
pub fn default_state_registers(blocks: usize, block_size: usize) -> usize {
    blocks * block_size / default_snapshot_every(block_size) + (4 * blocks).min(512) + 16
}

impl<'a> Generator<'a> {
    /// Allocates a KV cache of `blocks` blocks of `block_size` slots on `be`.
    pub fn new(
        be: &'a dyn Backend,
        model: &'a dyn Model,
        blocks: usize,
        block_size: usize,
    ) -> Result<Generator<'a>, EngineError> {
        let mut kv = be.alloc_kv(model.kv_spec(blocks, block_size))?;
        alloc_states(be, model, &mut kv)?;
        Ok(Generator::with_kv(be, model, kv))
    }

    /// Uses an allocated KV cache (with its state registers for a hybrid model: [`alloc_states`]); the pool
    /// follows its spec.
    pub fn with_kv(be: &'a dyn Backend, model: &'a dyn Model, kv: KvCache) -> Generator<'a> {
        let pool = KvPool::new(kv.spec.blocks, kv.spec.block_size);
        let bs = kv.spec.block_size;
        let states = kv.states.as_ref().map(|st| StateMap::new(st.spec.registers, bs, default_snapshot_every(bs)));
        assert!(
            states.is_some() || model.state_spec().is_none(),
            "a hybrid model's KV cache needs its state registers (alloc_states)"
        );
        Generator {
            states,
            be,
            model,
            kv,
            pool,
            drafting: None,
            cache: None,
            device_argmax: true,
            run_ahead: true,
            in_flight: None,
            next_key: 0,
            limit_mask: None,
        }
    }

    /// Turns the automatic prefix cache on or off (off drops every cached block).
    pub fn set_prefix_cache(&mut self, on: bool) {
        self.cache = on.then(|| {
            let fingerprint = format!(
                "{}/{}/{}/{}",
                self.model.family(),
                self.model.vocab_size(),
                self.be.describe(),
                self.be.precision().name()
            );
            PrefixCache::new(&self.pool, &fingerprint)
        });
    }

    /// Lets forwards whose every logits row is a plain greedy draw ([`crate::greedy_on_device`]) fetch only each
    /// row's token ([`Backend::argmax_rows`]) instead of downloading the logits: on by default. Off, every row is
    /// downloaded and drawn on the host (the same tokens; tests compare the two).
    pub fn set_device_argmax(&mut self, on: bool) {
        self.device_argmax = on;
    }

    /// Lets serial greedy decodes on a backend that queues ids ([`Backend::queues_ids`]) run ahead: each step is
    /// queued, fed the previous step's argmax on the device, before the host takes that argmax (`ahead.rs`). On by
    /// default; the same tokens either way (tests compare the two). Needs [`Generator::set_device_argmax`] on.
    pub fn set_run_ahead(&mut self, on: bool) {
        self.run_ahead = on;
    }

    /// Draws only ids below `n` (the tokenizer's vocabulary) when the model's head is wider: its padding rows
    /// are masked like a grammar's disallowed ids (every draw downloads its row then).
    pub fn set_token_limit(&mut self, n: usize) {
        let vocab = self.model.vocab_size();
        self.limit_mask = (n < vocab).then(|| {
            let mut mask = vec![0u32; vocab.div_ceil(32)];
            for t in 0..n.max(1) {
                mask[t / 32] |= 1 << (t % 32);
            }
            mask
        });
        if self.limit_mask.is_some() {
            self.device_argmax = false;
        }
    }

    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }

    /// Keeps a hybrid model's recurrent state every `tokens` positions (a multiple of the block size) for the
    /// prefix cache, which resumes only where a state is kept. No effect on other models.
    pub fn set_state_snapshots(&mut self, tokens: usize) {
        if let Some(m) = self.states.as_mut() {
            let bs = self.pool.block_size();
            assert!(tokens > 0 && tokens.is_multiple_of(bs), "snapshots every {tokens} tokens, blocks of {bs}");
            *m = StateMap::new(m.free_registers(), bs, tokens);
        }
    }

    /// Turns drafting on (requests with `draft: true` use it) or off.
    pub fn set_drafting(&mut self, config: Option<DraftConfig>) {
        self.drafting = config;
    }

    pub fn drafting(&self) -> Option<&DraftConfig> {
        self.drafting.as_ref()
    }

    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Checks everything that can be checked before any work; returns the seed.
    pub(crate) fn admit(&self, req: &GenRequest) -> Result<u64, EngineError> {
        let invalid = |m: String| Err(EngineError::InvalidRequest(m));
        if req.prompt.is_empty() {
            return invalid("the prompt is empty".into());
        }
        if req.max_tokens == 0 && req.prompt_logprobs.is_none() {
            return invalid("max_tokens must be at least 1".into());
        }
        if req.prefill_chunk == 0 {
            return invalid("prefill_chunk must be at least 1".into());
        }
        req.params.validate()?;
        let vocab = self.model.vocab_size();
        if let Some((i, id)) = req.prompt.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return invalid(format!("prompt token {i} is id {id}, outside the vocabulary of {vocab}"));
        }
        let context_length = self.model.context_length();
        let total = req.prompt.len().saturating_add(req.max_tokens);
        if total > context_length {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: req.prompt.len(),
                max_tokens: req.max_tokens,
                context_length,
            });
        }
        // KV is written for every token fed: the prompt and generated tokens, and a window's drafts may reach one
        // slot past the last token that will be generated. Cached blocks nobody uses count as free.
        if total > self.pool.capacity_tokens() {
            return Err(PoolError::TooLarge { tokens: total, capacity_tokens: self.pool.capacity_tokens() }.into());
        }
        if self.cache.is_none() {
            self.pool.check_fits(total)?;
        }
        Ok(req.params.seed.unwrap_or_else(|| derive_seed(&req.prompt, &req.seed_salt)))
    }

    /// A request's blocks: cached prefix blocks first (leaving the prompt's last token to feed, for its logits;
    /// none when the prompt is scored), then every other block it can need, up front (freed when the table
    /// drops), evicting idle cached blocks for room: a request cannot run out half-way. Returns the table and
    /// the prompt tokens it got from the cache.
    pub(crate) fn reserve(&mut self, req: &GenRequest) -> Result<(BlockTable, usize), EngineError> {
        let total = req.prompt.len() + req.max_tokens;
        self.reserve_seq(&req.prompt, total, req.prompt_logprobs.is_none())
    }

    /// The blocks of a sequence whose first `seq.len()` tokens are to be filled and that may reach `total`
    /// positions: the cached prefix of `seq` (when `use_cache`; its last token is always left to feed), then
    /// fresh blocks for the rest, evicting idle cached blocks for room. Returns the table and the cached tokens.
    pub(crate) fn reserve_seq(
        &mut self,
        seq: &[u32],
        total: usize,
        use_cache: bool,
    ) -> Result<(BlockTable, usize), EngineError> {
        let mut table = BlockTable::new(&self.pool);
        let mut cached_tokens = 0;
        if let Some(cache) = self.cache.as_mut() {
            if use_cache {
                let mut hit = cache.lookup(seq, seq.len() - 1);
                // A hybrid model continues only from a position whose recurrent state is kept.
                if let Some(m) = self.states.as_ref() {
                    let ids: Vec<u32> = hit.iter().map(BlockRef::id).collect();
                    hit.truncate(m.usable_blocks(&ids));
                }
                cached_tokens = hit.len() * self.pool.block_size();
                table.adopt(hit);
            }
            let need = self.pool.blocks_for(total).saturating_sub(table.len());
            let free = self.pool.free_blocks();
            if need > free {
                cache.evict(&self.pool, need - free);
            }
        }
        table.ensure(&self.pool, total)?;
        Ok((table, cached_tokens))
    }

    /// One forward over `tokens` at positions `start..`, all causal rows of sequence 0; returns the logits of
    /// `logit_rows` (indices into `tokens`), in that order: only each row's argmax when `argmax` (the caller
    /// checked [`greedy_on_device`] for every row) and the generator allows it, else every value.
    pub(crate) fn forward(
        &mut self,
        table: &BlockTable,
        tokens: &[u32],
        start: usize,
        logit_rows: Vec<usize>,
        argmax: bool,
    ) -> Result<Logits, EngineError> {
        self.forward_batch(&chain_batch(table, tokens, start, logit_rows), argmax)
    }

    /// One forward of `batch`; returns the logits of its `logit_rows` as [`Generator::forward`] does.
    pub(crate) fn forward_batch(&mut self, batch: &Batch, argmax: bool) -> Result<Logits, EngineError> {
        let want = batch.logit_rows.len();
        let out = self.run_model(&mut batch.clone(), &[])?;
        let vocab = self.model.vocab_size();
        if want == 0 {
            return Ok(Logits::Values { data: Vec::new(), vocab });
        }
        fetch(self.be, &out, want, vocab, argmax && self.device_argmax)
    }
}

impl Generator<'_> {
    /// The model's forward of `batch`, with its rows' recurrent states assigned and recorded for a hybrid model;
    /// `window_rows[r]` (empty: none) marks the rows of verify windows, which keep their states.
    pub(crate) fn run_model(&mut self, batch: &mut Batch, window_rows: &[bool]) -> Result<Tensor, EngineError> {
        if let Some(m) = self.states.as_mut() {
            m.assign(batch, window_rows)?;
        }
        let out = self.model.forward(self.be, batch, &mut self.kv);
        if let Some(m) = self.states.as_mut() {
            m.commit(batch);
        }
        Ok(out)
    }

    /// A sequence's latest recurrent state after a round moved it to position `pos` (`None`: nothing fed, or it
    /// ended): the new slot is pinned and the old one released unless it is a snapshot; `others` (the slots and
    /// positions of the round's other rows of this sequence) are released unless snapshots.
    pub(crate) fn settle_state(&mut self, s: &mut Sequence<'_>, pos: Option<usize>, others: &[(u32, usize)]) {
        let Some(m) = self.states.as_mut() else { return };
        let new = pos.map(|p| (s.table.slot(p), p));
        if s.state_at != new {
            if let Some((slot, p)) = s.state_at {
                m.unpin(slot);
                m.release_unless_snapshot(slot, p);
            }
            if let Some((slot, _)) = new {
                m.pin(slot);
            }
            s.state_at = new;
        }
        for &(slot, p) in others {
            if Some(slot) != new.map(|n| n.0) {
                m.release_unless_snapshot(slot, p);
            }
        }
    }
}

/// A batch of `tokens` as consecutive rows of sequence 0 from position `start` (KV slots from `table`), each
/// attending to everything before it; logits wanted for `logit_rows`.
pub(crate) fn chain_batch(table: &BlockTable, tokens: &[u32], start: usize, logit_rows: Vec<usize>) -> Batch {
    let positions: Vec<u32> = (start..start + tokens.len()).map(|p| p as u32).collect();
    let slots = (start..start + tokens.len()).map(|p| table.slot(p)).collect();
    let rows = positions.iter().map(|&pos| RowAttn { pos, seq: 0, ctx: pos + 1, tree: Vec::new() }).collect();
    Batch {
        tokens: tokens.to_vec(),
        slots,
        attn: AttnMeta { block_tables: vec![table.ids()], rows },
        positions,
        logit_rows,
        fed: None,
        states: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Python: hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()[:12]
    //   [] e3b0c44298fc / [1, 2, 3] 8a6ae1512200 / [9707, 11, 1879, 2] 386b554eb8f6
    #[test]
    fn token_sha_known_answers() {
        assert_eq!(token_sha(&[]), "e3b0c44298fc");
        assert_eq!(token_sha(&[1, 2, 3]), "8a6ae1512200");
        assert_eq!(token_sha(&[9707, 11, 1879, 2]), "386b554eb8f6");
    }
}
