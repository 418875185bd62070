//! One sequence's matcher: [`TokenConstraint`] on llguidance's `Matcher`.
//!
//! llguidance's matcher turns into a permanent error state on any failed call (a rejected token included), so
//! `consume` checks the token against this state's mask first, and a matcher that fails anyway is rebuilt from
//! the compiled start state by replaying the committed tokens (the state is a pure function of them).

use llguidance::api::StopReason;
use llguidance::Matcher;
use tf_core::{ConstraintError, TokenConstraint};

use crate::GrammarEnv;

/// Masks kept per matcher (by depth along the consumed tokens), so that a verify window's rows and a rollback
/// to an earlier row reuse them.
const MASK_CACHE: usize = 16;

fn err(msg: impl Into<String>) -> ConstraintError {
    ConstraintError(msg.into())
}

/// The [`TokenConstraint`] of one sequence (made by `ConstraintSpec::start`).
pub struct GrammarMatcher {
    env: GrammarEnv,
    /// The compiled grammar's start state.
    proto: Matcher,
    m: Matcher,
    /// Every consumed token, in order.
    history: Vec<u32>,
    /// End-of-sequence ids consumed after llguidance had stopped (they are in `history` but not in `m`).
    tail: usize,
    /// (depth, mask words over the tokenizer's vocabulary) for states along `history`.
    masks: Vec<(usize, Vec<u32>)>,
}

impl GrammarMatcher {
    pub(crate) fn new(env: GrammarEnv, proto: Matcher) -> Self {
        let m = proto.clone();
        GrammarMatcher { env, proto, m, history: Vec::new(), tail: 0, masks: Vec::new() }
    }

    /// Number of consumed tokens (the depth of the current state).
    pub fn len(&self) -> usize {
        self.history.len()
    }

    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// The consumed tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    fn stopped_ok(&self) -> bool {
        self.tail > 0 || matches!(self.m.stop_reason(), StopReason::EndOfSentence | StopReason::NoExtension)
    }

    /// Replaces `m` by the start state advanced over `history` one token at a time, as it was first built.
    fn rebuild(&mut self) -> Result<(), ConstraintError> {
        let mut m = self.proto.clone();
        let mut tail = 0;
        for &t in &self.history {
            if m.is_stopped() && !m.is_error() && self.env.eos_ids().binary_search(&t).is_ok() {
                tail += 1;
                continue;
            }
            m.consume_token(t).map_err(|e| err(format!("replaying the grammar state: {e}")))?;
        }
        self.m = m;
        self.tail = tail;
        Ok(())
    }

    /// The mask words of the current state (computed once per state while it stays in the cache).
    fn current_mask(&mut self) -> Result<usize, ConstraintError> {
        let depth = self.history.len();
        if let Some(i) = self.masks.iter().position(|(d, _)| *d == depth) {
            return Ok(i);
        }
        let vocab = self.env.vocab_size();
        let mut words = vec![0u32; vocab.div_ceil(32)];
        if self.m.is_stopped() {
            if !self.stopped_ok() {
                let why = self.m.get_error().unwrap_or_else(|| format!("{:?}", self.m.stop_reason()));
                return Err(err(format!("grammar stopped: {why}")));
            }
        } else {
            let vob = match self.m.compute_mask() {
                Ok(v) => v,
                Err(e) => {
                    let msg = format!("no token can continue the grammar here: {e}");
                    self.rebuild()?;
                    return Err(err(msg));
                }
            };
            let src = vob.as_slice();
            let n = words.len().min(src.len());
            words[..n].copy_from_slice(&src[..n]);
            if !vocab.is_multiple_of(32) {
                let last = words.len() - 1;
                words[last] &= (1u32 << (vocab % 32)) - 1;
            }
            for &e in self.env.eos_ids() {
                words[e as usize / 32] &= !(1u32 << (e % 32));
            }
        }
        if self.is_accepting() {
            for &e in self.env.eos_ids() {
                words[e as usize / 32] |= 1u32 << (e % 32);
            }
        }
        if self.masks.len() >= MASK_CACHE {
            let oldest = (0..self.masks.len()).min_by_key(|&i| self.masks[i].0).expect("non-empty cache");
            self.masks.swap_remove(oldest);
        }
        self.masks.push((depth, words));
        Ok(self.masks.len() - 1)
    }
}

impl TokenConstraint for GrammarMatcher {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
        let i = self.current_mask()?;
        let words = &self.masks[i].1;
        let n = mask.len().min(words.len());
        mask[..n].copy_from_slice(&words[..n]);
        mask[n..].fill(0);
        Ok(())
    }

    fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        let vocab = self.env.vocab_size();
        if token as usize >= vocab {
            return Err(err(format!("token {token} is outside the vocabulary ({vocab} ids)")));
        }
        let i = self.current_mask()?;
        if self.masks[i].1[token as usize / 32] >> (token % 32) & 1 == 0 {
            return Err(err(format!("token {token} is not allowed by the grammar here")));
        }
        if self.m.is_stopped() {
            // Only end-of-sequence ids are in a stopped state's mask.
            self.history.push(token);
            self.tail += 1;
            return Ok(());
        }
        if let Err(e) = self.m.consume_token(token) {
            self.rebuild()?;
            return Err(err(format!("token {token}: {e}")));
        }
        self.history.push(token);
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        if n == 0 {
            return Ok(());
        }
        let len = self.history.len();
        if n > len {
            return Err(err(format!("rollback of {n} tokens past the start ({len} consumed)")));
        }
        let from_tail = n.min(self.tail);
        let rest = n - from_tail;
        self.tail -= from_tail;
        self.history.truncate(len - n);
        self.masks.retain(|(d, _)| *d <= len - n);
        // Grammars with `stop=`/`max_tokens=` lexemes cannot roll back in llguidance; they are replayed.
        if rest > 0 && self.m.rollback(rest).is_err() {
            self.rebuild()?;
        }
        Ok(())
    }

    fn forced(&mut self) -> Vec<u32> {
        if self.is_stopped() {
            return Vec::new();
        }
        let toks = self.m.compute_ff_tokens();
        if self.m.is_error() {
            let _ = self.rebuild();
            return Vec::new();
        }
        let vocab = self.env.vocab_size() as u32;
        toks.into_iter().take_while(|&t| t < vocab).collect()
    }

    fn is_accepting(&mut self) -> bool {
        if self.m.is_stopped() {
            return self.stopped_ok();
        }
        self.m.is_accepting().unwrap_or(false)
    }

    fn is_stopped(&self) -> bool {
        self.tail > 0 || self.m.is_stopped()
    }
}
