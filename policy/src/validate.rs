//! Semantic validation: checks every parsed document against the others
//! (names, references, quantities, GPU classes, capacity) and builds the
//! [`Policy`] model. All checks run; every problem is reported.

use crate::money::Usd;
use std::collections::{BTreeMap, BTreeSet};

use crate::document::{Doc, Docs};
use crate::file::{Loc, RoleSpec};
use crate::model::{
    ANY_GPU_CLASS, BurstProvider, CHECKPOINT_SIGNALS, Cluster, CrossTeamPreemption,
    DEFAULT_CHECKPOINT_INTERVAL_S, GangPlacement, MAX_NODES_PER_CLUSTER, MILLI_PER_GPU,
    MIN_LOG_BYTES_PER_WORKLOAD, MIN_RETENTION_MS, Member, Milli, NodeGroup, Policy, PriorityClass,
    Quota, Role, Settings, Team, default_priority_classes,
};
use crate::report::{Pos, Reporter};

mod burst;
use burst::{burst_providers, team_burst};

/// A grace period longer than a day means a preempted workload effectively
/// never yields, which defeats guarantees (design invariant 2).
const MAX_GRACE_PERIOD_S: u64 = 86_400;
/// `minRuntimeSeconds` and `tolerableWaitSeconds` at most a week: a class
/// that may not be preempted for longer is a class that is never
/// preempted (say so with an empty `preemptibleBy`).
const MAX_CHURN_SECONDS: u64 = 7 * 86_400;
/// A topology domain name is a label value: Kubernetes caps those at 63.
const MAX_TOPOLOGY_NAME_BYTES: usize = 63;
/// Largest node groups seen in practice are a few thousand nodes; the bound
/// keeps `count × gpusPerNode` sums far from overflow.
const MAX_NODES_PER_GROUP: u64 = 1_000_000;
/// The densest GPU servers hold 16 GPUs (or 64 MIG slices); 1024 leaves room
/// while catching typos like a memory size in the GPU-count field.
const MAX_GPUS_PER_NODE: u64 = 1024;

/// Largest `fractionMemoryGb`: today's largest GPU has 288 GB; 4 TB is far
/// past any and still catches a value typed in MB.
const MAX_GPU_MEMORY_GB: u64 = 4096;

pub(crate) fn validate(docs: Docs, rep: &mut Reporter<'_>, revision: String) -> Policy {
    let (settings, default_class) = settings(&docs, rep);
    let gpu_classes: BTreeSet<String> = settings.gpu_classes.iter().cloned().collect();
    let priority_classes = priority_classes(&docs, rep);
    check_default_class(&docs, rep, &settings, default_class, &priority_classes);
    let burst_providers = burst_providers(&docs, rep, &gpu_classes);
    let clusters = clusters(&docs, rep, &gpu_classes);
    let (teams, quota_at) = teams(&docs, rep, &settings, &gpu_classes, &burst_providers);
    check_overcommit(rep, &teams, &clusters, &quota_at);
    Policy {
        revision,
        teams,
        priority_classes,
        clusters,
        burst_providers,
        settings,
    }
}

/// GPUs from a file number: finite, non-negative, at most milli precision.
fn gpus<S>(
    rep: &mut Reporter<'_>,
    doc: &Doc<S>,
    loc: &Loc<f64>,
    path: &str,
    granularity: Milli,
) -> Option<Milli> {
    let v = loc.value;
    let bad = |msg: String, hint: &str, rep: &mut Reporter<'_>| {
        rep.error(doc.at(loc), doc.path(path), msg, hint);
        None
    };
    if !v.is_finite() {
        return bad(
            format!("{path} must be a finite number, not {v}"),
            "write a number of GPUs such as 8 or 0.5",
            rep,
        );
    }
    if v < 0.0 {
        return bad(
            format!("{path} must not be negative ({v})"),
            "use 0 or a positive number of GPUs",
            rep,
        );
    }
    let Some(m) = Milli::from_gpus_f64(v) else {
        return bad(
            format!("{path} ({v}) is not a whole number of milli-GPUs or is too large"),
            "use at most three decimals",
            rep,
        );
    };
    if granularity.0 > 0 && !m.0.is_multiple_of(granularity.0) {
        return bad(
            format!("{path} ({v}) is not a multiple of fractionGranularity ({granularity})"),
            &format!(
                "round to a multiple of {granularity} GPU or change Settings.fractionGranularity"
            ),
            rep,
        );
    }
    Some(m)
}

/// A finite, non-negative amount of money.
/// An amount of dollars, exact (see [`crate::money`]); an error names the field.
fn usd<S>(rep: &mut Reporter<'_>, doc: &Doc<S>, loc: &Loc<f64>, path: &str) -> Usd {
    match Usd::from_number(loc.value) {
        Ok(v) => v,
        Err(e) => {
            rep.error(
                doc.at(loc),
                doc.path(path),
                format!("{path} must be an amount of dollars: {e}"),
                "write a plain number of US dollars such as 5000 or 2.75",
            );
            Usd::ZERO
        }
    }
}

fn check_gpu_class<S>(
    rep: &mut Reporter<'_>,
    doc: &Doc<S>,
    loc: &Loc<String>,
    path: &str,
    known: &BTreeSet<String>,
    allow_any: bool,
) -> bool {
    let name = &loc.value;
    if known.contains(name) || (allow_any && name == ANY_GPU_CLASS) {
        return true;
    }
    let near = known.iter().find(|k| k.eq_ignore_ascii_case(name));
    let hint = match near {
        Some(k) => format!("did you mean `{k}`? GPU classes are case-sensitive"),
        None if allow_any => format!(
            "use `{ANY_GPU_CLASS}`, a built-in model (H100, A100, …) or add it to Settings.gpuClasses"
        ),
        None => "use a built-in model (H100, A100, …) or add it to Settings.gpuClasses".to_string(),
    };
    rep.error(
        doc.at(loc),
        doc.path(path),
        format!("unknown GPU class `{name}`"),
        &hint,
    );
    false
}

fn settings(docs: &Docs, rep: &mut Reporter<'_>) -> (Settings, Option<(Pos, String)>) {
    let mut settings = Settings::default();
    let Some((first, rest)) = docs.settings.split_first() else {
        return (settings, None);
    };
    for extra in rest {
        let hint = format!(
            "merge it into the Settings document at {}",
            rep.describe(first.name_pos)
        );
        rep.error(
            extra.name_pos,
            extra.id(),
            "more than one Settings document".to_string(),
            &hint,
        );
    }
    let s = &first.spec;
    if let Some(g) = &s.fraction_granularity {
        match Milli::from_gpus_f64(g.value) {
            Some(m) if m.0 > 0 && m.0 <= MILLI_PER_GPU && MILLI_PER_GPU.is_multiple_of(m.0) => {
                settings.fraction_granularity = m;
            }
            _ => rep.error(
                first.at(g),
                first.path("fractionGranularity"),
                format!(
                    "fractionGranularity ({}) must divide one GPU exactly",
                    g.value
                ),
                "use 1, 0.5, 0.25, 0.2, 0.125 or 0.1 (a divisor of 1000 milli-GPUs)",
            ),
        }
    }
    if let Some(v) = &s.burst_wait_threshold_seconds {
        settings.burst_wait_threshold_s = v.value;
    }
    if let Some(v) = &s.burst_budget_usd_per_month {
        settings.burst_budget_per_month = Some(usd(rep, first, v, "burstBudgetUsdPerMonth"));
    }
    if let Some(v) = &s.default_burst_runtime_seconds {
        if v.value == 0 {
            rep.error(
                first.at(v),
                first.path("defaultBurstRuntimeSeconds"),
                "defaultBurstRuntimeSeconds must be above 0".to_string(),
                "an hour (3600) is a common choice",
            );
        } else {
            settings.default_burst_runtime_s = v.value;
        }
    }
    if let Some(v) = &s.spoke_lost_after_seconds {
        if v.value == 0 {
            rep.error(
                first.at(v),
                first.path("spokeLostAfterSeconds"),
                "spokeLostAfterSeconds must be at least 1".to_string(),
                "a few heartbeat intervals, such as 30",
            );
        } else {
            settings.spoke_lost_after_s = v.value;
        }
    }
    let window = |v: &Loc<f64>, unit_ms: f64| -> Option<u64> {
        let ms = v.value * unit_ms;
        (v.value.is_finite() && ms >= MIN_RETENTION_MS as f64 && ms < u64::MAX as f64)
            .then_some(ms as u64)
    };
    if let Some(v) = &s.retain_finished_hours {
        match window(v, 3_600_000.0) {
            Some(ms) => settings.retain_finished_ms = ms,
            None => rep.error(
                first.at(v),
                first.path("retainFinishedHours"),
                format!(
                    "retainFinishedHours ({}) must be a window of at least a minute",
                    v.value
                ),
                "keep finished work long enough to read why it failed, such as 168 (a week)",
            ),
        }
    }
    if let Some(v) = &s.retain_events_days {
        match window(v, 86_400_000.0) {
            Some(ms) => settings.retain_events_ms = ms,
            None => rep.error(
                first.at(v),
                first.path("retainEventsDays"),
                format!(
                    "retainEventsDays ({}) must be a window of at least a minute",
                    v.value
                ),
                "an audit window such as 90",
            ),
        }
    }
    if let Some(v) = &s.max_log_bytes_per_workload {
        if v.value < MIN_LOG_BYTES_PER_WORKLOAD {
            rep.error(
                first.at(v),
                first.path("maxLogBytesPerWorkload"),
                format!(
                    "maxLogBytesPerWorkload ({}) is below the smallest useful log of {MIN_LOG_BYTES_PER_WORKLOAD} bytes",
                    v.value
                ),
                "67108864 (64 MiB) keeps every traceback",
            );
        } else {
            settings.max_log_bytes_per_workload = v.value;
        }
    }
    if let Some(c) = &s.cross_team_preemption {
        match CrossTeamPreemption::ALL
            .into_iter()
            .find(|v| v.as_str() == c.value)
        {
            Some(v) => settings.cross_team_preemption = v,
            None => rep.error(
                first.at(c),
                first.path("crossTeamPreemption"),
                format!("unknown crossTeamPreemption `{}`", c.value),
                "use `borrowedOnly` (guarantees are hard) or `any` (priority may take any team's GPUs)",
            ),
        }
    }
    let mut default_class = None;
    if let Some(c) = &s.default_priority_class {
        settings.default_priority_class = c.value.clone();
        default_class = Some((first.at(c), first.path("defaultPriorityClass")));
    }
    for (i, u) in s.platform_admins.iter().enumerate() {
        let name = u.value.trim();
        if name.is_empty() || name != u.value || crate::text::hidden_char(name).is_some() {
            rep.error(
                first.at(u),
                first.path(&format!("platformAdmins[{i}]")),
                format!("invalid user name `{}`", u.value),
                "a user name as your tokens or SSO name them, e.g. `alice`",
            );
        } else if !settings.platform_admins.iter().any(|k| k == name) {
            settings.platform_admins.push(name.to_string());
        }
    }
    let bounded = |rep: &mut Reporter<'_>, v: &Loc<u64>, field: &str, most: u64, hint: &str| {
        if v.value == 0 || v.value > most {
            rep.error(
                first.at(v),
                first.path(field),
                format!("{field} ({}) must be 1 to {most}", v.value),
                hint,
            );
            None
        } else {
            Some(v.value)
        }
    };
    if let Some(v) = &s.max_nodes_per_cluster
        && let Some(n) = bounded(
            rep,
            v,
            "maxNodesPerCluster",
            MAX_NODES_PER_CLUSTER,
            "the most nodes one spoke serves, such as 10000",
        )
    {
        settings.undeclared.max_nodes = n;
    }
    if let Some(v) = &s.max_gpus_per_node
        && let Some(n) = bounded(
            rep,
            v,
            "maxGpusPerNode",
            crate::model::MAX_GPUS_PER_NODE,
            "the GPUs of your largest server, such as 8 or 16",
        )
    {
        settings.undeclared.max_gpus_per_node = n;
    }
    if let Some(v) = &s.max_gpu_memory_gb
        && let Some(n) = bounded(
            rep,
            v,
            "maxGpuMemoryGb",
            MAX_GPU_MEMORY_GB,
            "the memory of your largest GPU, such as 80 or 192",
        )
    {
        settings.undeclared.max_gpu_memory_gb = n;
    }
    for (model, gb) in &s.fraction_memory_gb {
        if gb.value == 0 || gb.value > MAX_GPU_MEMORY_GB {
            rep.error(
                first.at(gb),
                first.path(&format!("fractionMemoryGb.{model}")),
                format!(
                    "fractionMemoryGb.{model} ({}) must be 1 to {MAX_GPU_MEMORY_GB} GB",
                    gb.value
                ),
                "the memory of one whole GPU, such as 80 for an H100",
            );
        } else {
            settings.fraction_memory_gb.insert(model.clone(), gb.value);
        }
    }
    for (i, c) in s.gpu_classes.iter().enumerate() {
        let path = format!("gpuClasses[{i}]");
        let name = c.value.trim();
        if name.is_empty() || name != c.value || name == ANY_GPU_CLASS {
            rep.error(
                first.at(c),
                first.path(&path),
                format!("invalid GPU class name `{}`", c.value),
                "a GPU model name such as `MI325X`; `any` is reserved",
            );
        } else if !settings.gpu_classes.iter().any(|k| k == name) {
            settings.gpu_classes.push(name.to_string());
        }
    }
    for model in s.fraction_memory_gb.keys() {
        if !settings.gpu_classes.iter().any(|k| k == model) {
            let gb = &s.fraction_memory_gb[model];
            rep.error(
                first.at(gb),
                first.path(&format!("fractionMemoryGb.{model}")),
                format!("unknown GPU model `{model}` in fractionMemoryGb"),
                &format!("one of {}", settings.gpu_classes.join(", ")),
            );
            settings.fraction_memory_gb.remove(model);
        }
    }
    (settings, default_class)
}

fn priority_classes(docs: &Docs, rep: &mut Reporter<'_>) -> BTreeMap<String, PriorityClass> {
    if docs.priority_classes.is_empty() {
        return default_priority_classes();
    }
    let unique = &docs.priority_classes;
    let values: BTreeMap<&str, i32> = unique
        .iter()
        .map(|d| (d.name.as_str(), d.spec.value.value))
        .collect();
    let mut out = BTreeMap::new();
    for doc in unique {
        let s = &doc.spec;
        let mut seen = BTreeSet::new();
        for (i, by) in s.preemptible_by.iter().enumerate() {
            let path = format!("preemptibleBy[{i}]");
            match values.get(by.value.as_str()) {
                None => {
                    let known: Vec<&str> = values.keys().copied().collect();
                    rep.error(
                        doc.at(by),
                        doc.path(&path),
                        format!("unknown priority class `{}`", by.value),
                        &format!("defined classes: {}", known.join(", ")),
                    );
                }
                Some(v) if *v <= s.value.value => rep.warning(
                    doc.at(by),
                    doc.path(&path),
                    format!(
                        "`{}` may be preempted by `{}` whose value ({v}) is not higher than its own ({})",
                        doc.name, by.value, s.value.value
                    ),
                    "preemption by an equal or lower class can make workloads evict each other in turn",
                ),
                Some(_) => {}
            }
            if !seen.insert(by.value.as_str()) {
                rep.error(
                    doc.at(by),
                    doc.path(&path),
                    format!("`{}` is listed twice", by.value),
                    "list each class once",
                );
            }
        }
        let mut grace_period_s = 30;
        if let Some(g) = &s.grace_period_seconds {
            if g.value > MAX_GRACE_PERIOD_S {
                rep.error(
                    doc.at(g),
                    doc.path("gracePeriodSeconds"),
                    format!(
                        "gracePeriodSeconds ({}) exceeds {MAX_GRACE_PERIOD_S}",
                        g.value
                    ),
                    "a preempted workload must yield within a day; checkpoint more often",
                );
            } else {
                grace_period_s = g.value;
            }
        }
        let checkpointable = s.checkpointable.unwrap_or(false);
        let mut checkpoint_interval_s = DEFAULT_CHECKPOINT_INTERVAL_S;
        if let Some(i) = &s.checkpoint_interval_seconds {
            if i.value < 1 {
                rep.error(
                    doc.at(i),
                    doc.path("checkpointIntervalSeconds"),
                    format!(
                        "checkpointIntervalSeconds must be at least 1 second (got {})",
                        i.value
                    ),
                    "how often the workload saves its progress, such as 1800",
                );
            } else {
                checkpoint_interval_s = i.value as u64;
                if !checkpointable {
                    rep.warning(
                        doc.at(i),
                        doc.path("checkpointIntervalSeconds"),
                        "checkpointIntervalSeconds has no effect without `checkpointable: true`"
                            .to_string(),
                        "set checkpointable: true, or remove the interval",
                    );
                }
            }
        }
        let mut checkpoint_signal = "SIGTERM".to_string();
        if let Some(sig) = &s.checkpoint_signal {
            if CHECKPOINT_SIGNALS.contains(&sig.value.as_str()) {
                checkpoint_signal = sig.value.clone();
            } else {
                rep.error(
                    doc.at(sig),
                    doc.path("checkpointSignal"),
                    format!("unknown or uncatchable checkpointSignal `{}`", sig.value),
                    &format!("use one of {}", CHECKPOINT_SIGNALS.join(", ")),
                );
            }
        }
        let mut placement = GangPlacement::default();
        if let Some(pl) = &s.placement {
            match GangPlacement::ALL
                .iter()
                .find(|p| p.as_str() == pl.value.as_str())
            {
                Some(p) => placement = *p,
                None => rep.error(
                    doc.at(pl),
                    doc.path("placement"),
                    format!("unknown placement `{}`", pl.value),
                    &format!(
                        "use one of {}",
                        GangPlacement::ALL.map(GangPlacement::as_str).join(", ")
                    ),
                ),
            }
        }
        let mut churn = |field: &Option<Loc<u64>>, name: &str| -> u64 {
            match field {
                Some(v) if v.value > MAX_CHURN_SECONDS => {
                    rep.error(
                        doc.at(v),
                        doc.path(name),
                        format!("{name} ({}) exceeds {MAX_CHURN_SECONDS}", v.value),
                        "at most a week; a class never to be preempted has an empty preemptibleBy",
                    );
                    0
                }
                Some(v) => v.value,
                None => 0,
            }
        };
        let min_runtime_s = churn(&s.min_runtime_seconds, "minRuntimeSeconds");
        let tolerable_wait_s = churn(&s.tolerable_wait_seconds, "tolerableWaitSeconds");
        out.insert(
            doc.name.clone(),
            PriorityClass {
                name: doc.name.clone(),
                value: s.value.value,
                preemptible_by: s.preemptible_by.iter().map(|b| b.value.clone()).collect(),
                grace_period_s,
                idle_only: s.idle_only.unwrap_or(false),
                burst_allowed: s.burst_allowed.unwrap_or(true),
                checkpointable,
                checkpoint_interval_s,
                checkpoint_signal,
                placement,
                min_runtime_s,
                tolerable_wait_s,
            },
        );
    }
    out
}

fn check_default_class(
    docs: &Docs,
    rep: &mut Reporter<'_>,
    settings: &Settings,
    at: Option<(Pos, String)>,
    classes: &BTreeMap<String, PriorityClass>,
) {
    let name = &settings.default_priority_class;
    if classes.contains_key(name) {
        return;
    }
    let known: Vec<&str> = classes.keys().map(String::as_str).collect();
    let (pos, path, hint) = match (at, docs.priority_classes.first()) {
        (Some((pos, path)), _) => (
            pos,
            path,
            format!("use one of the defined classes: {}", known.join(", ")),
        ),
        (None, Some(first)) => (
            first.name_pos,
            "Settings.defaultPriorityClass".to_string(),
            format!(
                "define a `{name}` PriorityClass or set Settings.defaultPriorityClass to one of: {}",
                known.join(", ")
            ),
        ),
        // No class documents means the built-ins, which include the default.
        (None, None) => return,
    };
    rep.error(
        pos,
        path,
        format!("default priority class `{name}` is not defined"),
        &hint,
    );
}

fn clusters(
    docs: &Docs,
    rep: &mut Reporter<'_>,
    gpu_classes: &BTreeSet<String>,
) -> BTreeMap<String, Cluster> {
    let mut out = BTreeMap::new();
    for doc in &docs.clusters {
        let s = &doc.spec;
        if s.region.value.trim().is_empty() {
            rep.error(
                doc.at(&s.region),
                doc.path("region"),
                "empty region".to_string(),
                "write the cluster's region, such as eu-west",
            );
        }
        let price = s
            .price_usd_per_gpu_hour
            .as_ref()
            .map_or(Usd::ZERO, |p| usd(rep, doc, p, "priceUsdPerGpuHour"));
        let mut nodes = Vec::new();
        for (i, g) in s.nodes.iter().enumerate() {
            let at = |f: &str| format!("nodes[{i}].{f}");
            if g.count.value == 0 || g.count.value > MAX_NODES_PER_GROUP {
                rep.error(
                    doc.at(&g.count),
                    doc.path(&at("count")),
                    format!(
                        "count must be between 1 and {MAX_NODES_PER_GROUP}, not {}",
                        g.count.value
                    ),
                    "remove the node group or give its number of nodes",
                );
            }
            if g.gpus_per_node.value == 0 || g.gpus_per_node.value > MAX_GPUS_PER_NODE {
                rep.error(
                    doc.at(&g.gpus_per_node),
                    doc.path(&at("gpusPerNode")),
                    format!(
                        "gpusPerNode must be between 1 and {MAX_GPUS_PER_NODE}, not {}",
                        g.gpus_per_node.value
                    ),
                    "nodes without GPUs are not scheduled on; typical values are 4 or 8",
                );
            }
            check_gpu_class(rep, doc, &g.gpu_model, &at("gpuModel"), gpu_classes, false);
            let topology = g.topology.as_ref().and_then(|t| {
                let ok = !t.value.is_empty()
                    && t.value.len() <= MAX_TOPOLOGY_NAME_BYTES
                    && t.value.chars().all(|c| c.is_ascii_graphic());
                if !ok {
                    rep.error(
                        doc.at(t),
                        doc.path(&at("topology")),
                        format!("topology `{}` is not a domain name", t.value.escape_debug()),
                        &format!(
                            "1 to {MAX_TOPOLOGY_NAME_BYTES} printable ASCII characters without spaces, such as rack-a"
                        ),
                    );
                }
                ok.then(|| t.value.clone())
            });
            nodes.push(NodeGroup {
                count: g.count.value.min(MAX_NODES_PER_GROUP),
                gpu_model: g.gpu_model.value.clone(),
                gpus_per_node: g.gpus_per_node.value.min(MAX_GPUS_PER_NODE),
                gpu_memory_gb: g.gpu_memory_gb.unwrap_or(0),
                topology,
            });
        }
        let mut default_image = None;
        if let Some(img) = &s.default_image {
            let v = img.value.trim();
            if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
                rep.error(
                    doc.at(img),
                    doc.path("defaultImage"),
                    format!("defaultImage `{}` is not an image reference", img.value),
                    "write an image such as `nvcr.io/nvidia/pytorch:24.05-py3`",
                );
            } else {
                default_image = Some(v.to_string());
            }
        }
        out.insert(
            doc.name.clone(),
            Cluster {
                name: doc.name.clone(),
                region: s.region.value.clone(),
                business_unit: s.business_unit.clone().unwrap_or_default(),
                labels: s.labels.clone(),
                price_per_gpu_hour: price,
                nodes,
                default_image,
            },
        );
    }
    out
}

/// Where each (team, GPU class) quota was written, for capacity warnings.
type QuotaAt = BTreeMap<(String, String), (Pos, String)>;

fn teams(
    docs: &Docs,
    rep: &mut Reporter<'_>,
    settings: &Settings,
    gpu_classes: &BTreeSet<String>,
    providers: &BTreeMap<String, BurstProvider>,
) -> (BTreeMap<String, Team>, QuotaAt) {
    let mut out = BTreeMap::new();
    let mut quota_at = QuotaAt::new();
    let granularity = settings.fraction_granularity;
    for doc in &docs.teams {
        let s = &doc.spec;
        let mut quotas = BTreeMap::new();
        for (key, q) in &s.quotas.0 {
            let class = &key.value;
            let base = format!("quotas.{class}");
            check_gpu_class(rep, doc, key, &base, gpu_classes, true);
            let g_path = format!("{base}.guaranteed");
            let l_path = format!("{base}.limit");
            let guaranteed = match &q.guaranteed {
                Some(g) => gpus(rep, doc, g, &g_path, granularity),
                None => Some(Milli::ZERO),
            };
            let limit = match &q.limit {
                Some(l) => gpus(rep, doc, l, &l_path, granularity),
                None => guaranteed,
            };
            let (Some(guaranteed), Some(limit)) = (guaranteed, limit) else {
                continue;
            };
            if guaranteed > limit {
                let pos = q.guaranteed.as_ref().map_or(doc.at(key), |g| doc.at(g));
                rep.error(
                    pos,
                    doc.path(&g_path),
                    format!("guaranteed ({guaranteed}) exceeds limit ({limit})"),
                    "raise limit or lower guaranteed",
                );
            }
            quota_at.insert(
                (doc.name.clone(), class.clone()),
                (
                    q.guaranteed.as_ref().map_or(doc.at(key), |g| doc.at(g)),
                    doc.path(&g_path),
                ),
            );
            quotas.insert(class.clone(), Quota { guaranteed, limit });
        }

        let mut weight = 1.0;
        if let Some(w) = &s.weight {
            if w.value.is_finite() && w.value > 0.0 {
                weight = w.value;
            } else {
                rep.error(
                    doc.at(w),
                    doc.path("weight"),
                    format!("weight must be a finite number above 0, not {}", w.value),
                    "use 1 for an ordinary share, 2 for twice the share",
                );
            }
        }

        let mut members = Vec::new();
        let mut users: BTreeMap<&str, Pos> = BTreeMap::new();
        for (i, m) in s.members.iter().enumerate() {
            let path = format!("members[{i}].user");
            if m.user.value.trim().is_empty() {
                rep.error(
                    doc.at(&m.user),
                    doc.path(&path),
                    "empty user name".to_string(),
                    "write the user's login",
                );
            } else if let Some(c) = crate::text::hidden_char(&m.user.value) {
                rep.error(
                    doc.at(&m.user),
                    doc.path(&path),
                    format!(
                        "user `{}` holds {}, a character that is not shown as itself",
                        crate::text::printable(&m.user.value),
                        c.escape_unicode()
                    ),
                    "write the user's login as your tokens or SSO name it",
                );
            } else if let Some(first) = users.get(m.user.value.as_str()) {
                let hint = format!(
                    "first listed at {}; give each user one role",
                    rep.describe(*first)
                );
                rep.error(
                    doc.at(&m.user),
                    doc.path(&path),
                    format!("user `{}` is listed twice", m.user.value),
                    &hint,
                );
            } else {
                users.insert(&m.user.value, doc.at(&m.user));
            }
            members.push(Member {
                user: m.user.value.clone(),
                role: match m.role.unwrap_or(RoleSpec::Member) {
                    RoleSpec::Admin => Role::Admin,
                    RoleSpec::Member => Role::Member,
                    RoleSpec::Viewer => Role::Viewer,
                },
            });
        }
        let mut groups = Vec::new();
        let mut seen: BTreeMap<&str, Pos> = BTreeMap::new();
        for (i, g) in s.groups.iter().enumerate() {
            let path = format!("groups[{i}].group");
            if g.group.value.trim().is_empty() {
                rep.error(
                    doc.at(&g.group),
                    doc.path(&path),
                    "empty group name".to_string(),
                    "write the group as the identity provider's groups claim names it",
                );
            } else if let Some(first) = seen.get(g.group.value.as_str()) {
                let hint = format!(
                    "first listed at {}; give each group one role",
                    rep.describe(*first)
                );
                rep.error(
                    doc.at(&g.group),
                    doc.path(&path),
                    format!("group `{}` is listed twice", g.group.value),
                    &hint,
                );
            } else {
                seen.insert(&g.group.value, doc.at(&g.group));
            }
            groups.push(crate::model::GroupMember {
                group: g.group.value.clone(),
                role: match g.role.unwrap_or(RoleSpec::Member) {
                    RoleSpec::Admin => Role::Admin,
                    RoleSpec::Member => Role::Member,
                    RoleSpec::Viewer => Role::Viewer,
                },
            });
        }

        let burst = s
            .burst
            .as_ref()
            .map(|b| team_burst(rep, doc, b, providers))
            .unwrap_or_default();

        out.insert(
            doc.name.clone(),
            Team {
                name: doc.name.clone(),
                quotas,
                weight,
                members,
                groups,
                burst,
            },
        );
    }
    (out, quota_at)
}

/// Warns where teams' guarantees for a GPU class add up to more than the
/// clusters declare: those guarantees cannot all be honoured at once. Skipped
/// when no Cluster is declared (capacity then comes from live spokes only).
fn check_overcommit(
    rep: &mut Reporter<'_>,
    teams: &BTreeMap<String, Team>,
    clusters: &BTreeMap<String, Cluster>,
    quota_at: &QuotaAt,
) {
    if clusters.is_empty() {
        return;
    }
    let mut capacity: BTreeMap<&str, u64> = BTreeMap::new();
    let mut total: u64 = 0;
    for c in clusters.values() {
        for g in &c.nodes {
            let n = g.count.saturating_mul(g.gpus_per_node);
            let e = capacity.entry(g.gpu_model.as_str()).or_insert(0);
            *e = e.saturating_add(n);
            total = total.saturating_add(n);
        }
    }
    let classes: BTreeSet<&str> = teams
        .values()
        .flat_map(|t| t.quotas.keys().map(String::as_str))
        .collect();
    for class in classes {
        let cap_gpus = if class == ANY_GPU_CLASS {
            total
        } else {
            capacity.get(class).copied().unwrap_or(0)
        };
        let cap = Milli(cap_gpus.saturating_mul(MILLI_PER_GPU));
        let mut sum = Milli::ZERO;
        let mut crossing: Option<&str> = None;
        for team in teams.values() {
            if let Some(q) = team.quotas.get(class) {
                sum = Milli(sum.0.saturating_add(q.guaranteed.0));
                if sum > cap && crossing.is_none() {
                    crossing = Some(&team.name);
                }
            }
        }
        let Some(team) = crossing else { continue };
        let Some((pos, path)) = quota_at.get(&(team.to_string(), class.to_string())) else {
            continue;
        };
        let what = if class == ANY_GPU_CLASS {
            "GPUs of all models".to_string()
        } else {
            format!("{class} GPUs")
        };
        rep.warning(
            *pos,
            path.clone(),
            format!(
                "guarantees for `{class}` are over-committed: teams guarantee {sum} in total but the clusters declare {cap} {what}"
            ),
            "lower guarantees or declare more capacity; guarantees above capacity cannot all be honoured at once",
        );
    }
}
