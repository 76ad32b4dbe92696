//! Spokes: one [`SpokeState`] per cluster with one transition function,
//! registration (inventory, the spoke's view of what runs), heartbeats, and
//! liveness (a silent spoke is lost; its work is released once the spoke
//! has surely fenced itself).

use std::collections::{BTreeMap, BTreeSet};

use axle_proto::pb;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::applier::Effects;
use super::messages::{grace_of, stop_msg};
use super::workloads::transition;
use super::{FENCE_MARGIN_MS, HEARTBEAT_INTERVAL_MS, HubConfig, HubError, Inner};
use crate::lifecycle::{WEvent, WState};
use crate::records::*;

/// A spoke's outbound stream: what the hub sends it, in order.
pub type SpokeTx = mpsc::Sender<pb::HubMessage>;

/// Where a cluster's spoke stands.
#[derive(Debug, Clone)]
pub enum SpokeState {
    /// Declared in the policy; no spoke has registered (or none since the
    /// store was created).
    Declared,
    /// A live session: work is placed here.
    Connected { conn: u64, tx: SpokeTx },
    /// Registered before, no session now (its stream ended, or the hub
    /// restarted): nothing new goes there; its work waits to be adopted.
    Disconnected,
    /// Silent past `spokeLostAfter`: nothing new goes there, and its work is
    /// released once the spoke has surely fenced itself. A session that is
    /// still open may bring it back with a heartbeat.
    Lost { session: Option<(u64, SpokeTx)> },
}

/// What happens to a spoke.
#[derive(Debug, Clone)]
pub enum SpokeEvent {
    /// A session registered (durably).
    Register { conn: u64, tx: SpokeTx },
    /// A heartbeat arrived on session `conn`.
    Heartbeat { conn: u64 },
    /// Session `conn`'s stream ended.
    StreamEnded { conn: u64 },
    /// No heartbeat for `spokeLostAfter`.
    Silent,
}

/// The event does not apply in that state (a message from a replaced
/// session, silence of a cluster that never had a spoke): nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("spoke event {event} does not apply in state {state}")]
pub struct Ignored {
    pub state: &'static str,
    pub event: &'static str,
}

impl SpokeState {
    pub fn name(&self) -> &'static str {
        match self {
            SpokeState::Declared => "Declared",
            SpokeState::Connected { .. } => "Ready",
            SpokeState::Disconnected => "Disconnected",
            SpokeState::Lost { .. } => "Lost",
        }
    }

    /// New work may be placed on the cluster.
    pub fn schedulable(&self) -> bool {
        matches!(self, SpokeState::Connected { .. })
    }

    /// The open session, if any: its id and sender.
    pub fn session(&self) -> Option<(u64, &SpokeTx)> {
        match self {
            SpokeState::Connected { conn, tx }
            | SpokeState::Lost {
                session: Some((conn, tx)),
            } => Some((*conn, tx)),
            _ => None,
        }
    }

    pub fn sender(&self) -> Option<&SpokeTx> {
        self.session().map(|(_, tx)| tx)
    }

    /// A spoke registered at some point (else the nodes are only declared).
    pub fn registered(&self) -> bool {
        !matches!(self, SpokeState::Declared)
    }

    pub fn is_lost(&self) -> bool {
        matches!(self, SpokeState::Lost { .. })
    }
}

impl SpokeEvent {
    fn name(&self) -> &'static str {
        match self {
            SpokeEvent::Register { .. } => "Register",
            SpokeEvent::Heartbeat { .. } => "Heartbeat",
            SpokeEvent::StreamEnded { .. } => "StreamEnded",
            SpokeEvent::Silent => "Silent",
        }
    }
}

/// The one transition function of a spoke.
pub fn step(state: &SpokeState, event: SpokeEvent) -> Result<SpokeState, Ignored> {
    use SpokeEvent as E;
    use SpokeState as S;
    let ignored = Ignored {
        state: state.name(),
        event: event.name(),
    };
    let current = |c: u64| state.session().is_some_and(|(s, _)| s == c);
    match (state, event) {
        // A new session replaces whatever was there.
        (_, E::Register { conn, tx }) => Ok(S::Connected { conn, tx }),
        (S::Connected { .. }, E::Heartbeat { conn }) if current(conn) => Ok(state.clone()),
        // A lost spoke that speaks again is back.
        (
            S::Lost {
                session: Some((c, tx)),
            },
            E::Heartbeat { conn },
        ) if *c == conn => Ok(S::Connected {
            conn,
            tx: tx.clone(),
        }),
        (S::Connected { .. }, E::StreamEnded { conn }) if current(conn) => Ok(S::Disconnected),
        (S::Lost { .. }, E::StreamEnded { conn }) if current(conn) => Ok(S::Lost { session: None }),
        (S::Connected { conn, tx }, E::Silent) => Ok(S::Lost {
            session: Some((*conn, tx.clone())),
        }),
        (S::Disconnected, E::Silent) => Ok(S::Lost { session: None }),
        _ => Err(ignored),
    }
}

/// Whether spoke process `instance` may register for a cluster in `state`
/// whose open session belongs to `current`: never two sessions at once. With
/// no open session, yes; the same process reconnecting, yes (its old stream
/// is dead, it just has not ended here yet); another spoke only once the
/// open session is silent for `fenced_after_ms` (the spoke behind it has
/// surely fenced itself). Otherwise why not.
pub fn may_replace(
    state: &SpokeState,
    current: &str,
    instance: &str,
    silent_ms: u64,
    fenced_after_ms: u64,
) -> Result<(), String> {
    if state.session().is_none() || (!instance.is_empty() && instance == current) {
        return Ok(());
    }
    if state.is_lost() && silent_ms >= fenced_after_ms {
        return Ok(());
    }
    Err(format!(
        "its spoke ({}) was heard from {} s ago",
        if current.is_empty() {
            "unnamed"
        } else {
            current
        },
        silent_ms / 1000
    ))
}

/// Refused registrations of one cluster are recorded as an event at most
/// this often (a refused spoke retries every few seconds).
pub const REFUSAL_EVENT_EVERY_MS: u64 = 60_000;

/// A cluster the hub knows: declared in policy, registered by a spoke, or both.
pub(super) struct ClusterEntry {
    pub region: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: Vec<NodeRecord>,
    pub session: SpokeState,
    pub last_seen_ms: u64,
    /// Running workloads the spoke did not list when it registered; if the
    /// next heartbeat does not list them either, they are gone.
    pub unconfirmed: BTreeSet<u64>,
    /// How its spoke runs work: `local`, `kubernetes` (empty: never said).
    pub driver: String,
    /// The spoke's image for workloads that name none.
    pub default_image: Option<String>,
    /// The spoke process of the open session (its `instance_id`): the one
    /// spoke that may replace the session before it is fenced (a reconnect).
    pub instance: String,
    /// Pages of nodes stored for it ([`crate::records::NodePageRecord`]).
    pub node_pages: u32,
}

impl ClusterEntry {
    pub fn new(session: SpokeState, last_seen_ms: u64) -> ClusterEntry {
        ClusterEntry {
            region: String::new(),
            labels: BTreeMap::new(),
            nodes: Vec::new(),
            session,
            last_seen_ms,
            unconfirmed: BTreeSet::new(),
            driver: String::new(),
            default_image: None,
            instance: String::new(),
            node_pages: 0,
        }
    }

    /// A cluster that runs container images (Kubernetes Jobs).
    pub fn runs_images(&self) -> bool {
        self.driver == "kubernetes"
    }
}

impl Inner {
    /// Applies `event` to `cluster`'s spoke; rebuilds the scheduler's view
    /// when whether it takes work changed. False when the event was ignored.
    pub(super) fn spoke_step(
        &mut self,
        cluster: &str,
        event: SpokeEvent,
        fx: &mut Effects,
        now: u64,
    ) -> bool {
        let Some(c) = self.clusters.get_mut(cluster) else {
            return false;
        };
        match step(&c.session, event) {
            Ok(next) => {
                let was = c.session.schedulable();
                c.session = next;
                if was != c.session.schedulable() {
                    self.rebuild(fx, now);
                }
                true
            }
            Err(_) => false,
        }
    }

    pub(super) fn is_current(&self, cluster: &str, conn: u64) -> bool {
        self.clusters
            .get(cluster)
            .and_then(|c| c.session.session())
            .is_some_and(|(id, _)| id == conn)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn register(
        &mut self,
        cfg: &HubConfig,
        r: pb::Register,
        peer: Option<&str>,
        conn: u64,
        tx: SpokeTx,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(), HubError> {
        if cfg.spoke_ca.is_some() {
            self.check_spoke_cert(peer, Some(&r.cluster), now)?;
        } else if let Some(token) = &cfg.spoke_token
            && r.token != *token
        {
            warn!("spoke for cluster {:?} presented a wrong token", r.cluster);
            return Err(HubError::Unauthenticated(
                "wrong or missing spoke token; start the spoke with --token (or AXLE_SPOKE_TOKEN) set to the hub's --spoke-token".into(),
            ));
        }
        if r.cluster.is_empty() {
            return Err(HubError::bad(
                "register: cluster name is empty",
                Some("cluster"),
            ));
        }
        let burst = self.burst_check_register(&r);
        if let Some(refused) = &burst {
            refused.clone()?;
        }
        if burst.is_none()
            && !self.policy.clusters.is_empty()
            && !self.policy.clusters.contains_key(&r.cluster)
        {
            return Err(HubError::PermissionDenied(format!(
                "cluster {:?} is not declared in the policy (known: {}); add a Cluster document first",
                r.cluster,
                self.policy
                    .clusters
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if let Some(c) = self.clusters.get(&r.cluster) {
            let silent_ms = now.saturating_sub(c.last_seen_ms.max(self.started_ms));
            let fenced_after = self.policy.settings.spoke_lost_after_s * 1000 + FENCE_MARGIN_MS;
            may_replace(
                &c.session,
                &c.instance,
                &r.instance_id,
                silent_ms,
                fenced_after,
            )
            .map_err(|why| {
                warn!(
                    "a second spoke for cluster {:?} was refused: {why}",
                    r.cluster
                );
                HubError::Conflict(format!(
                    "cluster {:?} already has a live spoke session: {why}. One spoke \
                         serves a cluster at a time; this one may connect once the other's \
                         stream ends or it is fenced",
                    r.cluster
                ))
            })?;
        }
        let checked = super::inventory::check(&self.policy, &r)?;
        let pages = node_pages(&checked.nodes);
        let record = ClusterRecord {
            v: RECORD_VERSION,
            name: r.cluster.clone(),
            region: checked.region,
            labels: checked.labels,
            nodes: Vec::new(),
            driver: r.driver.clone(),
            default_image: Some(r.default_image.clone()).filter(|i| !i.is_empty()),
            node_pages: pages.len() as u32,
        };
        fx.put(cluster_key(&r.cluster), &record);
        for (page, nodes) in pages.into_iter().enumerate() {
            let page = page as u32;
            fx.put(
                node_page_key(&r.cluster, page),
                &NodePageRecord {
                    v: RECORD_VERSION,
                    cluster: r.cluster.clone(),
                    page,
                    nodes,
                },
            );
        }
        let entry = self
            .clusters
            .entry(r.cluster.clone())
            .or_insert_with(|| ClusterEntry::new(SpokeState::Declared, now));
        for stale in record.node_pages..entry.node_pages {
            fx.delete(node_page_key(&r.cluster, stale));
        }
        entry.node_pages = record.node_pages;
        entry.driver = record.driver.clone();
        entry.default_image = record.default_image.clone();
        entry.region = record.region.clone();
        entry.labels = record.labels.clone();
        entry.nodes = checked.nodes;
        entry.last_seen_ms = now;
        entry.instance = r.instance_id.clone();
        entry.unconfirmed.clear();
        entry.session = step(&entry.session, SpokeEvent::Register { conn, tx })
            .expect("a registration applies in every state");
        let nodes = &entry.nodes;
        let gpus: usize = nodes.iter().map(|n| n.gpus.len()).sum();
        let node_count = nodes.len();
        let teams = crate::isolation::teams_for(&self.policy, nodes);
        info!(
            "spoke {} registered: {node_count} nodes, {gpus} GPUs",
            r.cluster
        );
        self.event(
            fx,
            now,
            "spoke_registered",
            None,
            Some(&r.cluster),
            format!(
                "spoke {} registered with {node_count} nodes, {gpus} GPUs",
                r.cluster
            ),
        );
        // First on the new session's stream, and like everything else sent
        // only once the registration is durable. What this batch queued for
        // the replaced session is dropped: the reconcile below re-sends
        // what still applies (assigns of placed work, pending stops).
        fx.msgs.retain(|(c, _)| c != &r.cluster);
        fx.msgs.push((
            r.cluster.clone(),
            pb::HubMessage {
                msg: Some(pb::hub_message::Msg::Registered(pb::Registered {
                    cluster: r.cluster.clone(),
                    heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
                    fence_after_ms: self.policy.settings.spoke_lost_after_s * 1000,
                    teams,
                    priority_classes: crate::isolation::priority_classes(&self.policy),
                    max_log_bytes_per_workload: self.policy.settings.max_log_bytes_per_workload,
                })),
            },
        ));
        self.rebuild(fx, now);
        self.reconcile_running(&r.cluster, &r.running, true, fx, now);
        if burst.is_some() {
            self.burst_joined(&r.cluster, fx, now);
        }
        Ok(())
    }

    /// Records a refused registration as an event (`spoke_refused`, with
    /// the reason), at most once per [`REFUSAL_EVENT_EVERY_MS`] per declared
    /// cluster and once for all undeclared names together: platform teams
    /// see who was refused and why, and a spoke retrying cannot fill the log.
    pub(super) fn note_refused_spoke(
        &mut self,
        cluster: &str,
        e: &HubError,
        fx: &mut Effects,
        now: u64,
    ) {
        let key = if self.policy.clusters.contains_key(cluster) {
            cluster.to_string()
        } else {
            String::new()
        };
        if self
            .refusals_noted
            .get(&key)
            .is_some_and(|&at| now.saturating_sub(at) < REFUSAL_EVENT_EVERY_MS)
        {
            return;
        }
        self.refusals_noted.insert(key, now);
        let shown = super::reports::bounded_message(cluster);
        let why = super::reports::bounded_message(&e.to_string());
        let declared = self.policy.clusters.contains_key(cluster);
        self.event(
            fx,
            now,
            "spoke_refused",
            None,
            declared.then_some(cluster),
            format!("a spoke for cluster {shown:?} was refused: {why}"),
        );
    }

    /// Compares what a spoke runs with what the hub assigned to it.
    pub(super) fn reconcile_running(
        &mut self,
        cluster: &str,
        running: &[pb::RunningWorkload],
        registering: bool,
        fx: &mut Effects,
        now: u64,
    ) {
        let reported: BTreeMap<u64, u64> =
            running.iter().map(|r| (r.workload_id, r.epoch)).collect();
        for (&id, &epoch) in &reported {
            let current = self.workloads.get(&id).is_some_and(|w| {
                w.epoch == epoch
                    && w.holds_gpus()
                    && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
            });
            let stopping = self
                .workloads
                .get(&id)
                .filter(|w| w.state.is_stopping())
                .and_then(|w| w.stopping.clone());
            if current {
                let w = self.workloads.get_mut(&id).expect("checked");
                if w.state == WState::Placed {
                    transition(
                        w,
                        WEvent::Started,
                        now,
                        format!("adopted: running on {cluster}"),
                    );
                    w.started_at_ms.get_or_insert(now);
                    self.save(fx, id);
                }
                if let Some(s) = stopping
                    && s.epoch == epoch
                {
                    // Re-send the stop that may have been lost.
                    self.request_stop(fx, id, &s, "stop".into());
                }
            } else if let Some(s) = stopping.filter(|s| s.epoch == epoch && s.cluster == cluster) {
                self.request_stop(fx, id, &s, "stop".into());
            } else {
                // Fencing: the spoke runs an epoch the hub no longer wants.
                warn!(
                    "spoke {cluster} runs workload {id} epoch {epoch}, which is stale; stopping it"
                );
                fx.msgs.push((
                    cluster.to_string(),
                    stop_msg(
                        id,
                        epoch,
                        pb::StopReason::Stale,
                        0,
                        "stale epoch: the workload was re-queued or finished".into(),
                    ),
                ));
                self.event(
                    fx,
                    now,
                    "fenced",
                    Some(id),
                    Some(cluster),
                    format!(
                        "stale copy of workload {id} (epoch {epoch}) on {cluster} told to stop"
                    ),
                );
            }
        }
        // Assigned here but not reported.
        let ids: Vec<u64> = self
            .workloads
            .values()
            .filter(|w| {
                w.holds_gpus() && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
            })
            .map(|w| w.id)
            .filter(|id| !reported.contains_key(id))
            .collect();
        for id in ids {
            let w = &self.workloads[&id];
            if w.state.is_stopping() {
                // It was being stopped and is gone: the stop is done.
                let epoch = w.epoch;
                self.stopped(cluster, id, epoch, fx, now);
            } else if w.state == WState::Placed {
                let msg = self.assign_msg(id);
                fx.msgs.push((cluster.to_string(), msg));
            } else if registering {
                if let Some(c) = self.clusters.get_mut(cluster) {
                    c.unconfirmed.insert(id);
                }
            } else {
                self.requeue(
                    fx,
                    now,
                    id,
                    cluster,
                    &format!("spoke {cluster} no longer runs it"),
                );
            }
        }
    }

    pub(super) fn heartbeat(
        &mut self,
        cluster: &str,
        conn: u64,
        hb: pb::Heartbeat,
        fx: &mut Effects,
        now: u64,
    ) {
        if !self.is_current(cluster, conn) {
            return;
        }
        if let Some(c) = self.clusters.get_mut(cluster) {
            c.last_seen_ms = now;
        }
        self.spoke_step(cluster, SpokeEvent::Heartbeat { conn }, fx, now);
        if let Some(n) = &hb.interruption {
            self.spoke_notice(cluster, &n.action, n.at_unix_ms, fx, now);
        }
        // The spoke fences itself when these stop coming.
        fx.msgs.push((
            cluster.to_string(),
            pb::HubMessage {
                msg: Some(pb::hub_message::Msg::HeartbeatAck(pb::HeartbeatAck {})),
            },
        ));
        let unconfirmed =
            std::mem::take(&mut self.clusters.get_mut(cluster).expect("current").unconfirmed);
        if !unconfirmed.is_empty() {
            let reported: BTreeSet<u64> = hb.running.iter().map(|r| r.workload_id).collect();
            for id in unconfirmed {
                if reported.contains(&id) {
                    continue;
                }
                let Some(w) = self.workloads.get(&id) else {
                    continue;
                };
                if w.state == WState::Running
                    && w.placement.as_ref().is_some_and(|p| p.cluster == cluster)
                {
                    self.requeue(
                        fx,
                        now,
                        id,
                        cluster,
                        &format!("spoke {cluster} restarted without it"),
                    );
                }
            }
        }
    }

    /// Marks silent spokes lost and releases the work of lost spokes once
    /// they have surely stopped it.
    pub(super) fn liveness(&mut self, fx: &mut Effects, now: u64) {
        let lost_after = self.policy.settings.spoke_lost_after_s * 1000;
        let started = self.started_ms;
        let silent_ms = |c: &ClusterEntry| now.saturating_sub(c.last_seen_ms.max(started));
        // 1. A spoke silent past the timeout is lost: no new work goes there.
        let newly_lost: Vec<String> = self
            .clusters
            .iter()
            .filter(|(_, c)| {
                matches!(
                    c.session,
                    SpokeState::Connected { .. } | SpokeState::Disconnected
                ) && silent_ms(c) >= lost_after
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &newly_lost {
            if let Some(c) = self.clusters.get_mut(name) {
                c.session =
                    step(&c.session, SpokeEvent::Silent).unwrap_or(SpokeState::Disconnected);
            }
        }
        for cluster in &newly_lost {
            warn!("spoke {cluster} silent for {lost_after} ms: lost");
            self.event(
                fx,
                now,
                "spoke_lost",
                None,
                Some(cluster),
                format!(
                    "spoke {cluster} silent for {}s: marked lost",
                    lost_after / 1000
                ),
            );
        }
        // 2. Its workloads are released once the spoke has surely stopped
        // them: a spoke cut off from the hub fences itself after the same
        // timeout and gives each workload its grace period. Nothing to look
        // for (and no pass over every stored workload) while no spoke is lost.
        if !self.clusters.values().any(|c| c.session.is_lost()) {
            return;
        }
        let due: Vec<(u64, String)> = self
            .workloads
            .values()
            .filter_map(|w| {
                let cluster = match (&w.stopping, &w.placement) {
                    (Some(s), _) if w.state.is_stopping() => &s.cluster,
                    (_, Some(p)) if w.holds_gpus() => &p.cluster,
                    _ => return None,
                };
                let c = self.clusters.get(cluster).filter(|c| c.session.is_lost())?;
                let release_after =
                    lost_after + grace_of(&self.policy, &w.priority) * 1000 + FENCE_MARGIN_MS;
                (silent_ms(c) >= release_after).then(|| (w.id, cluster.clone()))
            })
            .collect();
        // The scheduler's state is rebuilt below.
        for (id, cluster) in &due {
            let why = format!("spoke {cluster} lost");
            let w = self.workloads.get_mut(id).expect("listed");
            if w.state.is_stopping() {
                self.stop_done(fx, now, *id, cluster, Some(&why));
                continue;
            }
            transition(w, WEvent::Requeue, now, format!("re-queued: {why}"));
            w.placement = None;
            self.save(fx, *id);
            self.event(
                fx,
                now,
                "requeued",
                Some(*id),
                Some(cluster),
                format!("workload {id} re-queued: {why}"),
            );
        }
        if !newly_lost.is_empty() || !due.is_empty() {
            self.rebuild(fx, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx() -> SpokeTx {
        mpsc::channel(1).0
    }

    fn states() -> Vec<SpokeState> {
        vec![
            SpokeState::Declared,
            SpokeState::Connected { conn: 1, tx: tx() },
            SpokeState::Disconnected,
            SpokeState::Lost {
                session: Some((1, tx())),
            },
            SpokeState::Lost { session: None },
        ]
    }

    fn events() -> Vec<SpokeEvent> {
        vec![
            SpokeEvent::Register { conn: 2, tx: tx() },
            SpokeEvent::Heartbeat { conn: 1 },
            SpokeEvent::Heartbeat { conn: 2 },
            SpokeEvent::StreamEnded { conn: 1 },
            SpokeEvent::StreamEnded { conn: 2 },
            SpokeEvent::Silent,
        ]
    }

    /// What a state reads as, with its session: `Ready(1)`, `Lost(-)`.
    fn show(s: &SpokeState) -> String {
        match s.session() {
            Some((c, _)) => format!("{}({c})", s.name()),
            None if s.is_lost() => "Lost(-)".into(),
            None => s.name().into(),
        }
    }

    #[test]
    fn every_state_and_event_pair_is_decided() {
        // Rows: states(); columns: events(). "-" means ignored.
        let want = [
            // Register2  Hb1          Hb2  End1            End2  Silent
            ["Ready(2)", "-", "-", "-", "-", "-"], // Declared
            ["Ready(2)", "Ready(1)", "-", "Disconnected", "-", "Lost(1)"], // Ready(1)
            ["Ready(2)", "-", "-", "-", "-", "Lost(-)"], // Disconnected
            ["Ready(2)", "Ready(1)", "-", "Lost(-)", "-", "-"], // Lost(1)
            ["Ready(2)", "-", "-", "-", "-", "-"], // Lost(-)
        ];
        for (i, s) in states().iter().enumerate() {
            for (j, e) in events().into_iter().enumerate() {
                let got = match step(s, e.clone()) {
                    Ok(next) => show(&next),
                    Err(ignored) => {
                        assert_eq!(ignored.state, s.name());
                        "-".into()
                    }
                };
                assert_eq!(got, want[i][j], "{} + {e:?}", show(s));
            }
        }
    }

    #[test]
    fn a_live_session_is_replaced_only_by_its_own_spoke_or_once_fenced() {
        let connected = SpokeState::Connected { conn: 1, tx: tx() };
        let lost = SpokeState::Lost {
            session: Some((1, tx())),
        };
        // Observed: a second spoke with the shared token took over a connected cluster.
        assert!(may_replace(&connected, "a", "b", 0, 32_000).is_err());
        assert!(may_replace(&connected, "a", "", 0, 32_000).is_err());
        assert!(may_replace(&connected, "a", "a", 0, 32_000).is_ok());
        assert!(may_replace(&lost, "a", "b", 31_999, 32_000).is_err());
        assert!(may_replace(&lost, "a", "b", 32_000, 32_000).is_ok());
        for free in [
            SpokeState::Declared,
            SpokeState::Disconnected,
            SpokeState::Lost { session: None },
        ] {
            assert!(may_replace(&free, "a", "b", 0, 32_000).is_ok(), "{free:?}");
        }
    }

    #[test]
    fn only_a_connected_spoke_takes_work() {
        for s in states() {
            assert_eq!(
                s.schedulable(),
                matches!(s, SpokeState::Connected { .. }),
                "{}",
                show(&s)
            );
        }
        assert!(!SpokeState::Declared.registered());
        assert!(SpokeState::Disconnected.registered());
    }
}
