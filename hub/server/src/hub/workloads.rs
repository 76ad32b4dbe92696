//! User commands on workloads (submit, cancel) and the one place a
//! workload record changes state ([`transition`], through the lifecycle's
//! `step`).

use axle_policy::Milli;
use axle_proto::api::{self, SubmitRequest};
use tracing::warn;

use super::applier::Effects;
use super::snapshot::spec_of;
use super::{HubError, Inner};
use crate::lifecycle::{WEvent, WState, step};
use crate::records::*;

pub(super) fn transition(w: &mut WorkloadRecord, event: WEvent, now: u64, reason: String) -> bool {
    match step(w.state, event) {
        Ok(to) => {
            // A run ends: its time counts, whatever comes next (a
            // preemption, a lost spoke, the end).
            if w.state == WState::Running
                && to != WState::Running
                && let Some(started) = w.started_at_ms
            {
                w.run_ms = w.run_ms.saturating_add(now.saturating_sub(started));
            }
            w.history.push(TransitionRecord {
                at_ms: now,
                from: w.state,
                to,
                reason,
            });
            if w.history.len() > MAX_HISTORY {
                w.history.remove(0);
            }
            w.state = to;
            true
        }
        Err(e) => {
            warn!("workload {}: {e}", w.id);
            false
        }
    }
}

impl Inner {
    /// The checkpoint settings of a new workload: its priority class's,
    /// overridden by the request. Err on an interval of 0 or a signal a
    /// workload cannot catch.
    fn checkpoint_of(
        &self,
        req: &SubmitRequest,
        priority: &str,
    ) -> Result<(Option<u64>, Option<String>), HubError> {
        let class = self.policy.priority_classes.get(priority);
        let checkpointable = req
            .checkpointable
            .unwrap_or_else(|| class.is_some_and(|c| c.checkpointable));
        if req.checkpoint_interval_s == Some(0) {
            return Err(HubError::bad(
                "checkpoint_interval_s must be at least 1 second",
                Some("checkpoint_interval_s"),
            ));
        }
        if let Some(sig) = &req.checkpoint_signal
            && !axle_policy::CHECKPOINT_SIGNALS.contains(&sig.as_str())
        {
            return Err(HubError::bad(
                format!(
                    "checkpoint_signal {sig:?} cannot ask a workload to save; use one of {}",
                    axle_policy::CHECKPOINT_SIGNALS.join(", ")
                ),
                Some("checkpoint_signal"),
            ));
        }
        if !checkpointable {
            return Ok((None, None));
        }
        let interval = req.checkpoint_interval_s.unwrap_or_else(|| {
            class.map_or(axle_policy::DEFAULT_CHECKPOINT_INTERVAL_S, |c| {
                c.checkpoint_interval_s
            })
        });
        let signal = req.checkpoint_signal.clone().unwrap_or_else(|| {
            class.map_or_else(|| "SIGTERM".to_string(), |c| c.checkpoint_signal.clone())
        });
        Ok((Some(interval), Some(signal)))
    }

    pub(super) fn submit(
        &mut self,
        req: SubmitRequest,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(u64, bool), HubError> {
        if let Err(e) = crate::request_limits::check(&req) {
            return Err(HubError::bad(e.message, Some(&e.field)));
        }
        // An unknown team is refused below, with the teams there are.
        if let Some(who) = &self.actor
            && self.policy.teams.contains_key(&req.team)
        {
            crate::auth::may(&self.policy, who, &req.team, crate::auth::Action::Submit)?;
        }
        if let Some(key) = &req.idempotency_key
            && let Some(&id) = self.idem.get(&(req.team.clone(), key.clone()))
        {
            return Ok((id, false));
        }
        if req.command.is_empty() || req.command[0].trim().is_empty() {
            return Err(HubError::bad(
                "command must name a program to run",
                Some("command"),
            ));
        }
        if !req.gpus.is_finite() || req.gpus <= 0.0 {
            return Err(HubError::bad(
                format!(
                    "gpus must be a positive number (got {}); e.g. 0.25, 1 or 8",
                    req.gpus
                ),
                Some("gpus"),
            ));
        }
        let Some(gpus) = Milli::from_gpus_f64(req.gpus) else {
            return Err(HubError::bad(
                format!(
                    "gpus {} is not a valid GPU amount; use e.g. 0.25, 0.5 or a whole number",
                    req.gpus
                ),
                Some("gpus"),
            ));
        };
        let gang = req.gang.unwrap_or(1);
        if gang == 0 {
            return Err(HubError::bad("gang must be at least 1", Some("gang")));
        }
        let priority = req
            .priority
            .clone()
            .unwrap_or_else(|| self.policy.settings.default_priority_class.clone());
        let id = self.next_id;
        let (checkpoint_interval_s, checkpoint_signal) = self.checkpoint_of(&req, &priority)?;
        let w = WorkloadRecord {
            v: RECORD_VERSION,
            id,
            name: req
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("w-{id}")),
            team: req.team.clone(),
            priority,
            gpus_milli: gpus.0,
            replicas: gang,
            gpu_model: req.gpu_model.clone().filter(|m| !m.is_empty()),
            regions: req.regions.clone(),
            allow_spread: req.allow_spread,
            burst_allowed: req.burst_allowed,
            command: req.command.clone(),
            env: req.env.clone(),
            max_runtime_s: req.max_runtime_s.filter(|&s| s > 0),
            image: req.image.clone().filter(|i| !i.trim().is_empty()),
            checkpoint_interval_s,
            checkpoint_signal,
            idempotency_key: req.idempotency_key.clone(),
            submitted_at_ms: now,
            submitted_by: self.actor.as_ref().map(|a| a.user.clone()),
            state: WState::Pending,
            epoch: 0,
            placement: None,
            started_at_ms: None,
            finished_at_ms: None,
            exit_code: None,
            preemptions: 0,
            stopping: None,
            history: Vec::new(),
            preemption_log: Vec::new(),
            lost_gpu_ms: 0,
            run_ms: 0,
        };
        let spec = spec_of(&w, &self.runtimes);
        if let Err(e) = self.state.submit(spec) {
            use axle_scheduler::RequestError as R;
            let field = match &e {
                R::UnknownTeam { .. } => Some("team"),
                R::UnknownPriorityClass { .. } => Some("priority"),
                R::ZeroGpus
                | R::BadFraction { .. }
                | R::NotWhole(_)
                | R::NeverFitsNode { .. }
                | R::AboveLimit { .. }
                | R::AboveEveryLimit { .. }
                | R::AboveGuarantee { .. } => Some("gpus"),
                R::ZeroReplicas | R::GangTooLarge { .. } => Some("gang"),
                R::UnknownGpuModel { .. } | R::NoQuota { .. } => Some("gpu_model"),
                R::UnknownRegion { .. } => Some("regions"),
                _ => None,
            };
            return Err(HubError::bad(e.to_string(), field));
        }
        self.next_id += 1;
        if let Some(key) = &w.idempotency_key {
            self.idem.insert((w.team.clone(), key.clone()), id);
        }
        let msg = format!(
            "{} submitted by team {}: {} GPU{} ({})",
            w.name,
            w.team,
            gpus,
            if gang > 1 {
                format!(" × {gang}")
            } else {
                String::new()
            },
            w.priority
        );
        self.workloads.insert(w);
        self.save(fx, id);
        self.event(fx, now, "submitted", Some(id), None, msg);
        self.changed();
        Ok((id, true))
    }

    pub(super) fn cancel(
        &mut self,
        id: u64,
        fx: &mut Effects,
        now: u64,
    ) -> Result<api::WorkloadView, HubError> {
        if let (Some(who), Some(w)) = (&self.actor, self.workloads.get(&id)) {
            let owner = w.submitted_by.as_deref();
            crate::auth::may(
                &self.policy,
                who,
                &w.team,
                crate::auth::Action::Cancel { owner },
            )?;
        }
        let Some(w) = self.workloads.get_mut(&id) else {
            return Err(HubError::NotFound(format!("workload {id} not found")));
        };
        if w.state.is_terminal() {
            return Err(HubError::Conflict(format!(
                "workload {id} already finished ({})",
                w.state.as_str()
            )));
        }
        if w.state == WState::Cancelling {
            // Asked again: the stop is on its way already.
            return self
                .view(id)
                .ok_or_else(|| HubError::Internal(format!("workload {id} vanished")));
        }
        if w.state == WState::Preempting {
            // Its stop is on its way: cancelled once it is confirmed.
            transition(
                w,
                WEvent::Cancel,
                now,
                "cancel requested while preempting".into(),
            );
        } else if let Some(p) = w.placement.as_ref().filter(|_| w.holds_gpus()) {
            let stopping = StoppingRecord {
                cluster: p.cluster.clone(),
                epoch: w.epoch,
                legacy_cancel: false,
                grace_s: None,
            };
            transition(w, WEvent::Cancel, now, "cancel requested".into());
            w.stopping = Some(stopping.clone());
            self.request_stop(fx, id, &stopping, "cancelled by user".into());
        } else {
            transition(w, WEvent::Cancel, now, "cancelled by user".into());
            w.finished_at_ms = Some(now);
            self.state.remove(id);
            self.reasons.remove(&id);
        }
        self.save(fx, id);
        self.event(
            fx,
            now,
            "cancel_requested",
            Some(id),
            None,
            format!(
                "workload {id} cancelled by {}",
                self.actor.as_ref().map_or("user", |a| a.user.as_str())
            ),
        );
        self.view(id)
            .ok_or_else(|| HubError::Internal(format!("workload {id} vanished")))
    }
}
