//! What a cycle remembers about failed requests: a request shape that did
//! not fit proves that every request asking for at least as much under the
//! same constraints fails too (capacity only shrinks within a cycle).

use std::collections::BTreeMap;
use std::ops::Bound;

use axle_policy::{MILLI_PER_GPU, Milli};

use super::work::Work;
use crate::state::QueueKey;
use crate::types::{PendingReason, WorkloadId, WorkloadSpec};

/// What makes two requests of a cycle interchangeable for feasibility: if one
/// failed, the other fails too (capacity only shrinks and usage only grows
/// within a cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ShapeKey<'a> {
    pub(super) team: u32,
    pub(super) class: u16,
    pub(super) model: Option<&'a str>,
    pub(super) gpus: Milli,
    pub(super) replicas: u32,
    pub(super) spread: bool,
    pub(super) regions: &'a [String],
}

/// Does a failure recorded this cycle prove that `key` fails too?
pub(super) fn dominated(
    failed: &BTreeMap<ShapeKey<'_>, PendingReason>,
    key: &ShapeKey<'_>,
) -> bool {
    // Failures of the same team and class sort together, from this bound on.
    let first = ShapeKey {
        team: key.team,
        class: key.class,
        model: None,
        gpus: Milli::ZERO,
        replicas: 0,
        spread: false,
        regions: &[],
    };
    failed
        .range(first..)
        .take_while(|(f, _)| f.team == key.team && f.class == key.class)
        .any(|(f, _)| f.dominates(key))
}

impl<'a> ShapeKey<'a> {
    /// The shape of `spec` for `team` and `class`.
    pub(super) fn of(spec: &'a WorkloadSpec, team: u32, class: u16) -> ShapeKey<'a> {
        ShapeKey {
            team,
            class,
            model: spec.gpu_model.as_deref(),
            gpus: spec.gpus_per_replica,
            replicas: spec.replicas,
            spread: spec.allow_spread,
            regions: &spec.regions,
        }
    }
}

impl ShapeKey<'_> {
    /// Does a failure of `self` imply a failure of `other`? True when `other`
    /// asks for at least as much under at least the same constraints.
    pub(super) fn dominates(&self, other: &ShapeKey<'_>) -> bool {
        self.team == other.team
            && self.class == other.class
            && self.model == other.model
            && self.regions == other.regions
            && (self.spread || !other.spread)
            && other.replicas >= self.replicas
            && other.gpus >= self.gpus
            && (self.gpus.0 >= MILLI_PER_GPU) == (other.gpus.0 >= MILLI_PER_GPU)
    }
}

impl<'s> Work<'s> {
    /// The first request after `after` in queue `key` whose shape no
    /// failure of this cycle dominates: the next one that could still be
    /// placed. `None` when every shape left is known not to fit.
    pub(super) fn next_unfailed(
        &self,
        key: &QueueKey,
        team: u32,
        class: u16,
        after: (u64, WorkloadId),
        failed: &BTreeMap<ShapeKey<'_>, PendingReason>,
    ) -> Option<(u64, WorkloadId)> {
        let shapes = self.s.queue_shapes.get(key)?;
        shapes
            .iter()
            .filter(|(shape, _)| {
                let k = ShapeKey {
                    team,
                    class,
                    model: shape.model.as_deref(),
                    gpus: shape.gpus,
                    replicas: shape.replicas,
                    spread: shape.spread,
                    regions: &shape.regions,
                };
                !dominated(failed, &k)
            })
            .filter_map(|(_, of_shape)| {
                of_shape
                    .range((Bound::Excluded(after), Bound::Unbounded))
                    .next()
                    .copied()
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(gpus: u64, replicas: u32, spread: bool) -> ShapeKey<'static> {
        ShapeKey {
            team: 0,
            class: 0,
            model: Some("H100"),
            gpus: Milli(gpus),
            replicas,
            spread,
            regions: &[],
        }
    }

    #[test]
    fn a_failure_proves_failure_only_for_requests_at_least_as_large() {
        let failed = key(2000, 1, false);
        assert!(failed.dominates(&key(2000, 1, false)));
        assert!(failed.dominates(&key(4000, 2, false)));
        assert!(!failed.dominates(&key(1000, 1, false)), "smaller may fit");
        // A fraction and whole GPUs are placed differently.
        assert!(!key(500, 1, false).dominates(&key(1000, 1, false)));
        // Spreading only helps.
        assert!(!failed.dominates(&key(2000, 1, true)));
        assert!(key(2000, 1, true).dominates(&key(2000, 1, false)));
        let mut other_team = key(2000, 1, false);
        other_team.team = 1;
        assert!(!failed.dominates(&other_team));
        let memo = BTreeMap::from([(failed, PendingReason::NotEvaluated)]);
        assert!(dominated(&memo, &key(8000, 1, false)));
        assert!(!dominated(&memo, &key(1000, 1, false)));
    }
}
