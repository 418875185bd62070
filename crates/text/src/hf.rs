//! Building a [`Tokenizer`] from HF files: `tokenizer.json` drives encoding and decoding as in
//! `transformers`; `tokenizer_config.json` names the special tokens, the BOS/EOS flags and the chat
//! template; `generation_config.json` may add end-of-generation ids.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value as Json;

use crate::gguf_vocab::{byte_level_decoder, parse_byte_token, EOG_ALL, EOT_TEXTS};
use crate::tokenizer::{Engine, TokenKind, Tokenizer};
use crate::{Result, TextError};

/// A special-token entry of `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_text(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(m) => m.get("content").and_then(|c| c.as_str()).map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of `{name, template}` (the one
/// named "default", else the first).
fn chat_template(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |n: &str| list.iter().find(|e| e.get("name").and_then(|x| x.as_str()) == Some(n));
            named("default")
                .or_else(|| list.first())
                .and_then(|e| e.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_owned)
        }
        _ => None,
    }
}

/// Whether a JSON tree has an object with `"type": ty` anywhere.
fn has_type(v: &Json, ty: &str) -> bool {
    match v {
        Json::Object(m) => m.get("type").and_then(|t| t.as_str()) == Some(ty) || m.values().any(|x| has_type(x, ty)),
        Json::Array(a) => a.iter().any(|x| has_type(x, ty)),
        _ => false,
    }
}

pub(crate) fn build_hf(tokenizer_json: &[u8], config: Option<&Json>, generation_eos: &[u32]) -> Result<Tokenizer> {
    let raw: Json = serde_json::from_slice(tokenizer_json)
        .map_err(|e| TextError::Tokenizer(format!("tokenizer.json is not JSON: {e}")))?;
    let full = tokenizers::Tokenizer::from_bytes(tokenizer_json)
        .map_err(|e| TextError::Tokenizer(format!("tokenizer.json: {e}")))?;
    let mut plain = full.clone();
    plain.set_encode_special_tokens(true);

    let vocab = full.get_vocab(true);
    let n = vocab.values().map(|&i| i as usize + 1).max().unwrap_or(0);
    let mut texts = vec![String::new(); n];
    for (t, &i) in &vocab {
        texts[i as usize] = t.clone();
    }
    let token_to_id: HashMap<String, u32> = vocab;

    let model = raw.get("model").cloned().unwrap_or(Json::Null);
    let byte_fallback = model.get("byte_fallback").and_then(|b| b.as_bool()).unwrap_or(false);
    let decoder = raw.get("decoder").cloned().unwrap_or(Json::Null);
    let byte_level = has_type(&decoder, "ByteLevel");
    let metaspace = has_type(&decoder, "Metaspace") || decoder.to_string().contains('\u{2581}');

    let mut kinds = vec![TokenKind::Normal; n];
    for (i, t) in texts.iter().enumerate() {
        if byte_fallback && parse_byte_token(t).is_some() {
            kinds[i] = TokenKind::Byte;
        }
    }
    for (id, added) in full.get_added_tokens_decoder() {
        if let Some(k) = kinds.get_mut(id as usize) {
            *k = if added.special { TokenKind::Control } else { TokenKind::UserDefined };
        }
    }

    let lookup = |t: Option<String>| t.and_then(|t| token_to_id.get(&t).copied());
    let cfg = |k: &str| config.and_then(|c| c.get(k));
    let bos = lookup(token_text(cfg("bos_token")));
    let eos = lookup(token_text(cfg("eos_token")));
    let unk = lookup(token_text(cfg("unk_token")))
        .or_else(|| lookup(model.get("unk_token").and_then(|u| u.as_str()).map(str::to_owned)));
    let pad = lookup(token_text(cfg("pad_token")));
    if let Some(u) = unk {
        kinds[u as usize] = TokenKind::Unknown;
    }

    // Explicit add_bos_token/add_eos_token win over the post-processor (transformers rebuilds it from them).
    let flag = |k: &str| cfg(k).and_then(|v| v.as_bool());
    let manual_specials = flag("add_bos_token").is_some() || flag("add_eos_token").is_some();
    let (add_bos, add_eos) = if manual_specials {
        (
            flag("add_bos_token").unwrap_or(false) && bos.is_some(),
            flag("add_eos_token").unwrap_or(false) && eos.is_some(),
        )
    } else {
        let probe = full.encode_fast("", true).map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let ids = probe.get_ids();
        (bos.is_some() && ids.first().copied() == bos, eos.is_some() && ids.last().copied() == eos)
    };

    let byte_dec = byte_level_decoder();
    let pieces: Vec<Vec<u8>> = texts
        .iter()
        .zip(&kinds)
        .map(|(t, k)| match k {
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown => t.as_bytes().to_vec(),
            TokenKind::Byte => parse_byte_token(t).map(|b| vec![b]).unwrap_or_default(),
            TokenKind::Unused | TokenKind::Undefined => Vec::new(),
            TokenKind::Normal if byte_level => {
                let mut out = Vec::with_capacity(t.len());
                for c in t.chars() {
                    match byte_dec.get(&c) {
                        Some(&b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
            TokenKind::Normal if metaspace => t.replace('\u{2581}', " ").into_bytes(),
            TokenKind::Normal => t.as_bytes().to_vec(),
        })
        .collect();

    let control = |t: &&str| token_to_id.get(*t).filter(|&&i| kinds[i as usize] == TokenKind::Control).copied();
    let eot = EOT_TEXTS.iter().find_map(control);
    let eom = control(&"<|eom_id|>");
    let mut stops: BTreeSet<u32> = EOG_ALL.iter().filter_map(control).collect();
    stops.extend([eos, eot, eom].into_iter().flatten());
    stops.extend(generation_eos.iter().copied().filter(|&i| (i as usize) < n));
    // Harmony (gpt-oss): `<|end|>` ends a message, not the generation (as the GGUF vocabulary decides).
    let stop = |t: &str| token_to_id.get(t).filter(|id| stops.contains(id)).copied();
    if let (Some(_), Some(_), Some(end)) = (stop("<|return|>"), stop("<|call|>"), stop("<|end|>")) {
        if !generation_eos.contains(&end) {
            stops.remove(&end);
        }
    }

    Ok(Tokenizer {
        engine: Engine::Hf { full: Box::new(full), plain: Box::new(plain), manual_specials },
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
        strip_leading_space: false,
        stop_ids: stops.into_iter().collect(),
        chat_template: chat_template(cfg("chat_template")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A tiny byte-level BPE tokenizer.json with ChatML added tokens.
    fn tiny_json() -> Vec<u8> {
        let dec = byte_level_decoder();
        let mut by_byte: Vec<(u8, char)> = dec.iter().map(|(&c, &b)| (b, c)).collect();
        by_byte.sort();
        let mut vocab = serde_json::Map::new();
        for (i, (_, c)) in by_byte.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        vocab.insert("he".into(), json!(256));
        vocab.insert("<|im_start|>".into(), json!(257));
        vocab.insert("<|im_end|>".into(), json!(258));
        let tj = json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 257, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 258, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": [["h", "e"]]}
        });
        serde_json::to_vec(&tj).unwrap()
    }

    #[test]
    fn hf_json_encode_decode_specials() {
        let cfg = json!({"eos_token": "<|im_end|>", "bos_token": null, "chat_template": "{{ messages }}"});
        let tok = Tokenizer::from_hf_json(&tiny_json(), Some(&cfg), &[]).unwrap();
        let ids = tok.encode("<|im_start|>hello<|im_end|>", true, true).unwrap();
        assert_eq!(ids[0], 257);
        assert_eq!(ids[1], 256);
        assert_eq!(*ids.last().unwrap(), 258);
        let plain = tok.encode("<|im_start|>", false, false).unwrap();
        assert!(!plain.contains(&257), "{plain:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>hello<|im_end|>");
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello");
        assert_eq!(tok.token_to_piece(256), b"he");
        assert_eq!(tok.stop_ids(), &[258]);
        assert_eq!(tok.eot_id(), Some(258));
        assert!(!tok.add_bos());
        assert_eq!(tok.chat_template(), Some("{{ messages }}"));
    }

    #[test]
    fn manual_bos_flag() {
        let cfg = json!({"bos_token": {"content": "<|im_start|>"}, "add_bos_token": true});
        let tok = Tokenizer::from_hf_json(&tiny_json(), Some(&cfg), &[5]).unwrap();
        assert_eq!(tok.encode("he", true, false).unwrap(), vec![257, 256]);
        assert_eq!(tok.encode("he", false, false).unwrap(), vec![256]);
        assert!(tok.is_stop(5));
    }
}
