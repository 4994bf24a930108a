//! Draft lengths for a batch of generations that share target steps: the throughput-optimal
//! scheduler of DSpark (arXiv 2607.05147, Algorithm 1). Each generation `i` drafting `γ_i`
//! tokens puts `1 + γ_i` rows in the step and emits `E_i = 1 + Σ_{k ≤ γ_i} S_ik` tokens in
//! expectation, `S_ik` the probability that its first `k` drafts all survive. A step of `R`
//! rows costs `T(R)` seconds (measured: [`StepCosts`]). Draft slots `(i, k)` are admitted in
//! decreasing order of survival — within a generation survival falls with `k`, so every
//! admitted set is a prefix per generation — and the admitted prefix that maximises the
//! batch's expected tokens per second `Σ E_i / T(R)` is kept. Generations whose drafts do
//! not pay get `γ = 0`. Which lengths it picks never changes what is generated.
//!
//! On a target that pads every block of a step to the step's longest (a GPU's batched
//! steps, [`StepCosts::padded`]) a step of `B` generations whose longest block has `L` rows
//! costs `T(B · L)`, `L` rounded up to the block lengths the target runs: one long block
//! makes every generation's rows long, so a draft is priced by the step shape it makes, not
//! by its own rows.

/// Seconds of a target step by its rows, from a profile and refreshed by observed steps.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCosts {
    /// `(rows, seconds)`, rows strictly increasing, seconds positive.
    points: Vec<(usize, f64)>,
    /// Weight an observed step gives its nearest point.
    learn: f64,
    /// Where the target pads: the block lengths its steps run, ascending (a step's rows are
    /// its generations times the first that holds its longest block).
    padded: Option<Vec<usize>>,
    /// Seconds a row whose logits are all formed adds to a step over a row whose logits the
    /// target only bounds ([`Self::with_full_rows`]).
    full_row_s: f64,
}

impl StepCosts {
    /// Costs from measured `(rows, seconds)` points (any order; non-positive or non-finite
    /// seconds and zero rows are dropped; `None` if no point is left).
    pub fn new(points: &[(usize, f64)]) -> Option<Self> {
        let mut p: Vec<(usize, f64)> = points
            .iter()
            .copied()
            .filter(|(r, s)| *r > 0 && s.is_finite() && *s > 0.0)
            .collect();
        p.sort_by_key(|(r, _)| *r);
        p.dedup_by_key(|(r, _)| *r);
        (!p.is_empty()).then_some(Self {
            points: p,
            learn: 0.1,
            padded: None,
            full_row_s: 0.0,
        })
    }

    /// The same costs for a target whose plain sampled rows cost less than rows with every
    /// logit (a CPU target that bounds a plain round's logits instead of forming them: a
    /// drafted sampled round forms all of them in every row, its anchor's included), each
    /// of those costing `seconds` more (negative or non-finite: 0).
    pub fn with_full_rows(self, seconds: f64) -> Self {
        Self {
            full_row_s: if seconds.is_finite() {
                seconds.max(0.0)
            } else {
                0.0
            },
            ..self
        }
    }

    /// Seconds a row with every logit costs over a bounded one ([`Self::with_full_rows`]).
    pub fn full_row_s(&self) -> f64 {
        self.full_row_s
    }

    /// The same costs for a target that pads every block of a step to the first of
    /// `blocks` (its block lengths, any order) that holds the step's longest (a longer block
    /// keeps its length): a step's rows, in its points and in the steps it observes, are
    /// then its generations times that length.
    pub fn padded(self, blocks: &[usize]) -> Self {
        let mut blocks = blocks.to_vec();
        blocks.sort_unstable();
        blocks.dedup();
        Self {
            padded: Some(blocks),
            ..self
        }
    }

    /// Whether a step's rows count its padding ([`Self::padded`]).
    pub fn is_padded(&self) -> bool {
        self.padded.is_some()
    }

    /// The rows each block of a step whose longest block has `longest` tokens runs:
    /// `longest` unless the target pads it to a longer block length.
    pub fn block_rows(&self, longest: usize) -> usize {
        crate::batching::bucket(self.padded.as_deref().unwrap_or_default(), longest)
    }

    /// The measured points.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Seconds of a step of `rows` rows: linear between the points, the last segment's
    /// slope beyond them, the first point's cost below it.
    pub fn seconds(&self, rows: usize) -> f64 {
        let p = &self.points;
        let (r0, s0) = p[0];
        if rows <= r0 || p.len() == 1 {
            let per_row = s0 / r0 as f64;
            return if rows <= r0 {
                s0
            } else {
                per_row * rows as f64
            };
        }
        let i = p
            .iter()
            .position(|(r, _)| *r >= rows)
            .unwrap_or(p.len() - 1)
            .max(1);
        let ((ra, sa), (rb, sb)) = (p[i - 1], p[i]);
        let slope = (sb - sa) / (rb - ra) as f64;
        (sa + slope * (rows as f64 - ra as f64)).max(f64::MIN_POSITIVE)
    }

    /// Corrects the point nearest to `rows` (in ratio) by a step towards what an observed
    /// step of `rows` rows took against what the costs predicted. The points price rows
    /// whose logits are bounded: `full` of the rows formed every logit, and their
    /// [`Self::full_row_s`] each is taken off the step first (at most half of it).
    pub fn observe(&mut self, rows: usize, full: usize, seconds: f64) {
        if rows == 0 || !seconds.is_finite() || seconds <= 0.0 {
            return;
        }
        let seconds = seconds - (full.min(rows) as f64 * self.full_row_s).min(seconds / 2.0);
        let factor = seconds / self.seconds(rows);
        let distance = |r: usize| ((r as f64) / (rows as f64)).ln().abs();
        let nearest = self
            .points
            .iter_mut()
            .min_by(|a, b| distance(a.0).total_cmp(&distance(b.0)));
        if let Some((_, s)) = nearest {
            *s *= 1.0 + self.learn * (factor - 1.0);
        }
    }
}

/// Prefix survivals `S_1 ≥ S_2 ≥ …` from per-position acceptance rates (each given the
/// positions before it were accepted), clamped to [0, 1].
pub fn survivals(acceptance: &[f64]) -> Vec<f64> {
    acceptance
        .iter()
        .scan(1.0f64, |s, a| {
            *s *= a.clamp(0.0, 1.0);
            Some(*s)
        })
        .collect()
}

/// A generation in the batch whose draft length is not scheduled (plain decoding, a fixed
/// γ): the rows of its block and the tokens it is expected to emit per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unscheduled {
    /// Rows of its block (1 + γ).
    pub rows: usize,
    /// Its expected tokens per step.
    pub expected: f64,
}

impl Unscheduled {
    /// A plain generation: one row, one token.
    pub const PLAIN: Self = Self {
        rows: 1,
        expected: 1.0,
    };
}

/// What a scheduled generation brings: the prefix survivals of the drafts it may make and
/// the seconds its drafting takes a round. Those seconds are charged to the whole step:
/// exact where the drafter shares the target's compute (the same CPU cores or GPU),
/// conservative where it does not (the generation then steps aside while it drafts, and
/// only its own rounds lengthen) — a doubtful draft is left out rather than let in.
#[derive(Debug, Clone, PartialEq)]
pub struct Drafts {
    /// `S_1 ≥ S_2 ≥ …`, as many as it may draft.
    pub survival: Vec<f64>,
    /// Seconds of drafting per round that drafts anything.
    pub draft_s: f64,
    /// Seconds of the generation's own work that each drafted row adds to its round (a
    /// sampled row's distribution made and drawn from on the host), charged to the step
    /// like drafting: on a CPU target it takes the cores the step runs on, on a device it
    /// queues beside the step's work.
    pub row_s: f64,
}

/// The batch's expected tokens per second with draft lengths `gamma` (the definition
/// [`allocate`] maximises; it keeps running totals instead).
#[cfg(test)]
fn rate(sessions: &[Drafts], gamma: &[usize], others: &[Unscheduled], costs: &StepCosts) -> f64 {
    let mut expected: f64 = others.iter().map(|o| o.expected).sum();
    let mut blocks: Vec<usize> = others.iter().map(|o| o.rows).collect();
    let mut draft = 0.0;
    for (d, g) in sessions.iter().zip(gamma) {
        expected += 1.0 + d.survival[..*g].iter().sum::<f64>();
        blocks.push(1 + g);
        if *g > 0 {
            draft += d.draft_s.max(0.0);
        }
        draft += d.row_s.max(0.0) * *g as f64;
    }
    let rows = match costs.is_padded() {
        true => blocks.len() * costs.block_rows(blocks.iter().max().copied().unwrap_or(0)),
        false => blocks.iter().sum(),
    };
    expected / (costs.seconds(rows) + draft)
}

/// A generation as the allocation sees it: `cum[g]` its expected tokens drafting `g`
/// (`1 + S_1 + … + S_g`, survivals made falling), its drafting seconds per round and its
/// own seconds per drafted row.
#[derive(Debug)]
struct Profile {
    cum: Vec<f64>,
    draft_s: f64,
    row_s: f64,
}

impl Profile {
    fn new(d: &Drafts) -> Self {
        let falling = d.survival.iter().scan(1.0f64, |m, x| {
            *m = m.min(x.clamp(0.0, 1.0));
            Some(*m)
        });
        let cum = std::iter::once(1.0)
            .chain(falling.scan(1.0, |c, s| {
                *c += s;
                Some(*c)
            }))
            .collect();
        Self {
            cum,
            draft_s: d.draft_s.max(0.0),
            row_s: d.row_s.max(0.0),
        }
    }

    fn survival(&self, k: usize) -> f64 {
        self.cum[k] - self.cum[k - 1]
    }

    fn max(&self) -> usize {
        self.cum.len() - 1
    }
}

/// Block lengths a batch's totals tell apart (a longer block counts as this long).
const BLOCKS: usize = 65;

/// Running totals of a batch: expected tokens, rows and drafting seconds per step, and its
/// generations by block length (a padded step's shape).
#[derive(Debug, Clone, Copy)]
struct Totals {
    expected: f64,
    rows: usize,
    draft: f64,
    sequences: usize,
    blocks: [u16; BLOCKS],
}

impl Totals {
    /// The totals of a batch of `others` and `scheduled` generations drafting nothing.
    fn new(others: &[Unscheduled], scheduled: usize) -> Self {
        let mut t = Self {
            expected: scheduled as f64,
            rows: scheduled,
            draft: 0.0,
            sequences: scheduled,
            blocks: [0; BLOCKS],
        };
        t.blocks[1] = scheduled.min(u16::MAX as usize) as u16;
        others.iter().for_each(|o| t.join(o));
        t
    }

    fn join(&mut self, o: &Unscheduled) {
        self.expected += o.expected;
        self.rows += o.rows;
        self.sequences += 1;
        self.count(o.rows, 1);
    }

    fn leave(&mut self, o: &Unscheduled) {
        self.expected -= o.expected;
        self.rows = self.rows.saturating_sub(o.rows);
        self.sequences = self.sequences.saturating_sub(1);
        self.count(o.rows, -1);
    }

    fn count(&mut self, rows: usize, by: i32) {
        let n = &mut self.blocks[rows.min(BLOCKS - 1)];
        *n = (*n as i32 + by).clamp(0, u16::MAX as i32) as u16;
    }

    /// The totals with generation `p` drafting `to` tokens instead of `from`.
    fn moved(mut self, p: &Profile, from: usize, to: usize) -> Self {
        let drafting = |g: usize| p.row_s * g as f64 + if g > 0 { p.draft_s } else { 0.0 };
        self.expected += p.cum[to] - p.cum[from];
        self.rows = self.rows + to - from;
        self.draft += drafting(to) - drafting(from);
        self.count(1 + from, -1);
        self.count(1 + to, 1);
        self
    }

    /// The rows a step of this batch runs: its blocks' rows, or where the target pads them
    /// its generations times its longest block as the target runs it.
    fn step_rows(&self, costs: &StepCosts) -> usize {
        match costs.is_padded() {
            true => {
                let longest = self.blocks.iter().rposition(|n| *n > 0).unwrap_or(0);
                self.sequences * costs.block_rows(longest)
            }
            false => self.rows,
        }
    }

    fn rate(&self, costs: &StepCosts) -> f64 {
        self.expected / (costs.seconds(self.step_rows(costs)) + self.draft)
    }
}

/// The draft length of each generation that maximises the batch's expected tokens per
/// second under `costs`, beside the `others` whose lengths are given ([`BatchPlan::new`]).
pub fn allocate(sessions: &[Drafts], others: &[Unscheduled], costs: &StepCosts) -> Vec<usize> {
    BatchPlan::new(sessions, others, costs).gamma
}

/// A batch's draft lengths and running totals: built once a step ([`BatchPlan::new`]), then
/// each generation that posts a new profile gets its best length beside the others' as
/// planned ([`BatchPlan::answer`], O(its slots), read-only), so that a batch of many
/// generations, each asking every round, allocates once a step rather than once a
/// generation and its generations never wait for each other to ask.
#[derive(Debug)]
pub struct BatchPlan {
    profiles: Vec<Profile>,
    gamma: Vec<usize>,
    totals: Totals,
}

impl BatchPlan {
    /// The allocation: slots admitted by survival (a generation's drafting cost counted
    /// with its first slot) up to the best prefix, then each generation's length improved
    /// alone while any change pays, so that no single generation's length can do better.
    /// O(slots · log slots) with running totals.
    pub fn new(sessions: &[Drafts], others: &[Unscheduled], costs: &StepCosts) -> Self {
        let profiles: Vec<Profile> = sessions.iter().map(Profile::new).collect();
        let mut slots: Vec<(f64, usize)> = profiles
            .iter()
            .enumerate()
            .flat_map(|(i, p)| (1..=p.max()).map(move |k| (p.survival(k), i)))
            .collect();
        // Highest survival first; ties by generation (deterministic, prefixes kept).
        slots.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut plan = Self {
            gamma: vec![0; profiles.len()],
            totals: Totals::new(others, profiles.len()),
            profiles,
        };
        let mut best = (plan.totals.rate(costs), 0);
        for (n, (_, i)) in slots.iter().enumerate() {
            plan.set(*i, plan.gamma[*i] + 1);
            let r = plan.totals.rate(costs);
            if r > best.0 {
                best = (r, n + 1);
            }
        }
        // Back to the best prefix of admissions.
        for (_, i) in &slots[best.1..] {
            plan.set(*i, plan.gamma[*i] - 1);
        }
        for _ in 0..8 {
            let before = plan.gamma.clone();
            (0..plan.gamma.len()).for_each(|i| plan.improve(i, costs));
            if plan.gamma == before {
                break;
            }
        }
        plan
    }

    /// Each generation's draft length, in the order they were given.
    pub fn gammas(&self) -> &[usize] {
        &self.gamma
    }

    /// The best length for a generation that asks with new `drafts`, beside the others'
    /// lengths as planned; `standing` says where the plan counted it. The plan itself does
    /// not change (O(its slots)), so that many generations may ask the same plan at once.
    pub fn answer(&self, standing: Standing, drafts: &Drafts, costs: &StepCosts) -> usize {
        let mut base = self.totals;
        match standing {
            Standing::Scheduled(i) if i < self.gamma.len() => {
                base = base.moved(&self.profiles[i], self.gamma[i], 0);
            }
            Standing::Fixed(before) => {
                base.leave(&before);
                base.join(&Unscheduled::PLAIN);
            }
            Standing::Scheduled(_) | Standing::Absent => base.join(&Unscheduled::PLAIN),
        }
        best_move(&base, &Profile::new(drafts), 0, costs)
    }

    /// Generation `i`'s length set to `g`, the totals with it.
    fn set(&mut self, i: usize, g: usize) {
        self.totals = self.totals.moved(&self.profiles[i], self.gamma[i], g);
        self.gamma[i] = g;
    }

    /// Generation `i`'s length moved to the best for the batch, where a change pays.
    fn improve(&mut self, i: usize, costs: &StepCosts) {
        let g = best_move(&self.totals, &self.profiles[i], self.gamma[i], costs);
        self.set(i, g);
    }
}

/// Where a generation that asks a [`BatchPlan`] stood when it was made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Standing {
    /// The plan scheduled it, `i`-th of the generations it was given.
    Scheduled(usize),
    /// The plan counted it among the others with this block.
    Fixed(Unscheduled),
    /// The plan did not count it (it joined since).
    Absent,
}

/// The draft length for profile `p`, now drafting `from` in batch `t`, that gives the batch
/// the most tokens per second (`from` unless another pays strictly more; ties go to the
/// shorter).
fn best_move(t: &Totals, p: &Profile, from: usize, costs: &StepCosts) -> usize {
    let rated = |g: usize| t.moved(p, from, g).rate(costs);
    let mut best = (rated(from), from);
    for g in 0..=p.max() {
        let r = rated(g);
        if r > best.0 * (1.0 + 1e-12) {
            best = (r, g);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn costs(points: &[(usize, f64)]) -> StepCosts {
        StepCosts::new(points).expect("points")
    }

    /// Generations of these survivals that draft for free.
    fn free(survival: Vec<Vec<f64>>) -> Vec<Drafts> {
        survival
            .into_iter()
            .map(|survival| Drafts {
                survival,
                draft_s: 0.0,
                row_s: 0.0,
            })
            .collect()
    }

    #[test]
    fn costs_interpolate_and_extrapolate() {
        let c = costs(&[(1, 10.0), (4, 16.0), (8, 28.0)]);
        assert_eq!(c.seconds(1), 10.0);
        assert_eq!(c.seconds(2), 12.0);
        assert_eq!(c.seconds(8), 28.0);
        assert_eq!(c.seconds(12), 40.0);
        assert!(StepCosts::new(&[(0, 1.0), (3, f64::NAN)]).is_none());
    }

    #[test]
    fn full_rows_cost_what_was_measured_and_never_less_than_nothing() {
        let c = costs(&[(1, 0.01)]);
        assert_eq!(c.full_row_s(), 0.0);
        assert_eq!(c.clone().with_full_rows(0.003).full_row_s(), 0.003);
        assert_eq!(c.clone().with_full_rows(-0.003).full_row_s(), 0.0);
        assert_eq!(c.with_full_rows(f64::NAN).full_row_s(), 0.0);
    }

    #[test]
    fn observed_steps_move_the_nearest_point() {
        let mut c = costs(&[(1, 10.0), (8, 28.0)]);
        c.observe(7, 0, 2.0 * c.seconds(7));
        assert_eq!(c.points()[0], (1, 10.0));
        assert!((c.points()[1].1 - 30.8).abs() < 1e-9);
        for _ in 0..200 {
            c.observe(8, 0, 40.0);
        }
        assert!((c.seconds(8) - 40.0).abs() < 0.01);
    }

    /// A step's full rows are priced apart: the points learn what its bounded rows cost.
    #[test]
    fn observed_full_rows_are_taken_off_the_step() {
        let mut c = costs(&[(1, 10.0), (8, 28.0)]).with_full_rows(2.0);
        for _ in 0..200 {
            c.observe(8, 3, 46.0);
        }
        assert!((c.seconds(8) - 40.0).abs() < 0.01, "{:?}", c.points());
        let mut all = costs(&[(1, 10.0), (8, 28.0)]).with_full_rows(30.0);
        for _ in 0..200 {
            all.observe(8, 8, 40.0);
        }
        assert!((all.seconds(8) - 20.0).abs() < 0.01, "half a step at most");
    }

    #[test]
    fn a_flat_cost_takes_every_surviving_draft() {
        let c = costs(&[(1, 1.0), (64, 1.0)]);
        let s = vec![survivals(&[0.9, 0.5, 0.5]), survivals(&[0.1, 0.1, 0.1])];
        assert_eq!(allocate(&free(s.clone()), &[], &c), vec![3, 3]);
    }

    #[test]
    fn a_linear_cost_drafts_nothing_that_survives_less_than_the_rows_yield() {
        // Each row costs as much as the first: a draft pays only with survival ≥ tokens
        // per row, which is 1 without drafts.
        let c = costs(&[(1, 1.0), (64, 64.0)]);
        let s = vec![vec![0.99, 0.98], vec![0.5, 0.2]];
        assert_eq!(allocate(&free(s.clone()), &[], &c), vec![0, 0]);
    }

    #[test]
    fn the_batch_shares_rows_by_survival() {
        // A step of 2 rows costs 1, then 0.1 per row: good drafts go first.
        let c = costs(&[(2, 1.0), (10, 1.8)]);
        let s = vec![survivals(&[0.9, 0.9, 0.9]), survivals(&[0.6, 0.1, 0.5])];
        let g = allocate(&free(s.clone()), &[], &c);
        assert_eq!(g, vec![3, 1]);
    }

    #[test]
    fn unscheduled_generations_count_in_the_batch() {
        // Alone, a 0.5 draft pays (1.5 tokens for 1.2 against 1 for 1); beside eight plain
        // generations the batch yields 9 tokens for 8.0 and a row more costs 0.5, which
        // 0.5 of a token does not pay for.
        let c = costs(&[(1, 1.0), (2, 1.2), (9, 8.0), (10, 8.5)]);
        let s = vec![vec![0.5]];
        assert_eq!(allocate(&free(s.clone()), &[], &c), vec![1]);
        let eight = [Unscheduled::PLAIN; 8];
        assert_eq!(allocate(&free(s), &eight, &c), vec![0]);
    }

    #[test]
    fn a_plan_answers_beside_the_others_as_planned() {
        // Beside a plain generation a 0.5 draft pays (2.5 tokens for 1.2 against 2 for
        // 1.1); beside one whose fixed block of 8 rows yields 8 tokens it does not (9.5 for
        // 8.5 against 9 for 8); alone it does (1.5 for 1.1 against 1 for 1).
        let c = costs(&[(1, 1.0), (2, 1.1), (3, 1.2), (9, 8.0), (10, 8.5)]);
        let half = free(vec![vec![0.5]]);
        let none = free(vec![vec![]]);
        let beside_plain = BatchPlan::new(&none, &[Unscheduled::PLAIN], &c);
        assert_eq!(beside_plain.gammas(), &[0]);
        assert_eq!(beside_plain.answer(Standing::Scheduled(0), &half[0], &c), 1);
        let fixed = Unscheduled {
            rows: 8,
            expected: 8.0,
        };
        let beside_fixed = BatchPlan::new(&half, &[fixed], &c);
        assert_eq!(beside_fixed.gammas(), &[0]);
        assert_eq!(beside_fixed.answer(Standing::Scheduled(0), &half[0], &c), 0);
        // One the plan counted as that fixed block asks as if alone; one it did not know
        // asks beside it.
        let only_fixed = BatchPlan::new(&[], &[fixed], &c);
        assert_eq!(only_fixed.answer(Standing::Fixed(fixed), &half[0], &c), 1);
        assert_eq!(only_fixed.answer(Standing::Absent, &half[0], &c), 0);
    }

    #[test]
    fn a_padded_step_prices_a_draft_by_the_shape_it_makes() {
        // A step costs 1 + 0.02 a row. Beside eight plain generations, drafts surviving
        // 0.9 pay for their own rows (ragged: 14.1 tokens for 1.34 against 9 for 1.18) but
        // not for every generation's rows padded to the long block (81 rows: 2.62).
        let line: Vec<(usize, f64)> = [1, 64, 600]
            .iter()
            .map(|r| (*r, 1.0 + 0.02 * *r as f64))
            .collect();
        let (ragged, padded) = (costs(&line), costs(&line).padded(&[]));
        let sure = free(vec![vec![0.9; 8]]);
        let eight = [Unscheduled::PLAIN; 8];
        assert_eq!(allocate(&sure, &eight, &ragged), vec![8]);
        assert_eq!(allocate(&sure, &eight, &padded), vec![0]);
        // Where every generation drafts, rows below the longest block are free: all draft
        // alike.
        let nine = free(vec![survivals(&[0.9; 8]); 9]);
        assert_eq!(allocate(&nine, &[], &padded), vec![8; 9]);
        // A fixed long block among the others makes drafting up to it free.
        let fixed = [Unscheduled {
            rows: 9,
            expected: 4.0,
        }];
        let weak = free(vec![vec![0.2, 0.1]; 3]);
        assert_eq!(allocate(&weak, &fixed, &padded), vec![2; 3]);
    }

    #[test]
    fn a_padded_step_runs_its_longest_block_at_the_targets_length() {
        // Blocks run at 1, 2, 4 or 8 rows: a fourth draft surviving 0.5 pays for a 5-row
        // block (9 tokens for 1.5 against 8 for 1.4), not for the 8 rows it runs (1.8).
        let buckets = [1, 2, 4, 8];
        let c = costs(&[(1, 1.05), (64, 1.0 + 0.05 * 64.0)]);
        assert_eq!(
            (1..=9)
                .map(|m| c.clone().padded(&buckets).block_rows(m))
                .collect::<Vec<_>>(),
            vec![1, 2, 4, 4, 8, 8, 8, 8, 9]
        );
        let two = free(vec![vec![1.0, 1.0, 1.0, 0.5]; 2]);
        assert_eq!(allocate(&two, &[], &c.clone().padded(&[])), vec![4, 4]);
        assert_eq!(allocate(&two, &[], &c.padded(&buckets)), vec![3, 3]);
    }

    #[test]
    fn drafting_time_is_paid_once_per_round() {
        // A 0.6 draft pays for its row (1.6 tokens for 1.1 against 1 for 1) but not for a
        // draft taking half a step; three sure ones do.
        let c = costs(&[(1, 1.0), (9, 1.8)]);
        let slow = |survival: Vec<f64>| Drafts {
            survival,
            draft_s: 0.5,
            row_s: 0.0,
        };
        assert_eq!(allocate(&free(vec![vec![0.6]]), &[], &c), vec![1]);
        assert_eq!(allocate(&[slow(vec![0.6])], &[], &c), vec![0]);
        assert_eq!(allocate(&[slow(vec![1.0, 1.0, 1.0])], &[], &c), vec![3]);
    }

    #[test]
    fn each_drafted_row_pays_for_its_own_work() {
        // Eight plain generations and one whose drafts survive 0.5: a row costs the step
        // 0.25 (8 → 8.25), which 0.5 of a token pays for (9.5 / 8.25 > 9 / 8)...
        let c = costs(&[(1, 1.0), (9, 8.0), (16, 9.75)]);
        let eight = [Unscheduled::PLAIN; 8];
        let half = |row_s: f64| Drafts {
            survival: vec![0.5, 0.25],
            draft_s: 0.0,
            row_s,
        };
        assert_eq!(allocate(&[half(0.0)], &eight, &c), vec![1]);
        // ...but not when sampling the row takes another 0.25 of the generation's work.
        assert_eq!(allocate(&[half(0.25)], &eight, &c), vec![0]);
    }

    proptest! {
        /// No single-generation change, nor all-zero, nor all-max, beats the allocation.
        #[test]
        fn the_allocation_is_at_least_as_good_as_its_neighbours(
            acc in proptest::collection::vec(
                (proptest::collection::vec(0.0f64..1.0, 0..6), 0.0f64..0.6), 1..6),
            per_row in 0.0f64..1.5,
            fixed in proptest::collection::vec((1usize..10, 1.0f64..4.0), 0..4),
            padded: bool,
        ) {
            let c = costs(&[(1, 1.0), (2, 1.0 + per_row), (64, 1.0 + 63.0 * per_row)]);
            let c = if padded { c.padded(&[1, 2, 4, 8]) } else { c };
            let s: Vec<Drafts> = acc
                .iter()
                .map(|(a, d)| Drafts { survival: survivals(a), draft_s: *d, row_s: *d / 4.0 })
                .collect();
            let others: Vec<Unscheduled> = fixed
                .iter()
                .map(|(rows, expected)| Unscheduled { rows: *rows, expected: *expected })
                .collect();
            let others = others.as_slice();
            let g = allocate(&s, others, &c);
            let best = rate(&s, &g, others, &c);
            for (i, si) in s.iter().enumerate() {
                prop_assert!(g[i] <= si.survival.len());
                for other in 0..=si.survival.len() {
                    let mut h = g.clone();
                    h[i] = other;
                    prop_assert!(rate(&s, &h, others, &c) <= best * (1.0 + 1e-9), "{g:?} vs {h:?}");
                }
            }
            let plan = BatchPlan::new(&s, others, &c);
            prop_assert_eq!(plan.gammas(), g.as_slice());
            // A generation's new profile gets its best length beside the others' as planned.
            let fresh = Drafts { survival: survivals(&[0.9, 0.7, 0.5]), draft_s: 0.1, row_s: 0.02 };
            let answer = plan.answer(Standing::Scheduled(0), &fresh, &c);
            let mut t = s.clone();
            t[0] = fresh.clone();
            let mut h = g.clone();
            h[0] = answer;
            let answered = rate(&t, &h, others, &c);
            for other in 0..=3 {
                h[0] = other;
                prop_assert!(rate(&t, &h, others, &c) <= answered * (1.0 + 1e-9));
            }
            let zero = vec![0; s.len()];
            let full: Vec<usize> = s.iter().map(|d| d.survival.len()).collect();
            prop_assert!(rate(&s, &zero, others, &c) <= best * (1.0 + 1e-9));
            prop_assert!(rate(&s, &full, others, &c) <= best * (1.0 + 1e-9));
        }
    }
}
