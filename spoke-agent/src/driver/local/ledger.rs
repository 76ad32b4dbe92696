//! GPU share accounting: which milli-GPUs live processes hold on each
//! (node, GPU), and whether an assignment can start without over-committing.
//! Pure code, no I/O.

use std::collections::BTreeMap;
use std::fmt;

use axle_proto::pb;

use crate::config::NodeSpec;

/// Thousandths of a GPU in one whole GPU.
pub const MILLI_PER_GPU: u32 = 1000;
/// The most replicas one assignment may have on this spoke. Each replica is
/// two processes (shim + command) on this machine; a gang larger than this is
/// a hub bug, not a workload.
pub const MAX_REPLICAS_PER_ASSIGN: usize = 1024;

/// One GPU of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GpuKey {
    pub node: String,
    pub index: u32,
}

impl fmt::Display for GpuKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} gpu {}", self.node, self.index)
    }
}

/// Milli-GPUs per GPU that one workload holds or wants.
pub type Demand = BTreeMap<GpuKey, u32>;

/// Checks an assignment's replicas against the inventory and sums what it
/// wants per GPU.
pub fn demand(assign: &pb::Assign, nodes: &[NodeSpec]) -> Result<Demand, String> {
    if assign.replicas.is_empty() {
        return Err("assignment has no replicas".into());
    }
    if assign.replicas.len() > MAX_REPLICAS_PER_ASSIGN {
        return Err(format!(
            "assignment has {} replicas; this spoke runs at most {MAX_REPLICAS_PER_ASSIGN}",
            assign.replicas.len()
        ));
    }
    let mut want = Demand::new();
    for (r, replica) in assign.replicas.iter().enumerate() {
        let Some(node) = nodes.iter().find(|n| n.name == replica.node) else {
            return Err(format!(
                "replica {r} is placed on node {:?}, which this spoke does not have",
                replica.node
            ));
        };
        for share in &replica.gpus {
            if !node.gpus.iter().any(|g| g.index == share.index) {
                return Err(format!(
                    "replica {r} wants GPU {} of node {:?}, which has no such GPU",
                    share.index, node.name
                ));
            }
            if share.milli == 0 || share.milli > MILLI_PER_GPU {
                return Err(format!(
                    "replica {r} wants {} milli of GPU {}; a share is 1..={MILLI_PER_GPU}",
                    share.milli, share.index
                ));
            }
            let key = GpuKey {
                node: node.name.clone(),
                index: share.index,
            };
            let total = want.entry(key.clone()).or_insert(0);
            *total += share.milli;
            if *total > MILLI_PER_GPU {
                return Err(format!(
                    "the assignment itself wants {total} milli of {key}, more than one GPU"
                ));
            }
        }
    }
    Ok(want)
}

/// A workload whose processes may still be alive, with what it holds.
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    pub workload_id: u64,
    pub epoch: u64,
    /// Being stopped: its shares free up within its grace period.
    pub stopping: bool,
    pub shares: &'a Demand,
}

/// A GPU that cannot take an assignment's share yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub gpu: GpuKey,
    pub want_milli: u32,
    pub held_milli: u32,
    /// (workload_id, epoch, stopping) of the holders.
    pub holders: Vec<(u64, u64, bool)>,
}

impl Conflict {
    /// Whether every holder is being stopped, i.e. the wait is expected
    /// (preemption) rather than a sign the hub and spoke disagree.
    pub fn all_stopping(&self) -> bool {
        self.holders.iter().all(|h| h.2)
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} has {} milli in use, {} more wanted (held by",
            self.gpu, self.held_milli, self.want_milli
        )?;
        for (i, (id, epoch, stopping)) in self.holders.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let state = if *stopping { ", stopping" } else { "" };
            write!(f, "{sep}workload {id} epoch {epoch}{state}")?;
        }
        write!(f, ")")
    }
}

/// The GPUs on which `want` does not fit next to what `holders` hold.
pub fn conflicts<'a>(
    holders: impl IntoIterator<Item = Holder<'a>>,
    want: &Demand,
) -> Vec<Conflict> {
    let holders: Vec<Holder<'a>> = holders.into_iter().collect();
    let mut out = Vec::new();
    for (gpu, &want_milli) in want {
        let mut held_milli = 0u32;
        let mut who = Vec::new();
        for h in &holders {
            if let Some(&milli) = h.shares.get(gpu) {
                held_milli += milli;
                who.push((h.workload_id, h.epoch, h.stopping));
            }
        }
        if held_milli + want_milli > MILLI_PER_GPU {
            out.push(Conflict {
                gpu: gpu.clone(),
                want_milli,
                held_milli,
                holders: who,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuSpec;

    fn nodes() -> Vec<NodeSpec> {
        vec![NodeSpec {
            name: "n0".into(),
            gpus: (0..2)
                .map(|index| GpuSpec::whole(index, "H100", 1))
                .collect(),
            whole_only: false,
            topology: String::new(),
        }]
    }

    fn assign(shares: &[(u32, u32)]) -> pb::Assign {
        pb::Assign {
            workload_id: 1,
            epoch: 1,
            command: vec!["true".into()],
            replicas: vec![pb::Replica {
                node: "n0".into(),
                gpus: shares
                    .iter()
                    .map(|&(index, milli)| pb::GpuShare { index, milli })
                    .collect(),
            }],
            ..Default::default()
        }
    }

    fn key(index: u32) -> GpuKey {
        GpuKey {
            node: "n0".into(),
            index,
        }
    }

    #[test]
    fn demand_sums_and_validates() {
        let want = demand(&assign(&[(0, 1000), (1, 250)]), &nodes()).expect("valid");
        assert_eq!(want.get(&key(0)), Some(&1000));
        assert_eq!(want.get(&key(1)), Some(&250));
        for (bad, why) in [
            (assign(&[(5, 1000)]), "no such GPU"),
            (assign(&[(0, 0)]), "1..=1000"),
            (assign(&[(0, 1001)]), "1..=1000"),
            (assign(&[(0, 600), (0, 600)]), "more than one GPU"),
        ] {
            let err = demand(&bad, &nodes()).expect_err(why);
            assert!(err.contains(why), "{err}");
        }
        let mut elsewhere = assign(&[(0, 1000)]);
        elsewhere.replicas[0].node = "n9".into();
        assert!(demand(&elsewhere, &nodes()).is_err());
        let mut none = assign(&[]);
        none.replicas.clear();
        assert!(demand(&none, &nodes()).is_err());
    }

    #[test]
    fn fractions_fit_until_a_gpu_is_full() {
        let quarter = demand(&assign(&[(0, 250)]), &nodes()).expect("valid");
        let three_quarters = demand(&assign(&[(0, 750)]), &nodes()).expect("valid");
        let holders = [Holder {
            workload_id: 9,
            epoch: 1,
            stopping: false,
            shares: &three_quarters,
        }];
        assert!(conflicts(holders, &quarter).is_empty());
        let half = demand(&assign(&[(0, 500)]), &nodes()).expect("valid");
        let found = conflicts(holders, &half);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].held_milli, 750);
        assert!(!found[0].all_stopping());
        assert!(found[0].to_string().contains("workload 9 epoch 1"));
    }

    #[test]
    fn stopping_holders_still_block_but_are_flagged() {
        let whole = demand(&assign(&[(1, 1000)]), &nodes()).expect("valid");
        let holders = [Holder {
            workload_id: 3,
            epoch: 2,
            stopping: true,
            shares: &whole,
        }];
        let found = conflicts(holders, &whole);
        assert_eq!(found.len(), 1);
        assert!(found[0].all_stopping());
        assert!(conflicts([], &whole).is_empty());
    }
}
