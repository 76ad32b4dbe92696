//! The workload table: a persistent (structurally shared) ordered map, so
//! publishing a read snapshot after a commit is O(1) however many
//! workloads are stored, and a change copies only the path to the record.

use std::ops::RangeBounds;
use std::sync::Arc;

use crate::records::WorkloadRecord;

#[derive(Clone, Default)]
pub struct Workloads {
    map: imbl::OrdMap<u64, Arc<Entry>>,
    /// The generation the next change gets.
    next_gen: u64,
}

/// A record and its generation: a number no other version of any record
/// in this table has had, so a reader can tell that a record it saw
/// before is unchanged without looking at it (the list's page cache).
#[derive(Clone)]
struct Entry {
    generation: u64,
    record: WorkloadRecord,
}

impl Workloads {
    pub fn get(&self, id: &u64) -> Option<&WorkloadRecord> {
        self.map.get(id).map(|e| &e.record)
    }

    /// The record to change (copied first if a snapshot still shares it);
    /// it gets a new generation.
    pub fn get_mut(&mut self, id: &u64) -> Option<&mut WorkloadRecord> {
        let generation = self.next_gen;
        let e = Arc::make_mut(self.map.get_mut(id)?);
        self.next_gen += 1;
        e.generation = generation;
        Some(&mut e.record)
    }

    pub fn insert(&mut self, w: WorkloadRecord) {
        let generation = self.next_gen;
        self.next_gen += 1;
        self.map.insert(
            w.id,
            Arc::new(Entry {
                generation,
                record: w,
            }),
        );
    }

    /// Removes a record; snapshots that share it keep it.
    pub fn remove(&mut self, id: &u64) -> Option<Removed> {
        self.map.remove(id).map(Removed)
    }

    pub fn contains_key(&self, id: &u64) -> bool {
        self.map.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The highest id stored.
    pub fn last_id(&self) -> Option<u64> {
        self.map.get_max().map(|(id, _)| *id)
    }

    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.keys().copied()
    }

    pub fn values(&self) -> impl Iterator<Item = &WorkloadRecord> + '_ {
        self.map.values().map(|e| &e.record)
    }

    /// Records with ids in `range`, in id order.
    pub fn range<R: RangeBounds<u64>>(&self, range: R) -> impl Iterator<Item = &WorkloadRecord> {
        self.map.range(range).map(|(_, e)| &e.record)
    }

    /// [`Workloads::range`] with each record's generation.
    pub fn range_with_gen<R: RangeBounds<u64>>(
        &self,
        range: R,
    ) -> impl Iterator<Item = (&WorkloadRecord, u64)> {
        self.map
            .range(range)
            .map(|(_, e)| (&e.record, e.generation))
    }
}

/// A record taken out of the table (still shared with older snapshots,
/// so not copied).
pub struct Removed(Arc<Entry>);

impl std::ops::Deref for Removed {
    type Target = WorkloadRecord;
    fn deref(&self) -> &WorkloadRecord {
        &self.0.record
    }
}

impl std::ops::Index<&u64> for Workloads {
    type Output = WorkloadRecord;
    fn index(&self, id: &u64) -> &WorkloadRecord {
        self.get(id).expect("no workload with this id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_gets_a_generation_never_seen_before() {
        let mut t = Workloads::default();
        let rec = crate::records::sample_record;
        t.insert(rec(1));
        t.insert(rec(2));
        let gens = |t: &Workloads| t.range_with_gen(..).map(|(_, g)| g).collect::<Vec<_>>();
        let before = gens(&t);
        let snapshot = t.clone();
        t.get_mut(&1).unwrap().epoch = 1;
        let after = gens(&t);
        assert_ne!(before[0], after[0]);
        assert_eq!(
            before[1], after[1],
            "an untouched record keeps its generation"
        );
        assert!(after[0] > before[1], "never one seen before");
        assert_eq!(
            snapshot.get(&1).unwrap().epoch,
            0,
            "snapshots are unchanged"
        );
        assert_eq!(gens(&snapshot), before);
    }
}
