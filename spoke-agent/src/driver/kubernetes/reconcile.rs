//! The kubernetes driver's reconciler: what the hub wants (assignments and
//! stops) against what the cluster shows (Jobs, their pods, their events)
//! gives the actions to take (create or delete a Job) and what to tell the
//! hub (started, ended). Pure: hand-built objects in, actions out; the
//! controller performs them (`controller.rs`).
//!
//! Safety rule: a run is reported stopped only when its pods are gone (its
//! GPUs are free), and a new epoch's Job is created only when no pod of an
//! older epoch remains, so one workload never runs twice at once.

use std::collections::{BTreeMap, BTreeSet};

use axle_proto::pb;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};

use super::manifest::{LABEL_EPOCH, LABEL_WORKLOAD, ManifestOptions, job_for, job_name};
use super::nodes::NodeFacts;
use super::observe::{Observation, observe};

/// What the hub wants of one workload.
#[derive(Debug, Clone)]
pub struct Want {
    pub epoch: u64,
    /// The assignment; `None` for a Job adopted after a restart of the agent.
    pub assign: Option<pb::Assign>,
    /// A stop was asked for: (grace in seconds, why).
    pub stop: Option<(u64, String)>,
}

/// What the driver already did for one run (workload, epoch).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Track {
    /// A create was issued (or the Job was adopted).
    pub created: bool,
    /// The Job was seen in the cluster at least once.
    pub seen: bool,
    pub started_reported: bool,
    /// A delete was issued.
    pub deleting: bool,
    /// Its end was reported.
    pub ended: bool,
    /// Its end as the Job showed it, kept until its pods are gone: the Job
    /// is deleted meanwhile and cannot say it again.
    pub end: Option<pb::WorkloadStatus>,
}

/// The cluster as the watchers show it, for the workloads of this agent.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// Jobs by (workload, epoch).
    pub jobs: BTreeMap<(u64, u64), &'a Job>,
    /// Pods by (workload, epoch), terminating ones included.
    pub pods: BTreeMap<(u64, u64), Vec<&'a Pod>>,
    /// Events by Job name.
    pub events: BTreeMap<String, Vec<&'a Event>>,
}

/// (workload, epoch) of an object from its labels.
pub fn run_of(labels: Option<&BTreeMap<String, String>>) -> Option<(u64, u64)> {
    let l = labels?;
    Some((
        l.get(LABEL_WORKLOAD)?.parse().ok()?,
        l.get(LABEL_EPOCH)?.parse().ok()?,
    ))
}

impl<'a> Observed<'a> {
    pub fn from(jobs: &'a [Job], pods: &'a [Pod], events: &'a [Event]) -> Observed<'a> {
        let jobs: Vec<&Job> = jobs.iter().collect();
        let pods: Vec<&Pod> = pods.iter().collect();
        let events: Vec<&Event> = events.iter().collect();
        Observed::from_refs(&jobs, &pods, &events)
    }

    pub fn from_refs(jobs: &[&'a Job], pods: &[&'a Pod], events: &[&'a Event]) -> Observed<'a> {
        let mut o = Observed::default();
        for &j in jobs {
            if let Some(run) = run_of(j.metadata.labels.as_ref()) {
                o.jobs.insert(run, j);
            }
        }
        for &p in pods {
            if let Some(run) = run_of(p.metadata.labels.as_ref()) {
                o.pods.entry(run).or_default().push(p);
            }
        }
        for &e in events {
            if let Some(name) = &e.involved_object.name {
                o.events.entry(name.clone()).or_default().push(e);
            }
        }
        o
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Create {
        run: (u64, u64),
        job: Box<Job>,
    },
    Delete {
        run: (u64, u64),
        namespace: String,
        name: String,
        grace_s: u64,
    },
    Started {
        run: (u64, u64),
    },
    /// A terminal status for the hub.
    Ended(pb::WorkloadStatus),
}

fn status(
    run: (u64, u64),
    phase: pb::Phase,
    exit_code: i32,
    message: String,
) -> pb::WorkloadStatus {
    pb::WorkloadStatus {
        workload_id: run.0,
        epoch: run.1,
        phase: phase as i32,
        exit_code,
        message,
    }
}

/// Whether any of the pods still runs (or waits to): their GPUs are not
/// free yet.
fn pods_running(pods: &[&Pod]) -> bool {
    pods.iter().any(|p| {
        !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        )
    })
}

/// Grace for deleting a Job nobody wants any more (an older epoch, or one
/// of a workload the hub does not know): Kubernetes' default.
pub const STALE_GRACE_S: u64 = 30;

/// Everything to do now. `tracks` is updated as if every action succeeded;
/// the controller corrects it when one fails.
pub fn reconcile(
    wants: &BTreeMap<u64, Want>,
    tracks: &mut BTreeMap<(u64, u64), Track>,
    seen: &Observed<'_>,
    nodes: &BTreeMap<String, NodeFacts>,
    opts: &ManifestOptions,
    priority_classes: bool,
) -> Vec<Action> {
    let mut out = Vec::new();
    for run in seen.jobs.keys() {
        tracks.entry(*run).or_default().seen = true;
    }
    // Runs nobody wants: older epochs, unknown workloads.
    let wanted: BTreeSet<(u64, u64)> = wants.iter().map(|(id, w)| (*id, w.epoch)).collect();
    let mut gone: Vec<(u64, u64)> = Vec::new();
    for (run, track) in tracks.iter_mut() {
        if wanted.contains(run) {
            continue;
        }
        if let Some(job) = seen.jobs.get(run) {
            if !track.deleting {
                track.deleting = true;
                out.push(Action::Delete {
                    run: *run,
                    namespace: job.metadata.namespace.clone().unwrap_or_default(),
                    name: job.metadata.name.clone().unwrap_or_default(),
                    grace_s: STALE_GRACE_S,
                });
            }
        } else if !seen.pods.contains_key(run) {
            if !track.ended && track.seen {
                track.ended = true;
                out.push(Action::Ended(status(
                    *run,
                    pb::Phase::Stopped,
                    0,
                    "superseded or no longer wanted; its Job is gone".into(),
                )));
            }
            gone.push(*run);
        }
    }
    for run in gone {
        tracks.remove(&run);
    }
    for (&id, want) in wants {
        let run = (id, want.epoch);
        let track = tracks.entry(run).or_default();
        if track.ended {
            continue;
        }
        let job = seen.jobs.get(&run);
        let pods: &[&Pod] = seen.pods.get(&run).map(Vec::as_slice).unwrap_or(&[]);
        if let Some((grace_s, why)) = &want.stop {
            match job {
                Some(j) if !track.deleting => {
                    track.deleting = true;
                    out.push(Action::Delete {
                        run,
                        namespace: j.metadata.namespace.clone().unwrap_or_default(),
                        name: j.metadata.name.clone().unwrap_or_default(),
                        grace_s: *grace_s,
                    });
                }
                Some(_) => {}
                None if pods.is_empty() && (track.seen || !track.created) => {
                    track.ended = true;
                    let message = if track.created {
                        format!("stopped by the hub: {why}")
                    } else {
                        format!("stopped by the hub before it started: {why}")
                    };
                    out.push(Action::Ended(status(run, pb::Phase::Stopped, 0, message)));
                }
                // Created but not seen yet, or pods still terminating.
                None => {}
            }
            continue;
        }
        let Some(job) = job else {
            if let Some(end) = &track.end {
                if !pods_running(pods) {
                    track.ended = true;
                    out.push(Action::Ended(end.clone()));
                }
                continue;
            }
            if !track.created {
                // Never two epochs at once: wait for older pods to go.
                let older = seen.pods.keys().any(|(i, e)| *i == id && *e < want.epoch)
                    || seen.jobs.keys().any(|(i, e)| *i == id && *e < want.epoch);
                if older {
                    continue;
                }
                let Some(assign) = &want.assign else { continue };
                match job_for(assign, nodes, opts, priority_classes) {
                    Ok(job) => {
                        track.created = true;
                        out.push(Action::Create {
                            run,
                            job: Box::new(job),
                        });
                    }
                    Err(message) => {
                        track.ended = true;
                        out.push(Action::Ended(status(run, pb::Phase::Failed, 127, message)));
                    }
                }
            } else if track.seen && !track.deleting {
                track.ended = true;
                out.push(Action::Ended(status(
                    run,
                    pb::Phase::Failed,
                    -1,
                    format!(
                        "its Job {} was deleted outside Axle",
                        job_name(run.0, run.1)
                    ),
                )));
            }
            continue;
        };
        let name = job.metadata.name.clone().unwrap_or_default();
        let events: &[&Event] = seen.events.get(&name).map(Vec::as_slice).unwrap_or(&[]);
        let end = match observe(job, pods, events) {
            Observation::Waiting => None,
            Observation::Started => {
                if !track.started_reported {
                    track.started_reported = true;
                    out.push(Action::Started { run });
                }
                None
            }
            Observation::Succeeded => {
                let n = job.spec.as_ref().and_then(|s| s.parallelism).unwrap_or(1);
                Some(status(
                    run,
                    pb::Phase::Succeeded,
                    0,
                    if n > 1 {
                        format!("all {n} replicas succeeded")
                    } else {
                        "succeeded".into()
                    },
                ))
            }
            Observation::Failed { exit_code, message } => {
                Some(status(run, pb::Phase::Failed, exit_code, message))
            }
        };
        if let Some(end) = track.end.clone().or(end) {
            // Its pods must be gone before the hub is told (their GPUs
            // free): delete the Job now, report once they went.
            track.end = Some(end.clone());
            if !track.deleting {
                track.deleting = true;
                out.push(Action::Delete {
                    run,
                    namespace: job.metadata.namespace.clone().unwrap_or_default(),
                    name,
                    grace_s: 0,
                });
            }
            if !pods_running(pods) {
                track.ended = true;
                out.push(Action::Ended(end));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::kubernetes::manifest::tests::{assign, opts};
    use crate::driver::kubernetes::nodes::node_facts;
    use crate::driver::kubernetes::nodes::tests::{gpu_node, opts as inv_opts};
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn nodes() -> BTreeMap<String, NodeFacts> {
        let f = node_facts(
            &gpu_node("a", "NVIDIA-A100", &[("nvidia.com/gpu", "4")]),
            &inv_opts(),
        )
        .unwrap();
        BTreeMap::from([("a".to_string(), f)])
    }

    fn want(id: u64, epoch: u64) -> Want {
        let mut a = assign(id, &[("a", &[(0, 1000)])]);
        a.epoch = epoch;
        Want {
            epoch,
            assign: Some(a),
            stop: None,
        }
    }

    fn job_of(id: u64, epoch: u64) -> Job {
        let mut a = assign(id, &[("a", &[(0, 1000)])]);
        a.epoch = epoch;
        job_for(&a, &nodes(), &opts(), true).unwrap()
    }

    fn pod_of(id: u64, epoch: u64, phase: &str) -> Pod {
        let job = job_of(id, epoch);
        Pod {
            metadata: ObjectMeta {
                labels: job.metadata.labels.clone(),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn run(
        wants: &BTreeMap<u64, Want>,
        tracks: &mut BTreeMap<(u64, u64), Track>,
        jobs: &[Job],
        pods: &[Pod],
    ) -> Vec<Action> {
        let seen = Observed::from(jobs, pods, &[]);
        reconcile(wants, tracks, &seen, &nodes(), &opts(), true)
    }

    #[test]
    fn create_once_report_started_then_the_end_after_the_pods_are_done() {
        let wants = BTreeMap::from([(1, want(1, 1))]);
        let mut tracks = BTreeMap::new();
        let a = run(&wants, &mut tracks, &[], &[]);
        assert!(
            matches!(&a[..], [Action::Create { run: (1, 1), .. }]),
            "{a:?}"
        );
        assert!(
            run(&wants, &mut tracks, &[], &[]).is_empty(),
            "not created twice"
        );
        let job = job_of(1, 1);
        let a = run(
            &wants,
            &mut tracks,
            std::slice::from_ref(&job),
            &[pod_of(1, 1, "Running")],
        );
        assert_eq!(a, vec![Action::Started { run: (1, 1) }]);
        let mut done = job.clone();
        done.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Complete".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let a = run(&wants, &mut tracks, &[done], &[pod_of(1, 1, "Succeeded")]);
        assert!(matches!(&a[0], Action::Delete { grace_s: 0, .. }), "{a:?}");
        assert!(
            matches!(&a[1], Action::Ended(s) if s.phase == pb::Phase::Succeeded as i32),
            "{a:?}"
        );
    }

    /// Regression: the Job's watch said Complete before the pod's said
    /// Succeeded; the Job was deleted, and with it the only record of the
    /// end, so the workload stayed Running forever.
    #[test]
    fn an_end_seen_on_the_job_is_kept_until_its_pods_are_gone() {
        let wants = BTreeMap::from([(1, want(1, 1))]);
        let mut tracks = BTreeMap::new();
        run(&wants, &mut tracks, &[], &[]);
        let mut done = job_of(1, 1);
        done.status = Some(JobStatus {
            conditions: Some(vec![JobCondition {
                type_: "Complete".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let a = run(&wants, &mut tracks, &[done], &[pod_of(1, 1, "Running")]);
        assert!(matches!(&a[..], [Action::Delete { .. }]), "{a:?}");
        assert!(run(&wants, &mut tracks, &[], &[pod_of(1, 1, "Running")]).is_empty());
        let a = run(&wants, &mut tracks, &[], &[]);
        assert!(
            matches!(&a[..], [Action::Ended(s)] if s.phase == pb::Phase::Succeeded as i32),
            "{a:?}"
        );
    }

    #[test]
    fn a_stop_deletes_with_the_grace_and_ends_when_the_pods_are_gone() {
        let mut wants = BTreeMap::from([(1, want(1, 1))]);
        let mut tracks = BTreeMap::new();
        run(&wants, &mut tracks, &[], &[]);
        let job = job_of(1, 1);
        run(
            &wants,
            &mut tracks,
            std::slice::from_ref(&job),
            &[pod_of(1, 1, "Running")],
        );
        wants.get_mut(&1).unwrap().stop = Some((45, "preempted".into()));
        let a = run(
            &wants,
            &mut tracks,
            std::slice::from_ref(&job),
            &[pod_of(1, 1, "Running")],
        );
        assert!(
            matches!(&a[..], [Action::Delete { grace_s: 45, .. }]),
            "{a:?}"
        );
        // The Job is gone but its pod still terminates: nothing yet.
        assert!(run(&wants, &mut tracks, &[], &[pod_of(1, 1, "Running")]).is_empty());
        let a = run(&wants, &mut tracks, &[], &[]);
        assert!(
            matches!(&a[..], [Action::Ended(s)] if s.phase == pb::Phase::Stopped as i32),
            "{a:?}"
        );
    }

    #[test]
    fn a_job_deleted_behind_our_back_is_failed_and_a_new_epoch_waits_for_the_old_pods() {
        let wants = BTreeMap::from([(1, want(1, 1))]);
        let mut tracks = BTreeMap::new();
        run(&wants, &mut tracks, &[], &[]);
        run(&wants, &mut tracks, &[job_of(1, 1)], &[]);
        let a = run(&wants, &mut tracks, &[], &[]);
        assert!(
            matches!(&a[..], [Action::Ended(s)] if s.message.contains("deleted outside Axle")),
            "{a:?}"
        );
        // Epoch 2 while epoch 1's Job and pod are still there.
        let wants = BTreeMap::from([(2, want(2, 2))]);
        let mut tracks = BTreeMap::from([(
            (2, 1),
            Track {
                created: true,
                seen: true,
                ..Default::default()
            },
        )]);
        let a = run(
            &wants,
            &mut tracks,
            &[job_of(2, 1)],
            &[pod_of(2, 1, "Running")],
        );
        assert!(
            matches!(&a[..], [Action::Delete { run: (2, 1), .. }]),
            "the old epoch goes first: {a:?}"
        );
        assert!(
            run(&wants, &mut tracks, &[], &[pod_of(2, 1, "Running")]).is_empty(),
            "no new Job while an old pod runs"
        );
        let a = run(&wants, &mut tracks, &[], &[]);
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::Create { run: (2, 2), .. })),
            "{a:?}"
        );
    }

    #[test]
    fn an_assignment_that_cannot_run_here_fails_at_once() {
        let mut w = want(1, 1);
        w.assign.as_mut().unwrap().image.clear();
        let wants = BTreeMap::from([(1, w)]);
        let a = run(&wants, &mut BTreeMap::new(), &[], &[]);
        assert!(
            matches!(&a[..], [Action::Ended(s)] if s.message.contains("--image")),
            "{a:?}"
        );
    }
}
