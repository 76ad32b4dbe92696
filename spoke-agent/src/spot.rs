//! EC2 spot interruption notices, read on the instance itself: EC2 posts
//! `spot/instance-action` in the instance metadata service two minutes
//! before it reclaims spot capacity. A spoke started with
//! `--ec2-spot-notices` (a burst instance launched as spot) polls it with
//! IMDSv2 and hands the notice to the agent, whose heartbeats carry it to
//! the hub from then on; the hub drains the instance and stops its
//! workloads (a checkpointable one gets its checkpoint signal) in the time
//! left.
//!
//! IMDSv2: `PUT /latest/api/token` with
//! `X-aws-ec2-metadata-token-ttl-seconds` gives a session token;
//! `GET /latest/meta-data/spot/instance-action` with
//! `X-aws-ec2-metadata-token` answers 404 until a notice exists, then
//! `{"action": "terminate" | "stop" | "hibernate", "time": "<RFC 3339>"}`.

use std::time::Duration;

use axle_proto::pb;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::event::Event;

/// EC2's instance metadata service.
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";
/// How often the notice is looked for: a notice gives 120 s, so at most
/// 5 s of them go by before the spoke knows.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Lifetime asked for an IMDSv2 session token (EC2's maximum, six hours);
/// it is renewed a minute before it ends or when refused.
pub const TOKEN_TTL_S: u64 = 21_600;
/// One metadata call's deadline: the service is on the instance's own link.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest notice body read (EC2's is under 100 bytes).
pub const MAX_NOTICE_BYTES: usize = 4096;

/// A failed metadata call or an answer that is not a notice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("instance metadata: {0}")]
pub struct ImdsError(String);

/// Reads the provider's notice that it reclaims this instance.
pub struct Imds {
    base: String,
    client: reqwest::Client,
    token: Option<(String, Instant)>,
}

impl Imds {
    pub fn new(endpoint: &str) -> Result<Imds, ImdsError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            // The metadata service is link-local: never through a proxy.
            .no_proxy()
            .build()
            .map_err(|e| ImdsError(format!("cannot build its client: {e}")))?;
        Ok(Imds {
            base: endpoint.trim_end_matches('/').to_string(),
            client,
            token: None,
        })
    }

    async fn token(&mut self) -> Result<String, ImdsError> {
        if let Some((t, until)) = &self.token
            && Instant::now() < *until
        {
            return Ok(t.clone());
        }
        let resp = self
            .client
            .put(format!("{}/latest/api/token", self.base))
            .header(
                "X-aws-ec2-metadata-token-ttl-seconds",
                TOKEN_TTL_S.to_string(),
            )
            .send()
            .await
            .map_err(|e| ImdsError(format!("PUT /latest/api/token: {e}")))?;
        if !resp.status().is_success() {
            return Err(ImdsError(format!(
                "PUT /latest/api/token answered {}",
                resp.status()
            )));
        }
        let token = resp
            .text()
            .await
            .map_err(|e| ImdsError(format!("PUT /latest/api/token: {e}")))?;
        let until = Instant::now() + Duration::from_secs(TOKEN_TTL_S.saturating_sub(60));
        self.token = Some((token.clone(), until));
        Ok(token)
    }

    /// The notice, if EC2 has posted one.
    pub async fn notice(&mut self) -> Result<Option<pb::InterruptionNotice>, ImdsError> {
        let token = self.token().await?;
        let path = "/latest/meta-data/spot/instance-action";
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .header("X-aws-ec2-metadata-token", token)
            .send()
            .await
            .map_err(|e| ImdsError(format!("GET {path}: {e}")))?;
        match resp.status().as_u16() {
            404 => Ok(None),
            401 => {
                // The token expired or the service restarted: a new one next time.
                self.token = None;
                Err(ImdsError(format!(
                    "GET {path}: the session token was refused"
                )))
            }
            200 => {
                let body = resp
                    .bytes()
                    .await
                    .map_err(|e| ImdsError(format!("GET {path}: {e}")))?;
                if body.len() > MAX_NOTICE_BYTES {
                    return Err(ImdsError(format!(
                        "GET {path}: {} bytes, more than the {MAX_NOTICE_BYTES} a notice has",
                        body.len()
                    )));
                }
                parse_notice(&body).map(Some)
            }
            s => Err(ImdsError(format!("GET {path} answered {s}"))),
        }
    }
}

/// EC2's `spot/instance-action` document as a notice.
pub fn parse_notice(body: &[u8]) -> Result<pb::InterruptionNotice, ImdsError> {
    #[derive(serde::Deserialize)]
    struct Action {
        action: String,
        time: String,
    }
    let a: Action = serde_json::from_slice(body)
        .map_err(|e| ImdsError(format!("spot/instance-action is not a notice: {e}")))?;
    if !matches!(a.action.as_str(), "terminate" | "stop" | "hibernate") {
        return Err(ImdsError(format!(
            "spot/instance-action names action {:?}; EC2's are terminate, stop and hibernate",
            a.action
        )));
    }
    let at: jiff::Timestamp = a
        .time
        .parse()
        .map_err(|e| ImdsError(format!("spot/instance-action time {:?}: {e}", a.time)))?;
    let at_unix_ms = u64::try_from(at.as_millisecond()).map_err(|_| {
        ImdsError(format!(
            "spot/instance-action time {:?} is before 1970",
            a.time
        ))
    })?;
    Ok(pb::InterruptionNotice {
        action: a.action,
        at_unix_ms,
    })
}

/// Polls for the notice every [`POLL_INTERVAL`] until there is one, then
/// hands it to the agent and ends (a notice is not taken back).
pub async fn watch(endpoint: String, events: mpsc::Sender<Event>) {
    let mut imds = match Imds::new(&endpoint) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(error = %e, "spot interruption notices cannot be read");
            return;
        }
    };
    tracing::info!(endpoint = %endpoint, "watching for spot interruption notices");
    let mut failing = false;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match imds.notice().await {
            Ok(Some(n)) => {
                tracing::warn!(action = %n.action, at_unix_ms = n.at_unix_ms, "the provider reclaims this instance: telling the hub");
                let _ = events.send(Event::Interruption(n)).await;
                return;
            }
            Ok(None) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot read the spot interruption notice; trying again every {} s", POLL_INTERVAL.as_secs());
            }
            Err(e) => tracing::debug!(error = %e, "spot interruption notice"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2s_notice_document_parses_and_anything_else_is_refused() {
        let n =
            parse_notice(br#"{"action": "terminate", "time": "2026-12-06T08:22:00Z"}"#).unwrap();
        assert_eq!(n.action, "terminate");
        assert_eq!(
            n.at_unix_ms,
            "2026-12-06T08:22:00Z"
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_millisecond() as u64
        );
        for (body, says) in [
            (
                &br#"{"action": "reboot", "time": "2026-12-06T08:22:00Z"}"#[..],
                "reboot",
            ),
            (br#"{"action": "stop", "time": "soon"}"#, "soon"),
            (br#"{"action": "stop"}"#, "time"),
            (b"none", "not a notice"),
        ] {
            let e = parse_notice(body).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
