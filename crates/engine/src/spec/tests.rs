//! Test helpers shared by the `spec` modules: a tiny seeded PRNG and random draft trees.

use super::tree::DraftTree;

/// xorshift64* seeded from `TF_SEED` (to reproduce a failure) or the clock; property tests print
/// [`Rng::seed_note`] when they fail.
pub(crate) struct Rng {
    /// The seed this generator started from.
    seed: u64,
    /// The generator state (never 0).
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed` (0 is remapped: xorshift needs a non-zero state).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng { seed, state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    /// Seeded from the `TF_SEED` environment variable, else from the clock.
    pub(crate) fn from_env() -> Rng {
        let seed = std::env::var("TF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            now.as_nanos() as u64
        });
        Rng::new(seed)
    }

    /// "TF_SEED=<seed>", for assertion messages.
    pub(crate) fn seed_note(&self) -> String {
        format!("TF_SEED={}", self.seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `num / den`.
    pub(crate) fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    /// A random tree of `n` nodes over tokens `0..vocab`, each node under a uniformly chosen earlier node or
    /// the root (duplicate siblings allowed).
    pub(crate) fn tree(&mut self, n: usize, vocab: u32) -> DraftTree {
        let mut t = DraftTree::new();
        for i in 0..n {
            let p = self.below(i + 1);
            let token = self.below(vocab as usize) as u32;
            t.push(token, if p == i { None } else { Some(p) });
        }
        t
    }
}

/// Property tests of the context-copies proposer against brute force.
mod ngram_props {
    use super::super::ngram::copy_after;
    use super::super::{DraftTree, NgramConfig, NgramProposer, Proposer};
    use super::Rng;

    /// Token paths of every node of `t`.
    fn paths(t: &DraftTree) -> Vec<Vec<u32>> {
        (0..t.len()).map(|i| t.path_tokens(i)).collect()
    }

    /// Brute force: with one candidate, the proposal is the self-extending copy after the most recent earlier
    /// occurrence of the longest suffix of `min_n..=max_n` tokens, filling the budget.
    fn reference_chain(ctx: &[u32], cfg: &NgramConfig, k: usize) -> DraftTree {
        let len = ctx.len();
        for n in (cfg.min_n..=cfg.max_n.min(len.saturating_sub(1))).rev() {
            if let Some(end) = (n - 1..len - 1).rev().find(|&e| ctx[e + 1 - n..=e] == ctx[len - n..]) {
                return DraftTree::from_chain(&copy_after(ctx, end, k));
            }
        }
        DraftTree::new()
    }

    /// Random contexts over small vocabularies: every proposal respects the budget and the candidate cap, every
    /// path is a genuine copy, and a single candidate equals the brute-force reference.
    #[test]
    fn proposals_are_copies_within_budget_property() {
        let mut rng = Rng::from_env();
        for _ in 0..400 {
            let vocab = 2 + rng.below(5);
            let ctx: Vec<u32> = (0..rng.below(60)).map(|_| rng.below(vocab) as u32).collect();
            let k = rng.below(12);
            let cfg = NgramConfig {
                min_n: 1 + rng.below(3),
                max_n: 1 + rng.below(5),
                max_candidates: 1 + rng.below(4),
                ..NgramConfig::default()
            };
            let mut p = NgramProposer::new(cfg.clone());
            let cfg = p.config().clone();
            let tree = p.propose(&ctx, k);
            let note = rng.seed_note();
            assert!(tree.len() <= k, "{note}");
            assert!(tree.children(None).count() <= cfg.max_candidates, "{note}");
            for parent in std::iter::once(None).chain((0..tree.len()).map(Some)) {
                let mut tokens: Vec<u32> = tree.children(parent).map(|c| tree.nodes()[c].token).collect();
                let n = tokens.len();
                tokens.sort_unstable();
                tokens.dedup();
                assert_eq!(tokens.len(), n, "{note}: repeated siblings under {parent:?} in {tree:?}");
            }
            let len = ctx.len();
            for path in paths(&tree) {
                let genuine = (cfg.min_n..=cfg.max_n.min(len.saturating_sub(1))).any(|n| {
                    (n - 1..len - 1)
                        .any(|e| ctx[e + 1 - n..=e] == ctx[len - n..] && copy_after(&ctx, e, path.len()) == path)
                });
                assert!(genuine, "{note}: {path:?} is not a copy in {ctx:?}");
            }
            let single = NgramProposer::new(NgramConfig { max_candidates: 1, ..cfg.clone() }).propose(&ctx, k);
            assert_eq!(single, reference_chain(&ctx, &cfg, k), "{note}: {ctx:?}");
        }
    }

    /// A proposer fed a growing (sometimes rewound) context proposes exactly what a fresh one does.
    #[test]
    fn incremental_index_equals_fresh_property() {
        let mut rng = Rng::from_env();
        for _ in 0..30 {
            let vocab = 2 + rng.below(6);
            let cfg = NgramConfig {
                min_n: 1 + rng.below(2),
                max_n: 2 + rng.below(4),
                positions_per_gram: 1 + rng.below(4),
                ..NgramConfig::default()
            };
            let mut p = NgramProposer::new(cfg.clone());
            let mut ctx: Vec<u32> = Vec::new();
            for _ in 0..60 {
                if rng.chance(1, 8) {
                    let keep = rng.below(ctx.len() + 1);
                    ctx.truncate(keep);
                }
                for _ in 0..rng.below(5) {
                    ctx.push(rng.below(vocab) as u32);
                }
                let k = rng.below(10);
                let fresh = NgramProposer::new(cfg.clone()).propose(&ctx, k);
                assert_eq!(p.propose(&ctx, k), fresh, "{}: {ctx:?}", rng.seed_note());
            }
        }
    }
}
