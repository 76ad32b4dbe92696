//! `axle get workloads|clusters|teams|events`: tables, JSON or YAML, and
//! `-w` to keep printing rows as they change (and new events as they come).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use axle_proto::api::{ClusterView, EventView, TeamView, WorkloadView};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::args::{ListFormat, ObjectFormat, parse_state, to_text};
use crate::client::{Client, ClientError, WorkloadFilter};
use crate::exit::UsageError;
use crate::layout;
use crate::table::{self, Row};
use crate::workload_cmd::now_ms;

/// `-w` polls at this period (the brief: every second); one small list
/// request per second per watcher.
const WATCH_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Resource {
    #[value(alias = "workload", alias = "wl")]
    Workloads,
    #[value(alias = "cluster")]
    Clusters,
    #[value(alias = "team")]
    Teams,
    #[value(alias = "event", alias = "ev")]
    Events,
    /// The hub's replicas, which one leads, and its term.
    #[value(alias = "hub")]
    Hubs,
    /// Cloud burst instances and each team's spend this month.
    Burst,
}

/// Events `get events` shows by default: the most recent screenfuls.
const DEFAULT_EVENT_TAIL: u32 = 200;

#[derive(Args)]
pub struct GetArgs {
    /// What to list.
    #[arg(value_enum)]
    resource: Resource,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ListFormat::Table)]
    pub(crate) output: ListFormat,
    /// Keep polling every second and print rows that change, until Ctrl-C.
    #[arg(short = 'w', long)]
    watch: bool,
    /// Tables without their header line.
    #[arg(long)]
    pub(crate) no_headers: bool,
    /// Only this team (workloads, teams).
    #[arg(long)]
    pub(crate) team: Option<String>,
    /// Only this state: a workload state (Pending, Running, …) or a cluster
    /// state (Ready, Lost, Declared).
    #[arg(long)]
    state: Option<String>,
    /// Only this cluster (workloads, clusters).
    #[arg(long)]
    cluster: Option<String>,
    /// Only the events of this workload (events).
    #[arg(long, value_name = "ID")]
    workload: Option<u64>,
    /// How many of the most recent events to show first (events).
    #[arg(long, default_value_t = DEFAULT_EVENT_TAIL)]
    tail: u32,
}

/// What one poll returned.
enum Snapshot {
    Workloads(Vec<WorkloadView>),
    Clusters(Vec<ClusterView>),
    Teams(Vec<TeamView>),
    Events(Vec<EventView>),
}

/// Fields that change with the clock alone; `-w -o json|yaml` ignores them
/// when deciding whether an object changed.
const VOLATILE_FIELDS: &[&str] = &["last_heartbeat_ms"];

impl Snapshot {
    fn headers(&self) -> &'static [&'static str] {
        match self {
            Snapshot::Workloads(_) => table::WORKLOAD_HEADERS,
            Snapshot::Clusters(_) => table::CLUSTER_HEADERS,
            Snapshot::Teams(_) => table::TEAM_HEADERS,
            Snapshot::Events(_) => table::EVENT_HEADERS,
        }
    }

    /// Widths `-w` starts with (see `table::WORKLOAD_WATCH_WIDTHS`).
    fn watch_widths(&self) -> &'static [usize] {
        match self {
            Snapshot::Workloads(_) => table::WORKLOAD_WATCH_WIDTHS,
            Snapshot::Events(_) => table::EVENT_WATCH_WIDTHS,
            _ => &[],
        }
    }

    fn volatile_columns(&self) -> &'static [usize] {
        match self {
            Snapshot::Workloads(_) => table::WORKLOAD_VOLATILE,
            Snapshot::Clusters(_) => table::CLUSTER_VOLATILE,
            Snapshot::Teams(_) => table::TEAM_VOLATILE,
            Snapshot::Events(_) => table::EVENT_VOLATILE,
        }
    }

    /// Rows as `-o` wants them: `wide` keeps every reason whole (a table on
    /// a terminal is cut to its width when laid out: [`fit_to`]).
    fn rows_for(&self, now_ms: u64, output: ListFormat) -> Vec<Row> {
        let mut rows = self.rows(now_ms);
        if output == ListFormat::Wide
            && let Snapshot::Workloads(ws) = self
        {
            for (r, w) in rows.iter_mut().zip(ws) {
                if let (Some(last), Some(reason)) = (r.cells.last_mut(), &w.pending_reason) {
                    *last = reason.clone();
                }
            }
        }
        rows
    }

    fn rows(&self, now_ms: u64) -> Vec<Row> {
        match self {
            Snapshot::Workloads(ws) => table::workload_rows(ws, now_ms),
            Snapshot::Clusters(cs) => table::cluster_rows(cs, now_ms),
            Snapshot::Teams(ts) => table::teams_rows(ts),
            Snapshot::Events(es) => table::event_rows(es),
        }
    }

    /// `kind/name` of each object, as `-o name` prints them.
    fn names(&self) -> Vec<String> {
        match self {
            Snapshot::Workloads(ws) => ws.iter().map(|w| format!("workload/{}", w.id)).collect(),
            Snapshot::Clusters(cs) => cs.iter().map(|c| format!("cluster/{}", c.name)).collect(),
            Snapshot::Teams(ts) => ts.iter().map(|t| format!("team/{}", t.name)).collect(),
            Snapshot::Events(es) => es.iter().map(|e| format!("event/{}", e.seq)).collect(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Snapshot::Workloads(v) => v.len(),
            Snapshot::Clusters(v) => v.len(),
            Snapshot::Teams(v) => v.len(),
            Snapshot::Events(v) => v.len(),
        }
    }

    /// Each object with its key, as JSON values.
    fn items(&self) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
        fn each<T: Serialize>(
            v: &[T],
            key: impl Fn(&T) -> String,
        ) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
            v.iter()
                .map(|x| Ok((key(x), serde_json::to_value(x)?)))
                .collect()
        }
        match self {
            Snapshot::Workloads(v) => each(v, |w| w.id.to_string()),
            Snapshot::Clusters(v) => each(v, |c| c.name.clone()),
            Snapshot::Teams(v) => each(v, |t| t.name.clone()),
            Snapshot::Events(v) => each(v, |e| format!("{:020}", e.seq)),
        }
    }

    fn to_text(&self, format: ObjectFormat) -> anyhow::Result<String> {
        match self {
            Snapshot::Workloads(v) => to_text(v, format),
            Snapshot::Clusters(v) => to_text(v, format),
            Snapshot::Teams(v) => to_text(v, format),
            Snapshot::Events(v) => to_text(v, format),
        }
    }
}

/// Which filters apply to which resource; the rest are usage errors.
fn check_filters(a: &GetArgs) -> Result<Option<String>, UsageError> {
    let unsupported = |flag: &str| {
        UsageError(format!(
            "{flag} does not apply to {}",
            match a.resource {
                Resource::Workloads => "workloads",
                Resource::Clusters => "clusters",
                Resource::Teams => "teams",
                Resource::Events => "events",
                Resource::Hubs => "hubs",
                Resource::Burst => "burst",
            }
        ))
    };
    if a.resource != Resource::Events && a.workload.is_some() {
        return Err(unsupported("--workload"));
    }
    match a.resource {
        Resource::Workloads => a
            .state
            .as_deref()
            .map(parse_state)
            .transpose()
            .map_err(UsageError),
        Resource::Clusters if a.team.is_some() => Err(unsupported("--team")),
        Resource::Clusters => Ok(a.state.clone()),
        Resource::Teams if a.state.is_some() => Err(unsupported("--state")),
        Resource::Teams if a.cluster.is_some() => Err(unsupported("--cluster")),
        Resource::Teams => Ok(None),
        Resource::Events if a.team.is_some() => Err(unsupported("--team")),
        Resource::Events if a.state.is_some() => Err(unsupported("--state")),
        Resource::Events if a.cluster.is_some() => Err(unsupported("--cluster")),
        Resource::Events => Ok(None),
        Resource::Hubs if a.team.is_some() => Err(unsupported("--team")),
        Resource::Hubs if a.state.is_some() => Err(unsupported("--state")),
        Resource::Hubs if a.cluster.is_some() => Err(unsupported("--cluster")),
        Resource::Hubs if a.watch => Err(unsupported("-w")),
        Resource::Hubs => Ok(None),
        Resource::Burst if a.state.is_some() => Err(unsupported("--state")),
        Resource::Burst if a.cluster.is_some() => Err(unsupported("--cluster")),
        Resource::Burst if a.watch => Err(unsupported("-w")),
        Resource::Burst => Ok(None),
    }
}

const HUB_HEADERS: &[&str] = &["REPLICA", "ROLE", "TERM", "HTTP", "GRPC", "AGE"];

/// `axle get hubs`: one row per replica (one hub on redb has none: a line says so).
async fn hubs(client: &Client, a: &GetArgs) -> anyhow::Result<ExitCode> {
    let v = client.hubs().await?;
    if let Some(format) = structured(a.output) {
        print!("{}", to_text(&v, format)?);
        return Ok(ExitCode::SUCCESS);
    }
    if a.output == ListFormat::Name {
        for r in &v.replicas {
            println!("hub/{}", r.id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if v.replicas.is_empty() {
        println!(
            "one hub on the {} store (no replicas); it always leads",
            v.store
        );
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ms();
    let term = v.term.map_or("-".to_string(), |t| t.to_string());
    let rows: Vec<Row> = v
        .replicas
        .iter()
        .map(|r| Row {
            key: r.id.clone(),
            cells: vec![
                table::printable(&r.id).into_owned(),
                if r.leader { "leader" } else { "follower" }.to_string(),
                if r.leader {
                    term.clone()
                } else {
                    "-".to_string()
                },
                table::printable(&r.http).into_owned(),
                table::printable(&r.grpc).into_owned(),
                table::age(now, r.started_at_ms),
            ],
        })
        .collect();
    let header = (!a.no_headers).then_some(HUB_HEADERS);
    print!("{}", layout::render(header, &rows, None));
    if let Some(state) = &v.state
        && !a.no_headers
    {
        println!(
            "answered by {}: {}",
            table::printable(&v.answered_by),
            table::printable(state)
        );
    }
    if v.leader.is_none() {
        eprintln!("no replica leads right now (an election, or etcd is unreachable)");
    }
    Ok(ExitCode::SUCCESS)
}

/// One poll. `cursor` is the newest event seen: the first events poll
/// takes the most recent `--tail`, later ones what came after.
async fn fetch(
    client: &Client,
    a: &GetArgs,
    state: &Option<String>,
    cursor: &mut u64,
) -> anyhow::Result<Snapshot> {
    Ok(match a.resource {
        Resource::Events => {
            let es = if *cursor == 0 {
                client.events(0, Some(a.tail), a.workload).await?
            } else {
                client.events(*cursor, None, a.workload).await?
            };
            if let Some(last) = es.last() {
                *cursor = last.seq;
            }
            Snapshot::Events(es)
        }
        Resource::Workloads => {
            let filter = WorkloadFilter {
                team: a.team.clone(),
                state: state.clone(),
                cluster: a.cluster.clone(),
            };
            Snapshot::Workloads(client.workloads(&filter).await?)
        }
        Resource::Clusters => {
            let mut cs = client.clusters().await?;
            cs.retain(|c| {
                a.cluster.as_ref().is_none_or(|n| &c.name == n)
                    && state
                        .as_ref()
                        .is_none_or(|s| c.state.eq_ignore_ascii_case(s))
            });
            Snapshot::Clusters(cs)
        }
        Resource::Teams => {
            let mut ts = client.teams().await?;
            ts.retain(|t| a.team.as_ref().is_none_or(|n| &t.name == n));
            Snapshot::Teams(ts)
        }
        Resource::Hubs => anyhow::bail!("hubs are listed by `hubs`, not polled"),
        Resource::Burst => anyhow::bail!("burst is listed by `burst_cmd`, not polled"),
    })
}

/// The terminal's width when stdout is one: `COLUMNS`, else what the
/// terminal says.
/// The width a table is cut to: the terminal's, except for `-o wide`.
fn fit_to(output: ListFormat) -> Option<usize> {
    (output != ListFormat::Wide)
        .then(terminal_columns)
        .flatten()
}

fn terminal_columns() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .or_else(|| terminal_size::terminal_size().map(|(w, _)| usize::from(w.0)))
}

pub(crate) fn structured(format: ListFormat) -> Option<ObjectFormat> {
    match format {
        ListFormat::Table | ListFormat::Wide | ListFormat::Name => None,
        ListFormat::Json => Some(ObjectFormat::Json),
        ListFormat::Yaml => Some(ObjectFormat::Yaml),
    }
}

pub async fn run(client: &Client, a: GetArgs) -> anyhow::Result<ExitCode> {
    let state = check_filters(&a)?;
    if a.resource == Resource::Hubs {
        return hubs(client, &a).await;
    }
    if a.resource == Resource::Burst {
        return crate::burst_cmd::run(client, &a).await;
    }
    if a.watch && a.output == ListFormat::Name {
        return Err(UsageError("-o name lists once; drop -w or use -o json".into()).into());
    }
    let mut cursor = 0;
    let snap = fetch(client, &a, &state, &mut cursor).await?;
    if !a.watch {
        match structured(a.output) {
            Some(format) => print!("{}", snap.to_text(format)?),
            None if a.output == ListFormat::Name => {
                for n in snap.names() {
                    println!("{n}");
                }
            }
            None if snap.len() == 0 => eprintln!("no {} found", resource_name(a.resource)),
            None => {
                let rows = snap.rows_for(now_ms(), a.output);
                let header = (!a.no_headers).then_some(snap.headers());
                print!("{}", layout::render(header, &rows, fit_to(a.output)));
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    match structured(a.output) {
        None => watch_table(client, &a, &state, snap, cursor).await,
        Some(format) => watch_structured(client, &a, &state, snap, format, cursor).await,
    }
}

fn resource_name(r: Resource) -> &'static str {
    match r {
        Resource::Workloads => "workloads",
        Resource::Clusters => "clusters",
        Resource::Teams => "teams",
        Resource::Events => "events",
        Resource::Hubs => "hubs",
        Resource::Burst => "burst",
    }
}

/// Rows of this poll that differ from the previous poll (ignoring volatile
/// columns), in table order; updates `seen`, which keeps only this poll's
/// rows (so a watch running for weeks does not grow).
pub fn changed_rows(
    rows: Vec<Row>,
    volatile: &[usize],
    seen: &mut BTreeMap<String, Vec<String>>,
) -> Vec<Row> {
    let keys: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    seen.retain(|k, _| keys.contains(k.as_str()));
    drop(keys);
    let mut out = Vec::new();
    for row in rows {
        let stable = table::stable_cells(&row, volatile);
        if seen.get(&row.key) != Some(&stable) {
            seen.insert(row.key.clone(), stable);
            out.push(row);
        }
    }
    out
}

/// Whether a poll failed because the hub is away (restarting, shutting
/// down): `-w` keeps trying instead of exiting.
fn hub_away(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<ClientError>(),
        Some(ClientError::Unreachable { .. }) | Some(ClientError::Server { status: 503, .. })
    )
}

/// Polls until the hub answers, saying once on stderr that it is away and
/// once that it is back.
async fn poll(
    client: &Client,
    a: &GetArgs,
    state: &Option<String>,
    cursor: &mut u64,
    ticker: &mut tokio::time::Interval,
) -> anyhow::Result<Snapshot> {
    let mut away = false;
    loop {
        ticker.tick().await;
        match fetch(client, a, state, cursor).await {
            Ok(s) => {
                if away {
                    eprintln!("axle: reconnected to {}", client.hub());
                }
                return Ok(s);
            }
            Err(e) if hub_away(&e) => {
                if !away {
                    eprintln!("axle: {e:#}; retrying every second (Ctrl-C to stop)");
                    away = true;
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `HH:MM:SS` (UTC) of a poll, the first column of `-w` rows.
fn clock(ms: u64) -> String {
    table::fmt_timestamp(ms)
        .get(11..19)
        .unwrap_or_default()
        .to_string()
}

async fn watch_table(
    client: &Client,
    a: &GetArgs,
    state: &Option<String>,
    first: Snapshot,
    mut cursor: u64,
) -> anyhow::Result<ExitCode> {
    let volatile = first.volatile_columns();
    // Rows start with the poll's time, except events, which have their own.
    let stamped = !matches!(first, Snapshot::Events(_));
    let headers: Vec<&str> = stamped
        .then_some("TIME")
        .into_iter()
        .chain(first.headers().iter().copied())
        .collect();
    let floors: Vec<usize> = stamped
        .then_some(8)
        .into_iter()
        .chain(first.watch_widths().iter().copied())
        .collect();
    // Widths come from the first rows printed (the header waits for them),
    // so a watch started on an empty list still lines up; when a later row
    // is wider, the columns widen and the header is printed again.
    let mut widths: Option<Vec<usize>> = None;
    let mut seen = BTreeMap::new();
    let mut ticker = tokio::time::interval(WATCH_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut snap = first;
    loop {
        let now = now_ms();
        let changed = changed_rows(snap.rows_for(now, a.output), volatile, &mut seen);
        if !changed.is_empty() {
            let rows: Vec<Vec<String>> = changed
                .into_iter()
                .map(|r| {
                    stamped
                        .then(|| clock(now))
                        .into_iter()
                        .chain(r.cells)
                        .collect()
                })
                .collect();
            let reprint = match &mut widths {
                None => {
                    let mut w: Vec<usize> = headers
                        .iter()
                        .enumerate()
                        .map(|(i, h)| h.chars().count().max(floors.get(i).copied().unwrap_or(0)))
                        .collect();
                    layout::grow(&mut w, &rows);
                    widths = Some(w);
                    true
                }
                Some(w) => layout::grow(w, &rows),
            };
            let w = widths.as_ref().expect("set above");
            let fit = fit_to(a.output);
            if reprint && !a.no_headers {
                println!("{}", layout::line(&headers, w, fit));
            }
            for row in rows {
                println!("{}", layout::line(&row, w, fit));
            }
        }
        snap = poll(client, a, state, &mut cursor, &mut ticker).await?;
    }
}

async fn watch_structured(
    client: &Client,
    a: &GetArgs,
    state: &Option<String>,
    first: Snapshot,
    format: ObjectFormat,
    mut cursor: u64,
) -> anyhow::Result<ExitCode> {
    let mut seen: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut ticker = tokio::time::interval(WATCH_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut snap = first;
    loop {
        let items = snap.items()?;
        let keys: std::collections::BTreeSet<String> =
            items.iter().map(|(k, _)| k.clone()).collect();
        seen.retain(|k, _| keys.contains(k));
        for (key, value) in items {
            let mut stable = value.clone();
            if let Some(obj) = stable.as_object_mut() {
                for f in VOLATILE_FIELDS {
                    obj.remove(*f);
                }
            }
            if seen.get(&key) != Some(&stable) {
                seen.insert(key, stable);
                if format == ObjectFormat::Yaml {
                    println!("---");
                }
                print!("{}", to_text(&value, format)?);
            }
        }
        snap = poll(client, a, state, &mut cursor, &mut ticker).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{NOW_MS, running_workload, workload};

    #[test]
    fn watch_prints_new_and_changed_rows_only() {
        let mut seen = BTreeMap::new();
        let a = workload(1);
        let b = running_workload(2);
        let first = changed_rows(
            table::workload_rows(&[a.clone(), b.clone()], NOW_MS),
            table::WORKLOAD_VOLATILE,
            &mut seen,
        );
        assert_eq!(first.len(), 2);
        // A second later nothing but AGE moved: nothing to print.
        let again = changed_rows(
            table::workload_rows(&[a.clone(), b.clone()], NOW_MS + 1000),
            table::WORKLOAD_VOLATILE,
            &mut seen,
        );
        assert!(again.is_empty());
        let mut b2 = b.clone();
        b2.state = "Succeeded".into();
        let c = workload(3);
        let changed = changed_rows(
            table::workload_rows(&[a, b2, c], NOW_MS + 2000),
            table::WORKLOAD_VOLATILE,
            &mut seen,
        );
        let keys: Vec<&str> = changed.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["2", "3"]);
    }
}
