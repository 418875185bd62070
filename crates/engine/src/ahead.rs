//! Serial greedy decoding that runs ahead of the host ([`tf_core::Backend::queues_ids`]). Each step's forward is
//! queued before the host has its input token: step `p + 1` is fed the argmax of step `p` where the backend
//! computes ([`tf_core::Backend::embed_queued`]), and the host takes step `p`'s id while step `p + 1` runs, so the
//! device does not sit idle between steps while the id travels to the host and the next step is launched.
//!
//! Every step is the serial step: one row, at the same position, fed the same token (the argmax the host would
//! have drawn, `greedy_on_device`), so the bits and the reply are serial decoding's. The cost: a reply that ends
//! on a stop token, a stop from the caller or a cancel has queued one step too many. That step writes K/V one
//! position past the reply's last fed token, into a slot of the request's own table (reserved up front) that no
//! row reads, and its ids are never taken. A reply that ends at `max_tokens` queues nothing extra.

use crate::draft::{emit, DraftCounts, Drawn};
use crate::generate::{chain_batch, EngineError, FinishReason, Flow, GenRequest, Generator, TokenEvent};
use crate::kv_pool::BlockTable;
use crate::logits::greedy_on_device;
use tf_core::QueuedIds;

impl Generator<'_> {
    /// Whether a decode from `reply` runs ahead: on (the default, [`Generator::set_run_ahead`]), the backend
    /// queues ids, the request is not drafted and every draw is the plain argmax the backend computes.
    pub(crate) fn runs_ahead(&self, req: &GenRequest, reply: &[u32], drafted: bool) -> bool {
        self.run_ahead && self.device_argmax && !drafted && !reply.is_empty() && self.be.queues_ids() && {
            greedy_on_device(req, reply)
        }
    }

    /// Decodes from `tokens` (at least the first token emitted, the reply not finished) to the end of the
    /// reply, running ahead; returns why it ended.
    pub(crate) fn decode_ahead(
        &mut self,
        req: &GenRequest,
        table: &BlockTable,
        tokens: &mut Vec<u32>,
        counts: &mut DraftCounts,
        on_token: &mut dyn FnMut(TokenEvent) -> Flow,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<FinishReason, EngineError> {
        let pending = *tokens.last().expect("a pending token");
        // The step at `p` feeds the reply's last token and gives the next one.
        let mut p = req.prompt.len() + tokens.len() - 1;
        let mut queued = self.queue_step(table, p, pending, None)?;
        loop {
            // Once emitted, `queued`'s id makes tokens.len() + 1 tokens: a further step runs only if the reply can
            // go on (a stop token or a cancel is known only then).
            let next = if tokens.len() + 1 < req.max_tokens && !cancelled() {
                Some(self.queue_step(table, p + 1, 0, Some(&queued))?)
            } else {
                None
            };
            let ids = self.be.take_ids(&queued);
            let vocab = self.model.vocab_size();
            if ids.len() != 1 || ids[0] as usize >= vocab {
                return Err(EngineError::Model(format!(
                    "the backend's queued argmax gave {ids:?} for 1 row of {vocab}"
                )));
            }
            counts.rounds += 1;
            counts.min_rows = 1;
            let d = Drawn { token: ids[0], logprob: None, top: Vec::new() };
            if let Some(end) = emit(req, tokens, d, on_token, cancelled) {
                return Ok(end);
            }
            p += 1;
            queued = match next {
                Some(q) => q,
                // Not queued because a cancel was seen, which emit() then reports; kept for a flag that clears.
                None => self.queue_step(table, p, ids[0], None)?,
            };
        }
    }

    /// Queues the one-row forward at position `p` fed `token`, or the queued id `fed` (then `token` is a
    /// placeholder), and its argmax.
    fn queue_step(
        &mut self,
        table: &BlockTable,
        p: usize,
        token: u32,
        fed: Option<&QueuedIds>,
    ) -> Result<QueuedIds, EngineError> {
        let mut batch = chain_batch(table, &[token], p, vec![0]);
        batch.fed = fed.cloned();
        let out = self.model.forward(self.be, &batch, &mut self.kv);
        let vocab = self.model.vocab_size();
        if out.rows != 1 || out.cols != vocab {
            return Err(EngineError::Model(format!("logits are {}×{}, expected 1×{vocab}", out.rows, out.cols)));
        }
        Ok(self.be.argmax_rows_queued(&out))
    }
}
