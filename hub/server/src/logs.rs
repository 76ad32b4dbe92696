//! Workload logs on the hub: spokes stream chunks up their session; the hub
//! keeps one file per (workload, epoch) under `<data-dir>/logs/` and serves
//! the epochs of a workload concatenated, addressed by byte offset.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use axle_proto::pb;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Largest log slice one request returns; `axle logs -f` asks again from the
/// next offset.
pub const MAX_LOG_READ: u64 = 1 << 20;

pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("logs")
}

fn file(dir: &Path, workload: u64, epoch: u64) -> PathBuf {
    dir.join(format!("{workload}-{epoch}.log"))
}

/// Writes a chunk at its offset (idempotent: a re-sent chunk overwrites the same bytes).
pub async fn write_chunk(dir: &Path, c: &pb::LogChunk) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(file(dir, c.workload_id, c.epoch))
        .await?;
    f.seek(SeekFrom::Start(c.offset)).await?;
    f.write_all(&c.data).await?;
    Ok(())
}

/// Reads from `offset` of the concatenation of every epoch's log, oldest first.
pub async fn read(
    dir: &Path,
    workload: u64,
    max_epoch: u64,
    offset: u64,
) -> std::io::Result<(Vec<u8>, u64)> {
    let mut base = 0u64;
    let mut out = Vec::new();
    for epoch in 1..=max_epoch {
        let path = file(dir, workload, epoch);
        let len = match tokio::fs::metadata(&path).await {
            Ok(m) => m.len(),
            Err(_) => continue,
        };
        let end = base + len;
        if offset < end && (out.len() as u64) < MAX_LOG_READ {
            let start = offset.max(base) - base;
            let mut f = tokio::fs::File::open(&path).await?;
            f.seek(SeekFrom::Start(start)).await?;
            let want = (len - start).min(MAX_LOG_READ - out.len() as u64);
            let mut buf = vec![0u8; want as usize];
            f.read_exact(&mut buf).await?;
            out.extend_from_slice(&buf);
        }
        base = end;
    }
    let next = offset + out.len() as u64;
    Ok((out, next))
}
