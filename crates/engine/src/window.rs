//! A decoding sequence's window (DESIGN.md §1–§3, §8): its pending token plus a tree of drafts (a chain in the
//! common case), proposed within the width its measured acceptance and the window costs favour, cut to what
//! its grammar allows, then verified by equality against the target's keyed draw at every row, each row drawn
//! under the grammar's mask after that row's own path. `0` drafts is the serial one-row step itself.

use crate::draft::{fallback_guess, DraftConfig};
use crate::generate::{EngineError, Generator};
use crate::kv_pool::BlockTable;
use crate::logits::{draw_row, greedy_on_device, window_on_device, Logits};
use crate::round::Part;
use crate::seq::Sequence;
use crate::spec::{truncate_after, verify, CostTable, DraftTree, CLASSES};
use std::time::Instant;

impl<'a> Generator<'a> {
    /// Drafts a decoding sequence may verify in its next window (0 without drafting): the widest width its
    /// measured acceptance (of any class of guess) and the measured window costs favour, within `max_window`
    /// and `max_tokens`. The proposer's class of guess picks the width within this when the window runs.
    pub fn want_drafts(&self, s: &Sequence<'_>) -> usize {
        let Some(c) = &self.drafting else { return 0 };
        if s.proposer.is_none() {
            return 0;
        }
        let widest = (0..CLASSES).map(|cl| s.stats.best_width(cl, &self.seq_costs(c, s, cl), c.max_window - 1));
        let k = widest.max().unwrap_or(0).max(c.min_drafts).min(c.max_window - 1);
        k.min(s.req.max_tokens.saturating_sub(s.tokens.len()))
    }

    /// The window costs a guess of `class` for `s` is priced with: as its own rows would come back (argmaxes for
    /// a greedy sequence when the backend draws them), plus that class's measured proposal cost per drafted
    /// token (a draft model's steps are priced as such, context copies as nearly free).
    fn seq_costs(&self, c: &DraftConfig, s: &Sequence<'_>, class: usize) -> CostTable {
        let device = self.device_argmax;
        let costs = c.round_costs(
            device && greedy_on_device(&s.req, &s.tokens),
            device && window_on_device(&s.req, &s.tokens, true),
        );
        costs.with_proposal_cost(s.propose_cost[class.min(CLASSES - 1)])
    }

    /// The window of a decoding sequence with at most `max_drafts` draft rows: the grammar's forced tokens when
    /// it allows one token only (free drafts), else the proposer's tree, cut to what the grammar allows.
    pub(crate) fn window_part(&mut self, s: &mut Sequence<'_>, max_drafts: usize) -> Part {
        let pending = *s.tokens.last().expect("decoding");
        s.context.push(pending);
        s.class = None;
        let config = self.drafting.clone();
        let (Some(c), true) = (config, s.proposer.is_some()) else {
            return Part::Window { tree: DraftTree::new(), scratch: None };
        };
        let k = self.want_drafts(s).min(max_drafts);
        if k == 0 {
            // No class was asked: let them all relax, so a sequence that stopped drafting probes again.
            s.stats.relax_all();
            return Part::Window { tree: DraftTree::new(), scratch: None };
        }
        if let Some(g) = s.constraint.as_mut() {
            let forced = g.forced();
            if !forced.is_empty() {
                return Part::Window { tree: DraftTree::from_chain(&forced[..forced.len().min(k)]), scratch: None };
            }
        }
        let priced: Vec<CostTable> = (0..CLASSES).map(|cl| self.seq_costs(&c, s, cl)).collect();
        let (stats, prop) = (&s.stats, s.proposer.as_mut().expect("checked"));
        let width = &mut |cl: usize| {
            stats.best_width(cl, &priced[cl.min(CLASSES - 1)], c.max_window - 1).max(c.min_drafts).min(k)
        };
        let started = Instant::now();
        let (mut tree, class) = prop.propose_by_class(&s.context, width);
        s.class = class;
        if let (Some(cl), false) = (class, tree.is_empty()) {
            let cl = cl.min(CLASSES - 1);
            let per_token = started.elapsed().as_secs_f64() / tree.len() as f64;
            s.proposals[cl] += 1;
            s.propose_cost[cl] = match s.proposals[cl] {
                1 => per_token,
                _ => 0.8 * s.propose_cost[cl] + 0.2 * per_token,
            };
        }
        if tree.is_empty() && c.min_drafts > 0 {
            tree = DraftTree::from_chain(&[fallback_guess(&s.context)]);
        }
        if tree.len() > k {
            tree.truncate_to(k);
        }
        if let Some(g) = s.constraint.as_mut() {
            tree = allowed_subtree(&tree, &mut |path| g.valid_prefix(path) == path.len());
        }
        if is_chain(&tree) {
            return Part::Window { tree, scratch: None };
        }
        let mut scratch = BlockTable::new(&self.pool);
        match scratch.ensure(&self.pool, tree.len()) {
            Ok(()) => Part::Window { tree, scratch: Some(scratch) },
            Err(_) => Part::Window { tree: DraftTree::from_chain(&first_path(&tree)), scratch: None },
        }
    }

    /// The grammar's mask at the sequence's current state (without a grammar: the token limit's, if any). A
    /// grammar's mask never allows ids past the tokenizer's vocabulary.
    pub(crate) fn mask_here(&self, s: &mut Sequence<'_>, vocab: usize) -> Result<Option<Vec<u32>>, EngineError> {
        let Some(g) = s.constraint.as_mut() else { return Ok(self.limit_mask.clone()) };
        let mut mask = vec![0u32; vocab.div_ceil(32)];
        g.fill_mask(&mut mask).map_err(|e| EngineError::Model(e.to_string()))?;
        if mask.iter().all(|&w| w == 0) {
            return Err(EngineError::Model("the request's grammar allows no token here".into()));
        }
        Ok(Some(mask))
    }

    /// Verifies a window whose logits rows start at `first`: the keyed draw at each row along the accepted path
    /// (under the grammar's mask after that row's path), the tree's accepted K/V copied into place, the reply cut
    /// at a stop id or `max_tokens`, the proposer told, and the tokens emitted.
    pub(crate) fn verify_window(
        &mut self,
        s: &mut Sequence<'_>,
        tree: &DraftTree,
        scratch: Option<&BlockTable>,
        logits: &Logits,
        first: usize,
    ) {
        let vocab = self.model.vocab_size();
        let p = s.fill_target() - 1;
        let positions = tree.row_positions(p);
        let mut ds = Vec::new();
        let mut consumed = 0;
        let mut failure = None;
        let limit = self.limit_mask.as_deref();
        let verdict = {
            let tokens = &s.tokens;
            let (req, seed) = (&s.req, s.seed);
            let constraint = &mut s.constraint;
            verify(tree, &mut |row, path| {
                let mut mask = limit.map(<[u32]>::to_vec);
                if let Some(g) = constraint.as_mut() {
                    // The state after this row's path: the committed tokens, then the drafts accepted so far.
                    for &t in &path[consumed..] {
                        if let Err(e) = g.consume(t) {
                            failure.get_or_insert(EngineError::Model(e.to_string()));
                        }
                    }
                    consumed = path.len();
                    let mut m = vec![0u32; vocab.div_ceil(32)];
                    if let Err(e) = g.fill_mask(&mut m) {
                        failure.get_or_insert(EngineError::Model(e.to_string()));
                    }
                    mask = Some(m);
                }
                let mut reply = tokens.clone();
                reply.extend_from_slice(path);
                let d = draw_row(req, logits.row(first + row), seed, positions[row] + 1, &reply, mask.as_deref());
                let t = d.0;
                ds.push(d);
                t
            })
        };
        if let Some(g) = s.constraint.as_mut() {
            if consumed > 0 {
                if let Err(e) = g.rollback(consumed) {
                    failure.get_or_insert(EngineError::Model(e.to_string()));
                }
            }
        }
        if let Some(e) = failure {
            s.failed = Some(e);
            return;
        }
        if let Some(sc) = scratch {
            let src: Vec<u32> = verdict.accepted_nodes.iter().map(|&i| sc.slot(i)).collect();
            let dst: Vec<u32> = (1..=src.len()).map(|d| s.table.slot(p + d)).collect();
            self.be.kv_copy(&mut self.kv, &src, &dst);
            if let Some(m) = self.states.as_mut() {
                src.iter().zip(&dst).for_each(|(&a, &b)| m.relocate(a, b));
            }
        }
        let remaining = s.req.max_tokens - s.tokens.len();
        let verdict = truncate_after(verdict, remaining, &|t| s.req.stop_ids.contains(&t));
        let rows = tree.len() + 1;
        s.counts.rounds += 1;
        s.counts.drafted += tree.len();
        s.counts.min_rows = if s.counts.rounds == 1 { rows } else { s.counts.min_rows.min(rows) };
        if let Some(prop) = s.proposer.as_mut() {
            prop.observe(tree.len(), verdict.accepted());
            if let Some(cl) = s.class {
                s.stats.observe(cl, tree.max_depth(), verdict.accepted());
            }
        }
        let m = verdict.tokens.len();
        for (j, d) in ds.into_iter().take(m).enumerate() {
            debug_assert_eq!(d.0, verdict.tokens[j]);
            if j > 0 {
                let last = *s.tokens.last().expect("emitted");
                s.context.push(last);
            }
            if j + 1 < m || !verdict.has_bonus() {
                s.counts.accepted += 1;
            }
            s.emit(d);
            if s.is_done() {
                break;
            }
        }
    }
}

/// The nodes of `tree` whose whole path `allowed` accepts (a prefix-closed subtree, in the same order).
fn allowed_subtree(tree: &DraftTree, allowed: &mut dyn FnMut(&[u32]) -> bool) -> DraftTree {
    let mut out = DraftTree::new();
    let mut new_index: Vec<Option<usize>> = vec![None; tree.len()];
    for (i, n) in tree.nodes().iter().enumerate() {
        let parent = match n.parent {
            Some(p) => match new_index[p] {
                Some(q) => Some(q),
                None => continue,
            },
            None => None,
        };
        if allowed(&tree.path_tokens(i)) {
            new_index[i] = Some(out.push(n.token, parent));
        }
    }
    out
}

/// Whether node `i`'s parent is node `i − 1` for every node (a single chain in order).
pub(crate) fn is_chain(tree: &DraftTree) -> bool {
    tree.nodes().iter().enumerate().all(|(i, n)| n.parent == i.checked_sub(1))
}

/// The tokens of the tree's first path: the first child at every level (a chain's tokens, unchanged).
pub(crate) fn first_path(tree: &DraftTree) -> Vec<u32> {
    let mut chain = Vec::new();
    let mut at = None;
    while let Some(c) = tree.children(at).next() {
        chain.push(tree.nodes()[c].token);
        at = Some(c);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_subtree_drops_a_node_and_its_descendants() {
        let mut tree = DraftTree::new();
        tree.merge_chain(&[1, 2, 3]);
        tree.merge_chain(&[1, 4]);
        tree.merge_chain(&[5]);
        // Paths with token 2 are not allowed: node 2 and its child 3 go; 1, 4 and 5 stay.
        let out = allowed_subtree(&tree, &mut |path| !path.contains(&2));
        let paths: Vec<Vec<u32>> = (0..out.len()).map(|i| out.path_tokens(i)).collect();
        assert_eq!(paths, vec![vec![1], vec![1, 4], vec![5]]);
    }
}
