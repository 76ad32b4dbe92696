//! The trace formats: each reads its header and rows into jobs, then
//! [`finish`] orders them and makes submit times relative.

use axle_policy::{MILLI_PER_GPU, Milli};

use super::cells::{
    check_whole_gpus, parse_datetime, parse_gpus, parse_nonempty, parse_seconds_ceil,
    parse_seconds_floor, parse_u64, parse_whole_gpus,
};
use super::csv_reader::{Column, Reader};
use super::{Trace, TraceError, TraceJob};

/// Philly jobs over this many GPUs may spread over several (8-GPU) nodes.
const MAX_GPUS_ON_ONE_NODE: u64 = 8;

const PHILLY_COLUMNS: &[Column] = &[
    Column::required("timestamp"),
    Column::required("duration"),
    Column::required("num_gpus"),
    Column::ignored("gpu_time"),
    Column::required("cluster"),
];

pub(super) fn parse_philly(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
    let header = reader.header(
        PHILLY_COLUMNS,
        "timestamp,duration,num_gpus,gpu_time,cluster",
    )?;
    let timestamp = header.index("timestamp")?;
    let duration = header.index("duration")?;
    let num_gpus = header.index("num_gpus")?;
    let cluster = header.index("cluster")?;
    let mut raw = Vec::new();
    while let Some(row) = reader.next_row(&header)? {
        let submit = row.get(timestamp, "timestamp", parse_datetime)?;
        let duration_s = row.get(duration, "duration", parse_seconds_ceil)?;
        let gpus = row.get(num_gpus, "num_gpus", parse_whole_gpus)?;
        let team = row.get(cluster, "cluster", parse_nonempty)?;
        raw.push(RawJob {
            name: None,
            submit: i128::from(submit),
            duration_s,
            gpus: Milli::gpus(gpus),
            allow_spread: gpus > MAX_GPUS_ON_ONE_NODE,
            team,
            priority: None,
            gpu_model: None,
        });
    }
    Ok(finish(raw, "philly", Vec::new()))
}

const OPENB_COLUMNS: &[Column] = &[
    Column::required("name"),
    Column::ignored("cpu_milli"),
    Column::ignored("memory_mib"),
    Column::required("num_gpu"),
    Column::required("gpu_milli"),
    Column::optional("gpu_spec"),
    Column::required("qos"),
    Column::ignored("pod_phase"),
    Column::required("creation_time"),
    Column::required("deletion_time"),
    Column::required("scheduled_time"),
];

const OPENB_QOS: &[(&str, &str)] = &[
    ("Guaranteed", "production"),
    ("LS", "training"),
    ("Burstable", "development"),
    ("BE", "batch"),
];

pub(super) fn parse_openb(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
    let header = reader.header(
        OPENB_COLUMNS,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time",
    )?;
    let name = header.index("name")?;
    let num_gpu = header.index("num_gpu")?;
    let gpu_milli = header.index("gpu_milli")?;
    let gpu_spec = header.position("gpu_spec");
    let qos = header.index("qos")?;
    let creation = header.index("creation_time")?;
    let deletion = header.index("deletion_time")?;
    let scheduled = header.index("scheduled_time")?;
    let mut cpu_only = 0u64;
    let mut never_scheduled = 0u64;
    let mut raw = Vec::new();
    while let Some(row) = reader.next_row(&header)? {
        let gpus = row.get(num_gpu, "num_gpu", parse_u64)?;
        if gpus == 0 {
            cpu_only += 1;
            continue;
        }
        if row.cell(scheduled).is_empty() {
            never_scheduled += 1;
            continue;
        }
        let pod = row.get(name, "name", parse_nonempty)?;
        let share = row.get(gpu_milli, "gpu_milli", parse_u64)?;
        if share == 0 || share > MILLI_PER_GPU {
            return Err(row.error(format!(
                "column `gpu_milli`: `{share}` is out of range; expected 1..={MILLI_PER_GPU}"
            )));
        }
        let gpus_per_replica = if gpus == 1 && share < MILLI_PER_GPU {
            Milli(share)
        } else {
            Milli::gpus(check_whole_gpus(gpus).map_err(|m| row.column_error("num_gpu", m))?)
        };
        let priority = row.get(qos, "qos", |cell| {
            OPENB_QOS
                .iter()
                .find(|(class, _)| class.eq_ignore_ascii_case(cell))
                .map(|(_, priority)| (*priority).to_string())
                .ok_or_else(|| {
                    format!("unknown QoS `{cell}`; expected one of Guaranteed, LS, Burstable, BE")
                })
        })?;
        let gpu_model = gpu_spec.and_then(|index| {
            row.cell(index)
                .split('|')
                .next()
                .map(str::trim)
                .filter(|model| !model.is_empty())
                .map(str::to_string)
        });
        let submit = row.get(creation, "creation_time", parse_u64)?;
        let start = row.get(scheduled, "scheduled_time", parse_u64)?;
        let end = row.get(deletion, "deletion_time", parse_u64)?;
        raw.push(RawJob {
            name: Some(pod),
            submit: i128::from(submit),
            duration_s: end.saturating_sub(start).max(1),
            gpus: gpus_per_replica,
            allow_spread: false,
            team: "openb".to_string(),
            priority: Some(priority),
            gpu_model,
        });
    }
    let mut skipped = Vec::new();
    if cpu_only > 0 {
        skipped.push(("cpu-only pod".to_string(), cpu_only));
    }
    if never_scheduled > 0 {
        skipped.push(("never scheduled in the trace".to_string(), never_scheduled));
    }
    Ok(finish(raw, "openb", skipped))
}

const CSV_COLUMNS: &[Column] = &[
    Column::required("submit_time_s"),
    Column::required("duration_s"),
    Column::required("gpus"),
    Column::required("team"),
    Column::optional("priority"),
    Column::optional("gpu_model"),
];

pub(super) fn parse_csv(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
    let header = reader.header(
        CSV_COLUMNS,
        "submit_time_s,duration_s,gpus,team (optionally also priority,gpu_model)",
    )?;
    header.reject_unknown(CSV_COLUMNS)?;
    let submit = header.index("submit_time_s")?;
    let duration = header.index("duration_s")?;
    let gpus = header.index("gpus")?;
    let team = header.index("team")?;
    let priority = header.position("priority");
    let gpu_model = header.position("gpu_model");
    let mut raw = Vec::new();
    while let Some(row) = reader.next_row(&header)? {
        let submit_s = row.get(submit, "submit_time_s", parse_seconds_floor)?;
        let duration_s = row.get(duration, "duration_s", parse_seconds_ceil)?;
        let amount = row.get(gpus, "gpus", parse_gpus)?;
        let team = row.get(team, "team", parse_nonempty)?;
        let optional = |index: Option<usize>| {
            index
                .map(|index| row.cell(index))
                .filter(|cell| !cell.is_empty())
                .map(str::to_string)
        };
        raw.push(RawJob {
            name: None,
            submit: i128::from(submit_s),
            duration_s,
            gpus: amount,
            allow_spread: amount > Milli::gpus(MAX_GPUS_ON_ONE_NODE),
            team,
            priority: optional(priority),
            gpu_model: optional(gpu_model),
        });
    }
    Ok(finish(raw, "job", Vec::new()))
}

/// A job before submit times are made relative and ids assigned.
struct RawJob {
    name: Option<String>,
    submit: i128,
    duration_s: u64,
    gpus: Milli,
    allow_spread: bool,
    team: String,
    priority: Option<String>,
    gpu_model: Option<String>,
}

/// Assigns ids in file order, makes submit times relative to the earliest, and
/// sorts by `(submit_time_s, id)`. Jobs without a name get `<prefix>-<id>`.
fn finish(raw: Vec<RawJob>, prefix: &str, skipped: Vec<(String, u64)>) -> Trace {
    let earliest = raw.iter().map(|job| job.submit).min().unwrap_or(0);
    let relative = |submit: i128| u64::try_from(submit - earliest).unwrap_or(u64::MAX);
    // Sort small keys rather than whole jobs; ids are unique, so an unstable
    // sort is deterministic.
    let mut order: Vec<(u64, usize)> = raw
        .iter()
        .enumerate()
        .map(|(index, job)| (relative(job.submit), index))
        .collect();
    order.sort_unstable();
    let mut slots: Vec<Option<RawJob>> = raw.into_iter().map(Some).collect();
    let jobs = order
        .into_iter()
        .filter_map(|(submit_time_s, index)| {
            let job = slots.get_mut(index)?.take()?;
            let id = index as u64;
            Some(TraceJob {
                id,
                name: job.name.unwrap_or_else(|| format!("{prefix}-{id}")),
                submit_time_s,
                duration_s: job.duration_s,
                gpus_per_replica: job.gpus,
                replicas: 1,
                allow_spread: job.allow_spread,
                team: job.team,
                priority: job.priority,
                gpu_model: job.gpu_model,
            })
        })
        .collect();
    Trace { jobs, skipped }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{OPENB_HEADER, PHILLY_HEADER, assert_err};
    use super::super::{TraceFormat, parse_trace};
    use axle_policy::Milli;

    #[test]
    fn philly_sample_parses_and_sorts() {
        let content = format!(
            "{PHILLY_HEADER}\
             2017-10-09 07:01:55,66.0,1,66.0,11cb48\r\n\
             2017-10-09 06:13:03,2951.5,16,47224.0,6214e9\r\n\
             2017-10-09 06:13:03,0.0,2,0.0,6c71a0\r\n\
             \r\n\n"
        );
        let trace = parse_trace("philly.csv", &content, TraceFormat::Philly).unwrap();
        assert!(trace.skipped.is_empty());
        let summary: Vec<_> = trace
            .jobs
            .iter()
            .map(|job| {
                (
                    job.id,
                    job.name.as_str(),
                    job.submit_time_s,
                    job.duration_s,
                    job.gpus_per_replica,
                    job.allow_spread,
                    job.team.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (1, "philly-1", 0, 2952, Milli::gpus(16), true, "6214e9"),
                (2, "philly-2", 0, 1, Milli::gpus(2), false, "6c71a0"),
                (0, "philly-0", 2932, 66, Milli::gpus(1), false, "11cb48"),
            ]
        );
        assert!(
            trace
                .jobs
                .iter()
                .all(|job| job.replicas == 1 && job.priority.is_none() && job.gpu_model.is_none())
        );
    }

    #[test]
    fn philly_errors_name_the_line() {
        let row = "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n";
        assert_err("", TraceFormat::Philly, 1, "empty file");
        assert_err(row, TraceFormat::Philly, 1, "missing or wrong header");
        assert_err(
            "timestamp,duration,gpus,cluster\n",
            TraceFormat::Philly,
            1,
            "lacks column(s) num_gpus",
        );
        let bad_rows = [
            ("2017-10-09 07:01:55,66.0,1,66.0\n", "expected 5 fields"),
            ("2017-10-09,66.0,1,66.0,11cb48\n", "column `timestamp`"),
            ("2017-10-09 07:01:55,-3,1,66.0,11cb48\n", "negative"),
            ("2017-10-09 07:01:55,nan,1,66.0,11cb48\n", "not a finite"),
            ("2017-10-09 07:01:55,66.0,0,66.0,11cb48\n", "at least 1"),
            ("2017-10-09 07:01:55,66.0,1.5,66.0,11cb48\n", "whole number"),
            (
                "2017-10-09 07:01:55,66.0,99999999999999999,0,x\n",
                "too large",
            ),
            ("2017-10-09 07:01:55,66.0,1,66.0,\n", "column `cluster`"),
            ("2017-10-09 07:01:55,\"66.0,1,66.0,x\n", "no closing quote"),
        ];
        for (bad, needle) in bad_rows {
            let content = format!("{PHILLY_HEADER}{row}\n{row}{bad}{row}");
            assert_err(&content, TraceFormat::Philly, 5, needle);
        }
    }

    #[test]
    fn philly_rejects_impossible_timestamps() {
        let row = "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n";
        for timestamp in [
            "2017-02-29 00:00:00",
            "2017-13-01 00:00:00",
            "2017-01-01 24:00:00",
            "2017-1-01 00:00:00",
        ] {
            let content = format!("{PHILLY_HEADER}{row}{timestamp},66.0,1,66.0,11cb48\n");
            assert_err(&content, TraceFormat::Philly, 3, "column `timestamp`");
            assert_err(&content, TraceFormat::Philly, 3, timestamp);
        }
    }

    #[test]
    fn openb_sample_parses_and_skips() {
        let content = format!(
            "{OPENB_HEADER}\
             openb-pod-0000,12000,16384,1,1000,,LS,Running,100,12537496,100\n\
             openb-pod-0001,6000,12288,1,460,V100M16|V100M32,BE,Running,50,1000,60\n\
             openb-pod-0002,6000,12288,0,0,,BE,Running,10,1000,10\n\
             openb-pod-0003,6000,12288,1,460,,BE,Pending,20,30,\n\
             openb-pod-0004,88000,327680,8,1000,,Burstable,Failed,500,400,500\n\
             \"openb,pod-0005\",88000,327680,2,1000,T4,Guaranteed,Failed,500,900,600\n"
        );
        let trace = parse_trace("openb.csv", &content, TraceFormat::AlibabaOpenb).unwrap();
        assert_eq!(
            trace.skipped,
            vec![
                ("cpu-only pod".to_string(), 1),
                ("never scheduled in the trace".to_string(), 1)
            ]
        );
        let summary: Vec<_> = trace
            .jobs
            .iter()
            .map(|job| {
                (
                    job.id,
                    job.name.as_str(),
                    job.submit_time_s,
                    job.duration_s,
                    job.gpus_per_replica,
                    job.priority.as_deref(),
                    job.gpu_model.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    1,
                    "openb-pod-0001",
                    0,
                    940,
                    Milli(460),
                    Some("batch"),
                    Some("V100M16")
                ),
                (
                    0,
                    "openb-pod-0000",
                    50,
                    12_537_396,
                    Milli::gpus(1),
                    Some("training"),
                    None
                ),
                (
                    2,
                    "openb-pod-0004",
                    450,
                    1,
                    Milli::gpus(8),
                    Some("development"),
                    None
                ),
                (
                    3,
                    "openb,pod-0005",
                    450,
                    300,
                    Milli::gpus(2),
                    Some("production"),
                    Some("T4")
                ),
            ]
        );
        assert!(
            trace
                .jobs
                .iter()
                .all(|job| job.team == "openb" && job.replicas == 1 && !job.allow_spread)
        );
    }

    #[test]
    fn openb_errors_name_the_line() {
        let row = "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n";
        assert_err(
            PHILLY_HEADER,
            TraceFormat::AlibabaOpenb,
            1,
            "missing or wrong header",
        );
        let bad_rows = [
            ("p,1,1,1,1000,,XX,Running,0,1,0\n", "unknown QoS `XX`"),
            ("p,1,1,1,0,,LS,Running,0,1,0\n", "column `gpu_milli`"),
            ("p,1,1,1,1001,,LS,Running,0,1,0\n", "out of range"),
            ("p,1,1,x,1000,,LS,Running,0,1,0\n", "column `num_gpu`"),
            ("p,1,1,1,1000,,LS,Running,0,,0\n", "column `deletion_time`"),
            (
                "p,1,1,1,1000,,LS,Running,-5,1,0\n",
                "column `creation_time`",
            ),
            (",1,1,1,1000,,LS,Running,0,1,0\n", "column `name`"),
            ("p,1,1,1,1000,,LS,Running,0,1,0,extra\n", "found 12"),
        ];
        for (bad, needle) in bad_rows {
            let content = format!("{OPENB_HEADER}{row}{bad}");
            assert_err(&content, TraceFormat::AlibabaOpenb, 3, needle);
        }
    }

    #[test]
    fn csv_sample_parses_in_any_column_order() {
        let content = "team,gpus,duration_s,submit_time_s,gpu_model,priority\n\
                       vision,0.25,100,1000,H100,production\n\
                       \"nlp, west\",16,0.5,990,,\n\
                       research,2,7200.2,1000.9,A100,batch\n";
        let trace = parse_trace("jobs.csv", content, TraceFormat::Csv).unwrap();
        let summary: Vec<_> = trace
            .jobs
            .iter()
            .map(|job| {
                (
                    job.id,
                    job.name.as_str(),
                    job.submit_time_s,
                    job.duration_s,
                    job.gpus_per_replica,
                    job.allow_spread,
                    job.team.as_str(),
                    job.priority.as_deref(),
                    job.gpu_model.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    1,
                    "job-1",
                    0,
                    1,
                    Milli::gpus(16),
                    true,
                    "nlp, west",
                    None,
                    None
                ),
                (
                    0,
                    "job-0",
                    10,
                    100,
                    Milli(250),
                    false,
                    "vision",
                    Some("production"),
                    Some("H100")
                ),
                (
                    2,
                    "job-2",
                    10,
                    7201,
                    Milli::gpus(2),
                    false,
                    "research",
                    Some("batch"),
                    Some("A100")
                ),
            ]
        );
        let minimal = "submit_time_s,duration_s,gpus,team\n5,10,1,a\n";
        let trace = parse_trace("m.csv", minimal, TraceFormat::Csv).unwrap();
        assert_eq!(trace.jobs[0].submit_time_s, 0);
        assert_eq!(trace.jobs[0].priority, None);
    }

    #[test]
    fn csv_errors_name_the_line() {
        const HEADER: &str = "submit_time_s,duration_s,gpus,team\n";
        assert_err(
            "submit_time_s,duration_s,gpus,team,user,note\n",
            TraceFormat::Csv,
            1,
            "unknown column(s) `user`, `note`",
        );
        assert_err(
            "submit,duration,gpus\n",
            TraceFormat::Csv,
            1,
            "lacks column(s)",
        );
        assert_err(
            "submit_time_s,duration_s,gpus,team,gpus\n",
            TraceFormat::Csv,
            1,
            "duplicate column `gpus`",
        );
        assert_err("\n\n", TraceFormat::Csv, 1, "empty file");
        let bad_rows = [
            ("0,10,-1,a", "`-1` is negative"),
            ("0,10,0,a", "zero"),
            ("0,10,0.0,a", "zero"),
            ("0,10,inf,a", "not a finite"),
            ("0,10,NaN,a", "not a finite"),
            ("0,10,two,a", "not a number"),
            ("0,10,,a", "must not be empty"),
            ("0,10,0.0001,a", "finer than 0.001"),
            ("0,10,1e13,a", "too large"),
            ("-1,10,1,a", "column `submit_time_s`"),
            ("0,abc,1,a", "column `duration_s`"),
            ("0,1e300,1,a", "too large"),
            ("0,10,1,", "column `team`"),
            ("0,10,1", "expected 4 fields"),
            ("0,10,\"1\"x,a", "after the closing quote"),
        ];
        for (bad, needle) in bad_rows {
            let content = format!("{HEADER}0,10,1,a\r\n\r\n{bad}\r\n0,10,1,a\r\n");
            assert_err(&content, TraceFormat::Csv, 4, needle);
        }
    }
}
