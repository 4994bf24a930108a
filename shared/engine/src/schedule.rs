//! The draft scheduler of an engine whose generations share batched steps (DSpark's
//! Algorithm 1, [`tandem_core::schedule`]). Every running generation holds a [`Seat`]:
//! adaptive ones post the survival profile their acceptance implies and get back the draft
//! length that maximises the whole batch's expected tokens per second under the measured
//! step costs; plain and fixed-γ ones declare the rows and tokens they bring. A generation
//! alone keeps its own policy (which also weighs its drafting time). The step costs come
//! from the target's start-up profile and are refreshed by every step it runs.
//!
//! Every generation asks every round, all of them between two steps, under one lock: the
//! allocation is made once per step (by the first to ask after it, or after seats came
//! or went) and each later question is answered beside the others' lengths as they stand
//! ([`BatchPlan::respond`]). A full allocation per question was O(batch · slots) each, and
//! at 32 generations on a GPU the queue for the lock outlasted the step's wait for them.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tandem_core::{BatchPlan, Drafts, StepCosts, Unscheduled};

use crate::models::{StepObserver, StepReport};

/// What a seat brings to the batch.
#[derive(Debug, Clone)]
enum Claim {
    /// Its draft length is scheduled from these survivals and drafting time.
    Scheduled(Drafts),
    /// The block and expected tokens per step it brings whatever the scheduler says.
    Fixed(Unscheduled),
}

struct State {
    costs: StepCosts,
    seats: BTreeMap<u64, Claim>,
    next: u64,
    /// The allocation since the last step or change of seats, with the ids of the
    /// scheduled seats in its order.
    plan: Option<(Vec<u64>, BatchPlan)>,
}

impl State {
    /// The allocation of the seats as they claim now.
    fn allocate(&self) -> (Vec<u64>, BatchPlan) {
        let (mut ids, mut profiles, mut others) = (Vec::new(), Vec::new(), Vec::new());
        for (id, claim) in &self.seats {
            match claim {
                Claim::Scheduled(p) => {
                    ids.push(*id);
                    profiles.push(p.clone());
                }
                Claim::Fixed(o) => others.push(*o),
            }
        }
        (ids, BatchPlan::new(&profiles, &others, &self.costs))
    }
}

/// The scheduler of one engine's batch.
pub struct DraftScheduler {
    state: Mutex<State>,
}

impl DraftScheduler {
    /// A scheduler with `costs` as its starting step costs.
    pub fn new(costs: StepCosts) -> Self {
        Self {
            state: Mutex::new(State {
                costs,
                seats: BTreeMap::new(),
                next: 0,
                plan: None,
            }),
        }
    }

    /// A seat for a new generation, counted as one plain row until it says more.
    pub fn seat(&self) -> Seat<'_> {
        let mut s = self.lock();
        let id = s.next;
        s.next += 1;
        s.plan = None;
        s.seats.insert(id, Claim::Fixed(Unscheduled::PLAIN));
        Seat {
            scheduler: self,
            id,
        }
    }

    /// The current step costs.
    pub fn costs(&self) -> StepCosts {
        self.lock().costs.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl StepObserver for DraftScheduler {
    fn step(&self, r: &StepReport) {
        let mut s = self.lock();
        s.costs.observe(r.rows, r.seconds);
        s.plan = None;
    }
}

/// A running generation's place in the batch; leaves it when dropped.
pub struct Seat<'s> {
    scheduler: &'s DraftScheduler,
    id: u64,
}

impl Seat<'_> {
    /// Declares a fixed draft length (0: plain) and the tokens a round is expected to emit.
    pub fn fixed(&self, gamma: usize, expected: f64) {
        let now = Unscheduled {
            rows: 1 + gamma,
            expected: expected.max(1.0),
        };
        let mut s = self.scheduler.lock();
        match (s.seats.insert(self.id, Claim::Fixed(now)), s.plan.as_mut()) {
            (Some(Claim::Fixed(before)), Some((_, plan))) => plan.others_changed(before, now),
            _ => s.plan = None,
        }
    }

    /// Seconds of a one-row step as the costs stand.
    pub fn one_row_s(&self) -> f64 {
        self.scheduler.lock().costs.seconds(1)
    }

    /// Posts this generation's drafts (prefix survivals, as many as it may draft, and the
    /// seconds its drafting and each drafted row's own work take), and returns its draft
    /// length for the batch as it stands with the number of generations in it; `None` when
    /// it is alone.
    pub fn schedule(&self, drafts: Drafts) -> Option<(usize, usize)> {
        let mut s = self.scheduler.lock();
        s.seats.insert(self.id, Claim::Scheduled(drafts.clone()));
        let sessions = s.seats.len();
        if sessions < 2 {
            return None;
        }
        let planned = |p: &Option<(Vec<u64>, BatchPlan)>| {
            p.as_ref()
                .and_then(|(ids, _)| ids.iter().position(|id| *id == self.id))
        };
        if planned(&s.plan).is_none() {
            s.plan = Some(s.allocate());
        }
        let i = planned(&s.plan)?;
        let State { plan, costs, .. } = &mut *s;
        let (_, plan) = plan.as_mut()?;
        Some((plan.respond(i, &drafts, costs), sessions))
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut s = self.scheduler.lock();
        s.seats.remove(&self.id);
        s.plan = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(survival: Vec<f64>) -> Drafts {
        Drafts {
            survival,
            draft_s: 0.0,
            row_s: 0.0,
        }
    }

    fn scheduler() -> DraftScheduler {
        // A step costs 10 ms plus 5 ms a row.
        let points: Vec<(usize, f64)> = [1, 8, 64]
            .iter()
            .map(|r| (*r, 0.010 + 0.005 * *r as f64))
            .collect();
        DraftScheduler::new(StepCosts::new(&points).expect("costs"))
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
    fn steps_refresh_the_costs() {
        let s = scheduler();
        let before = s.costs().seconds(8);
        for _ in 0..50 {
            s.step(&StepReport {
                sequences: 8,
                rows: 8,
                seconds: 0.2,
                waited: 0.0,
                missed: 0,
            });
        }
        assert!(s.costs().seconds(8) > before * 2.0);
    }
}
