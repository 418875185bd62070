//! Rounds of greedy one-row steps that run ahead of the host ([`tf_core::Backend::queues_ids`]). When every row
//! of a round is a plain greedy step of a sequence with no drafts and no grammar, the round's forward is queued
//! before the host has its input tokens: round `r + 1` is fed the argmaxes of round `r` where the backend
//! computes ([`tf_core::Backend::embed_queued`]), and the host takes round `r`'s ids while round `r + 1` runs, so
//! the device does not sit idle between steps while the ids travel to the host and the next step is launched.
//!
//! Every step is the serial step: one row per sequence, at the same position, fed the same token (the argmax the
//! host would have drawn, `greedy_on_device`), so the bits and the replies are serial decoding's. The cost: a
//! sequence that ends on a stop token, a stop from the caller or a cancel has queued one step too many. That step
//! writes K/V one position past the reply's last fed token, into a slot of the sequence's own table (reserved up
//! front) that no row reads, and its id is never taken. A reply that ends at `max_tokens` queues nothing extra.

use crate::generate::{EngineError, Generator};
use crate::logits::greedy_on_device;
use crate::round::{push_window, Grant};
use crate::seq::Sequence;
use crate::spec::DraftTree;
use tf_core::{AttnMeta, QueuedIds};
use tf_models::Batch;

/// A round queued on the backend whose ids the host has not taken: the sequences of its rows, in row order.
pub(crate) struct InFlight {
    keys: Vec<u64>,
    ids: QueuedIds,
}

impl Generator<'_> {
    /// Runs the round ahead when it qualifies; `None` when it must run as an ordinary round (after any round in
    /// flight has landed).
    pub(crate) fn run_ahead_round(
        &mut self,
        seqs: &mut [Sequence<'_>],
        grants: &[(usize, Grant)],
    ) -> Result<Option<usize>, EngineError> {
        let order: Vec<usize> = grants.iter().map(|&(i, _)| i).collect();
        let qualifies = self.run_ahead
            && self.states.is_none()
            && self.device_argmax
            && self.be.queues_ids()
            && !order.is_empty()
            && grants.iter().all(|&(i, g)| {
                let s = &seqs[i];
                matches!(g, Grant::Window { .. })
                    && (s.is_decoding() || s.in_flight)
                    && s.proposer.is_none()
                    && s.constraint.is_none()
                    && greedy_on_device(&s.req, &s.tokens)
            });
        if !qualifies {
            self.land(seqs)?;
            return Ok(None);
        }
        let keys: Vec<u64> = order.iter().map(|&i| seqs[i].key).collect();
        let fed = match self.in_flight.take() {
            // Each sequence continues from its queued token if, once that token is emitted, the reply can go on.
            Some(f) if f.keys == keys => {
                let go_on = order.iter().all(|&i| {
                    let s = &seqs[i];
                    !s.is_done() && s.tokens.len() + 1 < s.req.max_tokens && !s.cancelled()
                });
                if go_on {
                    Some(f)
                } else {
                    self.in_flight = Some(f);
                    self.land(seqs)?;
                    return Ok(None);
                }
            }
            other => {
                self.in_flight = other;
                self.land(seqs)?;
                if order.iter().any(|&i| !seqs[i].is_decoding()) {
                    return Ok(None);
                }
                None
            }
        };
        // Row j: sequence order[j] at the position of its next token to feed (its in-flight one, or its pending
        // one).
        let mut batch = Batch {
            tokens: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            attn: AttnMeta { block_tables: Vec::new(), rows: Vec::new() },
            logit_rows: Vec::new(),
            fed: fed.as_ref().map(|f| f.ids.clone()),
            states: Vec::new(),
        };
        let none = DraftTree::new();
        for (seq, &i) in order.iter().enumerate() {
            let s = &seqs[i];
            batch.attn.block_tables.push(s.table.ids());
            let (p, token) = match fed {
                Some(_) => (s.fill_target(), 0),
                None => (s.fill_target() - 1, *s.tokens.last().expect("decoding")),
            };
            push_window(&mut batch, seq, &s.table, None, &none, token, p);
        }
        let vocab = self.model.vocab_size();
        let out = self.model.forward(self.be, &batch, &mut self.kv);
        if out.rows != order.len() || out.cols != vocab {
            return Err(EngineError::Model(format!(
                "logits are {}×{}, expected {}×{vocab}",
                out.rows,
                out.cols,
                order.len()
            )));
        }
        let queued = self.be.argmax_rows_queued(&out);
        if let Some(f) = fed {
            self.in_flight = Some(f);
            self.land(seqs)?;
        }
        // A sequence that ended on the landed token has queued one step too many: its id is never taken (nor is
        // the round's, when every sequence in it ended).
        let mut live = false;
        for &i in &order {
            seqs[i].in_flight = !seqs[i].is_done();
            live |= seqs[i].in_flight;
        }
        if live {
            self.in_flight = Some(InFlight { keys, ids: queued });
        }
        Ok(Some(order.len()))
    }

    /// Takes the ids of the round in flight, if any, and emits them to their sequences (a sequence that ended
    /// meanwhile, by a cancel, drops its id).
    pub(crate) fn land(&mut self, seqs: &mut [Sequence<'_>]) -> Result<(), EngineError> {
        let Some(f) = self.in_flight.take() else { return Ok(()) };
        let ids = self.be.take_ids(&f.ids);
        let vocab = self.model.vocab_size();
        if ids.len() != f.keys.len() || ids.iter().any(|&t| t as usize >= vocab) {
            return Err(EngineError::Model(format!(
                "the backend's queued argmax gave {ids:?} for {} rows of {vocab}",
                f.keys.len()
            )));
        }
        for (key, token) in f.keys.iter().zip(ids) {
            let Some(s) = seqs.iter_mut().find(|s| s.key == *key) else { continue };
            s.in_flight = false;
            if s.is_done() {
                continue;
            }
            s.counts.rounds += 1;
            s.counts.min_rows = 1;
            s.context.push(*s.tokens.last().expect("decoding"));
            s.emit((token, None, Vec::new()));
        }
        Ok(())
    }
}
