//! Streaming detokenization: text is released only once it is final, so a client never sees half of a
//! UTF-8 sequence (e.g. an emoji spread over byte-fallback tokens) and the pieces add up to exactly what
//! one `decode` of all ids gives, including the first-token space handling of SentencePiece.
//!
//! Method: decode a short window of recent ids twice, without and with the unreleased ids, and release
//! the difference when the longer text does not end in U+FFFD (an incomplete sequence). The window
//! starts at the ids behind the last release, so whatever a decoder does at the start of a text
//! (dropping a prefix space) happens in both decodes and cancels out.

use crate::{Result, Tokenizer};

/// Turns ids, one at a time, into complete text. Not tied to one tokenizer borrow: pass the tokenizer
/// to each call (always the same one).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDetokenizer {
    skip_special: bool,
    /// Ids from the start of the current window.
    ids: Vec<u32>,
    /// `ids[..read]` has been released.
    read: usize,
}

impl IncrementalDetokenizer {
    /// `skip_special`: control tokens produce no text (as `decode(.., true)`).
    pub fn new(skip_special: bool) -> Self {
        Self { skip_special, ids: Vec::new(), read: 0 }
    }

    /// Adds one id; returns the text that became final (often empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[..self.read], self.skip_special)?;
        let full = tok.decode(&self.ids, self.skip_special)?;
        if full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        if full.len() <= prefix.len() {
            // Nothing visible yet (e.g. a skipped special token): keep the window start.
            self.read = self.ids.len();
            return Ok(String::new());
        }
        let out = new_suffix(&prefix, &full);
        // The next window starts at the ids just released.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        Ok(out)
    }

    /// Adds several ids; returns the text that became final.
    pub fn push_all(&mut self, tok: &Tokenizer, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(tok, id)?);
        }
        Ok(out)
    }

    /// Releases whatever is held back (an incomplete sequence becomes U+FFFD) and resets the window.
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        if self.read >= self.ids.len() {
            return Ok(String::new());
        }
        let prefix = tok.decode(&self.ids[..self.read], self.skip_special)?;
        let full = tok.decode(&self.ids, self.skip_special)?;
        let out = new_suffix(&prefix, &full);
        self.ids.clear();
        self.read = 0;
        Ok(out)
    }

    /// Whether ids are held back waiting for more.
    pub fn has_pending(&self) -> bool {
        self.read < self.ids.len()
    }
}

/// `full` minus `prefix`; if a decoder rewrote the shared part, everything after the common prefix.
fn new_suffix(prefix: &str, full: &str) -> String {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest.to_string();
    }
    let common = prefix.char_indices().zip(full.chars()).take_while(|((_, a), b)| a == b).count();
    full.chars().skip(common).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf_vocab::tests::{tiny_bpe, tiny_spm};

    const STRINGS: &[&str] = &[
        "hello world",
        " hello  world ",
        "héllo wörld 😀🎉 漢字",
        "<start_of_turn>hello<end_of_turn>\n",
        "<|im_start|>hello<|im_end|> world",
        "a😀b",
        "   ",
        "",
        "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467} family",
    ];

    fn check(tok: &Tokenizer) {
        for s in STRINGS {
            for skip in [false, true] {
                let ids = tok.encode(s, false, true).unwrap();
                let want = tok.decode(&ids, skip).unwrap();
                let mut d = IncrementalDetokenizer::new(skip);
                let mut got = String::new();
                for &id in &ids {
                    let piece = d.push(tok, id).unwrap();
                    assert!(!piece.contains('\u{FFFD}'), "{s:?}: broken piece {piece:?}");
                    got.push_str(&piece);
                }
                got.push_str(&d.finish(tok).unwrap());
                assert_eq!(got, want, "{s:?} skip={skip}");
            }
        }
    }

    #[test]
    fn increments_add_up_spm() {
        check(&Tokenizer::from_gguf_vocab(tiny_spm(None)).unwrap());
        check(&Tokenizer::from_gguf_vocab(tiny_spm(Some(false))).unwrap());
    }

    #[test]
    fn increments_add_up_bpe() {
        check(&Tokenizer::from_gguf_vocab(tiny_bpe("qwen2")).unwrap());
    }

    #[test]
    fn holds_back_split_emoji() {
        let tok = Tokenizer::from_gguf_vocab(tiny_spm(Some(false))).unwrap();
        let ids = tok.encode("😀", false, false).unwrap();
        assert_eq!(ids.len(), 4);
        let mut d = IncrementalDetokenizer::new(false);
        for &id in &ids[..3] {
            assert_eq!(d.push(&tok, id).unwrap(), "");
        }
        assert!(d.has_pending());
        assert_eq!(d.push(&tok, ids[3]).unwrap(), "😀");
        // Cut short: finish releases the replacement character.
        let mut d = IncrementalDetokenizer::new(false);
        d.push_all(&tok, &ids[..2]).unwrap();
        assert_eq!(d.finish(&tok).unwrap(), "\u{FFFD}");
    }
}
