//! `axle describe workload`: the readable block for one workload, as a pure
//! function of the view and `now_ms`.

use std::fmt::Write as _;

use axle_proto::api::{ReplicaView, TransitionView, WorkloadView};

use crate::table::{self, Row, age, fmt_gpus, fmt_timestamp};

/// Quotes an argument for a POSIX shell when it needs it, so the printed
/// command can be pasted back.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// GPU-hours with precision that fits their size: 0.0042, 1.25, 310.
fn fmt_gpu_hours(h: f64) -> String {
    if h == 0.0 {
        "0".to_string()
    } else if h < 0.01 {
        format!("{h:.4}")
    } else if h < 100.0 {
        format!("{h:.2}")
    } else {
        format!("{h:.0}")
    }
}

pub fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// "node-a: GPU 0, GPU 2 (0.5)": whole GPUs bare, shares with their fraction.
pub fn fmt_replica(r: &ReplicaView) -> String {
    let gpus: Vec<String> = r
        .gpus
        .iter()
        .map(|g| {
            if let Some(unit) = &g.unit {
                format!("{unit} ({})", fmt_gpus(g.fraction))
            } else if (g.fraction - 1.0).abs() < 1e-9 {
                format!("GPU {}", g.index)
            } else {
                format!("GPU {} ({})", g.index, fmt_gpus(g.fraction))
            }
        })
        .collect();
    if gpus.is_empty() {
        r.node.clone()
    } else {
        format!("{}: {}", r.node, gpus.join(", "))
    }
}

fn fmt_when(at_ms: Option<u64>, now_ms: u64) -> String {
    match at_ms {
        Some(at) => format!("{} ({} ago)", fmt_timestamp(at), age(now_ms, at)),
        None => "-".to_string(),
    }
}

/// Seconds with one decimal below a minute, else the age format.
fn fmt_span(ms: u64) -> String {
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        table::fmt_age(ms)
    }
}

pub fn history_table(history: &[TransitionView]) -> String {
    let rows: Vec<Row> = history
        .iter()
        .enumerate()
        .map(|(i, t)| Row {
            key: i.to_string(),
            cells: vec![
                fmt_timestamp(t.at_ms),
                format!("{} → {}", t.from, t.to),
                if t.reason.is_empty() {
                    "-".into()
                } else {
                    t.reason.clone()
                },
            ],
        })
        .collect();
    crate::layout::render(Some(&["TIME", "TRANSITION", "REASON"]), &rows, None)
}

/// "Label:" padded to one column, then the value.
fn field(out: &mut String, label: &str, value: &str) {
    let _ = writeln!(out, "{:<13}{value}", format!("{label}:"));
}

pub fn describe_workload(w: &WorkloadView, now_ms: u64) -> String {
    let mut out = String::new();
    let o = &mut out;
    field(o, "Workload", &w.id.to_string());
    field(o, "Name", &w.name);
    field(o, "Team", &w.team);
    field(o, "Priority", &w.priority);
    let gpus = if w.gang > 1 {
        format!(
            "{} per replica × {} replicas (gang) = {} GPUs",
            fmt_gpus(w.gpus),
            w.gang,
            fmt_gpus(w.gpus * f64::from(w.gang))
        )
    } else {
        fmt_gpus(w.gpus)
    };
    field(o, "GPUs", &gpus);
    field(o, "GPU model", w.gpu_model.as_deref().unwrap_or("any"));
    field(o, "Command", &shell_join(&w.command));
    field(o, "State", &w.state);
    if let Some(reason) = &w.pending_reason {
        field(o, "Pending", reason);
    }
    field(o, "Cluster", w.cluster.as_deref().unwrap_or("-"));
    field(o, "Epoch", &w.epoch.to_string());
    field(o, "Preemptions", &w.preemptions.to_string());
    let checkpoints = match (w.checkpointable, w.checkpoint_interval_s) {
        (true, Some(i)) => format!("yes, every {}", fmt_span(i * 1000)),
        (true, None) => "yes".to_string(),
        (false, _) => "no (a preemption restarts it from zero)".to_string(),
    };
    field(o, "Checkpoints", &checkpoints);
    if w.preemptions > 0 {
        field(
            o,
            "Work lost",
            &format!(
                "{} GPU-hours to preemption",
                fmt_gpu_hours(w.lost_gpu_hours)
            ),
        );
    }
    field(o, "Submitted", &fmt_when(Some(w.submitted_at_ms), now_ms));
    field(o, "Started", &fmt_when(w.started_at_ms, now_ms));
    field(o, "Finished", &fmt_when(w.finished_at_ms, now_ms));
    if w.started_at_ms.is_some() || w.run_ms > 0 {
        field(o, "Runtime", &fmt_span(run_time_ms(w, now_ms)));
    }
    field(
        o,
        "Exit code",
        &w.exit_code.map_or("-".to_string(), |c| c.to_string()),
    );
    if w.replicas.is_empty() {
        field(o, "Placement", "-");
    } else {
        o.push_str("Placement:\n");
        for (i, r) in w.replicas.iter().enumerate() {
            let _ = writeln!(o, "  replica {i}  {}", fmt_replica(r));
        }
    }
    if !w.preemption_log.is_empty() {
        o.push_str("Preempted:\n");
        for p in &w.preemption_log {
            let _ = writeln!(
                o,
                "  {}  by workload {} ({}, team {}), lost {} GPU-hours: {}",
                fmt_when(Some(p.at_ms), now_ms),
                p.by_workload,
                p.by_priority,
                p.by_team,
                fmt_gpu_hours(p.lost_gpu_hours),
                p.reason
            );
        }
    }
    if w.history.is_empty() {
        field(o, "History", "-");
    } else {
        o.push_str("History:\n");
        for line in history_table(&w.history).lines() {
            let _ = writeln!(o, "  {line}");
        }
    }
    out
}

/// Time the workload has run, over all its runs: those that ended (the
/// hub sums them, across preemptions and hub restarts) plus the current one.
pub fn run_time_ms(w: &WorkloadView, now_ms: u64) -> u64 {
    let current = match (w.state.as_str(), w.started_at_ms) {
        ("Running", Some(s)) => now_ms.saturating_sub(s),
        _ => 0,
    };
    w.run_ms.saturating_add(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::tests::{NOW_MS, running_workload, workload};

    #[test]
    fn quoting_round_trips_through_a_shell_reader() {
        assert_eq!(shell_quote("train.py"), "train.py");
        assert_eq!(shell_quote("--lr=3e-4"), "--lr=3e-4");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_join(&["echo".into(), "$HOME".into()]), "echo '$HOME'");
    }

    #[test]
    fn placement_shows_fractions_only_for_shares() {
        let w = running_workload(1);
        assert_eq!(fmt_replica(&w.replicas[0]), "node-a: GPU 0");
        assert_eq!(
            fmt_replica(&w.replicas[1]),
            "node-b: GPU 2 (0.5), GPU 3 (0.5)"
        );
        // A fraction on a fractional unit names the unit.
        let mut r = w.replicas[1].clone();
        r.node = "mig-b".into();
        r.gpus.truncate(1);
        r.gpus[0].fraction = 0.25;
        r.gpus[0].unit = Some("MIG 2g.20gb #1".into());
        assert_eq!(fmt_replica(&r), "mig-b: MIG 2g.20gb #1 (0.25)");
    }

    #[test]
    fn runtime_counts_earlier_runs_and_the_current_one() {
        let mut w = running_workload(5);
        w.run_ms = 3_600_000;
        let started = w.started_at_ms.unwrap();
        assert_eq!(run_time_ms(&w, started + 60_000), 3_660_000);
        w.state = "Pending".into();
        assert_eq!(run_time_ms(&w, started + 60_000), 3_600_000);
    }

    #[test]
    fn a_running_gang_is_described_fully() {
        let out = describe_workload(&running_workload(42), NOW_MS);
        let expected = "\
Workload:    42
Name:        w-42
Team:        vision
Priority:    development
GPUs:        1 per replica × 2 replicas (gang) = 2 GPUs
GPU model:   H100
Command:     python train.py --lr 3e-4
State:       Running
Cluster:     gpu-east-1
Epoch:       1
Preemptions: 0
Checkpoints: no (a preemption restarts it from zero)
Submitted:   2023-11-14 22:14:15.000Z (45s ago)
Started:     2023-11-14 22:14:20.000Z (40s ago)
Finished:    -
Runtime:     40.0s
Exit code:   -
Placement:
  replica 0  node-a: GPU 0
  replica 1  node-b: GPU 2 (0.5), GPU 3 (0.5)
History:
  TIME                       TRANSITION         REASON
  2023-11-14 22:14:16.000Z   Pending → Placed   placed on gpu-east-1
  2023-11-14 22:14:20.000Z   Placed → Running   started
";
        assert_eq!(out, expected);
    }

    #[test]
    fn preemptions_show_who_caused_them_and_the_work_lost() {
        let mut w = running_workload(7);
        w.checkpointable = true;
        w.checkpoint_interval_s = Some(1800);
        w.preemptions = 1;
        w.lost_gpu_hours = 0.25;
        w.preemption_log = vec![axle_proto::api::PreemptionView {
            at_ms: NOW_MS - 30_000,
            by_workload: 9,
            by_team: "nlp".into(),
            by_priority: "training".into(),
            reason: "team nlp reclaims its guarantee".into(),
            lost_gpu_hours: 0.25,
        }];
        let out = describe_workload(&w, NOW_MS);
        assert!(out.contains("Checkpoints: yes, every 30m"), "{out}");
        assert!(
            out.contains("Work lost:   0.25 GPU-hours to preemption"),
            "{out}"
        );
        assert!(
            out.contains("by workload 9 (training, team nlp), lost 0.25 GPU-hours: team nlp reclaims its guarantee"),
            "{out}"
        );
    }

    #[test]
    fn a_pending_workload_shows_its_reason() {
        let mut w = workload(5);
        w.pending_reason = Some("team vision is at its limit of 16 H100".into());
        let out = describe_workload(&w, NOW_MS);
        assert!(out.contains("Pending:     team vision is at its limit of 16 H100\n"));
        assert!(out.contains("Placement:   -\n"));
        assert!(out.contains("History:     -\n"));
        assert!(!out.contains("Runtime"));
    }
}
