//! Quota checks of a cycle: which GPU models a request may use under its
//! team's limits, and whether a team runs above its guarantee.

use axle_policy::Milli;

use super::work::Work;
use crate::types::{PendingReason, WorkloadSpec};

impl<'s> Work<'s> {
    /// Models this request may use, each with the quota slot it is charged to.
    /// Err: the reason none is allowed.
    pub(super) fn allowed_models(
        &self,
        spec: &WorkloadSpec,
        team: u32,
    ) -> Result<Vec<(u16, u16)>, PendingReason> {
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
        let mut out = Vec::new();
        let mut limit_reason = None;
        for m in candidates {
            let Some(slot) = info.charge[m as usize] else {
                continue;
            };
            let (class, _, limit) = &info.slots[slot as usize];
            let used = self.usage[team as usize][slot as usize];
            if used + spec.total_gpus() > *limit {
                limit_reason.get_or_insert(PendingReason::TeamAtLimit {
                    team: info.name.clone(),
                    gpu_class: class.clone(),
                    limit: *limit,
                    used,
                    requested: spec.total_gpus(),
                });
                continue;
            }
            out.push((m, slot));
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

    /// Is `team` above its guarantee on `slot` even after giving up `minus`?
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
