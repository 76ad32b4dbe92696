//! Quota checks of a cycle: which GPU models a request may use under its
//! team's limits, how much of its own team's lower-priority work must make
//! room first, and whether a team runs above its guarantee.

use axle_policy::Milli;

use super::work::Work;
use crate::types::{PendingReason, WorkloadSpec};

/// A GPU model a request may use, the quota slot of its team it is charged
/// to, and how much of the team's own work in that slot must stop before it
/// fits the team's limit. A `deficit` above zero is only offered when the
/// team's own work that this class may preempt covers it. (Work that is
/// never preempted must also fit, with the team's other such work, in the
/// guarantee; preempting the team's other work cannot help that.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ModelChoice {
    pub model: u16,
    pub slot: u16,
    pub deficit: Milli,
}

impl<'s> Work<'s> {
    /// GPUs of `team`'s running work on `slot` that `class` may preempt by
    /// priority (and that this cycle has not preempted yet).
    pub(super) fn own_preemptible(&self, team: u32, slot: u16, class: u16) -> Milli {
        self.s.team_running[team as usize]
            .iter()
            .filter(|id| !self.preempted.contains(id))
            .map(|id| &self.s.running[id])
            .filter(|r| {
                r.slot == slot && self.s.cat.classes[r.class as usize].preemptible_by(class)
            })
            .map(|r| r.spec.total_gpus())
            .sum()
    }

    /// Models this request may use, each with the quota slot it is charged
    /// to and the deficit its own team's work must free. Err: the reason
    /// none is allowed.
    // A reason is built once per failed request shape and kept; boxing it
    // would only move that one allocation.
    #[allow(clippy::result_large_err)]
    pub(super) fn allowed_models(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
    ) -> Result<Vec<ModelChoice>, PendingReason> {
        let info = &self.s.cat.teams[team as usize];
        let candidates: Vec<u16> = match &spec.gpu_model {
            Some(m) => match self.s.cat.model_index.get(m) {
                Some(&i) => vec![i],
                None => {
                    return Err(PendingReason::NoMatchingCluster {
                        gpu_model: spec.gpu_model.clone(),
                        regions: spec.regions.clone(),
                    });
                }
            },
            None => (0..self.s.cat.models.len() as u16).collect(),
        };
        let idle_only = self.s.cat.classes[class as usize].idle_only;
        let mut out = Vec::new();
        let mut limit_reason = None;
        for m in candidates {
            let Some(slot) = info.charge[m as usize] else {
                continue;
            };
            let (gpu_class, guaranteed, limit) = &info.slots[slot as usize];
            let used = self.usage[team as usize][slot as usize];
            let fixed = self.usage_fixed[team as usize][slot as usize];
            let never_preempted = !self.s.cat.classes[class as usize].is_preemptible();
            if self.s.cat.guarantees_hard
                && never_preempted
                && fixed + spec.total_gpus() > *guaranteed
            {
                // Only the team's other never-preempted work holds its
                // guarantee; preempting its other work would not help.
                limit_reason.get_or_insert(PendingReason::TeamAtLimit {
                    team: info.name.clone(),
                    gpu_class: gpu_class.clone(),
                    limit: *guaranteed,
                    used: fixed,
                    requested: spec.total_gpus(),
                    within_guarantee_only: true,
                    own_preemptible: Milli::ZERO,
                });
                continue;
            }
            let cap = *limit;
            let need = used + spec.total_gpus();
            if need <= cap {
                out.push(ModelChoice {
                    model: m,
                    slot,
                    deficit: Milli::ZERO,
                });
                continue;
            }
            let deficit = need.saturating_sub(cap);
            let own = if idle_only {
                Milli::ZERO
            } else {
                self.own_preemptible(team, slot, class)
            };
            if own >= deficit {
                out.push(ModelChoice {
                    model: m,
                    slot,
                    deficit,
                });
                continue;
            }
            limit_reason.get_or_insert(PendingReason::TeamAtLimit {
                team: info.name.clone(),
                gpu_class: gpu_class.clone(),
                limit: cap,
                used,
                requested: spec.total_gpus(),
                within_guarantee_only: false,
                own_preemptible: own,
            });
        }
        if out.is_empty() {
            return Err(
                limit_reason.unwrap_or_else(|| PendingReason::NoQuotaForModel {
                    team: info.name.clone(),
                    gpu_model: spec.gpu_model.clone().unwrap_or_else(|| "any".to_string()),
                }),
            );
        }
        Ok(out)
    }

    /// Does `team` still run above its guarantee on `slot` (it borrows)
    /// after giving up `minus`?
    pub(super) fn borrows_after(&self, team: u32, slot: u16, minus: Milli) -> bool {
        let used = self.usage[team as usize][slot as usize];
        let g = self.s.cat.teams[team as usize].slots[slot as usize].1;
        used.0 >= minus.0 && Milli(used.0 - minus.0) > g
    }

    /// Is `team` at or above its guarantee on `slot` after giving up
    /// `minus` (above it, for `minus` zero)?
    pub(super) fn is_borrower(&self, team: u32, slot: u16, minus: Milli) -> bool {
        let used = self.usage[team as usize][slot as usize];
        let g = self.s.cat.teams[team as usize].slots[slot as usize].1;
        if minus == Milli::ZERO {
            used > g
        } else {
            used.0 >= minus.0 && Milli(used.0 - minus.0) >= g
        }
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::{Any, BorrowedOnly};

    use super::*;
    use crate::state::State;
    use crate::testkit::{gpus, inventory, policy, req, run};

    fn state(cross: axle_policy::CrossTeamPreemption) -> State {
        let p = policy(&[("ml", &[("H100", 2.0, 4.0)])], cross);
        let mut s = State::new(p, &inventory(&[("H100", 8)]));
        run(&mut s, req(1, "ml", "batch", 2.0), 0, &[0, 1], 0);
        run(&mut s, req(2, "ml", "production", 2.0), 0, &[2, 3], 0);
        s
    }

    #[test]
    fn at_the_limit_own_lower_priority_work_is_a_deficit_to_free() {
        let s = state(BorrowedOnly);
        let w = Work::new(&s, true, 0);
        let training = s.cat.class_index["training"];
        let batch = s.cat.class_index["batch"];
        // 4 in use of a limit of 4: the 2 of batch may make room for training.
        let c = w
            .allowed_models(&req(3, "ml", "training", 1.0), 0, training)
            .unwrap();
        assert_eq!(c[0].deficit, gpus(1.0));
        assert_eq!(w.own_preemptible(0, 0, training), gpus(2.0));
        // More than the team's batch work could free: at its limit.
        let r = w
            .allowed_models(&req(4, "ml", "training", 3.0), 0, training)
            .unwrap_err();
        assert!(
            matches!(r, PendingReason::TeamAtLimit { own_preemptible, .. } if own_preemptible == gpus(2.0))
        );
        // Batch cannot preempt batch.
        assert!(
            w.allowed_models(&req(5, "ml", "batch", 1.0), 0, batch)
                .is_err()
        );
    }

    #[test]
    fn never_preempted_work_fits_its_guarantee_with_the_teams_other_such_work() {
        let production = |s: &State| s.cat.class_index["production"];
        let s = state(BorrowedOnly);
        let w = Work::new(&s, true, 0);
        // 2 of production already fill the guarantee of 2.
        let r = w
            .allowed_models(&req(3, "ml", "production", 1.0), 0, production(&s))
            .unwrap_err();
        assert!(matches!(
            r,
            PendingReason::TeamAtLimit {
                within_guarantee_only: true,
                ..
            }
        ));
        // With `any`, guarantees do not bound it.
        let s = state(Any);
        let w = Work::new(&s, true, 0);
        let c = w
            .allowed_models(&req(3, "ml", "production", 1.0), 0, production(&s))
            .unwrap();
        assert_eq!(c[0].deficit, gpus(1.0), "still within the limit of 4");
    }

    #[test]
    fn borrower_means_above_the_guarantee_even_after_giving_up() {
        let s = state(BorrowedOnly);
        let w = Work::new(&s, true, 0);
        assert!(w.is_borrower(0, 0, Milli::ZERO), "4 in use, 2 guaranteed");
        assert!(w.is_borrower(0, 0, gpus(2.0)), "giving up 2 leaves it at 2");
        assert!(!w.is_borrower(0, 0, gpus(3.0)));
    }
}
