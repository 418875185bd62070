//! "Context copies": when the text being written already occurs in the context (code being edited, quoted
//! passages, repeated structure), propose the tokens that followed the earlier occurrence.
//!
//! Matching: the longest suffix of the context (`max_n` tokens down to `min_n`) that occurred before; each
//! earlier occurrence (most recent first) yields a candidate chain, the tokens that followed it. A chain that
//! runs into the end of the context continues by copying itself (a repeating pattern keeps repeating), so
//! every chain can fill the budget. Up to `max_candidates` distinct chains are merged into one tree (shared
//! prefixes merged), then cut to the budget best-first: a node added by the `r`-th chain (0-based) at depth `d`
//! has priority `d·(r + 1)`, so the best chain gets the most depth and alternatives a shallower share.
//!
//! The index maps each n-gram (n in `min_n..=max_n`) to its most recent end positions, updated only for
//! tokens appended since the last call. A context that is not a continuation of the indexed one (shorter, or
//! different in the last [`TAIL_CHECK`] indexed tokens or the first token) is re-indexed from scratch; a change
//! elsewhere is not detected, so [`Proposer::reset`] must be called when a stream starts a new request. Every
//! candidate is checked against the context itself, so a stale index can only miss proposals, never produce
//! one that is not a real copy. Drafts never change the output anyway (they are verified).

use super::tree::DraftTree;
use super::Proposer;
use std::collections::HashMap;

/// Indexed tokens compared on every call to detect a context that is not a continuation of the indexed one.
pub const TAIL_CHECK: usize = 16;

/// Settings of an [`NgramProposer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest context suffix that may be matched (at least 1).
    pub min_n: usize,
    /// Longest context suffix tried first (at least `min_n`).
    pub max_n: usize,
    /// Most candidate chains merged into one tree (at least 1).
    pub max_candidates: usize,
    /// Most recent end positions remembered per n-gram (at least 1); older occurrences are forgotten.
    pub positions_per_gram: usize,
    /// Consecutive proposals with nothing accepted before going quiet; 0 = never go quiet.
    pub quiet_after: usize,
    /// Rounds of the first quiet period; each further one doubles, up to `max_backoff`. 0 = never go quiet.
    pub backoff: usize,
    /// Longest quiet period, in rounds.
    pub max_backoff: usize,
}

impl Default for NgramConfig {
    /// Suffixes of 5 down to 2 tokens, 3 candidates, 8 positions per n-gram, quiet after 3 fruitless
    /// proposals for 4, 8, … up to 64 rounds.
    fn default() -> Self {
        NgramConfig {
            min_n: 2,
            max_n: 5,
            max_candidates: 3,
            positions_per_gram: 8,
            quiet_after: 3,
            backoff: 4,
            max_backoff: 64,
        }
    }
}

/// The context-copies proposer (see the module docs). One per stream.
#[derive(Clone, Debug)]
pub struct NgramProposer {
    /// Settings, normalized by [`NgramProposer::new`].
    config: NgramConfig,
    /// [`gram_key`] → end positions (inclusive, ascending) of its most recent occurrences.
    index: HashMap<u64, Vec<u32>>,
    /// Length of the context prefix indexed so far.
    indexed: usize,
    /// Tokens indexed since creation, re-indexing included (work done; tests check it stays incremental).
    indexed_total: u64,
    /// The last (up to [`TAIL_CHECK`]) tokens of the indexed prefix, to detect a changed context.
    tail: Vec<u32>,
    /// The first token of the indexed prefix.
    head: Option<u32>,
    /// Consecutive observed proposals with nothing accepted.
    fruitless: usize,
    /// Rounds left in the current quiet period.
    quiet: usize,
    /// Length of the next quiet period.
    backoff: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        NgramProposer::new(NgramConfig::default())
    }
}

impl NgramProposer {
    /// A proposer with `config`, its values raised to their minimums (`min_n ≥ 1`, `max_n ≥ min_n`,
    /// `max_candidates ≥ 1`, `positions_per_gram ≥ 1`, `max_backoff ≥ backoff`).
    pub fn new(mut config: NgramConfig) -> NgramProposer {
        config.min_n = config.min_n.max(1);
        config.max_n = config.max_n.max(config.min_n);
        config.max_candidates = config.max_candidates.max(1);
        config.positions_per_gram = config.positions_per_gram.max(1);
        config.max_backoff = config.max_backoff.max(config.backoff);
        let backoff = config.backoff;
        NgramProposer {
            config,
            index: HashMap::new(),
            indexed: 0,
            indexed_total: 0,
            tail: Vec::new(),
            head: None,
            fruitless: 0,
            quiet: 0,
            backoff,
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &NgramConfig {
        &self.config
    }

    /// Rounds left in the current quiet period (0 = proposing).
    pub fn quiet_rounds(&self) -> usize {
        self.quiet
    }

    /// Brings the index up to date with `context`: appends new tokens, or starts over if `context` is not a
    /// continuation of what was indexed.
    fn sync(&mut self, context: &[u32]) {
        let continues = context.len() >= self.indexed
            && context.first().copied() == self.head
            && context[self.indexed - self.tail.len()..self.indexed] == self.tail[..];
        if !continues {
            self.index.clear();
            self.indexed = 0;
        }
        let (min_n, max_n, cap) = (self.config.min_n, self.config.max_n, self.config.positions_per_gram);
        for end in self.indexed..context.len() {
            for n in min_n..=max_n.min(end + 1) {
                let ends = self.index.entry(gram_key(&context[end + 1 - n..=end])).or_default();
                if ends.len() == cap {
                    ends.remove(0);
                }
                ends.push(end as u32);
            }
        }
        self.indexed_total += (context.len() - self.indexed) as u64;
        self.indexed = context.len();
        self.head = context.first().copied();
        self.tail.clear();
        self.tail.extend_from_slice(&context[context.len().saturating_sub(TAIL_CHECK)..]);
    }

    /// Length of the match behind the best candidate ([`NgramProposer::candidates`]' first chain): its
    /// suffix of `n` tokens, extended backwards while the context keeps agreeing with the earlier occurrence,
    /// up to [`MATCH_CAP`]. `None` when nothing matches. The index must be synced with `context`.
    fn match_len(&self, context: &[u32]) -> Option<usize> {
        let len = context.len();
        for n in (self.config.min_n..=self.config.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            let Some(ends) = self.index.get(&gram_key(suffix)) else { continue };
            let found = ends
                .iter()
                .rev()
                .map(|&e| e as usize)
                .find(|&end| end + 1 < len && end + 1 >= n && context[end + 1 - n..=end] == *suffix);
            if let Some(end) = found {
                // context[len − 1 − i] == context[end − i] for i < n; extend while it holds.
                let mut m = n;
                while m < MATCH_CAP && m <= end && context[len - 1 - m] == context[end - m] {
                    m += 1;
                }
                return Some(m);
            }
        }
        None
    }

    /// Candidate chains, best first: longest matched suffix first, then most recent occurrence; only chains
    /// that add a node to the tree so far count.
    fn candidates(&self, context: &[u32], max_tokens: usize) -> DraftTree {
        let len = context.len();
        let mut tree = DraftTree::new();
        let mut rank: Vec<u64> = Vec::new();
        let mut used: Vec<usize> = Vec::new();
        let mut chains = 0u64;
        'search: for n in (self.config.min_n..=self.config.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            let Some(ends) = self.index.get(&gram_key(suffix)) else { continue };
            for end in ends.iter().rev().map(|&e| e as usize) {
                // Skip the suffix itself, occurrences already used, and hash collisions.
                if end + 1 >= len || end + 1 < n || used.contains(&end) || context[end + 1 - n..=end] != *suffix {
                    continue;
                }
                used.push(end);
                if tree.merge_chain(&copy_after(context, end, max_tokens)) > 0 {
                    rank.resize(tree.len(), chains);
                    chains += 1;
                    if chains as usize == self.config.max_candidates {
                        break 'search;
                    }
                }
            }
        }
        tree.best_first(max_tokens, |i| tree.depth(i) as u64 * (rank[i] + 1))
    }
}

/// Longest match [`NgramProposer::match_len`] measures (a class boundary beyond any useful one).
const MATCH_CAP: usize = 64;

/// The class of a guess backed by a match of `len` tokens: `⌊log2 len⌋` (1 → 0, 2–3 → 1, 4–7 → 2, …, 64 → 6).
pub fn match_class(len: usize) -> usize {
    len.max(1).ilog2() as usize
}

/// The `k` tokens that followed position `end` of `context`, continuing by self-copy past its end: token `m`
/// is `context[end + 1 + m]`, or the chain's own token `end + 1 + m − len` once that runs past the context.
pub(super) fn copy_after(context: &[u32], end: usize, k: usize) -> Vec<u32> {
    let len = context.len();
    let mut chain = Vec::with_capacity(k);
    for m in 0..k {
        let at = end + 1 + m;
        let t = if at < len { context[at] } else { chain[at - len] };
        chain.push(t);
    }
    chain
}

/// Hash of an n-gram (its length included).
fn gram_key(gram: &[u32]) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    gram.iter().fold(mix(gram.len() as u64), |h, &t| mix(h ^ u64::from(t)).wrapping_add(0x9E37_79B9_7F4A_7C15))
}

impl Proposer for NgramProposer {
    fn name(&self) -> &'static str {
        "ngram"
    }

    /// Indexes new context tokens, then proposes unless quiet (a quiet round counts down and proposes
    /// nothing). Empty when `max_tokens` is 0, the context has fewer than 2 tokens, or nothing matches.
    fn propose(&mut self, context: &[u32], max_tokens: usize) -> DraftTree {
        self.sync(context);
        if self.quiet > 0 {
            self.quiet -= 1;
            return DraftTree::new();
        }
        if max_tokens == 0 {
            return DraftTree::new();
        }
        self.candidates(context, max_tokens)
    }

    /// Like [`Proposer::propose`], with the class (`match_class`) of the best match's length: a copy backed by a
    /// long match is accepted far more often than one backed by two tokens.
    fn propose_by_class(
        &mut self,
        context: &[u32],
        width: &mut dyn FnMut(usize) -> usize,
    ) -> (DraftTree, Option<usize>) {
        self.sync(context);
        if self.quiet > 0 {
            self.quiet -= 1;
            return (DraftTree::new(), None);
        }
        let Some(len) = self.match_len(context) else { return (DraftTree::new(), None) };
        let class = match_class(len);
        let k = width(class);
        let tree = if k > 0 { self.candidates(context, k) } else { DraftTree::new() };
        (tree, Some(class))
    }

    /// Any accepted token ends the streak of fruitless proposals and the back-off; `quiet_after` fruitless
    /// proposals in a row start a quiet period and double the next one. `proposed = 0` is ignored.
    fn observe(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        if accepted > 0 {
            self.fruitless = 0;
            self.backoff = self.config.backoff;
            return;
        }
        self.fruitless += 1;
        if self.config.quiet_after > 0 && self.fruitless >= self.config.quiet_after {
            self.quiet = self.backoff;
            self.backoff = self.backoff.saturating_mul(2).min(self.config.max_backoff);
            self.fruitless = 0;
        }
    }

    fn reset(&mut self) {
        *self = NgramProposer::new(self.config.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::Rng;

    fn proposer(max_candidates: usize) -> NgramProposer {
        NgramProposer::new(NgramConfig { max_candidates, ..NgramConfig::default() })
    }

    /// Token paths of every node of `t`.
    fn paths(t: &DraftTree) -> Vec<Vec<u32>> {
        (0..t.len()).map(|i| t.path_tokens(i)).collect()
    }

    #[test]
    fn copies_a_repeated_code_block_exactly() {
        // "fn f(x) { let y = x * 2; y + 1 }" as ids 100.., a different function, then the start of f again.
        let block: Vec<u32> = (100..140).collect();
        let mut ctx = block.clone();
        ctx.extend([7, 8, 9, 7, 8]);
        ctx.extend_from_slice(&block[..5]);
        let tree = proposer(3).propose(&ctx, 10);
        assert_eq!(tree, DraftTree::from_chain(&block[5..15]));
        // Past the end of the copied block the copy follows what came after it.
        let tree = proposer(1).propose(&ctx, 40);
        let want: Vec<u32> = block[5..].iter().copied().chain([7, 8, 9, 7, 8]).collect();
        assert_eq!(tree, DraftTree::from_chain(&want));
    }

    #[test]
    fn a_repeating_pattern_continues_past_the_context() {
        let ctx = [1, 2, 3, 1, 2, 3, 1, 2];
        assert_eq!(proposer(1).propose(&ctx, 7), DraftTree::from_chain(&[3, 1, 2, 3, 1, 2, 3]));
    }

    #[test]
    fn prefers_the_longest_suffix_then_the_most_recent() {
        // Suffix [1, 2, 3] occurred once (followed by 50); the shorter [2, 3] more recently (followed by 60).
        let ctx = [1, 2, 3, 50, 9, 9, 2, 3, 60, 9, 9, 1, 2, 3];
        let tree = proposer(1).propose(&ctx, 4);
        assert_eq!(tree, DraftTree::from_chain(&[50, 9, 9, 2]));
        let tree = proposer(2).propose(&ctx, 6);
        assert_eq!(tree.children(None).map(|c| tree.nodes()[c].token).collect::<Vec<_>>(), [50, 60]);
        // Priority d·(r + 1): the best chain gets depth 4, the alternative depth 2.
        let deepest =
            |first: u32| (0..tree.len()).filter(|&i| tree.path_tokens(i)[0] == first).map(|i| tree.depth(i)).max();
        assert_eq!((deepest(50), deepest(60)), (Some(4), Some(2)));
        // Same length: the most recent occurrence first.
        let ctx = [1, 2, 70, 5, 1, 2, 80, 5, 1, 2];
        assert_eq!(proposer(1).propose(&ctx, 2), DraftTree::from_chain(&[80, 5]));
        // Priorities 1, 2 (80 5) and 2 (70): equal priorities go to the better chain.
        assert_eq!(paths(&proposer(3).propose(&ctx, 2)), [vec![80], vec![80, 5]]);
        assert_eq!(paths(&proposer(3).propose(&ctx, 3)), [vec![80], vec![80, 5], vec![70]]);
    }

    #[test]
    fn nothing_to_copy() {
        let mut p = proposer(3);
        assert!(p.propose(&[], 8).is_empty());
        assert!(p.propose(&[4], 8).is_empty());
        assert!(p.propose(&[4, 4], 8).is_empty(), "min_n = 2 needs a 2-token match before the suffix");
        assert!(p.propose(&[1, 2, 3, 4, 5, 6], 8).is_empty());
        assert!(p.propose(&[1, 2, 1, 2], 0).is_empty());
        let mut one =
            NgramProposer::new(NgramConfig { min_n: 0, max_n: 0, max_candidates: 0, ..NgramConfig::default() });
        assert_eq!(one.config().min_n, 1);
        assert_eq!(one.propose(&[4, 4], 3), DraftTree::from_chain(&[4, 4, 4]));
    }

    #[test]
    fn goes_quiet_after_fruitless_rounds_and_backs_off() {
        let cfg = NgramConfig { quiet_after: 3, backoff: 2, max_backoff: 8, ..NgramConfig::default() };
        let mut p = NgramProposer::new(cfg);
        let mut ctx: Vec<u32> = [1, 2, 3].repeat(10);
        // Rounds of silence before the next proposal (each call is one round; the context keeps growing).
        fn silent_rounds(p: &mut NgramProposer, ctx: &mut Vec<u32>) -> usize {
            for n in 0..100 {
                ctx.push(ctx[ctx.len() - 3]);
                if !p.propose(ctx, 4).is_empty() {
                    return n;
                }
            }
            panic!("silent for 100 rounds");
        }
        let mut fruitless = |p: &mut NgramProposer, rounds: usize| -> Vec<usize> {
            let mut out = Vec::new();
            for _ in 0..rounds {
                out.push(silent_rounds(p, &mut ctx));
                p.observe(4, 0);
            }
            out
        };
        assert_eq!(fruitless(&mut p, 3), [0, 0, 0]);
        assert_eq!(p.quiet_rounds(), 2);
        // No proposal: ignored. Then quiet 2 rounds, then 4, 8, 8 (capped), each after 3 more fruitless proposals.
        p.observe(0, 0);
        assert_eq!(fruitless(&mut p, 3), [2, 0, 0]);
        assert_eq!(fruitless(&mut p, 3), [4, 0, 0]);
        assert_eq!(fruitless(&mut p, 3), [8, 0, 0]);
        assert_eq!(fruitless(&mut p, 1), [8]);
        // An acceptance resets the streak and the back-off.
        assert_eq!(fruitless(&mut p, 0), []);
        p.observe(4, 1);
        assert_eq!(fruitless(&mut p, 4), [0, 0, 0, 2]);
        p.reset();
        assert_eq!(p.quiet_rounds(), 0);
        assert_eq!(fruitless(&mut p, 4), [0, 0, 0, 2]);
        let mut never = NgramProposer::new(NgramConfig { quiet_after: 0, ..NgramConfig::default() });
        for _ in 0..10 {
            assert!(!never.propose(&[1, 2, 1, 2], 2).is_empty());
            never.observe(2, 0);
        }
    }

    #[test]
    fn long_context_is_indexed_once() {
        // 32k tokens of pseudo-text with a repeated passage: one full index, then one new token per round.
        let mut rng = Rng::new(7);
        let passage: Vec<u32> = (0..200).map(|_| rng.below(30_000) as u32).collect();
        let mut ctx: Vec<u32> = (0..32_000).map(|_| rng.below(30_000) as u32).collect();
        ctx.extend_from_slice(&passage);
        ctx.extend_from_slice(&passage[..10]);
        let start = ctx.len() as u64;
        let mut p = proposer(3);
        for i in 10..150 {
            assert_eq!(p.propose(&ctx, 8), DraftTree::from_chain(&passage[i..i + 8]));
            ctx.push(passage[i]);
        }
        assert_eq!(p.indexed_total, start + 139, "every token indexed once");
        // A context that is not a continuation is re-indexed from scratch.
        let at = ctx.len() - 2;
        ctx[at] ^= 1;
        p.propose(&ctx, 8);
        assert_eq!(p.indexed_total, start + 139 + ctx.len() as u64);
    }

    #[test]
    fn classes_follow_the_match_length() {
        assert_eq!([1, 2, 3, 4, 7, 8, 63, 64, 1000].map(match_class), [0, 1, 1, 2, 2, 3, 5, 6, 9]);
        let block: Vec<u32> = (100..180).collect();
        // The context repeats the first 20 tokens of the block: a 20-token match (class 4), drafting the next ones.
        let mut ctx = block.clone();
        ctx.extend([7, 8, 9]);
        ctx.extend_from_slice(&block[..20]);
        let mut p = proposer(1);
        let mut asked = None;
        let (tree, class) = p.propose_by_class(&ctx, &mut |c| {
            asked = Some(c);
            6
        });
        assert_eq!((class, asked), (Some(4), Some(4)));
        assert_eq!(tree, DraftTree::from_chain(&block[20..26]));
        assert_eq!(p.match_len(&ctx), Some(20));
        // Width 0: no tree, the class still named (the caller relaxes that class).
        assert_eq!(p.propose_by_class(&ctx, &mut |_| 0), (DraftTree::new(), Some(4)));
        // A 2-token match only: class 1. The length is capped.
        let short = [1, 2, 50, 60, 70, 1, 2];
        assert_eq!(proposer(1).propose_by_class(&short, &mut |_| 2), (DraftTree::from_chain(&[50, 60]), Some(1)));
        let long: Vec<u32> = (0..300).map(|i| i % 150).collect();
        assert_eq!(proposer(1).match_len(&long), None, "not synced");
        let mut p = proposer(1);
        assert_eq!(p.propose_by_class(&long, &mut |_| 1).1, Some(match_class(MATCH_CAP)));
        // Nothing to copy: no class, and `width` is not asked.
        let (tree, class) = proposer(1).propose_by_class(&[1, 2, 3, 4], &mut |_| panic!("asked"));
        assert!(tree.is_empty() && class.is_none());
        // The class agrees with what `propose` would draft for the same budget.
        let mut a = proposer(3);
        let mut b = proposer(3);
        assert_eq!(a.propose_by_class(&ctx, &mut |_| 9).0, b.propose(&ctx, 9));
    }
}
