//! A thinking budget (DESIGN.md §8): a [`ConstraintSpec`] that counts the tokens of a sequence's own thinking
//! block (`<think>` … `</think>`) and forces the end-of-thinking token once the count reaches the budget,
//! optionally followed by another constraint (a JSON schema, a forced tool call) on the answer.
//!
//! A reply goes through three phases:
//!
//! * **before** (only when the reply does not start inside thinking): the first token may open the block with
//!   `think_start`. Any other first token starts the answer at once (a reply without thinking; no budget
//!   applies). The mask is the answer's (the inner constraint's fresh mask, or every id) plus `think_start`.
//! * **inside**: every id of the vocabulary is allowed (`think_start` and `think_end` included) while fewer than
//!   `budget` thinking tokens were drawn; at `budget` tokens the mask holds `think_end` only, and
//!   [`forced`](TokenConstraint::forced) returns it (followed by what the inner constraint forces at its start).
//!   The count is of tokens after `think_start` (or after the prompt, when the reply starts inside), `think_end`
//!   excluded, so a reply has at most `budget` thinking tokens.
//! * **after** `think_end`: the inner constraint, started fresh at the first answer token, decides; without one
//!   every id is allowed.
//!
//! End of sequence inside thinking: allowed below the limit (a model may end its reply while thinking) when there
//! is no inner constraint, or when the inner constraint accepts an empty answer; otherwise not, since ending
//! there would leave the answer's constraint unsatisfied. At the limit only `think_end` is allowed. The
//! constraint is accepting exactly when its mask holds the end-of-sequence ids.
//!
//! The state is a pure function of the consumed tokens; [`rollback`](TokenConstraint::rollback) is exact (a
//! phase per consumed token is kept, and the inner constraint is rolled back by the tokens it consumed).

use std::sync::Arc;

use tf_core::{ConstraintError, ConstraintSpec, TokenConstraint};

use crate::{GrammarEnv, GrammarError};

fn err(msg: impl Into<String>) -> ConstraintError {
    ConstraintError(msg.into())
}

/// A thinking budget, shared by every sequence that uses it; see the module documentation.
#[derive(Clone, Debug)]
pub struct ThinkingBudget {
    /// The token that opens a thinking block (`<think>`).
    pub think_start: u32,
    /// The token that ends it (`</think>`).
    pub think_end: u32,
    /// The most tokens the thinking block may hold (`think_start` and `think_end` not counted).
    pub budget: usize,
    /// Whether the reply starts inside the block (the prompt already ended with `<think>`).
    pub starts_inside: bool,
    /// The constraint on the answer after `think_end`, started fresh there.
    pub inner: Option<Arc<dyn ConstraintSpec>>,
    /// Ids `>= vocab_size` (padding rows of the head) are never allowed.
    pub vocab_size: usize,
    /// The end-of-sequence ids.
    pub eos_ids: Vec<u32>,
}

impl ThinkingBudget {
    /// A budget over a vocabulary of `vocab_size` ids with end-of-sequence ids `eos_ids`, not starting inside,
    /// without an inner constraint.
    pub fn new(think_start: u32, think_end: u32, budget: usize, vocab_size: usize, eos_ids: &[u32]) -> Self {
        ThinkingBudget {
            think_start,
            think_end,
            budget,
            starts_inside: false,
            inner: None,
            vocab_size,
            eos_ids: eos_ids.to_vec(),
        }
    }

    /// A budget for the model of `env`: its `<think>`/`</think>` tokens, vocabulary and end-of-sequence ids.
    /// An error when the tokenizer lacks either marker as a single token.
    pub fn for_env(env: &GrammarEnv, budget: usize) -> Result<Self, GrammarError> {
        let tok = env.tokenizer();
        let id = |text: &str| {
            tok.id_of(text)
                .ok_or_else(|| GrammarError::new("thinking budget", format!("the tokenizer has no {text} token")))
        };
        Ok(ThinkingBudget::new(id("<think>")?, id("</think>")?, budget, env.vocab_size(), env.eos_ids()))
    }

    /// The same budget, starting inside the thinking block or not.
    pub fn starting_inside(mut self, starts_inside: bool) -> Self {
        self.starts_inside = starts_inside;
        self
    }

    /// The same budget with `inner` constraining the answer after `think_end`.
    pub fn then(mut self, inner: Arc<dyn ConstraintSpec>) -> Self {
        self.inner = Some(inner);
        self
    }
}

impl ConstraintSpec for ThinkingBudget {
    fn start(&self) -> Result<Box<dyn TokenConstraint>, ConstraintError> {
        for (what, t) in [("think_start", self.think_start), ("think_end", self.think_end)] {
            if t as usize >= self.vocab_size {
                return Err(err(format!(
                    "thinking budget: {what} {t} is outside the vocabulary ({} ids)",
                    self.vocab_size
                )));
            }
        }
        if self.think_start == self.think_end {
            return Err(err("thinking budget: think_start and think_end are the same token"));
        }
        let inner = self.inner.as_ref().map(|s| s.start()).transpose()?;
        let first = if self.starts_inside { Phase::Inside(0) } else { Phase::Before };
        let mut eos = self.eos_ids.clone();
        eos.sort_unstable();
        eos.dedup();
        Ok(Box::new(BudgetMatcher {
            think_start: self.think_start,
            think_end: self.think_end,
            budget: self.budget,
            vocab: self.vocab_size,
            eos,
            inner,
            phases: vec![first],
            to_inner: Vec::new(),
        }))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No token yet, outside thinking: the first token may open the block.
    Before,
    /// Inside the block, after this many thinking tokens.
    Inside(usize),
    /// After the block (or a reply without one): the answer.
    After,
}

/// The matcher of one sequence under a [`ThinkingBudget`].
pub struct BudgetMatcher {
    think_start: u32,
    think_end: u32,
    budget: usize,
    vocab: usize,
    /// Sorted, deduplicated.
    eos: Vec<u32>,
    inner: Option<Box<dyn TokenConstraint>>,
    /// `phases[i]` is the phase after `i` consumed tokens.
    phases: Vec<Phase>,
    /// Per consumed token: whether the inner constraint consumed it.
    to_inner: Vec<bool>,
}

impl BudgetMatcher {
    fn phase(&self) -> Phase {
        *self.phases.last().expect("the initial phase is never popped")
    }

    fn is_eos(&self, t: u32) -> bool {
        self.eos.binary_search(&t).is_ok()
    }

    /// Whether the end of sequence may be drawn inside thinking below the limit: without an inner constraint,
    /// or when the (still fresh) inner constraint accepts an empty answer.
    fn eos_inside(&mut self) -> bool {
        self.inner.as_mut().is_none_or(|c| c.is_accepting())
    }

    fn set(&self, mask: &mut [u32], t: u32) {
        if (t as usize) < self.vocab {
            if let Some(w) = mask.get_mut(t as usize / 32) {
                *w |= 1 << (t % 32);
            }
        }
    }

    fn clear(mask: &mut [u32], t: u32) {
        if let Some(w) = mask.get_mut(t as usize / 32) {
            *w &= !(1 << (t % 32));
        }
    }

    /// Every id below the vocabulary size.
    fn fill_all(&self, mask: &mut [u32]) {
        let n = self.vocab.min(mask.len() * 32);
        mask.fill(0);
        mask[..n / 32].fill(u32::MAX);
        if !n.is_multiple_of(32) {
            mask[n / 32] = (1u32 << (n % 32)) - 1;
        }
    }
}

impl TokenConstraint for BudgetMatcher {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError> {
        match self.phase() {
            Phase::Before => {
                match self.inner.as_mut() {
                    Some(c) => c.fill_mask(mask)?,
                    None => self.fill_all(mask),
                }
                self.set(mask, self.think_start);
            }
            Phase::Inside(n) if n >= self.budget => {
                mask.fill(0);
                self.set(mask, self.think_end);
            }
            Phase::Inside(_) => {
                self.fill_all(mask);
                if !self.eos_inside() {
                    for &e in &self.eos {
                        Self::clear(mask, e);
                    }
                }
            }
            Phase::After => match self.inner.as_mut() {
                Some(c) => c.fill_mask(mask)?,
                None => self.fill_all(mask),
            },
        }
        Ok(())
    }

    fn consume(&mut self, token: u32) -> Result<(), ConstraintError> {
        if token as usize >= self.vocab {
            return Err(err(format!("token {token} is outside the vocabulary ({} ids)", self.vocab)));
        }
        let (next, inner) = match self.phase() {
            Phase::Before if token == self.think_start => (Phase::Inside(0), false),
            Phase::Before | Phase::After => match self.inner.as_mut() {
                Some(c) => {
                    c.consume(token)?;
                    (Phase::After, true)
                }
                None => (Phase::After, false),
            },
            Phase::Inside(_) if token == self.think_end => (Phase::After, false),
            Phase::Inside(n) if n >= self.budget => {
                return Err(err(format!(
                    "token {token}: the thinking budget of {} tokens is spent; only {} may follow",
                    self.budget, self.think_end
                )));
            }
            Phase::Inside(n) => {
                if self.is_eos(token) && !self.eos_inside() {
                    return Err(err(format!(
                        "token {token}: the reply may not end inside thinking before its answer's constraint is met"
                    )));
                }
                (Phase::Inside(n + 1), false)
            }
        };
        self.phases.push(next);
        self.to_inner.push(inner);
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        if n > self.to_inner.len() {
            return Err(err(format!("cannot roll back {n} tokens: only {} consumed", self.to_inner.len())));
        }
        let keep = self.to_inner.len() - n;
        let inner_n = self.to_inner[keep..].iter().filter(|&&b| b).count();
        if inner_n > 0 {
            self.inner.as_mut().expect("tokens went to the inner constraint").rollback(inner_n)?;
        }
        self.to_inner.truncate(keep);
        self.phases.truncate(keep + 1);
        Ok(())
    }

    fn forced(&mut self) -> Vec<u32> {
        match self.phase() {
            Phase::Inside(n) if n >= self.budget => {
                let mut out = vec![self.think_end];
                if let Some(c) = self.inner.as_mut() {
                    out.extend(c.forced());
                }
                out
            }
            Phase::After => self.inner.as_mut().map(|c| c.forced()).unwrap_or_default(),
            Phase::Before | Phase::Inside(_) => Vec::new(),
        }
    }

    fn is_accepting(&mut self) -> bool {
        match self.phase() {
            Phase::Before | Phase::After => self.inner.as_mut().is_none_or(|c| c.is_accepting()),
            Phase::Inside(n) if n >= self.budget => false,
            Phase::Inside(_) => self.eos_inside(),
        }
    }

    fn is_stopped(&self) -> bool {
        self.phase() == Phase::After && self.inner.as_ref().is_some_and(|c| c.is_stopped())
    }
}
