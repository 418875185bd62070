//! GGUF tokenizer metadata ([`GgufVocab`]) and its conversion into a [`Tokenizer`] that reproduces
//! llama.cpp's ids: its pre-tokenizer regexes per `tokenizer.ggml.pre`, its special-token handling,
//! its defaults for BOS/EOS/space prefix, and its end-of-generation detection.

use std::collections::{BTreeSet, HashMap};

use ahash::AHashMap;
use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::BPE;

use crate::pretok::PreTokenizer;
use crate::spm::Spm;
use crate::tokenizer::{Engine, SpecialSplitter, TokenKind, Tokenizer};
use crate::{Result, TextError};

/// GGUF `tokenizer.ggml.token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    pub fn from_i32(v: i32) -> Self {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    fn kind(self) -> TokenKind {
        match self {
            TokenType::Undefined => TokenKind::Undefined,
            TokenType::Normal => TokenKind::Normal,
            TokenType::Unknown => TokenKind::Unknown,
            TokenType::Control => TokenKind::Control,
            TokenType::UserDefined => TokenKind::UserDefined,
            TokenType::Unused => TokenKind::Unused,
            TokenType::Byte => TokenKind::Byte,
        }
    }
}

/// The tokenizer part of a GGUF file's metadata, as plain data (keys `tokenizer.ggml.*` and
/// `tokenizer.chat_template`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of BPE vocabularies (`"qwen2"`, `"llama-bpe"`, `"smollm"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities)
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type` (see [`TokenType`])
    pub token_type: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` (`"left right"`, highest priority first)
    pub merges: Option<Vec<String>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub sep: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`
    pub chat_template: Option<String>,
}

/// The GPT-2 split regex (llama.cpp runs a hand-written equivalent of it, `\s+` included).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// llama.cpp's forms of the GPT-4o and Tekken patterns: over class stand-ins every non-ASCII letter counts
// as both cases, so "upper" is "a letter that is not a-z" and "lower" "a letter that is not A-Z".
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// How llama.cpp pre-tokenizes one `tokenizer.ggml.pre` value.
struct PreSpec {
    /// Applied in order, each splitting the pieces of the previous one (matches and gaps both kept).
    regexes: Vec<&'static str>,
    /// A whole pre-token that is a vocabulary entry is taken as is (llama3-style).
    ignore_merges: bool,
    /// Default of `add_bos` before `tokenizer.ggml.add_bos_token` overrides it.
    add_bos: bool,
}

fn pre_spec(pre: &str) -> Result<PreSpec> {
    let spec = |regexes: Vec<&'static str>| PreSpec { regexes, ignore_merges: false, add_bos: false };
    Ok(match pre {
        "default" => spec(vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            PreSpec { regexes: vec![LLAMA3], ignore_merges: true, add_bos: true }
        }
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => spec(vec![LLAMA3]),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan" | "grok-2" => spec(vec![QWEN2]),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" | "trillion"
        | "granite-docling" => spec(vec![GPT2]),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            spec(vec![r"\p{N}", GPT2])
        }
        "falcon" => spec(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "deepseek-coder" => spec(vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]),
        "poro-chat" | "bloom" | "gpt3-finnish" => spec(vec![BLOOM]),
        "viking" => spec(vec![BLOOM, r"\p{N}"]),
        "gpt-4o" | "llama4" => spec(vec![GPT4O]),
        "tekken" => PreSpec { regexes: vec![TEKKEN], ignore_merges: true, add_bos: true },
        other => return Err(TextError::UnsupportedPre(other.to_string())),
    })
}

/// Token texts llama.cpp auto-detects (when the metadata names none) and forces to control type.
pub(crate) const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP: &[&str] = &["<|file_sep|>"];
/// Texts of end-of-generation tokens (llama.cpp's list).
pub(crate) const EOG_ALL: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// GPT-2's byte-to-character table inverted: the byte each byte-level character stands for.
pub(crate) fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut map: HashMap<char, u8> = printable.iter().map(|&b| (char::from_u32(b).unwrap(), b as u8)).collect();
    let mut n = 0;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            map.insert(char::from_u32(256 + n).unwrap(), b as u8);
            printable.push(b);
            n += 1;
        }
    }
    map
}

/// `<0xNN>` → NN
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl Tokenizer {
    /// Builds the tokenizer llama.cpp would build from this metadata. Unknown `model` or `pre` values
    /// are errors naming the value.
    pub fn from_gguf_vocab(v: GgufVocab) -> Result<Self> {
        let is_bpe = match v.model.as_str() {
            "gpt2" => true,
            "llama" => false,
            other => return Err(TextError::UnsupportedModel(other.to_string())),
        };
        let n = v.tokens.len();
        if n == 0 {
            return Err(TextError::Tokenizer("tokenizer.ggml.tokens is empty".into()));
        }
        for (name, len) in
            [("scores", v.scores.as_ref().map(|s| s.len())), ("token_type", v.token_type.as_ref().map(|s| s.len()))]
        {
            if let Some(len) = len.filter(|&l| l < n) {
                return Err(TextError::Tokenizer(format!("tokenizer.ggml.{name} has {len} entries for {n} tokens")));
            }
        }
        let texts: Vec<String> = v
            .tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t })
            .collect();
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            if let Some(prev) = token_to_id.insert(t.clone(), i as u32) {
                return Err(TextError::Tokenizer(format!("duplicate token {t:?} has ids {prev} and {i}")));
            }
        }
        let mut kinds: Vec<TokenKind> = match &v.token_type {
            Some(tt) => tt[..n].iter().map(|&t| TokenType::from_i32(t).kind()).collect(),
            None => vec![TokenKind::Normal; n],
        };

        let pre = if is_bpe { Some(pre_spec(v.pre.as_deref().unwrap_or("default"))?) } else { None };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (def_bos, def_eos, def_unk) = if is_bpe { (None, None, None) } else { (Some(1), Some(2), Some(0)) };
        let bos = in_range(v.bos).or(in_range(def_bos));
        let eos = in_range(v.eos).or(in_range(def_eos));
        let unk = in_range(v.unk).or(in_range(def_unk));
        let pad = in_range(v.pad);
        let add_bos = v.add_bos.unwrap_or(match &pre {
            Some(p) => p.add_bos,
            None => true,
        });
        let add_eos = v.add_eos.unwrap_or(false);
        let add_space_prefix = !is_bpe && v.add_space_prefix.unwrap_or(true);
        if add_bos && bos.is_none() {
            return Err(TextError::Tokenizer("add_bos_token is true, but no BOS token is set".into()));
        }
        if add_eos && eos.is_none() {
            return Err(TextError::Tokenizer("add_eos_token is true, but no EOS token is set".into()));
        }

        // Auto-detected ids (llama.cpp: by text, when the metadata names none); such tokens become control.
        let detect = |given: Option<u32>, names: &[&str], kinds: &mut Vec<TokenKind>| -> Option<u32> {
            if let Some(id) = in_range(given) {
                return Some(id);
            }
            let id = names.iter().find_map(|t| token_to_id.get(*t).copied())?;
            if kinds[id as usize] != TokenKind::Control {
                kinds[id as usize] = TokenKind::Control;
            }
            Some(id)
        };
        let eot = detect(v.eot, EOT_TEXTS, &mut kinds);
        let eom = detect(v.eom, &["<|eom_id|>"], &mut kinds);
        detect(v.fim_pre, FIM_PRE, &mut kinds);
        detect(v.fim_suf, FIM_SUF, &mut kinds);
        detect(v.fim_mid, FIM_MID, &mut kinds);
        let fim_pad = detect(v.fim_pad, FIM_PAD, &mut kinds);
        let fim_rep = detect(v.fim_rep, FIM_REP, &mut kinds);
        let fim_sep = detect(v.fim_sep, FIM_SEP, &mut kinds);

        let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for t in EOG_ALL {
            if let Some(&id) = token_to_id.get(*t) {
                eog.insert(id);
                kinds[id as usize] = TokenKind::Control;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        // gpt-oss / solar-open: `<|end|>` ends a message, not the generation.
        let has = |eog: &BTreeSet<u32>, t: &str| token_to_id.get(t).is_some_and(|id| eog.contains(id));
        let harmony =
            (has(&eog, "<|return|>") && has(&eog, "<|call|>")) || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>"));
        if harmony && has(&eog, "<|end|>") {
            let id = token_to_id["<|end|>"];
            eog.remove(&id);
            kinds[id as usize] = TokenKind::UserDefined;
        }
        // gemma4 / paddleocr: `</s>` is not an end of generation when `<|tool_response>` is one.
        if has(&eog, "<|tool_response>") && has(&eog, "</s>") {
            let id = token_to_id["</s>"];
            eog.remove(&id);
            kinds[id as usize] = TokenKind::Normal;
        }

        let specials = SpecialSplitter::new(
            kinds
                .iter()
                .enumerate()
                .filter(|(_, k)| matches!(k, TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown))
                .map(|(i, k)| (texts[i].clone(), i as u32, k.is_special()))
                .collect(),
        )?;

        let byte_dec = if is_bpe { Some(byte_level_decoder()) } else { None };
        let pieces: Vec<Vec<u8>> = texts
            .iter()
            .zip(&kinds)
            .map(|(t, k)| match k {
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown => t.as_bytes().to_vec(),
                TokenKind::Byte => parse_byte_token(t).map(|b| vec![b]).unwrap_or_default(),
                TokenKind::Unused | TokenKind::Undefined => Vec::new(),
                TokenKind::Normal => match &byte_dec {
                    Some(dec) => {
                        let mut out = Vec::with_capacity(t.len());
                        for c in t.chars() {
                            match dec.get(&c) {
                                Some(&b) => out.push(b),
                                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                            }
                        }
                        out
                    }
                    None => t.replace('\u{2581}', " ").into_bytes(),
                },
            })
            .collect();

        let engine = match pre {
            Some(spec) => {
                let merges = v
                    .merges
                    .as_deref()
                    .ok_or_else(|| TextError::Tokenizer("BPE vocabulary without tokenizer.ggml.merges".into()))?;
                let bpe = build_bpe(&texts, merges, &spec)?;
                let pretok = PreTokenizer::new(&spec.regexes)?;
                Engine::GgufBpe { specials, pretok, bpe: Box::new(bpe), unknown: n as u32 }
            }
            None => {
                let scores = v.scores.map(|mut s| {
                    s.truncate(n);
                    s
                });
                let spm = Spm::new(scores.unwrap_or_else(|| vec![0.0; n]), &token_to_id, unk);
                Engine::GgufSpm { specials, spm: Box::new(spm), add_space_prefix }
            }
        };

        Ok(Tokenizer {
            engine,
            kinds,
            texts,
            pieces,
            token_to_id,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            strip_leading_space: add_space_prefix,
            stop_ids: eog.into_iter().collect(),
            chat_template: v.chat_template,
        })
    }
}

/// Stands for characters that are not in a BPE vocabulary (no real token can spell it).
const UNKNOWN_SENTINEL: &str = "\u{10FFFF}tf-text:not-in-vocabulary\u{10FFFF}";

/// HF's BPE model over llama.cpp's vocabulary and merges.
///
/// Characters missing from the vocabulary must still separate their neighbours during merging and then
/// produce nothing (llama.cpp keeps them as symbols and drops them at the end), so they map to a sentinel
/// unknown token, id `texts.len()`, which the caller removes.
fn build_bpe(texts: &[String], merges: &[String], spec: &PreSpec) -> Result<BPE> {
    let mut vocab: AHashMap<String, u32> = texts.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut seen = ahash::AHashSet::with_capacity(merges.len());
    let mut pairs = Vec::with_capacity(merges.len());
    for m in merges {
        // llama.cpp splits at the first space after the first byte.
        let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else { continue };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        // A merge whose parts or result are no tokens can never apply usefully; HF refuses them.
        if !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&format!("{a}{b}")) {
            continue;
        }
        if seen.insert((a.to_string(), b.to_string())) {
            pairs.push((a.to_string(), b.to_string()));
        }
    }
    vocab.insert(UNKNOWN_SENTINEL.to_string(), texts.len() as u32);
    BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .unk_token(UNKNOWN_SENTINEL.to_string())
        .fuse_unk(false)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| TextError::Tokenizer(format!("building BPE: {e}")))
}

/// GPT-2's byte-to-character table: the character that stands for each byte in byte-level BPE.
pub(crate) fn byte_level_encoder() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = ['\0'; 256];
        for (c, b) in byte_level_decoder() {
            t[b as usize] = c;
        }
        t
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level vocabulary: the 256 byte characters, some merges, and chat control tokens.
    pub(crate) fn tiny_bpe(pre: &str) -> GgufVocab {
        let dec = byte_level_decoder();
        let mut by_byte: Vec<(u8, char)> = dec.iter().map(|(&c, &b)| (b, c)).collect();
        by_byte.sort();
        let mut tokens: Vec<String> = by_byte.iter().map(|(_, c)| c.to_string()).collect();
        let merges = ["Ġ w", "h e", "l l", "he ll", "hell o", "o r", "Ġw or", "l d", "Ġwor ld"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        let first_special = tokens.len() as u32;
        tokens.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"].map(String::from));
        let mut token_type = vec![1; tokens.len()];
        for t in &mut token_type[first_special as usize..first_special as usize + 3] {
            *t = 3;
        }
        *token_type.last_mut().unwrap() = 4;
        GgufVocab {
            model: "gpt2".into(),
            pre: Some(pre.into()),
            tokens,
            token_type: Some(token_type),
            merges: Some(merges.iter().map(|s| s.to_string()).collect()),
            bos: Some(first_special),
            eos: Some(first_special + 2),
            add_bos: Some(false),
            ..Default::default()
        }
    }

    #[test]
    fn bpe_encode_decode_and_specials() {
        let tok = Tokenizer::from_gguf_vocab(tiny_bpe("qwen2")).unwrap();
        let hello = tok.id_of("hello").unwrap();
        let world = tok.id_of("Ġworld").unwrap();
        let im_start = tok.id_of("<|im_start|>").unwrap();
        let tool = tok.id_of("<tool_call>").unwrap();
        assert_eq!(tok.encode("hello world", false, true).unwrap(), vec![hello, world]);
        assert_eq!(tok.encode("<|im_start|>hello", false, true).unwrap(), vec![im_start, hello]);
        // Control text stays text without parse_special; user-defined tokens are matched anyway.
        let plain = tok.encode("<|im_start|><tool_call>", false, false).unwrap();
        assert_eq!(plain.last(), Some(&tool));
        assert!(plain.len() > 2 && !plain.contains(&im_start));
        let ids = tok.encode("<|im_start|>hello world é😀<|im_end|>", false, true).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>hello world é😀<|im_end|>");
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello world é😀");
        let stops: Vec<&str> = tok.stop_ids().iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
        assert_eq!(stops, vec!["<|endoftext|>", "<|im_end|>"]);
        assert_eq!(tok.eot_id(), tok.id_of("<|im_end|>"));
    }

    #[test]
    fn unknown_model_and_pre_are_named() {
        let mut v = tiny_bpe("no-such-pre");
        let err = Tokenizer::from_gguf_vocab(v.clone()).unwrap_err().to_string();
        assert!(err.contains("\"no-such-pre\""), "{err}");
        v.model = "bert".into();
        let err = Tokenizer::from_gguf_vocab(v).unwrap_err().to_string();
        assert!(err.contains("\"bert\""), "{err}");
        // A name with a newline stays on one line, escaped.
        let mut v = tiny_bpe("qwen2");
        v.model = "g\nt2".into();
        let err = Tokenizer::from_gguf_vocab(v).unwrap_err().to_string();
        assert!(!err.contains('\n') && err.contains("\"g\\nt2\""), "{err}");
    }

    #[test]
    fn digits_are_split_per_pre() {
        let qwen = Tokenizer::from_gguf_vocab(tiny_bpe("qwen2")).unwrap();
        let smol = Tokenizer::from_gguf_vocab(tiny_bpe("smollm")).unwrap();
        let gpt2 = Tokenizer::from_gguf_vocab(tiny_bpe("gpt-2")).unwrap();
        // No digit merges exist, so every variant yields one id per byte; the split only matters
        // for correctness of offsets, which the round trip checks.
        for tok in [&qwen, &smol, &gpt2] {
            let ids = tok.encode("a 1234 b", false, false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), "a 1234 b");
        }
    }

    #[test]
    fn every_known_pre_compiles_and_round_trips() {
        for pre in [
            "default",
            "llama-bpe",
            "dbrx",
            "qwen2",
            "gpt-2",
            "smollm",
            "falcon",
            "deepseek-coder",
            "bloom",
            "viking",
            "gpt-4o",
            "tekken",
        ] {
            let mut v = tiny_bpe(pre);
            v.add_bos = None;
            let tok = Tokenizer::from_gguf_vocab(v).unwrap_or_else(|e| panic!("{pre}: {e}"));
            let text = "Hello World's 12345 straße 漢字!! \n\n  x";
            let ids = tok.encode(text, false, false).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "{pre}");
            // llama3-style pre-tokenizers add BOS by default.
            assert_eq!(tok.add_bos(), matches!(pre, "llama-bpe" | "tekken"), "{pre}");
        }
    }

    pub(crate) fn tiny_spm(add_space_prefix: Option<bool>) -> GgufVocab {
        let mut tokens: Vec<(String, f32, i32)> = vec![
            ("<unk>".into(), 0.0, 2),
            ("<s>".into(), 0.0, 3),
            ("</s>".into(), 0.0, 3),
            ("<start_of_turn>".into(), 0.0, 3),
            ("<end_of_turn>".into(), 0.0, 3),
        ];
        tokens.extend((0..256).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
        for (t, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("w", -2.0),
            ("r", -2.0),
            ("d", -2.0),
            ("he", -3.0),
            ("ll", -3.5),
            ("hell", -4.0),
            ("hello", -4.5),
            ("▁hello", -5.0),
            ("wo", -6.0),
            ("rld", -6.5),
            ("ld", -6.2),
            ("world", -7.0),
            ("▁world", -7.5),
        ] {
            tokens.push((t.into(), s, 1));
        }
        GgufVocab {
            model: "llama".into(),
            tokens: tokens.iter().map(|t| t.0.clone()).collect(),
            scores: Some(tokens.iter().map(|t| t.1).collect()),
            token_type: Some(tokens.iter().map(|t| t.2).collect()),
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            add_space_prefix,
            ..Default::default()
        }
    }

    #[test]
    fn spm_space_prefix_and_bos() {
        let tok = Tokenizer::from_gguf_vocab(tiny_spm(None)).unwrap();
        let (h, w) = (tok.id_of("▁hello").unwrap(), tok.id_of("▁world").unwrap());
        assert_eq!(tok.encode("hello world", true, true).unwrap(), vec![1, h, w]);
        assert_eq!(tok.decode(&[h, w], false).unwrap(), "hello world");
        let sot = tok.id_of("<start_of_turn>").unwrap();
        // After a special token the next text gets the prefix space again (llama.cpp).
        assert_eq!(tok.encode("<start_of_turn>hello", false, true).unwrap(), vec![sot, h]);
        let no_prefix = Tokenizer::from_gguf_vocab(tiny_spm(Some(false))).unwrap();
        let ids = no_prefix.encode("hello world", false, true).unwrap();
        assert_eq!(ids, vec![no_prefix.id_of("hello").unwrap(), w]);
        assert_eq!(no_prefix.decode(&ids, false).unwrap(), "hello world");
        // Characters outside the vocabulary fall back to bytes and decode back.
        let ids = no_prefix.encode("hé", false, true).unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(no_prefix.decode(&ids, false).unwrap(), "hé");
        let stops: Vec<&str> = tok.stop_ids().iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
        assert_eq!(stops, vec!["</s>", "<end_of_turn>"]);
    }
}
