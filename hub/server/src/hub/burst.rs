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
    notes: BTreeMap<u64, String>,
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

impl Inner {
    /// Each team's burst headroom this month, for the scheduler.
    pub(super) fn burst_headroom(&self, now: u64) -> Option<BTreeMap<String, Usd>> {
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
    pub(super) fn burst_of_cluster(&self, cluster: &str) -> Option<&BurstRecord> {
        let id = cluster.strip_prefix("burst-")?.rsplit_once('-')?.1;
        self.bursts.get(id).filter(|r| r.cluster == cluster)
    }

    fn queue_job(&mut self, fx: &mut Effects, key: String, job: Job, now: u64) -> bool {
        if let Some(&at) = self.burst_rt.in_flight.get(&key)
            && now.saturating_sub(at) < IN_FLIGHT_STALE_MS
        {
            return false;
        }
        self.burst_rt.in_flight.insert(key, now);
        fx.burst_jobs.push(job);
        true
    }

    fn save_burst(&mut self, fx: &mut Effects, id: &str) {
        if let Some(r) = self.bursts.get(id) {
            fx.put(burst_key(id), r);
            self.burst_snapshot_stale = true;
        }
    }

    /// Rebuilds what readers see of the bursts, when a record changed.
    pub(super) fn refresh_burst_snapshot(&mut self) {
        if self.burst_snapshot_stale {
            self.burst_snapshot_stale = false;
            self.burst_snapshot = Arc::new(self.bursts.values().cloned().collect());
        }
    }

    fn threshold_events(&mut self, fx: &mut Effects, now: u64, crossed: Vec<Crossed>) {
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
    fn burst_step(&mut self, id: &str, event: BurstEvent) -> bool {
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

    /// Acts on the cycle's burst wishes: one launch per waiting workload at
    /// most, on the cheapest offer that fits, within the team's budget.
    pub(super) fn burst_reconcile(&mut self, wanted: &[BurstWanted], fx: &mut Effects, now: u64) {
        let Some(cfg) = self.burst_cfg.clone() else {
            return;
        };
        let mut catalogs_wanted: Vec<String> = Vec::new();
        for b in wanted {
            if let Some(r) = self
                .bursts
                .values()
                .find(|r| r.is_live() && r.workload == b.workload)
            {
                // It waits for its own instance: say which, and how far along.
                let note = format!(
                    "waiting for {} ({}, {} {} in {}, {}/h)",
                    r.cluster,
                    r.state.name(),
                    r.provider,
                    r.offer.instance_type,
                    r.offer.region,
                    r.offer.price_per_hour
                );
                self.burst_rt.notes.insert(b.workload, note);
                continue;
            }
            let why = match self.burst_plan(&cfg, b, &mut catalogs_wanted, fx, now) {
                Ok(()) => {
                    self.burst_rt.notes.remove(&b.workload);
                    continue;
                }
                Err(why) => why,
            };
            let first = self.burst_rt.notes.get(&b.workload) != Some(&why);
            if first {
                self.event(
                    fx,
                    now,
                    "burst_not_launched",
                    Some(b.workload),
                    None,
                    format!("workload {} does not burst: {why}", b.workload),
                );
                self.burst_rt.notes.insert(b.workload, why);
            }
        }
        for p in catalogs_wanted {
            self.queue_job(
                fx,
                format!("catalog/{p}"),
                Job::Catalog { provider: p },
                now,
            );
        }
        // The reasons of waiting workloads say why they did not burst, or
        // which instance they wait for.
        let notes: Vec<(u64, String)> = self
            .burst_rt
            .notes
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (id, why) in notes {
            if let Some(r) = self.reasons.get(&id)
                && let PendingReason::NoFreeCapacity { burst, .. } = &**r
                && burst.as_deref() != Some(why.as_str())
            {
                let mut r = (**r).clone();
                if let PendingReason::NoFreeCapacity { burst, .. } = &mut r {
                    *burst = Some(why);
                }
                self.reasons.insert(id, Arc::new(r));
            }
        }
    }

    /// Reserves and launches a burst for `b`, or says why not.
    fn burst_plan(
        &mut self,
        cfg: &crate::burst::setup::BurstConfig,
        b: &BurstWanted,
        catalogs_wanted: &mut Vec<String>,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(), String> {
        let live = self.bursts.values().filter(|r| r.is_live()).count();
        if live >= MAX_LIVE_BURSTS {
            return Err(format!(
                "{live} burst instances are live, the most this hub runs ({MAX_LIVE_BURSTS})"
            ));
        }
        let w = self
            .workloads
            .get(&b.workload)
            .ok_or_else(|| "the workload is gone".to_string())?;
        let (regions, runtime_s, class) = (w.regions.clone(), w.max_runtime_s, w.priority.clone());
        let team = self
            .policy
            .teams
            .get(&b.team)
            .ok_or_else(|| format!("team {} is not in the policy", b.team))?
            .clone();
        let spot_class = self
            .policy
            .priority_classes
            .get(&class)
            .is_some_and(|c| c.checkpointable);
        let mut allowed = Vec::new();
        let mut skipped = Vec::new();
        let mut waiting_for_catalog = false;
        for name in &b.providers {
            let Some(doc) = self.policy.burst_providers.get(name) else {
                continue;
            };
            if !cfg.providers.contains_key(name) {
                skipped.push(format!(
                    "{name} is not set up on this hub ({})",
                    cfg.unavailable
                        .get(name)
                        .map_or("no adapter", String::as_str)
                ));
                continue;
            }
            if let Some((until, why)) = self.burst_rt.down.get(name)
                && now < *until
            {
                skipped.push(format!("{name} failed: {why}"));
                continue;
            }
            let running = self
                .bursts
                .values()
                .filter(|r| r.is_live() && &r.provider == name)
                .count() as u64;
            if running >= doc.max_instances {
                skipped.push(format!("{name} runs {running} instances, its maxInstances"));
                continue;
            }
            match self.burst_rt.catalogs.get(name) {
                Some((_, at)) if now.saturating_sub(*at) < CATALOG_MAX_AGE_MS => {}
                Some(_) => catalogs_wanted.push(name.clone()),
                None => {
                    catalogs_wanted.push(name.clone());
                    waiting_for_catalog = true;
                    continue;
                }
            }
            allowed.push(Allowed {
                name: name.clone(),
                regions: doc.regions.clone(),
                gpu_models: doc.gpu_models.clone(),
                instance_types: doc.instance_types.clone(),
            });
        }
        catalogs_wanted.sort();
        catalogs_wanted.dedup();
        if allowed.is_empty() {
            return Err(if waiting_for_catalog {
                "waiting for the providers' catalogs".to_string()
            } else if skipped.is_empty() {
                "the team has no burst provider".to_string()
            } else {
                skipped.join("; ")
            });
        }
        let offers: Vec<(String, Offer)> = allowed
            .iter()
            .flat_map(|a| {
                let (offers, _) = &self.burst_rt.catalogs[&a.name];
                offers.iter().filter_map(|o| {
                    let key = (a.name.clone(), o.instance_type.clone(), o.region.clone());
                    let cooling = self.burst_rt.cooldown.get(&key).is_some_and(|&t| now < t);
                    (!cooling).then(|| (a.name.clone(), o.clone()))
                })
            })
            .collect();
        let total = b.gpus_per_replica.0.saturating_mul(u64::from(b.replicas));
        let need = Need {
            gpu_model: b.gpu_model.clone(),
            gpus: u32::try_from(total.div_ceil(MILLI_PER_GPU)).unwrap_or(u32::MAX),
            gpu_memory_mb: 0,
            regions,
            spot_ok: spot_class,
        };
        let candidates = rank(&offers, &need, &allowed, &team.burst.regions);
        let Some(c) = candidates
            .into_iter()
            .find(|c| self.policy.burst_providers[&c.provider].allow_spot || !c.offer.spot)
        else {
            for a in &allowed {
                if self
                    .burst_rt
                    .catalogs
                    .get(&a.name)
                    .is_some_and(|(_, at)| now.saturating_sub(*at) >= CATALOG_NO_FIT_MAX_AGE_MS)
                {
                    catalogs_wanted.push(a.name.clone());
                }
            }
            let mut why = format!(
                "no offer of {} has {} {} GPU(s){}",
                allowed
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                need.gpus,
                need.gpu_model.as_deref().unwrap_or("(any model)"),
                if team.burst.regions.is_empty() {
                    String::new()
                } else {
                    format!(" in {}", team.burst.regions.join(", "))
                }
            );
            if !skipped.is_empty() {
                why.push_str(&format!("; {}", skipped.join("; ")));
            }
            return Err(why);
        };
        let doc = &self.policy.burst_providers[&c.provider];
        let seconds = runtime_s
            .unwrap_or(self.policy.settings.default_burst_runtime_s)
            .saturating_add(doc.idle_timeout_s);
        let estimate = c.estimate(seconds);
        let id = new_burst_id();
        let month = Month::of_ms(now);
        let crossed = self
            .ledger
            .reserve(
                &id,
                &team.name,
                &c.provider,
                month,
                estimate,
                team.burst.monthly_budget,
                self.policy.settings.burst_budget_per_month,
            )
            .map_err(|r| r.to_string())?;
        let kind = c.offer.provider.to_string();
        let record = BurstRecord {
            v: RECORD_VERSION,
            id: id.clone(),
            team: team.name.clone(),
            provider: c.provider.clone(),
            kind,
            workload: b.workload,
            cluster: cluster_name(&c.provider, &id),
            state: BurstState::Requested,
            offer: OfferRecord {
                instance_type: c.offer.instance_type.clone(),
                region: c.offer.region.clone(),
                gpu_model: c.offer.gpu_model.clone(),
                gpus: c.offer.gpus,
                gpu_memory_mb: c.offer.gpu_memory_mb,
                price_per_hour: c.offer.price_per_hour,
                spot: c.offer.spot,
            },
            month,
            reserved: estimate,
            settled: None,
            created_at_ms: now,
            launched_at_ms: None,
            joined_at_ms: None,
            instance_seen_ms: None,
            idle_since_ms: None,
            ended_at_ms: None,
            attempts: 0,
            retry_at_ms: 0,
            note: String::new(),
        };
        let msg = format!(
            "burst {id} for workload {}: {} {} in {} at {}/h, {estimate} reserved for {} s ({} of {} used in {month})",
            b.workload,
            c.provider,
            c.offer.instance_type,
            c.offer.region,
            c.offer.price_per_hour,
            seconds,
            self.ledger.used(&team.name, month),
            team.burst.monthly_budget,
        );
        self.bursts.insert(id.clone(), record);
        self.save_burst(fx, &id);
        self.event(fx, now, "burst_requested", Some(b.workload), None, msg);
        self.threshold_events(fx, now, crossed);
        self.burst_launch(&id, fx, now);
        Ok(())
    }

    /// Sends burst `id`'s launch (again): with a fresh one-time join token
    /// in its user-data, under the same idempotency key and tag.
    fn burst_launch(&mut self, id: &str, fx: &mut Effects, now: u64) {
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
    fn burst_ended(&mut self, id: &str, fx: &mut Effects, now: u64) {
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
    fn release_cluster(&mut self, cluster: &str, why: &str, fx: &mut Effects, now: u64) {
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
        if self.clusters.remove(cluster).is_some() {
            fx.delete(cluster_key(cluster));
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
    fn burst_terminate(&mut self, id: &str, note: String, fx: &mut Effects, now: u64) {
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
    fn cluster_busy(&self, cluster: &str) -> bool {
        self.workloads.values().any(|w| {
            (w.holds_gpus() || w.state.is_stopping())
                && w.placement
                    .as_ref()
                    .map(|p| p.cluster.as_str())
                    .or(w.stopping.as_ref().map(|s| s.cluster.as_str()))
                    == Some(cluster)
        })
    }

    /// Time-driven burst work, each tick: retries, join and idle timeouts,
    /// the budget guard, terminations to send again, provider listings.
    pub(super) fn burst_tick(&mut self, fx: &mut Effects, now: u64) {
        let Some(cfg) = self.burst_cfg.clone() else {
            return;
        };
        self.burst_rt
            .in_flight
            .retain(|_, at| now.saturating_sub(*at) < IN_FLIGHT_STALE_MS);
        self.burst_rt.cooldown.retain(|_, until| now < *until);
        self.burst_rt.down.retain(|_, (until, _)| now < *until);
        self.burst_rt.notes.retain(|id, _| {
            self.workloads
                .get(id)
                .is_some_and(|w| w.state == crate::lifecycle::WState::Pending)
        });
        let live: Vec<String> = self
            .bursts
            .values()
            .filter(|r| r.is_live())
            .map(|r| r.id.clone())
            .collect();
        for id in live {
            let r = self.bursts[&id].clone();
            let Some(doc) = self.policy.burst_providers.get(&r.provider).cloned() else {
                self.burst_step(&id, BurstEvent::TerminateRequested);
                self.burst_terminate(&id, "its provider left the policy".into(), fx, now);
                continue;
            };
            // Not joined yet and the workload it was for is done (cancelled,
            // finished) or placed on another cluster (on-prem freed up
            // first): nobody waits for it.
            let unwanted = self.workloads.get(&r.workload).is_none_or(|w| {
                w.state.is_terminal()
                    || w.placement.as_ref().is_some_and(|p| p.cluster != r.cluster)
            });
            if unwanted
                && matches!(
                    r.state,
                    BurstState::Requested | BurstState::Launching | BurstState::Joining { .. }
                )
                && !self.burst_rt.in_flight.contains_key(&launch_key(&id))
            {
                let why = match self.workloads.get(&r.workload) {
                    Some(w) if !w.state.is_terminal() => format!(
                        "workload {} runs on {}",
                        r.workload,
                        w.placement.as_ref().map_or("", |p| p.cluster.as_str())
                    ),
                    _ => format!("workload {} is done", r.workload),
                };
                self.burst_step(&id, BurstEvent::TerminateRequested);
                if self.bursts[&id].state.is_final() {
                    // Never launched: nothing to stop, nothing charged.
                    self.launch_failed(&id, why, fx, now);
                } else {
                    self.burst_terminate(&id, why, fx, now);
                }
                continue;
            }
            match &r.state {
                BurstState::Requested if now >= r.retry_at_ms => self.burst_launch(&id, fx, now),
                BurstState::Launching => self.burst_launch(&id, fx, now),
                BurstState::Joining { .. } => {
                    let since = r.launched_at_ms.unwrap_or(r.created_at_ms);
                    if now.saturating_sub(since) >= doc.join_timeout_s * 1000 {
                        // An image or network that keeps spokes from joining
                        // would fail again: the offer rests like one without capacity.
                        self.burst_rt.cooldown.insert(
                            (
                                r.provider.clone(),
                                r.offer.instance_type.clone(),
                                r.offer.region.clone(),
                            ),
                            now + CAPACITY_COOLDOWN_MS,
                        );
                        self.burst_step(&id, BurstEvent::JoinTimedOut);
                        self.burst_terminate(
                            &id,
                            format!("its spoke did not join within {} s", doc.join_timeout_s),
                            fx,
                            now,
                        );
                        continue;
                    }
                }
                BurstState::Ready { .. } => {
                    if self.cluster_busy(&r.cluster) {
                        if r.idle_since_ms.is_some() {
                            self.bursts.get_mut(&id).expect("live").idle_since_ms = None;
                            self.save_burst(fx, &id);
                        }
                    } else {
                        let since = match r.idle_since_ms {
                            Some(t) => t,
                            None => {
                                self.bursts.get_mut(&id).expect("live").idle_since_ms = Some(now);
                                self.save_burst(fx, &id);
                                now
                            }
                        };
                        if now.saturating_sub(since) >= doc.idle_timeout_s * 1000 {
                            self.burst_step(&id, BurstEvent::Idle);
                            self.burst_step(&id, BurstEvent::Drained);
                            self.burst_terminate(
                                &id,
                                format!("idle for {} s", doc.idle_timeout_s),
                                fx,
                                now,
                            );
                            continue;
                        }
                    }
                }
                BurstState::Draining { .. } if !self.cluster_busy(&r.cluster) => {
                    self.burst_step(&id, BurstEvent::Drained);
                    self.burst_terminate(&id, "drained".into(), fx, now);
                    continue;
                }
                BurstState::Terminating { instance_id } => {
                    let job = Job::Terminate {
                        id: Some(id.clone()),
                        provider: r.provider.clone(),
                        instance_id: instance_id.clone(),
                    };
                    self.queue_job(fx, terminate_key(&r.provider, instance_id), job, now);
                    continue;
                }
                _ => {}
            }
            self.budget_guard(&id, fx, now);
        }
        if now.saturating_sub(self.burst_rt.last_list_ms) >= cfg.list_every_ms {
            self.burst_rt.last_list_ms = now;
            for p in cfg.providers.keys() {
                let job = Job::List {
                    provider: p.clone(),
                    hub_tag: (TAG_HUB.to_string(), cfg.hub_id.clone()),
                };
                self.queue_job(fx, format!("list/{p}"), job, now);
            }
        }
        self.forget_old_bursts(fx, now);
    }

    /// Extends a running instance's reservation before its cost reaches it,
    /// or stops the instance when the budget has no room: spend never
    /// passes the budget.
    fn budget_guard(&mut self, id: &str, fx: &mut Effects, now: u64) {
        let Some(r) = self.bursts.get(id) else {
            return;
        };
        if r.state.instance_id().is_none() && r.launched_at_ms.is_none() {
            return;
        }
        let soon = r.cost_until(now + BUDGET_GUARD_S * 1000);
        if soon < r.reserved {
            return;
        }
        let more = r
            .offer
            .price_per_hour
            .per_hour_for_seconds(self.policy.settings.default_burst_runtime_s);
        let team = r.team.clone();
        let budget = self
            .policy
            .teams
            .get(&team)
            .map_or(Usd::ZERO, |t| t.burst.monthly_budget);
        match self.ledger.extend(
            id,
            more,
            budget,
            self.policy.settings.burst_budget_per_month,
        ) {
            Ok(crossed) => {
                let r = self.bursts.get_mut(id).expect("exists");
                r.reserved = r.reserved.saturating_add(more);
                let msg = format!(
                    "burst {id}: reservation extended by {more} to {}",
                    r.reserved
                );
                self.save_burst(fx, id);
                self.event(fx, now, "burst_extended", None, None, msg);
                self.threshold_events(fx, now, crossed);
            }
            Err(refusal) => {
                self.burst_step(id, BurstEvent::TerminateRequested);
                self.burst_terminate(id, format!("its reservation runs out: {refusal}"), fx, now);
            }
        }
    }

    /// Deletes finished burst records beyond [`MAX_BURST_RECORDS`], oldest
    /// first, and settled ones of months before last.
    fn forget_old_bursts(&mut self, fx: &mut Effects, now: u64) {
        let this = Month::of_ms(now);
        let last = Month::of_ms(now.saturating_sub(32 * 86_400_000));
        let mut done: Vec<(u64, String)> = self
            .bursts
            .values()
            .filter(|r| !r.is_live())
            .map(|r| (r.ended_at_ms.unwrap_or(r.created_at_ms), r.id.clone()))
            .collect();
        done.sort();
        let excess = self.bursts.len().saturating_sub(MAX_BURST_RECORDS);
        let mut gone: Vec<String> = done.iter().take(excess).map(|(_, id)| id.clone()).collect();
        gone.extend(
            done.iter()
                .filter(|(_, id)| {
                    let m = self.bursts[id].month;
                    m < last && m < this
                })
                .map(|(_, id)| id.clone()),
        );
        gone.sort();
        gone.dedup();
        if gone.is_empty() {
            return;
        }
        for id in gone {
            self.bursts.remove(&id);
            fx.delete(burst_key(&id));
            self.burst_snapshot_stale = true;
        }
        self.ledger = crate::burst::ledger::Ledger::from_reservations(
            self.bursts.values().map(BurstRecord::reservation),
        );
    }

    /// A registering spoke of a burst cluster: its claims are held against
    /// the offer (region, model, GPU count). `None`: not a burst cluster.
    pub(super) fn burst_check_register(
        &self,
        r: &axle_proto::pb::Register,
    ) -> Option<Result<(), super::HubError>> {
        let b = self.burst_of_cluster(&r.cluster)?;
        let refuse = |m: String| {
            Some(Err(super::HubError::bad(
                format!("register: {m}"),
                Some("nodes"),
            )))
        };
        // Launching too: the instance's spoke may call before the launch's
        // answer is recorded.
        if !matches!(
            b.state,
            BurstState::Launching | BurstState::Joining { .. } | BurstState::Ready { .. }
        ) {
            return Some(Err(super::HubError::PermissionDenied(format!(
                "burst cluster {} is {}: it takes no spoke",
                r.cluster,
                b.state.name()
            ))));
        }
        if !r.region.is_empty() && r.region != b.offer.region {
            return refuse(format!(
                "burst cluster {} runs in {}, and the spoke says {}",
                r.cluster, b.offer.region, r.region
            ));
        }
        let gpus: usize = r.nodes.iter().map(|n| n.gpus.len()).sum();
        if gpus > b.offer.gpus as usize
            || r.nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .any(|g| g.model != b.offer.gpu_model)
        {
            return refuse(format!(
                "burst cluster {} is one {} with {} {} GPUs; the spoke reports {gpus} GPUs of other models or more",
                r.cluster, b.offer.instance_type, b.offer.gpus, b.offer.gpu_model
            ));
        }
        Some(Ok(()))
    }

    /// The spoke of burst cluster `cluster` registered: work may go there.
    pub(super) fn burst_joined(&mut self, cluster: &str, fx: &mut Effects, now: u64) {
        let Some(id) = self.burst_of_cluster(cluster).map(|r| r.id.clone()) else {
            return;
        };
        if self.bursts[&id].state == BurstState::Launching {
            // Ready once the launch's answer names the instance.
            self.bursts.get_mut(&id).expect("exists").joined_at_ms = Some(now);
            self.save_burst(fx, &id);
            return;
        }
        if self.burst_step(&id, BurstEvent::Joined) {
            let r = self.bursts.get_mut(&id).expect("exists");
            r.joined_at_ms = Some(now);
            let took = r.launched_at_ms.map_or(0, |l| now.saturating_sub(l));
            let workload = r.workload;
            self.save_burst(fx, &id);
            self.event(
                fx,
                now,
                "burst_ready",
                Some(workload),
                Some(cluster),
                format!(
                    "burst {id} joined as cluster {cluster}, {} ms after its launch",
                    took
                ),
            );
            self.rebuild(fx, now);
            self.changed();
        }
    }

    /// What a provider answered.
    pub(super) fn burst_outcome(&mut self, o: Outcome, fx: &mut Effects, now: u64) {
        match o {
            Outcome::Catalog { provider, result } => {
                self.burst_rt
                    .in_flight
                    .remove(&format!("catalog/{provider}"));
                match result {
                    Ok(offers) => {
                        self.burst_rt.catalogs.insert(provider, (offers, now));
                        self.changed();
                    }
                    Err(e) => self.provider_failed(&provider, &e, fx, now),
                }
            }
            Outcome::Launched {
                id,
                provider,
                result,
            } => {
                self.burst_rt.in_flight.remove(&launch_key(&id));
                self.launched(&id, &provider, result, fx, now);
            }
            Outcome::Terminated {
                id,
                provider,
                instance_id,
                result,
            } => {
                self.burst_rt
                    .in_flight
                    .remove(&terminate_key(&provider, &instance_id));
                match (result, id) {
                    (Ok(()), Some(id)) => {
                        if self.burst_step(&id, BurstEvent::Terminated) {
                            self.burst_ended(&id, fx, now);
                        }
                    }
                    (Ok(()), None) => {
                        self.burst_rt
                            .orphans
                            .remove(&(provider.clone(), instance_id.clone()));
                        self.event(
                            fx,
                            now,
                            "burst_orphan_terminated",
                            None,
                            None,
                            format!("terminated orphan instance {instance_id} on {provider}: no live burst claims it"),
                        );
                    }
                    (Err(e), _) => {
                        warn!(
                            "terminating {instance_id} on {provider}: {e}; tried again next tick"
                        );
                    }
                }
            }
            Outcome::Listed { provider, result } => {
                let asked = self
                    .burst_rt
                    .in_flight
                    .remove(&format!("list/{provider}"))
                    .unwrap_or(0);
                match result {
                    Ok(list) => self.listed(&provider, list, asked, fx, now),
                    Err(e) => warn!("listing {provider}'s instances: {e}"),
                }
            }
        }
    }

    fn provider_failed(&mut self, provider: &str, e: &ProviderError, fx: &mut Effects, now: u64) {
        let until = match e {
            ProviderError::Retryable { retry_after, .. } => {
                now + retry_after.map_or(30_000, |d| d.as_millis() as u64)
            }
            ProviderError::Permanent { .. } => now + PROVIDER_DOWN_MS,
        };
        let first = !self.burst_rt.down.contains_key(provider);
        self.burst_rt
            .down
            .insert(provider.to_string(), (until, e.to_string()));
        if first {
            self.event(
                fx,
                now,
                "burst_provider_failed",
                None,
                None,
                format!("burst provider {provider}: {e}"),
            );
        }
    }

    fn launched(
        &mut self,
        id: &str,
        provider: &str,
        result: Result<Instance, ProviderError>,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(r) = self.bursts.get(id).cloned() else {
            return;
        };
        match result {
            Ok(inst) => {
                if matches!(r.state, BurstState::Requested | BurstState::Launching) {
                    if r.state == BurstState::Requested {
                        self.burst_step(id, BurstEvent::LaunchStarted);
                    }
                    self.burst_step(
                        id,
                        BurstEvent::Launched {
                            instance_id: inst.id.clone(),
                        },
                    );
                    if let Some(rec) = self.bursts.get_mut(id) {
                        rec.instance_seen_ms = Some(now);
                    }
                    self.save_burst(fx, id);
                    if r.joined_at_ms.is_some() && self.burst_step(id, BurstEvent::Joined) {
                        // Its spoke registered before this answer came.
                        self.rebuild(fx, now);
                        self.changed();
                    }
                    self.event(
                        fx,
                        now,
                        "burst_launched",
                        Some(r.workload),
                        Some(&r.cluster),
                        format!(
                            "burst {id}: {provider} instance {} ({} in {})",
                            inst.id, inst.instance_type, inst.region
                        ),
                    );
                } else if r.state.instance_id() != Some(inst.id.as_str()) {
                    // The burst ended meanwhile: this instance is not wanted.
                    let job = Job::Terminate {
                        id: None,
                        provider: provider.to_string(),
                        instance_id: inst.id.clone(),
                    };
                    self.queue_job(fx, terminate_key(provider, &inst.id), job, now);
                }
            }
            Err(e) if e.is_capacity() => {
                self.burst_rt.cooldown.insert(
                    (
                        provider.to_string(),
                        r.offer.instance_type.clone(),
                        r.offer.region.clone(),
                    ),
                    now + CAPACITY_COOLDOWN_MS,
                );
                self.launch_failed(id, format!("no capacity: {e}"), fx, now);
                // The next cycle tries the next-cheapest offer.
                self.changed();
            }
            Err(e) if e.is_retryable() && r.attempts < MAX_LAUNCH_ATTEMPTS => {
                let backoff = match &e {
                    ProviderError::Retryable {
                        retry_after: Some(d),
                        ..
                    } => d.as_millis() as u64,
                    _ => 1000u64 << r.attempts.min(6),
                };
                if self.burst_step(
                    id,
                    BurstEvent::LaunchFailed {
                        retry: true,
                        reason: e.to_string(),
                    },
                ) {
                    let rec = self.bursts.get_mut(id).expect("exists");
                    rec.retry_at_ms = now + backoff.min(60_000);
                    rec.note = format!("launch try {} failed: {e}", rec.attempts);
                    self.save_burst(fx, id);
                }
            }
            Err(e) => {
                if !e.is_retryable() {
                    self.provider_failed(provider, &e, fx, now);
                }
                self.launch_failed(id, e.to_string(), fx, now);
                self.changed();
            }
        }
    }

    fn launch_failed(&mut self, id: &str, why: String, fx: &mut Effects, now: u64) {
        let stepped = self.burst_step(
            id,
            BurstEvent::LaunchFailed {
                retry: false,
                reason: why.clone(),
            },
        );
        // Already failed (a request ended before its launch) and not yet settled: settle it.
        let unsettled_failure = self
            .bursts
            .get(id)
            .is_some_and(|r| matches!(r.state, BurstState::Failed { .. }) && r.settled.is_none());
        if !stepped && !unsettled_failure {
            return;
        }
        let r = self.bursts.get_mut(id).expect("exists");
        r.note = why.clone();
        // Nothing ran: nothing is charged, the reservation is released.
        r.launched_at_ms = None;
        r.ended_at_ms = Some(now);
        r.settled = Some(Usd::ZERO);
        let (team, workload) = (r.team.clone(), r.workload);
        let budget = self
            .policy
            .teams
            .get(&team)
            .map_or(Usd::ZERO, |t| t.burst.monthly_budget);
        self.ledger.settle(id, Usd::ZERO, budget);
        self.save_burst(fx, id);
        self.event(
            fx,
            now,
            "burst_failed",
            Some(workload),
            None,
            format!("burst {id} failed: {why}"),
        );
    }

    /// A provider's list of this hub's instances: adopts launches whose
    /// answer was lost, notices instances the provider took back, and reaps
    /// tagged instances no live burst claims.
    fn listed(
        &mut self,
        provider: &str,
        list: Vec<Instance>,
        asked: u64,
        fx: &mut Effects,
        now: u64,
    ) {
        let Some(cfg) = self.burst_cfg.clone() else {
            return;
        };
        let mut seen = std::collections::BTreeSet::new();
        for inst in list {
            if !inst.is_axles() || inst.tags.get(TAG_HUB) != Some(&cfg.hub_id) {
                continue;
            }
            let gone = matches!(inst.state, InstanceState::Terminated);
            let bid = inst.tags.get(TAG_BURST_ID).cloned().unwrap_or_default();
            let claim = self
                .bursts
                .get(&bid)
                .filter(|r| r.is_live() && r.provider == provider)
                .cloned();
            match claim {
                Some(r) if matches!(r.state, BurstState::Requested | BurstState::Launching) => {
                    if gone {
                        continue;
                    }
                    seen.insert(inst.id.clone());
                    info!("burst {bid}: adopting {provider} instance {}", inst.id);
                    self.launched(&bid, provider, Ok(inst.clone()), fx, now);
                    self.event(
                        fx,
                        now,
                        "burst_adopted",
                        Some(r.workload),
                        Some(&r.cluster),
                        format!(
                            "burst {bid}: found instance {} by its tag and adopted it",
                            inst.id
                        ),
                    );
                }
                Some(r) if r.state.instance_id() == Some(inst.id.as_str()) => {
                    seen.insert(inst.id.clone());
                    let taken_back = gone
                        || matches!(inst.state, InstanceState::Interrupted)
                        || (matches!(inst.state, InstanceState::Stopping)
                            && !matches!(r.state, BurstState::Terminating { .. }));
                    if taken_back && !matches!(r.state, BurstState::Terminating { .. }) {
                        self.burst_step(&bid, BurstEvent::Interrupted);
                        self.event(
                            fx,
                            now,
                            "burst_interrupted",
                            Some(r.workload),
                            Some(&r.cluster),
                            format!("burst {bid}: {provider} took instance {} back", inst.id),
                        );
                        self.release_cluster(
                            &r.cluster.clone(),
                            &format!(
                                "its burst instance {} was taken back by {provider}",
                                inst.id
                            ),
                            fx,
                            now,
                        );
                        self.burst_terminate(&bid, "interrupted by the provider".into(), fx, now);
                    } else if gone
                        && matches!(r.state, BurstState::Terminating { .. })
                        && self.burst_step(&bid, BurstEvent::Terminated)
                    {
                        self.burst_ended(&bid, fx, now);
                    }
                }
                _ if gone => {}
                _ => {
                    // Unknown, finished, or a second instance of one burst: an orphan.
                    seen.insert(inst.id.clone());
                    let key = (provider.to_string(), inst.id.clone());
                    let first = *self.burst_rt.orphans.entry(key).or_insert(now);
                    if first == now {
                        self.event(
                            fx,
                            now,
                            "burst_orphan_found",
                            None,
                            None,
                            format!(
                                "{provider} instance {} carries this hub's tag and no live burst claims it (burst id {bid:?}); terminated after {} s unless claimed",
                                inst.id,
                                cfg.orphan_grace_ms / 1000
                            ),
                        );
                    }
                    if now.saturating_sub(first) >= cfg.orphan_grace_ms {
                        let job = Job::Terminate {
                            id: None,
                            provider: provider.to_string(),
                            instance_id: inst.id.clone(),
                        };
                        self.queue_job(fx, terminate_key(provider, &inst.id), job, now);
                    }
                }
            }
        }
        self.burst_rt
            .orphans
            .retain(|(p, i), _| p != provider || seen.contains(i));
        // Live bursts whose instance the provider no longer lists at all
        // (known before this listing was asked for: a newer one may not show yet).
        let vanished: Vec<BurstRecord> = self
            .bursts
            .values()
            .filter(|r| {
                r.is_live()
                    && r.provider == provider
                    && r.instance_seen_ms.is_some_and(|t| t < asked)
                    && r.state.instance_id().is_some_and(|i| !seen.contains(i))
            })
            .cloned()
            .collect();
        for r in vanished {
            if matches!(r.state, BurstState::Terminating { .. }) {
                if self.burst_step(&r.id, BurstEvent::Terminated) {
                    self.burst_ended(&r.id, fx, now);
                }
                continue;
            }
            self.burst_step(&r.id, BurstEvent::Interrupted);
            self.event(
                fx,
                now,
                "burst_interrupted",
                Some(r.workload),
                Some(&r.cluster),
                format!("burst {}: {provider} no longer lists its instance", r.id),
            );
            if self.burst_step(&r.id, BurstEvent::Terminated) {
                self.burst_ended(&r.id, fx, now);
            }
        }
    }
}
