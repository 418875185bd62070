//! Stop strings over streamed text: holds back the tail that could still become a stop string, and cuts the
//! text before the first stop string that appears (the stop string itself is not part of the reply).

/// Streams text through a set of stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopFilter {
    /// The stop strings (none empty).
    stops: Vec<String>,
    /// Text received but not yet released: it may be the start of a stop string.
    pending: String,
    /// Set once a stop string was seen; nothing is released after it.
    hit: bool,
}

impl StopFilter {
    /// Panics on an empty stop string (callers validate: an empty one would end every reply at once).
    pub fn new(stops: Vec<String>) -> StopFilter {
        assert!(stops.iter().all(|s| !s.is_empty()), "empty stop string");
        StopFilter { stops, pending: String::new(), hit: false }
    }

    /// Whether a stop string was seen.
    pub fn is_hit(&self) -> bool {
        self.hit
    }

    /// Adds text; returns what is safe to release now and whether a stop string was hit (then the text from
    /// the stop string on is dropped, and every later push returns nothing).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.hit {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_owned();
            self.pending.clear();
            self.hit = true;
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (end, _) in s.char_indices().skip(1) {
                if end > keep && self.pending.ends_with(&s[..end]) {
                    keep = end;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_owned();
        self.pending.drain(..cut);
        (out, false)
    }

    /// The reply ended without a stop string: releases what was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `text` into pieces releases the same text as a one-shot search.
    fn stream(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        let mut hit = false;
        for p in pieces {
            let (t, h) = f.push(p);
            out.push_str(&t);
            hit |= h;
        }
        if !hit {
            out.push_str(&f.finish());
        }
        (out, hit)
    }

    fn reference(stops: &[&str], text: &str) -> (String, bool) {
        match stops.iter().filter_map(|s| text.find(s)).min() {
            Some(at) => (text[..at].to_string(), true),
            None => (text.to_string(), false),
        }
    }

    #[test]
    fn any_split_matches_the_one_shot_search() {
        let texts = ["hello world\n\nUser: hi", "no stop here", "aaab", "ééé stop é", "x</s>y</s>", "Use"];
        let stops: &[&[&str]] = &[&["\n\nUser:"], &["ab", "stop"], &["</s>"], &["é s"], &["User", "Use"]];
        for text in texts {
            for st in stops {
                let chars: Vec<(usize, char)> = text.char_indices().collect();
                // Every split into two and three pieces at char boundaries.
                for i in 0..=chars.len() {
                    for j in i..=chars.len() {
                        let b = |k: usize| if k == chars.len() { text.len() } else { chars[k].0 };
                        let pieces = [&text[..b(i)], &text[b(i)..b(j)], &text[b(j)..]];
                        assert_eq!(stream(st, &pieces), reference(st, text), "{text:?} {st:?} {pieces:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn holds_back_only_a_possible_stop_prefix() {
        let mut f = StopFilter::new(vec!["STOP".into()]);
        assert_eq!(f.push("abc S"), ("abc ".to_string(), false));
        assert_eq!(f.push("x"), ("Sx".to_string(), false));
        assert_eq!(f.push("ST"), (String::new(), false));
        assert_eq!(f.push("OP and more"), (String::new(), true));
        assert!(f.is_hit());
        assert_eq!(f.push("later"), (String::new(), true));
    }
}
