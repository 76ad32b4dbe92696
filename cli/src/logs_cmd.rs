//! `axle logs`: a workload's output, read piece by piece from the hub.
//! What the workload wrote to stderr goes to this command's stderr (in red
//! on a terminal), the rest to stdout, so `2>/dev/null` keeps only stdout
//! and `2>&1` shows both in order, as `docker logs` does.

use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;

use axle_proto::api::{LogTimeView, LogsView};
use clap::Args;

use crate::args::parse_workload_id;
use crate::client::Client;
use crate::workload_cmd::{POLL_PERIOD, now_ms};

#[derive(Args)]
pub struct LogsArgs {
    #[arg(value_parser = parse_workload_id)]
    id: u64,
    /// Keep printing new output until the workload finishes; then exit
    /// with its outcome (0 if it succeeded, 1 if not).
    #[arg(short = 'f', long)]
    follow: bool,
    /// Only the last N lines of the output so far (then follow, with -f).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only output that reached the hub in this last stretch (90s, 10m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = crate::args::parse_duration_s)]
    since: Option<u64>,
    /// Start every line with the time it reached the hub (RFC 3339, to the
    /// second).
    #[arg(long)]
    timestamps: bool,
}

/// Puts the arrival time in front of every line of a log read piece by
/// piece.
#[derive(Debug)]
pub struct Stamper {
    at_line_start: bool,
    /// The time of the latest index entry passed.
    last_ms: Option<u64>,
}

impl Default for Stamper {
    fn default() -> Stamper {
        Stamper::new()
    }
}

impl Stamper {
    pub fn new() -> Stamper {
        Stamper {
            at_line_start: true,
            last_ms: None,
        }
    }

    /// `data` as read from `offset`, with `times` (offset, at_ms) ascending.
    pub fn stamp(&mut self, data: &str, offset: u64, times: &[LogTimeView]) -> String {
        let mut out = String::with_capacity(data.len() + data.len() / 8);
        let mut next = times.iter().peekable();
        for (i, c) in data.char_indices() {
            let at = offset + i as u64;
            while let Some(t) = next.peek() {
                if t.offset > at {
                    break;
                }
                self.last_ms = Some(t.at_ms);
                next.next();
            }
            if self.at_line_start {
                match self.last_ms {
                    Some(ms) => {
                        out.push_str(&crate::table::fmt_timestamp(ms).replacen(' ', "T", 1));
                        out.push(' ');
                    }
                    None => out.push_str("-                        "),
                }
            }
            out.push(c);
            self.at_line_start = c == '\n';
        }
        out
    }
}

/// The last `n` lines of `text` (a trailing newline ends the last line).
pub fn last_lines(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    let body = text.strip_suffix('\n').unwrap_or(text);
    match body.rmatch_indices('\n').nth(n - 1) {
        Some((i, _)) => &text[i + 1..],
        None => text,
    }
}

/// Log text and the parts of it that are stderr.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogText {
    pub text: String,
    /// [start, end) byte positions in `text`, ascending, on char boundaries.
    pub stderr: Vec<(usize, usize)>,
}

impl LogText {
    /// A hub answer's text; marks that are not ascending char-boundary
    /// ranges inside the text are dropped (that part shows as stdout).
    pub fn of(chunk: &LogsView) -> LogText {
        let text = chunk.data.clone();
        let mut stderr: Vec<(usize, usize)> = Vec::new();
        for &[a, b] in &chunk.stderr {
            let (Ok(a), Ok(b)) = (usize::try_from(a), usize::try_from(b)) else {
                continue;
            };
            let fits = a < b
                && b <= text.len()
                && text.is_char_boundary(a)
                && text.is_char_boundary(b)
                && stderr.last().is_none_or(|&(_, end)| end <= a);
            if fits {
                stderr.push((a, b));
            }
        }
        LogText { text, stderr }
    }

    /// Appends text of one stream.
    fn push_str(&mut self, s: &str, is_stderr: bool) {
        let start = self.text.len();
        self.text.push_str(s);
        if !is_stderr || s.is_empty() {
            return;
        }
        match self.stderr.last_mut() {
            Some(last) if last.1 == start => last.1 = self.text.len(),
            _ => self.stderr.push((start, self.text.len())),
        }
    }

    pub fn push(&mut self, other: &LogText) {
        for (is_stderr, s) in other.segments() {
            self.push_str(s, is_stderr);
        }
    }

    /// The text in order, as (is stderr, text) runs.
    pub fn segments(&self) -> impl Iterator<Item = (bool, &str)> {
        let mut out = Vec::with_capacity(self.stderr.len() * 2 + 1);
        let mut at = 0;
        for &(a, b) in &self.stderr {
            if a > at {
                out.push((false, &self.text[at..a]));
            }
            out.push((true, &self.text[a..b]));
            at = b;
        }
        if at < self.text.len() {
            out.push((false, &self.text[at..]));
        }
        out.into_iter()
    }

    /// With every line stamped (the text read from `offset`).
    fn stamped(&self, stamper: &mut Stamper, offset: u64, times: &[LogTimeView]) -> LogText {
        let mut out = LogText::default();
        let mut at = 0u64;
        for (is_stderr, s) in self.segments() {
            out.push_str(&stamper.stamp(s, offset + at, times), is_stderr);
            at += s.len() as u64;
        }
        out
    }

    /// The last `n` lines.
    pub fn last_lines(&self, n: usize) -> LogText {
        let from = self.text.len() - last_lines(&self.text, n).len();
        LogText {
            text: self.text[from..].to_string(),
            stderr: self
                .stderr
                .iter()
                .filter(|&&(_, b)| b > from)
                .map(|&(a, b)| (a.max(from) - from, b - from))
                .collect(),
        }
    }
}

/// Where log text goes: stdout, and stderr for the workload's stderr.
struct Sink {
    /// Show stderr in red (it goes to a terminal, and NO_COLOR is unset).
    color: bool,
}

impl Sink {
    fn new() -> Sink {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Sink {
            color: std::io::stderr().is_terminal() && !no_color,
        }
    }

    /// Writes in order; false once a reader has left (`axle logs 3 | head`:
    /// that is not a failure).
    fn write(&self, t: &LogText) -> std::io::Result<bool> {
        for (is_stderr, s) in t.segments() {
            let r = if is_stderr {
                let mut err = std::io::stderr().lock();
                if self.color {
                    write!(err, "\x1b[31m{s}\x1b[0m")
                } else {
                    err.write_all(s.as_bytes())
                }
                .and_then(|()| err.flush())
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(s.as_bytes()).and_then(|()| out.flush())
            };
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(false),
                other => other?,
            }
        }
        Ok(true)
    }
}

pub async fn logs(client: &Client, a: LogsArgs) -> anyhow::Result<ExitCode> {
    let sink = Sink::new();
    let mut offset = 0;
    let mut since_ms = a
        .since
        .map(|s| now_ms().saturating_sub(s.saturating_mul(1000)));
    let mut stamper = a.timestamps.then(Stamper::new);
    // With --tail, what exists now is gathered first and only its end shown.
    let mut held: Option<LogText> = a.tail.map(|_| LogText::default());
    loop {
        let chunk = client
            .logs(a.id, offset, since_ms.take(), a.timestamps)
            .await?;
        let offset_read = chunk.offset;
        let text = LogText::of(&chunk);
        let text = match &mut stamper {
            Some(s) => text.stamped(s, chunk.offset, &chunk.times),
            None => text,
        };
        if !text.text.is_empty() {
            match &mut held {
                Some(buf) => buf.push(&text),
                None => {
                    if !sink.write(&text)? {
                        return Ok(ExitCode::SUCCESS);
                    }
                }
            }
        }
        let advanced = chunk.next_offset > offset_read;
        offset = chunk.next_offset;
        if advanced {
            // More may already be there: read on without waiting.
            continue;
        }
        if let (Some(buf), Some(n)) = (held.take(), a.tail)
            && !sink.write(&buf.last_lines(n))?
        {
            return Ok(ExitCode::SUCCESS);
        }
        if !a.follow {
            return Ok(ExitCode::SUCCESS);
        }
        if chunk.complete {
            let w = client.workload(a.id).await?;
            return Ok(if w.state == "Succeeded" {
                ExitCode::SUCCESS
            } else {
                eprintln!("workload {} ended {}", a.id, w.state);
                ExitCode::from(crate::exit::REFUSED_OR_FAILED)
            });
        }
        tokio::time::sleep(POLL_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_gets_the_time_its_bytes_reached_the_hub() {
        let t = |offset, at_ms| LogTimeView { offset, at_ms };
        let mut s = Stamper::new();
        // Bytes 0.. arrived at :20, bytes 4.. ("two" on) at :21.
        let out = s.stamp(
            "one\ntwo\nthr",
            0,
            &[t(0, 1_700_000_000_000), t(4, 1_700_000_001_000)],
        );
        assert_eq!(
            out,
            "2023-11-14T22:13:20.000Z one\n2023-11-14T22:13:21.000Z two\n2023-11-14T22:13:21.000Z thr"
        );
        // The next piece continues the line: no stamp in the middle of it.
        let out = s.stamp(
            "ee\nfour\n",
            11,
            &[t(6, 1_700_000_001_000), t(14, 1_700_000_002_000)],
        );
        assert_eq!(out, "ee\n2023-11-14T22:13:22.000Z four\n");
    }

    #[test]
    fn last_lines_of_a_log() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(last_lines("a\nb\n", 5), "a\nb\n");
        assert_eq!(last_lines("a\nb\n", 0), "");
        assert_eq!(last_lines("", 3), "");
    }

    fn chunk(data: &str, stderr: &[[u64; 2]]) -> LogsView {
        LogsView {
            workload: 1,
            offset: 0,
            data: data.into(),
            next_offset: data.len() as u64,
            complete: false,
            times: Vec::new(),
            stderr: stderr.to_vec(),
        }
    }

    #[test]
    fn stderr_is_kept_apart_through_stamps_and_tails() {
        let t = LogText::of(&chunk("out\nerr\nout2\n", &[[4, 8]]));
        let segs: Vec<(bool, &str)> = t.segments().collect();
        assert_eq!(segs, [(false, "out\n"), (true, "err\n"), (false, "out2\n")]);
        let mut s = Stamper::new();
        let stamped = t.stamped(
            &mut s,
            0,
            &[LogTimeView {
                offset: 0,
                at_ms: 1_700_000_000_000,
            }],
        );
        let segs: Vec<(bool, &str)> = stamped.segments().collect();
        assert_eq!(segs[1], (true, "2023-11-14T22:13:20.000Z err\n"));
        let tail = t.last_lines(2);
        assert_eq!(
            tail.segments().collect::<Vec<_>>(),
            [(true, "err\n"), (false, "out2\n")]
        );
        // Two reads in a row of stderr join up.
        let mut all = LogText::default();
        all.push(&LogText::of(&chunk("a", &[[0, 1]])));
        all.push(&LogText::of(&chunk("b", &[[0, 1]])));
        assert_eq!(all.stderr, [(0, 2)]);
    }

    #[test]
    fn marks_that_do_not_fit_the_text_are_dropped() {
        // Beyond the text, inside a character, backwards, overlapping.
        let t = LogText::of(&chunk("é\nab", &[[0, 1], [3, 9], [4, 3], [2, 4], [3, 5]]));
        assert_eq!(t.stderr, [(2, 4)]);
    }
}
