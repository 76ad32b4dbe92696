//! The workload table: a persistent (structurally shared) ordered map, so
//! publishing a read snapshot after a commit is O(1) however many
//! workloads are stored, and a change copies only the path to the record.

use std::ops::RangeBounds;
use std::sync::Arc;

use crate::records::WorkloadRecord;

#[derive(Clone, Default)]
pub struct Workloads(imbl::OrdMap<u64, Arc<WorkloadRecord>>);

impl Workloads {
    pub fn get(&self, id: &u64) -> Option<&WorkloadRecord> {
        self.0.get(id).map(|w| &**w)
    }

    /// The record to change; copied first if a snapshot still shares it.
    pub fn get_mut(&mut self, id: &u64) -> Option<&mut WorkloadRecord> {
        self.0.get_mut(id).map(Arc::make_mut)
    }

    pub fn insert(&mut self, w: WorkloadRecord) {
        self.0.insert(w.id, Arc::new(w));
    }

    pub fn remove(&mut self, id: &u64) -> Option<Arc<WorkloadRecord>> {
        self.0.remove(id)
    }

    pub fn contains_key(&self, id: &u64) -> bool {
        self.0.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The highest id stored.
    pub fn last_id(&self) -> Option<u64> {
        self.0.get_max().map(|(id, _)| *id)
    }

    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.keys().copied()
    }

    pub fn values(&self) -> impl Iterator<Item = &WorkloadRecord> + '_ {
        self.0.values().map(|w| &**w)
    }

    /// Records with ids in `range`, in id order.
    pub fn range<R: RangeBounds<u64>>(&self, range: R) -> impl Iterator<Item = &WorkloadRecord> {
        self.0.range(range).map(|(_, w)| &**w)
    }
}

impl std::ops::Index<&u64> for Workloads {
    type Output = WorkloadRecord;
    fn index(&self, id: &u64) -> &WorkloadRecord {
        self.get(id).expect("no workload with this id")
    }
}
