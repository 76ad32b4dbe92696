//! Parses GPU job traces (Philly, Alibaba openb, plain CSV) into [`TraceJob`]s for
//! the simulator, and the openb node list into [`ListedNode`]s.
//!
//! The module is pure: callers pass a file's display name and its content, and get
//! back a [`Trace`] (jobs sorted by submit time, then row order) or a [`TraceError`]
//! naming the file, the 1-based line and what is wrong. There is no I/O, no clock
//! and no randomness, and no input makes it panic.
//!
//! Formats (see [`TraceFormat`]):
//!
//! - `philly`: the Philly trace with virtual-cluster labels (Pollux artifact),
//!   header `timestamp,duration,num_gpus,gpu_time,cluster`. The VC hash is the
//!   team; jobs over 8 GPUs may spread across nodes. Timestamps are naive wall
//!   clock times and are only used relative to each other.
//! - `alibaba-openb`: Alibaba's GPU-sharing trace v2023 pod list
//!   (`openb_pod_list_*.csv`). CPU-only and never-scheduled pods are skipped and
//!   counted in [`Trace::skipped`]; QoS classes map to priorities.
//! - `csv`: Axle's own format, header with `submit_time_s,duration_s,gpus,team`
//!   and optionally `priority,gpu_model`, in any order.
//!
//! [`parse_node_list`] reads the openb node list (`openb_node_list_*.csv`).
//!
//! Files are CSV read with the `csv` crate: comma separated, fields may be
//! wrapped in double quotes (to contain commas; `""` is a literal quote), CRLF
//! or LF line endings, a leading UTF-8 BOM and blank lines are ignored, and
//! cells are trimmed. One line is one record: a quoted field that does not
//! close on its line, or text after a closing quote, is an error. Line numbers
//! are the 1-based physical lines of the file.
//!
//! Layout: `formats` holds the three trace formats, `nodes` the node list,
//! `csv_reader` the CSV plumbing and `cells` the cell parsers.

mod cells;
mod csv_reader;
mod formats;
mod nodes;

use std::fmt;
use std::str::FromStr;

use axle_policy::Milli;

use csv_reader::Reader;
pub use nodes::{ListedNode, NodeList, parse_node_list};

/// The trace formats [`parse_trace`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// `philly`: Philly trace with VC labels (`timestamp,duration,num_gpus,gpu_time,cluster`).
    Philly,
    /// `alibaba-openb`: Alibaba GPU trace v2023 pod list.
    AlibabaOpenb,
    /// `csv`: `submit_time_s,duration_s,gpus,team[,priority][,gpu_model]`.
    Csv,
}

impl TraceFormat {
    /// Every format, in the order they are documented.
    pub const ALL: [TraceFormat; 3] = [
        TraceFormat::Philly,
        TraceFormat::AlibabaOpenb,
        TraceFormat::Csv,
    ];

    /// The name used on the command line and accepted by [`FromStr`].
    pub const fn as_str(self) -> &'static str {
        match self {
            TraceFormat::Philly => "philly",
            TraceFormat::AlibabaOpenb => "alibaba-openb",
            TraceFormat::Csv => "csv",
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Returned by [`TraceFormat::from_str`] for a name that is not a known format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown trace format `{given}`; expected one of: philly, alibaba-openb, csv")]
pub struct UnknownTraceFormat {
    pub given: String,
}

impl FromStr for TraceFormat {
    type Err = UnknownTraceFormat;

    /// Accepts `philly`, `alibaba-openb` and `csv` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        TraceFormat::ALL
            .into_iter()
            .find(|format| format.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownTraceFormat {
                given: s.to_string(),
            })
    }
}

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    /// Position among the jobs read from the file (skipped rows are not
    /// counted), 0-based; ties in submit time are broken by it.
    pub id: u64,
    /// `philly-<id>`, the openb pod name, or `job-<id>` for the csv format.
    pub name: String,
    /// Seconds since the earliest submit in the trace (the first job is at 0).
    pub submit_time_s: u64,
    /// Run time in seconds, at least 1.
    pub duration_s: u64,
    /// GPUs of each replica.
    pub gpus_per_replica: Milli,
    /// Gang size (1 for all current formats).
    pub replicas: u32,
    /// Whether the GPUs of one replica may span nodes (jobs over 8 GPUs in the
    /// Philly and csv formats).
    pub allow_spread: bool,
    pub team: String,
    pub priority: Option<String>,
    pub gpu_model: Option<String>,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// Jobs sorted by `(submit_time_s, id)`.
    pub jobs: Vec<TraceJob>,
    /// Rows deliberately left out, as `(reason, count)`; only reasons with a
    /// non-zero count, in a fixed order per format.
    pub skipped: Vec<(String, u64)>,
}

/// A malformed trace: which file, which 1-based line, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    pub file: String,
    pub line: u64,
    pub message: String,
}

/// Parses `content` (the text of the file shown to users as `file`) as a trace
/// in `format`.
pub fn parse_trace(file: &str, content: &str, format: TraceFormat) -> Result<Trace, TraceError> {
    let mut reader = Reader::new(file, content);
    match format {
        TraceFormat::Philly => formats::parse_philly(&mut reader),
        TraceFormat::AlibabaOpenb => formats::parse_openb(&mut reader),
        TraceFormat::Csv => formats::parse_csv(&mut reader),
    }
}

#[cfg(test)]
mod test_support {
    use std::path::PathBuf;

    use super::{TraceError, TraceFormat, parse_trace};

    pub(super) const PHILLY_HEADER: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n";
    pub(super) const OPENB_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

    pub(super) fn manifest_path(relative: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
    }

    /// A full trace file (`../shared/traces/<relative>`), from the gzipped
    /// copy kept in `testdata/traces/full/` so that the tests need nothing
    /// outside the repository. A missing file fails the test rather than
    /// skipping it: these tests are the only check against the real traces.
    pub(super) fn read_shared_trace(relative: &str) -> String {
        use std::io::Read as _;
        let name = relative.rsplit('/').next().unwrap_or(relative);
        let path = manifest_path(&format!("testdata/traces/full/{name}.gz"));
        let file = std::fs::File::open(&path).unwrap_or_else(|error| {
            panic!("cannot read the full trace {}: {error}", path.display())
        });
        let mut text = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        text
    }

    pub(super) fn parse_err(content: &str, format: TraceFormat) -> TraceError {
        match parse_trace("t.csv", content, format) {
            Ok(trace) => panic!("expected an error, got {trace:?}"),
            Err(error) => error,
        }
    }

    pub(super) fn assert_err(content: &str, format: TraceFormat, line: u64, needle: &str) {
        let error = parse_err(content, format);
        assert_eq!(error.file, "t.csv");
        assert_eq!(error.line, line, "{error}");
        assert!(
            error.message.contains(needle),
            "`{error}` should contain `{needle}`"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{OPENB_HEADER, PHILLY_HEADER, manifest_path, read_shared_trace};
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn format_names_round_trip() {
        for format in TraceFormat::ALL {
            assert_eq!(format.as_str().parse::<TraceFormat>(), Ok(format));
            assert_eq!(format.to_string(), format.as_str());
        }
        assert_eq!(" Philly ".parse(), Ok(TraceFormat::Philly));
        let error = "pai".parse::<TraceFormat>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown trace format `pai`; expected one of: philly, alibaba-openb, csv"
        );
    }

    #[test]
    fn no_panics_on_mangled_input() {
        let csv = "submit_time_s,duration_s,gpus,team,priority\n0,10,0.25,\"a,b\",x\n5,1,2,c,\n";
        let philly = format!("{PHILLY_HEADER}2017-10-09 07:01:55,66.0,1,66.0,11cb48\n");
        let openb =
            format!("{OPENB_HEADER}openb-pod-0001,6000,12288,1,460,A|B,BE,Running,50,1000,60\n");
        let noise = [
            '"', ',', '\n', '\r', '-', '.', '9', 'é', ' ', '|', '\u{feff}',
        ];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for (format, text) in [
            (TraceFormat::Csv, csv.to_string()),
            (TraceFormat::Philly, philly),
            (TraceFormat::AlibabaOpenb, openb),
        ] {
            for (cut, _) in text.char_indices() {
                let _ = parse_trace("t", &text[..cut], format);
                let _ = parse_trace("t", &text[cut..], format);
            }
            for _ in 0..2000 {
                let mut chars: Vec<char> = text.chars().collect();
                for _ in 0..3 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let at = (state % chars.len() as u64) as usize;
                    chars[at] = noise[(state >> 32) as usize % noise.len()];
                }
                let mangled: String = chars.into_iter().collect();
                let first = parse_trace("t", &mangled, format);
                assert_eq!(first, parse_trace("t", &mangled, format));
                if let Err(error) = first {
                    assert!(error.line >= 1);
                }
            }
        }
    }

    #[test]
    fn testdata_samples_parse() {
        let read = |name: &str| {
            std::fs::read_to_string(manifest_path(&format!("testdata/traces/{name}")))
                .unwrap_or_else(|error| panic!("testdata/traces/{name}: {error}"))
        };
        let philly = parse_trace(
            "philly-sample.csv",
            &read("philly-sample.csv"),
            TraceFormat::Philly,
        )
        .unwrap();
        assert_eq!(philly.jobs.len(), 200);
        assert_eq!(philly.jobs[0].submit_time_s, 0);

        let openb = parse_trace(
            "openb-sample.csv",
            &read("openb-sample.csv"),
            TraceFormat::AlibabaOpenb,
        )
        .unwrap();
        assert_eq!(
            openb.skipped,
            vec![
                ("cpu-only pod".to_string(), 7),
                ("never scheduled in the trace".to_string(), 15)
            ]
        );
        assert_eq!(openb.jobs.len(), 178);
        let fractional = openb
            .jobs
            .iter()
            .filter(|job| job.gpus_per_replica < Milli::gpus(1));
        assert_eq!(fractional.count(), 60);

        let small = parse_trace("small.csv", &read("small.csv"), TraceFormat::Csv).unwrap();
        assert_eq!(small.jobs.len(), 30);
        let teams: BTreeSet<&str> = small.jobs.iter().map(|job| job.team.as_str()).collect();
        assert_eq!(teams, BTreeSet::from(["nlp", "research", "vision"]));
        let priorities: BTreeSet<&str> = small
            .jobs
            .iter()
            .filter_map(|job| job.priority.as_deref())
            .collect();
        assert_eq!(
            priorities,
            BTreeSet::from(["batch", "development", "production", "training"])
        );
        let models: BTreeSet<&str> = small
            .jobs
            .iter()
            .filter_map(|job| job.gpu_model.as_deref())
            .collect();
        assert_eq!(models, BTreeSet::from(["A100", "H100"]));
        assert!(
            small
                .jobs
                .iter()
                .any(|job| job.gpus_per_replica.0 % 1000 != 0)
        );
    }

    /// The whole Philly trace from the shared data directory.
    #[test]
    fn full_philly_trace_matches_source_md() {
        let content = read_shared_trace("philly-vc-pollux/philly.csv");
        let trace = parse_trace("philly.csv", &content, TraceFormat::Philly).unwrap();
        assert_eq!(trace.jobs.len(), 82_247);
        assert!(trace.skipped.is_empty());
        let teams: BTreeMap<&str, u64> =
            trace.jobs.iter().fold(BTreeMap::new(), |mut teams, job| {
                *teams.entry(job.team.as_str()).or_default() += 1;
                teams
            });
        assert_eq!(teams.len(), 15);
        assert_eq!(teams["6214e9"], 41_226);
        assert_eq!(teams["795a4c"], 3);
        let mut histogram: BTreeMap<u64, u64> = BTreeMap::new();
        for job in &trace.jobs {
            *histogram
                .entry(job.gpus_per_replica.whole_gpus())
                .or_default() += 1;
            assert_eq!(job.allow_spread, job.gpus_per_replica > Milli::gpus(8));
            assert!(job.duration_s >= 1);
        }
        let expected = [
            (1, 76_627),
            (2, 1_818),
            (4, 1_870),
            (8, 1_643),
            (12, 7),
            (16, 199),
            (24, 7),
            (32, 67),
            (64, 6),
            (128, 3),
        ];
        assert_eq!(histogram, BTreeMap::from(expected));
        // 2017-09-04 10:30:41 .. 2017-12-22 08:02:11
        assert_eq!(trace.jobs[0].submit_time_s, 0);
        assert_eq!(
            trace.jobs.last().map(|job| job.submit_time_s),
            Some(1_513_929_731 - 1_504_521_041)
        );
        assert!(trace.jobs.windows(2).all(|pair| {
            (pair[0].submit_time_s, pair[0].id) < (pair[1].submit_time_s, pair[1].id)
        }));
        let max_duration = trace.jobs.iter().map(|job| job.duration_s).max();
        assert_eq!(max_duration, Some(4_628_226));
    }

    /// The whole openb pod list from the shared data directory.
    #[test]
    fn full_openb_trace_matches_source_md() {
        let content = read_shared_trace("alibaba-gpu-v2023-openb/openb_pod_list_default.csv");
        let trace = parse_trace(
            "openb_pod_list_default.csv",
            &content,
            TraceFormat::AlibabaOpenb,
        )
        .unwrap();
        assert_eq!(
            trace.skipped,
            vec![
                ("cpu-only pod".to_string(), 1_088),
                ("never scheduled in the trace".to_string(), 861)
            ]
        );
        assert_eq!(trace.jobs.len(), 8_152 - 1_088 - 861);
    }
}
