//! The pod log endpoint: what tests appended, filtered by `sinceTime`,
//! `sinceSeconds`, `tailLines` and `limitBytes`; with `follow=true` a stream
//! of appended bytes until the pod finishes (log drained) or is deleted.

use std::collections::HashMap;
use std::io;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::errors::ApiError;
use crate::kinds::{Kind, Object};
use crate::kubelet;
use crate::store::{PodLog, State};

/// The log query, parsed.
#[derive(Debug, Default)]
struct LogQuery {
    follow: bool,
    container: Option<String>,
    since: Option<Timestamp>,
    limit_bytes: Option<usize>,
    tail_lines: Option<usize>,
    timestamps: bool,
}

fn parse_query(q: &HashMap<String, String>) -> Result<LogQuery, ApiError> {
    let int = |name: &str| -> Result<Option<i64>, ApiError> {
        q.get(name)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| ApiError::bad_request(format!("{name}: invalid value {v:?}")))
            })
            .transpose()
    };
    let since_time = q
        .get("sinceTime")
        .map(|v| {
            v.parse::<Timestamp>()
                .map_err(|_| ApiError::bad_request(format!("sinceTime: invalid value {v:?}")))
        })
        .transpose()?;
    let since_seconds = int("sinceSeconds")?;
    if since_time.is_some() && since_seconds.is_some() {
        return Err(ApiError::bad_request(
            "at most one of sinceTime or sinceSeconds may be specified",
        ));
    }
    let since = since_time.or(since_seconds.and_then(|s| {
        Timestamp::now()
            .checked_sub(SignedDuration::from_secs(s))
            .ok()
    }));
    let positive = |v: Option<i64>, name: &str| -> Result<Option<usize>, ApiError> {
        match v {
            Some(n) if n < 0 || (name == "limitBytes" && n == 0) => Err(ApiError::bad_request(
                format!("{name}: must be greater than 0"),
            )),
            Some(n) => Ok(Some(n as usize)),
            None => Ok(None),
        }
    };
    Ok(LogQuery {
        follow: q.get("follow").is_some_and(|v| v == "true" || v == "1"),
        container: q.get("container").cloned(),
        since,
        limit_bytes: positive(int("limitBytes")?, "limitBytes")?,
        tail_lines: positive(int("tailLines")?, "tailLines")?,
        timestamps: q.get("timestamps").is_some_and(|v| v == "true" || v == "1"),
    })
}

fn render_chunk(out: &mut Vec<u8>, at: Timestamp, chunk: &[u8], timestamps: bool) {
    if !timestamps {
        out.extend_from_slice(chunk);
        return;
    }
    for piece in chunk.split_inclusive(|b| *b == b'\n') {
        out.extend_from_slice(format!("{at} ").as_bytes());
        out.extend_from_slice(piece);
    }
}

/// Bytes of `log` at or after absolute offset `from`, and the end offset.
fn read_from(
    log: Option<&PodLog>,
    from: u64,
    q: &LogQuery,
    since: Option<Timestamp>,
) -> (Vec<u8>, u64) {
    let Some(log) = log else {
        return (Vec::new(), from);
    };
    let mut pos = log.dropped_bytes;
    let mut out = Vec::new();
    for (at, chunk) in &log.chunks {
        let end = pos + chunk.len() as u64;
        if end > from && since.is_none_or(|t| *at >= t) {
            let skip = from.saturating_sub(pos) as usize;
            render_chunk(&mut out, *at, &chunk[skip.min(chunk.len())..], q.timestamps);
        }
        pos = end;
    }
    (out, pos.max(from))
}

fn keep_tail(bytes: Vec<u8>, lines: usize) -> Vec<u8> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let mut seen = 0;
    let start = body.iter().rposition(|b| {
        if *b == b'\n' {
            seen += 1;
        }
        seen == lines && *b == b'\n'
    });
    match start {
        Some(i) if lines > 0 => bytes[i + 1..].to_vec(),
        _ if lines == 0 => Vec::new(),
        _ => bytes,
    }
}

/// GET `/api/v1/namespaces/{ns}/pods/{name}/log`.
pub(crate) fn logs(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    query: &HashMap<String, String>,
    shutdown: watch::Receiver<bool>,
) -> Result<Response, ApiError> {
    let q = parse_query(query)?;
    let key = (Kind::Pod, namespace.to_string(), name.to_string());
    let log_key = (namespace.to_string(), name.to_string());
    let mut changed = cluster.subscribe();
    changed.borrow_and_update();
    let (mut first, offset) = cluster.read(|s: &State| {
        let Some(Object::Pod(pod)) = s.get(&key) else {
            return Err(ApiError::not_found(Kind::Pod, name));
        };
        let containers: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|sp| sp.containers.iter().map(|c| c.name.clone()))
            .collect();
        let container = match &q.container {
            Some(c) if containers.contains(c) => c.clone(),
            Some(c) => {
                return Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )));
            }
            None if containers.len() == 1 => containers[0].clone(),
            None => {
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    containers.join(" ")
                )));
            }
        };
        let log = s.logs.get(&log_key);
        // A container that never started has no log: the kubelet answers 400.
        // A test that appended bytes wants them read, so those are served.
        if log.is_none_or(|l| l.kept_bytes == 0)
            && let Some(reason) = kubelet::waiting_to_start(pod, &container)
        {
            return Err(ApiError::bad_request(format!(
                "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
            )));
        }
        Ok(read_from(log, 0, &q, q.since))
    })?;
    if let Some(n) = q.tail_lines {
        first = keep_tail(first, n);
    }
    let mut budget = q.limit_bytes.unwrap_or(usize::MAX);
    first.truncate(budget);
    budget -= first.len();
    let plain = |body: Body| ([(header::CONTENT_TYPE, "text/plain")], body).into_response();
    if !q.follow || budget == 0 {
        return Ok((StatusCode::OK, plain(Body::from(first))).into_response());
    }
    struct Follow {
        cluster: Cluster,
        key: (Kind, String, String),
        log_key: (String, String),
        offset: u64,
        budget: usize,
        first: Option<Vec<u8>>,
        q: LogQuery,
    }
    let state = Follow {
        cluster: cluster.clone(),
        key,
        log_key,
        offset,
        budget,
        first: Some(first),
        q,
    };
    let stream = futures::stream::unfold((state, changed), move |(mut f, mut changed)| {
        let mut shutdown = shutdown.clone();
        async move {
            if let Some(first) = f.first.take().filter(|b| !b.is_empty()) {
                return Some((Ok::<_, io::Error>(Bytes::from(first)), (f, changed)));
            }
            loop {
                if f.budget == 0 {
                    return None;
                }
                changed.borrow_and_update();
                let (mut bytes, end, done) = f.cluster.read(|s| {
                    let pod_gone_or_done = match s.get(&f.key) {
                        Some(Object::Pod(p)) => kubelet::is_terminal(p),
                        _ => true,
                    };
                    let (bytes, end) = read_from(s.logs.get(&f.log_key), f.offset, &f.q, None);
                    (bytes, end, pod_gone_or_done)
                });
                f.offset = end;
                if !bytes.is_empty() {
                    bytes.truncate(f.budget);
                    f.budget -= bytes.len();
                    return Some((Ok(Bytes::from(bytes)), (f, changed)));
                }
                if done {
                    return None;
                }
                tokio::select! {
                    r = changed.changed() => if r.is_err() { return None },
                    _ = shutdown.wait_for(|stopped| *stopped) => {
                        return Some((Err(io::Error::other("kube test server stopped")), (f, changed)));
                    }
                }
            }
        }
    });
    Ok((StatusCode::OK, plain(Body::from_stream(stream))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_from_offsets_and_times() {
        let t0: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2025-01-01T00:00:10Z".parse().unwrap();
        let log = PodLog {
            chunks: [(t0, b"old\n".to_vec()), (t1, b"new\nmore\n".to_vec())].into(),
            dropped_bytes: 100,
            kept_bytes: 13,
        };
        let q = LogQuery::default();
        assert_eq!(
            read_from(Some(&log), 0, &q, None),
            (b"old\nnew\nmore\n".to_vec(), 113)
        );
        assert_eq!(
            read_from(Some(&log), 106, &q, None),
            (b"w\nmore\n".to_vec(), 113)
        );
        assert_eq!(read_from(Some(&log), 0, &q, Some(t1)).0, b"new\nmore\n");
        let stamped = LogQuery {
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(read_from(Some(&log), 104, &stamped, None).0).unwrap(),
            "2025-01-01T00:00:10Z new\n2025-01-01T00:00:10Z more\n"
        );
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(keep_tail(b"a\nb\nc\n".to_vec(), 2), b"b\nc\n");
        assert_eq!(keep_tail(b"a\nb\nc\n".to_vec(), 5), b"a\nb\nc\n");
        assert_eq!(keep_tail(b"a\nb\nc".to_vec(), 1), b"c");
        assert_eq!(keep_tail(b"a\nb\n".to_vec(), 0), b"");
    }
}
