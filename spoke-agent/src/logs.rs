//! Workload log plumbing: replica pipes → one log file per (workload, epoch)
//! and `LogChunk`s for the hub.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axle_proto::pb;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::event::Event;

/// Largest `LogChunk.data`: keeps one message far below gRPC's 4 MiB default
/// limit and lets log lines reach the hub in small, steady pieces.
pub const MAX_LOG_CHUNK_BYTES: usize = 64 * 1024;
/// Longest time output waits before it goes up as a chunk: small writes are
/// coalesced, yet `axle logs -f` still feels live.
pub const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// A line longer than this is split (with the prefix repeated), so a replica
/// that never prints a newline cannot make the spoke buffer without bound.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Bytes read from a pipe at once.
const PIPE_READ_BYTES: usize = 8 * 1024;
/// Pieces in flight from the pipes to the log writer; the pipes block (and so
/// do the replicas' writes) when the writer falls this far behind.
pub const LOG_PIPE_CHANNEL_CAPACITY: usize = 64;

/// Bytes of one run's log the spoke keeps on disk before the hub says (64
/// MiB, the policy's default `maxLogBytesPerWorkload`).
pub const DEFAULT_MAX_LOG_FILE_BYTES: u64 = 64 << 20;

/// The hub's `maxLogBytesPerWorkload`, from `Registered`: one value per
/// process, since every spoke of a process talks to one hub. The hub keeps
/// the head and the most recent tail of what it is sent; the spoke's own
/// file keeps the head, with a line saying where it was cut.
static MAX_LOG_FILE_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MAX_LOG_FILE_BYTES);

/// Sets the per-run log file cap (0 keeps the current one).
pub fn set_max_log_file_bytes(bytes: u64) {
    if bytes > 0 {
        MAX_LOG_FILE_BYTES.store(bytes, Ordering::Relaxed);
    }
}

pub fn max_log_file_bytes() -> u64 {
    MAX_LOG_FILE_BYTES.load(Ordering::Relaxed)
}

/// `<data_dir>/logs/<workload_id>-<epoch>.log`: a run's log file on the spoke.
pub fn log_path(data_dir: &Path, workload_id: u64, epoch: u64) -> std::path::PathBuf {
    data_dir
        .join("logs")
        .join(format!("{workload_id}-{epoch}.log"))
}

/// `<data_dir>/work/<workload_id>-<epoch>`: a run's working directory.
pub fn work_dir(data_dir: &Path, workload_id: u64, epoch: u64) -> std::path::PathBuf {
    data_dir.join("work").join(format!("{workload_id}-{epoch}"))
}

/// How long a finished run's log file and working directory stay on the
/// spoke after its end was sent to the hub: the window in which the end is
/// re-sent after a reconnect, and time to look at a run's files by hand.
pub const KEEP_FINISHED_RUN: Duration = Duration::from_secs(60);

/// Runs waiting for deletion at most: a minute of 100 runs/s many times
/// over. When full, the oldest is deleted at once.
pub const MAX_RUNS_TO_FORGET: usize = 65_536;

/// Finished runs whose files go once [`KEEP_FINISHED_RUN`] has passed.
#[derive(Debug, Default)]
pub struct Forgetting {
    queue: std::collections::VecDeque<(Instant, u64, u64)>,
}

impl Forgetting {
    /// Schedules run (workload, epoch), whose end was sent at `now`; returns
    /// a run to delete now if the queue was full.
    pub fn push(&mut self, now: Instant, workload_id: u64, epoch: u64) -> Option<(u64, u64)> {
        let evicted = (self.queue.len() >= MAX_RUNS_TO_FORGET)
            .then(|| self.queue.pop_front())
            .flatten()
            .map(|(_, w, e)| (w, e));
        self.queue
            .push_back((now + KEEP_FINISHED_RUN, workload_id, epoch));
        evicted
    }

    /// The runs due at `now`, removed from the queue.
    pub fn due(&mut self, now: Instant) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        while let Some(&(at, w, e)) = self.queue.front() {
            if at > now {
                break;
            }
            self.queue.pop_front();
            out.push((w, e));
        }
        out
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Deletes a run's log file and working directory (missing ones are fine).
pub async fn forget(data_dir: &Path, workload_id: u64, epoch: u64) {
    let log = log_path(data_dir, workload_id, epoch);
    match tokio::fs::remove_file(&log).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(error = %e, "cannot delete the log file {}", log.display()),
    }
    let work = work_dir(data_dir, workload_id, epoch);
    match tokio::fs::remove_dir_all(&work).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot delete the working directory {}", work.display())
        }
    }
}

/// Output of a workload on its way to the log writer: bytes of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Written to stderr (else stdout, or a stream that cannot be told
    /// apart, like a Kubernetes pod's log).
    pub stderr: bool,
    pub data: Vec<u8>,
}

impl From<Vec<u8>> for Piece {
    fn from(data: Vec<u8>) -> Piece {
        Piece {
            stderr: false,
            data,
        }
    }
}

/// Output not yet sent up: bytes and which of them are stderr.
#[derive(Debug, Default, PartialEq, Eq)]
struct Unsent {
    data: Vec<u8>,
    /// [start, end) positions in `data`, ascending, never touching.
    stderr: Vec<(usize, usize)>,
}

impl Unsent {
    fn push(&mut self, piece: &Piece) {
        let (start, end) = (self.data.len(), self.data.len() + piece.data.len());
        self.data.extend_from_slice(&piece.data);
        if !piece.stderr || start == end {
            return;
        }
        match self.stderr.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => self.stderr.push((start, end)),
        }
    }

    /// The first `n` bytes (and their stderr marks), leaving the rest.
    fn split_front(&mut self, n: usize) -> Unsent {
        let rest = self.data.split_off(n);
        let front = std::mem::replace(&mut self.data, rest);
        let mut marks = Vec::new();
        let mut later = Vec::new();
        for &(a, b) in &self.stderr {
            if a < n {
                marks.push((a, b.min(n)));
            }
            if b > n {
                later.push((a.max(n) - n, b - n));
            }
        }
        self.stderr = later;
        Unsent {
            data: front,
            stderr: marks,
        }
    }
}

/// Turns a byte stream into whole lines that each start with `prefix`, so the
/// output of several replicas interleaves by lines, never mid-line.
#[derive(Debug)]
pub struct LineSplitter {
    prefix: Vec<u8>,
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn new(prefix: &str) -> Self {
        LineSplitter {
            prefix: prefix.as_bytes().to_vec(),
            pending: Vec::new(),
        }
    }

    /// Returns the complete (prefixed) lines `data` finishes; keeps the rest.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &byte in data {
            self.pending.push(byte);
            if byte == b'\n' || self.pending.len() >= MAX_LINE_BYTES {
                self.emit_pending(&mut out);
            }
        }
        out
    }

    /// Returns whatever partial line is left (at end of stream).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if !self.pending.is_empty() {
            self.emit_pending(&mut out);
        }
        out
    }

    fn emit_pending(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.prefix);
        out.append(&mut self.pending);
    }
}

/// Copies one replica pipe into the log writer's channel, line-prefixed when
/// `prefix` is given (several replicas share the log), raw otherwise.
///
/// With `ready`, the stream must begin with `marker` (the shim's readiness
/// line): it is stripped and `ready` fires. Anything else there is kept as
/// output and `ready` fires anyway, as it does (by being dropped) at EOF, so
/// a waiter is never stuck.
pub async fn pump(
    mut reader: impl AsyncRead + Unpin,
    prefix: Option<String>,
    stderr: bool,
    tx: mpsc::Sender<Piece>,
    ready: Option<(&'static [u8], oneshot::Sender<()>)>,
) {
    let piece = |data: Vec<u8>| Piece { stderr, data };
    let mut splitter = prefix.as_deref().map(LineSplitter::new);
    let mut buf = vec![0u8; PIPE_READ_BYTES];
    if let Some((marker, ready_tx)) = ready {
        let mut head = Vec::with_capacity(marker.len());
        while head.len() < marker.len() {
            let want = marker.len() - head.len();
            match reader.read(&mut buf[..want]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            if !marker.starts_with(&head) {
                break;
            }
        }
        let _ = ready_tx.send(());
        if head != marker && !head.is_empty() {
            let data = match splitter.as_mut() {
                Some(s) => s.feed(&head),
                None => head,
            };
            if !data.is_empty() && tx.send(piece(data)).await.is_err() {
                return;
            }
        }
    }
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = match splitter.as_mut() {
            Some(s) => s.feed(&buf[..n]),
            None => buf[..n].to_vec(),
        };
        if !data.is_empty() && tx.send(piece(data)).await.is_err() {
            return;
        }
    }
    if let Some(rest) = splitter.as_mut().map(LineSplitter::finish)
        && !rest.is_empty()
    {
        let _ = tx.send(piece(rest)).await;
    }
}

/// Appends everything the pumps send to the log file and emits it as
/// `LogChunk`s (at most [`MAX_LOG_CHUNK_BYTES`], at least every
/// [`LOG_FLUSH_INTERVAL`]) until every pump has hung up.
pub async fn write_log<P: Into<Piece>>(
    file: tokio::fs::File,
    rx: mpsc::Receiver<P>,
    workload_id: u64,
    epoch: u64,
    events: mpsc::Sender<Event>,
) {
    write_log_capped(file, rx, workload_id, epoch, events, max_log_file_bytes()).await
}

/// [`write_log`] with the file cap given.
pub async fn write_log_capped<P: Into<Piece>>(
    mut file: tokio::fs::File,
    mut rx: mpsc::Receiver<P>,
    workload_id: u64,
    epoch: u64,
    events: mpsc::Sender<Event>,
    cap: u64,
) {
    let mut offset: u64 = 0;
    let mut buf = Unsent::default();
    let mut flush_at: Option<Instant> = None;
    let mut file_ok = true;
    let mut in_file: u64 = 0;
    loop {
        let deadline = flush_at.unwrap_or_else(|| Instant::now() + LOG_FLUSH_INTERVAL);
        tokio::select! {
            piece = rx.recv() => {
                let Some(piece) = piece else { break };
                let piece: Piece = piece.into();
                if file_ok && in_file < cap {
                    let room = (cap - in_file).min(piece.data.len() as u64) as usize;
                    let mut r = file.write_all(&piece.data[..room]).await;
                    in_file += room as u64;
                    if r.is_ok() && in_file >= cap {
                        let note = format!(
                            "\n[axle: this spoke keeps the first {cap} bytes of the log; the hub keeps the most recent output too]\n"
                        );
                        r = file.write_all(note.as_bytes()).await;
                    }
                    if let Err(e) = r {
                        tracing::warn!(workload_id, epoch, error = %e, "cannot write workload log file");
                        file_ok = false;
                    }
                }
                buf.push(&piece);
                if flush_at.is_none() {
                    flush_at = Some(Instant::now() + LOG_FLUSH_INTERVAL);
                }
                while buf.data.len() >= MAX_LOG_CHUNK_BYTES {
                    let full = buf.split_front(MAX_LOG_CHUNK_BYTES);
                    file_ok = flush_file(&mut file, file_ok).await;
                    if !emit(&events, workload_id, epoch, &mut offset, full).await {
                        return;
                    }
                }
                if buf.data.is_empty() {
                    flush_at = None;
                }
            }
            () = tokio::time::sleep_until(deadline), if flush_at.is_some() => {
                flush_at = None;
                file_ok = flush_file(&mut file, file_ok).await;
                let data = std::mem::take(&mut buf);
                if !emit(&events, workload_id, epoch, &mut offset, data).await {
                    return;
                }
            }
        }
    }
    flush_file(&mut file, file_ok).await;
    if !buf.data.is_empty() {
        emit(&events, workload_id, epoch, &mut offset, buf).await;
    }
}

/// Flushes so the file holds at least what the hub is told it holds.
async fn flush_file(file: &mut tokio::fs::File, ok: bool) -> bool {
    if !ok {
        return false;
    }
    match file.flush().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot flush workload log file");
            false
        }
    }
}

async fn emit(
    events: &mpsc::Sender<Event>,
    workload_id: u64,
    epoch: u64,
    offset: &mut u64,
    out: Unsent,
) -> bool {
    if out.data.is_empty() {
        return true;
    }
    let len = out.data.len() as u64;
    let chunk = pb::LogChunk {
        workload_id,
        epoch,
        offset: *offset,
        data: out.data,
        stderr: out
            .stderr
            .into_iter()
            .flat_map(|(a, b)| [a as u64, b as u64])
            .collect(),
    };
    *offset += len;
    events.send(Event::Log(chunk)).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_runs_are_forgotten_after_the_keep_window_in_order() {
        let t = Instant::now();
        let mut f = Forgetting::default();
        assert_eq!(f.push(t, 1, 1), None);
        assert_eq!(f.push(t + Duration::from_secs(1), 2, 1), None);
        assert!(
            f.due(t + KEEP_FINISHED_RUN - Duration::from_millis(1))
                .is_empty()
        );
        assert_eq!(f.due(t + KEEP_FINISHED_RUN), vec![(1, 1)]);
        assert_eq!(f.due(t + KEEP_FINISHED_RUN * 2), vec![(2, 1)]);
        assert!(f.is_empty());
    }

    #[tokio::test]
    async fn forget_deletes_the_log_file_and_the_working_directory() {
        // Observed: 16,352 files on the spoke after 16,000 empty jobs.
        let dir = tempfile::tempdir().unwrap();
        let log = log_path(dir.path(), 5, 2);
        let work = work_dir(dir.path(), 5, 2);
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(&log, b"out\n").unwrap();
        std::fs::write(work.join("model.pt"), b"x").unwrap();
        forget(dir.path(), 5, 2).await;
        assert!(!log.exists());
        assert!(!work.exists());
        forget(dir.path(), 5, 2).await; // already gone: fine
    }

    #[tokio::test]
    async fn the_spokes_log_file_keeps_the_head_up_to_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.log");
        let file = tokio::fs::File::create(&path).await.unwrap();
        let (tx, rx) = mpsc::channel(4);
        let (etx, mut erx) = mpsc::channel(1024);
        set_max_log_file_bytes(0); // 0 keeps the current value
        let cap = max_log_file_bytes();
        let writer = tokio::spawn(write_log_capped(file, rx, 1, 1, etx, 10));
        tx.send(b"0123456789abcdef".to_vec()).await.unwrap();
        drop(tx);
        writer.await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("0123456789\n[axle: this spoke keeps the first 10 bytes"),
            "{text}"
        );
        // The hub is sent everything.
        let mut sent = Vec::new();
        while let Ok(Event::Log(c)) = erx.try_recv() {
            sent.extend(c.data);
        }
        assert_eq!(sent, b"0123456789abcdef");
        assert_eq!(max_log_file_bytes(), cap);
    }

    #[test]
    fn splitter_prefixes_whole_lines_only() {
        let mut s = LineSplitter::new("[r1] ");
        assert_eq!(s.feed(b"hel"), b"");
        assert_eq!(s.feed(b"lo\nwor"), b"[r1] hello\n");
        assert_eq!(s.feed(b"ld\n\n"), b"[r1] world\n[r1] \n");
        assert_eq!(s.feed(b"tail"), b"");
        assert_eq!(s.finish(), b"[r1] tail");
        assert_eq!(s.finish(), b"");
    }

    #[test]
    fn splitter_splits_overlong_lines() {
        let mut s = LineSplitter::new("[r0] ");
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let out = s.feed(&long);
        assert_eq!(out.len(), 5 + MAX_LINE_BYTES);
        assert_eq!(s.finish().len(), 5 + 10);
    }

    async fn pumped(input: &[u8], prefix: Option<&str>) -> (Vec<u8>, bool) {
        let (tx, mut rx) = mpsc::channel(16);
        let (ready_tx, ready_rx) = oneshot::channel();
        pump(
            input,
            prefix.map(String::from),
            false,
            tx,
            Some((b"READY\n", ready_tx)),
        )
        .await;
        let mut out = Vec::new();
        while let Ok(piece) = rx.try_recv() {
            out.extend(piece.data);
        }
        (out, ready_rx.await.is_ok())
    }

    #[tokio::test]
    async fn pump_strips_the_ready_marker_and_keeps_anything_else() {
        assert_eq!(
            pumped(b"READY\nhello\n", None).await,
            (b"hello\n".to_vec(), true)
        );
        assert_eq!(
            pumped(b"READY\nhi\n", Some("[r1] ")).await,
            (b"[r1] hi\n".to_vec(), true)
        );
        assert_eq!(pumped(b"REXXX\n", None).await, (b"REXXX\n".to_vec(), true));
        assert_eq!(pumped(b"", None).await, (Vec::new(), true));
    }

    #[tokio::test]
    async fn writer_chunks_at_limit_and_offsets_add_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let file = tokio::fs::File::create(&path).await.expect("create");
        let (tx, rx) = mpsc::channel(4);
        let (etx, mut erx) = mpsc::channel(64);
        let writer = tokio::spawn(write_log(file, rx, 7, 2, etx));
        let big = vec![b'a'; MAX_LOG_CHUNK_BYTES * 2 + 100];
        tx.send(big.clone()).await.expect("send");
        drop(tx);
        writer.await.expect("writer");
        let mut chunks = Vec::new();
        while let Ok(Event::Log(c)) = erx.try_recv() {
            chunks.push(c);
        }
        let sizes: Vec<usize> = chunks.iter().map(|c| c.data.len()).collect();
        assert_eq!(sizes, vec![MAX_LOG_CHUNK_BYTES, MAX_LOG_CHUNK_BYTES, 100]);
        let offsets: Vec<u64> = chunks.iter().map(|c| c.offset).collect();
        assert_eq!(
            offsets,
            vec![
                0,
                MAX_LOG_CHUNK_BYTES as u64,
                2 * MAX_LOG_CHUNK_BYTES as u64
            ]
        );
        assert!(chunks.iter().all(|c| c.workload_id == 7 && c.epoch == 2));
        assert_eq!(std::fs::read(&path).expect("read"), big);
    }

    #[tokio::test]
    async fn writer_coalesces_small_writes_within_the_flush_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = tokio::fs::File::create(dir.path().join("log"))
            .await
            .expect("create");
        let (tx, rx) = mpsc::channel(4);
        let (etx, mut erx) = mpsc::channel(64);
        let writer = tokio::spawn(write_log(file, rx, 1, 1, etx));
        tx.send(b"a".to_vec()).await.expect("send");
        tx.send(b"b".to_vec()).await.expect("send");
        let first = tokio::time::timeout(LOG_FLUSH_INTERVAL * 2, erx.recv())
            .await
            .expect("flushed within the interval");
        match first {
            Some(Event::Log(c)) => assert_eq!(c.data, b"ab"),
            other => panic!("expected a log chunk, got {other:?}"),
        }
        tx.send(b"c".to_vec()).await.expect("send");
        drop(tx);
        writer.await.expect("writer");
        match erx.recv().await {
            Some(Event::Log(c)) => {
                assert_eq!(c.data, b"c");
                assert_eq!(c.offset, 2);
            }
            other => panic!("expected a log chunk, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn stderr_is_marked_in_the_chunks_also_across_a_chunk_split() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = tokio::fs::File::create(dir.path().join("log"))
            .await
            .expect("create");
        let (tx, rx) = mpsc::channel(8);
        let (etx, mut erx) = mpsc::channel(64);
        let writer = tokio::spawn(write_log(file, rx, 1, 1, etx));
        let piece = |stderr, data: &[u8]| Piece {
            stderr,
            data: data.to_vec(),
        };
        tx.send(piece(false, b"out\n")).await.unwrap();
        tx.send(piece(true, b"err\n")).await.unwrap();
        tx.send(piece(true, b"more\n")).await.unwrap();
        tx.send(piece(false, b"out\n")).await.unwrap();
        // stderr across the chunk limit: both chunks say their part.
        let long = vec![b'e'; MAX_LOG_CHUNK_BYTES];
        tx.send(piece(true, &long)).await.unwrap();
        drop(tx);
        writer.await.unwrap();
        let mut chunks = Vec::new();
        while let Ok(Event::Log(c)) = erx.try_recv() {
            chunks.push(c);
        }
        assert_eq!(chunks.len(), 2);
        let n = MAX_LOG_CHUNK_BYTES as u64;
        // One range for the two stderr pieces in a row.
        assert_eq!(chunks[0].stderr, [4, 13, 17, n]);
        assert_eq!(chunks[1].stderr, [0, 17]);
        assert_eq!(chunks[1].data.len(), 17);
    }
}
