//! The workload list's page cache. Most of a big hub's workloads do not
//! change between two polls of the list (finished ones never do), yet
//! building a page of 500 costs milliseconds of conversion and JSON. So the
//! JSON of each page is kept and served again while the page is the same:
//! the same records, each at the same generation, with the same pending
//! reasons. Checking that touches 500 small entries, not the records'
//! contents, and the answer is a reference-counted buffer (no copy).
//!
//! Bounded by [`PAGE_CACHE_BYTES`]. When full, the least recently used page
//! makes room only if it was idle for [`PAGE_IDLE`]; otherwise the new page
//! is served without being kept. Pollers walking a list larger than the
//! cache then keep hitting the pages already kept, rather than each new
//! page pushing out the one the next walk needs first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axle_scheduler::PendingReason;
use axum::body::Bytes;

use crate::hub::{HubError, ListParams, Page};

/// Bytes of page JSON kept at most: the pages of 100,000 workloads are
/// ~70 MB; 64 MiB keeps most of them within the hub's memory budget.
pub const PAGE_CACHE_BYTES: usize = 64 << 20;

/// A kept page unused this long may give way to a new one.
pub const PAGE_IDLE: Duration = Duration::from_secs(10);

/// Which page: the request, resolved (`start` from the continue token).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    start: u64,
    limit: usize,
    team: Option<String>,
    state: Option<String>,
    cluster: Option<String>,
    priority: Option<String>,
    name_prefix: Option<String>,
}

/// What a page showed: (id, generation, reason pointer) per item. The
/// reasons are held, so a pointer cannot be reused by another reason while
/// the page is kept.
#[derive(PartialEq, Eq)]
struct Signature {
    items: Vec<(u64, u64, usize)>,
    next: Option<String>,
}

struct Kept {
    signature: Signature,
    _reasons: Vec<Arc<PendingReason>>,
    body: Bytes,
    last_used: Instant,
}

#[derive(Default)]
struct Pages {
    map: HashMap<Key, Kept>,
    bytes: usize,
}

/// See the module documentation.
#[derive(Default)]
pub struct PageCache {
    pages: Mutex<Pages>,
    limit_bytes: usize,
}

/// How a page was served, for tests and figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Kept,
    Built,
}

impl PageCache {
    pub fn new() -> PageCache {
        PageCache::with_limit(PAGE_CACHE_BYTES)
    }

    pub fn with_limit(limit_bytes: usize) -> PageCache {
        PageCache {
            pages: Mutex::default(),
            limit_bytes,
        }
    }

    /// The body of `page` (asked for with `q`): the kept one when the page
    /// is unchanged, else `build`'s, kept if there is room.
    pub fn body(
        &self,
        q: &ListParams,
        page: &Page<'_>,
        now: Instant,
        build: impl FnOnce(&Page<'_>) -> Result<Vec<u8>, HubError>,
    ) -> Result<(Bytes, Served), HubError> {
        let key = Key {
            start: page.start,
            limit: page.limit,
            team: q.team.clone(),
            state: q.state.clone(),
            cluster: q.cluster.clone(),
            priority: q.priority.clone(),
            name_prefix: q.name_prefix.clone(),
        };
        let signature = Signature {
            items: page
                .items
                .iter()
                .map(|i| {
                    (
                        i.record.id,
                        i.generation,
                        i.reason.map_or(0, |r| Arc::as_ptr(r) as usize),
                    )
                })
                .collect(),
            next: page.next.clone(),
        };
        {
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = pages.map.get_mut(&key)
                && k.signature == signature
            {
                k.last_used = now;
                return Ok((k.body.clone(), Served::Kept));
            }
        }
        // Built outside the lock: other pages are served meanwhile.
        let body = Bytes::from(build(page)?);
        let reasons = page
            .items
            .iter()
            .filter_map(|i| i.reason.cloned())
            .collect();
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = pages.map.remove(&key) {
            pages.bytes -= old.body.len();
        }
        while pages.bytes + body.len() > self.limit_bytes {
            let idle = pages
                .map
                .iter()
                .min_by_key(|(_, k)| k.last_used)
                .filter(|(_, k)| now.saturating_duration_since(k.last_used) >= PAGE_IDLE)
                .map(|(key, _)| key.clone());
            let Some(idle) = idle else {
                return Ok((body, Served::Built));
            };
            if let Some(old) = pages.map.remove(&idle) {
                pages.bytes -= old.body.len();
            }
        }
        pages.bytes += body.len();
        pages.map.insert(
            key,
            Kept {
                signature,
                _reasons: reasons,
                body: body.clone(),
                last_used: now,
            },
        );
        Ok((body, Served::Built))
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.pages.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::{PageItem, Workloads};
    use crate::records::sample_record;

    fn page<'a>(
        t: &'a Workloads,
        reasons: &'a [Arc<PendingReason>],
        next: Option<&str>,
    ) -> Page<'a> {
        Page {
            start: 0,
            limit: 500,
            items: t
                .range_with_gen(..)
                .enumerate()
                .map(|(i, (record, generation))| PageItem {
                    record,
                    generation,
                    reason: reasons.get(i),
                })
                .collect(),
            next: next.map(str::to_string),
        }
    }

    fn reason() -> Arc<PendingReason> {
        Arc::new(PendingReason::NotEvaluated)
    }

    #[test]
    fn a_page_is_served_again_only_while_nothing_on_it_changed() {
        let cache = PageCache::new();
        let q = ListParams::default();
        let now = Instant::now();
        let mut t = Workloads::default();
        t.insert(sample_record(1));
        t.insert(sample_record(2));
        let reasons = vec![reason()];
        let mut builds = 0;
        let mut serve = |t: &Workloads, reasons: &[Arc<PendingReason>], next: Option<&str>| {
            cache
                .body(&q, &page(t, reasons, next), now, |p| {
                    builds += 1;
                    Ok(format!("{} items", p.items.len()).into_bytes())
                })
                .unwrap()
                .1
        };
        assert_eq!(serve(&t, &reasons, None), Served::Built);
        assert_eq!(serve(&t, &reasons, None), Served::Kept);
        // A record changed.
        t.get_mut(&2).unwrap().epoch = 1;
        assert_eq!(serve(&t, &reasons, None), Served::Built);
        assert_eq!(serve(&t, &reasons, None), Served::Kept);
        // A new reason, even an equal one, is a new pointer.
        let other = vec![reason()];
        assert_eq!(serve(&t, &other, None), Served::Built);
        // A record joined the range; the page now has a next page.
        t.insert(sample_record(3));
        assert_eq!(serve(&t, &other, None), Served::Built);
        assert_eq!(serve(&t, &other, Some("w1.3")), Served::Built);
        assert_eq!(serve(&t, &other, Some("w1.3")), Served::Kept);
        assert_eq!(builds, 5);
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_keeps_busy_pages() {
        let cache = PageCache::with_limit(100);
        let t0 = Instant::now();
        let mut t = Workloads::default();
        t.insert(sample_record(1));
        let body = |q: &ListParams, at: Instant| {
            cache
                .body(q, &page(&t, &[], None), at, |_| Ok(vec![b'x'; 60]))
                .unwrap()
                .1
        };
        let a = ListParams::default();
        let b = ListParams {
            team: Some("t".into()),
            ..Default::default()
        };
        assert_eq!(body(&a, t0), Served::Built);
        // No room for b while a is in use: served, not kept.
        assert_eq!(body(&b, t0), Served::Built);
        assert_eq!(body(&b, t0), Served::Built);
        assert_eq!(body(&a, t0), Served::Kept);
        assert!(cache.bytes() <= 100);
        // Once a is idle, b takes its place.
        let later = t0 + PAGE_IDLE;
        assert_eq!(body(&b, later), Served::Built);
        assert_eq!(body(&b, later), Served::Kept);
        assert_eq!(body(&a, later), Served::Built);
        assert!(cache.bytes() <= 100);
    }
}
