//! SentencePiece-style merging as llama.cpp does it for `tokenizer.ggml.model = "llama"` vocabularies:
//! start from single characters and repeatedly merge the adjacent pair whose concatenation is a vocabulary
//! token with the highest score (ties: leftmost pair first); characters that end up in no token are
//! written as byte tokens `<0xNN>`.
//!
//! This is deliberately not HF's BPE over score-derived merges: ties and multi-way splits of a token can
//! order merges differently there, and the goal is the exact ids llama.cpp produces.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// Scores and byte-fallback ids; token lookups go through the tokenizer's text-to-id map.
#[derive(Debug, Clone)]
pub(crate) struct Spm {
    scores: Vec<f32>,
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap pops the greatest: the higher score, then the smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm {
    /// `scores[i]` is token i's score; byte tokens are found as `<0xNN>` (or, for ASCII, the character
    /// itself) in `token_to_id`.
    pub(crate) fn new(scores: Vec<f32>, token_to_id: &HashMap<String, u32>, unk: Option<u32>) -> Self {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = token_to_id.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                if b < 128 {
                    token_to_id.get(&char::from(b as u8).to_string()).copied()
                } else {
                    None
                }
            });
        }
        Self { scores, byte_ids, unk }
    }

    /// Appends the ids of `text` (spaces already escaped as U+2581) to `out`.
    pub(crate) fn encode(&self, text: &str, token_to_id: &HashMap<String, u32>, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let len = c.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: if start + len == text.len() { None } else { Some(i + 1) },
            });
        }
        let mut heap = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.push_bigram(text, token_to_id, &symbols, i - 1, i, &mut heap);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            // Skip pairs that went stale: one side merged away or grew.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bg.left);
            }
            if let Some(p) = symbols[bg.left].prev {
                self.push_bigram(text, token_to_id, &symbols, p, bg.left, &mut heap);
            }
            if let Some(n) = symbols[bg.left].next {
                self.push_bigram(text, token_to_id, &symbols, bg.left, n, &mut heap);
            }
        }
        let mut cur = Some(0);
        while let Some(i) = cur {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            cur = s.next;
        }
    }

    fn push_bigram(
        &self,
        text: &str,
        token_to_id: &HashMap<String, u32>,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        heap: &mut BinaryHeap<Bigram>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let size = l.len + r.len;
        let piece = &text[l.start..l.start + size];
        if let Some(&id) = token_to_id.get(piece) {
            if let Some(&score) = self.scores.get(id as usize) {
                heap.push(Bigram { score, left, right, size });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> (HashMap<String, u32>, Vec<f32>) {
        let mut map = HashMap::new();
        let mut scores = Vec::new();
        for (i, (t, s)) in tokens.iter().enumerate() {
            map.insert(t.to_string(), i as u32);
            scores.push(*s);
        }
        (map, scores)
    }

    #[test]
    fn merges_by_score_then_leftmost() {
        let (map, scores) = vocab(&[("a", 0.0), ("b", 0.0), ("ab", -1.0), ("ba", -0.5), ("aba", -0.1)]);
        let spm = Spm::new(scores, &map, None);
        let mut out = Vec::new();
        // "ba" (-0.5) beats "ab" (-1.0): a|ba -> then "aba" exists: a+ba -> aba
        spm.encode("aba", &map, &mut out);
        assert_eq!(out, vec![4]);
        out.clear();
        // equal scores: leftmost first. "abab": bigrams ab(0,1) ba(1,2) ab(2,3); ba wins -> a|ba|b
        // then a+ba=aba (-0.1) -> aba|b
        spm.encode("abab", &map, &mut out);
        assert_eq!(out, vec![4, 1]);
    }

    #[test]
    fn byte_fallback_for_unknown_chars() {
        let mut toks: Vec<(String, f32)> = (0..256).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect();
        toks.push(("h".into(), -1.0));
        let refs: Vec<(&str, f32)> = toks.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let (map, scores) = vocab(&refs);
        let spm = Spm::new(scores, &map, None);
        let mut out = Vec::new();
        spm.encode("hé", &map, &mut out);
        assert_eq!(out, vec![256, 0xC3, 0xA9]);
    }
}
