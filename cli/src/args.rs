//! Parsers for command-line values (durations, `K=V`, ids, states, GPU
//! counts) and the `-o` output formats, shared by the hub commands.

use std::collections::BTreeMap;

use clap::ValueEnum;
use serde::Serialize;

/// `--max-runtime`: "90s", "45m", "1h", "1h30m", "2d", or bare seconds
/// ("300"). Returns seconds; zero is refused (it would kill the job at once).
pub fn parse_duration_s(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration; use e.g. 90s, 45m, 1h30m".into());
    }
    let bad = || format!("invalid duration {text:?}; use e.g. 90s, 45m, 1h30m, 2d");
    let total = if t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>().map_err(|_| bad())?
    } else {
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in t.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit_s: u64 = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            let n: u64 = digits.parse().map_err(|_| bad())?;
            digits.clear();
            total = n
                .checked_mul(unit_s)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(|| format!("duration {text:?} is too long"))?;
        }
        if !digits.is_empty() {
            return Err(format!(
                "invalid duration {text:?}: {digits} has no unit (s, m, h or d)"
            ));
        }
        total
    };
    if total == 0 {
        return Err("duration must be longer than zero".into());
    }
    Ok(total)
}

/// `--env K=V`: the key is a shell-style variable name; the value may hold '='.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    let Some((k, v)) = text.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got {text:?}"));
    };
    let valid = k
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "invalid variable name {k:?}: use letters, digits and '_', not starting with a digit"
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Collects `--env` pairs; a key given twice is an error rather than a
/// silent override.
pub fn env_map(pairs: &[(String, String)]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in pairs {
        if out.insert(k.clone(), v.clone()).is_some() {
            return Err(format!("--env {k} is given more than once"));
        }
    }
    Ok(out)
}

/// `--gpus`: a positive number, e.g. 0.25 or 8. Which fractions are allowed
/// is the hub's policy, so it is not checked here.
pub fn parse_gpus(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 => Ok(g),
        Ok(_) => Err("GPUs must be a positive number, e.g. 0.25 or 8".into()),
        Err(_) => Err(format!(
            "{text:?} is not a number; use e.g. 0.25 (a quarter GPU) or 8"
        )),
    }
}

/// A workload id: a number, as the hub assigns them; the default name's
/// form `w-42` is accepted too (the hub accepts both).
pub fn parse_workload_id(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.strip_prefix("w-")
        .unwrap_or(t)
        .parse::<u64>()
        .map_err(|_| "workload id must be a number".to_string())
}

/// `--state`: one of the API's states, any case; returned as the API spells it.
pub fn parse_state(text: &str) -> Result<String, String> {
    axle_proto::api::STATES
        .iter()
        .find(|s| s.eq_ignore_ascii_case(text.trim()))
        .map(|s| s.to_string())
        .ok_or_else(|| {
            format!(
                "unknown state {text:?}; one of: {}",
                axle_proto::api::STATES.join(", ")
            )
        })
}

/// `-o` for lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    Table,
    /// A table whose last column (reason, message) is never cut.
    Wide,
    Json,
    Yaml,
    /// One `kind/name` per line (`workload/12`), for scripts.
    Name,
}

/// `-o` for one object (the default is a human sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectFormat {
    Json,
    Yaml,
}

/// JSON (pretty) or YAML text of `value`, ending in a newline.
/// Beside every millisecond timestamp (`submitted_at_ms`, `at_ms`,
/// `last_heartbeat_ms`, …) the same instant in RFC 3339 (`submitted_at`,
/// `at`, `last_heartbeat`), for people and for tools that parse dates.
pub fn with_rfc3339(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let stamps: Vec<(String, u64)> = map
                .iter()
                .filter(|(k, _)| k.ends_with("at_ms") || k.ends_with("heartbeat_ms"))
                .filter_map(|(k, v)| v.as_u64().map(|ms| (k.clone(), ms)))
                .collect();
            for v in map.values_mut() {
                with_rfc3339(v);
            }
            for (k, ms) in stamps {
                let name = k.trim_end_matches("_ms").to_string();
                let text = crate::table::fmt_timestamp(ms).replacen(' ', "T", 1);
                map.entry(name).or_insert(serde_json::Value::String(text));
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(with_rfc3339),
        _ => {}
    }
}

pub fn to_text<T: Serialize>(value: &T, format: ObjectFormat) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(value)?;
    with_rfc3339(&mut value);
    let mut text = match format {
        ObjectFormat::Json => serde_json::to_string_pretty(&value)?,
        ObjectFormat::Yaml => serde_saphyr::to_string(&value)?,
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_get_an_rfc3339_twin() {
        let mut v = serde_json::json!({
            "submitted_at_ms": 1_796_303_901_583u64,
            "finished_at_ms": null,
            "history": [{"at_ms": 0, "to": "Placed"}],
            "gpus": 1.0
        });
        with_rfc3339(&mut v);
        assert_eq!(v["submitted_at"], "2026-12-03T13:18:21.583Z");
        assert_eq!(v["submitted_at_ms"], 1_796_303_901_583u64);
        assert!(v.get("finished_at").is_none());
        assert_eq!(v["history"][0]["at"], "1970-01-01T00:00:00.000Z");
        assert!(v.get("gpus_at").is_none());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_s("90s"), Ok(90));
        assert_eq!(parse_duration_s("45m"), Ok(2700));
        assert_eq!(parse_duration_s("1h"), Ok(3600));
        assert_eq!(parse_duration_s("1h30m"), Ok(5400));
        assert_eq!(parse_duration_s("2d"), Ok(172_800));
        assert_eq!(parse_duration_s("1d2h3m4s"), Ok(93_784));
        assert_eq!(parse_duration_s("300"), Ok(300));
        assert_eq!(parse_duration_s(" 5m "), Ok(300));
        for bad in [
            "",
            "0",
            "0s",
            "1x",
            "h",
            "1h30",
            "-5s",
            "1.5h",
            "99999999999999999999d",
        ] {
            assert!(parse_duration_s(bad).is_err(), "{bad:?} should fail");
        }
        assert!(
            parse_duration_s("1h30")
                .unwrap_err()
                .contains("30 has no unit")
        );
    }

    #[test]
    fn env_pairs() {
        assert_eq!(parse_env("A=1"), Ok(("A".into(), "1".into())));
        assert_eq!(
            parse_env("OPTS=--x=1 --y=2"),
            Ok(("OPTS".into(), "--x=1 --y=2".into()))
        );
        assert_eq!(parse_env("_EMPTY="), Ok(("_EMPTY".into(), String::new())));
        for bad in ["NOVALUE", "=1", "1A=x", "A-B=1", "A B=1"] {
            assert!(parse_env(bad).is_err(), "{bad:?} should fail");
        }
        let dup = [("A".to_string(), "1".to_string()), ("A".into(), "2".into())];
        assert!(env_map(&dup).unwrap_err().contains("more than once"));
        let ok = env_map(&[("B".into(), "2".into()), ("A".into(), "1".into())]).unwrap();
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["A", "B"]);
    }

    #[test]
    fn ids_gpus_and_states() {
        assert_eq!(parse_workload_id("42"), Ok(42));
        assert_eq!(parse_workload_id("w-42"), Ok(42));
        assert_eq!(
            parse_workload_id("abc"),
            Err("workload id must be a number".into())
        );
        assert!(parse_workload_id("-1").is_err());
        assert_eq!(parse_gpus("0.25"), Ok(0.25));
        assert_eq!(parse_gpus("8"), Ok(8.0));
        for bad in ["0", "-1", "NaN", "inf", "x"] {
            assert!(parse_gpus(bad).is_err(), "{bad:?} should fail");
        }
        assert_eq!(parse_state("running"), Ok("Running".into()));
        assert!(parse_state("done").unwrap_err().contains("Pending"));
    }

    #[test]
    fn structured_output_ends_in_a_newline() {
        let v = serde_json::json!({"id": 1, "state": "Running"});
        let json = to_text(&v, ObjectFormat::Json).unwrap();
        assert!(json.ends_with("}\n"));
        let yaml = to_text(&v, ObjectFormat::Yaml).unwrap();
        assert!(yaml.contains("state: Running"), "{yaml}");
        assert!(yaml.ends_with('\n'));
    }
}
