//! Drafting (DESIGN.md §1, §3): proposers guess tokens ahead, one window verifies them, and equality acceptance
//! keeps exactly the tokens serial decoding would have produced. Pure logic: nothing here touches a model.
//!
//! One round of one stream, as the engine drives it:
//! 1. `context` = prompt + reply so far, whose last token is the *pending* token (drawn, not yet fed) at
//!    position `P = context.len() − 1`.
//! 2. The [`Proposer`] names the class of the guess it has ([`Proposer::propose_by_class`]: for context
//!    copies, how long a match backs it); `k` = that class's [`ClassStats::best_width`] (capped by the row
//!    budget and the tokens left); the proposer returns a [`DraftTree`] of at most `k` nodes.
//! 3. The window is `1 + tree.len()` rows ([`DraftTree::row_tokens`], [`DraftTree::row_positions`],
//!    [`DraftTree::row_ancestor_rows`]); one forward gives every row's logits.
//! 4. [`verify`] walks the tree with the target's keyed draw, [`truncate_after`] cuts the result at a stop id
//!    or `max_tokens`; the verdict's tokens are emitted; the last becomes the next pending token.
//! 5. [`Proposer::observe`] and [`ClassStats::observe`] (for the round's class) learn from
//!    `(proposed, accepted)`.

mod ngram;
mod tree;
mod verify;
mod width;

#[cfg(test)]
pub(crate) mod tests;

pub use ngram::{NgramConfig, NgramProposer, TAIL_CHECK};
pub use tree::{DraftNode, DraftTree};
pub use verify::{truncate_after, verify, Verdict};
pub use width::{expected_tokens, AcceptStats, ClassStats, CostTable, CLASSES, CLASS_PRIORS};

/// A source of draft tokens for one stream. One instance per stream: it may keep per-stream state (an index
/// of the context, acceptance history), so call [`Proposer::reset`] before reusing it for another request.
pub trait Proposer: Send {
    /// A short name for telemetry (e.g. `"ngram"`).
    fn name(&self) -> &'static str;

    /// Drafts at most `max_tokens` tokens continuing `context` (prompt + reply so far, the pending token
    /// last). An empty tree means "no guess this round".
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree;

    /// Drafts with the width chosen for the class of guess this proposer has: it names the class, `width(class)`
    /// returns the most tokens to draft, and the tree of at most that many comes back with the class. `None`: no
    /// guess this round (`width` not called). Classes are ordered by the evidence behind a guess: a higher class
    /// starts from a higher acceptance estimate ([`CLASS_PRIORS`]) before its own outcomes are learned. The
    /// default has one class, 0.
    fn propose_by_class(
        &mut self,
        context: &[u32],
        width: &mut dyn FnMut(usize) -> usize,
    ) -> (DraftTree, Option<usize>) {
        let k = width(0);
        (if k > 0 { self.propose(context, k) } else { DraftTree::new() }, Some(0))
    }

    /// The outcome of the last proposal: `proposed` = nodes of the tree it returned, `accepted` = draft tokens
    /// the target kept. Rounds that proposed nothing may report `(0, 0)` or nothing at all.
    fn observe(&mut self, proposed: usize, accepted: usize);

    /// Forgets all per-stream state (context index, acceptance history).
    fn reset(&mut self);

    /// The prompt is in the target's cache and decoding starts after `context`: a proposer with its own model
    /// feeds it now, as part of the prompt's processing, rather than on its first proposal. The default does
    /// nothing.
    fn prepare(&mut self, _context: &[u32]) {}
}
