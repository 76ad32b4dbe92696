//! Admission checks for a workload request: known team and class, a sane GPU
//! amount, and a shape that some node or cluster could ever hold.

use axle_policy::{MILLI_PER_GPU, Milli};

use crate::catalog::Catalog;
use crate::error::RequestError;
use crate::types::WorkloadSpec;

/// Gangs larger than this are refused: the scheduler plans a gang replica by
/// replica, and no cluster Axle targets has more GPUs than this.
pub const MAX_GANG_REPLICAS: u32 = 4096;

/// Checks `spec` against the catalog. `admission`: a new request, which must
/// also fit the caps the cycle enforces (work that is never preempted fits
/// in its team's guarantee); adopting a running workload skips that check,
/// since a policy change must not throw out work that already runs.
pub(crate) fn validate(
    state: &Catalog,
    spec: &WorkloadSpec,
    admission: bool,
) -> Result<(), RequestError> {
    let Some(&team) = state.team_index.get(&spec.team) else {
        return Err(RequestError::UnknownTeam {
            team: spec.team.clone(),
            known: join(state.team_index.keys()),
        });
    };
    if !state.class_index.contains_key(&spec.priority_class) {
        return Err(RequestError::UnknownPriorityClass {
            class: spec.priority_class.clone(),
            known: join(state.class_index.keys()),
        });
    }
    for r in spec.regions.iter().filter(|_| admission) {
        if !state.regions.contains(r) {
            return Err(RequestError::UnknownRegion {
                region: r.clone(),
                known: join(state.regions.iter()),
            });
        }
    }
    if spec.gpus_per_replica.0 == 0 {
        return Err(RequestError::ZeroGpus);
    }
    if spec.replicas == 0 {
        return Err(RequestError::ZeroReplicas);
    }
    if spec.replicas > MAX_GANG_REPLICAS {
        return Err(RequestError::GangTooLarge {
            replicas: spec.replicas,
            max: MAX_GANG_REPLICAS,
        });
    }
    let g = spec.gpus_per_replica;
    let granularity = state.policy.settings.fraction_granularity;
    if g.0 < MILLI_PER_GPU {
        if granularity.0 == 0 || !g.0.is_multiple_of(granularity.0) {
            return Err(RequestError::BadFraction {
                got: g,
                granularity,
            });
        }
    } else if !g.is_whole() {
        return Err(RequestError::NotWhole(g));
    }
    let team_info = &state.teams[team as usize];
    let class = &state.classes[state.class_index[&spec.priority_class] as usize];
    let within_guarantee = admission && state.guarantees_hard && !class.is_preemptible();
    // Models this request could use: the named one, or all.
    let models: Vec<u16> = match &spec.gpu_model {
        Some(m) => match state.model_index.get(m) {
            Some(&i) => vec![i],
            None => {
                return Err(RequestError::UnknownGpuModel {
                    model: m.clone(),
                    known: join(state.models.iter()),
                });
            }
        },
        None => (0..state.models.len() as u16).collect(),
    };
    // Some model must have quota, a limit that admits the request, and nodes big enough.
    // The most telling refusal wins: a shape no node can hold says more than
    // one model's quota limit, which says more than a missing quota.
    let mut first_err: Option<RequestError> = None;
    let mut note = |e: RequestError| {
        let rank = |e: &RequestError| match e {
            RequestError::NeverFitsNode { .. } => 3,
            RequestError::AboveLimit { .. }
            | RequestError::AboveGuarantee { .. }
            | RequestError::AboveEveryLimit { .. } => 2,
            _ => 1,
        };
        if first_err.as_ref().is_none_or(|f| rank(&e) > rank(f)) {
            first_err = Some(e);
        }
    };
    // (limit, class) of every class the request is above.
    let mut above: Vec<(Milli, String)> = Vec::new();
    for &m in &models {
        let Some(slot) = team_info.charge[m as usize] else {
            note(RequestError::NoQuota {
                team: spec.team.clone(),
                model: state.models[m as usize].clone(),
            });
            continue;
        };
        let (gpu_class, guaranteed, limit) = &team_info.slots[slot as usize];
        if spec.total_gpus() > *limit {
            if !above.iter().any(|(_, c)| c == gpu_class) {
                above.push((*limit, gpu_class.clone()));
            }
            note(RequestError::AboveLimit {
                team: spec.team.clone(),
                class: gpu_class.clone(),
                requested: spec.total_gpus(),
                limit: *limit,
            });
            continue;
        }
        if within_guarantee && spec.total_gpus() > *guaranteed {
            note(RequestError::AboveGuarantee {
                team: spec.team.clone(),
                class: gpu_class.clone(),
                priority: spec.priority_class.clone(),
                requested: spec.total_gpus(),
                guaranteed: *guaranteed,
            });
            continue;
        }
        let largest = state.largest_node[m as usize];
        if !spec.allow_spread && g.whole_gpus() > u64::from(largest) {
            note(RequestError::NeverFitsNode {
                requested: g,
                model: state.models[m as usize].clone(),
                largest,
            });
            continue;
        }
        return Ok(());
    }
    if above.len() > 1 && matches!(first_err, Some(RequestError::AboveLimit { .. })) {
        above.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let limits: Vec<String> = above.iter().map(|(l, c)| format!("{l} {c}")).collect();
        return Err(RequestError::AboveEveryLimit {
            team: spec.team.clone(),
            requested: spec.total_gpus(),
            limits: limits.join(", "),
        });
    }
    Err(first_err.unwrap_or(RequestError::UnknownGpuModel {
        model: spec.gpu_model.clone().unwrap_or_else(|| "any".into()),
        known: join(state.models.iter()),
    }))
}

fn join<'a>(it: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = it.map(|s| s.as_str()).collect();
    if v.is_empty() {
        "(none)".to_string()
    } else {
        v.join(", ")
    }
}

/// Rounds a fractional request up to the policy granularity (simulator input).
pub fn round_to_granularity(g: Milli, granularity: Milli) -> Milli {
    if g.0 >= MILLI_PER_GPU || granularity.0 == 0 {
        return Milli(g.0.div_ceil(MILLI_PER_GPU) * MILLI_PER_GPU);
    }
    Milli(g.0.div_ceil(granularity.0) * granularity.0)
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption;

    use crate::state::State;
    use crate::testkit::{inventory, policy, req};

    #[test]
    fn a_request_above_every_limit_names_the_largest() {
        // Observed: `submit --gpus 99` naming no model said "exceed team
        // vision's limit of 4 A100" though vision may hold 16 H100.
        let p = policy(
            &[("vision", &[("A100", 1.0, 4.0), ("H100", 8.0, 16.0)])],
            CrossTeamPreemption::BorrowedOnly,
        );
        let mut s = State::new(p, &inventory(&[("A100", 4), ("H100", 8)]));
        let e = s
            .submit(req(1, "vision", "batch", 99.0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("exceed every limit of team vision (16 H100, 4 A100)"),
            "{e}"
        );
        // Naming a model, the refusal is that model's.
        let mut r = req(2, "vision", "batch", 20.0);
        r.gpu_model = Some("H100".into());
        let e = s.submit(r).unwrap_err().to_string();
        assert!(e.contains("limit of 16 H100"), "{e}");
    }
}
