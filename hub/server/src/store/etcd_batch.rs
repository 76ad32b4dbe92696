//! Atomic batches larger than one etcd txn, through a durable intent.
//!
//! A batch whose ops do not fit one etcd txn (by count or bytes) is committed in four steps:
//! 1. its ops are written as parts under `_batch/<id>/part/<n>` (invisible to the hub's
//!    records: nothing reads `_batch/` but recovery);
//! 2. the commit marker `_batch/<id>/commit` (the number of parts) is written: **the commit
//!    point**; only after it does [`Store::txn_atomic`](super::Store::txn_atomic) succeed;
//! 3. the ops are applied in chunks (they touch distinct keys, so the chunks commute and go
//!    in parallel);
//! 4. the intent is deleted in one range delete.
//!
//! Every step is a fenced txn (see `etcd_store.rs`), so a deposed leader stops at its next
//! step. A new leader runs [`EtcdStore::recover_batches`] before it loads its state: an intent
//! with a marker is applied again (the same end values, so replaying is harmless), one without
//! is dropped. The applier commits one batch at a time and waits for step 4, so at most one
//! intent is ever left, and replaying it cannot overwrite a later batch.

use std::collections::BTreeMap;

use etcd_client::{DeleteOptions, TxnOp};
use futures::stream::{self, StreamExt};

use super::etcd_store::EtcdStore;
use super::{MAX_OPS_PER_TXN, MAX_VALUE_BYTES, Op, Rev, Store, StoreError, Txn, TxnResult};

/// Where intents live: beside the hub's records, never under them.
pub const BATCH_PREFIX: &str = "_batch/";

/// Bytes of ops in one part or one applied chunk: etcd refuses requests above
/// `--max-request-bytes` (1.5 MiB by default); 1 MiB leaves room for keys and framing.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// Txns of one batch in flight at once. Chunks write distinct keys, so their order does not
/// matter; 8 keeps one large batch from queueing hundreds of requests on etcd.
const PARALLEL_TXNS: usize = 8;

/// What [`EtcdStore::recover_batches`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Committed intents applied again.
    pub replayed: usize,
    /// Uncommitted intents dropped.
    pub dropped: usize,
}

/// Bytes an op adds to a request, roughly: key, value, framing.
fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put { key, value, .. } => key.len() + value.len() + 32,
        Op::Delete { key } => key.len() + 16,
    }
}

/// Ops in one chunk: etcd's limit (`--max-txn-ops`, [`MAX_OPS_PER_TXN`]) less the fence's
/// one op, because etcd gives a nested txn what its outer txn leaves of the limit, and a
/// leader's txns are nested in the fence (measured: 128 puts inside the fence are refused
/// with "too many operations in txn request").
pub const MAX_OPS_PER_CHUNK: usize = MAX_OPS_PER_TXN - 1;

/// Splits ops into chunks of at most [`MAX_OPS_PER_CHUNK`] ops and [`MAX_TXN_BYTES`] bytes
/// (an op larger than that alone gets a chunk of its own).
pub(super) fn chunks(ops: Vec<Op>) -> Vec<Vec<Op>> {
    let mut out: Vec<Vec<Op>> = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let b = op_bytes(&op);
        match out.last_mut() {
            Some(last) if last.len() < MAX_OPS_PER_CHUNK && bytes + b <= MAX_TXN_BYTES => {
                bytes += b;
                last.push(op);
            }
            _ => {
                bytes = b;
                out.push(vec![op]);
            }
        }
    }
    out
}

/// A part's bytes: for each op a tag (1 put, 2 delete), the key, and for a put the lease
/// (0: none) and the value; lengths as little-endian u32.
pub(super) fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ops.iter().map(op_bytes).sum());
    for op in ops {
        match op {
            Op::Put { key, value, lease } => {
                out.push(1);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(&lease.unwrap_or(0).to_le_bytes());
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            Op::Delete { key } => {
                out.push(2);
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key.as_bytes());
            }
        }
    }
    out
}

/// The ops of a part; any malformed byte is reported as corruption of `key`.
pub(super) fn decode_ops(key: &str, mut b: &[u8]) -> Result<Vec<Op>, StoreError> {
    let corrupt = |message: &str| StoreError::Corrupt {
        key: key.to_string(),
        message: format!("batch part: {message}"),
    };
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    fn take_u32(b: &mut &[u8]) -> Option<usize> {
        take(b, 4).map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as usize)
    }
    let mut ops = Vec::new();
    while let Some(tag) = take(&mut b, 1) {
        let key_len = take_u32(&mut b).ok_or_else(|| corrupt("truncated key length"))?;
        let k = take(&mut b, key_len).ok_or_else(|| corrupt("truncated key"))?;
        let k = std::str::from_utf8(k)
            .map_err(|_| corrupt("key is not UTF-8"))?
            .to_string();
        match tag[0] {
            1 => {
                let lease = take(&mut b, 8).ok_or_else(|| corrupt("truncated lease"))?;
                let lease = u64::from_le_bytes(lease.try_into().unwrap_or([0; 8]));
                let len = take_u32(&mut b).ok_or_else(|| corrupt("truncated value length"))?;
                let value = take(&mut b, len).ok_or_else(|| corrupt("truncated value"))?;
                ops.push(Op::Put {
                    key: k,
                    value: value.to_vec(),
                    lease: (lease != 0).then_some(lease),
                });
            }
            2 => ops.push(Op::Delete { key: k }),
            t => return Err(corrupt(&format!("unknown op tag {t}"))),
        }
    }
    Ok(ops)
}

fn put_txn(key: String, value: Vec<u8>) -> Txn {
    Txn::new().and_then(Op::put(key, value))
}

/// One intent as recovery finds it: its marker's part count (if committed) and its parts by key.
type Intent = (Option<usize>, BTreeMap<String, Vec<u8>>);

impl EtcdStore {
    /// Commits `ops` (distinct keys) atomically: one txn when they fit, else through an
    /// intent (see the module documentation).
    pub(super) async fn commit_batch(&self, ops: Vec<Op>) -> Result<TxnResult, StoreError> {
        let mut parts = chunks(ops);
        if parts.len() <= 1 {
            let success = parts.pop().unwrap_or_default();
            return self
                .run_txn(Txn {
                    compares: Vec::new(),
                    success,
                    failure: Vec::new(),
                })
                .await;
        }
        let seq = self
            .batches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!(
            "{:020}-{:016x}-{seq:08}",
            self.fenced_at().unwrap_or(0),
            std::process::id() as u64 ^ start_nanos()
        );
        let dir = format!("{BATCH_PREFIX}{id}/");
        let n = parts.len();
        let part_txns = parts
            .iter()
            .enumerate()
            .map(|(i, ops)| {
                let value = encode_ops(ops);
                if value.len() > MAX_VALUE_BYTES {
                    return Err(StoreError::InvalidRequest(format!(
                        "one write of {} bytes is larger than etcd's request limit",
                        value.len()
                    )));
                }
                Ok(put_txn(format!("{dir}part/{i:06}"), value))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.steps(part_txns).await?;
        let marker = self
            .step(put_txn(format!("{dir}commit"), n.to_string().into_bytes()))
            .await?;
        let applied = self.apply_parts(parts).await?;
        self.delete_intent(&dir).await?;
        Ok(TxnResult {
            succeeded: true,
            rev: applied.max(marker.rev),
        })
    }

    /// Finishes what a crashed leader left: intents with a commit marker are applied again,
    /// intents without one are dropped. Run under the new leader's fence, before restore.
    pub async fn recover_batches(&self) -> Result<Recovered, StoreError> {
        // Unbounded on purpose, and small: the applier leaves at most one intent.
        let kvs = self.range(BATCH_PREFIX).await?;
        let mut intents: BTreeMap<String, Intent> = BTreeMap::new();
        for kv in kvs {
            let rest = &kv.key[BATCH_PREFIX.len()..];
            let Some((id, what)) = rest.split_once('/') else {
                continue;
            };
            let entry = intents.entry(id.to_string()).or_default();
            if what == "commit" {
                let n = std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| StoreError::Corrupt {
                        key: kv.key.clone(),
                        message: "a batch marker that is not a part count".to_string(),
                    })?;
                entry.0 = Some(n);
            } else {
                entry.1.insert(kv.key.clone(), kv.value);
            }
        }
        let mut done = Recovered::default();
        for (id, (marker, parts)) in intents {
            let dir = format!("{BATCH_PREFIX}{id}/");
            if let Some(n) = marker {
                if parts.len() != n {
                    // The marker is written only once every part is durable.
                    return Err(StoreError::Corrupt {
                        key: format!("{dir}commit"),
                        message: format!("the marker counts {n} parts, {} are stored", parts.len()),
                    });
                }
                let mut ops = Vec::new();
                for (key, value) in &parts {
                    ops.push(decode_ops(key, value)?);
                }
                self.apply_parts(ops).await?;
                done.replayed += 1;
            } else {
                done.dropped += 1;
            }
            self.delete_intent(&dir).await?;
        }
        Ok(done)
    }

    /// Applies parts (each one txn); returns the highest revision.
    async fn apply_parts(&self, parts: Vec<Vec<Op>>) -> Result<Rev, StoreError> {
        let txns = parts
            .into_iter()
            .map(|success| Txn {
                compares: Vec::new(),
                success,
                failure: Vec::new(),
            })
            .collect();
        self.steps(txns).await
    }

    async fn delete_intent(&self, dir: &str) -> Result<(), StoreError> {
        self.check_crash()?;
        let t = etcd_client::Txn::new().and_then(vec![TxnOp::delete(
            self.full(dir),
            Some(DeleteOptions::new().with_prefix()),
        )]);
        self.send_txn(t, &Txn::new()).await.map(|_| ())
    }

    /// One write of an intent batch.
    async fn step(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        self.check_crash()?;
        self.run_txn(txn).await
    }

    /// Writes of one phase, [`PARALLEL_TXNS`] at a time (in order under the crash hook, so a
    /// test can stop at an exact write); the highest revision.
    async fn steps(&self, txns: Vec<Txn>) -> Result<Rev, StoreError> {
        let hooked = self
            .crash_after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        let width = if hooked { 1 } else { PARALLEL_TXNS };
        let results: Vec<Result<TxnResult, StoreError>> = stream::iter(txns)
            .map(|t| self.step(t))
            .buffered(width)
            .collect()
            .await;
        let mut rev = 0;
        for r in results {
            rev = rev.max(r?.rev);
        }
        Ok(rev)
    }

    /// The crash hook (see [`EtcdStore::crash_after_writes`]).
    fn check_crash(&self) -> Result<(), StoreError> {
        let mut left = self.crash_after.lock().unwrap_or_else(|p| p.into_inner());
        match left.as_mut() {
            Some(0) => Err(StoreError::Io {
                context: "committing an atomic batch",
                message: "the hub stopped here (test crash hook)".to_string(),
            }),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// Nanoseconds since the epoch at first use: with the pid, keeps intent ids of two
/// processes apart.
fn start_nanos() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_every_op_kind() {
        let ops = vec![
            Op::put("workloads/1", b"{\"v\":1}".to_vec()),
            Op::put_with_lease("hubs/a", Vec::new(), 7),
            Op::delete("events/000001"),
            Op::put("k\u{e9}y", vec![0, 255, 1]),
        ];
        assert_eq!(decode_ops("p", &encode_ops(&ops)).unwrap(), ops);
        assert_eq!(decode_ops("p", &[]).unwrap(), Vec::<Op>::new());
    }

    #[test]
    fn a_damaged_part_is_corruption_not_a_panic() {
        let bytes = encode_ops(&[Op::put("a", b"xyz".to_vec())]);
        for cut in 1..bytes.len() {
            assert!(
                matches!(
                    decode_ops("p", &bytes[..cut]),
                    Err(StoreError::Corrupt { .. })
                ),
                "cut at {cut}"
            );
        }
        assert!(matches!(
            decode_ops("p", &[9, 0, 0, 0, 0]),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn chunks_respect_the_op_and_byte_limits() {
        let ops: Vec<Op> = (0..300)
            .map(|i| Op::put(format!("k{i}"), vec![0; 10]))
            .collect();
        let c = chunks(ops);
        assert_eq!(
            c.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![127, 127, 46]
        );
        let big: Vec<Op> = (0..5)
            .map(|i| Op::put(format!("k{i}"), vec![0; 400 * 1024]))
            .collect();
        let c = chunks(big);
        assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
        assert!(chunks(Vec::new()).is_empty());
    }
}
