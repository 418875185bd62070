//! The `model` proposer: a smaller model sharing the target's vocabulary drafts with its own KV cache, drawing
//! with the target's keyed noise (same seed, position and id key, same penalties over the reply), so sampled
//! requests accept as often as greedy ones when the two models agree. Its KV follows the target's: before each
//! proposal it keeps the longest prefix it already fed that the context still starts with, and feeds the rest.

use crate::generate::{EngineError, GenRequest};
use crate::kv_pool::{BlockTable, KvPool};
use crate::logits::{draw_is_argmax, fetch, Logits, Row};
use crate::sampler::{sample_token, SamplingParams};
use crate::spec::{DraftTree, NgramProposer, Proposer};
use std::sync::{Arc, Mutex};
use tf_core::{derive_seed, AttnMeta, Backend, KvCache, RowAttn};
use tf_models::{Batch, Model};

/// The draft model with its KV cache; one stream drafts at a time (the engine thread).
pub struct DraftModel {
    be: Arc<dyn Backend>,
    model: Box<dyn Model>,
    kv: KvCache,
    pool: KvPool,
    /// The one sequence's blocks (grown on demand).
    table: BlockTable,
    /// Tokens whose K/V sit in the cache at positions `0..fed.len()`.
    fed: Vec<u32>,
    /// Greedy draws without penalties take their token from [`Backend::argmax_rows`] (as the target's do).
    device_argmax: bool,
}

impl DraftModel {
    /// Allocates a KV cache for `context` tokens (plus a window) on `be`.
    pub fn new(
        be: Arc<dyn Backend>,
        model: Box<dyn Model>,
        context: usize,
        block_size: usize,
    ) -> Result<DraftModel, EngineError> {
        if model.state_spec().is_some() {
            return Err(EngineError::Model(format!(
                "a {} model with recurrent layers cannot be the draft model yet",
                model.family()
            )));
        }
        let blocks = (context + 64).div_ceil(block_size);
        let kv = be.alloc_kv(model.kv_spec(blocks, block_size))?;
        let pool = KvPool::new(blocks, block_size);
        let table = BlockTable::new(&pool);
        Ok(DraftModel { be, model, kv, pool, table, fed: Vec::new(), device_argmax: true })
    }

    pub fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    /// Lets draws that are a plain argmax fetch only the token ([`Backend::argmax_rows`]) instead of the logits:
    /// on by default; off downloads every row (the same drafts).
    pub fn set_device_argmax(&mut self, on: bool) {
        self.device_argmax = on;
    }

    /// Feeds `tokens` at positions `start..` and returns the last row's logits (its argmax alone with `argmax`).
    fn feed(&mut self, tokens: &[u32], start: usize, argmax: bool) -> Result<Logits, EngineError> {
        self.table.ensure(&self.pool, start + tokens.len())?;
        let positions: Vec<u32> = (start..start + tokens.len()).map(|p| p as u32).collect();
        let batch = Batch {
            tokens: tokens.to_vec(),
            slots: (start..start + tokens.len()).map(|p| self.table.slot(p)).collect(),
            attn: AttnMeta {
                block_tables: vec![self.table.ids()],
                rows: positions.iter().map(|&pos| RowAttn { pos, seq: 0, ctx: pos + 1, tree: Vec::new() }).collect(),
            },
            positions,
            logit_rows: vec![tokens.len() - 1],
            fed: None,
            states: Vec::new(),
        };
        let out = self.model.forward(self.be.as_ref(), &batch, &mut self.kv);
        let logits = fetch(self.be.as_ref(), &out, 1, self.model.vocab_size(), argmax && self.device_argmax)
            .map_err(|e| EngineError::Model(format!("draft model: {e}")))?;
        self.fed.truncate(start);
        self.fed.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Feeds what of `context` its cache does not hold yet, so the next proposal (context plus the pending token)
    /// feeds one row.
    fn prefill(&mut self, context: &[u32]) -> Result<(), EngineError> {
        if context.is_empty() || context.len() >= self.pool.capacity_tokens() {
            return Ok(());
        }
        let common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count();
        if common < context.len() {
            self.feed(&context[common..], common, true)?;
        }
        Ok(())
    }

    /// Drafts `k` tokens after `context` (pending token last) with the request's keyed draw.
    fn draft(
        &mut self,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
        seed: u64,
        prompt_len: usize,
    ) -> Result<Vec<u32>, EngineError> {
        if context.is_empty() || k == 0 || context.len() + k > self.pool.capacity_tokens() {
            return Ok(Vec::new());
        }
        let common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
        let mut reply: Vec<u32> = context[prompt_len.min(context.len())..].to_vec();
        let mut logits = self.feed(&context[common..], common, draw_is_argmax(params, &reply))?;
        let mut chain = Vec::with_capacity(k);
        for i in 0..k {
            let position = context.len() + i;
            let t = match logits.row(0) {
                Row::Argmax(t) => t,
                Row::Values(l) => sample_token(l, params, seed, position as u64, &reply),
            };
            chain.push(t);
            reply.push(t);
            if i + 1 < k {
                logits = self.feed(&[t], position, draw_is_argmax(params, &reply))?;
            }
        }
        Ok(chain)
    }
}

/// Drafts for one request: context copies when they have a guess, the draft model otherwise.
pub struct ModelProposer {
    model: Arc<Mutex<DraftModel>>,
    ngram: Option<NgramProposer>,
    params: SamplingParams,
    seed: u64,
    prompt_len: usize,
    /// The draft model failed once (e.g. out of its KV): stop asking it for this request.
    broken: bool,
    /// Whether the last proposal came from context copies (only they learn from its outcome).
    last_from_copies: bool,
}

impl ModelProposer {
    /// The proposer for `req`; `with_copies` also tries context copies first.
    pub fn new(model: Arc<Mutex<DraftModel>>, req: &GenRequest, with_copies: bool) -> ModelProposer {
        let seed = req.params.seed.unwrap_or_else(|| derive_seed(&req.prompt, &req.seed_salt));
        ModelProposer {
            model,
            ngram: with_copies
                .then(|| NgramProposer::new(crate::spec::NgramConfig { max_candidates: 1, ..Default::default() })),
            params: req.params.clone(),
            seed,
            prompt_len: req.prompt.len(),
            broken: false,
            last_from_copies: false,
        }
    }
}

impl Proposer for ModelProposer {
    fn name(&self) -> &'static str {
        "model"
    }

    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree {
        if let Some(ng) = self.ngram.as_mut() {
            let t = ng.propose(context, max_tokens);
            if t.len() >= max_tokens.min(2) && !t.is_empty() {
                self.last_from_copies = true;
                return t;
            }
        }
        self.last_from_copies = false;
        if self.broken {
            return DraftTree::new();
        }
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        match m.draft(context, max_tokens, &self.params, self.seed, self.prompt_len) {
            Ok(chain) => DraftTree::from_chain(&chain),
            Err(_) => {
                self.broken = true;
                DraftTree::new()
            }
        }
    }

    /// Context copies, when they have a match, under their classes (by match length, 1 and up: matches are at
    /// least 2 tokens); otherwise the draft model, class 0. A match whose class is not worth drafting gives no
    /// draft this round (that class relaxes and is probed again later) rather than a model draft.
    fn propose_by_class(
        &mut self,
        context: &[u32],
        width: &mut dyn FnMut(usize) -> usize,
    ) -> (DraftTree, Option<usize>) {
        if let Some(ng) = self.ngram.as_mut() {
            let (t, class) = ng.propose_by_class(context, &mut |c| width(c.max(1)));
            if let Some(c) = class {
                self.last_from_copies = true;
                return (t, Some(c.max(1)));
            }
        }
        self.last_from_copies = false;
        if self.broken {
            return (DraftTree::new(), None);
        }
        let k = width(0);
        if k == 0 {
            return (DraftTree::new(), Some(0));
        }
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        match m.draft(context, k, &self.params, self.seed, self.prompt_len) {
            Ok(chain) => (DraftTree::from_chain(&chain), Some(0)),
            Err(_) => {
                self.broken = true;
                (DraftTree::new(), None)
            }
        }
    }

    fn observe(&mut self, proposed: usize, accepted: usize) {
        if let Some(ng) = self.ngram.as_mut().filter(|_| self.last_from_copies) {
            ng.observe(proposed, accepted);
        }
    }

    fn reset(&mut self) {
        if let Some(ng) = self.ngram.as_mut() {
            ng.reset();
        }
    }

    fn prepare(&mut self, context: &[u32]) {
        if self.broken {
            return;
        }
        let mut m = self.model.lock().unwrap_or_else(|p| p.into_inner());
        if m.prefill(context).is_err() {
            self.broken = true;
        }
    }
}

/// A proposer factory over a shared draft model.
pub fn model_proposer_factory(model: Arc<Mutex<DraftModel>>, with_copies: bool) -> crate::ProposerFactory {
    Arc::new(move |req: &GenRequest| Box::new(ModelProposer::new(model.clone(), req, with_copies)) as Box<dyn Proposer>)
}
