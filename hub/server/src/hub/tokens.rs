//! Minting API tokens: a platform admin's command, applied like every other
//! change (durable before it is answered, replicated with the store). Only
//! the digest is stored; the token itself is in the answer, once.

use std::sync::Arc;

use super::applier::Effects;
use super::{HubError, Inner};
use crate::auth::{self, Action, TokenRecord};
use crate::records::*;

impl Inner {
    pub(super) fn create_token(
        &mut self,
        user: String,
        ttl_ms: u64,
        fx: &mut Effects,
        now: u64,
    ) -> Result<(TokenRecord, String), HubError> {
        let Some(by) = self.actor.clone() else {
            return Err(HubError::Internal("a token without a caller".into()));
        };
        auth::may(&self.policy, &by, "", Action::ManageTokens)?;
        auth::check_user(&user)?;
        let ttl_ms = match ttl_ms {
            0 => auth::DEFAULT_TOKEN_TTL_MS,
            t if t > auth::MAX_TOKEN_TTL_MS => {
                return Err(HubError::bad(
                    format!(
                        "ttl of {} days is longer than the longest token life of {} days",
                        t / 86_400_000,
                        auth::MAX_TOKEN_TTL_MS / 86_400_000
                    ),
                    Some("ttl"),
                ));
            }
            t => t,
        };
        // Expired tokens go first: they count against nothing.
        let expired: Vec<String> = self
            .tokens
            .values()
            .filter(|t| t.expires_at_ms <= now)
            .map(|t| t.id.clone())
            .collect();
        for id in expired {
            fx.delete(token_key(&id));
            Arc::make_mut(&mut self.tokens).remove(&id);
        }
        if self.tokens.len() >= auth::MAX_TOKENS {
            return Err(HubError::Conflict(format!(
                "{} live API tokens, the most the hub keeps ({}); let some expire first",
                self.tokens.len(),
                auth::MAX_TOKENS
            )));
        }
        let (id, token, sha256) = auth::mint()?;
        let record = TokenRecord::new(id.clone(), sha256, &user, &by.user, now, ttl_ms);
        fx.put(token_key(&id), &record);
        Arc::make_mut(&mut self.tokens).insert(id.clone(), record.clone());
        self.event(
            fx,
            now,
            "token_created",
            None,
            None,
            format!(
                "API token {id} for {user}, valid {} days",
                ttl_ms.div_ceil(86_400_000)
            ),
        );
        Ok((record, token))
    }

    pub(super) fn revoke_token(
        &mut self,
        id: &str,
        fx: &mut Effects,
        now: u64,
    ) -> Result<TokenRecord, HubError> {
        let Some(by) = self.actor.clone() else {
            return Err(HubError::Internal("a revocation without a caller".into()));
        };
        auth::may(&self.policy, &by, "", Action::ManageTokens)?;
        let Some(record) = Arc::make_mut(&mut self.tokens).remove(id) else {
            return Err(HubError::NotFound(format!("API token {id} not found")));
        };
        fx.delete(token_key(id));
        self.event(
            fx,
            now,
            "token_revoked",
            None,
            None,
            format!("API token {id} of {} revoked", record.user),
        );
        Ok(record)
    }
}
