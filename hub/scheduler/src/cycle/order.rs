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
    pub(super) fn share_of(&self, team: u32, model: Option<&str>) -> f64 {
        let info = &self.s.cat.teams[team as usize];
        let usage = &self.usage[team as usize];
        let ratio = |slot: usize| {
            let g = info.slots[slot].1.0.max(MILLI_PER_GPU);
            usage[slot].0 as f64 / g as f64
        };
        let slot_of_model = model
            .and_then(|m| self.s.cat.model_index.get(m))
            .and_then(|&m| info.charge[m as usize]);
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
        let share = self.share_of(team, spec.gpu_model.as_deref());
        let weight = self.s.cat.teams[team as usize]
            .weight
            .max(f64::MIN_POSITIVE);
        (share >= 1.0, Share(share / weight), submit, id, team, i)
    }
}
