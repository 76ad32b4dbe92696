//! One scheduling cycle: a pure function of (`State`, clock, options) to
//! `Decisions`. No I/O, no clock reads, no hashing, no randomness.
//!
//! Order of service (documented in ARCHITECTURE.md):
//! 1. priority class value, highest first;
//! 2. within a class, teams below their guarantee before borrowers, then the
//!    lowest weighted dominant share
//!    `share(t) = max over quota classes q of used(t,q) / max(guaranteed(t,q), 1 GPU) / weight(t)`
//!    (for a workload that names a GPU model, only that model's quota class counts);
//! 3. then submit time, then workload id.
//!
//! Shares are recomputed after every placement, so a cycle interleaves teams
//! the way a fair-share queue does.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use axle_policy::Milli;

use crate::state::{GpuFree, QueueKey, Queued, State};
use crate::types::{Decisions, PendingReason, Preemption, WorkloadId, WorkloadSpec};

mod burst;
mod explain;
mod memo;
mod order;
mod placement;
mod preemption;
mod quota;
mod work;

use burst::maybe_burst;
use memo::{ShapeKey, dominated};
use order::TeamKey;
use work::Work;

/// Preemption searches per cycle. Each search may scan every node of a GPU
/// model (8,000 nodes in the largest fleet we plan for, ~50 µs); 256 searches
/// bound the worst cycle to ~15 ms. Workloads past the limit wait one cycle.
pub const MAX_PREEMPTION_SEARCHES_PER_CYCLE: usize = 256;

/// Burst wishes a cycle that does not explain every workload looks for past
/// the head of a full group (each costs the hub one offer lookup). Deep
/// queues wait for the next explaining cycle beyond it; the hub launches far
/// fewer instances than this per cycle anyway.
pub const MAX_BURST_WISHES_PER_CYCLE: usize = 1024;

/// Victims one preemption may evict: more than a full 16-node cluster of
/// fractional notebooks would be a sign of a bad request, not a plan.
pub const MAX_VICTIMS_PER_PREEMPTION: usize = 512;

/// Extra victim searches in one scope when a reclaim was refused because the
/// victim's team would fall below its guarantee: each retry puts one refused
/// victim first. Each retry is one more pass over the scope's candidates, and
/// only scopes that found no victim set retry, so 8 keeps a scope within 9
/// passes.
pub const MAX_RECLAIM_RETRIES: usize = 8;

#[derive(Debug, Clone)]
pub struct CycleOptions {
    /// Give every waiting workload a reason (the hub). The simulator turns it
    /// off: workloads that provably cannot be placed are then skipped, which
    /// makes a cycle cost proportional to what changes, not to the queue.
    pub explain: bool,
    pub max_preemption_searches: usize,
    /// Remaining burst budget per team this month; `None` uses the policy's
    /// monthly budget (nothing spent).
    pub burst_headroom: Option<BTreeMap<String, axle_policy::Usd>>,
}

impl Default for CycleOptions {
    fn default() -> Self {
        CycleOptions {
            explain: true,
            max_preemption_searches: MAX_PREEMPTION_SEARCHES_PER_CYCLE,
            burst_headroom: None,
        }
    }
}

/// One team's queue within a priority level.
type LevelQueue<'a> = (&'a QueueKey, &'a BTreeMap<(u64, WorkloadId), Queued>);

/// The estimated start of pending workload `id` at `now_ms`, and what it
/// rests on when some work in the way has no max runtime: the estimate its
/// pending reason would carry, for one workload (the simulator checks
/// estimates against what happened without explaining every cycle).
pub fn estimate_start(state: &State, id: WorkloadId, now_ms: u64) -> Option<(u64, Option<String>)> {
    let rec = state.pending.get(&id)?;
    let w = Work::new(state, true, now_ms);
    let choices = w.allowed_models(&rec.spec, rec.team, rec.class).ok()?;
    // The work a cycle serves before it: higher priority, or the same
    // priority and ahead in fair-share order (teams below their guarantee,
    // then the lowest share, then submit time), as the cycle orders them.
    let value = |c: u16| state.cat.classes[c as usize].value;
    let key = |p: &crate::state::PendingRec, id: WorkloadId| {
        let k = w.team_key(p.team, &p.spec, p.spec.submit_time_ms, id, 0);
        (Reverse(value(p.class)), k)
    };
    let mine = key(rec, id);
    let mut ahead: explain::Ahead = vec![BTreeMap::new(); state.cat.models.len()];
    for (&other, p) in &state.pending {
        if key(p, other) < mine {
            w.add_ahead(&mut ahead, &p.spec);
        }
    }
    let mut reason = w.explain_capacity(&rec.spec, rec.team, rec.class, &choices);
    w.queue_aware_estimate(&rec.spec, &ahead, &mut reason);
    match reason {
        PendingReason::NoFreeCapacity {
            estimated_start_ms: Some(at),
            estimate_basis,
            ..
        } => Some((at, estimate_basis)),
        _ => None,
    }
}

/// Runs one cycle over `state` at time `now_ms`.
pub fn cycle(state: &State, now_ms: u64, opts: &CycleOptions) -> Decisions {
    let mut w = Work::new(state, opts.explain, now_ms);
    let mut out = Decisions::default();
    let mut failed: BTreeMap<ShapeKey<'_>, PendingReason> = BTreeMap::new();
    let mut searches_left = opts.max_preemption_searches;
    // Requests of each shape (at each priority) left waiting so far, in the
    // order served: a waiting request's place in line.
    let mut in_line: BTreeMap<ShapeKey<'_>, u32> = BTreeMap::new();
    // Milli-GPUs per model of the work left waiting so far this cycle: what
    // a later workload's start estimate must wait behind.
    let mut ahead: explain::Ahead = vec![BTreeMap::new(); state.cat.models.len()];

    // Group queues into levels of equal (priority value, class).
    let mut levels: Vec<(u16, Vec<LevelQueue<'_>>)> = Vec::new();
    for (key, q) in &state.queues {
        let class = key.1;
        match levels.last_mut() {
            Some((c, v)) if *c == class => v.push((key, q)),
            _ => levels.push((class, vec![(key, q)])),
        }
    }

    for (class, queues) in levels {
        let class_info = &state.cat.classes[class as usize];
        let mut iters: Vec<_> = queues
            .iter()
            .map(|(k, q)| (k.2, q.iter().peekable()))
            .collect();
        // Per queue, once the cycle has seen one of its requests fail (and
        // none of it may burst): the last request served. From there the
        // queue is walked by shape, passing over the requests of shapes
        // known not to fit instead of visiting each (the simulator only).
        let mut cursor: Vec<Option<(u64, WorkloadId)>> = vec![None; iters.len()];
        // Each queue's head, best first (a heap: a cycle pushes and pops once
        // per request, and a tree's rebalancing cost twice as much).
        let mut order: BinaryHeap<Reverse<TeamKey>> = BinaryHeap::with_capacity(iters.len());
        for (i, (_, line)) in iters.iter_mut().enumerate() {
            if let Some(k) = next_key(&w, queues[i], line, None, class, &failed, i) {
                order.push(Reverse(k));
            }
        }
        while let Some(Reverse(k)) = order.pop() {
            let i = k.5;
            let team = iters[i].0;
            let at = (k.2, k.3);
            let entry = match cursor[i] {
                None => iters[i].1.next(),
                Some(_) => {
                    cursor[i] = Some(at);
                    queues[i].1.get_key_value(&at)
                }
            };
            let Some((&(_, id), Queued { spec, .. })) = entry else {
                continue;
            };

            let skip = !opts.explain && w.global_free == 0 && !w.may_preempt(team, class);
            if skip {
                // Nothing is free and this group cannot make room: nothing
                // else in this group can be placed this cycle — on-prem is
                // full, which is when a burst is wanted.
                // Only without explanations (the simulator's fast path).
                w.unexplained_burst_wish(state, opts, spec, team, class, now_ms, &mut out);
                // The rest of the team's queue may want a burst too (each
                // waited past the threshold on its own clock).
                if more_burst_wishes(state, class_info.burst_allowed, team, &out)
                    && let Some(k) =
                        next_key(&w, queues[i], &mut iters[i].1, cursor[i], class, &failed, i)
                {
                    order.push(Reverse(k));
                }
                continue;
            }

            let result = w.schedule_one(
                state,
                spec,
                team,
                class,
                &mut failed,
                &mut searches_left,
                &mut out,
            );
            if let Err(mut reason) = result {
                if opts.explain {
                    // Every team's requests of the shape, at this priority.
                    let n = in_line.entry(ShapeKey::of(spec, 0, class)).or_insert(0);
                    *n += 1;
                    if let PendingReason::NoFreeCapacity { queue_position, .. } = &mut reason {
                        *queue_position = Some(*n);
                    }
                    w.queue_aware_estimate(spec, &ahead, &mut reason);
                    w.add_ahead(&mut ahead, spec);
                }
                if reason != PendingReason::NotEvaluated {
                    let no_burst = maybe_burst(
                        state,
                        opts,
                        spec,
                        team,
                        class_info.burst_allowed,
                        &reason,
                        now_ms,
                        &mut out,
                    );
                    if let PendingReason::NoFreeCapacity { burst, .. } = &mut reason {
                        *burst = no_burst;
                    }
                } else {
                    w.unexplained_burst_wish(state, opts, spec, team, class, now_ms, &mut out);
                }
                if opts.explain || reason != PendingReason::NotEvaluated {
                    out.pending.push((id, reason));
                }
                if !opts.explain
                    && cursor[i].is_none()
                    && !more_burst_wishes(state, class_info.burst_allowed, team, &out)
                {
                    // What is known not to fit needs no visit: a skipped
                    // request would get no reason and make no burst wish.
                    cursor[i] = Some(at);
                }
            }
            if let Some(k) = next_key(&w, queues[i], &mut iters[i].1, cursor[i], class, &failed, i)
            {
                order.push(Reverse(k));
            }
        }
    }
    out
}

/// The place in line of the request a level's queue `q` (the `i`-th) serves
/// next: the next in line, or once the queue is walked by shape (`cursor`),
/// the first after it of a shape no failure of this cycle dominates.
fn next_key<'q>(
    w: &Work<'_>,
    q: LevelQueue<'q>,
    line: &mut std::iter::Peekable<
        std::collections::btree_map::Iter<'q, (u64, WorkloadId), Queued>,
    >,
    cursor: Option<(u64, WorkloadId)>,
    class: u16,
    failed: &BTreeMap<ShapeKey<'_>, PendingReason>,
    i: usize,
) -> Option<TeamKey> {
    let (&(submit, id), next) = match cursor {
        None => line.peek().copied()?,
        Some(after) => {
            let at = w.next_unfailed(q.0, q.0.2, class, after, failed)?;
            q.1.get_key_value(&at)?
        }
    };
    Some(w.queued_key(q.0.2, next.model, submit, id, i))
}

/// Is a preemption by priority worth what it costs? The work its victims
/// lose (milli-GPU·ms since their last checkpoint) must be at most what the
/// request would otherwise spend waiting (its GPUs × the wait its start
/// estimate gives, asked of `wait` only when victims lose work). Always,
/// when no estimate bounds its wait. (A reclaim of a guarantee is not
/// priced: it is owed.)
fn worth_it(
    plan: &preemption::VictimPlan,
    spec: &WorkloadSpec,
    wait: &dyn Fn() -> Option<u64>,
) -> bool {
    let lost: u128 = plan.victims.iter().map(|v| v.lost).sum();
    if lost == 0 {
        return true;
    }
    match wait() {
        Some(w) => lost <= u128::from(w) * u128::from(spec.total_gpus().0),
        None => true,
    }
}

/// Whether a cycle that skips what cannot run should still look further
/// down a team's queue, for burst wishes.
fn more_burst_wishes(state: &State, class_allows: bool, team: u32, out: &Decisions) -> bool {
    class_allows
        && !state.cat.teams[team as usize].burst_providers.is_empty()
        && out.burst_wanted.len() < MAX_BURST_WISHES_PER_CYCLE
}

impl<'s> Work<'s> {
    /// What a burst wish of a workload this cycle did not explain is judged
    /// on: a team limit or guarantee rule that holds it back (a burst
    /// instance would not lift it: it would idle, paid for), else
    /// `NotEvaluated` (capacity).
    fn unexplained_burst_reason(
        &self,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
    ) -> PendingReason {
        match self.allowed_models(spec, team, class) {
            Err(r) => r,
            Ok(_) => PendingReason::NotEvaluated,
        }
    }

    /// How long `spec` would wait without preempting: until running work
    /// with a known end frees enough GPUs of a model it may use (fluid,
    /// fragmentation aside). `None` when no known end frees enough.
    /// `None` too when a team limit holds it back (a deficit) or enough is
    /// free now but not where it fits: then no end of running work bounds
    /// the wait.
    fn wait_without_preempting(
        &self,
        spec: &WorkloadSpec,
        choices: &[quota::ModelChoice],
    ) -> Option<u64> {
        if choices.iter().any(|c| c.deficit > Milli::ZERO) {
            return None;
        }
        let models: Vec<u16> = choices.iter().map(|c| c.model).collect();
        let none_ahead: explain::Ahead = Vec::new();
        self.fluid_start(&models, spec.total_gpus().0, &none_ahead)
            .map(|(at, _)| at.saturating_sub(self.now_ms))
            .filter(|&w| w > 0)
    }

    /// The burst wish of a workload this cycle does not explain: judged on
    /// its team's rules alone (a limit or guarantee rule that holds it back
    /// means no wish), and only when it may burst at all — asked for, its
    /// class allows it, its team has a provider — since judging walks its
    /// team's running work. No pending reason carries why it does not
    /// burst, so that note is not kept.
    #[allow(clippy::too_many_arguments)]
    fn unexplained_burst_wish(
        &self,
        state: &State,
        opts: &CycleOptions,
        spec: &WorkloadSpec,
        team: u32,
        class: u16,
        now_ms: u64,
        out: &mut Decisions,
    ) {
        let class_allows = state.cat.classes[class as usize].burst_allowed;
        if !spec.burst_allowed
            || !class_allows
            || state.cat.teams[team as usize].burst_providers.is_empty()
        {
            return;
        }
        let judged = self.unexplained_burst_reason(spec, team, class);
        let _why_not = maybe_burst(state, opts, spec, team, class_allows, &judged, now_ms, out);
    }

    /// Schedules one workload: place directly, else preempt, else explain.
    // See `allowed_models` on the size of the reason.
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    pub(super) fn schedule_one(
        &mut self,
        state: &State,
        spec: &'s Arc<WorkloadSpec>,
        team: u32,
        class: u16,
        failed: &mut BTreeMap<ShapeKey<'s>, PendingReason>,
        searches_left: &mut usize,
        out: &mut Decisions,
    ) -> Result<(), PendingReason> {
        let key = ShapeKey::of(spec, team, class);
        if let Some(r) = failed.get(&key) {
            return Err(if self.explain {
                r.clone()
            } else {
                PendingReason::NotEvaluated
            });
        }
        if !self.explain {
            // A failed request of this group that asks for no more than this
            // one under the same constraints proves this one fails too.
            if dominated(failed, &key) {
                return Err(PendingReason::NotEvaluated);
            }
        }
        let choices = match self.allowed_models(spec, team, class) {
            Ok(m) => m,
            Err(r) => {
                failed.insert(key, r.clone());
                return Err(r);
            }
        };
        for c in choices.iter().filter(|c| c.deficit == Milli::ZERO) {
            if let Some(plan) = self.find(spec, c.model, None) {
                self.commit(spec, team, c.slot, class, plan, Vec::new(), out);
                return Ok(());
            }
        }
        // Once per shape a cycle: it scans every cluster. The team matters
        // only where a cluster belongs to one.
        let mut nf_key = (key, spec.has_image);
        if !self.owned_clusters {
            nf_key.0.team = 0;
        }
        let never = match self.never_fits_memo.get(&nf_key) {
            Some(r) => r.clone(),
            None => {
                let r = self.never_fits(spec, &choices);
                self.never_fits_memo.insert(nf_key, r.clone());
                r
            }
        };
        if let Some(r) = never {
            failed.insert(key, r.clone());
            return Err(r);
        }
        let class_info = &state.cat.classes[class as usize];
        let mut reason = None;
        // Reclaiming its team's guarantee, a request preempts whatever the
        // wait; by priority only when the wait it saves is worth it.
        let reclaims = choices.iter().any(|c| {
            self.usage[team as usize][c.slot as usize] + spec.total_gpus()
                <= state.cat.teams[team as usize].slots[c.slot as usize].1
        });
        // The wait is estimated only when a rule needs it (the estimate
        // builds what running work frees when, once per cycle).
        let wait_ms = std::cell::OnceCell::new();
        let wait = || *wait_ms.get_or_init(|| self.wait_without_preempting(spec, &choices));
        let tolerable = !reclaims
            && class_info.tolerable_wait_ms > 0
            && wait().is_some_and(|w| w <= class_info.tolerable_wait_ms);
        if !class_info.idle_only && !tolerable {
            if *searches_left == 0 {
                reason = Some(PendingReason::PreemptionDeferred);
            } else {
                *searches_left -= 1;
                let plan = self
                    .find_victims(spec, team, class, &choices)
                    .filter(|plan| reclaims || worth_it(plan, spec, &wait));
                if let Some(plan) = plan {
                    // Victims hold their GPUs until they stop (grace period);
                    // only this workload waits for them, so after it is
                    // placed whatever it left of their GPUs is not free for
                    // anyone else this cycle.
                    let held: Vec<(u32, GpuFree)> = plan
                        .victims
                        .iter()
                        .flat_map(|v| state.running[&v.id].gpus.iter())
                        .map(|&(g, _)| (g, self.gpu_free[g as usize]))
                        .collect();
                    let mut ids = Vec::with_capacity(plan.victims.len());
                    for v in plan.victims {
                        self.evict(v.id);
                        let grace =
                            state.cat.classes[state.running[&v.id].class as usize].grace_period_s;
                        out.preemptions.push(Preemption {
                            workload: v.id,
                            for_workload: spec.id,
                            reason: v.why,
                            grace_period_s: grace,
                            lost_gpu_ms: u64::try_from(v.lost / 1000).unwrap_or(u64::MAX),
                        });
                        ids.push(v.id);
                    }
                    let placed = match self.find(spec, plan.choice.model, Some(plan.cluster)) {
                        Some(plan_) => {
                            self.commit(spec, team, plan.choice.slot, class, plan_, ids, out);
                            true
                        }
                        // Unreachable when find_victims and find agree; the victims
                        // stay preempted and the workload takes the room next cycle.
                        None => false,
                    };
                    for (g, before) in held {
                        if self.gpu_free[g as usize] > before {
                            self.adjust(g, before);
                        }
                    }
                    if placed {
                        return Ok(());
                    }
                }
            }
        }
        let reason = reason.unwrap_or_else(|| {
            if self.explain {
                self.explain_capacity(spec, team, class, &choices)
            } else {
                PendingReason::NotEvaluated
            }
        });
        failed.insert(key, reason.clone());
        Err(reason)
    }
}

#[cfg(test)]
mod tests {
    use axle_policy::CrossTeamPreemption::BorrowedOnly;

    use super::*;
    use crate::testkit::{inventory, policy, req, run};

    /// `minRuntimeSeconds`: a development workload that started at 0 with
    /// a minimum runtime of 600 s is not preempted by training at 100 s,
    /// and is at 700 s; a reclaim of a guarantee does not wait for it.
    #[test]
    fn a_minimum_runtime_holds_off_preemption_by_priority_but_not_reclaim() {
        let mut p = (*policy(
            &[("a", &[("H100", 0.0, 1.0)]), ("b", &[("H100", 1.0, 1.0)])],
            BorrowedOnly,
        ))
        .clone();
        p.priority_classes
            .get_mut("development")
            .unwrap()
            .min_runtime_s = 600;
        let p = Arc::new(p);
        let mut s = State::new(p.clone(), &inventory(&[("H100", 1)]));
        crate::testkit::run(&mut s, req(1, "a", "development", 1.0), 0, &[0], 0);
        s.submit(req(2, "a", "training", 1.0)).unwrap();
        let opts = CycleOptions::default();
        assert!(cycle(&s, 100_000, &opts).preemptions.is_empty());
        let d = cycle(&s, 700_000, &opts);
        assert_eq!(d.preemptions.len(), 1, "{d:?}");
        // Team b reclaims its guaranteed GPU from borrower a at once.
        let mut s = State::new(p, &inventory(&[("H100", 1)]));
        crate::testkit::run(&mut s, req(1, "a", "development", 1.0), 0, &[0], 0);
        s.submit(req(3, "b", "development", 1.0)).unwrap();
        assert_eq!(cycle(&s, 100_000, &opts).preemptions.len(), 1);
    }

    /// `tolerableWaitSeconds`: a training request that its estimate says
    /// will fit in 500 s (the development work in the way has a 600 s max
    /// runtime and ran 100 s) does not preempt it when training tolerates
    /// an hour; with no tolerance it does. Victims that would lose more
    /// GPU-hours than the wait costs are not taken either.
    #[test]
    fn a_request_that_fits_soon_enough_does_not_preempt() {
        let with = |tolerable_s: u64, request_gpus: f64, now_s: u64| {
            let mut p = (*policy(&[("a", &[("H100", 0.0, 4.0)])], BorrowedOnly)).clone();
            p.priority_classes
                .get_mut("training")
                .unwrap()
                .tolerable_wait_s = tolerable_s;
            let mut s = State::new(Arc::new(p), &inventory(&[("H100", 1)]));
            let mut dev = req(1, "a", "development", 1.0);
            dev.max_runtime_s = Some(600);
            crate::testkit::run(&mut s, dev, 0, &[0], 0);
            s.submit(req(2, "a", "training", request_gpus)).unwrap();
            cycle(&s, now_s * 1000, &CycleOptions::default())
                .preemptions
                .len()
        };
        assert_eq!(with(3600, 1.0, 100), 0);
        // It lost 100 GPU-s; waiting 500 s would cost the request 500.
        assert_eq!(with(0, 1.0, 100), 1);
        // At 400 s it would lose 400 GPU-s; a quarter GPU waiting 200 s
        // costs 50: not worth it.
        assert_eq!(with(0, 0.25, 400), 0);
    }

    /// Without explanations a queue is walked by shape once a request of
    /// it failed: requests of a shape known not to fit are passed over,
    /// and the cycle places exactly what the explained one (which visits
    /// every request) places.
    #[test]
    fn passing_over_known_failures_places_what_visiting_each_places() {
        let p = policy(&[("a", &[("H100", 4.0, 8.0)])], BorrowedOnly);
        let mut s = State::new(p, &inventory(&[("H100", 4)]));
        run(&mut s, req(100, "a", "production", 2.0), 0, &[0, 1], 0);
        for (id, gpus) in [(1, 3.0), (2, 4.0), (3, 3.0), (4, 1.0), (5, 1.0), (6, 1.0)] {
            s.submit(req(id, "a", "training", gpus)).unwrap();
        }
        let placed = |explain| {
            let opts = CycleOptions {
                explain,
                ..CycleOptions::default()
            };
            let mut ids: Vec<u64> = cycle(&s, 0, &opts)
                .placements
                .iter()
                .map(|p| p.workload)
                .collect();
            ids.sort_unstable();
            ids
        };
        assert_eq!(placed(true), [4, 5]);
        assert_eq!(placed(false), [4, 5]);
    }

    #[test]
    fn higher_priority_is_served_first_and_every_wait_has_a_reason() {
        let p = policy(&[("a", &[("H100", 1.0, 4.0)])], BorrowedOnly);
        let mut s = State::new(p, &inventory(&[("H100", 1)]));
        s.submit(req(1, "a", "development", 1.0)).unwrap();
        s.submit(req(2, "a", "training", 1.0)).unwrap();
        let d = cycle(&s, 0, &CycleOptions::default());
        assert_eq!(d.placements.len(), 1);
        assert_eq!(d.placements[0].workload, 2, "training before development");
        assert_eq!(d.pending.len(), 1);
        assert_eq!(d.pending[0].0, 1);
        assert!(matches!(
            d.pending[0].1,
            PendingReason::NoFreeCapacity {
                queue_position: Some(1),
                ..
            }
        ));
        // Without explanations the simulator's fast path gives none.
        let quiet = CycleOptions {
            explain: false,
            ..CycleOptions::default()
        };
        assert!(cycle(&s, 0, &quiet).pending.is_empty());
    }
}
