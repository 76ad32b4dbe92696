//! Watch streams: newline-delimited watch events from a resourceVersion on,
//! with selector transitions, bookmarks, timeouts, and 410 Expired once the
//! history the client needs is gone.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Status, WatchEvent};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::errors::ApiError;
use crate::kinds::{ChangeType, Kind, Object, to_json};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Change, State};

/// How often a watch that asked for bookmarks (`allowWatchBookmarks=true`)
/// gets one. The real server sends one about every minute; tests want to
/// see them within a second.
pub(crate) const BOOKMARK_INTERVAL_MS: u64 = 1_000;

/// How long a watch without `timeoutSeconds` stays open: the API server's
/// default `--min-request-timeout` (1800 s).
pub(crate) const DEFAULT_WATCH_TIMEOUT_SECONDS: u64 = 1_800;

/// The annotation on the bookmark that ends a streaming list's initial
/// events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// What a watch request asked for.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub(crate) kind: Kind,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) resource_version: Option<String>,
    pub(crate) send_initial_events: bool,
    pub(crate) bookmarks: bool,
    pub(crate) timeout_seconds: Option<u64>,
}

struct Session {
    cluster: Cluster,
    req: WatchRequest,
    changed: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
    /// Every change up to here was considered.
    cursor: u64,
    epoch: u64,
    pending: VecDeque<Bytes>,
    finished: bool,
    deadline: Instant,
    next_bookmark: Instant,
}

fn line(mut bytes: Vec<u8>) -> Bytes {
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn expired_line(from: u64, oldest: u64) -> Bytes {
    let status = Status {
        code: Some(410),
        message: Some(format!("too old resource version: {from} ({oldest})")),
        reason: Some("Expired".into()),
        status: Some("Failure".into()),
        metadata: ListMeta::default(),
        details: None,
    };
    line(to_json(&WatchEvent::<Pod>::ErrorStatus(status)))
}

/// A BOOKMARK event. Written by hand because k8s-openapi's serialization of
/// `WatchEvent::Bookmark` leaves out the object's `apiVersion`/`kind`,
/// which the real server sends and kube-rs requires to parse it.
fn bookmark_line(kind: Kind, rv: u64, annotations: BTreeMap<String, String>) -> Bytes {
    let metadata = ObjectMeta {
        resource_version: Some(rv.to_string()),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..Default::default()
    };
    line(to_json(&json!({
        "type": "BOOKMARK",
        "object": { "kind": kind.name(), "apiVersion": kind.api_version(), "metadata": metadata },
    })))
}

impl WatchRequest {
    fn selects(&self, obj: &Object) -> bool {
        obj.kind() == self.kind
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| obj.meta().namespace.as_ref() == Some(ns))
            && self.labels.matches(obj.meta().labels.as_ref())
            && self.fields.matches(obj)
    }

    /// The event a change is to this watch, if any: an object that moves
    /// into the selection is ADDED, one that moves out is DELETED.
    fn render(&self, change: &Change) -> Option<Bytes> {
        if change.object.kind() != self.kind {
            return None;
        }
        let now = self.selects(&change.object);
        let ty = match change.ty {
            ChangeType::Modified => {
                match (change.prev.as_deref().is_some_and(|p| self.selects(p)), now) {
                    (true, true) => ChangeType::Modified,
                    (false, true) => ChangeType::Added,
                    (true, false) => ChangeType::Deleted,
                    (false, false) => return None,
                }
            }
            ty if now => ty,
            _ => return None,
        };
        Some(line(change.object.watch_event_json(ty)))
    }
}

impl Session {
    async fn next(&mut self) -> Option<Result<Bytes, io::Error>> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Some(Ok(bytes));
            }
            if self.finished {
                return None;
            }
            self.changed.borrow_and_update();
            let (cursor, epoch, req) = (self.cursor, self.epoch, &self.req);
            let read = self.cluster.read(|s: &State| {
                if s.expire_epoch != epoch || cursor < s.compacted_rv {
                    return Err(s.compacted_rv);
                }
                Ok((
                    s.changes_after(cursor)
                        .filter_map(|c| req.render(c))
                        .collect::<Vec<_>>(),
                    s.rv,
                ))
            });
            match read {
                Err(oldest) => {
                    self.pending.push_back(expired_line(self.cursor, oldest));
                    self.finished = true;
                    continue;
                }
                Ok((lines, rv)) => {
                    self.cursor = rv;
                    if !lines.is_empty() {
                        self.pending.extend(lines);
                        continue;
                    }
                }
            }
            let bookmarks = self.req.bookmarks;
            tokio::select! {
                changed = self.changed.changed() => {
                    if changed.is_err() {
                        self.finished = true;
                    }
                }
                _ = tokio::time::sleep_until(self.deadline) => self.finished = true,
                _ = tokio::time::sleep_until(self.next_bookmark), if bookmarks => {
                    self.pending.push_back(bookmark_line(self.req.kind, self.cursor, BTreeMap::new()));
                    self.next_bookmark = Instant::now() + Duration::from_millis(BOOKMARK_INTERVAL_MS);
                }
                _ = self.shutdown.wait_for(|stopped| *stopped) => {
                    // The server is stopping: break the connection rather
                    // than end the stream cleanly, as a crashed server would.
                    self.finished = true;
                    self.pending.clear();
                    return Some(Err(io::Error::other("kube test server stopped")));
                }
            }
        }
    }
}

/// Starts a watch. Errors (a bad resourceVersion) come back before any
/// byte is streamed; an expired resourceVersion is an in-stream ERROR event,
/// as the real server sends it.
pub(crate) fn start(
    cluster: &Cluster,
    req: WatchRequest,
    shutdown: watch::Receiver<bool>,
) -> Result<impl Stream<Item = Result<Bytes, io::Error>> + use<>, ApiError> {
    let mut changed = cluster.subscribe();
    changed.borrow_and_update();
    let requested = match req.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?,
        ),
    };
    let initial = requested.is_none() || req.send_initial_events;
    let (cursor, epoch, pending, expired) = cluster.read(|s| {
        let mut pending = VecDeque::new();
        match requested {
            Some(rv) if rv < s.compacted_rv && !req.send_initial_events => {
                pending.push_back(expired_line(rv, s.compacted_rv));
                return (rv, s.expire_epoch, pending, true);
            }
            _ => {}
        }
        if initial {
            let ns = req.namespace.as_deref();
            for obj in s.iter_kind(req.kind, ns).filter(|o| req.selects(o)) {
                pending.push_back(line(obj.watch_event_json(ChangeType::Added)));
            }
            if req.send_initial_events {
                let end = BTreeMap::from([(INITIAL_EVENTS_END.to_string(), "true".to_string())]);
                pending.push_back(bookmark_line(req.kind, s.rv, end));
            }
            (s.rv, s.expire_epoch, pending, false)
        } else {
            (
                requested.unwrap_or(s.rv).min(s.rv),
                s.expire_epoch,
                pending,
                false,
            )
        }
    });
    let now = Instant::now();
    let timeout = Duration::from_secs(req.timeout_seconds.unwrap_or(DEFAULT_WATCH_TIMEOUT_SECONDS));
    let session = Session {
        cluster: cluster.clone(),
        req,
        changed,
        shutdown,
        cursor,
        epoch,
        pending,
        finished: expired,
        deadline: now + timeout,
        next_bookmark: now + Duration::from_millis(BOOKMARK_INTERVAL_MS),
    };
    Ok(futures::stream::unfold(session, |mut s| async move {
        s.next().await.map(|item| (item, s))
    }))
}
