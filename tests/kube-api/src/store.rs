//! The in-memory "etcd": objects by key, the global resourceVersion, the
//! bounded watch history, and the request and deletion logs.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use axum::http::Method;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::DeleteRecord;
use crate::controller::{self, JobTracking};
use crate::kinds::{ChangeType, Kind, Object};

/// How many changes the watch history keeps. A watch resuming from an older
/// resourceVersion gets 410 Gone and the client relists, as with etcd
/// compaction. 10,000 covers every test and, in a dispatch benchmark with
/// auto-complete, the last ~1,400 single-pod jobs (about seven changes each:
/// pod added, running, succeeded; job status; two events; quota status),
/// while bounding memory to a few tens of MB of object copies.
pub(crate) const MAX_HISTORY_EVENTS: usize = 10_000;

/// How many requests `Cluster::requests` remembers: enough for a test to
/// assert what a client called, bounded so a benchmark does not grow it
/// without limit.
pub(crate) const MAX_REQUEST_LOG: usize = 10_000;

/// How many API deletions `Cluster::deletions` remembers (same reasoning as
/// the request log).
pub(crate) const MAX_DELETE_LOG: usize = 10_000;

/// Per-pod log bytes kept; older bytes are dropped first. The kubelet
/// rotates container logs at 10 MiB by default (`containerLogMaxSize`).
pub(crate) const MAX_POD_LOG_BYTES: usize = 10 * 1024 * 1024;

/// Storage key: kind, namespace ("" for cluster-scoped kinds), name. A
/// `BTreeMap` over it lists in a stable order and ranges over one namespace.
pub(crate) type Key = (Kind, String, String);

/// One entry of the watch history.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) ty: ChangeType,
    pub(crate) object: Arc<Object>,
    /// The object before a MODIFIED change, so a label-selected watch can
    /// turn "moved out of the selector" into DELETED, as the server does.
    pub(crate) prev: Option<Arc<Object>>,
}

/// A pod's log: appended chunks with their time, for `sinceTime`.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodLog {
    pub(crate) chunks: VecDeque<(Timestamp, Vec<u8>)>,
    /// Bytes dropped from the front (to stay under `MAX_POD_LOG_BYTES`), so
    /// that a follower's absolute offset stays meaningful.
    pub(crate) dropped_bytes: u64,
    pub(crate) kept_bytes: usize,
}

/// Everything behind the cluster's mutex.
pub(crate) struct State {
    pub(crate) objects: BTreeMap<Key, Object>,
    /// The last resourceVersion handed out (global, like etcd's revision).
    pub(crate) rv: u64,
    pub(crate) history: VecDeque<Change>,
    /// Watches may resume from this resourceVersion or later; older ones are
    /// gone (everything after it is in `history`).
    pub(crate) compacted_rv: u64,
    /// Bumped by `compact()`; open watches started under an older epoch end
    /// with a 410 ERROR event.
    pub(crate) expire_epoch: u64,
    /// Owner uid -> keys of objects whose ownerReferences name it.
    owners: HashMap<String, BTreeSet<Key>>,
    pub(crate) requests: VecDeque<(Method, String)>,
    pub(crate) deletions: VecDeque<DeleteRecord>,
    pub(crate) logs: HashMap<(String, String), PodLog>,
    pub(crate) auto_complete: bool,
    /// Set by every write; the cluster wakes watchers and log followers.
    pub(crate) dirty: bool,
    rng: u64,
    // Job controller and quota work, drained after each write batch.
    pub(crate) jobs_to_sync: BTreeSet<(String, String)>,
    pub(crate) quota_namespaces_to_sync: BTreeSet<String>,
    /// Jobs whose last pod creation was refused (quota, admission); retried
    /// when pods in their namespace finish or quotas change.
    pub(crate) blocked_jobs: BTreeSet<(String, String)>,
    /// Node capacity came free (a pod ended or went): the scheduler tries
    /// the pods it left Pending/Unschedulable again.
    pub(crate) reschedule: bool,
    pub(crate) tracking: HashMap<String, JobTracking>,
    /// "uid\0type\0reason\0message" -> event key, to aggregate repeats
    /// into `count` as the event recorder does.
    pub(crate) event_index: HashMap<String, Key>,
}

/// A `meta/v1 Time` for now.
pub(crate) fn now() -> Time {
    Time(Timestamp::now())
}

impl State {
    pub(crate) fn new() -> State {
        let seed = Timestamp::now().as_nanosecond() as u64;
        State {
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            compacted_rv: 0,
            expire_epoch: 0,
            owners: HashMap::new(),
            requests: VecDeque::new(),
            deletions: VecDeque::new(),
            logs: HashMap::new(),
            auto_complete: false,
            reschedule: false,
            dirty: false,
            rng: seed | 1,
            jobs_to_sync: BTreeSet::new(),
            quota_namespaces_to_sync: BTreeSet::new(),
            blocked_jobs: BTreeSet::new(),
            tracking: HashMap::new(),
            event_index: HashMap::new(),
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: names and uids only need to be distinct, not secure.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Five characters from the alphabet the API server uses for
    /// `generateName` (no vowels, no confusable digits).
    pub(crate) fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.next_random();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// A fresh uid in the usual 8-4-4-4-12 hex form.
    pub(crate) fn new_uid(&mut self) -> String {
        let (a, b) = (self.next_random(), self.next_random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    pub(crate) fn key_of(obj: &Object) -> Key {
        let meta = obj.meta();
        (
            obj.kind(),
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&Object> {
        self.objects.get(key)
    }

    /// The objects of `kind`, in one namespace or (None) in all.
    pub(crate) fn iter_kind<'a>(
        &'a self,
        kind: Kind,
        namespace: Option<&str>,
    ) -> Box<dyn Iterator<Item = &'a Object> + 'a> {
        match namespace {
            Some(ns) => {
                let start = (kind, ns.to_string(), String::new());
                let ns = ns.to_string();
                Box::new(
                    self.objects
                        .range(start..)
                        .take_while(move |((k, n, _), _)| *k == kind && *n == ns)
                        .map(|(_, o)| o),
                )
            }
            None => {
                let start = (kind, String::new(), String::new());
                Box::new(
                    self.objects
                        .range(start..)
                        .take_while(move |((k, _, _), _)| *k == kind)
                        .map(|(_, o)| o),
                )
            }
        }
    }

    /// Keys of the objects whose ownerReferences name `uid`.
    pub(crate) fn owned_by(&self, uid: &str) -> Vec<Key> {
        self.owners
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn index_owners(&mut self, key: &Key, obj: &Object, add: bool) {
        for owner in obj.meta().owner_references.iter().flatten() {
            if add {
                self.owners
                    .entry(owner.uid.clone())
                    .or_default()
                    .insert(key.clone());
            } else if let Some(set) = self.owners.get_mut(&owner.uid) {
                set.remove(key);
                if set.is_empty() {
                    self.owners.remove(&owner.uid);
                }
            }
        }
    }

    fn record(&mut self, ty: ChangeType, object: &Object, prev: Option<Arc<Object>>) {
        self.history.push_back(Change {
            rv: self.rv,
            ty,
            object: Arc::new(object.clone()),
            prev,
        });
        while self.history.len() > MAX_HISTORY_EVENTS {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        self.dirty = true;
    }

    /// Stores a new object: uid, resourceVersion, creationTimestamp and
    /// generation are assigned here. The caller checked the name is free.
    pub(crate) fn insert(&mut self, mut obj: Object) -> Object {
        self.rv += 1;
        let uid = self.new_uid();
        let meta = obj.meta_mut();
        meta.uid = Some(uid);
        meta.resource_version = Some(self.rv.to_string());
        meta.creation_timestamp = Some(now());
        meta.generation = Some(1);
        meta.deletion_timestamp = None;
        let key = State::key_of(&obj);
        self.index_owners(&key, &obj, true);
        self.record(ChangeType::Added, &obj, None);
        controller::note_write(self, &key, None, Some(&obj));
        self.objects.insert(key, obj.clone());
        obj
    }

    /// Replaces a stored object, keeping its identity (uid, creation time);
    /// bumps generation when the spec changed.
    pub(crate) fn replace(&mut self, mut obj: Object) -> Object {
        let key = State::key_of(&obj);
        let Some(old) = self.objects.get(&key).cloned() else {
            return self.insert(obj);
        };
        self.rv += 1;
        let spec_changed = old.to_value().get("spec") != obj.to_value().get("spec");
        let old_meta = old.meta();
        let generation = old_meta.generation.unwrap_or(1) + i64::from(spec_changed);
        let (uid, created) = (old_meta.uid.clone(), old_meta.creation_timestamp.clone());
        let meta = obj.meta_mut();
        meta.uid = uid;
        meta.creation_timestamp = created;
        meta.generation = Some(generation);
        meta.resource_version = Some(self.rv.to_string());
        self.index_owners(&key, &old, false);
        self.index_owners(&key, &obj, true);
        self.record(ChangeType::Modified, &obj, Some(Arc::new(old.clone())));
        controller::note_write(self, &key, Some(&old), Some(&obj));
        self.objects.insert(key, obj.clone());
        obj
    }

    /// Removes an object; its last state carries the deletion's
    /// resourceVersion, as in the server's DELETED event.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Object> {
        let mut obj = self.objects.remove(key)?;
        self.rv += 1;
        obj.meta_mut().resource_version = Some(self.rv.to_string());
        self.index_owners(key, &obj, false);
        self.record(ChangeType::Deleted, &obj, None);
        if key.0 == Kind::Pod {
            self.logs.remove(&(key.1.clone(), key.2.clone()));
        }
        controller::note_write(self, key, Some(&obj), None);
        Some(obj)
    }

    /// Forgets the watch history up to now and expires open watches.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
        self.expire_epoch += 1;
        self.dirty = true;
    }

    /// Changes after `rv`, oldest first (the caller checked `rv` is not
    /// compacted away).
    pub(crate) fn changes_after(&self, rv: u64) -> impl Iterator<Item = &Change> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history.range(start..)
    }

    pub(crate) fn log_request(&mut self, method: Method, path_and_query: String) {
        if self.requests.len() >= MAX_REQUEST_LOG {
            self.requests.pop_front();
        }
        self.requests.push_back((method, path_and_query));
    }

    pub(crate) fn log_delete(&mut self, record: DeleteRecord) {
        if self.deletions.len() >= MAX_DELETE_LOG {
            self.deletions.pop_front();
        }
        self.deletions.push_back(record);
    }

    pub(crate) fn append_log(&mut self, namespace: &str, pod: &str, bytes: &[u8]) {
        let log = self
            .logs
            .entry((namespace.to_string(), pod.to_string()))
            .or_default();
        log.chunks.push_back((Timestamp::now(), bytes.to_vec()));
        log.kept_bytes += bytes.len();
        while log.kept_bytes > MAX_POD_LOG_BYTES {
            let Some((_, old)) = log.chunks.pop_front() else {
                break;
            };
            log.kept_bytes -= old.len();
            log.dropped_bytes += old.len() as u64;
        }
        self.dirty = true;
    }
}
