//! The draft scheduler of an engine whose generations share batched steps (DSpark's
//! Algorithm 1, [`tandem_core::schedule`]). Every running generation holds a [`Seat`]:
//! adaptive ones post the survival profile their acceptance implies and get back the draft
//! length that maximises the whole batch's expected tokens per second under the measured
//! step costs; plain and fixed-γ ones declare the rows and tokens they bring. A generation
//! alone keeps its own policy (which also weighs its drafting time). The step costs come
//! from the target's start-up profile and are refreshed by every step it runs. An adaptive
//! generation that joins a batch where not even drafts sure to be accepted would pay
//! decodes plainly to its end ([`Seat::sheds`]): under that load the speculative path's
//! costs on every round and step (snapshot rows, lookups, a question a round) pay for
//! nothing. A generation given no draft probes its drafter only where accepted probes
//! could earn it a length ([`Seat::probe_pays`]).
//!
//! The batch is planned once a step, on the stepper's thread before it answers the step's
//! forwards (and when seats come or go), from what every seat last posted; a generation's question
//! is answered beside the others' planned lengths from the plan as published
//! ([`BatchPlan::answer`], read-only). Generations never wait for each other: each posts
//! to its own seat and reads the shared plan. (One lock for all of them, taken twice a
//! round by every generation, kept 32 generations on an H100 queueing 0.2–0.4 ms a round
//! for it, a quarter of the step.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tandem_core::{BatchPlan, Drafts, GammaPolicy, Standing, StepCosts, Unscheduled};

use crate::models::{StepObserver, StepReport};

/// What a seat brings to the batch.
#[derive(Debug, Clone)]
enum Claim {
    /// Its draft length is scheduled from these survivals and drafting time.
    Scheduled(Drafts),
    /// The block and expected tokens per step it brings whatever the scheduler says.
    Fixed(Unscheduled),
}

/// A seat's claim, written by its generation and read when the batch is planned.
type Slot = Arc<Mutex<Claim>>;

/// The batch as planned: the allocation, where each seat stood in it (one entry a seat)
/// and the costs it used.
struct Published {
    plan: BatchPlan,
    standing: BTreeMap<u64, Standing>,
    costs: StepCosts,
}

impl Published {
    /// The plan of `claims` (by seat) under `costs`.
    fn plan(claims: &BTreeMap<u64, Claim>, costs: StepCosts) -> Self {
        let (mut profiles, mut others) = (Vec::new(), Vec::new());
        let mut standing = BTreeMap::new();
        for (id, claim) in claims {
            let place = match claim {
                Claim::Scheduled(d) => {
                    profiles.push(d.clone());
                    Standing::Scheduled(profiles.len() - 1)
                }
                Claim::Fixed(o) => {
                    others.push(*o);
                    Standing::Fixed(*o)
                }
            };
            standing.insert(*id, place);
        }
        Self {
            plan: BatchPlan::new(&profiles, &others, &costs),
            standing,
            costs,
        }
    }
}

/// The scheduler of one engine's batch.
pub struct DraftScheduler {
    /// Every seat's claim.
    seats: Mutex<BTreeMap<u64, Slot>>,
    next: AtomicU64,
    /// The step costs as observed (the stepper's).
    costs: Mutex<StepCosts>,
    /// The latest plan, read by every generation's question.
    published: RwLock<Arc<Published>>,
    /// Whether the latest generation to join started without speculation ([`Seat::sheds`]).
    shedding: AtomicBool,
}

impl DraftScheduler {
    /// A scheduler with `costs` as its starting step costs.
    pub fn new(costs: StepCosts) -> Self {
        let published = Published::plan(&BTreeMap::new(), costs.clone());
        Self {
            seats: Mutex::default(),
            next: AtomicU64::new(0),
            costs: Mutex::new(costs),
            published: RwLock::new(Arc::new(published)),
            shedding: AtomicBool::new(false),
        }
    }

    /// A seat for a new generation, counted as one plain row until it says more.
    pub fn seat(&self) -> Seat<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Mutex::new(Claim::Fixed(Unscheduled::PLAIN)));
        lock(&self.seats).insert(id, slot.clone());
        self.replan();
        Seat {
            scheduler: self,
            id,
            slot,
        }
    }

    /// The current step costs.
    pub fn costs(&self) -> StepCosts {
        lock(&self.costs).clone()
    }

    /// Plans the batch from every seat's latest claim and publishes the plan.
    fn replan(&self) {
        let claims: BTreeMap<u64, Claim> = lock(&self.seats)
            .iter()
            .map(|(id, slot)| (*id, lock(slot).clone()))
            .collect();
        let planned = Arc::new(Published::plan(&claims, self.costs()));
        *self.published.write().unwrap_or_else(|e| e.into_inner()) = planned;
    }

    fn published(&self) -> Arc<Published> {
        self.published
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Locks `m`; what it guards stays consistent whatever panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StepObserver for DraftScheduler {
    fn step(&self, r: &StepReport) {
        lock(&self.costs).observe(r.rows, r.full_rows, r.seconds);
        self.replan();
    }
}

/// A running generation's place in the batch; leaves it when dropped.
pub struct Seat<'s> {
    scheduler: &'s DraftScheduler,
    id: u64,
    slot: Slot,
}

impl Seat<'_> {
    /// Declares a fixed draft length (0: plain) and the tokens a round is expected to emit.
    pub fn fixed(&self, gamma: usize, expected: f64) {
        *lock(&self.slot) = Claim::Fixed(Unscheduled {
            rows: 1 + gamma,
            expected: expected.max(1.0),
        });
    }

    /// Seconds of a one-row step as the costs stand.
    pub fn one_row_s(&self) -> f64 {
        self.scheduler.published().costs.seconds(1)
    }

    /// Posts this generation's drafts (prefix survivals, as many as it may draft, and the
    /// seconds its drafting and each drafted row's own work take), and returns its draft
    /// length beside the others' planned ones with the number of generations in the batch;
    /// `None` when it is alone.
    pub fn schedule(&self, drafts: Drafts) -> Option<(usize, usize)> {
        *lock(&self.slot) = Claim::Scheduled(drafts.clone());
        let (gamma, sessions) = self.answer(&drafts);
        (sessions >= 2).then_some((gamma, sessions))
    }

    /// Whether the batch would give `drafts` any length beside the others' planned ones,
    /// without posting them (a probe's question: [`GammaPolicy::hopeful_survival`]).
    pub fn would_draft(&self, drafts: &Drafts) -> bool {
        self.answer(drafts).0 > 0
    }

    /// The published plan's length for `drafts` at this seat, and the generations it
    /// counts (a seat the plan does not know joined since: one more than it counted).
    fn answer(&self, drafts: &Drafts) -> (usize, usize) {
        let p = self.scheduler.published();
        let standing = p.standing.get(&self.id).copied();
        let sessions = p.standing.len() + usize::from(standing.is_none());
        let standing = standing.unwrap_or(Standing::Absent);
        (p.plan.answer(standing, drafts, &p.costs), sessions)
    }

    /// Whether a probe (a one-token draft after plain rounds) is worth its round to a
    /// generation with `policy` that the batch now gives no draft: only if the batch would
    /// give it a length had the next probes all been accepted
    /// ([`GammaPolicy::hopeful_survival`]). Otherwise no outcome of the probe changes what
    /// the generation does, and it only costs the batch a drafter call and a row.
    pub fn probe_pays(&self, policy: &GammaPolicy) -> bool {
        let hopeful = Drafts {
            survival: policy.hopeful_survival(),
            ..self.drafts(policy)
        };
        self.would_draft(&hopeful)
    }

    /// The seconds an adaptive generation with `policy` drafts a round, as the batch counts
    /// them (its drafting cost in its own step time, or in a one-row step's).
    pub fn draft_seconds(&self, policy: &GammaPolicy) -> f64 {
        policy.draft_seconds(self.one_row_s())
    }

    /// What an adaptive generation with `policy` brings the batch each round: the
    /// survivals it expects and its drafting and per-row seconds (a sampled generation's
    /// drafted rows are bounded as its plain ones are, so they cost what those do).
    pub fn drafts(&self, policy: &GammaPolicy) -> Drafts {
        Drafts {
            survival: policy.survival(),
            draft_s: self.draft_seconds(policy),
            row_s: policy.row_seconds(),
        }
    }

    /// Whether an adaptive generation joining the batch with `policy` (what generations
    /// sampled the same way learnt of their drafter's costs) starts without speculation:
    /// asked as for its first round with drafts certain to be accepted, the scheduler gives
    /// it no draft beside the others — at this load no text could make drafting pay
    /// (vLLM's `speculative_disable_by_batch_size`, at the batch size the measured step
    /// costs give). It then decodes plainly to its end (no drafter session, no snapshot
    /// rows, no lookup, no question a round), as each of those would cost every step of
    /// the batch. Alone it never sheds. The first shed after admissions that were not, and
    /// the reverse, are logged.
    pub fn sheds(&self, policy: &GammaPolicy) -> bool {
        let drafts = self.drafts(policy);
        let certain = Drafts {
            survival: vec![1.0; drafts.survival.len()],
            ..drafts
        };
        let asked = self.schedule(certain);
        let shed = matches!(asked, Some((0, _)));
        // Counted as one plain row until its rounds say more, as any seat that comes.
        self.fixed(0, 1.0);
        let sessions = asked.map_or(1, |(_, n)| n);
        if self.scheduler.shedding.swap(shed, Ordering::Relaxed) != shed {
            match shed {
                true => tracing::info!(
                    sessions,
                    "speculation shed: new generations decode plainly, at this load the \
                     batch's scheduler would give a newcomer no draft, not even a sure one"
                ),
                false => tracing::info!(sessions, "speculation back for new generations"),
            }
        }
        shed
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        lock(&self.scheduler.seats).remove(&self.id);
        self.scheduler.replan();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn free(survival: Vec<f64>) -> Drafts {
        Drafts {
            survival,
            draft_s: 0.0,
            row_s: 0.0,
        }
    }

    /// A step costs 10 ms plus 5 ms a row (the engine's tests' step costs).
    pub(crate) fn costs() -> StepCosts {
        let points: Vec<(usize, f64)> = [1, 8, 64]
            .iter()
            .map(|r| (*r, 0.010 + 0.005 * *r as f64))
            .collect();
        StepCosts::new(&points).expect("costs")
    }

    fn scheduler() -> DraftScheduler {
        DraftScheduler::new(costs())
    }

    fn step(s: &DraftScheduler, rows: usize, seconds: f64) {
        s.step(&StepReport {
            sequences: rows,
            rows,
            seconds,
            waited: 0.0,
            missed: 0,
            drawn: 0,
            full_rows: 0,
        });
    }

    #[test]
    fn a_lone_generation_keeps_its_own_policy() {
        let s = scheduler();
        let seat = s.seat();
        assert_eq!(seat.schedule(free(vec![0.9, 0.8])), None);
    }

    #[test]
    fn seats_share_the_batch_and_leave_it() {
        let s = scheduler();
        let (a, b) = (s.seat(), s.seat());
        // Sure drafts pay beside a plain generation; hopeless ones do not.
        assert_eq!(a.schedule(free(vec![0.99, 0.98, 0.97])), Some((3, 2)));
        assert_eq!(b.schedule(free(vec![0.01, 0.0001])), Some((0, 2)));
        let crowd: Vec<Seat<'_>> = (0..30).map(|_| s.seat()).collect();
        crowd.iter().for_each(|c| c.fixed(0, 1.0));
        // Beside thirty plain generations a row costs more than a 0.5 draft brings.
        assert_eq!(a.schedule(free(vec![0.5, 0.25])), Some((0, 32)));
        drop(crowd);
        drop(b);
        assert_eq!(a.schedule(free(vec![0.5, 0.25])), None);
    }

    #[test]
    fn newcomers_shed_speculation_where_no_draft_could_pay() {
        // A device's steps: 2 ms up to 32 rows, then dearer; blocks padded to a bucket.
        let points = [(1, 0.002), (32, 0.0025), (64, 0.004), (512, 0.030)];
        let costs = StepCosts::new(&points).expect("costs");
        let s = DraftScheduler::new(costs.padded(&[1, 2, 4, 8, 16]));
        let policy = GammaPolicy::new(tandem_core::GammaPolicyConfig::new(4)).expect("policy");
        let first = s.seat();
        // Alone a generation keeps its own policy.
        assert!(!first.sheds(&policy));
        // Beside one other, four sure drafts (every block padded to 8 rows) pay.
        assert!(!s.seat().sheds(&policy));
        let crowd: Vec<Seat<'_>> = (0..30).map(|_| s.seat()).collect();
        crowd.iter().for_each(|c| c.fixed(0, 1.0));
        step(&s, 32, 0.0025);
        // Beside thirty-two plain generations, one block of 8 makes a step of 264 rows:
        // even sure drafts do not pay, and the newcomer counts as one plain row.
        let newcomer = s.seat();
        assert!(newcomer.sheds(&policy));
        step(&s, 33, 0.0026);
        let standing = s.published().standing.get(&newcomer.id).copied();
        assert_eq!(standing, Some(Standing::Fixed(Unscheduled::PLAIN)));
        drop(crowd);
        step(&s, 3, 0.002);
        assert!(!s.seat().sheds(&policy), "the crowd gone, drafts pay again");
    }

    /// A generation given no draft probes its drafter only where accepted probes could
    /// earn it a length beside the others; asking so posts nothing.
    #[test]
    fn probes_only_where_hope_could_pay() {
        let s = scheduler();
        let (a, _b) = (s.seat(), s.seat());
        let fresh = GammaPolicy::new(tandem_core::GammaPolicyConfig::new(4)).expect("policy");
        let mut rejected = fresh.clone();
        for _ in 0..60 {
            rejected.record(1, 0, 0.002, 0.03);
        }
        // Beside a plain generation (10 ms a step, 5 a row; drafting 0.2 of a 15 ms step)
        // two drafts hoped at 0.8 and 0.64 pay (3.44 tokens in 33 ms against 2 in 20);
        // after sixty rejections even the hope (below 0.2) does not.
        assert!(a.probe_pays(&fresh));
        assert!(!a.probe_pays(&rejected));
        assert!(matches!(*lock(&a.slot), Claim::Fixed(Unscheduled::PLAIN)));
    }

    #[test]
    fn claims_reach_the_plan_at_the_next_step() {
        let s = scheduler();
        let (a, b) = (s.seat(), s.seat());
        // Beside a plain generation (10 ms a step, 5 a row) a 0.6 draft pays (2.6 tokens
        // for 25 ms against 2 for 20)...
        assert_eq!(a.schedule(free(vec![0.6])), Some((1, 2)));
        // ...but not beside one that declares a block of 16 sure rows (17.6 for 100 ms
        // against 17 for 95), once a step has planned the batch with it.
        b.fixed(15, 16.0);
        assert_eq!(a.schedule(free(vec![0.6])), Some((1, 2)));
        step(&s, 2, 0.020);
        assert_eq!(a.schedule(free(vec![0.6])), Some((0, 2)));
    }

    #[test]
    fn a_seat_the_plan_does_not_know_asks_as_one_more() {
        // A step's plan read the seats before `a` came, and was published after the plan
        // `a` made when it came.
        let s = scheduler();
        let a = s.seat();
        *s.published.write().expect("plan") =
            Arc::new(Published::plan(&BTreeMap::new(), s.costs()));
        // The plan counts no seat; the one that asks is one more than that: alone.
        assert_eq!(a.schedule(free(vec![0.9])), None);
        let _b = s.seat();
        assert_eq!(a.schedule(free(vec![0.9])), Some((1, 2)));
    }

    #[test]
    fn generations_ask_while_the_stepper_plans() {
        // Sixteen generations ask every round, each its own way, while steps plan the
        // batch: no one waits for another, every answer is within what was posted, and
        // every generation is counted once.
        let s = scheduler();
        let seats: Vec<Seat<'_>> = (0..16).map(|_| s.seat()).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let stepper = scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    step(&s, 16, 0.09);
                }
            });
            for (i, seat) in seats.iter().enumerate() {
                scope.spawn(move || {
                    for round in 0..300 {
                        let survival = vec![0.95 - 0.05 * (i % 4) as f64; 1 + (i + round) % 8];
                        let most = survival.len();
                        if (i + round) % 5 == 0 {
                            seat.fixed(round % 3, 1.0 + (round % 3) as f64);
                            continue;
                        }
                        let (gamma, sessions) = seat.schedule(free(survival)).expect("shared");
                        assert!(gamma <= most, "{gamma} > {most}");
                        assert_eq!(sessions, 16);
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
            stepper.join().expect("stepper");
        });
        assert_eq!(s.published().standing.len(), 16);
    }

    #[test]
    fn steps_refresh_the_costs() {
        let s = scheduler();
        let before = s.costs().seconds(8);
        for _ in 0..50 {
            step(&s, 8, 0.2);
        }
        assert!(s.costs().seconds(8) > before * 2.0);
        assert!(s.published().costs.seconds(8) > before * 2.0);
    }
}
