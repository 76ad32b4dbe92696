//! Provider credentials from the environment or from files.
//!
//! `NAME` holds the secret itself, or `NAME_FILE` a path to a file holding it
//! (a mounted Kubernetes Secret). A [`Secret`] never prints its value.

use std::fmt;
use std::path::Path;

/// Largest credentials file read: an API key is well under 1 KiB.
pub const MAX_SECRET_FILE_BYTES: u64 = 16 * 1024;

/// A credential; `Debug` and `Display` show only that it is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it (an `Authorization` header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("…")
    }
}

/// Why a credential could not be had; names the variable or file, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("set {name} or {name}_FILE")]
    Missing { name: String },
    #[error("{name}_FILE {path}: {reason}")]
    File {
        name: String,
        path: String,
        reason: String,
    },
}

/// The secret in `$NAME`, or in the file `$NAME_FILE` names (trimmed).
pub fn secret(name: &str) -> Result<Secret, CredentialError> {
    secret_from(name, |k| std::env::var(k).ok())
}

/// [`secret`] with the environment given (for tests).
pub fn secret_from(
    name: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Secret, CredentialError> {
    if let Some(v) = env(name).filter(|v| !v.trim().is_empty()) {
        return Ok(Secret(v.trim().to_string()));
    }
    let file_var = format!("{name}_FILE");
    let Some(path) = env(&file_var).filter(|p| !p.trim().is_empty()) else {
        return Err(CredentialError::Missing {
            name: name.to_string(),
        });
    };
    let err = |reason: String| CredentialError::File {
        name: name.to_string(),
        path: path.clone(),
        reason,
    };
    let p = Path::new(path.trim());
    let len = std::fs::metadata(p)
        .map_err(|e| err(format!("cannot read it: {e}")))?
        .len();
    if len > MAX_SECRET_FILE_BYTES {
        return Err(err(format!(
            "{len} bytes, more than a credentials file of {MAX_SECRET_FILE_BYTES}"
        )));
    }
    let text = std::fs::read_to_string(p).map_err(|e| err(format!("cannot read it: {e}")))?;
    let value = text.trim();
    if value.is_empty() {
        return Err(err("it is empty".to_string()));
    }
    Ok(Secret(value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_the_variable_or_its_file_and_never_print() {
        let dir = std::env::temp_dir().join(format!("axle-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "s3cr3t\n").unwrap();
        let path = file.display().to_string();
        let env = |k: &str| match k {
            "RUNPOD_API_KEY_FILE" => Some(path.clone()),
            _ => None,
        };
        let s = secret_from("RUNPOD_API_KEY", env).unwrap();
        assert_eq!(s.expose(), "s3cr3t");
        assert!(!format!("{s:?} {s}").contains("s3cr3t"));
        let direct = secret_from("K", |k| (k == "K").then(|| "v".to_string())).unwrap();
        assert_eq!(direct.expose(), "v");
        let e = secret_from("LAMBDA_API_KEY", |_| None).unwrap_err();
        assert_eq!(e.to_string(), "set LAMBDA_API_KEY or LAMBDA_API_KEY_FILE");
        std::fs::write(&file, "").unwrap();
        assert!(secret_from("RUNPOD_API_KEY", env).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
