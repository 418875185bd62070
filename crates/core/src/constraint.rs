//! Token constraints (DESIGN.md §8): grammars, JSON schemas and forced tool calls decide which tokens a sequence
//! may draw next. A constraint is a pure function of the sequence's own committed tokens, so a verify row that
//! asks it for the mask after that row's path gets exactly the mask serial decoding would have had there; the
//! keyed draw then runs over the allowed ids only, in the same order as without a mask. That keeps drafted ==
//! serial and concurrent == solo with grammars.
//!
//! The engine sees only these traits; `tf-grammar` implements them on `llguidance`.

use std::fmt;

/// Why a constraint refused a token or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError(pub String);

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "constraint: {}", self.0)
    }
}

impl std::error::Error for ConstraintError {}

/// A compiled constraint, shared by every sequence that uses it; [`ConstraintSpec::start`] makes the matcher of
/// one sequence at its first generated token.
pub trait ConstraintSpec: Send + Sync + fmt::Debug {
    /// A fresh matcher, in the state before any generated token.
    fn start(&self) -> Result<Box<dyn TokenConstraint>, ConstraintError>;
}

/// The matcher of one sequence. The engine advances it only with committed tokens, or, inside a verify window,
/// along one row's path and then back with [`TokenConstraint::rollback`].
pub trait TokenConstraint: Send {
    /// The allowed set at the current state: bit `t % 32` of `mask[t / 32]` is set iff token `t` may be drawn.
    /// `mask` holds `vocab.div_ceil(32)` words; ids past the tokenizer's vocabulary (padding rows of the head)
    /// are never allowed. When the constraint is complete, the set holds the end-of-sequence ids only.
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), ConstraintError>;
    /// Advances by one token; an error when the token is not allowed here (the state is then unchanged).
    fn consume(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// Undoes the last `n` consumed tokens.
    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError>;
    /// Tokens the constraint allows and no alternative exists for, in order, from the current state (for free
    /// drafts). Does not consume them.
    fn forced(&mut self) -> Vec<u32>;
    /// Whether the constraint is satisfied so that the reply may end here.
    fn is_accepting(&mut self) -> bool;
    /// Whether nothing but the end of the reply may follow.
    fn is_stopped(&self) -> bool;
    /// How many leading tokens of `tokens` the constraint allows in a row from the current state; the state is
    /// unchanged afterwards (used to cut drafts before verify).
    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let mut n = 0;
        while n < tokens.len() && self.consume(tokens[n]).is_ok() {
            n += 1;
        }
        if n > 0 {
            // Undoing tokens just consumed cannot fail.
            let _ = self.rollback(n);
        }
        n
    }
}

/// Whether `token` is allowed by `mask` (see [`TokenConstraint::fill_mask`]).
pub fn mask_allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

#[cfg(test)]
mod tests {
    use super::mask_allows;

    #[test]
    fn mask_bits() {
        let mut mask = vec![0u32; 3];
        mask[1] |= 1 << 5; // token 37
        assert!(mask_allows(&mask, 37));
        assert!(!mask_allows(&mask, 36));
        assert!(!mask_allows(&mask, 5));
        assert!(!mask_allows(&mask, 1000));
    }
}
