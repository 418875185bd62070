//! llama.cpp's BPE pre-tokenization: a chain of regexes, each splitting the pieces of the previous one
//! (matches and the gaps between them both become pieces).
//!
//! llama.cpp does not run these regexes over the text itself. It classifies each code point with its own
//! Unicode tables (letter, number, punctuation, mark, symbol, other; whitespace first) and matches over
//! that classification: hand-written matchers for the GPT-2 and Llama-3 patterns, `std::regex` over one
//! placeholder byte per class for the rest. We do the same: every non-ASCII code point is replaced by a
//! fixed representative of its class (`ª` letter, `²` number, `¡` punctuation, U+0300 mark, `¢` symbol,
//! U+2000 whitespace, U+E000 anything else), the regexes run over that stand-in text with Oniguruma, and
//! the pieces are cut from the original text at the same code point offsets. Classes come from the
//! Unicode tables of `regex-syntax`, restricted to the Unicode version of llama.cpp's tables, so that
//! newer or older Oniguruma tables cannot move a code point between classes.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};
use tokenizers::utils::SysRegex;

use crate::{Result, TextError};

/// The Unicode version of llama.cpp's class tables (as built into llama-cpp-python 0.3.36, the fixtures'
/// reference): code points assigned later count as unassigned.
const UNICODE_VERSION: &str = "15.1";

/// (first, last, representative) for every non-ASCII code point with a class, sorted.
fn class_table() -> &'static [(u32, u32, char)] {
    static TABLE: OnceLock<Vec<(u32, u32, char)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Vec::new();
        for (prop, rep) in [("L", 'ª'), ("N", '²'), ("P", '¡'), ("M", '\u{300}'), ("S", '¢')] {
            let hir = regex_syntax::ParserBuilder::new()
                .build()
                .parse(&format!(r"[\p{{{prop}}}&&\p{{Age={UNICODE_VERSION}}}]"))
                .expect("a Unicode general category parses");
            let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
                unreachable!("\\p{{{prop}}} is a Unicode class")
            };
            for r in class.ranges() {
                let (lo, hi) = (u32::from(r.start()).max(0x80), u32::from(r.end()));
                if lo <= hi {
                    table.push((lo, hi, rep));
                }
            }
        }
        table.sort_unstable();
        table
    })
}

/// The stand-in for one code point (ASCII stays itself).
fn representative(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    if c.is_whitespace() {
        return '\u{2000}';
    }
    let cp = u32::from(c);
    let table = class_table();
    let i = table.partition_point(|&(lo, _, _)| lo <= cp);
    match i.checked_sub(1).map(|i| table[i]) {
        Some((lo, hi, rep)) if lo <= cp && cp <= hi => rep,
        _ => '\u{E000}',
    }
}

/// A compiled regex chain.
pub(crate) struct PreTokenizer {
    regexes: Vec<SysRegex>,
}

impl PreTokenizer {
    pub(crate) fn new(patterns: &[&str]) -> Result<Self> {
        let regexes = patterns
            .iter()
            .map(|p| SysRegex::new(p).map_err(|e| TextError::Tokenizer(format!("pre-tokenizer regex {p:?}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { regexes })
    }

    /// Splits `text` into pre-tokens (non-empty, in order, covering all of `text`).
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        if text.is_empty() {
            return Vec::new();
        }
        // The stand-in text, and for each of its char boundaries the matching original byte offset.
        let mut stand_in = String::with_capacity(text.len());
        let mut to_orig: Vec<(usize, usize)> = Vec::with_capacity(text.len() + 1);
        for (pos, c) in text.char_indices() {
            to_orig.push((stand_in.len(), pos));
            stand_in.push(representative(c));
        }
        to_orig.push((stand_in.len(), text.len()));
        let orig = |s: usize| -> usize {
            let i = to_orig.partition_point(|&(si, _)| si < s);
            to_orig[i].1
        };

        // Pieces as byte ranges of the stand-in text.
        let mut pieces = vec![(0, stand_in.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for (start, end) in pieces {
                let mut last = start;
                for (ms, me) in re.find_iter(&stand_in[start..end]) {
                    let (ms, me) = (start + ms, start + me);
                    if ms == me {
                        continue;
                    }
                    if ms > last {
                        next.push((last, ms));
                    }
                    next.push((ms, me));
                    last = me;
                }
                if last < end {
                    next.push((last, end));
                }
            }
            pieces = next;
        }
        pieces.into_iter().map(|(s, e)| &text[orig(s)..orig(e)]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

    #[test]
    fn gpt2_splits() {
        let p = PreTokenizer::new(&[GPT2]).unwrap();
        assert_eq!(p.split("Hello world's  end!!\n"), vec!["Hello", " world", "'s", " ", " end", "!!", "\n"]);
        assert_eq!(p.split("héllo 漢字 ½x"), vec!["héllo", " 漢字", " ½", "x"]);
        assert!(p.split("").is_empty());
    }

    #[test]
    fn digits_then_gpt2() {
        let p = PreTokenizer::new(&[r"\p{N}", GPT2]).unwrap();
        assert_eq!(p.split("a 12b"), vec!["a", " ", "1", "2", "b"]);
    }

    #[test]
    fn classes_follow_llama_cpp_unicode_version() {
        // Unicode 15.1 letters count; Unicode 16 additions (Egyptian Hieroglyphs Extended-A) do not.
        assert_eq!(representative('\u{2EBF0}'), 'ª');
        assert_eq!(representative('\u{13663}'), '\u{E000}');
        assert_eq!(representative('é'), 'ª');
        assert_eq!(representative('٣'), '²');
        assert_eq!(representative('。'), '¡');
        assert_eq!(representative('\u{301}'), '\u{300}');
        assert_eq!(representative('€'), '¢');
        assert_eq!(representative('\u{3000}'), '\u{2000}');
        assert_eq!(representative('\u{200D}'), '\u{E000}');
        assert_eq!(representative('\u{926BB}'), '\u{E000}');
    }
}
