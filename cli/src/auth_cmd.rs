//! Who the CLI is: `axle login` (saves an API token in the config file),
//! `axle whoami`, `axle token create` (platform admins), and where the token
//! comes from for every other command: `--token`, `AXLE_TOKEN`, then
//! `~/.config/axle/config.yaml` (`$XDG_CONFIG_HOME/axle/config.yaml`).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::client::Client;

/// Largest config file read: it holds a token and a hub URL.
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// What `axle login` saves.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `$XDG_CONFIG_HOME/axle/config.yaml`, else `~/.config/axle/config.yaml`.
pub fn config_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("axle").join("config.yaml"))
}

/// The saved config, if there is one.
pub fn load_config() -> anyhow::Result<Option<Config>> {
    let Some(path) = config_path() else {
        return Ok(None);
    };
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(None);
    };
    if meta.len() > MAX_CONFIG_BYTES {
        anyhow::bail!(
            "{}: larger than a config file ({MAX_CONFIG_BYTES} bytes)",
            path.display()
        );
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let config = serde_saphyr::from_str(&text)
        .with_context(|| format!("{}: not an axle config", path.display()))?;
    Ok(Some(config))
}

/// Writes `config` readable by its owner only (0600, in a 0700 directory).
fn save_config(config: &Config) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let path = config_path().context("no home directory ($HOME) to keep the config in")?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let text = format!(
        "# Written by `axle login`; holds an API token: keep it to yourself.\n{}",
        serde_saphyr::to_string(config).context("cannot encode the config")?
    );
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // An existing file keeps its mode on open: make it 0600 too.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    Ok(path)
}

#[derive(Args)]
pub struct LoginArgs {
    /// The API token (default: read one line from standard input).
    #[arg(long = "with-token", value_name = "TOKEN")]
    pub token: Option<String>,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Mint an API token for a user (platform admins); it is shown once.
    Create {
        #[arg(long)]
        user: String,
        /// How long it is valid: e.g. `12h`, `30d` (default 90d, at most 366d).
        #[arg(long, value_parser = parse_ttl, default_value = "90d")]
        ttl: u64,
    },
    /// List API tokens: id, user, expiry, who made it (never secrets).
    List,
    /// Revoke an API token: it is refused from now on.
    Revoke { id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Mint a one-time join token for a new spoke of CLUSTER (platform admins); start
    /// the spoke once with `axle-spoke --join-token TOKEN`. It is shown once.
    JoinToken {
        cluster: String,
        /// How long it is valid: e.g. `30m`, `1h`, `2d` (default 1h, at most 7d).
        #[arg(long, value_parser = parse_ttl, default_value = "1h")]
        ttl: u64,
    },
    /// Cut CLUSTER's spoke off at once (platform admins): its certificate is refused and
    /// its session ends; its work is re-queued once the spoke counts as lost.
    Revoke { cluster: String },
}

/// `axle cluster …`.
pub async fn cluster(client: &Client, c: ClusterCommand) -> anyhow::Result<ExitCode> {
    match c {
        ClusterCommand::JoinToken { cluster, ttl } => {
            let t = client.create_join_token(&cluster, ttl).await?;
            eprintln!(
                "join token {} for cluster {cluster}, valid {} min, for one spoke, once; \
                 it is shown once. Start the spoke with:\n  axle-spoke --cluster {cluster} \
                 --hub https://HUB:7071 --join-token TOKEN",
                t["id"].as_str().unwrap_or("?"),
                ttl.div_ceil(60)
            );
            println!("{}", t["token"].as_str().unwrap_or(""));
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Revoke { cluster } => {
            let r = client.revoke_cluster(&cluster).await?;
            println!(
                "cluster {cluster} revoked: {} certificates, {} unused join tokens{}",
                r["certificates_revoked"].as_u64().unwrap_or(0),
                r["join_tokens_revoked"].as_u64().unwrap_or(0),
                if r["session_ended"].as_bool() == Some(true) {
                    "; its spoke was disconnected"
                } else {
                    ""
                }
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `30d`, `12h`, `45m`, `3600s` (or plain seconds) as seconds.
pub fn parse_ttl(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 12h or 30d"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d")),
    };
    match n.checked_mul(mult) {
        Some(0) | None => Err(format!("{s:?} is not a positive duration")),
        Some(v) => Ok(v),
    }
}

/// `axle login`: checks the token with the hub, then saves it.
pub async fn login(client: &Client, hub: &str, a: LoginArgs) -> anyhow::Result<ExitCode> {
    let token = match a.token {
        Some(t) => t,
        None => {
            eprint!("API token: ");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line.trim().to_string()
        }
    };
    if token.is_empty() {
        anyhow::bail!(crate::exit::UsageError("no token given".into()));
    }
    let me = client
        .clone()
        .with_token(Some(token.clone()))
        .whoami()
        .await?;
    let path = save_config(&Config {
        hub: Some(hub.to_string()),
        token: Some(token),
    })?;
    println!(
        "logged in to {hub} as {} (saved in {})",
        me["user"].as_str().unwrap_or("?"),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `axle whoami`.
pub async fn whoami(client: &Client) -> anyhow::Result<ExitCode> {
    let me = client.whoami().await?;
    println!(
        "{} (authenticated by {}){}",
        me["user"].as_str().unwrap_or("?"),
        me["authenticated_by"].as_str().unwrap_or("?"),
        if me["platform_admin"].as_bool() == Some(true) {
            ", platform admin"
        } else {
            ""
        }
    );
    if let Some(teams) = me["teams"].as_object() {
        for (team, role) in teams {
            println!("  {team}: {}", role.as_str().unwrap_or("?"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `axle token create`.
pub async fn token(client: &Client, c: TokenCommand) -> anyhow::Result<ExitCode> {
    match c {
        TokenCommand::Create { user, ttl } => {
            let t = client.create_token(&user, ttl).await?;
            eprintln!(
                "token {} for {user}, valid {} days; it is shown once:",
                t["id"].as_str().unwrap_or("?"),
                ttl.div_ceil(86_400)
            );
            println!("{}", t["token"].as_str().unwrap_or(""));
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::List => {
            println!("{:<14} {:<24} {:<26} CREATED BY", "ID", "USER", "EXPIRES");
            for t in client.tokens().await? {
                let expires = t["expires_at_ms"]
                    .as_u64()
                    .map_or("-".to_string(), crate::table::fmt_timestamp);
                println!(
                    "{:<14} {:<24} {:<26} {}",
                    crate::table::printable(t["id"].as_str().unwrap_or("?")),
                    crate::table::printable(t["user"].as_str().unwrap_or("?")),
                    expires,
                    crate::table::printable(t["created_by"].as_str().unwrap_or("?"))
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Revoke { id } => {
            let t = client.revoke_token(&id).await?;
            println!(
                "token {id} of {} revoked",
                t["user"].as_str().unwrap_or("?")
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_read_as_seconds() {
        assert_eq!(parse_ttl("90d"), Ok(90 * 86_400));
        assert_eq!(parse_ttl("12h"), Ok(43_200));
        assert_eq!(parse_ttl("3600"), Ok(3600));
        assert!(parse_ttl("0d").is_err());
        assert!(parse_ttl("5y").is_err());
        assert!(parse_ttl("d").is_err());
    }
}
