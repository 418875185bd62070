//! Equality acceptance along a [`DraftTree`] (DESIGN.md §3): a draft token is kept iff it equals the token the
//! target would have drawn serially at that position; at the first mismatch the target's draw is emitted
//! instead, so a round always yields at least one token and exactly the tokens serial decoding would.

use super::tree::DraftTree;

/// The outcome of verifying one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Indices of the accepted nodes, root-most first (a path of the tree).
    pub accepted_nodes: Vec<usize>,
    /// Window rows whose keys/values join the committed prefix: 0 (the pending token), then `1 + node` for
    /// each accepted node.
    pub accepted_rows: Vec<usize>,
    /// Tokens to emit, in order: the accepted draft tokens, then (unless [`truncate_after`] cut it) the
    /// target's draw at the last accepted row, the *bonus* token that becomes the next pending token.
    pub tokens: Vec<u32>,
}

impl Verdict {
    /// Draft tokens accepted (and emitted).
    pub fn accepted(&self) -> usize {
        self.accepted_nodes.len()
    }

    /// Whether the last emitted token is the target's own draw (always, unless [`truncate_after`] cut the
    /// tokens inside the accepted drafts).
    pub fn has_bonus(&self) -> bool {
        self.tokens.len() > self.accepted_nodes.len()
    }
}

/// Walks `tree` from the root with the target's draws and returns what serial decoding would emit.
///
/// `draw(row, path)` must return the target's keyed token for the position after window row `row`, computed
/// from that row's logits, with penalties over the reply so far followed by `path` (the draft tokens accepted
/// on the way to `row`). The walk: `t = draw(0, [])`; while some child of the current node carries `t` (the
/// first such child in insertion order), accept it and draw at its row; the final draw is the bonus token.
/// `draw` is called once per accepted row, in path order.
pub fn verify(tree: &DraftTree, draw: &mut dyn FnMut(usize, &[u32]) -> u32) -> Verdict {
    let mut v = Verdict { accepted_nodes: Vec::new(), accepted_rows: vec![0], tokens: Vec::new() };
    let mut at = None;
    loop {
        let row = at.map_or(0, |n| n + 1);
        let t = draw(row, &v.tokens);
        match tree.child_with_token(at, t) {
            Some(n) => {
                v.accepted_nodes.push(n);
                v.accepted_rows.push(n + 1);
                v.tokens.push(t);
                at = Some(n);
            }
            None => {
                v.tokens.push(t);
                return v;
            }
        }
    }
}

/// Cuts a verdict so the reply ends exactly where serial decoding would: after the first token for which
/// `is_stop` holds (inclusive), and after `max_new` tokens (the reply's remaining token budget). Accepted
/// nodes and rows past the last kept token are dropped with it: every kept draft token keeps its node (and
/// row), so afterwards `tokens.len()` is `accepted() + 1` or, when the cut fell inside the drafts,
/// `accepted()`.
pub fn truncate_after(verdict: Verdict, max_new: usize, is_stop: &dyn Fn(u32) -> bool) -> Verdict {
    let mut v = verdict;
    let stop_end = v.tokens.iter().position(|&t| is_stop(t)).map_or(v.tokens.len(), |i| i + 1);
    let keep = stop_end.min(max_new).min(v.tokens.len());
    v.tokens.truncate(keep);
    v.accepted_nodes.truncate(keep);
    v.accepted_rows.truncate(keep + 1);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::Rng;

    /// The fake "serial model": the next token after `prefix` is a hash of the whole prefix, mod `vocab`.
    fn next_token(prefix: &[u32], vocab: u32) -> u32 {
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for &t in prefix {
            h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01B3);
            h ^= h >> 29;
        }
        (h % u64::from(vocab)) as u32
    }

    /// Serial rollout: `n` tokens after `prefix`.
    fn serial(prefix: &[u32], n: usize, vocab: u32) -> Vec<u32> {
        let mut ctx = prefix.to_vec();
        for _ in 0..n {
            ctx.push(next_token(&ctx, vocab));
        }
        ctx[prefix.len()..].to_vec()
    }

    /// A draw callback over the fake model for a stream whose context (pending token last) is `context`;
    /// it checks that `path` is the tree path to `row`.
    fn verify_fake(tree: &DraftTree, context: &[u32], vocab: u32) -> Verdict {
        verify(tree, &mut |row, path| {
            let expect = if row == 0 { Vec::new() } else { tree.path_tokens(row - 1) };
            assert_eq!(path, expect, "draw got the wrong path for row {row}");
            next_token(&[context, path].concat(), vocab)
        })
    }

    /// Draw callback answering a fixed token per row.
    fn by_row(answers: &[u32]) -> impl FnMut(usize, &[u32]) -> u32 + '_ {
        move |row, _| answers[row]
    }

    #[test]
    fn accept_all_reject_first_reject_at_k() {
        let chain = DraftTree::from_chain(&[5, 6, 7]);
        // Rows 0..=3 draw 5, 6, 7, then the bonus 8.
        let v = verify(&chain, &mut by_row(&[5, 6, 7, 8]));
        assert_eq!(
            v,
            Verdict { accepted_nodes: vec![0, 1, 2], accepted_rows: vec![0, 1, 2, 3], tokens: vec![5, 6, 7, 8] }
        );
        assert!(v.has_bonus());
        let v = verify(&chain, &mut by_row(&[9, 0, 0, 0]));
        assert_eq!(v, Verdict { accepted_nodes: vec![], accepted_rows: vec![0], tokens: vec![9] });
        let v = verify(&chain, &mut by_row(&[5, 6, 1, 0]));
        assert_eq!(v, Verdict { accepted_nodes: vec![0, 1], accepted_rows: vec![0, 1, 2], tokens: vec![5, 6, 1] });
        assert_eq!(v.accepted(), 2);
        // No drafts: one draw, one token.
        let v = verify(&DraftTree::new(), &mut by_row(&[4]));
        assert_eq!(v, Verdict { accepted_nodes: vec![], accepted_rows: vec![0], tokens: vec![4] });
    }

    #[test]
    fn second_branch_is_the_right_one() {
        // root ─ 5 (0) ─ 6 (1)
        //      └ 7 (2) ─ 8 (3) ─ 9 (4)
        let mut t = DraftTree::from_chain(&[5, 6]);
        t.merge_chain(&[7, 8, 9]);
        // Row of node n is n + 1: row 0 draws 7, row 3 (node 2) draws 8, row 4 (node 3) draws 3.
        let mut answers = vec![u32::MAX; 6];
        answers[0] = 7;
        answers[3] = 8;
        answers[4] = 3;
        let v = verify(&t, &mut by_row(&answers));
        assert_eq!(v, Verdict { accepted_nodes: vec![2, 3], accepted_rows: vec![0, 3, 4], tokens: vec![7, 8, 3] });
    }

    #[test]
    fn truncation() {
        let v = Verdict { accepted_nodes: vec![0, 1, 2], accepted_rows: vec![0, 1, 2, 3], tokens: vec![5, 6, 7, 8] };
        let never = |_| false;
        assert_eq!(truncate_after(v.clone(), 10, &never), v);
        assert_eq!(truncate_after(v.clone(), 4, &never), v);
        // Stop id inside the drafts: cut after it, inclusive; no bonus.
        let eos = truncate_after(v.clone(), 10, &|t| t == 6);
        assert_eq!(eos, Verdict { accepted_nodes: vec![0, 1], accepted_rows: vec![0, 1, 2], tokens: vec![5, 6] });
        assert!(!eos.has_bonus());
        // The bonus token is the stop id.
        assert_eq!(truncate_after(v.clone(), 10, &|t| t == 8), v);
        // The first stop wins.
        assert_eq!(truncate_after(v.clone(), 10, &|t| t == 7 || t == 5).tokens, [5]);
        // max_tokens inside the window.
        let len = truncate_after(v.clone(), 2, &never);
        assert_eq!(len, Verdict { accepted_nodes: vec![0, 1], accepted_rows: vec![0, 1, 2], tokens: vec![5, 6] });
        // Both: the earlier cut wins.
        assert_eq!(truncate_after(v.clone(), 1, &|t| t == 7).tokens, [5]);
        assert_eq!(truncate_after(v.clone(), 3, &|t| t == 5).tokens, [5]);
        let none = truncate_after(v, 0, &never);
        assert_eq!(none, Verdict { accepted_nodes: vec![], accepted_rows: vec![0], tokens: vec![] });
        // A rejected round: only the bonus, possibly a stop id.
        let r = Verdict { accepted_nodes: vec![], accepted_rows: vec![0], tokens: vec![9] };
        assert_eq!(truncate_after(r.clone(), 5, &|t| t == 9), r);
    }

    /// Random trees (V = 5: many accidental matches) over the fake model: the verdict is a tree path, its
    /// tokens are the serial rollout, it stops only where no child matches the serial token.
    #[test]
    fn verdict_equals_serial_property() {
        const V: u32 = 5;
        let mut rng = Rng::from_env();
        let mut deep = 0;
        for _ in 0..2000 {
            let context: Vec<u32> = (0..1 + rng.below(6)).map(|_| rng.below(V as usize) as u32).collect();
            let tree = random_tree(&mut rng, &context, V);
            let v = verify_fake(&tree, &context, V);
            let truth = serial(&context, v.tokens.len(), V);
            let note = rng.seed_note();
            assert_eq!(v.tokens, truth, "{note}: tree {tree:?}");
            assert_eq!(v.accepted(), v.tokens.len() - 1, "{note}");
            assert_eq!(v.accepted_rows, [vec![0], v.accepted_nodes.iter().map(|n| n + 1).collect()].concat());
            let mut parent = None;
            for &n in &v.accepted_nodes {
                assert_eq!(tree.nodes()[n].parent, parent, "{note}: not a path");
                parent = Some(n);
            }
            assert_eq!(tree.child_with_token(parent, *v.tokens.last().unwrap()), None, "{note}: stopped early");
            deep += usize::from(v.accepted() >= 3);
        }
        assert!(deep > 100, "the generator should produce deep acceptances, got {deep}");
    }

    /// A mix of guided trees (the true continuation with mutations, plus alternatives) and random ones.
    fn random_tree(rng: &mut Rng, context: &[u32], vocab: u32) -> DraftTree {
        if rng.chance(1, 3) {
            let n = rng.below(12);
            return rng.tree(n, vocab);
        }
        let mut t = DraftTree::new();
        for _ in 0..1 + rng.below(3) {
            let mut chain = serial(context, 1 + rng.below(8), vocab);
            for x in chain.iter_mut() {
                if rng.chance(1, 5) {
                    *x = rng.below(vocab as usize) as u32;
                }
            }
            t.merge_chain(&chain);
        }
        t
    }

    /// Whole replies: rounds of random trees, verify and truncate_after give exactly the serial reply under
    /// max_tokens and stop ids (a stop id in the prompt does not matter).
    #[test]
    fn drafted_reply_equals_serial_property() {
        const V: u32 = 6;
        let mut rng = Rng::from_env();
        for _ in 0..500 {
            let prompt: Vec<u32> = (0..1 + rng.below(5)).map(|_| rng.below(V as usize) as u32).collect();
            let max_tokens = 1 + rng.below(40);
            let stop = if rng.chance(1, 2) { Some(rng.below(V as usize) as u32) } else { None };
            let is_stop = |t: u32| Some(t) == stop;
            let mut want = Vec::new();
            let mut ctx = prompt.clone();
            while want.len() < max_tokens {
                let t = next_token(&ctx, V);
                ctx.push(t);
                want.push(t);
                if is_stop(t) {
                    break;
                }
            }
            // Drafted: the first token comes from the prompt's last row, then windows.
            let mut reply = vec![next_token(&prompt, V)];
            let mut rounds = 0;
            while !is_stop(*reply.last().unwrap()) && reply.len() < max_tokens {
                let context = [prompt.as_slice(), &reply].concat();
                let tree = random_tree(&mut rng, &context, V);
                let v = truncate_after(verify_fake(&tree, &context, V), max_tokens - reply.len(), &is_stop);
                assert!(!v.tokens.is_empty());
                reply.extend_from_slice(&v.tokens);
                rounds += 1;
            }
            assert_eq!(reply, want, "{}: prompt {prompt:?}, max {max_tokens}, stop {stop:?}", rng.seed_note());
            assert!(rounds <= want.len());
        }
    }
}
