//! Fuzz target bodies, shared by the cargo-fuzz targets under `fuzz/` (nightly, libFuzzer) and the stable replay
//! tests of this crate (`tests/replay.rs`: the seed corpus plus a bounded number of random mutations, what CI
//! runs). Each body takes arbitrary bytes, drives one input surface of the product and asserts its invariants:
//! no panic, errors of one line (readers, tokenizers, templates) or of the API error shape (routes), and what an
//! accepted input promises (tensor bytes inside the file, ids inside the vocabulary, a job the engine admits).
//!
//! | target | surface |
//! | --- | --- |
//! | `gguf` | [`tf_loader::gguf::parse_header`], then the model config and the tokenizer from its metadata |
//! | `safetensors` | [`tf_loader::safetensors::parse_header`] |
//! | `tokenizer` | [`tf_text::Tokenizer`] encode / decode / incremental detokenizer, GGUF BPE, SPM and HF |
//! | `chat_template` | [`tf_text::ChatTemplate::render`] with hostile messages, tools and variables |
//! | `chat`, `completions`, `responses`, `messages`, `count_tokens` | each route's `parse` (request → job) |
//! | `tokenize`, `detokenize` | the route through the router (status and body) |

pub mod loader;
pub mod mutate;
pub mod replay;
pub mod server;
pub mod text;

/// One fuzz target.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Its dictionary, a file under `fuzz/dict/` (libFuzzer's `-dict` and the replay's mutations).
    pub dict: &'static str,
    /// The longest input it is fed (libFuzzer's `-max_len` and the replay).
    pub max_len: usize,
}

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    Target { name: "gguf", run: loader::gguf, dict: "gguf.dict", max_len: 4096 },
    Target { name: "safetensors", run: loader::safetensors, dict: "safetensors.dict", max_len: 4096 },
    Target { name: "tokenizer", run: text::tokenizer, dict: "text.dict", max_len: 1024 },
    Target { name: "chat_template", run: text::chat_template, dict: "request.dict", max_len: 2048 },
    Target { name: "chat", run: server::chat, dict: "request.dict", max_len: 2048 },
    Target { name: "completions", run: server::completions, dict: "request.dict", max_len: 2048 },
    Target { name: "responses", run: server::responses, dict: "request.dict", max_len: 2048 },
    Target { name: "messages", run: server::messages, dict: "request.dict", max_len: 2048 },
    Target { name: "count_tokens", run: server::count_tokens, dict: "request.dict", max_len: 2048 },
    Target { name: "tokenize", run: server::tokenize, dict: "request.dict", max_len: 2048 },
    Target { name: "detokenize", run: server::detokenize, dict: "request.dict", max_len: 2048 },
];

/// The target called `name`.
pub fn target(name: &str) -> &'static Target {
    TARGETS.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no fuzz target `{name}`"))
}

/// The repository's `fuzz/` directory (seeds and dictionaries).
pub fn fuzz_dir() -> std::path::PathBuf {
    tf_testkit::repo_root().join("fuzz")
}

/// An error message for people: not empty, one line.
pub fn check_message(what: &str, msg: &str) {
    assert!(!msg.trim().is_empty(), "{what}: an empty error message");
    assert!(!msg.contains('\n'), "{what}: an error of more than one line: {msg:?}");
}
