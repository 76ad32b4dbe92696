//! Spoke identity in the applier: join tokens minted, spent and pruned,
//! certificates issued, renewed and revoked, and the certificate check of a
//! registration. Everything here is a command like any other: durable before
//! it is answered, replicated with the store (see `crate::spoke_ca`).

use std::sync::Arc;

use super::applier::Effects;
use super::{HubConfig, HubError, Inner};
use crate::auth::{self, Action};
use crate::records::*;
use crate::spoke_ca::{self, JoinTokenRecord, SpokeCertRecord};

/// What a spoke receives for a join or a renewal.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cluster: String,
    pub certificate_pem: String,
    pub ca_pem: String,
    pub issued_at_ms: u64,
    pub not_after_ms: u64,
}

/// What `axle cluster revoke` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Revoked {
    pub cluster: String,
    pub certificates_revoked: usize,
    pub join_tokens_revoked: usize,
    pub session_ended: bool,
}

fn ttl_of(ttl_ms: u64) -> Result<u64, HubError> {
    match ttl_ms {
        0 => Ok(spoke_ca::DEFAULT_JOIN_TOKEN_TTL_MS),
        t if t > spoke_ca::MAX_JOIN_TOKEN_TTL_MS => Err(HubError::bad(
            format!(
                "ttl of {} hours is longer than a join token lives ({} hours at most)",
                t / 3_600_000,
                spoke_ca::MAX_JOIN_TOKEN_TTL_MS / 3_600_000
            ),
            Some("ttl"),
        )),
        t => Ok(t),
    }
}

/// The refusal of a join token the hub does not hold (or of something that is not one).
pub fn invalid_join_token() -> HubError {
    HubError::Unauthenticated(
        "the join token is not valid for this hub; mint one with `axle cluster join-token CLUSTER`"
            .into(),
    )
}

fn no_ca() -> HubError {
    HubError::Conflict(
        "this hub admits spokes with a shared token (--insecure-no-tls or --dev): it has no spoke CA to issue certificates from".into(),
    )
}

impl Inner {
    /// Drops join tokens and certificates that expired: they count against nothing.
    fn prune_identities(&mut self, fx: &mut Effects, now: u64) {
        let expired: Vec<String> = self
            .join_tokens
            .values()
            .filter(|t| t.expires_at_ms <= now)
            .map(|t| t.id.clone())
            .collect();
        for id in expired {
            fx.delete(join_token_key(&id));
            Arc::make_mut(&mut self.join_tokens).remove(&id);
        }
        let expired: Vec<String> = self
            .spoke_certs
            .values()
            .filter(|c| c.not_after_ms <= now)
            .map(|c| c.fingerprint.clone())
            .collect();
        for fp in expired {
            fx.delete(spoke_cert_key(&fp));
            Arc::make_mut(&mut self.spoke_certs).remove(&fp);
        }
    }

    pub(super) fn create_join_token(
        &mut self,
        cfg: &HubConfig,
        cluster: String,
        ttl_ms: u64,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(JoinTokenRecord, String), HubError> {
        let Some(by) = self.actor.clone() else {
            return Err(HubError::Internal("a join token without a caller".into()));
        };
        auth::may(&self.policy, &by, "", Action::ManageClusters)?;
        let ca = cfg.spoke_ca.as_ref().ok_or_else(no_ca)?;
        if !self.policy.clusters.is_empty() && !self.policy.clusters.contains_key(&cluster) {
            return Err(HubError::NotFound(format!(
                "cluster {cluster:?} is not declared in the policy (known: {}); add a Cluster document first",
                self.policy
                    .clusters
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if cluster.is_empty() || cluster.len() > 253 {
            return Err(HubError::bad(
                "a cluster name of 1 to 253 characters",
                Some("cluster"),
            ));
        }
        let ttl_ms = ttl_of(ttl_ms)?;
        self.mint_join_token(ca, &cluster, ttl_ms, &by.user, fx, now)
    }

    /// Mints a join token for `cluster` (a platform admin's, or the burst
    /// controller's for an instance it launches); answered with the record
    /// and the token, which is never stored.
    pub(super) fn mint_join_token(
        &mut self,
        ca: &spoke_ca::SpokeCa,
        cluster: &str,
        ttl_ms: u64,
        created_by: &str,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(JoinTokenRecord, String), HubError> {
        let cluster = cluster.to_string();
        self.prune_identities(fx, now);
        if self.join_tokens.len() >= spoke_ca::MAX_JOIN_TOKENS {
            return Err(HubError::Conflict(format!(
                "{} join tokens are live, the most the hub keeps ({}); let some expire first",
                self.join_tokens.len(),
                spoke_ca::MAX_JOIN_TOKENS
            )));
        }
        let (id, token, sha256) = spoke_ca::mint_join_token(&ca.pin())?;
        let record = JoinTokenRecord {
            v: 1,
            id: id.clone(),
            cluster: cluster.clone(),
            sha256,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(ttl_ms),
            created_by: created_by.to_string(),
            used_at_ms: None,
            used_csr_sha256: None,
        };
        fx.put(join_token_key(&id), &record);
        Arc::make_mut(&mut self.join_tokens).insert(id.clone(), record.clone());
        self.event(
            fx,
            now,
            "join_token_created",
            None,
            Some(&cluster),
            format!(
                "join token {id} for cluster {cluster}, valid {} min",
                ttl_ms.div_ceil(60_000)
            ),
        );
        Ok((record, token))
    }

    /// A new spoke's join: the token is checked and spent, the CSR signed.
    pub(super) fn join(
        &mut self,
        cfg: &HubConfig,
        token: &str,
        cluster: &str,
        csr_pem: &str,
        fx: &mut Effects,
        now: u64,
    ) -> Result<IssuedCert, HubError> {
        let ca = cfg.spoke_ca.as_ref().ok_or_else(no_ca)?;
        let bad = invalid_join_token;
        let (id, secret, pin) = spoke_ca::parse_join_token(token).ok_or_else(bad)?;
        if pin != ca.pin() {
            return Err(HubError::Unauthenticated(
                "the join token is for another hub (its CA hash differs from this hub's)".into(),
            ));
        }
        let record = self.join_tokens.get(id).ok_or_else(bad)?.clone();
        // Digests are compared, never secrets.
        if spoke_ca::sha256_hex(secret.as_bytes()) != record.sha256 {
            return Err(bad());
        }
        if now >= record.expires_at_ms {
            return Err(HubError::Unauthenticated(format!(
                "join token {id} expired; mint a new one with `axle cluster join-token {}`",
                record.cluster
            )));
        }
        let csr_sha256 = spoke_ca::sha256_hex(csr_pem.trim().as_bytes());
        let retry = record.used_csr_sha256.as_deref() == Some(csr_sha256.as_str());
        if let Some(at) = record.used_at_ms
            && !retry
        {
            tracing::warn!("join token {id} for {} presented again", record.cluster);
            return Err(HubError::Unauthenticated(format!(
                "join token {id} was already used (at {at} ms since the epoch); a join token \
                 admits one spoke once: mint a new one with `axle cluster join-token {}`",
                record.cluster
            )));
        }
        if record.cluster != cluster {
            return Err(HubError::PermissionDenied(format!(
                "join token {id} is for cluster {}, not {cluster}",
                record.cluster
            )));
        }
        let (certificate_pem, fingerprint) =
            ca.issue_spoke(csr_pem, cluster, now, cfg.spoke_cert_ttl_ms)?;
        self.prune_identities(fx, now);
        let mut spent = record;
        spent.used_at_ms = Some(spent.used_at_ms.unwrap_or(now));
        spent.used_csr_sha256 = Some(csr_sha256);
        fx.put(join_token_key(id), &spent);
        Arc::make_mut(&mut self.join_tokens).insert(id.to_string(), spent);
        // A join starts the cluster's identity afresh: what it held before is revoked.
        let old: Vec<String> = self
            .spoke_certs
            .values()
            .filter(|c| c.cluster == cluster)
            .map(|c| c.fingerprint.clone())
            .collect();
        for fp in old {
            fx.delete(spoke_cert_key(&fp));
            Arc::make_mut(&mut self.spoke_certs).remove(&fp);
        }
        let issued = self.record_cert(
            fx,
            cluster,
            fingerprint,
            format!("join token {id}"),
            now,
            cfg.spoke_cert_ttl_ms,
        );
        self.event(
            fx,
            now,
            "spoke_joined",
            None,
            Some(cluster),
            format!(
                "a spoke joined cluster {cluster} with join token {id}; its certificate {} is valid until {} ms",
                &issued.fingerprint[..16],
                issued.not_after_ms
            ),
        );
        Ok(IssuedCert {
            cluster: cluster.to_string(),
            certificate_pem,
            ca_pem: ca.cert_pem().to_string(),
            issued_at_ms: now,
            not_after_ms: issued.not_after_ms,
        })
    }

    fn record_cert(
        &mut self,
        fx: &mut Effects,
        cluster: &str,
        fingerprint: String,
        via: String,
        now: u64,
        ttl_ms: u64,
    ) -> SpokeCertRecord {
        let record = SpokeCertRecord {
            v: 1,
            fingerprint: fingerprint.clone(),
            cluster: cluster.to_string(),
            issued_at_ms: now,
            not_after_ms: now.saturating_add(ttl_ms),
            via,
            revoked_at_ms: None,
        };
        fx.put(spoke_cert_key(&fingerprint), &record);
        Arc::make_mut(&mut self.spoke_certs).insert(fingerprint, record.clone());
        // The newest MAX_CERTS_PER_CLUSTER stay valid; older ones go.
        let mut held: Vec<(u64, String)> = self
            .spoke_certs
            .values()
            .filter(|c| c.cluster == cluster && c.revoked_at_ms.is_none())
            .map(|c| (c.issued_at_ms, c.fingerprint.clone()))
            .collect();
        held.sort();
        while held.len() > spoke_ca::MAX_CERTS_PER_CLUSTER {
            let (_, fp) = held.remove(0);
            fx.delete(spoke_cert_key(&fp));
            Arc::make_mut(&mut self.spoke_certs).remove(&fp);
        }
        record
    }

    /// A joined spoke's renewal, authorized by the certificate it connects with.
    pub(super) fn renew(
        &mut self,
        cfg: &HubConfig,
        peer: Option<&str>,
        csr_pem: &str,
        fx: &mut Effects,
        now: u64,
    ) -> Result<IssuedCert, HubError> {
        let ca = cfg.spoke_ca.as_ref().ok_or_else(no_ca)?;
        let current = self.check_spoke_cert(peer, None, now)?.clone();
        let cluster = current.cluster.clone();
        let (certificate_pem, fingerprint) =
            ca.issue_spoke(csr_pem, &cluster, now, cfg.spoke_cert_ttl_ms)?;
        self.prune_identities(fx, now);
        let issued = self.record_cert(
            fx,
            &cluster,
            fingerprint,
            format!("renewal of {}", &current.fingerprint[..16]),
            now,
            cfg.spoke_cert_ttl_ms,
        );
        self.event(
            fx,
            now,
            "spoke_cert_renewed",
            None,
            Some(&cluster),
            format!(
                "cluster {cluster} renewed its certificate: {} replaces {}, valid until {} ms",
                &issued.fingerprint[..16],
                &current.fingerprint[..16],
                issued.not_after_ms
            ),
        );
        Ok(IssuedCert {
            cluster,
            certificate_pem,
            ca_pem: ca.cert_pem().to_string(),
            issued_at_ms: now,
            not_after_ms: issued.not_after_ms,
        })
    }

    /// The record of the certificate a spoke connects with (`peer`: its
    /// fingerprint), if it is one this hub issued, live and, with `cluster`,
    /// for that cluster.
    pub(super) fn check_spoke_cert(
        &self,
        peer: Option<&str>,
        cluster: Option<&str>,
        now: u64,
    ) -> Result<&SpokeCertRecord, HubError> {
        let Some(fp) = peer else {
            return Err(HubError::Unauthenticated(
                "this hub admits spokes by certificate, and this one presented none: start it \
                 once with --join-token (from `axle cluster join-token CLUSTER`)"
                    .into(),
            ));
        };
        let Some(record) = self.spoke_certs.get(fp) else {
            return Err(HubError::Unauthenticated(
                "this certificate is not one this hub holds for any cluster (replaced, expired \
                 or never issued here); join again with a new join token"
                    .into(),
            ));
        };
        if let Some(at) = record.revoked_at_ms {
            return Err(HubError::PermissionDenied(format!(
                "cluster {} was revoked (at {at} ms since the epoch); a platform admin can let it \
                 in again with a new join token",
                record.cluster
            )));
        }
        if now >= record.not_after_ms {
            return Err(HubError::Unauthenticated(format!(
                "the certificate of cluster {} expired; join again with a new join token",
                record.cluster
            )));
        }
        if let Some(c) = cluster
            && c != record.cluster
        {
            tracing::warn!(
                "a spoke with the certificate of cluster {} tried to register as {c}",
                record.cluster
            );
            return Err(HubError::PermissionDenied(format!(
                "this certificate names cluster {}; it cannot register as cluster {c}",
                record.cluster
            )));
        }
        Ok(record)
    }

    /// Cuts a cluster's spoke off: its certificates are refused from this
    /// commit on, its unused join tokens are void, and its session ends.
    pub(super) fn revoke_cluster(
        &mut self,
        cluster: &str,
        fx: &mut Effects,
        now: u64,
    ) -> Result<Revoked, HubError> {
        let Some(by) = self.actor.clone() else {
            return Err(HubError::Internal("a revocation without a caller".into()));
        };
        auth::may(&self.policy, &by, "", Action::ManageClusters)?;
        let certs: Vec<String> = self
            .spoke_certs
            .values()
            .filter(|c| c.cluster == cluster && c.revoked_at_ms.is_none())
            .map(|c| c.fingerprint.clone())
            .collect();
        for fp in &certs {
            if let Some(c) = Arc::make_mut(&mut self.spoke_certs).get_mut(fp) {
                c.revoked_at_ms = Some(now);
                fx.put(spoke_cert_key(fp), &*c);
            }
        }
        let tokens: Vec<String> = self
            .join_tokens
            .values()
            .filter(|t| t.cluster == cluster && t.used_at_ms.is_none())
            .map(|t| t.id.clone())
            .collect();
        for id in &tokens {
            fx.delete(join_token_key(id));
            Arc::make_mut(&mut self.join_tokens).remove(id);
        }
        if certs.is_empty() && tokens.is_empty() && !self.clusters.contains_key(cluster) {
            return Err(HubError::NotFound(format!(
                "cluster {cluster:?} has no spoke, certificate or join token here"
            )));
        }
        let open = self
            .clusters
            .get(cluster)
            .and_then(|c| c.session.session().map(|(conn, _)| conn));
        let session_ended = match open {
            Some(conn) => {
                self.spoke_step(cluster, super::SpokeEvent::StreamEnded { conn }, fx, now)
            }
            None => false,
        };
        self.event(
            fx,
            now,
            "cluster_revoked",
            None,
            Some(cluster),
            format!(
                "cluster {cluster} revoked: {} certificates, {} unused join tokens{}",
                certs.len(),
                tokens.len(),
                if session_ended {
                    "; its spoke session ended"
                } else {
                    ""
                }
            ),
        );
        Ok(Revoked {
            cluster: cluster.to_string(),
            certificates_revoked: certs.len(),
            join_tokens_revoked: tokens.len(),
            session_ended,
        })
    }
}
