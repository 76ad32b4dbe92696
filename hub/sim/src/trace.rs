//! Parses GPU job traces (Philly, Alibaba openb, plain CSV) into [`TraceJob`]s for the simulator.
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
//! The CSV reader is deliberately small: comma separated, fields may be wrapped in
//! double quotes (to contain commas; `""` is a literal quote), CRLF or LF line
//! endings, a leading UTF-8 BOM and blank lines are ignored, and cells are trimmed.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use axle_policy::{MILLI_PER_GPU, Milli};

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
        TraceFormat::Philly => parse_philly(&mut reader),
        TraceFormat::AlibabaOpenb => parse_openb(&mut reader),
        TraceFormat::Csv => parse_csv(&mut reader),
    }
}

// ---------------------------------------------------------------------------
// Formats
// ---------------------------------------------------------------------------

/// Philly jobs over this many GPUs may spread over several (8-GPU) nodes.
const MAX_GPUS_ON_ONE_NODE: u64 = 8;

const PHILLY_COLUMNS: &[Column] = &[
    Column::required("timestamp"),
    Column::required("duration"),
    Column::required("num_gpus"),
    Column::ignored("gpu_time"),
    Column::required("cluster"),
];

fn parse_philly(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
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

fn parse_openb(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
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

fn parse_csv(reader: &mut Reader<'_>) -> Result<Trace, TraceError> {
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

// ---------------------------------------------------------------------------
// Cell parsers: each returns a message that the caller prefixes with the column.
// ---------------------------------------------------------------------------

fn parse_nonempty(cell: &str) -> Result<String, String> {
    if cell.is_empty() {
        Err("must not be empty".to_string())
    } else {
        Ok(cell.to_string())
    }
}

fn parse_u64(cell: &str) -> Result<u64, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    cell.parse()
        .map_err(|_| format!("`{cell}` is not a non-negative whole number"))
}

/// Whole GPUs, at least 1, small enough to count in milli-GPUs.
fn parse_whole_gpus(cell: &str) -> Result<u64, String> {
    let gpus = parse_u64(cell)?;
    if gpus == 0 {
        return Err("must be at least 1".to_string());
    }
    check_whole_gpus(gpus)
}

fn check_whole_gpus(gpus: u64) -> Result<u64, String> {
    if gpus > u64::MAX / MILLI_PER_GPU {
        Err(format!("`{gpus}` GPUs is too large"))
    } else {
        Ok(gpus)
    }
}

/// The largest number of seconds accepted (about 31.7 million years); keeps
/// float conversions exact enough and sums far from overflow.
const MAX_SECONDS: f64 = 1e15;

/// A non-negative number of seconds (whole or decimal) as an `f64`.
fn parse_seconds(cell: &str) -> Result<f64, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    let value: f64 = cell
        .parse()
        .map_err(|_| format!("`{cell}` is not a number"))?;
    if !value.is_finite() {
        Err(format!("`{cell}` is not a finite number"))
    } else if value < 0.0 {
        Err(format!("`{cell}` is negative"))
    } else if value > MAX_SECONDS {
        Err(format!("`{cell}` is too large"))
    } else {
        Ok(value)
    }
}

/// Seconds rounded up, at least 1 (a run time).
fn parse_seconds_ceil(cell: &str) -> Result<u64, String> {
    if let Ok(whole) = cell.parse::<u64>() {
        return Ok(whole.max(1));
    }
    // In range by `parse_seconds`, so the cast is exact.
    Ok((parse_seconds(cell)?.ceil() as u64).max(1))
}

/// Seconds rounded down (a point in time).
fn parse_seconds_floor(cell: &str) -> Result<u64, String> {
    if let Ok(whole) = cell.parse::<u64>() {
        return Ok(whole);
    }
    Ok(parse_seconds(cell)?.floor() as u64)
}

/// A GPU amount greater than 0 with at most three decimals (`0.25`, `2`, `8`).
fn parse_gpus(cell: &str) -> Result<Milli, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    let value: f64 = cell
        .parse()
        .map_err(|_| format!("`{cell}` is not a number"))?;
    if !value.is_finite() {
        return Err(format!("`{cell}` is not a finite number"));
    }
    if value < 0.0 {
        return Err(format!("`{cell}` is negative; GPUs must be greater than 0"));
    }
    if value == 0.0 {
        return Err(format!("`{cell}` is zero; GPUs must be greater than 0"));
    }
    match Milli::from_gpus_f64(value) {
        Some(Milli(0)) => Err(format!(
            "`{cell}` rounds to zero; GPUs must be greater than 0"
        )),
        Some(milli) => Ok(milli),
        None if value > 1e12 => Err(format!("`{cell}` is too large")),
        None => Err(format!(
            "`{cell}` is finer than 0.001 GPU (at most three decimals)"
        )),
    }
}

/// Parses `YYYY-MM-DD HH:MM:SS` (or with `T` between date and time) into
/// seconds since 1970-01-01 00:00:00, treating the time as UTC.
fn parse_datetime(cell: &str) -> Result<i64, String> {
    let bad = || format!("`{cell}` is not a date-time of the form YYYY-MM-DD HH:MM:SS");
    let bytes = cell.as_bytes();
    if bytes.len() != 19
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !matches!(bytes[10], b' ' | b'T')
        || bytes[13] != b':'
        || bytes[16] != b':'
    {
        return Err(bad());
    }
    let number = |from: usize, to: usize| -> Result<u32, String> {
        bytes[from..to].iter().try_fold(0u32, |acc, &b| {
            if b.is_ascii_digit() {
                Ok(acc * 10 + u32::from(b - b'0'))
            } else {
                Err(bad())
            }
        })
    };
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    if !(1..=12).contains(&month) {
        return Err(format!("`{cell}` has month {month}; expected 1..12"));
    }
    let month_days = days_in_month(year, month);
    if !(1..=month_days).contains(&day) {
        return Err(format!("`{cell}` has day {day}; expected 1..{month_days}"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!("`{cell}` has an invalid time of day"));
    }
    let days = days_from_civil(i64::from(year), month, day);
    Ok(days * 86_400 + i64::from(hour * 3600 + minute * 60 + second))
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`). `month` is 1..=12, `day` 1..=31.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

// ---------------------------------------------------------------------------
// Minimal CSV reading
// ---------------------------------------------------------------------------

/// A header column a format knows about.
struct Column {
    name: &'static str,
    kind: ColumnKind,
}

#[derive(PartialEq)]
enum ColumnKind {
    /// Must be present.
    Required,
    /// Used when present.
    Optional,
    /// Part of the format but not read; accepted when present.
    Ignored,
}

impl Column {
    const fn required(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Required,
        }
    }

    const fn optional(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Optional,
        }
    }

    const fn ignored(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Ignored,
        }
    }
}

/// Yields the non-blank lines of a file with their 1-based line numbers.
struct Reader<'a> {
    file: &'a str,
    lines: std::iter::Zip<std::str::Split<'a, char>, std::ops::RangeFrom<u64>>,
    fields: Vec<Cow<'a, str>>,
}

impl<'a> Reader<'a> {
    fn new(file: &'a str, content: &'a str) -> Reader<'a> {
        let content = content.strip_prefix('\u{feff}').unwrap_or(content);
        Reader {
            file,
            lines: content.split('\n').zip(1u64..),
            fields: Vec::new(),
        }
    }

    fn error(&self, line: u64, message: String) -> TraceError {
        TraceError {
            file: self.file.to_string(),
            line,
            message,
        }
    }

    /// The next non-blank line, without its line ending.
    fn next_line(&mut self) -> Option<(u64, &'a str)> {
        self.lines.by_ref().find_map(|(line, number)| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            (!line.trim().is_empty()).then_some((number, line))
        })
    }

    /// Reads the header line and checks that every required column is there.
    fn header(&mut self, columns: &[Column], expected: &str) -> Result<Header, TraceError> {
        let Some((number, line)) = self.next_line() else {
            return Err(self.error(
                1,
                format!("empty file; expected a header line with columns {expected}"),
            ));
        };
        let mut fields = Vec::new();
        split_fields(line, &mut fields).map_err(|message| self.error(number, message))?;
        let names: Vec<String> = fields.iter().map(|name| name.trim().to_string()).collect();
        let missing: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind == ColumnKind::Required)
            .map(|column| column.name)
            .filter(|name| !names.iter().any(|have| have == name))
            .collect();
        if !missing.is_empty() {
            let known = names
                .iter()
                .any(|name| columns.iter().any(|column| column.name == name));
            let message = if known {
                format!(
                    "header lacks column(s) {}; expected columns {expected}",
                    missing.join(",")
                )
            } else {
                format!("missing or wrong header `{line}`; expected columns {expected}")
            };
            return Err(self.error(number, message));
        }
        for (index, name) in names.iter().enumerate() {
            if names[..index].contains(name) {
                return Err(self.error(number, format!("duplicate column `{name}` in the header")));
            }
        }
        Ok(Header {
            file: self.file.to_string(),
            line: number,
            names,
        })
    }

    /// The next data row, checked to have as many fields as the header.
    fn next_row<'r>(&'r mut self, header: &Header) -> Result<Option<Row<'r, 'a>>, TraceError> {
        let Some((number, line)) = self.next_line() else {
            return Ok(None);
        };
        let mut fields = std::mem::take(&mut self.fields);
        let split = split_fields(line, &mut fields);
        self.fields = fields;
        split.map_err(|message| self.error(number, message))?;
        if self.fields.len() != header.names.len() {
            return Err(self.error(
                number,
                format!(
                    "expected {} fields as in the header ({}), found {}",
                    header.names.len(),
                    header.names.join(","),
                    self.fields.len()
                ),
            ));
        }
        Ok(Some(Row {
            file: self.file,
            line: number,
            fields: &self.fields,
        }))
    }
}

struct Header {
    file: String,
    line: u64,
    names: Vec<String>,
}

impl Header {
    /// The field index of a column, if the header has it.
    fn position(&self, column: &str) -> Option<usize> {
        self.names.iter().position(|name| name == column)
    }

    /// The field index of a required column (checked by [`Reader::header`]).
    fn index(&self, column: &str) -> Result<usize, TraceError> {
        self.position(column).ok_or_else(|| TraceError {
            file: self.file.clone(),
            line: self.line,
            message: format!("header lacks column {column}"),
        })
    }

    /// Fails when the header has columns that are not in `columns`.
    fn reject_unknown(&self, columns: &[Column]) -> Result<(), TraceError> {
        let unknown: Vec<&str> = self
            .names
            .iter()
            .map(String::as_str)
            .filter(|name| !columns.iter().any(|column| column.name == *name))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let required: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind == ColumnKind::Required)
            .map(|column| column.name)
            .collect();
        let optional: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind != ColumnKind::Required)
            .map(|column| column.name)
            .collect();
        let quoted: Vec<String> = unknown.iter().map(|name| format!("`{name}`")).collect();
        Err(TraceError {
            file: self.file.clone(),
            line: self.line,
            message: format!(
                "unknown column(s) {}; expected {} and optionally {}",
                quoted.join(", "),
                required.join(","),
                optional.join(",")
            ),
        })
    }
}

/// One data row; cells are trimmed.
struct Row<'r, 'a> {
    file: &'r str,
    line: u64,
    fields: &'r [Cow<'a, str>],
}

impl Row<'_, '_> {
    fn cell(&self, index: usize) -> &str {
        self.fields.get(index).map_or("", |cell| cell.trim())
    }

    fn error(&self, message: String) -> TraceError {
        TraceError {
            file: self.file.to_string(),
            line: self.line,
            message,
        }
    }

    fn column_error(&self, column: &str, message: String) -> TraceError {
        self.error(format!("column `{column}`: {message}"))
    }

    /// Parses the cell at `index`, naming `column` in any error.
    fn get<T>(
        &self,
        index: usize,
        column: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, TraceError> {
        parse(self.cell(index)).map_err(|message| self.column_error(column, message))
    }
}

/// Splits one line into fields. A field that starts with `"` runs to the
/// matching closing quote and may contain commas; `""` inside it is a quote.
fn split_fields<'a>(line: &'a str, out: &mut Vec<Cow<'a, str>>) -> Result<(), String> {
    out.clear();
    if !line.contains('"') {
        out.extend(line.split(',').map(Cow::Borrowed));
        return Ok(());
    }
    // Only ASCII `"` and `,` are searched for, so every index below is a char boundary.
    let bytes = line.as_bytes();
    let mut at = 0;
    loop {
        if bytes.get(at) != Some(&b'"') {
            match line[at..].find(',') {
                Some(offset) => {
                    out.push(Cow::Borrowed(&line[at..at + offset]));
                    at += offset + 1;
                    continue;
                }
                None => {
                    out.push(Cow::Borrowed(&line[at..]));
                    return Ok(());
                }
            }
        }
        let field = out.len() + 1;
        let mut value = String::new();
        at += 1;
        loop {
            let Some(offset) = line[at..].find('"') else {
                return Err(format!("field {field}: quoted field has no closing quote"));
            };
            value.push_str(&line[at..at + offset]);
            at += offset + 1;
            if bytes.get(at) == Some(&b'"') {
                value.push('"');
                at += 1;
            } else {
                break;
            }
        }
        out.push(Cow::Owned(value));
        match bytes.get(at) {
            None => return Ok(()),
            Some(b',') => at += 1,
            Some(_) => {
                return Err(format!(
                    "field {field}: unexpected text after the closing quote"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    fn manifest_path(relative: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
    }

    fn parse_err(content: &str, format: TraceFormat) -> TraceError {
        match parse_trace("t.csv", content, format) {
            Ok(trace) => panic!("expected an error, got {trace:?}"),
            Err(error) => error,
        }
    }

    fn assert_err(content: &str, format: TraceFormat, line: u64, needle: &str) {
        let error = parse_err(content, format);
        assert_eq!(error.file, "t.csv");
        assert_eq!(error.line, line, "{error}");
        assert!(
            error.message.contains(needle),
            "`{error}` should contain `{needle}`"
        );
    }

    const PHILLY_HEADER: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n";
    const OPENB_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

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
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(1600, 2, 29), -135_081);
        assert_eq!(parse_datetime("2017-09-04 10:30:41"), Ok(1_504_521_041));
        assert_eq!(parse_datetime("2016-02-29T23:59:59"), Ok(1_456_790_399));
        assert!(parse_datetime("2017-02-29 00:00:00").is_err());
        assert!(parse_datetime("2017-13-01 00:00:00").is_err());
        assert!(parse_datetime("2017-01-01 24:00:00").is_err());
        assert!(parse_datetime("2017-1-01 00:00:00").is_err());
        assert!(parse_datetime("2017-01-01 00:00:0x").is_err());
        assert!(parse_datetime("2017-01-01 00:00:00é").is_err());
    }

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

    #[test]
    fn split_fields_handles_quotes() {
        let mut out = Vec::new();
        split_fields("a,\"b,c\",\"\"\"", &mut out).unwrap_err();
        split_fields(r#"a,"b,c","say ""hi""",,"""",x"#, &mut out).unwrap();
        assert_eq!(out, ["a", "b,c", r#"say "hi""#, "", "\"", "x"]);
        split_fields(r#""",a,"#, &mut out).unwrap();
        assert_eq!(out, ["", "a", ""]);
        split_fields(r#"x"y,z"#, &mut out).unwrap();
        assert_eq!(out, [r#"x"y"#, "z"]);
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

    /// The whole Philly trace from the shared data directory, when present.
    #[test]
    fn full_philly_trace_matches_source_md() {
        let path = manifest_path("../../../shared/traces/philly-vc-pollux/philly.csv");
        let Ok(content) = std::fs::read_to_string(&path) else {
            println!("skipping: {} not found", path.display());
            return;
        };
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

    /// The whole openb pod list from the shared data directory, when present.
    #[test]
    fn full_openb_trace_matches_source_md() {
        let path = manifest_path(
            "../../../shared/traces/alibaba-gpu-v2023-openb/openb_pod_list_default.csv",
        );
        let Ok(content) = std::fs::read_to_string(&path) else {
            println!("skipping: {} not found", path.display());
            return;
        };
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
