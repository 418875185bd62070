//! [`Tokenizer`]: one type over two sources. A HF `tokenizer.json` is used as `transformers` uses it; a
//! GGUF vocabulary is converted so that encoding reproduces llama.cpp (see `gguf_vocab.rs`).

use std::collections::HashMap;
use std::path::Path;

use aho_corasick::AhoCorasick;
use serde_json::Value as Json;

use tokenizers::models::bpe::BPE;
use tokenizers::Model;

use crate::gguf_vocab::byte_level_encoder;
use crate::pretok::PreTokenizer;
use crate::spm::Spm;
use crate::{Result, TextError};

/// What a token is, in llama.cpp's terms (GGUF `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Ordinary text.
    Normal,
    /// The unknown token: special, hidden when skipping special tokens.
    Unknown,
    /// Control tokens (BOS, EOS, chat markers): matched in text only with `parse_special`, hidden when
    /// skipping special tokens.
    Control,
    /// Added tokens that are always matched in text and always shown.
    UserDefined,
    /// Reserved ids that decode to nothing.
    Unused,
    /// Byte-fallback tokens `<0xNN>`.
    Byte,
    /// Type 0 in GGUF: decodes to nothing, never matched.
    Undefined,
}

impl TokenKind {
    /// Hidden by `decode(.., skip_special = true)`.
    pub fn is_special(self) -> bool {
        matches!(self, TokenKind::Unknown | TokenKind::Control)
    }
}

/// The splitter of special-token text, with llama.cpp's semantics: tokens are tried longest first, each
/// splitting every remaining text fragment at all of its (non-overlapping, leftmost-first) occurrences.
#[derive(Debug, Clone)]
pub(crate) struct SpecialSplitter {
    /// (text, id, control-or-unknown), longest text first, ties by id.
    tokens: Vec<(String, u32, bool)>,
    /// Finds which of `tokens` occur at all (by index), so the passes skip the absent ones.
    finder: Option<AhoCorasick>,
}

/// A piece of input: raw text to tokenize, or a special token already recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl SpecialSplitter {
    pub(crate) fn new(mut tokens: Vec<(String, u32, bool)>) -> Result<Self> {
        tokens.retain(|t| !t.0.is_empty());
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let finder = if tokens.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(tokens.iter().map(|t| t.0.as_str()))
                    .map_err(|e| TextError::Tokenizer(format!("special token matcher: {e}")))?,
            )
        };
        Ok(Self { tokens, finder })
    }

    pub(crate) fn split<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(text)];
        let Some(finder) = &self.finder else { return frags };
        let mut present = vec![false; self.tokens.len()];
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        for (i, (tok, id, control)) in self.tokens.iter().enumerate() {
            if !present[i] || (*control && !parse_special) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = rest.find(tok.as_str()) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(*id));
                    rest = &rest[pos + tok.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }
}

/// How raw text is turned into ids.
pub(crate) enum Engine {
    /// A HF tokenizer used as is. `plain` is the same with `encode_special_tokens` set, so special added
    /// tokens in the text stay text (`parse_special = false`).
    Hf { full: Box<tokenizers::Tokenizer>, plain: Box<tokenizers::Tokenizer>, manual_specials: bool },
    /// llama.cpp's byte-level BPE: special tokens split out first, each text fragment through the
    /// pre-tokenizer regexes, byte-level mapping and HF's BPE model. Characters missing from the
    /// vocabulary come out as `unknown` (outside the vocabulary) and are dropped.
    GgufBpe { specials: SpecialSplitter, pretok: PreTokenizer, bpe: Box<BPE>, unknown: u32 },
    /// llama.cpp's SentencePiece merging.
    GgufSpm { specials: SpecialSplitter, spm: Box<Spm>, add_space_prefix: bool },
}

/// A tokenizer: encoding, decoding, special ids and the chat template that came with it.
pub struct Tokenizer {
    pub(crate) engine: Engine,
    /// Per id: kind, vocabulary text, decoded bytes (special tokens as their text).
    pub(crate) kinds: Vec<TokenKind>,
    pub(crate) texts: Vec<String>,
    pub(crate) pieces: Vec<Vec<u8>>,
    pub(crate) token_to_id: HashMap<String, u32>,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    /// Decoding drops one leading space of the first token (SentencePiece's added prefix space).
    pub(crate) strip_leading_space: bool,
    pub(crate) stop_ids: Vec<u32>,
    pub(crate) chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.engine {
            Engine::Hf { .. } => "hf",
            Engine::GgufBpe { .. } => "gguf-bpe",
            Engine::GgufSpm { .. } => "gguf-spm",
        };
        f.debug_struct("Tokenizer")
            .field("engine", &kind)
            .field("vocab_size", &self.kinds.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop_ids", &self.stop_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Text to ids. `add_special`: add BOS/EOS as the model's flags say. `parse_special`: text of
    /// control tokens (e.g. `<|im_start|>`) becomes their id (llama.cpp's `special = true`); user-defined
    /// added tokens are matched either way.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        match &self.engine {
            Engine::Hf { full, plain, manual_specials } => {
                let tok = if parse_special { full } else { plain };
                let hf_special = add_special && !manual_specials;
                let enc = tok.encode_fast(text, hf_special).map_err(|e| TextError::Tokenizer(e.to_string()))?;
                if add_special && *manual_specials && self.add_bos {
                    out.extend(self.bos);
                }
                out.extend_from_slice(enc.get_ids());
                if add_special && *manual_specials && self.add_eos {
                    out.extend(self.eos);
                }
                return Ok(out);
            }
            Engine::GgufBpe { specials, pretok, bpe, unknown } => {
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                let bytes = byte_level_encoder();
                let mut mapped = String::new();
                for frag in specials.split(text, parse_special) {
                    match frag {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => {
                            for piece in pretok.split(t) {
                                mapped.clear();
                                mapped.extend(piece.bytes().map(|b| bytes[b as usize]));
                                let toks = bpe.tokenize(&mapped).map_err(|e| TextError::Tokenizer(e.to_string()))?;
                                out.extend(toks.iter().map(|t| t.id).filter(|id| id != unknown));
                            }
                        }
                    }
                }
            }
            Engine::GgufSpm { specials, spm, add_space_prefix } => {
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                let mut prev_special = true;
                for frag in specials.split(text, parse_special) {
                    match frag {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 4);
                            if *add_space_prefix && prev_special {
                                s.push('\u{2581}');
                            }
                            for c in t.chars() {
                                s.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm.encode(&s, &self.token_to_id, &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Ids to text. `skip_special`: control and unknown tokens produce nothing. Invalid UTF-8 (a byte
    /// sequence cut short) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Engine::Hf { full, .. } = &self.engine {
            self.check_ids(ids)?;
            return full.decode(ids, skip_special).map_err(|e| TextError::Tokenizer(e.to_string()));
        }
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids, skip_special)?).into_owned())
    }

    /// The raw bytes of a decode (GGUF vocabularies; for HF tokenizers the UTF-8 of `decode`).
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Result<Vec<u8>> {
        if let Engine::Hf { .. } = &self.engine {
            return Ok(self.decode(ids, skip_special)?.into_bytes());
        }
        self.check_ids(ids)?;
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let idx = id as usize;
            if skip_special && self.kinds[idx].is_special() {
                continue;
            }
            let piece = &self.pieces[idx][..];
            if i == 0 && self.strip_leading_space {
                out.extend_from_slice(piece.strip_prefix(b" ").unwrap_or(piece));
            } else {
                out.extend_from_slice(piece);
            }
        }
        Ok(out)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let size = self.vocab_size();
        match ids.iter().find(|&&id| id as usize >= size) {
            Some(&id) => Err(TextError::IdOutOfRange { id, size }),
            None => Ok(()),
        }
    }

    /// The bytes one token stands for (special tokens as their text). Empty for out-of-range ids.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map(|p| &p[..]).unwrap_or(&[])
    }

    /// The token's text as the vocabulary spells it (`Ġhello`, `▁hello`, `<|im_end|>`).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(|s| s.as_str())
    }

    /// The id of a token spelled as in the vocabulary (special tokens by their text).
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.token_to_id.get(token).copied()
    }

    /// The token's kind (None for out-of-range ids).
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Number of ids (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.kinds.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (e.g. `<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`), if any.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Every id that ends generation (EOS, EOT, EOM and the other end-of-generation tokens), sorted.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` ends generation.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_ids.binary_search(&id).is_ok()
    }

    /// The chat template that came with the tokenizer.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The BOS token's text (for the chat template's `bos_token`).
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.and_then(|id| self.id_to_token(id))
    }

    /// The EOS token's text (for the chat template's `eos_token`).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.and_then(|id| self.id_to_token(id))
    }

    /// Text that continues a sequence to ids: no BOS/EOS, no SentencePiece prefix space, special-token text
    /// stays text (user-defined added tokens are still matched). For GGUF vocabularies the ids decode to
    /// exactly `text` (SentencePiece ones read U+2581 in `text` as the space it stands for, as llama.cpp
    /// does); HF tokenizers whose normalizer prepends a space do not guarantee that.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>> {
        let Engine::GgufSpm { specials, spm, .. } = &self.engine else {
            return self.encode(text, false, false);
        };
        let mut out = Vec::new();
        for frag in specials.split(text, false) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => {
                    let s: String = t.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }).collect();
                    spm.encode(&s, &self.token_to_id, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// Loads `tokenizer.json` from `dir`, with `tokenizer_config.json`, `generation_config.json` and
    /// `chat_template.jinja` when present.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let read = |name: &str| -> Result<Option<Vec<u8>>> {
            let p = dir.join(name);
            match std::fs::read(&p) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(TextError::Io { path: p.display().to_string(), source }),
            }
        };
        let parse = |name: &str, bytes: Vec<u8>| -> Result<Json> {
            serde_json::from_slice(&bytes).map_err(|e| TextError::Tokenizer(format!("{name}: {e}")))
        };
        let tok_json = read("tokenizer.json")?
            .ok_or_else(|| TextError::Tokenizer(format!("no tokenizer.json in {}", dir.display())))?;
        let config = read("tokenizer_config.json")?.map(|b| parse("tokenizer_config.json", b)).transpose()?;
        let gen = read("generation_config.json")?.map(|b| parse("generation_config.json", b)).transpose()?;
        let mut gen_eos = Vec::new();
        if let Some(v) = gen.as_ref().and_then(|g| g.get("eos_token_id")) {
            match v {
                Json::Array(a) => gen_eos.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32)),
                other => gen_eos.extend(other.as_u64().map(|x| x as u32)),
            }
        }
        let mut tok = Self::from_hf_json(&tok_json, config.as_ref(), &gen_eos)?;
        if let Some(t) = read("chat_template.jinja")? {
            tok.chat_template = Some(String::from_utf8_lossy(&t).into_owned());
        }
        Ok(tok)
    }

    /// Builds from the bytes of a `tokenizer.json`, the parsed `tokenizer_config.json` (special tokens,
    /// `add_bos_token`/`add_eos_token`, `chat_template`) and the `eos_token_id`s of `generation_config.json`.
    pub fn from_hf_json(tokenizer_json: &[u8], config: Option<&Json>, generation_eos: &[u32]) -> Result<Self> {
        crate::hf::build_hf(tokenizer_json, config, generation_eos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitter_longest_first_and_parse_flag() {
        let s = SpecialSplitter::new(vec![
            ("<a>".into(), 1, true),
            ("<a><b>".into(), 2, true),
            ("\n".into(), 3, false),
            ("\n\n".into(), 4, false),
        ])
        .unwrap();
        use Fragment::*;
        assert_eq!(
            s.split("x<a><b>y<a>\n\n\nz", true),
            vec![Text("x"), Token(2), Text("y"), Token(1), Token(4), Token(3), Text("z")]
        );
        assert_eq!(s.split("x<a>\n", false), vec![Text("x<a>"), Token(3)]);
        assert_eq!(s.split("", true), vec![]);
    }
}
