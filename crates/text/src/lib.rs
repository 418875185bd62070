//! TensorFold text: tokenizers, chat templates and incremental detokenization.
//!
//! * [`Tokenizer`] encodes and decodes. It is built from a HF `tokenizer.json` (+ `tokenizer_config.json`),
//!   or from the tokenizer metadata of a GGUF file ([`GgufVocab`]), in which case it reproduces
//!   llama.cpp's tokenization: byte-level BPE with the pre-tokenizer regexes of `tokenizer.ggml.pre`, or
//!   SentencePiece-style merges by score; special tokens are split out of the text the way llama.cpp does.
//! * [`IncrementalDetokenizer`] turns a stream of ids into text pieces that are always whole UTF-8.
//! * [`ChatTemplate`] renders HF Jinja chat templates the way `transformers` does.
//! * [`ToolParser`] takes tool calls out of replies (streamed or whole); [`tool_call_grammar`] builds the grammar
//!   that forces one.
//! * [`ReasoningParser`] splits `<think>…</think>` reasoning, or harmony's `analysis` channel (gpt-oss), from the
//!   answer (streamed or whole).
//!
//! This crate depends on no other TensorFold crate.

mod chat;
mod detok;
mod gguf_vocab;
mod harmony;
mod hf;
mod pretok;
mod pyfmt;
mod reasoning;
mod spm;
mod stop;
mod tokenizer;
mod tool_grammar;
mod tools;

pub use chat::{strftime_utc, ChatRenderOptions, ChatTemplate};
pub use detok::IncrementalDetokenizer;
pub use gguf_vocab::{GgufVocab, TokenType};
pub use pyfmt::{float_repr, json_dumps, DumpOptions};
pub use reasoning::{
    ParsedReasoning, ReasoningEvent, ReasoningFormat, ReasoningParser, ReasoningStream, MISTRAL_THINK_END,
    MISTRAL_THINK_START, THINK_END, THINK_START,
};
pub use stop::StopFilter;
pub use tokenizer::{TokenKind, Tokenizer};
pub use tool_grammar::{tool_call_grammar, ToolSpec};
pub use tools::{parse_tool_calls, ParsedTools, ToolCall, ToolEvent, ToolFormat, ToolParser, ToolsEnd};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The GGUF `tokenizer.ggml.model` is not one this crate can reproduce.
    #[error("unsupported tokenizer model {0:?} (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")]
    UnsupportedModel(String),
    /// The GGUF `tokenizer.ggml.pre` names a pre-tokenizer this crate does not know.
    #[error("unsupported pre-tokenizer {0:?} (tokenizer.ggml.pre)")]
    UnsupportedPre(String),
    /// The vocabulary or tokenizer files are inconsistent or unreadable.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is out of range (vocabulary size {size})")]
    IdOutOfRange { id: u32, size: usize },
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),
    /// The chat template called `raise_exception(message)`.
    #[error("chat template raised: {0}")]
    TemplateRaised(String),
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Result with [`TextError`].
pub type Result<T> = std::result::Result<T, TextError>;

#[cfg(test)]
mod tests {
    /// The server shares these across threads.
    #[test]
    fn shareable_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::Tokenizer>();
        send_sync::<crate::ChatTemplate>();
        send_sync::<crate::IncrementalDetokenizer>();
        send_sync::<crate::TextError>();
    }
}
