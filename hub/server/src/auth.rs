//! Who calls, and what they may do.
//!
//! Users prove who they are with API tokens (`axle_<id>_<secret>`, sent as
//! `Authorization: Bearer …` on HTTP and as `authorization` metadata on
//! gRPC). The hub keeps only each token's SHA-256 digest, under
//! `tokens/<id>`; a token names its user, its creator and its expiry.
//!
//! What a user may do comes from the policy: a team's `viewer` reads the
//! team's workloads, events and logs; a `member` also submits for the team
//! and cancels its own workloads; an `admin` cancels any of the team's; the
//! `platformAdmins` of Settings may do anything, and mint tokens. A call
//! without credentials is refused with 401, one that is not allowed with 403,
//! each naming why.

use std::collections::{BTreeMap, BTreeSet};

use axle_policy::{Policy, Role};
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

use crate::hub::HubError;

/// Every API token starts with this, so a leaked one is easy to search for.
pub const TOKEN_PREFIX: &str = "axle_";

/// Most live tokens: a company's users, their CI robots, many times over;
/// every token costs the hub a record and a little memory.
pub const MAX_TOKENS: usize = 10_000;

/// Longest a token lives: a year, so a forgotten one ends by itself.
pub const MAX_TOKEN_TTL_MS: u64 = 366 * 86_400_000;

/// A token's life when its creator names none: 90 days.
pub const DEFAULT_TOKEN_TTL_MS: u64 = 90 * 86_400_000;

/// Longest user name: an e-mail address is at most 254 characters.
pub const MAX_USER_BYTES: usize = 254;

/// The user of a hub started with `--dev`: a platform admin with a token
/// printed at start.
pub const DEV_USER: &str = "dev";

/// How the hub authenticates calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Every user call needs a valid API token.
    #[default]
    Tokens,
    /// No authentication: every caller is [`ANONYMOUS`], a platform admin.
    /// Only on loopback listeners (`--auth none`), for tests and one machine.
    None,
}

/// Who calls a hub without authentication.
pub const ANONYMOUS: &str = "anonymous";

/// A token as stored: never the secret, only its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub v: u32,
    pub id: String,
    pub user: String,
    /// Hex SHA-256 of the secret part.
    pub sha256: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub created_by: String,
}

impl TokenRecord {
    /// The record of token `id` (with `sha256`, its secret's digest) for `user`,
    /// made by `created_by` at `now_ms`, valid `ttl_ms`.
    pub fn new(
        id: String,
        sha256: String,
        user: &str,
        created_by: &str,
        now_ms: u64,
        ttl_ms: u64,
    ) -> TokenRecord {
        TokenRecord {
            v: 1,
            id,
            user: user.to_string(),
            sha256,
            created_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            created_by: created_by.to_string(),
        }
    }
}

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    /// How they proved it, for the audit log: `token <id>`, `oidc <issuer>`, or `none`.
    pub via: String,
    /// Their single sign-on groups (from an ID token); teams give groups roles.
    pub groups: Vec<String>,
    /// The caller of a hub without authentication (`--auth none`): a
    /// platform admin, exempt from rate limits. Never set in token mode,
    /// whatever the user's name (a user once named `anonymous` in an ID
    /// token or an API token was a platform admin).
    pub no_auth: bool,
}

impl Identity {
    pub fn anonymous() -> Identity {
        Identity {
            user: ANONYMOUS.to_string(),
            via: "none (--auth none)".to_string(),
            groups: Vec::new(),
            no_auth: true,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// The digest the hub keeps of a token's secret.
pub fn digest(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

/// A new token: its id, the whole token (shown once), and its digest.
pub fn mint() -> Result<(String, String, String), HubError> {
    let rng = ring::rand::SystemRandom::new();
    let mut id = [0u8; 6];
    let mut secret = [0u8; 32];
    rng.fill(&mut id)
        .and_then(|()| rng.fill(&mut secret))
        .map_err(|_| HubError::Internal("no randomness for a token".into()))?;
    let (id, secret) = (hex(&id), hex(&secret));
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    Ok((id, token, digest(&secret)))
}

/// A token's id and secret, if it has the shape of one.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hexy = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hexy(id, 12) && hexy(secret, 64)).then_some((id, secret))
}

/// The caller of a request carrying `authorization` (the header's value): an
/// API token, or an OIDC ID token when the hub has `oidc`.
pub fn authenticate(
    mode: AuthMode,
    tokens: &BTreeMap<String, TokenRecord>,
    oidc: Option<&crate::oidc::Oidc>,
    authorization: Option<&str>,
    now_ms: u64,
) -> Result<Identity, HubError> {
    if mode == AuthMode::None {
        return Ok(Identity::anonymous());
    }
    let Some(value) = authorization else {
        return Err(HubError::Unauthenticated(
            "no credentials: send an API token (axle --token, AXLE_TOKEN or `axle login`; \
             `Authorization: Bearer axle_…` over HTTP)"
                .into(),
        ));
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .unwrap_or(value)
        .trim();
    if crate::oidc::looks_like_jwt(token) {
        let Some(oidc) = oidc else {
            return Err(HubError::Unauthenticated(
                "this is an ID token, and this hub accepts none: it has no single sign-on \
                 (axle-hub --oidc-issuer); use an API token"
                    .into(),
            ));
        };
        let u = oidc
            .verify(token, now_ms / 1000)
            .map_err(|e| HubError::Unauthenticated(e.to_string()))?;
        if u.user == ANONYMOUS {
            return Err(reserved_user(&format!("the ID token from {}", u.issuer)));
        }
        return Ok(Identity {
            user: u.user,
            via: format!("oidc {}", u.issuer),
            groups: u.groups,
            no_auth: false,
        });
    }
    let bad = || HubError::Unauthenticated("the API token is not valid".into());
    let (id, secret) = parse(token).ok_or_else(bad)?;
    let record = tokens.get(id).ok_or_else(bad)?;
    // Digests are compared, never secrets: timing says nothing about the secret.
    if digest(secret) != record.sha256 {
        return Err(bad());
    }
    if now_ms >= record.expires_at_ms {
        return Err(HubError::Unauthenticated(format!(
            "the API token {id} of {} expired; ask a platform admin for a new one \
             (axle token create)",
            record.user
        )));
    }
    if record.user == ANONYMOUS {
        return Err(reserved_user(&format!("the API token {id}")));
    }
    Ok(Identity {
        user: record.user.clone(),
        via: format!("token {id}"),
        groups: Vec::new(),
        no_auth: false,
    })
}

/// `what` names the user [`ANONYMOUS`], which only a hub without
/// authentication has.
fn reserved_user(what: &str) -> HubError {
    HubError::Unauthenticated(format!(
        "{what} names the user {ANONYMOUS:?}, which is reserved for hubs without \
         authentication (--auth none); use another user name"
    ))
}

/// What a call does, for [`may`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// Read a team's workloads, events and logs.
    Read,
    /// Submit for the team.
    Submit,
    /// Cancel one of the team's workloads, submitted by `owner`.
    Cancel { owner: Option<&'a str> },
    /// Mint and list API tokens (no team).
    ManageTokens,
    /// Mint join tokens for clusters and revoke them (no team).
    ManageClusters,
}

/// Whether `who` is a platform admin (the caller of a hub without
/// authentication is; a user merely named `anonymous` is not).
pub fn is_platform_admin(policy: &Policy, who: &Identity) -> bool {
    who.no_auth || policy.settings.platform_admins.contains(&who.user)
}

/// `user`'s role in `team`, if any.
pub fn role_in(policy: &Policy, who: &Identity, team: &str) -> Option<Role> {
    let team = policy.teams.get(team)?;
    let own = team
        .members
        .iter()
        .filter(|m| m.user == who.user)
        .map(|m| m.role);
    let by_group = team
        .groups
        .iter()
        .filter(|g| who.groups.contains(&g.group))
        .map(|g| g.role);
    // The highest of them: admin over member over viewer.
    own.chain(by_group).min_by_key(|r| match r {
        Role::Admin => 0,
        Role::Member => 1,
        Role::Viewer => 2,
    })
}

/// Whether `who` may do `action` on `team`'s work; else a 403 saying why.
pub fn may(
    policy: &Policy,
    who: &Identity,
    team: &str,
    action: Action<'_>,
) -> Result<(), HubError> {
    if is_platform_admin(policy, who) {
        return Ok(());
    }
    let user = &who.user;
    let role = role_in(policy, who, team);
    let ok = match (action, role) {
        (Action::ManageTokens, _) => {
            return Err(HubError::PermissionDenied(format!(
                "{user} is not a platform admin (Settings platformAdmins): only they manage API tokens"
            )));
        }
        (Action::ManageClusters, _) => {
            return Err(HubError::PermissionDenied(format!(
                "{user} is not a platform admin (Settings platformAdmins): only they join and revoke clusters"
            )));
        }
        (_, None) => false,
        (Action::Read, Some(_)) => true,
        (Action::Submit, Some(r)) => r != Role::Viewer,
        (Action::Cancel { .. }, Some(Role::Admin)) => true,
        (Action::Cancel { owner }, Some(Role::Member)) => owner == Some(user.as_str()),
        (Action::Cancel { .. }, Some(Role::Viewer)) => false,
    };
    if ok {
        return Ok(());
    }
    let what = match action {
        Action::Read => "read the work of",
        Action::Submit => "submit for",
        Action::Cancel { .. } => "cancel this workload of",
        Action::ManageTokens => "manage the tokens of",
        Action::ManageClusters => "manage the clusters of",
    };
    Err(HubError::PermissionDenied(match role {
        None => format!("{user} may not {what} team {team}: not a member of it"),
        Some(r) => format!(
            "{user} may not {what} team {team} as a {}{}",
            role_name(r),
            match (action, r) {
                (Action::Cancel { .. }, Role::Member) => " (members cancel their own workloads)",
                _ => "",
            }
        ),
    }))
}

/// How the policy spells a role.
pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::Member => "member",
        Role::Viewer => "viewer",
    }
}

/// The teams whose work `who` may read; `None`: all of them.
pub fn readable_teams(policy: &Policy, who: &Identity) -> Option<BTreeSet<String>> {
    if is_platform_admin(policy, who) {
        return None;
    }
    Some(
        policy
            .teams
            .values()
            .filter(|t| role_in(policy, who, &t.name).is_some())
            .map(|t| t.name.clone())
            .collect(),
    )
}

/// How long the token of a `--dev` hub lives: a working day and then some.
pub const DEV_TOKEN_TTL_MS: u64 = 86_400_000;

/// A token for [`DEV_USER`] (whom the caller makes a platform admin), valid
/// [`DEV_TOKEN_TTL_MS`] from `now_ms`: its record for
/// [`crate::server::Listeners::bootstrap_token`], and the token to print.
pub fn dev_token(now_ms: u64) -> Result<(TokenRecord, String), HubError> {
    let (id, token, sha256) = mint()?;
    let record = TokenRecord::new(id, sha256, DEV_USER, "--dev", now_ms, DEV_TOKEN_TTL_MS);
    Ok((record, token))
}

/// Checks a user name for a new token.
pub fn check_user(user: &str) -> Result<(), HubError> {
    if user == ANONYMOUS {
        return Err(HubError::bad(
            format!(
                "user {ANONYMOUS:?} is reserved for hubs without authentication \
                 (--auth none); use another user name"
            ),
            Some("user"),
        ));
    }
    if user.is_empty()
        || user.len() > MAX_USER_BYTES
        || user.trim() != user
        || axle_policy::text::hidden_char(user).is_some()
    {
        return Err(HubError::bad(
            format!(
                "user {user:?}: a user name is 1 to {MAX_USER_BYTES} printable characters \
                 without surrounding spaces"
            ),
            Some("user"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_parses_and_authenticates_until_it_expires() {
        let (id, token, sha) = mint().unwrap();
        assert_eq!(parse(&token).map(|(i, _)| i), Some(id.as_str()));
        let mut tokens = BTreeMap::new();
        tokens.insert(
            id.clone(),
            TokenRecord {
                v: 1,
                id: id.clone(),
                user: "alice".into(),
                sha256: sha,
                created_at_ms: 0,
                expires_at_ms: 1_000,
                created_by: "root".into(),
            },
        );
        let who = authenticate(
            AuthMode::Tokens,
            &tokens,
            None,
            Some(&format!("Bearer {token}")),
            10,
        );
        assert_eq!(who.unwrap().user, "alice");
        let forged = format!("{TOKEN_PREFIX}{id}_{}", "0".repeat(64));
        for bad in [forged.as_str(), "axle_x", "", "Bearer"] {
            let e = authenticate(AuthMode::Tokens, &tokens, None, Some(bad), 10).unwrap_err();
            assert!(matches!(e, HubError::Unauthenticated(_)), "{bad}: {e}");
        }
        let e = authenticate(AuthMode::Tokens, &tokens, None, None, 10).unwrap_err();
        assert!(e.to_string().contains("no credentials"), "{e}");
        let e = authenticate(AuthMode::Tokens, &tokens, None, Some(&token), 1_000).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
        let open = authenticate(AuthMode::None, &BTreeMap::new(), None, None, 0).unwrap();
        assert_eq!(open.user, ANONYMOUS);
    }

    #[test]
    fn a_user_named_anonymous_is_no_admin_and_cannot_authenticate() {
        // Observed: an API token or ID token for `anonymous` was a platform
        // admin in token mode and minted tokens and join tokens.
        let policy = crate::dev::example_policy().expect("example policy");
        let named = Identity {
            user: ANONYMOUS.to_string(),
            via: "token t".to_string(),
            groups: Vec::new(),
            no_auth: false,
        };
        assert!(!is_platform_admin(&policy, &named));
        assert!(may(&policy, &named, "", Action::ManageTokens).is_err());
        assert!(is_platform_admin(&policy, &Identity::anonymous()));
        let e = check_user(ANONYMOUS).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let (id, token, sha) = mint().unwrap();
        let mut tokens = BTreeMap::new();
        tokens.insert(
            id.clone(),
            TokenRecord::new(id, sha, ANONYMOUS, "admin", 0, 1_000),
        );
        let e = authenticate(AuthMode::Tokens, &tokens, None, Some(&token), 10).unwrap_err();
        assert!(matches!(e, HubError::Unauthenticated(_)), "{e}");
        assert!(e.to_string().contains("reserved"), "{e}");
    }
}
