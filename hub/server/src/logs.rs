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
    f.write_all(data).await
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
) -> Result<(), ChunkError> {
    let end = c.offset.saturating_add(c.data.len() as u64);
    if end > MAX_LOG_OFFSET {
        return Err(ChunkError::OffsetTooLarge {
            workload: c.workload_id,
            offset: c.offset,
        });
    }
    tokio::fs::create_dir_all(dir).await?;
    let (w, e) = (c.workload_id, c.epoch);
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
    if let Ok(m) = tokio::fs::metadata(&head).await {
        out.push((0, head, m.len()));
    }
    for k in segments(dir, workload, epoch).await? {
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
pub async fn read(
    dir: &Path,
    limits: LogLimits,
    workload: u64,
    max_epoch: u64,
    offset: u64,
) -> std::io::Result<(Vec<u8>, u64)> {
    let mut base = 0u64;
    let mut out = Vec::new();
    let mut pos = offset;
    for epoch in 1..=max_epoch {
        let (pieces, total) = pieces(dir, limits, workload, epoch).await?;
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
            out.extend_from_slice(&buf);
            pos += want;
        }
        base += total;
    }
    Ok((out, pos))
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

    fn chunk(offset: u64, data: &[u8]) -> pb::LogChunk {
        pb::LogChunk {
            workload_id: 7,
            epoch: 1,
            offset,
            data: data.to_vec(),
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
        write_chunk(d.path(), l, &chunk(0, b"hello "))
            .await
            .unwrap();
        write_chunk(d.path(), l, &chunk(6, b"world\n"))
            .await
            .unwrap();
        // A re-sent chunk changes nothing.
        write_chunk(d.path(), l, &chunk(0, b"hello "))
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
            write_chunk(d.path(), l, &chunk(i * 100, &line))
                .await
                .unwrap();
        }
        let mut disk = 0;
        let mut rd = std::fs::read_dir(d.path()).unwrap();
        while let Some(Ok(e)) = rd.next() {
            disk += e.metadata().unwrap().len();
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
        let e = write_chunk(d.path(), LogLimits::default(), &chunk(1 << 50, b"x"))
            .await
            .unwrap_err();
        assert!(matches!(e, ChunkError::OffsetTooLarge { .. }), "{e}");
        assert!(std::fs::read_dir(d.path()).map_or(true, |mut r| r.next().is_none()));
    }
}
