//! Workload logs on the hub: spokes stream chunks up their session; the hub
//! keeps each (workload, epoch) log under `<data-dir>/logs/` and serves the
//! epochs of a workload concatenated, addressed by byte offset.
//!
//! A log is bounded: its head (the first `head` bytes) is kept in
//! `<w>-<e>.log`, and beyond it only the most recent bytes, in tail
//! segments `<w>-<e>.tail.<k>` of `segment` bytes each holding bytes
//! `[head + k·segment, head + (k+1)·segment)`; at most two segments are
//! kept, so a log takes at most `head + 2·segment` bytes of disk however
//! much a workload prints. A reader crossing the bytes that were cut gets
//! one line saying how many, then the tail.
//!
//! Beside each log, two bounded indexes: when its parts arrived
//! (`<w>-<e>.times`) and which bytes the workload wrote to stderr
//! (`<w>-<e>.stderr`).

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use axle_proto::pb;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Largest log slice one request returns; `axle logs -f` asks again from the
/// next offset.
pub const MAX_LOG_READ: u64 = 1 << 20;

/// Bytes kept of one run's log by default: 64 MiB — every traceback and
/// far more than anyone reads in a terminal — split as 32 MiB of head and
/// 16–32 MiB of the most recent output.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 << 20;

/// Highest log offset a spoke may write at: a spoke reports offsets of
/// real output, and a larger one (e.g. 1 TB) is refused rather than turned
/// into a sparse file. A workload printing at 100 MB/s for a week stays
/// under it.
pub const MAX_LOG_OFFSET: u64 = 1 << 46;

/// How a log is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Bytes kept from the start.
    pub head: u64,
    /// Size of one tail segment (two are kept).
    pub segment: u64,
}

impl LogLimits {
    /// Limits that keep at most `max` bytes.
    pub fn within(max: u64) -> LogLimits {
        let max = max.max(4);
        LogLimits {
            head: max / 2,
            segment: max / 4,
        }
    }
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits::within(DEFAULT_MAX_LOG_BYTES)
    }
}

pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("logs")
}

fn head_file(dir: &Path, workload: u64, epoch: u64) -> PathBuf {
    dir.join(format!("{workload}-{epoch}.log"))
}

/// When each part of a log arrived: (offset, hub time in ms) pairs, 16
/// bytes each, at most one per [`TIME_INDEX_EVERY_MS`].
fn times_file(dir: &Path, workload: u64, epoch: u64) -> PathBuf {
    dir.join(format!("{workload}-{epoch}.times"))
}

/// One time-index entry per second of output at most: `axle logs
/// --timestamps` and `--since` are exact to the second, and a week-long
/// run's index stays under 10 MB.
pub const TIME_INDEX_EVERY_MS: u64 = 1000;

/// Entries kept per run's time index: a week of one per second.
pub const MAX_TIME_ENTRIES: u64 = 7 * 24 * 3600;

/// When a part of a workload's log arrived at the hub: `offset` in the
/// workload's whole log (all runs), `at_ms` hub time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogTime {
    pub offset: u64,
    pub at_ms: u64,
}

/// The two indexes beside a log are files of (u64, u64) entries, 16 bytes
/// each, little-endian.
const ENTRY_BYTES: u64 = 16;

fn decode_entry(c: &[u8]) -> (u64, u64) {
    (
        u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(c[8..16].try_into().expect("8 bytes")),
    )
}

/// Every entry of an index file (none when it does not exist).
async fn read_entries(path: &Path) -> std::io::Result<Vec<(u64, u64)>> {
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(bytes
        .chunks_exact(ENTRY_BYTES as usize)
        .map(decode_entry)
        .collect())
}

/// The length of an index file in whole entries, in bytes, and its last
/// entry, if any.
async fn last_entry(path: &Path) -> std::io::Result<(u64, Option<(u64, u64)>)> {
    let len = tokio::fs::metadata(path).await.map_or(0, |m| m.len());
    let len = len - len % ENTRY_BYTES;
    if len < ENTRY_BYTES {
        return Ok((len, None));
    }
    let mut f = tokio::fs::File::open(path).await?;
    f.seek(SeekFrom::Start(len - ENTRY_BYTES)).await?;
    let mut last = [0u8; ENTRY_BYTES as usize];
    f.read_exact(&mut last).await?;
    Ok((len, Some(decode_entry(&last))))
}

/// Writes `entries` at byte `at` of an index file (created if missing).
async fn write_entries(path: &Path, at: u64, entries: &[(u64, u64)]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(entries.len() * ENTRY_BYTES as usize);
    for (a, b) in entries {
        buf.extend_from_slice(&a.to_le_bytes());
        buf.extend_from_slice(&b.to_le_bytes());
    }
    write_at(path, at, &buf).await
}

async fn read_times(dir: &Path, workload: u64, epoch: u64) -> std::io::Result<Vec<LogTime>> {
    Ok(read_entries(&times_file(dir, workload, epoch))
        .await?
        .into_iter()
        .map(|(offset, at_ms)| LogTime { offset, at_ms })
        .collect())
}

/// Notes that the bytes from `offset` arrived at `at_ms`, unless the last
/// entry is less than [`TIME_INDEX_EVERY_MS`] older or at a later offset
/// (a re-sent chunk).
async fn note_time(dir: &Path, w: u64, e: u64, offset: u64, at_ms: u64) -> std::io::Result<()> {
    let path = times_file(dir, w, e);
    let (len, last) = last_entry(&path).await?;
    if len >= MAX_TIME_ENTRIES * ENTRY_BYTES {
        return Ok(());
    }
    if let Some((last_offset, last_at)) = last
        && (offset <= last_offset || at_ms < last_at.saturating_add(TIME_INDEX_EVERY_MS))
    {
        return Ok(());
    }
    write_entries(&path, len, &[(offset, at_ms)]).await
}

/// Which bytes of a run's log are stderr: [start, end) offset pairs, 16
/// bytes each, ascending; touching ranges are merged.
fn stderr_file(dir: &Path, workload: u64, epoch: u64) -> PathBuf {
    dir.join(format!("{workload}-{epoch}.stderr"))
}

/// Stderr ranges kept per run (4 MiB of index): a workload that switches
/// streams more often than this has its later stderr shown as stdout.
pub const MAX_STDERR_RANGES: u64 = 1 << 18;

async fn read_stderr(dir: &Path, workload: u64, epoch: u64) -> std::io::Result<Vec<(u64, u64)>> {
    read_entries(&stderr_file(dir, workload, epoch)).await
}

/// The stderr marks of a chunk as [start, end) log offsets; an error names
/// what is wrong with them.
fn stderr_ranges(c: &pb::LogChunk) -> Result<Vec<(u64, u64)>, String> {
    if !c.stderr.len().is_multiple_of(2) {
        return Err(format!("{} stderr positions, not pairs", c.stderr.len()));
    }
    let len = c.data.len() as u64;
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(c.stderr.len() / 2);
    for pair in c.stderr.chunks_exact(2) {
        let (a, b) = (pair[0], pair[1]);
        if a >= b || b > len || out.last().is_some_and(|&(_, end)| a < end - c.offset) {
            return Err(format!(
                "stderr range [{a}, {b}) is empty, out of order or beyond the chunk's {len} bytes"
            ));
        }
        out.push((c.offset + a, c.offset + b));
    }
    Ok(out)
}

/// Appends a chunk's stderr ranges, unless they lie before the last one
/// (a re-sent chunk) or the index is full.
async fn note_stderr(dir: &Path, w: u64, e: u64, ranges: &[(u64, u64)]) -> std::io::Result<()> {
    let Some(&(first, _)) = ranges.first() else {
        return Ok(());
    };
    let path = stderr_file(dir, w, e);
    let (len, last) = last_entry(&path).await?;
    let mut ranges = ranges.to_vec();
    let mut at = len;
    if let Some((start, end)) = last {
        if first < end {
            return Ok(());
        }
        if first == end {
            // Continues the last range: rewrite it longer.
            ranges[0].0 = start;
            at = len - ENTRY_BYTES;
        }
    }
    let room = (MAX_STDERR_RANGES * ENTRY_BYTES).saturating_sub(at) / ENTRY_BYTES;
    ranges.truncate(room as usize);
    if ranges.is_empty() {
        return Ok(());
    }
    write_entries(&path, at, &ranges).await
}

fn tail_file(dir: &Path, workload: u64, epoch: u64, k: u64) -> PathBuf {
    dir.join(format!("{workload}-{epoch}.tail.{k}"))
}

/// A chunk refused before it touches the disk.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error(
        "log offset {offset} of workload {workload} is beyond the largest log Axle keeps track of ({MAX_LOG_OFFSET})"
    )]
    OffsetTooLarge { workload: u64, offset: u64 },
    #[error("log chunk of workload {workload} at offset {offset}: {why}")]
    BadStderrMarks {
        workload: u64,
        offset: u64,
        why: String,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

async fn write_at(path: &Path, at: u64, data: &[u8]) -> std::io::Result<()> {
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .await?;
    f.seek(SeekFrom::Start(at)).await?;
    f.write_all(data).await?;
    // tokio's `write_all` returns once the write is handed to a blocking
    // thread; without a flush the bytes may not be in the file yet when a
    // reader (or the next size check) looks — observed: a unit test's disk
    // total was short under load.
    f.flush().await
}

/// The tail segments of a log on disk, ascending.
async fn segments(dir: &Path, workload: u64, epoch: u64) -> std::io::Result<Vec<u64>> {
    let prefix = format!("{workload}-{epoch}.tail.");
    let mut out = Vec::new();
    let mut rd = match tokio::fs::read_dir(dir).await {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    while let Some(e) = rd.next_entry().await? {
        if let Some(k) = e
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|k| k.parse::<u64>().ok())
        {
            out.push(k);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Writes a chunk at its offset (idempotent: a re-sent chunk overwrites the
/// same bytes); bytes beyond the head go to the tail segments, and segments
/// older than the two most recent are deleted.
pub async fn write_chunk(
    dir: &Path,
    limits: LogLimits,
    c: &pb::LogChunk,
    at_ms: u64,
) -> Result<(), ChunkError> {
    let end = c.offset.saturating_add(c.data.len() as u64);
    if end > MAX_LOG_OFFSET {
        return Err(ChunkError::OffsetTooLarge {
            workload: c.workload_id,
            offset: c.offset,
        });
    }
    let stderr = stderr_ranges(c).map_err(|why| ChunkError::BadStderrMarks {
        workload: c.workload_id,
        offset: c.offset,
        why,
    })?;
    tokio::fs::create_dir_all(dir).await?;
    let (w, e) = (c.workload_id, c.epoch);
    if !c.data.is_empty() {
        note_time(dir, w, e, c.offset, at_ms).await?;
    }
    note_stderr(dir, w, e, &stderr).await?;
    let mut at = c.offset;
    let mut data: &[u8] = &c.data;
    if at < limits.head {
        let n = ((limits.head - at) as usize).min(data.len());
        write_at(&head_file(dir, w, e), at, &data[..n]).await?;
        at += n as u64;
        data = &data[n..];
    }
    let mut newest = None;
    while !data.is_empty() {
        let k = (at - limits.head) / limits.segment;
        let seg_start = limits.head + k * limits.segment;
        let n = ((seg_start + limits.segment - at) as usize).min(data.len());
        write_at(&tail_file(dir, w, e, k), at - seg_start, &data[..n]).await?;
        newest = Some(k);
        at += n as u64;
        data = &data[n..];
    }
    if let Some(k) = newest {
        for old in segments(dir, w, e).await? {
            if old + 1 < k {
                let _ = tokio::fs::remove_file(tail_file(dir, w, e, old)).await;
            }
        }
    }
    Ok(())
}

/// What one epoch's log holds: (start offset, path, length) pieces, and
/// its total length (the highest byte written).
async fn pieces(
    dir: &Path,
    limits: LogLimits,
    workload: u64,
    epoch: u64,
) -> std::io::Result<(Vec<(u64, PathBuf, u64)>, u64)> {
    let mut out = Vec::new();
    let head = head_file(dir, workload, epoch);
    let head_len = tokio::fs::metadata(&head).await.map(|m| m.len()).ok();
    if let Some(len) = head_len {
        out.push((0, head, len));
    }
    // Tail segments exist only once the head is full: no directory listing
    // (O(files)) for the common short log.
    let full = head_len.is_some_and(|l| l >= limits.head);
    let ks = if full {
        segments(dir, workload, epoch).await?
    } else {
        Vec::new()
    };
    for k in ks {
        let path = tail_file(dir, workload, epoch, k);
        if let Ok(m) = tokio::fs::metadata(&path).await {
            out.push((limits.head + k * limits.segment, path, m.len()));
        }
    }
    let total = out.iter().map(|(s, _, l)| s + l).max().unwrap_or(0);
    Ok((out, total))
}

/// Reads from `offset` of the concatenation of every epoch's log, oldest
/// first; where bytes were cut, one line says how many and the offset
/// moves past them.
#[cfg(test)]
pub async fn read(
    dir: &Path,
    limits: LogLimits,
    workload: u64,
    max_epoch: u64,
    offset: u64,
) -> std::io::Result<(Vec<u8>, u64)> {
    read_from(dir, limits, workload, max_epoch, Start::Offset(offset))
        .await
        .map(|r| (r.data, r.next))
}

/// Where a read starts.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    Offset(u64),
    /// The first output that arrived at or after this hub time.
    Since(u64),
}

/// What a read returns: the bytes from `offset`, the next offset, when
/// the parts of the returned range arrived (entries at or before `offset`
/// included, so the first line has a time too), and which bytes of `data`
/// are stderr.
#[derive(Debug, Clone, Default)]
pub struct Read {
    pub offset: u64,
    pub data: Vec<u8>,
    pub next: u64,
    pub times: Vec<LogTime>,
    /// [start, end) positions in `data`, ascending.
    pub stderr: Vec<(u64, u64)>,
}

/// [`read`] from an offset or a time, with the time index of the range.
pub async fn read_from(
    dir: &Path,
    limits: LogLimits,
    workload: u64,
    max_epoch: u64,
    start: Start,
) -> std::io::Result<Read> {
    // Runs in order with their place in the whole log.
    let mut runs = Vec::new();
    let mut base = 0u64;
    for epoch in 1..=max_epoch {
        let (pieces, total) = pieces(dir, limits, workload, epoch).await?;
        let times: Vec<LogTime> = read_times(dir, workload, epoch)
            .await?
            .into_iter()
            .map(|t| LogTime {
                offset: base + t.offset,
                at_ms: t.at_ms,
            })
            .collect();
        let stderr = read_stderr(dir, workload, epoch).await?;
        runs.push((base, pieces, times, stderr));
        base += total;
    }
    let offset = match start {
        Start::Offset(o) => o,
        Start::Since(ms) => runs
            .iter()
            .flat_map(|(_, _, t, _)| t)
            .find(|t| t.at_ms >= ms)
            .map_or(base, |t| t.offset),
    };
    let mut out = Vec::new();
    let mut marks: Vec<(u64, u64)> = Vec::new();
    let mut pos = offset;
    for (base, pieces, _, stderr) in &runs {
        let base = *base;
        for (start, path, len) in pieces {
            let (start, end) = (base + start, base + start + len);
            if (out.len() as u64) >= MAX_LOG_READ || end <= pos {
                continue;
            }
            if pos < start {
                out.extend_from_slice(
                    format!(
                        "\n[axle: {} bytes of this log were cut to keep it bounded]\n",
                        start - pos
                    )
                    .as_bytes(),
                );
                pos = start;
            }
            let mut f = tokio::fs::File::open(&path).await?;
            f.seek(SeekFrom::Start(pos - start)).await?;
            let want = (end - pos).min(MAX_LOG_READ.saturating_sub(out.len() as u64));
            let mut buf = vec![0u8; want as usize];
            f.read_exact(&mut buf).await?;
            // The stderr of [pos, pos + want), as positions in `out`.
            let at = out.len() as u64;
            let (lo, hi) = (pos - base, pos - base + want);
            let from = stderr.partition_point(|&(_, end)| end <= lo);
            for &(a, b) in stderr[from..].iter().take_while(|&&(a, _)| a < hi) {
                let (a, b) = (a.max(lo) - lo + at, b.min(hi) - lo + at);
                match marks.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => marks.push((a, b)),
                }
            }
            out.extend_from_slice(&buf);
            pos += want;
        }
    }
    let all: Vec<LogTime> = runs.into_iter().flat_map(|(_, _, t, _)| t).collect();
    // The last entry at or before `offset`, then those inside the range.
    let first = all.iter().rposition(|t| t.offset <= offset).unwrap_or(0);
    let times = all
        .into_iter()
        .skip(first)
        .take_while(|t| t.offset < pos.max(offset + 1))
        .collect();
    Ok(Read {
        offset,
        data: out,
        next: pos,
        times,
        stderr: marks,
    })
}

/// `data` as text (invalid UTF-8 replaced) with its stderr `marks` moved
/// to positions in that text.
pub fn lossy_text(data: &[u8], marks: &[(u64, u64)]) -> (String, Vec<[u64; 2]>) {
    let mut text = String::with_capacity(data.len());
    let mut out = Vec::with_capacity(marks.len());
    let mut at = 0usize;
    for &(a, b) in marks {
        let (a, b) = (a as usize, b as usize);
        if a < at || b > data.len() || a >= b {
            continue;
        }
        text.push_str(&String::from_utf8_lossy(&data[at..a]));
        let start = text.len() as u64;
        text.push_str(&String::from_utf8_lossy(&data[a..b]));
        out.push([start, text.len() as u64]);
        at = b;
    }
    text.push_str(&String::from_utf8_lossy(&data[at..]));
    (text, out)
}

/// Deletes every log file of the given workloads (all epochs, head and
/// tail segments) in one pass over the directory.
pub async fn forget(dir: &Path, workloads: &[u64]) -> std::io::Result<usize> {
    let ids: std::collections::BTreeSet<u64> = workloads.iter().copied().collect();
    let mut rd = match tokio::fs::read_dir(dir).await {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    while let Some(e) = rd.next_entry().await? {
        let name = e.file_name();
        let id = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(id, _)| id.parse::<u64>().ok());
        if id.is_some_and(|id| ids.contains(&id)) {
            match tokio::fs::remove_file(e.path()).await {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_time_index_maps_hub_time_to_offsets_across_runs() {
        let d = tempfile::tempdir().unwrap();
        let l = LogLimits::default();
        let c = |epoch, offset, data: &[u8]| pb::LogChunk {
            workload_id: 3,
            epoch,
            offset,
            data: data.to_vec(),
            stderr: Vec::new(),
        };
        write_chunk(d.path(), l, &c(1, 0, b"a\n"), 10_000)
            .await
            .unwrap();
        // Within a second of the last entry: not indexed.
        write_chunk(d.path(), l, &c(1, 2, b"b\n"), 10_500)
            .await
            .unwrap();
        write_chunk(d.path(), l, &c(1, 4, b"c\n"), 12_000)
            .await
            .unwrap();
        // A re-sent chunk does not move time back.
        write_chunk(d.path(), l, &c(1, 0, b"a\n"), 13_000)
            .await
            .unwrap();
        write_chunk(d.path(), l, &c(2, 0, b"d\n"), 20_000)
            .await
            .unwrap();
        let r = read_from(d.path(), l, 3, 2, Start::Offset(0))
            .await
            .unwrap();
        assert_eq!(r.data, b"a\nb\nc\nd\n");
        let at: Vec<(u64, u64)> = r.times.iter().map(|t| (t.offset, t.at_ms)).collect();
        assert_eq!(at, [(0, 10_000), (4, 12_000), (6, 20_000)]);
        let r = read_from(d.path(), l, 3, 2, Start::Since(11_000))
            .await
            .unwrap();
        assert_eq!((r.offset, r.data.as_slice()), (4, b"c\nd\n".as_slice()));
        let r = read_from(d.path(), l, 3, 2, Start::Since(99_000))
            .await
            .unwrap();
        assert_eq!((r.offset, r.data.len()), (8, 0), "nothing that new");
        assert_eq!(forget(d.path(), &[3]).await.unwrap(), 4, "logs and indexes");
    }

    fn chunk(offset: u64, data: &[u8]) -> pb::LogChunk {
        pb::LogChunk {
            workload_id: 7,
            epoch: 1,
            offset,
            data: data.to_vec(),
            stderr: Vec::new(),
        }
    }

    async fn read_all(dir: &Path, limits: LogLimits) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let (data, next) = read(dir, limits, 7, 1, at).await.unwrap();
            if next == at {
                return out;
            }
            out.extend_from_slice(&data);
            at = next;
        }
    }

    #[tokio::test]
    async fn a_log_within_its_head_reads_back_whole() {
        let d = tempfile::tempdir().unwrap();
        let l = LogLimits::within(1_000);
        write_chunk(d.path(), l, &chunk(0, b"hello "), 0)
            .await
            .unwrap();
        write_chunk(d.path(), l, &chunk(6, b"world\n"), 0)
            .await
            .unwrap();
        // A re-sent chunk changes nothing.
        write_chunk(d.path(), l, &chunk(0, b"hello "), 0)
            .await
            .unwrap();
        assert_eq!(read_all(d.path(), l).await, b"hello world\n");
    }

    #[tokio::test]
    async fn a_huge_log_keeps_its_head_and_recent_tail_and_says_what_was_cut() {
        // Observed: 100 MiB printed by one workload was stored in full,
        // forever. Here 100,000 bytes go to a log bounded at 1,000.
        let d = tempfile::tempdir().unwrap();
        let l = LogLimits::within(1_000); // head 500, segments of 250
        let line: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        for i in 0..1_000u64 {
            write_chunk(d.path(), l, &chunk(i * 100, &line), 0)
                .await
                .unwrap();
        }
        let mut disk = 0;
        let mut rd = std::fs::read_dir(d.path()).unwrap();
        while let Some(Ok(e)) = rd.next() {
            // The time index is bounded on its own (MAX_TIME_ENTRIES).
            if !e.file_name().to_string_lossy().ends_with(".times") {
                disk += e.metadata().unwrap().len();
            }
        }
        assert!(disk <= 1_000, "{disk} bytes on disk");
        let all = read_all(d.path(), l).await;
        let text = String::from_utf8_lossy(&all);
        assert!(all.starts_with(&line), "the head is kept");
        assert!(all.ends_with(&line), "the most recent output is kept");
        let cut = 100_000 - 500 - (disk - 500);
        assert!(
            text.contains(&format!("[axle: {cut} bytes of this log were cut")),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_offset_beyond_any_real_log_is_refused() {
        // Observed: a spoke could create a 1 TB sparse log file.
        let d = tempfile::tempdir().unwrap();
        let e = write_chunk(d.path(), LogLimits::default(), &chunk(1 << 50, b"x"), 0)
            .await
            .unwrap_err();
        assert!(matches!(e, ChunkError::OffsetTooLarge { .. }), "{e}");
        assert!(std::fs::read_dir(d.path()).map_or(true, |mut r| r.next().is_none()));
    }

    #[test]
    fn stderr_marks_follow_replaced_bytes_into_the_text() {
        // 0xff becomes U+FFFD (3 bytes): the mark after it moves by 2.
        let (text, marks) = lossy_text(b"a\xffb\nerr\n", &[(4, 8)]);
        assert_eq!(text, "a\u{fffd}b\nerr\n");
        assert_eq!(marks, [[6, 10]]);
        assert_eq!(&text[6..10], "err\n");
    }

    #[tokio::test]
    async fn stderr_marks_survive_runs_re_sends_and_the_cut() {
        let d = tempfile::tempdir().unwrap();
        let l = LogLimits::within(40); // head 20, segments of 10
        let c = |epoch, offset, data: &[u8], stderr: &[u64]| pb::LogChunk {
            workload_id: 9,
            epoch,
            offset,
            data: data.to_vec(),
            stderr: stderr.to_vec(),
        };
        // Run 1: "out\n" then "err\n" (stderr), then "err2\n" continuing it.
        write_chunk(d.path(), l, &c(1, 0, b"out\nerr\n", &[4, 8]), 0)
            .await
            .unwrap();
        write_chunk(d.path(), l, &c(1, 8, b"err2\n", &[0, 5]), 0)
            .await
            .unwrap();
        // Re-sent: no second mark.
        write_chunk(d.path(), l, &c(1, 8, b"err2\n", &[0, 5]), 0)
            .await
            .unwrap();
        assert_eq!(read_stderr(d.path(), 9, 1).await.unwrap(), [(4, 13)]);
        // Run 2 starts at byte 13 of the whole log.
        write_chunk(d.path(), l, &c(2, 0, b"E\nout\n", &[0, 2]), 0)
            .await
            .unwrap();
        let r = read_from(d.path(), l, 9, 2, Start::Offset(0))
            .await
            .unwrap();
        assert_eq!(r.data, b"out\nerr\nerr2\nE\nout\n");
        assert_eq!(r.stderr, [(4, 15)]);
        // From the middle of a range.
        let r = read_from(d.path(), l, 9, 2, Start::Offset(6))
            .await
            .unwrap();
        assert_eq!(r.stderr, [(0, 9)]);
        // Malformed marks are refused and change nothing.
        for bad in [&[0u64][..], &[2, 1], &[0, 99], &[3, 4, 1, 2]] {
            let e = write_chunk(d.path(), l, &c(3, 0, b"abcdef", bad), 0)
                .await
                .unwrap_err();
            assert!(matches!(e, ChunkError::BadStderrMarks { .. }), "{e}");
        }
        assert!(!d.path().join("9-3.log").exists());
        // Past the cut, marks map onto the text after the note.
        let d = tempfile::tempdir().unwrap();
        for i in 0..10u64 {
            write_chunk(d.path(), l, &c(1, i * 10, b"0123456789", &[8, 10]), 0)
                .await
                .unwrap();
        }
        let r = read_from(d.path(), l, 9, 1, Start::Offset(0))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&r.data).into_owned();
        let tail = text.rfind("cut to keep it bounded]\n").unwrap() + 24;
        let last = *r.stderr.last().unwrap();
        assert_eq!(&r.data[last.0 as usize..last.1 as usize], b"89");
        assert!(last.0 as usize > tail, "{text} {:?}", r.stderr);
    }
}
