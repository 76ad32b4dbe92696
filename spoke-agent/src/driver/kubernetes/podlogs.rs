//! Following one pod's log through the API server into the run's log
//! writer: reopened after a broken stream (an API server restart, a 410, a
//! network blip), skipping the bytes already read, so the output arrives
//! once and whole.

use std::time::Duration;

use futures::AsyncReadExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use tokio::sync::mpsc;

use super::manifest::CONTAINER;
use crate::logs::LineSplitter;

/// How a follower paces and bounds its reopens.
#[derive(Debug, Clone, Copy)]
pub struct Reopen {
    pub after: Duration,
    pub max: u32,
}

/// Follows `pod`'s workload container until its log ends (the container
/// exited and everything was read), the pod is gone, the run's writer is
/// closed, or `reopen.max` reopens were spent. `prefix` marks every line
/// (`[r1] `) for gangs.
pub async fn follow(
    api: Api<Pod>,
    pod: String,
    prefix: Option<String>,
    tx: mpsc::Sender<Vec<u8>>,
    reopen: Reopen,
) {
    let lp = LogParams {
        follow: true,
        container: Some(CONTAINER.to_string()),
        ..LogParams::default()
    };
    let mut splitter = prefix.as_deref().map(LineSplitter::new);
    let mut delivered: u64 = 0;
    let mut reopens = 0;
    let mut buf = vec![0u8; 8 * 1024];
    'open: loop {
        match api.log_stream(&pod, &lp).await {
            Ok(mut reader) => {
                // A reopened stream starts at the beginning of the log.
                let mut skip = delivered;
                loop {
                    let n = match reader.read(&mut buf).await {
                        Ok(0) => break 'open,
                        Ok(n) => n,
                        Err(e) => {
                            tracing::debug!(%pod, error = %e, "the pod's log stream broke");
                            break;
                        }
                    };
                    let mut chunk = &buf[..n];
                    if skip > 0 {
                        let drop = usize::try_from(skip).unwrap_or(usize::MAX).min(chunk.len());
                        chunk = &chunk[drop..];
                        skip -= drop as u64;
                    }
                    if chunk.is_empty() {
                        continue;
                    }
                    delivered += chunk.len() as u64;
                    let data = match splitter.as_mut() {
                        Some(s) => s.feed(chunk),
                        None => chunk.to_vec(),
                    };
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        return;
                    }
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => break,
            Err(e) => tracing::debug!(%pod, error = %e, "cannot open the pod's log"),
        }
        if reopens >= reopen.max || tx.is_closed() {
            tracing::warn!(%pod, reopens, "gave up following the pod's log");
            break;
        }
        reopens += 1;
        tokio::time::sleep(reopen.after).await;
    }
    if let Some(rest) = splitter.as_mut().map(LineSplitter::finish)
        && !rest.is_empty()
    {
        let _ = tx.send(rest).await;
    }
}
