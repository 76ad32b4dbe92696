//! The burst reconciler: from the scheduler's `BurstWanted` decisions, the
//! ledger and what providers answered, it decides what to launch, adopt,
//! drain and terminate. It runs on the applier (records and the ledger
//! change in the batch's one commit) and never calls a provider itself: it
//! queues [`Job`]s for the burst worker, whose answers come back as
//! [`Command::Burst`](super::Command::Burst).
//!
//! Order of writes: the reservation and the burst record are committed
//! before the launch is sent, so a hub that dies mid-launch finds the record
//! at restart and the instance by its tag (adopted, never launched twice,
//! never charged twice); a tagged instance no live record claims is an
//! orphan, terminated after a grace period.
//!
//! By responsibility: `plan.rs` (wishes → reservations and launches),
//! `tick.rs` (time-driven upkeep, spokes joining), `outcome.rs` (what
//! providers answered), `interruption.rs` (a provider's notice that it
//! takes an instance back); here the shared state and the steps all use.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_burst::{
    Instance, InstanceState, LaunchSpec, MANAGED_BY_VALUE, Offer, ProviderError, TAG_BURST_ID,
    TAG_HUB, TAG_MANAGED_BY,
};
use axle_policy::{MILLI_PER_GPU, Usd};
use axle_scheduler::{BurstWanted, PendingReason};
use tracing::{info, warn};

use super::applier::Effects;
use super::workloads::transition;
use super::{Inner, RECORD_VERSION};
use crate::burst::ledger::{Crossed, Month};
use crate::burst::lifecycle::{BurstEvent, BurstState, step};
use crate::burst::offers::{Allowed, Need, rank};
use crate::burst::record::{BurstRecord, OfferRecord, burst_key, cluster_name};
use crate::burst::setup::user_data;
use crate::burst::worker::{CALL_DEADLINE, Job, Outcome};
use crate::lifecycle::WEvent;
use crate::records::*;

/// Live burst instances at once, every team together: a bound on what one
/// hub launches and tracks, far above any budget's worth of GPUs.
pub const MAX_LIVE_BURSTS: usize = 1_000;
/// Burst records kept (live and finished, for the month's spend and
/// `axle get burst`); the oldest finished ones of past months go first.
pub const MAX_BURST_RECORDS: usize = 20_000;
/// Launch tries of one burst (same idempotency key) before it fails.
pub const MAX_LAUNCH_ATTEMPTS: u32 = 5;
/// How long an offer that had no capacity is skipped.
pub const CAPACITY_COOLDOWN_MS: u64 = 10 * 60_000;
/// How long a provider that refused credentials or a request is skipped.
pub const PROVIDER_DOWN_MS: u64 = 5 * 60_000;
/// A catalog older than this is fetched again.
pub const CATALOG_MAX_AGE_MS: u64 = 10 * 60_000;
/// While no offer fits a waiting workload, a catalog older than this is
/// fetched again: capacity comes and goes by the minute, and a workload
/// should not wait ten minutes on a stale "none" (one list call per
/// provider per 15 s at most, well under the providers' rate limits).
pub const CATALOG_NO_FIT_MAX_AGE_MS: u64 = 15_000;
/// A job with no answer after this is asked again (a lost job, a restart).
pub const IN_FLIGHT_STALE_MS: u64 = 2 * CALL_DEADLINE.as_millis() as u64 + 10_000;
/// The reservation is extended (or the instance stopped) when what is left
/// of it covers less than this much more run.
pub const BUDGET_GUARD_S: u64 = 120;

/// What the reconciler keeps in memory only: derived again after a restart.
#[derive(Default)]
pub struct BurstRuntime {
    /// Jobs asked and not answered, by job key, with when they were asked.
    in_flight: BTreeMap<String, u64>,
    /// Each provider's catalog and when it came.
    catalogs: BTreeMap<String, (Vec<Offer>, u64)>,
    /// (provider, instance type, region) without capacity, until.
    cooldown: BTreeMap<(String, String, String), u64>,
    /// Providers skipped until, and why.
    down: BTreeMap<String, (u64, String)>,
    /// Tagged instances no live record claims: (provider, instance) → first seen.
    orphans: BTreeMap<(String, String), u64>,
    /// What a waiting workload's pending reason says of burst: why it did
    /// not burst, or the instance it waits for.
    pub(in crate::hub) notes: BTreeMap<u64, String>,
    last_list_ms: u64,
}

fn launch_key(id: &str) -> String {
    format!("launch/{id}")
}
fn terminate_key(provider: &str, instance: &str) -> String {
    format!("terminate/{provider}/{instance}")
}

fn new_burst_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 6];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // No randomness: ids must still be unique within the hub.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    crate::spoke_ca::hex(&b)
}

mod interruption;
mod outcome;
mod plan;
mod tick;

impl Inner {
    /// Each team's burst headroom this month, for the scheduler.
    pub(in crate::hub) fn burst_headroom(&self, now: u64) -> Option<BTreeMap<String, Usd>> {
        self.burst_cfg.as_ref()?;
        let month = Month::of_ms(now);
        let global = self.policy.settings.burst_budget_per_month;
        Some(
            self.policy
                .teams
                .values()
                .map(|t| {
                    (
                        t.name.clone(),
                        self.ledger
                            .headroom(&t.name, month, t.burst.monthly_budget, global),
                    )
                })
                .collect(),
        )
    }

    /// The burst record whose cluster this is.
    pub(in crate::hub) fn burst_of_cluster(&self, cluster: &str) -> Option<&BurstRecord> {
        let id = cluster.strip_prefix("burst-")?.rsplit_once('-')?.1;
        self.bursts.get(id).filter(|r| r.cluster == cluster)
    }

    pub(in crate::hub) fn queue_job(
        &mut self,
        fx: &mut Effects,
        key: String,
        job: Job,
        now: u64,
    ) -> bool {
        if let Some(&at) = self.burst_rt.in_flight.get(&key)
            && now.saturating_sub(at) < IN_FLIGHT_STALE_MS
        {
            return false;
        }
        self.burst_rt.in_flight.insert(key, now);
        fx.burst_jobs.push(job);
        true
    }

    pub(in crate::hub) fn save_burst(&mut self, fx: &mut Effects, id: &str) {
        if let Some(r) = self.bursts.get(id) {
            fx.put(burst_key(id), r);
            self.burst_snapshot_stale = true;
        }
    }

    /// Rebuilds what readers see of the bursts, when a record changed.
    pub(in crate::hub) fn refresh_burst_snapshot(&mut self) {
        if self.burst_snapshot_stale {
            self.burst_snapshot_stale = false;
            self.burst_snapshot = Arc::new(self.bursts.values().cloned().collect());
        }
    }

    pub(in crate::hub) fn threshold_events(
        &mut self,
        fx: &mut Effects,
        now: u64,
        crossed: Vec<Crossed>,
    ) {
        for c in crossed {
            self.event(
                fx,
                now,
                "burst_budget_threshold",
                None,
                None,
                format!(
                    "team {} burst budget: {} of {} used in {} ({}%)",
                    c.team, c.used, c.budget, c.month, c.percent
                ),
            );
        }
    }

    /// Steps burst `id` by `event`; false (and nothing changes) when it does not apply.
    pub(in crate::hub) fn burst_step(&mut self, id: &str, event: BurstEvent) -> bool {
        let Some(r) = self.bursts.get_mut(id) else {
            return false;
        };
        match step(&r.state, event) {
            Ok(next) => {
                r.state = next;
                true
            }
            Err(_) => false,
        }
    }

    /// Sends burst `id`'s launch (again): with a fresh one-time join token
    /// in its user-data, under the same idempotency key and tag.
    pub(in crate::hub) fn burst_launch(&mut self, id: &str, fx: &mut Effects, now: u64) {
        let (Some(cfg), Some(ca)) = (self.burst_cfg.clone(), self.spoke_ca.clone()) else {
            return;
        };
        let Some(r) = self.bursts.get(id).cloned() else {
            return;
        };
        let policy = self.policy.clone();
        let Some(doc) = policy.burst_providers.get(&r.provider) else {
            return;
        };
        if let Some(&at) = self.burst_rt.in_flight.get(&launch_key(id))
            && now.saturating_sub(at) < IN_FLIGHT_STALE_MS
        {
            return;
        }
        let ttl_ms = doc.join_timeout_s.saturating_mul(1000).max(60_000);
        let token = match self.mint_join_token(&ca, &r.cluster, ttl_ms, "burst", fx, now) {
            Ok((_, token)) => token,
            Err(e) => {
                warn!("burst {id}: cannot mint its join token: {e}");
                return;
            }
        };
        let gpus = format!(
            "{}x{}:{}GB",
            r.offer.gpus,
            r.offer.gpu_model,
            r.offer.gpu_memory_mb / 1024
        );
        let spec = LaunchSpec {
            idempotency_key: format!("axle-{id}"),
            instance_type: r.offer.instance_type.clone(),
            region: r.offer.region.clone(),
            spot: r.offer.spot,
            tags: BTreeMap::from([
                (TAG_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
                (TAG_HUB.to_string(), cfg.hub_id.clone()),
                (TAG_BURST_ID.to_string(), id.to_string()),
            ]),
            user_data: user_data(
                &cfg.spoke_command,
                &cfg.hub_url,
                &r.cluster,
                &r.offer.region,
                &token,
                &gpus,
                r.kind == "aws" && r.offer.spot,
            ),
            image: doc
                .images
                .get(&r.offer.region)
                .or_else(|| doc.images.get("default"))
                .cloned(),
        };
        let job = Job::Launch {
            id: id.to_string(),
            provider: r.provider.clone(),
            spec: Box::new(spec),
        };
        if !self.queue_job(fx, launch_key(id), job, now) {
            return;
        }
        if let Some(r) = self.bursts.get_mut(id) {
            r.attempts += 1;
            r.launched_at_ms.get_or_insert(now);
        }
        self.burst_step(id, BurstEvent::LaunchStarted);
        self.save_burst(fx, id);
    }

    /// Settles burst `id` (its instance is gone), frees its cluster and
    /// re-queues what ran there.
    pub(in crate::hub) fn burst_ended(&mut self, id: &str, fx: &mut Effects, now: u64) {
        let Some(r) = self.bursts.get_mut(id) else {
            return;
        };
        r.ended_at_ms.get_or_insert(now);
        let cost = r.cost_until(now);
        r.settled = Some(cost);
        let (team, cluster, workload) = (r.team.clone(), r.cluster.clone(), r.workload);
        let budget = self
            .policy
            .teams
            .get(&team)
            .map_or(Usd::ZERO, |t| t.burst.monthly_budget);
        let crossed = match self.ledger.settle(id, cost, budget) {
            Some((_, c)) => c,
            None => Vec::new(),
        };
        self.save_burst(fx, id);
        let reserved = self.bursts[id].reserved;
        self.event(
            fx,
            now,
            "burst_settled",
            Some(workload),
            Some(&cluster),
            format!(
                "burst {id} ended: it cost {cost} ({} reserved, the rest released)",
                reserved
            ),
        );
        self.threshold_events(fx, now, crossed);
        self.release_cluster(&cluster, &format!("burst instance {id} ended"), fx, now);
    }

    /// Re-queues the work on `cluster` (its machine is gone) and forgets the
    /// cluster, its record and its certificates.
    pub(in crate::hub) fn release_cluster(
        &mut self,
        cluster: &str,
        why: &str,
        fx: &mut Effects,
        now: u64,
    ) {
        let ids: Vec<u64> = self
            .workloads
            .values()
            .filter(|w| {
                let on = match (&w.stopping, &w.placement) {
                    (Some(s), _) if w.state.is_stopping() => &s.cluster,
                    (_, Some(p)) if w.holds_gpus() => &p.cluster,
                    _ => return false,
                };
                on == cluster
            })
            .map(|w| w.id)
            .collect();
        for id in ids {
            let w = self.workloads.get_mut(&id).expect("listed");
            if w.state.is_stopping() {
                self.stop_done(fx, now, id, cluster, Some(why));
                continue;
            }
            transition(w, WEvent::Requeue, now, format!("re-queued: {why}"));
            w.placement = None;
            self.save(fx, id);
            self.event(
                fx,
                now,
                "requeued",
                Some(id),
                Some(cluster),
                format!("workload {id} re-queued: {why}"),
            );
        }
        if let Some(c) = self.clusters.remove(cluster) {
            fx.delete(cluster_key(cluster));
            for page in 0..c.node_pages {
                fx.delete(node_page_key(cluster, page));
            }
        }
        let certs: Vec<String> = self
            .spoke_certs
            .values()
            .filter(|c| c.cluster == cluster)
            .map(|c| c.fingerprint.clone())
            .collect();
        for fp in certs {
            fx.delete(spoke_cert_key(&fp));
            Arc::make_mut(&mut self.spoke_certs).remove(&fp);
        }
        self.rebuild(fx, now);
        self.changed();
    }

    /// Asks for burst `id`'s termination.
    pub(in crate::hub) fn burst_terminate(
        &mut self,
        id: &str,
        note: String,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(r) = self.bursts.get_mut(id) else {
            return;
        };
        if r.note.is_empty() {
            r.note = note.clone();
        }
        let instance = r.state.instance_id().map(str::to_string);
        let (provider, cluster, workload) = (r.provider.clone(), r.cluster.clone(), r.workload);
        self.save_burst(fx, id);
        self.event(
            fx,
            now,
            "burst_terminating",
            Some(workload),
            Some(&cluster),
            format!("burst {id}: terminating ({note})"),
        );
        if let Some(instance_id) = instance {
            let job = Job::Terminate {
                id: Some(id.to_string()),
                provider: provider.clone(),
                instance_id: instance_id.clone(),
            };
            self.queue_job(fx, terminate_key(&provider, &instance_id), job, now);
        }
        // No new work goes there.
        self.rebuild(fx, now);
    }

    /// Whether any workload holds GPUs on `cluster`.
    pub(in crate::hub) fn cluster_busy(&self, cluster: &str) -> bool {
        self.workloads.values().any(|w| {
            (w.holds_gpus() || w.state.is_stopping())
                && w.placement
                    .as_ref()
                    .map(|p| p.cluster.as_str())
                    .or(w.stopping.as_ref().map(|s| s.cluster.as_str()))
                    == Some(cluster)
        })
    }
}
