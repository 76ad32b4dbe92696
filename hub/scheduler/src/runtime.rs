//! Observed run times, as bounded histograms: per (team, priority class,
//! name prefix) and per (team, priority class). When a running workload
//! names no max runtime, the start estimate of whatever waits behind it
//! uses the median of the earlier runs of its kind — the hub feeds its
//! finished workloads in, the simulator its finished jobs. Pure: no clock,
//! no I/O; the caller says what finished and how long it ran.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Histograms kept, over all keys: each is `BUCKETS` counters (~400
/// bytes), so 10,000 keys hold ~4 MB whatever the hub's history. Past it,
/// the key updated longest ago is forgotten.
pub const MAX_RUNTIME_KEYS: usize = 10_000;

/// Runs a histogram needs before it estimates: one or two runs say little
/// about the next.
pub const MIN_RUNS_FOR_ESTIMATE: u32 = 3;

/// Buckets per doubling of the run time: a bucket's midpoint is within
/// ±9 % of any run time in it.
const BUCKETS_PER_OCTAVE: f64 = 4.0;

/// Buckets in all: from 1 s up to 2^25 s (over a year) at 4 per octave.
const BUCKETS: usize = 100;

/// What a workload's run is expected to take, and what that rests on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeEstimate {
    /// The median run.
    pub seconds: u64,
    /// `212 earlier runs of sweep-*` (shown in reasons).
    pub basis: String,
    /// The deciles of the earlier runs (p10 … p100), so a run that has
    /// already lasted longer than the median is expected to end at the
    /// median of the runs that lasted as long.
    #[serde(default)]
    pub deciles: Vec<u64>,
}

impl RuntimeEstimate {
    /// Seconds from its start a run that has lasted `elapsed_s` is
    /// expected to end at: the median of the earlier runs longer than
    /// that; past every earlier run, a tenth more (at least a minute).
    pub fn expected_end_s(&self, elapsed_s: u64) -> u64 {
        if elapsed_s < self.seconds {
            return self.seconds;
        }
        let longer: Vec<u64> = self
            .deciles
            .iter()
            .copied()
            .filter(|&d| d > elapsed_s)
            .collect();
        match longer.get(longer.len() / 2) {
            Some(&d) => d,
            None => elapsed_s + (elapsed_s / 10).max(60),
        }
    }
}

#[derive(Debug, Clone)]
struct Histogram {
    counts: [u32; BUCKETS],
    runs: u32,
    /// When it was last updated (the stats' own counter), to forget the
    /// stalest key first.
    touched: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: [0; BUCKETS],
            runs: 0,
            touched: 0,
        }
    }

    fn bucket(seconds: u64) -> usize {
        let s = seconds.max(1) as f64;
        ((s.log2() * BUCKETS_PER_OCTAVE) as usize).min(BUCKETS - 1)
    }

    fn add(&mut self, seconds: u64) {
        self.counts[Self::bucket(seconds)] = self.counts[Self::bucket(seconds)].saturating_add(1);
        self.runs = self.runs.saturating_add(1);
    }

    /// The run time below which `q` (0–1] of the runs fall: the geometric
    /// midpoint of its bucket.
    fn quantile(&self, q: f64) -> u64 {
        let want = ((f64::from(self.runs) * q).ceil() as u32).max(1);
        let mut seen = 0u32;
        for (i, &c) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(c);
            if seen >= want {
                let mid = (i as f64 + 0.5) / BUCKETS_PER_OCTAVE;
                return mid.exp2().round() as u64;
            }
        }
        0
    }

    fn median(&self) -> u64 {
        self.quantile(0.5)
    }

    fn deciles(&self) -> Vec<u64> {
        (1..=10)
            .map(|d| self.quantile(f64::from(d) / 10.0))
            .collect()
    }
}

/// The prefix that groups runs of one kind: a name with its trailing
/// counter, date or index cut off (`sweep-4` → `sweep-*`, `llm-2026-12-07`
/// → `llm-*`); a name without one is its own prefix.
pub fn name_prefix(name: &str) -> String {
    let cut = name.trim_end_matches(|c: char| c.is_ascii_digit() || "-_.:".contains(c));
    if cut.len() == name.len() || cut.is_empty() {
        name.to_string()
    } else {
        let sep = &name[cut.len()..];
        let sep = sep.chars().next().filter(|c| "-_.:".contains(*c));
        match sep {
            Some(c) => format!("{cut}{c}*"),
            None => format!("{cut}*"),
        }
    }
}

/// Key: (team, priority class, name prefix); an empty prefix is the
/// team's and class's own histogram.
type Key = (String, String, String);

/// Run-time histograms, bounded by [`MAX_RUNTIME_KEYS`].
#[derive(Debug, Clone, Default)]
pub struct RuntimeStats {
    by_key: BTreeMap<Key, Histogram>,
    clock: u64,
}

impl RuntimeStats {
    pub fn new() -> RuntimeStats {
        RuntimeStats::default()
    }

    /// Records a finished run of `seconds` of workload `name`.
    pub fn record(&mut self, team: &str, class: &str, name: &str, seconds: u64) {
        let prefix = name_prefix(name);
        // A name without a prefix of its own counts once, in the team's.
        let keys = if prefix.is_empty() {
            vec![String::new()]
        } else {
            vec![prefix, String::new()]
        };
        for p in keys {
            self.clock += 1;
            let key = (team.to_string(), class.to_string(), p);
            if !self.by_key.contains_key(&key) && self.by_key.len() >= MAX_RUNTIME_KEYS {
                let stalest = self
                    .by_key
                    .iter()
                    .min_by_key(|(_, h)| h.touched)
                    .map(|(k, _)| k.clone());
                if let Some(k) = stalest {
                    self.by_key.remove(&k);
                }
            }
            let h = self.by_key.entry(key).or_insert_with(Histogram::new);
            h.add(seconds);
            h.touched = self.clock;
        }
    }

    /// What a run of `name` is expected to take: the median of the earlier
    /// runs with its name prefix, else of its team's work of that class,
    /// once either has [`MIN_RUNS_FOR_ESTIMATE`] runs.
    pub fn estimate(&self, team: &str, class: &str, name: &str) -> Option<RuntimeEstimate> {
        let prefix = name_prefix(name);
        let of = |p: &str| {
            self.by_key
                .get(&(team.to_string(), class.to_string(), p.to_string()))
                .filter(|h| h.runs >= MIN_RUNS_FOR_ESTIMATE)
        };
        if !prefix.is_empty()
            && let Some(h) = of(&prefix)
        {
            return Some(RuntimeEstimate {
                seconds: h.median(),
                basis: format!("{} earlier runs of `{prefix}`", h.runs),
                deciles: h.deciles(),
            });
        }
        of("").map(|h| RuntimeEstimate {
            seconds: h.median(),
            basis: format!("{} earlier {class} runs of team {team}", h.runs),
            deciles: h.deciles(),
        })
    }

    /// Histograms kept.
    pub fn keys(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_group_numbered_runs() {
        assert_eq!(name_prefix("sweep-4"), "sweep-*");
        assert_eq!(name_prefix("sweep-12"), "sweep-*");
        assert_eq!(name_prefix("llm-2026-12-07"), "llm-*");
        assert_eq!(name_prefix("run7"), "run*");
        assert_eq!(name_prefix("notebook"), "notebook");
        assert_eq!(name_prefix("42"), "42");
    }

    #[test]
    fn the_median_of_a_kind_within_a_bucket() {
        let mut s = RuntimeStats::new();
        assert_eq!(s.estimate("nlp", "batch", "sweep-1"), None);
        for (i, secs) in [2300, 2400, 2500, 2450, 9000].iter().enumerate() {
            s.record("nlp", "batch", &format!("sweep-{i}"), *secs);
        }
        let e = s.estimate("nlp", "batch", "sweep-99").unwrap();
        assert!((2200..=2700).contains(&e.seconds), "{e:?}");
        assert_eq!(e.basis, "5 earlier runs of `sweep-*`");
        // Another name of the team's batch work: the team's histogram.
        let e = s.estimate("nlp", "batch", "eval").unwrap();
        assert_eq!(e.basis, "5 earlier batch runs of team nlp");
        // Another team: nothing known.
        assert_eq!(s.estimate("vision", "batch", "sweep-1"), None);
    }

    #[test]
    fn keys_are_bounded() {
        let mut s = RuntimeStats::new();
        for i in 0..(MAX_RUNTIME_KEYS + 50) {
            s.record("t", "batch", &format!("job{i}x"), 60);
        }
        assert!(s.keys() <= MAX_RUNTIME_KEYS);
        // The team's own histogram is touched by every run: never the stalest.
        assert!(s.estimate("t", "batch", "other").is_some());
    }
}
