//! Drafting (DESIGN.md §1–§3): its settings ([`DraftConfig`]), the proposers requests get by default, and what
//! turning it on does at load: the window costs measured on the real weights and the self-check that a window
//! reproduces one-row steps bit for bit. The windows themselves run in the engine loop (`window.rs`): each
//! round a sequence offers its pending token plus up to `k` draft tokens as rows of one forward; the target's
//! keyed draw at every row decides, by equality, which drafts stand.

use crate::generate::{chain_batch, EngineError, GenRequest, Generator};
use crate::kv_pool::BlockTable;
use crate::logits::fetch;
use crate::spec::{CostTable, DraftTree, NgramConfig, NgramProposer, Proposer};
use std::sync::Arc;
use std::time::Instant;

/// Makes the proposer of one request.
pub type ProposerFactory = Arc<dyn Fn(&GenRequest) -> Box<dyn Proposer> + Send + Sync>;

/// How a generator drafts.
#[derive(Clone)]
pub struct DraftConfig {
    /// Most rows in one verify window (the pending token plus drafts); below 2 nothing is drafted.
    pub max_window: usize,
    /// Measured seconds of one forward by width, both ways its rows can come back
    /// ([`Generator::measure_costs`]); pick each round's width ([`DraftConfig::round_costs`]).
    pub costs: WindowCosts,
    /// The proposer for each request; `None`: context copies ([`default_proposer`]).
    pub proposer: Option<ProposerFactory>,
    /// Drafts every round verifies at least (a one-token guess when the proposer has none). 0 lets the width
    /// choice run a plain one-row round when drafting does not pay; 1 makes every round a real window (what
    /// `tensorfold check` uses to exercise windows on every token).
    pub min_drafts: usize,
}

impl DraftConfig {
    /// Context copies with windows of up to `max_window` rows, priced with `costs` however the rows come back.
    pub fn new(max_window: usize, costs: CostTable) -> DraftConfig {
        let costs = WindowCosts { logits: costs.clone(), argmax: costs };
        DraftConfig { max_window, costs, proposer: None, min_drafts: 1 }
    }

    /// The costs a stream's next round is priced with: the one-row cost from [`WindowCosts::argmax`] when a
    /// one-row round would bring back only the argmax (`one_row`), else from [`WindowCosts::logits`]; likewise
    /// every wider window's cost with `window`.
    pub fn round_costs(&self, one_row: bool, window: bool) -> CostTable {
        let pick = |w: usize| {
            let on_device = if w <= 1 { one_row } else { window };
            let table = if on_device { &self.costs.argmax } else { &self.costs.logits };
            table.cost.get(w).copied().unwrap_or(f64::NAN)
        };
        CostTable::new((0..self.costs.logits.cost.len()).map(pick).collect())
    }
}

impl std::fmt::Debug for DraftConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftConfig")
            .field("max_window", &self.max_window)
            .field("costs", &self.costs)
            .field("proposer", &self.proposer.as_ref().map(|_| "custom").unwrap_or("ngram"))
            .finish()
    }
}

/// What drafting did over one reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftCounts {
    /// Decode rounds (forwards after the prompt).
    pub rounds: usize,
    /// Draft tokens proposed, and accepted (kept because the target drew the same token).
    pub drafted: usize,
    pub accepted: usize,
    /// Narrowest window (rows) over the rounds; 0 when there was no round.
    pub min_rows: usize,
    /// Whether drafting was on for this reply.
    pub drafts: bool,
}

/// The proposer a request gets by default: context copies, single chains.
pub fn default_proposer() -> Box<dyn Proposer> {
    ngram_proposer(1)
}

/// Context copies with up to `branches` candidate continuations merged into a tree (1: single chains).
pub fn ngram_proposer(branches: usize) -> Box<dyn Proposer> {
    Box::new(NgramProposer::new(NgramConfig { max_candidates: branches.max(1), ..NgramConfig::default() }))
}

/// A one-token guess when the proposer has none, so a drafted round always verifies at least one draft: the
/// token that followed the most recent earlier occurrence of the pending token, else the pending token.
pub fn fallback_guess(context: &[u32]) -> u32 {
    let Some((&last, rest)) = context.split_last() else { return 0 };
    rest.iter().rposition(|&t| t == last).map(|i| context[i + 1]).unwrap_or(last)
}

/// What turning drafting on found.
#[derive(Clone, Debug)]
pub struct DraftSetup {
    /// Whether drafting is on (off when the self-check found a difference or the window is below 2).
    pub enabled: bool,
    /// Why it is off, when the self-check disabled it.
    pub warning: Option<String>,
    /// What was measured ([`Generator::measure_costs`]); empty when drafting is off.
    pub costs: WindowCosts,
}

/// Seconds of one forward by width, measured at start ([`Generator::measure_costs`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowCosts {
    /// Every logits row brought to the host (sampled draws, logprobs).
    pub logits: CostTable,
    /// Only each row's argmax brought back (greedy draws made by the backend).
    pub argmax: CostTable,
}

impl<'a> Generator<'a> {
    /// Measures window costs, runs the self-check with `max_window`-row windows on the real weights, and turns
    /// drafting on if every row matched (off, with a warning, otherwise).
    pub fn setup_drafting(
        &mut self,
        max_window: usize,
        proposer: Option<ProposerFactory>,
        min_drafts: usize,
    ) -> Result<DraftSetup, EngineError> {
        self.drafting = None;
        if max_window < 2 {
            return Ok(DraftSetup { enabled: false, warning: None, costs: WindowCosts::default() });
        }
        let vocab = self.model.vocab_size() as u64;
        let n = 48.min(self.model.context_length()).min(self.pool.capacity_tokens());
        let tokens: Vec<u32> = (0..n as u64).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
        if let Some(diff) = self.self_check(&tokens, max_window)? {
            let warning = format!(
                "drafting disabled: the load-time self-check found that a {max_window}-row window does not                  reproduce one-row steps ({diff}); replies stay exact, decoding is serial"
            );
            return Ok(DraftSetup { enabled: false, warning: Some(warning), costs: WindowCosts::default() });
        }
        let costs = self.measure_costs(max_window)?;
        self.drafting = Some(DraftConfig { max_window, costs: costs.clone(), proposer, min_drafts });
        Ok(DraftSetup { enabled: true, warning: None, costs })
    }

    /// Seconds of one forward by width `1..=max_window`, each over a 64-token committed prefix, for choosing
    /// window widths: the median of 3 after a warm-up. Each timed forward brings back its rows' argmaxes (the
    /// [`WindowCosts::argmax`] time; skipped, and both tables equal, when the backend's argmax is off), then
    /// copies every logits row to the host as well; that copy added gives [`WindowCosts::logits`] (over by the
    /// argmax itself, a few microseconds). Uses (and frees) a scratch sequence.
    pub fn measure_costs(&mut self, max_window: usize) -> Result<WindowCosts, EngineError> {
        let prefix = 64.min(self.model.context_length().saturating_sub(max_window + 1));
        let need = prefix + max_window;
        if max_window == 0 || self.pool.check_fits(need).is_err() {
            return Ok(WindowCosts::default());
        }
        let mut table = BlockTable::new(&self.pool);
        table.ensure(&self.pool, need)?;
        let vocab = self.model.vocab_size();
        let tokens: Vec<u32> = (0..need as u32).map(|i| i % vocab as u32).collect();
        self.forward(&table, &tokens[..prefix.max(1)], 0, Vec::new(), false)?;
        let (mut logits, mut argmax) = (vec![0.0], vec![0.0]);
        let median = |mut t: Vec<f64>| {
            t.remove(0);
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        };
        for w in 1..=max_window {
            let (mut ids_s, mut values_s) = (Vec::new(), Vec::new());
            for _ in 0..4 {
                let batch = chain_batch(&table, &tokens[prefix..prefix + w], prefix, (0..w).collect());
                let t = Instant::now();
                let out = self.run_model(&mut batch.clone(), &[])?;
                if self.device_argmax {
                    fetch(self.be, &out, w, vocab, true)?;
                }
                let ids = t.elapsed().as_secs_f64();
                fetch(self.be, &out, w, vocab, false)?;
                let values = t.elapsed().as_secs_f64();
                // With the backend's argmax off every round copies the logits: both tables are that time.
                ids_s.push(if self.device_argmax { ids } else { values });
                values_s.push(values);
            }
            argmax.push(median(ids_s));
            logits.push(median(values_s));
        }
        Ok(WindowCosts { logits: CostTable::new(logits), argmax: CostTable::new(argmax) })
    }

    /// The load-time self-check of DESIGN.md §2: feeds `tokens` once as one-row steps and once as windows of
    /// `window` rows after the same prefix, and compares every row's logits bit for bit. `Ok(None)` when equal,
    /// else a description of the first difference.
    pub fn self_check(&mut self, tokens: &[u32], window: usize) -> Result<Option<String>, EngineError> {
        let vocab = self.model.vocab_size();
        if tokens.len() < 2 || window < 2 {
            return Ok(None);
        }
        self.pool.check_fits(tokens.len())?;
        let prefix = tokens.len() / 2;
        let mut serial = Vec::new();
        {
            let mut table = BlockTable::new(&self.pool);
            table.ensure(&self.pool, tokens.len())?;
            self.forward(&table, &tokens[..prefix], 0, Vec::new(), false)?;
            for p in prefix..tokens.len() {
                serial.extend(self.forward(&table, &tokens[p..p + 1], p, vec![0], false)?.into_values());
            }
        }
        let mut windowed = Vec::new();
        {
            let mut table = BlockTable::new(&self.pool);
            table.ensure(&self.pool, tokens.len())?;
            self.forward(&table, &tokens[..prefix], 0, Vec::new(), false)?;
            let mut p = prefix;
            while p < tokens.len() {
                let w = window.min(tokens.len() - p);
                windowed.extend(self.forward(&table, &tokens[p..p + w], p, (0..w).collect(), false)?.into_values());
                p += w;
            }
        }
        for (i, (a, b)) in serial.iter().zip(&windowed).enumerate() {
            if a.to_bits() != b.to_bits() {
                return Ok(Some(format!(
                    "position {}: logit {} is {a:e} one row at a time but {b:e} in a {window}-row window",
                    prefix + i / vocab,
                    i % vocab
                )));
            }
        }
        // A tree window: a decoy branch first, then the true tokens; the true path's rows (scratch slots,
        // attention through ancestor lists) must give the serial bits too.
        let depth = (window - 1).min(tokens.len() - prefix - 1) / 2;
        if depth >= 1 {
            let truth = &tokens[prefix + 1..prefix + 1 + depth];
            let decoy: Vec<u32> = truth.iter().map(|&t| (t + 1) % vocab as u32).collect();
            let mut tree = DraftTree::new();
            tree.merge_chain(&decoy);
            tree.merge_chain(truth);
            let mut table = BlockTable::new(&self.pool);
            table.ensure(&self.pool, tokens.len())?;
            let mut scratch = BlockTable::new(&self.pool);
            scratch.ensure(&self.pool, tree.len())?;
            self.forward(&table, &tokens[..prefix], 0, Vec::new(), false)?;
            let mut batch = chain_batch(&table, &[], prefix, Vec::new());
            crate::round::push_window(&mut batch, 0, &table, Some(&scratch), &tree, tokens[prefix], prefix);
            let all = self.forward_batch(&batch, false)?.into_values();
            let mut at = None;
            for d in 0..=depth {
                let row = match d {
                    0 => 0,
                    _ => {
                        let node = tree.child_with_token(at, truth[d - 1]).expect("the true branch");
                        at = Some(node);
                        node + 1
                    }
                };
                let got = &all[row * vocab..(row + 1) * vocab];
                let want = &serial[d * vocab..(d + 1) * vocab];
                if let Some(j) = (0..vocab).find(|&j| got[j].to_bits() != want[j].to_bits()) {
                    return Ok(Some(format!(
                        "position {}: logit {j} is {:e} one row at a time but {:e} in a tree window",
                        prefix + d,
                        want[j],
                        got[j]
                    )));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_guess_follows_the_last_occurrence() {
        assert_eq!(fallback_guess(&[5, 6, 7, 5, 8, 5]), 8);
        assert_eq!(fallback_guess(&[1, 2, 3]), 3);
        assert_eq!(fallback_guess(&[4]), 4);
        assert_eq!(fallback_guess(&[]), 0);
    }
}
