//! From GGUF metadata to `tf-text`: the `tokenizer.ggml.*` keys read into a [`GgufVocab`], and the
//! [`Tokenizer`] built from it (which reproduces llama.cpp's tokenization of the same file).

use tf_loader::gguf::Metadata;
use tf_text::{GgufVocab, Tokenizer};

const P: &str = "tokenizer.ggml.";

fn key(name: &str) -> String {
    format!("{P}{name}")
}

/// A token id key; ids beyond u32 are an error, absent keys are `None`.
fn id(md: &Metadata, name: &str) -> Result<Option<u32>, String> {
    match md.get(&key(name)) {
        None => Ok(None),
        Some(_) => match md.get_u64(&key(name)) {
            Some(v) => u32::try_from(v).map(Some).map_err(|_| format!("{P}{name} = {v} is not a token id")),
            None => Err(format!("{P}{name} is not a non-negative integer")),
        },
    }
}

/// A boolean key; present with another type is an error.
fn flag(md: &Metadata, name: &str) -> Result<Option<bool>, String> {
    match md.get(&key(name)) {
        None => Ok(None),
        Some(_) => md.get_bool(&key(name)).map(Some).ok_or_else(|| format!("{P}{name} is not a boolean")),
    }
}

/// Reads the tokenizer metadata of a GGUF file.
pub fn vocab_from_gguf(md: &Metadata) -> Result<GgufVocab, String> {
    let model = md
        .get_str(&key("model"))
        .ok_or_else(|| format!("this GGUF has no {P}model (no tokenizer in the file)"))?
        .to_string();
    let tokens =
        md.get_str_array(&key("tokens")).ok_or_else(|| format!("this GGUF has no {P}tokens string array"))?.to_vec();
    let scores = match md.get(&key("scores")) {
        None => None,
        Some(_) => Some(match (md.get_f32_array(&key("scores")), md.get_i32_array(&key("scores"))) {
            (Some(f), _) => f.to_vec(),
            (None, Some(i)) => i.iter().map(|&x| x as f32).collect(),
            (None, None) => return Err(format!("{P}scores is not an f32 or i32 array")),
        }),
    };
    let token_type = match md.get(&key("token_type")) {
        None => None,
        Some(_) => Some(
            md.get_i32_array(&key("token_type")).ok_or_else(|| format!("{P}token_type is not an i32 array"))?.to_vec(),
        ),
    };
    let merges = match md.get(&key("merges")) {
        None => None,
        Some(_) => {
            Some(md.get_str_array(&key("merges")).ok_or_else(|| format!("{P}merges is not a string array"))?.to_vec())
        }
    };
    let chat_template = match md.get("tokenizer.chat_template") {
        None => None,
        Some(_) => {
            Some(md.get_str("tokenizer.chat_template").ok_or("tokenizer.chat_template is not a string")?.to_string())
        }
    };
    let pre = match md.get(&key("pre")) {
        None => None,
        Some(_) => Some(md.get_str(&key("pre")).ok_or_else(|| format!("{P}pre is not a string"))?.to_string()),
    };
    Ok(GgufVocab {
        model,
        pre,
        tokens,
        scores,
        token_type,
        merges,
        bos: id(md, "bos_token_id")?,
        eos: id(md, "eos_token_id")?,
        eot: id(md, "eot_token_id")?,
        eom: id(md, "eom_token_id")?,
        unk: id(md, "unknown_token_id")?,
        pad: id(md, "padding_token_id")?,
        // llama.cpp's key is spelled this way.
        sep: id(md, "seperator_token_id")?,
        mask: id(md, "mask_token_id")?,
        // The deprecated keys are read after the new ones by llama.cpp, so they win.
        fim_pre: id(md, "prefix_token_id")?.or(id(md, "fim_pre_token_id")?),
        fim_suf: id(md, "suffix_token_id")?.or(id(md, "fim_suf_token_id")?),
        fim_mid: id(md, "middle_token_id")?.or(id(md, "fim_mid_token_id")?),
        fim_pad: id(md, "fim_pad_token_id")?,
        fim_rep: id(md, "fim_rep_token_id")?,
        fim_sep: id(md, "fim_sep_token_id")?,
        add_bos: flag(md, "add_bos_token")?,
        add_eos: flag(md, "add_eos_token")?,
        add_space_prefix: flag(md, "add_space_prefix")?,
        chat_template,
    })
}

/// The tokenizer of a GGUF file.
pub fn tokenizer_from_gguf(md: &Metadata) -> Result<Tokenizer, String> {
    let vocab = vocab_from_gguf(md)?;
    Tokenizer::from_gguf_vocab(vocab).map_err(|e| e.to_string())
}
