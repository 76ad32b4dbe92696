//! Service order within a priority level: teams below their guarantee
//! before borrowers, then the lowest weighted dominant share, then submit
//! time and id. Shares are recomputed after every placement.

use axle_policy::MILLI_PER_GPU;

use super::work::Work;
use crate::types::{WorkloadId, WorkloadSpec};

/// Total order on f64 for shares (all finite and non-negative).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Share(f64);
impl Eq for Share {}
impl PartialOrd for Share {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Share {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// (borrowing, weighted share, submit time, id, team, index in level)
pub(super) type TeamKey = (bool, Share, u64, WorkloadId, u32, usize);

impl<'s> Work<'s> {
    #[cfg(test)]
    pub(super) fn share_of(&self, team: u32, model: Option<&str>) -> f64 {
        self.share_of_model(team, self.s.cat.model_of(model))
    }

    /// [`Work::share_of`] with the model as its catalog index.
    fn share_of_model(&self, team: u32, model: Option<u16>) -> f64 {
        let info = &self.s.cat.teams[team as usize];
        let usage = &self.usage[team as usize];
        let ratio = |slot: usize| {
            let g = info.slots[slot].1.0.max(MILLI_PER_GPU);
            usage[slot].0 as f64 / g as f64
        };
        let slot_of_model = model.and_then(|m| info.charge[m as usize]);
        match slot_of_model {
            Some(slot) => ratio(slot as usize),
            None => (0..info.slots.len()).map(ratio).fold(0.0, f64::max),
        }
    }

    pub(super) fn team_key(
        &self,
        team: u32,
        spec: &WorkloadSpec,
        submit: u64,
        id: WorkloadId,
        i: usize,
    ) -> TeamKey {
        let model = self.s.cat.model_of(spec.gpu_model.as_deref());
        self.queued_key(team, model, submit, id, i)
    }

    /// [`Work::team_key`] of a queued request, from what its queue keeps
    /// beside it (the request itself is not read).
    pub(super) fn queued_key(
        &self,
        team: u32,
        model: Option<u16>,
        submit: u64,
        id: WorkloadId,
        i: usize,
    ) -> TeamKey {
        let share = self.share_of_model(team, model);
        let weight = self.s.cat.teams[team as usize]
            .weight
            .max(f64::MIN_POSITIVE);
        (share >= 1.0, Share(share / weight), submit, id, team, i)
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::state::State;
    use crate::testkit::{inventory, policy, req, run};

    #[test]
    fn teams_below_their_guarantee_come_before_borrowers_then_lowest_share() {
        let p = policy(
            &[
                ("a", &[("H100", 2.0, 8.0)]),
                ("b", &[("H100", 4.0, 8.0)]),
                ("c", &[("H100", 1.0, 8.0)]),
            ],
            BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("H100", 8)]));
        run(&mut s, req(1, "a", "training", 3.0), 0, &[0, 1, 2], 0); // share 1.5
        run(&mut s, req(2, "b", "training", 2.0), 0, &[3, 4], 0); // share 0.5
        let w = Work::new(&s, true, 0);
        let (a, b, c) = (
            w.team_key(0, &req(9, "a", "training", 1.0), 0, 9, 0),
            w.team_key(1, &req(9, "b", "training", 1.0), 0, 9, 1),
            w.team_key(2, &req(9, "c", "training", 1.0), 0, 9, 2),
        );
        assert!(a.0, "a runs above its guarantee");
        assert!(!b.0 && !c.0);
        // c (share 0) before b (share 0.5) before the borrower a.
        let mut keys = [a, b, c];
        keys.sort();
        assert_eq!(keys.map(|k| k.4), [2, 1, 0]);
        assert!((w.share_of(1, Some("H100")) - 0.5).abs() < 1e-9);
    }
}
