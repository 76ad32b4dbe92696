//! Where a hub's store is: `--store redb:PATH` or `--store etcd://HOST:PORT,HOST:PORT`.

use std::path::PathBuf;

/// A parsed `--store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// The embedded store in this file.
    Redb(PathBuf),
    /// An etcd cluster: the members' `host:port`s (the scheme is chosen by TLS).
    Etcd(Vec<String>),
}

/// Most etcd endpoints in one `--store`: clusters have 3 or 5 members.
pub const MAX_ETCD_ENDPOINTS: usize = 16;

impl StoreLocation {
    /// Parses `redb:PATH` or `etcd://h1:2379,h2:2379`; the error says what is expected.
    pub fn parse(s: &str) -> Result<StoreLocation, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("redb:") {
            if path.is_empty() {
                return Err("`redb:` needs a file path, e.g. redb:/var/lib/axle/axle.redb".into());
            }
            return Ok(StoreLocation::Redb(PathBuf::from(path)));
        }
        let Some(rest) = s.strip_prefix("etcd://") else {
            return Err(format!(
                "store {s:?}: expected redb:PATH or etcd://HOST:PORT[,HOST:PORT...]"
            ));
        };
        let mut endpoints = Vec::new();
        for part in rest.trim_end_matches('/').split(',') {
            let part = part.trim();
            let ok = match part.rsplit_once(':') {
                Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
                None => false,
            };
            if !ok {
                return Err(format!(
                    "store {s:?}: {part:?} is not HOST:PORT (e.g. etcd://10.0.0.1:2379,10.0.0.2:2379)"
                ));
            }
            endpoints.push(part.to_string());
        }
        if endpoints.len() > MAX_ETCD_ENDPOINTS {
            return Err(format!(
                "store {s:?}: {} endpoints, at most {MAX_ETCD_ENDPOINTS}",
                endpoints.len()
            ));
        }
        Ok(StoreLocation::Etcd(endpoints))
    }

    /// The client URLs of an etcd location, `https://` when `tls`.
    pub fn urls(endpoints: &[String], tls: bool) -> Vec<String> {
        let scheme = if tls { "https" } else { "http" };
        endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds_and_names_what_is_wrong() {
        assert_eq!(
            StoreLocation::parse("redb:/tmp/a.redb"),
            Ok(StoreLocation::Redb("/tmp/a.redb".into()))
        );
        assert_eq!(
            StoreLocation::parse("etcd://a:2379, b:2380"),
            Ok(StoreLocation::Etcd(vec!["a:2379".into(), "b:2380".into()]))
        );
        for bad in [
            "redb:",
            "etcd://",
            "etcd://a",
            "etcd://a:x",
            "http://a:1",
            "etcd://:1",
        ] {
            assert!(StoreLocation::parse(bad).is_err(), "{bad}");
        }
        let err = StoreLocation::parse("etcd://a:1,b").unwrap_err();
        assert!(err.contains("\"b\" is not HOST:PORT"), "{err}");
        assert_eq!(
            StoreLocation::urls(&["a:1".into()], true),
            vec!["https://a:1".to_string()]
        );
    }
}
