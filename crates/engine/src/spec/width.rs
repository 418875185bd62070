//! Choosing each round's draft count from measured acceptance and measured forward cost: the `k` that
//! maximizes expected emitted tokens per second of the window forward.

/// Measured cost of one forward by window width.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostTable {
    /// `cost[w]` = seconds of one forward with `w` rows (`cost[0]` is unused); measured by the engine at start.
    /// A width whose cost is missing, not finite or not positive ends the usable range.
    pub cost: Vec<f64>,
}

impl CostTable {
    /// A table from `cost[w]` = seconds for `w` rows (`cost[0]` ignored).
    pub fn new(cost: Vec<f64>) -> CostTable {
        CostTable { cost }
    }

    /// A table from costs of widths `1..=costs.len()` (`costs[0]` is the 1-row cost).
    pub fn from_widths(costs: &[f64]) -> CostTable {
        CostTable { cost: std::iter::once(0.0).chain(costs.iter().copied()).collect() }
    }

    /// The cost of a `w`-row forward, if measured and usable (finite, > 0). `None` for `w = 0`.
    pub fn get(&self, w: usize) -> Option<f64> {
        self.cost.get(w).copied().filter(|&c| w > 0 && c.is_finite() && c > 0.0)
    }

    /// The widest `w` such that every width `1..=w` has a usable cost (0 if none).
    pub fn max_width(&self) -> usize {
        (1..self.cost.len()).take_while(|&w| self.get(w).is_some()).last().unwrap_or(0)
    }

    /// The widest usable width and its cost relative to one row (`None` if no width is usable).
    pub fn widest_ratio(&self) -> Option<(usize, f64)> {
        let w = self.max_width();
        Some((w, self.get(w)? / self.get(1)?))
    }

    /// The cost of a round that drafts with a proposer costing `per_token` seconds per drafted token: a `w`-row
    /// window carries `w − 1` drafts on top of its forward.
    pub fn with_proposal_cost(&self, per_token: f64) -> CostTable {
        let cost = self.cost.iter().enumerate().map(|(w, &c)| c + w.saturating_sub(1) as f64 * per_token).collect();
        CostTable { cost }
    }
}

/// Expected tokens one round emits with a chain of `k` drafts of per-token acceptance `a`: the accepted
/// drafts plus the bonus token, `1 + a + … + a^k = (1 − a^(k+1)) / (1 − a)` (`k + 1` at `a = 1`).
pub fn expected_tokens(k: usize, a: f64) -> f64 {
    let a = a.clamp(0.0, 1.0);
    if a >= 1.0 {
        return (k + 1) as f64;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// An exponential moving average of the per-position acceptance probability `a`: the chance that a draft token
/// is accepted given that every earlier one on its path was.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptStats {
    /// Current estimate of `a`, in `[0, 1]`.
    rate: f64,
    /// Weight of one observed position in the average, in `(0, 1]`.
    alpha: f64,
    /// The starting estimate, which rounds without drafts drift back to.
    prior: f64,
    /// Fraction of the distance to `prior` closed by each round without drafts, in `[0, 1]`. Keeps a stream
    /// whose estimate fell to "draft nothing" from staying there forever: it probes again later.
    relax: f64,
    /// Draft rounds in a row that kept no draft (capped at [`MAX_BACKOFF`]): each halves the relaxation, so a
    /// stream whose probes keep failing probes at doubling intervals; a kept draft resets it.
    failed: u32,
}

/// The most halvings of the relaxation: a stream whose drafts never pay still probes (every few hundred rounds
/// with the default relaxation) rather than never.
pub const MAX_BACKOFF: u32 = 6;

impl Default for AcceptStats {
    /// Prior 0.5, `alpha` 0.1, `relax` 0.05.
    fn default() -> Self {
        AcceptStats::new(0.5, 0.1, 0.05)
    }
}

impl AcceptStats {
    /// Starts at `prior`; each observed position moves the estimate by `alpha`; each round without drafts
    /// moves it back toward `prior` by `relax`. Values are clamped to their ranges (`alpha` to `[1e-6, 1]`).
    pub fn new(prior: f64, alpha: f64, relax: f64) -> AcceptStats {
        let unit = |x: f64, lo: f64| if x.is_nan() { lo } else { x.clamp(lo, 1.0) };
        let prior = unit(prior, 0.0);
        AcceptStats { rate: prior, alpha: unit(alpha, 1e-6), prior, relax: unit(relax, 0.0), failed: 0 }
    }

    /// The current estimate of the per-position acceptance probability.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Learns from one round: `proposed` = drafted positions on the longest path (a chain's length, a tree's
    /// [`crate::spec::DraftTree::max_depth`]), `accepted` = draft tokens kept (capped at `proposed`). Each
    /// accepted position is a success, the first rejected one (if any) a failure; positions after it were
    /// never tested. `proposed = 0` relaxes the estimate toward the prior, by `relax / 2^f` where `f` counts the
    /// draft rounds in a row that kept nothing (up to [`MAX_BACKOFF`]).
    pub fn observe(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            self.rate += self.relax / f64::from(1u32 << self.failed) * (self.prior - self.rate);
            return;
        }
        let accepted = accepted.min(proposed);
        self.failed = if accepted == 0 { (self.failed + 1).min(MAX_BACKOFF) } else { 0 };
        // `accepted` successes in a row: 1 − rate shrinks by (1 − α) each.
        self.rate = 1.0 - (1.0 - self.rate) * (1.0 - self.alpha).powi(accepted.min(i32::MAX as usize) as i32);
        if accepted < proposed {
            self.rate *= 1.0 - self.alpha;
        }
        self.rate = self.rate.clamp(0.0, 1.0);
    }

    /// The draft count `k` in `0..=max` that maximizes [`expected_tokens`]`(k, rate) / cost[k + 1]`, limited
    /// to widths the table measured (0 if it measured none). Ties go to the smaller `k`.
    pub fn best_width(&self, cost: &CostTable, max: usize) -> usize {
        let mut best = (0, f64::NEG_INFINITY);
        for k in 0..=max {
            let Some(c) = cost.get(k + 1) else { break };
            let speed = expected_tokens(k, self.rate) / c;
            if speed > best.1 {
                best = (k, speed);
            }
        }
        best.0
    }
}

/// Classes a proposer may name ([`crate::spec::Proposer::propose_by_class`]); higher ones share the last.
pub const CLASSES: usize = 8;

/// The starting estimate of each class. Classes are ordered by the evidence behind a guess (for context copies,
/// class `c` is a match of `2^c` to `2^(c+1) − 1` tokens), so a higher class starts higher: a class whose
/// start were too low for the measured window costs would never be drafted and so never learn.
pub const CLASS_PRIORS: [f64; CLASSES] = [0.5, 0.5, 0.6, 0.75, 0.85, 0.9, 0.9, 0.9];

/// Acceptance estimates kept apart by the class of guess a proposer names for each proposal: a context copy
/// backed by a 40-token match is accepted far more often than one backed by 2 tokens, and one average over
/// both would draft too little for the first and too much for the second.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassStats {
    /// `[CLASSES]` estimates, class `c` starting at (and relaxing toward) [`CLASS_PRIORS`]`[c]`, with
    /// [`AcceptStats::default`]'s `alpha` and `relax`.
    classes: Vec<AcceptStats>,
}

impl Default for ClassStats {
    fn default() -> Self {
        ClassStats { classes: CLASS_PRIORS.iter().map(|&p| AcceptStats::new(p, 0.1, 0.05)).collect() }
    }
}

impl ClassStats {
    /// The estimate of `class` (classes past the last share the last).
    pub fn class(&self, class: usize) -> &AcceptStats {
        &self.classes[class.min(CLASSES - 1)]
    }

    /// [`AcceptStats::best_width`] of `class`.
    pub fn best_width(&self, class: usize, cost: &CostTable, max: usize) -> usize {
        self.class(class).best_width(cost, max)
    }

    /// A round in which no class was asked (the stream's widest width was 0): every class relaxes toward its
    /// prior, as each would after a round of its own without drafts.
    pub fn relax_all(&mut self) {
        for s in &mut self.classes {
            s.observe(0, 0);
        }
    }

    /// [`AcceptStats::observe`] of `class`: `proposed = 0` (the class's width was 0) relaxes that class only.
    pub fn observe(&mut self, class: usize, proposed: usize, accepted: usize) {
        self.classes[class.min(CLASSES - 1)].observe(proposed, accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::Rng;

    fn stats(rate: f64) -> AcceptStats {
        AcceptStats::new(rate, 0.1, 0.0)
    }

    #[test]
    fn expected_tokens_values() {
        assert_eq!(expected_tokens(0, 0.7), 1.0);
        assert_eq!(expected_tokens(2, 0.5), 1.75);
        assert_eq!(expected_tokens(3, 1.0), 4.0);
        assert_eq!(expected_tokens(3, 0.0), 1.0);
        assert!((expected_tokens(4, 0.9) - (1.0 + 0.9 + 0.81 + 0.729 + 0.6561)).abs() < 1e-12);
    }

    #[test]
    fn observe_is_a_per_position_average() {
        let mut s = AcceptStats::new(0.5, 0.5, 0.5);
        s.observe(2, 1); // one success (0.75), then one failure (0.375)
        assert_eq!(s.rate(), 0.375);
        s.observe(0, 0); // relaxes halfway back to the prior
        assert_eq!(s.rate(), 0.4375);
        let mut s = AcceptStats::new(0.5, 0.5, 0.0);
        s.observe(3, 3); // three successes, nothing rejected
        assert_eq!(s.rate(), 0.9375);
        s.observe(3, 7); // accepted is capped at proposed
        assert_eq!(s.rate(), 1.0 - 0.0625 * 0.125);
        let mut s = AcceptStats::new(0.8, 0.5, 0.0);
        s.observe(4, 0);
        assert_eq!(s.rate(), 0.4);
        // Out-of-range settings are clamped, never NaN.
        let mut s = AcceptStats::new(f64::NAN, 7.0, -1.0);
        s.observe(1, 1);
        assert_eq!(s.rate(), 1.0);
    }

    /// Drafts of true per-position acceptance 0.8, chains of 4: the average estimate converges to 0.8.
    #[test]
    fn observe_converges_to_the_true_rate() {
        let mut rng = Rng::from_env();
        let mut s = AcceptStats::new(0.3, 0.05, 0.0);
        let (mut sum, mut n) = (0.0, 0);
        for round in 0..20_000 {
            let accepted = (0..4).take_while(|_| rng.chance(4, 5)).count();
            s.observe(4, accepted);
            if round >= 1000 {
                sum += s.rate();
                n += 1;
            }
        }
        let mean = sum / f64::from(n);
        assert!((mean - 0.8).abs() < 0.03, "{}: mean estimate {mean}", rng.seed_note());
    }

    #[test]
    fn flat_costs_and_high_acceptance_pick_max() {
        let flat = CostTable::from_widths(&[0.01; 17]);
        assert_eq!(flat.max_width(), 17);
        assert_eq!(stats(0.9).best_width(&flat, 8), 8);
        assert_eq!(stats(0.9).best_width(&flat, 16), 16);
        // Limited by the widths measured: 17 rows = 16 drafts.
        assert_eq!(stats(0.9).best_width(&flat, 40), 16);
        // Zero acceptance: extra rows buy nothing; ties go to fewer drafts.
        assert_eq!(stats(0.0).best_width(&flat, 8), 0);
    }

    #[test]
    fn growing_costs_and_low_acceptance_pick_few() {
        let linear = CostTable::from_widths(&(1..=16).map(f64::from).collect::<Vec<_>>());
        assert_eq!(stats(0.1).best_width(&linear, 15), 0);
        assert_eq!(stats(0.9).best_width(&linear, 15), 0, "rows at full price never pay");
        // 1 + (w − 1)/4: k=0 → 1, k=1 → 1.5/1.25 = 1.2, k=2 → 1.75/1.5 ≈ 1.17, k=3 → 1.875/1.75 ≈ 1.07.
        let shallow = CostTable::from_widths(&(0..16).map(|i| 1.0 + 0.25 * f64::from(i)).collect::<Vec<_>>());
        assert_eq!(stats(0.5).best_width(&shallow, 15), 1);
        assert_eq!(stats(0.1).best_width(&shallow, 15), 0);
        assert!(stats(0.95).best_width(&shallow, 15) >= 5);
    }

    #[test]
    fn unusable_tables() {
        assert_eq!(stats(0.9).best_width(&CostTable::default(), 8), 0);
        assert_eq!(CostTable::default().max_width(), 0);
        let gap = CostTable::new(vec![0.0, 1.0, 1.0, 1.0, f64::NAN, 1.0]);
        assert_eq!(gap.max_width(), 3);
        assert_eq!(stats(0.9).best_width(&gap, 8), 2, "stops before the unmeasured width 4");
        assert_eq!(gap.get(0), None);
        assert_eq!(stats(0.9).best_width(&CostTable::new(vec![1.0, -1.0]), 8), 0);
    }

    /// A stream that fell to "draft nothing" probes again after enough rounds without drafts.
    #[test]
    fn relaxing_resumes_drafting() {
        let shallow = CostTable::from_widths(&(0..8).map(|i| 1.0 + 0.25 * f64::from(i)).collect::<Vec<_>>());
        let mut s = AcceptStats::new(0.7, 0.5, 0.1);
        for _ in 0..2 {
            s.observe(4, 0);
        }
        assert_eq!(s.best_width(&shallow, 7), 0);
        let rounds = (1..200).find(|_| {
            s.observe(0, 0);
            s.best_width(&shallow, 7) > 0
        });
        assert!(matches!(rounds, Some(2..=40)), "resumed after {rounds:?} rounds");
    }

    /// Probes that keep failing come at growing intervals (each failure halves the relaxation), never stop, and
    /// one kept draft brings the short interval back.
    #[test]
    fn failed_probes_back_off_and_a_kept_draft_resets() {
        let shallow = CostTable::from_widths(&(0..8).map(|i| 1.0 + 0.25 * f64::from(i)).collect::<Vec<_>>());
        let mut s = AcceptStats::default();
        // Rounds without drafts until the stream drafts again; that probe keeps `kept` drafts.
        let next_probe = |s: &mut AcceptStats, kept: usize| {
            let rounds = (1..100_000).find(|_| {
                s.observe(0, 0);
                s.best_width(&shallow, 7) > 0
            });
            let k = s.best_width(&shallow, 7);
            s.observe(k, kept);
            rounds.expect("probes again")
        };
        // gaps[i] is measured after i failed probes.
        let gaps: Vec<usize> = (0..12).map(|_| next_probe(&mut s, 0)).collect();
        assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "gaps {gaps:?}");
        assert!(gaps[7] >= 8 * gaps[1], "gaps {gaps:?}");
        // Capped: the last gaps are equal.
        assert_eq!(gaps[10], gaps[11], "gaps {gaps:?}");
        // A probe that keeps a draft resets the backoff: the next failing probe comes as soon as the first did.
        next_probe(&mut s, 1);
        let after = next_probe(&mut s, 0);
        assert!(after <= gaps[1], "after a kept draft: {after}, gaps {gaps:?}");
    }

    /// Random cost tables: the choice is optimal (against an independent sum), never above `max`, and does not
    /// shrink when acceptance or `max` grows.
    #[test]
    fn best_width_is_optimal_and_monotone_property() {
        let mut rng = Rng::from_env();
        for _ in 0..2000 {
            let n = 1 + rng.below(20);
            let costs: Vec<f64> = (0..n).map(|_| 0.001 + rng.below(1000) as f64 / 1000.0).collect();
            let table = CostTable::from_widths(&costs);
            let (a1, a2) = (rng.below(101) as f64 / 100.0, rng.below(101) as f64 / 100.0);
            let (lo, hi) = (a1.min(a2), a1.max(a2));
            let max = rng.below(24);
            let note = rng.seed_note();
            let k = stats(lo).best_width(&table, max);
            assert!(k <= max && k < n, "{note}");
            let speed = |k: usize, a: f64| (0..=k).map(|i| a.powi(i as i32)).sum::<f64>() / costs[k];
            for j in 0..=max.min(n - 1) {
                assert!(speed(k, lo) >= speed(j, lo) * (1.0 - 1e-12), "{note}: k={k} beaten by {j}");
            }
            assert!(stats(hi).best_width(&table, max) >= k, "{note}: acceptance {lo} → {hi}");
            assert!(stats(lo).best_width(&table, max + 1) >= k, "{note}: max {max} → {}", max + 1);
        }
    }

    /// A proposer's own cost per drafted token is part of a round's price: the same acceptance that drafts when
    /// guesses are free drafts less, then not at all, as each guess costs more of a one-row forward.
    #[test]
    fn proposal_cost_narrows_the_window() {
        let windows = CostTable::from_widths(&[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]);
        assert_eq!(windows.with_proposal_cost(0.0), windows);
        assert_eq!(windows.with_proposal_cost(0.5).cost[1..4], [1.0, 1.6, 2.2]);
        let s = stats(0.6);
        let free = s.best_width(&windows, 7);
        let cheap = s.best_width(&windows.with_proposal_cost(0.1), 7);
        let dear = s.best_width(&windows.with_proposal_cost(0.6), 7);
        assert!(free > cheap && cheap > 0, "free {free}, cheap {cheap}");
        assert_eq!(dear, 0);
    }

    /// Classes learn apart: one that keeps failing stops drafting while another keeps its wide windows.
    #[test]
    fn classes_learn_apart() {
        let shallow = CostTable::from_widths(&(0..16).map(|i| 1.0 + 0.1 * f64::from(i)).collect::<Vec<_>>());
        let mut s = ClassStats::default();
        for _ in 0..30 {
            s.observe(1, 4, 0);
            s.observe(5, 8, 8);
        }
        assert_eq!(s.best_width(1, &shallow, 15), 0);
        assert!(s.best_width(5, &shallow, 15) >= 12, "{}", s.best_width(5, &shallow, 15));
        // An untouched class keeps its prior, and higher classes start higher; classes past the last share it.
        assert_eq!(s.class(3).rate(), CLASS_PRIORS[3]);
        assert!(CLASS_PRIORS.windows(2).all(|w| w[0] <= w[1]));
        s.observe(CLASSES + 4, 3, 0);
        assert!(s.class(CLASSES - 1).rate() < CLASS_PRIORS[CLASSES - 1]);
        assert_eq!(s.class(CLASSES + 9), s.class(CLASSES - 1));
        // A failing class probes again after rounds without drafts (relaxing), without touching the others.
        let before = s.class(5).clone();
        let rounds = (1..500).find(|_| {
            s.observe(1, 0, 0);
            s.best_width(1, &shallow, 15) > 0
        });
        assert!(rounds.is_some(), "class 1 never probes again");
        assert_eq!(s.class(5), &before);
        // Relaxing every class moves each toward the prior, the good one included.
        s.relax_all();
        assert!(s.class(5).rate() < before.rate() && s.class(5).rate() > CLASS_PRIORS[5]);
    }
}
