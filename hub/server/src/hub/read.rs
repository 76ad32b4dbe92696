//! Reads. After every commit the applier publishes a [`ReadView`]: an
//! immutable snapshot of what is durable (workloads, pending reasons,
//! clusters, team usage, the recent events). Building one is O(1) in the
//! number of workloads (the tables are persistent maps), and every GET and
//! gRPC read uses one without ever taking the applier's lock — readers
//! cannot slow down writes, and never see a change before it is durable.

use std::collections::BTreeMap;
use std::sync::Arc;

use axle_policy::{MILLI_PER_GPU, Policy};
use axle_proto::api;
use axle_scheduler::{PendingReason, TeamUsage};
use serde::Deserialize;

use super::{Hub, HubError, Inner, Workloads};
use crate::lifecycle::WState;
use crate::records::*;

/// Items per page of a workload list when the client names no `limit`: a
/// screenful many times over, a few hundred KB of JSON.
pub const DEFAULT_PAGE_ITEMS: usize = 500;

/// Most items per page: bounds the time one page takes and the memory of
/// one answer, whatever the client asks.
pub const MAX_PAGE_ITEMS: usize = 5_000;

/// Pages of stored events one request scans at most when looking for a
/// workload's old events (10 × 10,000): a request costs tens of ms at
/// worst; older matches are found by asking again with a later `since`.
pub const EVENT_SCAN_PAGES: usize = 10;

/// A cluster as readers see it.
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    pub name: String,
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeRecord>,
    /// [`super::SpokeState::name`].
    pub state: &'static str,
    pub registered: bool,
    pub last_seen_ms: u64,
    pub driver: String,
}

/// The state as of one commit.
#[derive(Clone)]
pub struct ReadView {
    pub policy: Arc<Policy>,
    pub workloads: Workloads,
    pub reasons: imbl::OrdMap<u64, Arc<PendingReason>>,
    pub clusters: Arc<Vec<ClusterSnapshot>>,
    pub teams: Arc<Vec<TeamUsage>>,
    /// The most recent events (at most [`super::EVENTS_IN_MEMORY`]).
    pub events: imbl::Vector<Arc<EventRecord>>,
    /// API tokens by id, to authenticate calls without the applier.
    pub tokens: Arc<BTreeMap<String, crate::auth::TokenRecord>>,
    /// Join tokens and spoke certificates, for `GET /api/v1/clusters/identity`.
    pub join_tokens: Arc<BTreeMap<String, crate::spoke_ca::JoinTokenRecord>>,
    pub spoke_certs: Arc<BTreeMap<String, crate::spoke_ca::SpokeCertRecord>>,
    /// Burst instances (live and of this and last month), for `GET /api/v1/burst`.
    pub bursts: Arc<Vec<crate::burst::record::BurstRecord>>,
    /// Whether this hub bursts (`--burst`, with the spoke CA).
    pub burst_enabled: bool,
}

/// One page of a workload list, unconverted.
pub struct Page<'a> {
    /// The first id the page may hold, and its size limit (the request,
    /// resolved).
    pub start: u64,
    pub limit: usize,
    pub items: Vec<PageItem<'a>>,
    pub next: Option<String>,
}

impl Page<'_> {
    /// The API views of the page's items.
    pub fn views(&self) -> Vec<api::WorkloadView> {
        self.items
            .iter()
            .map(|i| crate::views::workload(i.record, i.reason.map(|r| &**r)))
            .collect()
    }
}

pub struct PageItem<'a> {
    pub record: &'a WorkloadRecord,
    /// Changes whenever the record does ([`Workloads::range_with_gen`]).
    pub generation: u64,
    pub reason: Option<&'a Arc<PendingReason>>,
}

/// Filters and paging of a workload list.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub team: Option<String>,
    pub state: Option<String>,
    pub cluster: Option<String>,
    pub priority: Option<String>,
    /// Names that start with this.
    pub name_prefix: Option<String>,
    /// Items per page (default [`DEFAULT_PAGE_ITEMS`], at most
    /// [`MAX_PAGE_ITEMS`]).
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
    /// Only these teams' workloads (the caller's readable teams; `None`: all).
    /// Set by the server from the caller, never from the query.
    #[serde(skip)]
    pub visible_teams: Option<std::collections::BTreeSet<String>>,
}

/// The opaque token for the page after workload `last_id`.
fn continue_token(last_id: u64) -> String {
    format!("w1.{last_id:x}")
}

fn parse_continue(token: &str) -> Result<u64, HubError> {
    token
        .strip_prefix("w1.")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| {
            HubError::bad(
                format!(
                    "continue token {token:?} is not one this hub gave out; pass the `continue` of the previous page unchanged"
                ),
                Some("continue"),
            )
        })
}

impl Inner {
    /// The snapshot readers get after this batch's commit.
    pub(super) fn read_view(&self) -> ReadView {
        ReadView {
            policy: self.policy.clone(),
            workloads: self.workloads.clone(),
            reasons: self.reasons.clone(),
            clusters: Arc::new(
                self.clusters
                    .iter()
                    .map(|(name, c)| ClusterSnapshot {
                        name: name.clone(),
                        region: c.region.clone(),
                        labels: c.labels.clone(),
                        nodes: c.nodes.clone(),
                        state: c.session.name(),
                        registered: c.session.registered(),
                        last_seen_ms: c.last_seen_ms,
                        driver: c.driver.clone(),
                    })
                    .collect(),
            ),
            teams: Arc::new(self.state.team_usage()),
            events: self.events.clone(),
            tokens: self.tokens.clone(),
            join_tokens: self.join_tokens.clone(),
            spoke_certs: self.spoke_certs.clone(),
            bursts: self.burst_snapshot.clone(),
            burst_enabled: self.burst_cfg.is_some(),
        }
    }

    /// The API view of a workload as the applier sees it now (for answers
    /// sent after the commit).
    pub(super) fn view(&self, id: u64) -> Option<api::WorkloadView> {
        view_in(&self.workloads, &self.reasons, id)
    }
}

/// A workload's API view, with its pending reason.
fn view_in(
    workloads: &Workloads,
    reasons: &imbl::OrdMap<u64, Arc<PendingReason>>,
    id: u64,
) -> Option<api::WorkloadView> {
    workloads
        .get(&id)
        .map(|w| crate::views::workload(w, reasons.get(&id).map(|r| &**r)))
}

impl ReadView {
    pub fn workload(&self, id: u64) -> Option<&WorkloadRecord> {
        self.workloads.get(&id)
    }

    /// Whether the spoke of `cluster` may write the log of run `epoch` of
    /// workload `id`: only a run the hub assigned to that cluster (the
    /// current placement, or the run whose stop it awaits there). Else why not.
    pub fn may_log(&self, cluster: &str, id: u64, epoch: u64) -> Result<(), String> {
        let Some(w) = self.workloads.get(&id) else {
            return Err(format!("workload {id} does not exist"));
        };
        let placed = w.epoch == epoch && w.placement.as_ref().is_some_and(|p| p.cluster == cluster);
        let stopping = w
            .stopping
            .as_ref()
            .is_some_and(|s| s.epoch == epoch && s.cluster == cluster);
        if placed || stopping {
            return Ok(());
        }
        Err(format!(
            "run {epoch} of workload {id} was not assigned to cluster {cluster} (it is {}{})",
            w.state.as_str(),
            match &w.placement {
                Some(p) => format!(" on {} at run {}", p.cluster, w.epoch),
                None => String::new(),
            }
        ))
    }

    pub fn view(&self, id: u64) -> Option<api::WorkloadView> {
        let mut v = view_in(&self.workloads, &self.reasons, id)?;
        self.name_units(&mut v);
        Some(v)
    }

    /// Names the fractional unit of every shard that runs on one (what
    /// `describe` shows: `mig-b: MIG 2g.20gb #1`).
    fn name_units(&self, v: &mut api::WorkloadView) {
        let Some(c) = v
            .cluster
            .as_deref()
            .and_then(|name| self.clusters.iter().find(|c| c.name == name))
        else {
            return;
        };
        for r in &mut v.replicas {
            let Some(n) = c.nodes.iter().find(|n| n.name == r.node) else {
                continue;
            };
            for g in &mut r.gpus {
                g.unit = n
                    .gpus
                    .iter()
                    .find(|d| d.index == g.index && !d.unit.is_empty())
                    .map(|d| {
                        // Its number among the node's devices of that kind.
                        let nth = n
                            .gpus
                            .iter()
                            .filter(|x| x.unit == d.unit && x.index < d.index)
                            .count();
                        format!("{} #{nth}", d.unit_name())
                    });
            }
        }
    }

    /// One page of the workloads matching `p`, in id order, and the token
    /// of the next page when there are more.
    pub fn list(
        &self,
        p: &ListParams,
    ) -> Result<(Vec<api::WorkloadView>, Option<String>), HubError> {
        let page = self.page(p)?;
        Ok((page.views(), page.next))
    }

    /// [`ReadView::list`] before conversion: the records of the page with
    /// their generations and pending reasons.
    pub fn page(&self, p: &ListParams) -> Result<Page<'_>, HubError> {
        let state = match &p.state {
            Some(s) => Some(WState::parse(s).ok_or_else(|| {
                HubError::bad(
                    format!("unknown state {s:?}; use one of {}", api::STATES.join(", ")),
                    Some("state"),
                )
            })?),
            None => None,
        };
        let limit = match p.limit {
            None => DEFAULT_PAGE_ITEMS,
            Some(0) => {
                return Err(HubError::bad(
                    format!("limit must be between 1 and {MAX_PAGE_ITEMS}"),
                    Some("limit"),
                ));
            }
            Some(n) => n.min(MAX_PAGE_ITEMS),
        };
        let after = match &p.continue_token {
            Some(t) if !t.is_empty() => Some(parse_continue(t)?),
            _ => None,
        };
        if let Some(t) = &p.team
            && !self.policy.teams.contains_key(t)
        {
            return Err(HubError::bad(
                format!(
                    "unknown team {t:?}; known teams: {}",
                    self.policy
                        .teams
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some("team"),
            ));
        }
        let start = after.map_or(0, |id| id.saturating_add(1));
        let mut items: Vec<PageItem<'_>> = Vec::new();
        let mut next = None;
        // Both tables are ordered by id: the reasons are walked beside the
        // records (one pass) rather than looked up one by one.
        let mut reasons = self.reasons.range(start..).peekable();
        for (w, generation) in self.workloads.range_with_gen(start..).filter(|(w, _)| {
            p.team.as_ref().is_none_or(|t| &w.team == t)
                && p.visible_teams.as_ref().is_none_or(|v| v.contains(&w.team))
                && state.is_none_or(|s| w.state == s)
                && p.priority.as_ref().is_none_or(|c| &w.priority == c)
                && p.name_prefix
                    .as_ref()
                    .is_none_or(|n| w.name.starts_with(n.as_str()))
                && p.cluster
                    .as_ref()
                    .is_none_or(|c| w.placement.as_ref().is_some_and(|p| &p.cluster == c))
        }) {
            if items.len() == limit {
                next = items.last().map(|i| continue_token(i.record.id));
                break;
            }
            while reasons.next_if(|(id, _)| **id < w.id).is_some() {}
            let reason = reasons.next_if(|(id, _)| **id == w.id).map(|(_, r)| r);
            items.push(PageItem {
                record: w,
                generation,
                reason,
            });
        }
        Ok(Page {
            start,
            limit,
            items,
            next,
        })
    }

    pub fn cluster_views(&self) -> Vec<api::ClusterView> {
        let allocated: BTreeMap<(&str, &str, u32), u64> = {
            let mut m = BTreeMap::new();
            for w in self.workloads.values() {
                if !w.holds_gpus() {
                    continue;
                }
                if let Some(p) = &w.placement {
                    for r in &p.replicas {
                        for (node, g, milli) in &r.shards {
                            *m.entry((p.cluster.as_str(), node.as_str(), *g))
                                .or_insert(0) += u64::from(*milli);
                        }
                    }
                }
            }
            m
        };
        self.clusters
            .iter()
            .map(|c| {
                let name = &c.name;
                let nodes: Vec<api::NodeView> = c
                    .nodes
                    .iter()
                    .map(|n| api::NodeView {
                        name: n.name.clone(),
                        gpus: n
                            .gpus
                            .iter()
                            .map(|g| {
                                let used = allocated
                                    .get(&(name.as_str(), n.name.as_str(), g.index))
                                    .copied()
                                    .unwrap_or(0);
                                let (unit, share) = if g.unit.is_empty() {
                                    (None, 1.0)
                                } else {
                                    (
                                        Some(g.unit_name()),
                                        f64::from(g.share_milli) / MILLI_PER_GPU as f64,
                                    )
                                };
                                api::GpuView {
                                    index: g.index,
                                    model: g.model.clone(),
                                    memory_mb: g.memory_mb,
                                    // A unit serves one fraction, whole.
                                    allocated: match unit {
                                        Some(_) if used > 0 => share,
                                        Some(_) => 0.0,
                                        None => used as f64 / MILLI_PER_GPU as f64,
                                    },
                                    unit,
                                    share,
                                }
                            })
                            .collect(),
                    })
                    .collect();
                let total: f64 = nodes.iter().flat_map(|n| &n.gpus).map(|g| g.share).sum();
                let alloc: f64 = nodes
                    .iter()
                    .flat_map(|n| &n.gpus)
                    .map(|g| g.allocated)
                    .sum();
                let running = self
                    .workloads
                    .values()
                    .filter(|w| {
                        w.holds_gpus() && w.placement.as_ref().is_some_and(|p| &p.cluster == name)
                    })
                    .count() as u64;
                api::ClusterView {
                    name: name.clone(),
                    region: c.region.clone(),
                    state: c.state.to_string(),
                    labels: c.labels.clone(),
                    nodes,
                    gpus_total: total,
                    gpus_allocated: alloc,
                    running_workloads: running,
                    last_heartbeat_ms: (c.registered && c.last_seen_ms > 0)
                        .then_some(c.last_seen_ms),
                    driver: c.driver.clone(),
                }
            })
            .collect()
    }

    /// The burst instances `who` may see (their teams'; every team's for
    /// platform admins and viewers of all), and every team's spend at `now`.
    pub fn burst_view(&self, who: &crate::auth::Identity, now: u64) -> api::BurstView {
        use crate::burst::ledger::Month;
        let month = Month::of_ms(now);
        let admin = crate::auth::is_platform_admin(&self.policy, who);
        let sees = |team: &str| admin || crate::auth::role_in(&self.policy, who, team).is_some();
        let instances = self
            .bursts
            .iter()
            .filter(|r| sees(&r.team))
            .map(|r| api::BurstInstanceView {
                id: r.id.clone(),
                team: r.team.clone(),
                provider: r.provider.clone(),
                kind: r.kind.clone(),
                cluster: r.cluster.clone(),
                workload: r.workload,
                state: r.state.name().to_string(),
                instance_id: r.state.instance_id().map(str::to_string),
                instance_type: r.offer.instance_type.clone(),
                region: r.offer.region.clone(),
                gpu_model: r.offer.gpu_model.clone(),
                gpus: r.offer.gpus,
                spot: r.offer.spot,
                price_per_hour_micro_usd: r.offer.price_per_hour.micros(),
                reserved_micro_usd: r.reserved.micros(),
                cost_micro_usd: r.settled.unwrap_or_else(|| r.cost_until(now)).micros(),
                settled: r.settled.is_some(),
                created_at_ms: r.created_at_ms,
                launched_at_ms: r.launched_at_ms,
                joined_at_ms: r.joined_at_ms,
                ended_at_ms: r.ended_at_ms,
                interruption_at_ms: r.interruption_at_ms,
                note: r.note.clone(),
            })
            .collect();
        let teams = self
            .policy
            .teams
            .values()
            .map(|t| {
                let mut committed = axle_policy::Usd::ZERO;
                let mut spent = axle_policy::Usd::ZERO;
                let mut by_provider: BTreeMap<String, u64> = BTreeMap::new();
                for r in self
                    .bursts
                    .iter()
                    .filter(|r| r.team == t.name && r.month == month)
                {
                    committed = committed.saturating_add(r.reservation().counts());
                    let cost = r.settled.unwrap_or_else(|| r.cost_until(now));
                    spent = spent.saturating_add(cost);
                    *by_provider.entry(r.provider.clone()).or_default() += cost.micros();
                }
                api::BurstSpendView {
                    team: t.name.clone(),
                    budget_micro_usd: t.burst.monthly_budget.micros(),
                    committed_micro_usd: committed.micros(),
                    spent_micro_usd: spent.micros(),
                    by_provider,
                }
            })
            .collect();
        api::BurstView {
            enabled: self.burst_enabled,
            month: month.to_string(),
            instances,
            teams,
        }
    }

    pub fn team_views(&self) -> Vec<api::TeamView> {
        let mut pending: BTreeMap<&str, u64> = BTreeMap::new();
        // (team, GPU model asked for, or "" for none) → pending workloads.
        let mut pending_by_model: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        let mut running: BTreeMap<&str, u64> = BTreeMap::new();
        // (team, GPU model) → running workloads, by the model of the first GPU.
        let mut by_model: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        let model_of = |cluster: &str, node: &str, gpu: u32| -> Option<&str> {
            let c = self.clusters.iter().find(|c| c.name == cluster)?;
            let n = c.nodes.iter().find(|n| n.name == node)?;
            n.gpus
                .iter()
                .find(|g| g.index == gpu)
                .map(|g| g.model.as_str())
        };
        for w in self.workloads.values() {
            if matches!(w.state, WState::Pending | WState::Preempting) {
                *pending.entry(&w.team).or_default() += 1;
                *pending_by_model
                    .entry((&w.team, w.gpu_model.as_deref().unwrap_or("")))
                    .or_default() += 1;
            } else if w.holds_gpus() {
                *running.entry(&w.team).or_default() += 1;
                let first = w.placement.as_ref().and_then(|p| {
                    let (node, gpu, _) = p.replicas.first()?.shards.first()?;
                    model_of(&p.cluster, node, *gpu)
                });
                if let Some(model) = first {
                    *by_model.entry((&w.team, model)).or_default() += 1;
                }
            }
        }
        self.teams
            .iter()
            .cloned()
            .map(|t| {
                let team = self.policy.teams.get(&t.team);
                api::TeamView {
                    weight: team.map(|x| x.weight).unwrap_or(1.0),
                    burst_budget_micro_usd: team.map_or(0, |x| x.burst.monthly_budget.micros()),
                    pending: pending.get(t.team.as_str()).copied().unwrap_or(0),
                    pending_any_model: pending_by_model
                        .get(&(t.team.as_str(), ""))
                        .copied()
                        .unwrap_or(0),
                    running: running.get(t.team.as_str()).copied().unwrap_or(0),
                    quotas: {
                        let named: Vec<&str> =
                            t.classes.iter().map(|c| c.gpu_class.as_str()).collect();
                        t.classes
                            .iter()
                            .map(|c| {
                                // A model the team has no class of counts under `any`.
                                let running = by_model
                                    .iter()
                                    .filter(|((team, model), _)| {
                                        *team == t.team
                                            && (*model == c.gpu_class
                                                || (c.gpu_class == axle_policy::ANY_GPU_CLASS
                                                    && !named.contains(model)))
                                    })
                                    .map(|(_, n)| n)
                                    .sum();
                                // Likewise for what waits, by the model asked for.
                                let pending = pending_by_model
                                    .iter()
                                    .filter(|((team, model), _)| {
                                        *team == t.team
                                            && !model.is_empty()
                                            && (*model == c.gpu_class
                                                || (c.gpu_class == axle_policy::ANY_GPU_CLASS
                                                    && !named.contains(model)))
                                    })
                                    .map(|(_, n)| n)
                                    .sum();
                                api::QuotaView {
                                    gpu_class: c.gpu_class.clone(),
                                    used: c.used.as_gpus_f64(),
                                    guaranteed: c.guaranteed.as_gpus_f64(),
                                    limit: c.limit.as_gpus_f64(),
                                    borrowed: c.used.saturating_sub(c.guaranteed).as_gpus_f64(),
                                    running,
                                    pending,
                                }
                            })
                            .collect()
                    },
                    name: t.team,
                }
            })
            .collect()
    }
}

impl Hub {
    /// The most recent `n` events (of `workload` when given) in the
    /// snapshot's window, oldest first.
    pub fn events_tail(&self, n: usize, workload: Option<u64>) -> Vec<Arc<EventRecord>> {
        let read = self.read();
        let mut out: Vec<Arc<EventRecord>> = read
            .events
            .iter()
            .rev()
            .filter(|e| workload.is_none_or(|w| e.workload == Some(w)))
            .take(n)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// Events after `since` (oldest first): from the snapshot, or from the
    /// store when they are older than its window.
    pub async fn events_since(
        &self,
        since: u64,
        limit: usize,
        workload: Option<u64>,
    ) -> Result<Vec<Arc<EventRecord>>, HubError> {
        let keep =
            |e: &EventRecord| e.seq > since && workload.is_none_or(|w| e.workload == Some(w));
        let read = self.read();
        let in_memory = read
            .events
            .front()
            .is_none_or(|first| first.seq <= since + 1);
        if in_memory {
            return Ok(read
                .events
                .iter()
                .filter(|e| keep(e))
                .take(limit)
                .cloned()
                .collect());
        }
        // Older than the window: page through the store from `since` on,
        // a bounded number of records per call.
        let mut out = Vec::new();
        let mut after = event_key(since);
        let mut pages = 0;
        while out.len() < limit && pages < EVENT_SCAN_PAGES {
            pages += 1;
            let page = self
                .store
                .range_page(EVENTS, Some(&after), super::EVENTS_IN_MEMORY)
                .await
                .map_err(|e| HubError::Internal(format!("cannot read events: {e}")))?;
            let Some(last) = page.last() else { break };
            after = last.key.clone();
            out.extend(
                page.iter()
                    .filter_map(|kv| serde_json::from_slice::<EventRecord>(&kv.value).ok())
                    .filter(|e| keep(e))
                    .map(Arc::new),
            );
            if workload.is_none() {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }
}
