//! The token environment of one model: a `toktrie` trie over the bytes of every id of a [`Tokenizer`], the
//! tokenization llguidance uses for forced bytes, and the parser factory every grammar compiles against.

use std::fmt;
use std::sync::Arc;

use llguidance::ParserFactory;
use tf_text::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::GrammarError;

/// Texts whose continuation-encoding must decode back to themselves for llguidance to treat the tokenizer as
/// canonical (and force tokens); otherwise forced bytes are never turned into forced tokens.
const CANONICAL_PROBES: [&str; 4] = ["a", "hello world", "{\"name\": \"x\", \"n\": [1, 2]}", "  \n\tz"];

/// `toktrie`'s view of a [`Tokenizer`].
struct TfTokEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
    canonical: bool,
}

impl TfTokEnv {
    /// `text` continued after other tokens, as ids whose pieces spell exactly `text`; `None` when the
    /// tokenizer does not reproduce it (e.g. a normalizer that prepends a space).
    fn encode_exact(&self, text: &str) -> Option<Vec<TokenId>> {
        let ids = self.tokenizer.encode_continuation(text).ok()?;
        let mut spelled = Vec::with_capacity(text.len());
        for &id in &ids {
            spelled.extend_from_slice(self.tokenizer.token_to_piece(id));
        }
        (spelled == text.as_bytes()).then_some(ids)
    }
}

impl TokenizerEnv for TfTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let (text, rest) = match std::str::from_utf8(s) {
            Ok(t) => (t, &[][..]),
            Err(e) => {
                let (head, tail) = s.split_at(e.valid_up_to());
                (std::str::from_utf8(head).unwrap_or_default(), tail)
            }
        };
        let mut ids = match self.encode_exact(text) {
            Some(ids) => ids,
            None => self.trie.greedy_tokenize(text.as_bytes()),
        };
        if !rest.is_empty() {
            ids.extend(self.trie.greedy_tokenize(rest));
        }
        ids
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

struct EnvInner {
    tokenizer: Arc<Tokenizer>,
    factory: ParserFactory,
    vocab: usize,
    eos: Vec<u32>,
    canonical: bool,
}

/// The grammar environment of one model (cheap to clone; build it once per tokenizer). Grammars compiled
/// against it share its trie, token tables and lexer slices.
#[derive(Clone)]
pub struct GrammarEnv {
    inner: Arc<EnvInner>,
}

impl fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrammarEnv")
            .field("vocab", &self.inner.vocab)
            .field("eos", &self.inner.eos)
            .field("canonical", &self.inner.canonical)
            .finish()
    }
}

impl GrammarEnv {
    /// Builds the environment of `tokenizer`. `eos_ids` are the ids that end a reply (EOS and end-of-turn ids,
    /// e.g. `tokenizer.stop_ids()`); the mask allows them exactly where the grammar is accepting. An error when
    /// `eos_ids` is empty or names an id outside the vocabulary.
    pub fn new(tokenizer: Arc<Tokenizer>, eos_ids: &[u32]) -> Result<GrammarEnv, GrammarError> {
        let vocab = tokenizer.vocab_size();
        let mut eos = eos_ids.to_vec();
        eos.sort_unstable();
        eos.dedup();
        if eos.is_empty() {
            return Err(GrammarError::new("grammar environment", "no end-of-sequence ids"));
        }
        if let Some(&bad) = eos.iter().find(|&&id| id as usize >= vocab) {
            let msg = format!("end-of-sequence id {bad} is outside the vocabulary ({vocab} ids)");
            return Err(GrammarError::new("grammar environment", msg));
        }

        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let piece = tokenizer.token_to_piece(id);
                let special = tokenizer.token_kind(id).is_some_and(|k| k.is_special());
                if special && !piece.is_empty() {
                    let mut w = Vec::with_capacity(piece.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let info = TokRxInfo {
            vocab_size: vocab as u32,
            tok_eos: eos[0],
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            tok_unk: tokenizer.unk_id(),
            tok_end_of_turn: tokenizer.eot_id(),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        drop(words);

        let mut env = TfTokEnv { tokenizer: tokenizer.clone(), trie, canonical: false };
        env.canonical = CANONICAL_PROBES.iter().all(|p| env.encode_exact(p).is_some());
        let canonical = env.canonical;
        let tok_env: TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&tok_env)
            .map_err(|e| GrammarError::new("grammar environment", format!("{e:#}")))?;
        factory.quiet();
        let limits = factory.limits_mut();
        // Errors name the problem only, without the parser state and grammar dump.
        limits.verbose_errors = false;
        Ok(GrammarEnv { inner: Arc::new(EnvInner { tokenizer, factory, vocab, eos, canonical }) })
    }

    /// Number of ids of the tokenizer; masks never allow an id at or past it.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab
    }

    /// The end-of-sequence ids, sorted.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos
    }

    /// Whether forced bytes become forced tokens (the tokenizer reproduces text continued mid-sequence).
    pub fn forces_tokens(&self) -> bool {
        self.inner.canonical
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }

    pub(crate) fn factory(&self) -> &ParserFactory {
        &self.inner.factory
    }
}
