//! TensorFold grammars: JSON schemas, regexes, choices and Lark grammars as token constraints
//! (DESIGN.md §8), on `llguidance`.
//!
//! * [`GrammarEnv`] is built once per model from its [`tf_text::Tokenizer`] and end-of-sequence ids: a
//!   `toktrie` trie of every token's bytes and an `llguidance` parser factory. It is a cheap-to-clone handle.
//! * [`compile`] turns a [`Grammar`] into an `Arc<dyn ConstraintSpec>` (tf-core), shared by every sequence that
//!   uses it; `start()` gives one sequence's [`TokenConstraint`](tf_core::TokenConstraint).
//! * [`ThinkingBudget`] counts a reply's thinking tokens, forces `</think>` at the budget and hands the answer to
//!   an inner constraint.
//!
//! Mask semantics: ids past the tokenizer's vocabulary are never allowed; the end-of-sequence ids are allowed
//! exactly when the grammar is accepting; once the grammar is stopped (nothing may follow) the mask holds the
//! end-of-sequence ids only. Where the grammar forces bytes, the mask holds only the first token of their
//! canonical tokenization (the same token [`forced`](tf_core::TokenConstraint::forced) returns).

mod budget;
mod compile;
mod env;
mod matcher;

pub use budget::{BudgetMatcher, ThinkingBudget};
pub use compile::{compile, Grammar, JSON_LAYOUT};
pub use env::GrammarEnv;
pub use matcher::GrammarMatcher;

use std::fmt;

/// Why a grammar could not be built or compiled. The message names the part of the request at fault and what
/// llguidance reported, without its internal context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrammarError {
    /// The request field the grammar came from (`response_format.json_schema`, `regex`, `grammar`, ...).
    pub context: String,
    /// What is wrong.
    pub message: String,
}

impl GrammarError {
    pub(crate) fn new(context: impl Into<String>, message: impl Into<String>) -> Self {
        GrammarError { context: context.into(), message: message.into() }
    }
}

impl fmt::Display for GrammarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.message)
    }
}

impl std::error::Error for GrammarError {}
