//! [`DraftTree`]: the draft tokens of one round, as a tree rooted at the stream's pending token.
//!
//! Nodes are stored in topological order (a parent's index is always below its children's), so any prefix
//! of the node list is itself a valid tree. A round's window maps the tree onto rows:
//!
//! | row | token | position |
//! |---|---|---|
//! | 0 | the pending token (the root) | `P` |
//! | `1 + i` | node `i` | `P + depth(i)` |
//!
//! Row `r` attends to the committed prefix `0..P` plus the window rows of [`DraftTree::row_ancestor_rows`]`[r]`
//! (row 0, the row's ancestors, itself), whose positions strictly increase.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One draft token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftNode {
    /// The drafted token id.
    pub token: u32,
    /// The node this token follows; `None` = it follows the pending token (a child of the root).
    pub parent: Option<usize>,
}

/// Draft tokens continuing a stream's pending token, in topological order (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTree {
    /// The nodes; `nodes[i].parent < Some(i)` always holds.
    nodes: Vec<DraftNode>,
    /// `depths[i]` = depth of node `i` (1 for children of the root).
    depths: Vec<usize>,
}

impl DraftTree {
    /// An empty tree (no drafts: the window is the pending token alone).
    pub fn new() -> DraftTree {
        DraftTree::default()
    }

    /// A single chain: `chain[0]` follows the pending token, `chain[i]` follows `chain[i - 1]`.
    pub fn from_chain(chain: &[u32]) -> DraftTree {
        let mut tree = DraftTree::new();
        let mut parent = None;
        for &token in chain {
            parent = Some(tree.push(token, parent));
        }
        tree
    }

    /// Appends a node and returns its index. No deduplication (see [`DraftTree::merge_chain`]).
    ///
    /// Panics if `parent` is not an existing node.
    pub fn push(&mut self, token: u32, parent: Option<usize>) -> usize {
        let depth = match parent {
            None => 1,
            Some(p) => {
                assert!(p < self.nodes.len(), "DraftTree::push: parent {p} of a tree of {} nodes", self.nodes.len());
                self.depths[p] + 1
            }
        };
        self.nodes.push(DraftNode { token, parent });
        self.depths.push(depth);
        self.nodes.len() - 1
    }

    /// Number of nodes (draft tokens); the window has `len() + 1` rows.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no drafts.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes in topological order.
    pub fn nodes(&self) -> &[DraftNode] {
        &self.nodes
    }

    /// Depth of node `i`: 1 for a child of the root. Panics if `i` is out of range.
    pub fn depth(&self, i: usize) -> usize {
        self.depths[i]
    }

    /// Greatest node depth (0 for an empty tree): the most tokens one round can accept from this tree.
    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// The ancestors of node `i`, root-most first, excluding `i` (ascending indices). Panics if out of range.
    pub fn ancestors(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.depths[i].saturating_sub(1));
        let mut cur = self.nodes[i].parent;
        while let Some(p) = cur {
            out.push(p);
            cur = self.nodes[p].parent;
        }
        out.reverse();
        out
    }

    /// The tokens on the path from the root to node `i`, inclusive.
    pub fn path_tokens(&self, i: usize) -> Vec<u32> {
        let mut out: Vec<u32> = self.ancestors(i).iter().map(|&a| self.nodes[a].token).collect();
        out.push(self.nodes[i].token);
        out
    }

    /// The children of `parent` (`None` = the root), in insertion order.
    pub fn children(&self, parent: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        self.nodes.iter().enumerate().filter(move |(_, n)| n.parent == parent).map(|(i, _)| i)
    }

    /// The first child of `parent` (`None` = the root) whose token is `token`.
    pub fn child_with_token(&self, parent: Option<usize>, token: u32) -> Option<usize> {
        self.children(parent).find(|&c| self.nodes[c].token == token)
    }

    /// Inserts `chain` below the root, reusing existing nodes: a child with the same token under the same
    /// parent is followed instead of duplicated. Returns how many nodes were added.
    pub fn merge_chain(&mut self, chain: &[u32]) -> usize {
        let before = self.len();
        let mut parent = None;
        for &token in chain {
            parent = Some(match self.child_with_token(parent, token) {
                Some(c) => c,
                None => self.push(token, parent),
            });
        }
        self.len() - before
    }

    /// Keeps at most `max_nodes` nodes, breadth-first: shallower nodes first, equal depths in insertion order
    /// (so a proposer that inserts its best guesses first keeps them). The kept set is prefix-closed (every
    /// kept node's parent is kept) and keeps its relative order, so indices are renumbered.
    pub fn truncate_to(&mut self, max_nodes: usize) {
        *self = self.best_first(max_nodes, |i| self.depths[i] as u64);
    }

    /// The tree of at most `max_nodes` nodes grown best-first from the root: repeatedly takes the lowest
    /// `(key(i), i)` among the children of nodes taken so far. Prefix-closed for any `key`; the kept nodes keep
    /// their relative order (renumbered). With `key = depth` this is [`DraftTree::truncate_to`].
    pub fn best_first(&self, max_nodes: usize, key: impl Fn(usize) -> u64) -> DraftTree {
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); self.len() + 1];
        for (i, n) in self.nodes.iter().enumerate() {
            children[n.parent.map_or(0, |p| p + 1)].push(i);
        }
        let mut keep = vec![false; self.len()];
        let mut frontier: BinaryHeap<Reverse<(u64, usize)>> =
            children[0].iter().map(|&c| Reverse((key(c), c))).collect();
        let mut taken = 0;
        while taken < max_nodes {
            let Some(Reverse((_, i))) = frontier.pop() else { break };
            keep[i] = true;
            taken += 1;
            frontier.extend(children[i + 1].iter().map(|&c| Reverse((key(c), c))));
        }
        let mut new_index = vec![usize::MAX; self.len()];
        let mut out = DraftTree::new();
        for (i, n) in self.nodes.iter().enumerate().filter(|&(i, _)| keep[i]) {
            new_index[i] = out.push(n.token, n.parent.map(|p| new_index[p]));
        }
        out
    }

    /// The window's row tokens: `pending` (row 0), then every node's token.
    pub fn row_tokens(&self, pending: u32) -> Vec<u32> {
        std::iter::once(pending).chain(self.nodes.iter().map(|n| n.token)).collect()
    }

    /// The absolute position of every window row, given the pending token's position `p`.
    pub fn row_positions(&self, p: usize) -> Vec<usize> {
        std::iter::once(p).chain(self.depths.iter().map(|d| p + d)).collect()
    }

    /// For every window row, the window rows it attends to besides the committed prefix, ascending: row 0,
    /// the row's ancestors, and the row itself (row 0's is `[0]`). Their positions strictly increase.
    pub fn row_ancestor_rows(&self) -> Vec<Vec<usize>> {
        let mut out = Vec::with_capacity(self.len() + 1);
        out.push(vec![0]);
        for (i, n) in self.nodes.iter().enumerate() {
            // The parent's row (0 for the root) was filled already: parents come first.
            let mut rows = out[n.parent.map_or(0, |p| p + 1)].clone();
            rows.push(i + 1);
            out.push(rows);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::Rng;

    /// root ─ 10 (0) ─ 11 (1) ─ 12 (3)
    ///      │        └ 21 (4)
    ///      └ 20 (2) ─ 22 (5)
    fn sample_tree() -> DraftTree {
        let mut t = DraftTree::new();
        assert_eq!(t.push(10, None), 0);
        assert_eq!(t.push(11, Some(0)), 1);
        assert_eq!(t.push(20, None), 2);
        assert_eq!(t.push(12, Some(1)), 3);
        assert_eq!(t.push(21, Some(0)), 4);
        assert_eq!(t.push(22, Some(2)), 5);
        t
    }

    #[test]
    fn shape_queries() {
        let t = sample_tree();
        assert_eq!(t.len(), 6);
        assert!(!t.is_empty());
        assert_eq!((0..6).map(|i| t.depth(i)).collect::<Vec<_>>(), [1, 2, 1, 3, 2, 2]);
        assert_eq!(t.max_depth(), 3);
        assert_eq!(t.ancestors(3), [0, 1]);
        assert_eq!(t.ancestors(0), Vec::<usize>::new());
        assert_eq!(t.path_tokens(3), [10, 11, 12]);
        assert_eq!(t.children(None).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(t.children(Some(0)).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(t.children(Some(3)).count(), 0);
        assert_eq!(t.child_with_token(Some(0), 21), Some(4));
        assert_eq!(t.child_with_token(None, 11), None);
    }

    #[test]
    fn window_rows() {
        let t = sample_tree();
        assert_eq!(t.row_tokens(7), [7, 10, 11, 20, 12, 21, 22]);
        assert_eq!(t.row_positions(100), [100, 101, 102, 101, 103, 102, 102]);
        let rows = t.row_ancestor_rows();
        assert_eq!(
            rows,
            vec![vec![0], vec![0, 1], vec![0, 1, 2], vec![0, 3], vec![0, 1, 2, 4], vec![0, 1, 5], vec![0, 3, 6]]
        );
    }

    #[test]
    fn empty_tree_is_safe() {
        let mut t = DraftTree::new();
        assert!(t.is_empty());
        assert_eq!(t.max_depth(), 0);
        assert_eq!(t.children(None).count(), 0);
        assert_eq!(t.row_positions(5), [5]);
        assert_eq!(t.row_ancestor_rows(), vec![vec![0]]);
        assert_eq!(t.row_tokens(3), [3]);
        t.truncate_to(4);
        assert!(t.is_empty());
        assert_eq!(DraftTree::from_chain(&[]), t);
        assert_eq!(t.merge_chain(&[]), 0);
    }

    #[test]
    #[should_panic(expected = "parent 1")]
    fn push_rejects_a_missing_parent() {
        DraftTree::new().push(1, Some(1));
    }

    #[test]
    fn chain_and_merge() {
        let c = DraftTree::from_chain(&[5, 6, 7]);
        assert_eq!(
            c.nodes(),
            &[
                DraftNode { token: 5, parent: None },
                DraftNode { token: 6, parent: Some(0) },
                DraftNode { token: 7, parent: Some(1) },
            ]
        );
        let mut t = c.clone();
        assert_eq!(t.merge_chain(&[5, 6, 7]), 0, "a known chain adds nothing");
        assert_eq!(t.merge_chain(&[5, 6]), 0);
        assert_eq!(t.merge_chain(&[5, 8, 9]), 2, "shares the prefix 5");
        assert_eq!(t.merge_chain(&[6]), 1);
        assert_eq!(t.nodes()[3], DraftNode { token: 8, parent: Some(0) });
        assert_eq!(t.nodes()[4], DraftNode { token: 9, parent: Some(3) });
        assert_eq!(t.nodes()[5], DraftNode { token: 6, parent: None });
        assert_eq!(t, sample_merge_reference());
    }

    fn sample_merge_reference() -> DraftTree {
        let mut t = DraftTree::new();
        t.push(5, None);
        t.push(6, Some(0));
        t.push(7, Some(1));
        t.push(8, Some(0));
        t.push(9, Some(3));
        t.push(6, None);
        t
    }

    #[test]
    fn truncate_is_breadth_first() {
        let mut t = sample_tree();
        t.truncate_to(3);
        // Depth 1: nodes 0 and 2; depth 2 in insertion order: node 1 (11 under 10).
        assert_eq!(
            t.nodes(),
            &[
                DraftNode { token: 10, parent: None },
                DraftNode { token: 11, parent: Some(0) },
                DraftNode { token: 20, parent: None },
            ]
        );
        let mut t = sample_tree();
        t.truncate_to(100);
        assert_eq!(t, sample_tree());
        t.truncate_to(0);
        assert!(t.is_empty());
    }

    /// Random trees: any truncation or best-first selection is prefix-closed, keeps paths (token sequences) of
    /// the original tree, and has the requested size.
    #[test]
    fn selections_are_prefix_closed_property() {
        let mut rng = Rng::from_env();
        for _ in 0..300 {
            let n = rng.below(20);
            let t = rng.tree(n, 4);
            let max = rng.below(t.len() + 2);
            let salt = rng.next();
            let variants = [
                {
                    let mut c = t.clone();
                    c.truncate_to(max);
                    c
                },
                t.best_first(max, |i| (i as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60),
            ];
            // Breadth-first: every node shallower than the deepest kept one is kept.
            let deepest = variants[0].max_depth();
            let shallow = |x: &DraftTree| (0..x.len()).filter(|&i| x.depth(i) < deepest).count();
            assert_eq!(shallow(&variants[0]), shallow(&t), "{}", rng.seed_note());
            for s in variants {
                assert_eq!(s.len(), max.min(t.len()), "{}", rng.seed_note());
                for i in 0..s.len() {
                    let path = s.path_tokens(i);
                    assert!(
                        (0..t.len()).any(|j| t.path_tokens(j) == path),
                        "{}: path {path:?} not in the original",
                        rng.seed_note()
                    );
                    if let Some(p) = s.nodes()[i].parent {
                        assert!(p < i && s.depth(i) == s.depth(p) + 1);
                    }
                }
            }
        }
    }
}
