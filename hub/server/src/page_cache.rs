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
//!
//! A client that accepts gzip gets the page compressed, as the Kubernetes
//! API server compresses large lists: a page of 500 is ~350 KB of JSON and
//! ~10 times less compressed, and a full-speed poller then costs the hub
//! the sending of a tenth of the bytes. The compressed body is made once,
//! the first time a gzip client asks for the page, and kept beside the
//! JSON (both count against the bound).

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

/// Bodies smaller than this go uncompressed even to a gzip client: below a
/// few packets, compressing costs more than the bytes it saves.
pub const GZIP_MIN_BYTES: usize = 16 << 10;

/// How the client takes the body (its `Accept-Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

/// A page's body as sent: `gzip` says whether it is compressed.
#[derive(Debug, Clone)]
pub struct Body {
    pub bytes: Bytes,
    pub gzip: bool,
}

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
    visible_teams: Option<std::collections::BTreeSet<String>>,
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
    json: Bytes,
    gzip: Option<Bytes>,
    last_used: Instant,
}

impl Kept {
    fn bytes(&self) -> usize {
        self.json.len() + self.gzip.as_ref().map_or(0, Bytes::len)
    }
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

    /// The body of `page` (asked for with `q`, taken as `encoding`): the
    /// kept one when the page is unchanged, else `build`'s JSON, kept if
    /// there is room.
    pub fn body(
        &self,
        q: &ListParams,
        page: &Page<'_>,
        now: Instant,
        encoding: Encoding,
        build: impl FnOnce(&Page<'_>) -> Result<Vec<u8>, HubError>,
    ) -> Result<(Body, Served), HubError> {
        let key = Key {
            start: page.start,
            limit: page.limit,
            team: q.team.clone(),
            state: q.state.clone(),
            cluster: q.cluster.clone(),
            priority: q.priority.clone(),
            name_prefix: q.name_prefix.clone(),
            visible_teams: q.visible_teams.clone(),
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
        let wants_gzip = |json: &Bytes| encoding == Encoding::Gzip && json.len() >= GZIP_MIN_BYTES;
        let kept_json = {
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            match pages.map.get_mut(&key) {
                Some(k) if k.signature == signature => {
                    k.last_used = now;
                    if !wants_gzip(&k.json) {
                        return Ok((plain(k.json.clone()), Served::Kept));
                    }
                    if let Some(z) = &k.gzip {
                        return Ok((gzipped(z.clone()), Served::Kept));
                    }
                    Some(k.json.clone())
                }
                _ => None,
            }
        };
        if let Some(json) = kept_json {
            // Compressed outside the lock, then kept beside the JSON if the
            // page is still the same one and there is room.
            let z = compress(&json)?;
            let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
            let room = pages.bytes + z.len() <= self.limit_bytes;
            if let Some(k) = pages.map.get_mut(&key)
                && k.json.as_ptr() == json.as_ptr()
                && k.gzip.is_none()
                && room
            {
                k.gzip = Some(z.clone());
                pages.bytes += z.len();
            }
            return Ok((gzipped(z), Served::Kept));
        }
        // Built (and compressed) outside the lock: other pages are served
        // meanwhile.
        let json = Bytes::from(build(page)?);
        let gzip = if wants_gzip(&json) {
            Some(compress(&json)?)
        } else {
            None
        };
        let sent = match &gzip {
            Some(z) => gzipped(z.clone()),
            None => plain(json.clone()),
        };
        let reasons = page
            .items
            .iter()
            .filter_map(|i| i.reason.cloned())
            .collect();
        let kept = Kept {
            signature,
            _reasons: reasons,
            json,
            gzip,
            last_used: now,
        };
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = pages.map.remove(&key) {
            pages.bytes -= old.bytes();
        }
        while pages.bytes + kept.bytes() > self.limit_bytes {
            let idle = pages
                .map
                .iter()
                .min_by_key(|(_, k)| k.last_used)
                .filter(|(_, k)| now.saturating_duration_since(k.last_used) >= PAGE_IDLE)
                .map(|(key, _)| key.clone());
            let Some(idle) = idle else {
                return Ok((sent, Served::Built));
            };
            if let Some(old) = pages.map.remove(&idle) {
                pages.bytes -= old.bytes();
            }
        }
        pages.bytes += kept.bytes();
        pages.map.insert(key, kept);
        Ok((sent, Served::Built))
    }

    /// Bytes kept now.
    pub fn bytes(&self) -> usize {
        self.pages.lock().unwrap_or_else(|e| e.into_inner()).bytes
    }
}

fn plain(bytes: Bytes) -> Body {
    Body { bytes, gzip: false }
}

fn gzipped(bytes: Bytes) -> Body {
    Body { bytes, gzip: true }
}

/// gzip at the fastest level: list JSON is repetitive enough that level 1
/// already shrinks it about tenfold, at a few ms per page of 500.
fn compress(json: &[u8]) -> Result<Bytes, HubError> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(
        Vec::with_capacity(json.len() / 8),
        flate2::Compression::fast(),
    );
    z.write_all(json)
        .and_then(|()| z.finish())
        .map(Bytes::from)
        .map_err(|e| HubError::Internal(format!("cannot compress a page: {e}")))
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
                .body(&q, &page(t, reasons, next), now, Encoding::Identity, |p| {
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

    fn gunzip(b: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn a_gzip_client_gets_the_page_compressed_once_and_kept() {
        let cache = PageCache::new();
        let q = ListParams::default();
        let now = Instant::now();
        let mut t = Workloads::default();
        t.insert(sample_record(1));
        let json = br#"{"items":[{"id":1,"name":"w"}]}"#.repeat(1000);
        let serve = |encoding| {
            cache
                .body(
                    &q,
                    &page(&t, &[], None),
                    now,
                    encoding,
                    |_| Ok(json.clone()),
                )
                .unwrap()
        };
        // Built for a plain client; a gzip client then gets it compressed.
        let (plain, served) = serve(Encoding::Identity);
        assert_eq!(
            (plain.gzip, served, &plain.bytes[..]),
            (false, Served::Built, &json[..])
        );
        let (z, served) = serve(Encoding::Gzip);
        assert_eq!((z.gzip, served), (true, Served::Kept));
        assert!(z.bytes.len() * 10 < json.len(), "{} bytes", z.bytes.len());
        assert_eq!(gunzip(&z.bytes), json);
        // Compressed once: the next gzip client gets the same buffer.
        let (again, _) = serve(Encoding::Gzip);
        assert_eq!(again.bytes.as_ptr(), z.bytes.as_ptr());
        assert_eq!(cache.bytes(), json.len() + z.bytes.len());
        // A small page goes plain even to a gzip client.
        let small = PageCache::new();
        let (b, _) = small
            .body(&q, &page(&t, &[], None), now, Encoding::Gzip, |_| {
                Ok(b"{}".to_vec())
            })
            .unwrap();
        assert!(!b.gzip);
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_keeps_busy_pages() {
        let cache = PageCache::with_limit(100);
        let t0 = Instant::now();
        let mut t = Workloads::default();
        t.insert(sample_record(1));
        let body = |q: &ListParams, at: Instant| {
            cache
                .body(q, &page(&t, &[], None), at, Encoding::Identity, |_| {
                    Ok(vec![b'x'; 60])
                })
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
