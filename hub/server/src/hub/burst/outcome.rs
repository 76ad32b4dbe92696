//! What providers answered: catalogs, launches, terminations, listings
//! (adoption, reclaims, orphans).

use super::*;

impl Inner {
    /// What a provider answered.
    pub(in crate::hub) fn burst_outcome(&mut self, o: Outcome, fx: &mut Effects, now: u64) {
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

    pub(in crate::hub) fn provider_failed(
        &mut self,
        provider: &str,
        e: &ProviderError,
        fx: &mut Effects,
        now: u64,
    ) {
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

    pub(in crate::hub) fn launched(
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

    pub(in crate::hub) fn launch_failed(
        &mut self,
        id: &str,
        why: String,
        fx: &mut Effects,
        now: u64,
    ) {
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
    pub(in crate::hub) fn listed(
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
                    if let InstanceState::Interrupting { at_ms } = inst.state {
                        self.burst_notice(&bid, at_ms, &format!("{provider}'s listing"), fx, now);
                        continue;
                    }
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
