//! Burst wishes into reservations and launches: the cheapest offer that
//! fits, within the team's budget; and what a waiting workload's reason
//! says of burst.

use super::*;

impl Inner {
    /// Acts on the cycle's burst wishes: one launch per waiting workload at
    /// most, on the cheapest offer that fits, within the team's budget.
    pub(in crate::hub) fn burst_reconcile(
        &mut self,
        wanted: &[BurstWanted],
        fx: &mut Effects,
        now: u64,
    ) {
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
    pub(in crate::hub) fn burst_plan(
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
            interruption_at_ms: None,
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
}
