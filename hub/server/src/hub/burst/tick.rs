//! Time-driven burst upkeep, each tick (retries, join and idle timeouts,
//! the budget guard, listings, retention), and burst spokes registering
//! and joining.

use super::*;

impl Inner {
    /// Time-driven burst work, each tick: retries, join and idle timeouts,
    /// the budget guard, terminations to send again, provider listings.
    pub(in crate::hub) fn burst_tick(&mut self, fx: &mut Effects, now: u64) {
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
                    // Time this hub was down (or not leading) is not the
                    // instance's: a spoke cannot join a hub that is not there.
                    let since = r
                        .launched_at_ms
                        .unwrap_or(r.created_at_ms)
                        .max(self.started_ms);
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
    pub(in crate::hub) fn budget_guard(&mut self, id: &str, fx: &mut Effects, now: u64) {
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
    pub(in crate::hub) fn forget_old_bursts(&mut self, fx: &mut Effects, now: u64) {
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
    pub(in crate::hub) fn burst_check_register(
        &self,
        r: &axle_proto::pb::Register,
    ) -> Option<Result<(), crate::hub::HubError>> {
        let b = self.burst_of_cluster(&r.cluster)?;
        let refuse = |m: String| {
            Some(Err(crate::hub::HubError::bad(
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
            return Some(Err(crate::hub::HubError::PermissionDenied(format!(
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
    pub(in crate::hub) fn burst_joined(&mut self, cluster: &str, fx: &mut Effects, now: u64) {
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
}
