//! Label and field selectors for list and watch, parsed with the API server's
//! grammar; a field the real server would not index for a kind is an error.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::errors::ApiError;
use crate::kinds::{Kind, Object};

/// One label requirement.
#[derive(Clone, Debug, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: all requirements must hold (AND).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 317 // 253 (prefix) + '/' + 63 (name)
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn label_error(req: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why}: {req:?}"))
}

fn parse_requirement(raw: &str) -> Result<LabelReq, ApiError> {
    let req = raw.trim();
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(LabelReq::NotExists(key.to_string()))
        } else {
            Err(label_error(raw, "invalid label key"))
        };
    }
    if let Some(open) = req.find('(') {
        let close = req
            .rfind(')')
            .filter(|&c| c > open && req[c + 1..].trim().is_empty());
        let close = close.ok_or_else(|| label_error(raw, "found '(', expected: ')'"))?;
        let head: Vec<&str> = req[..open].split_whitespace().collect();
        let [key, op] = head.as_slice() else {
            return Err(label_error(
                raw,
                "expected: key in (values) or key notin (values)",
            ));
        };
        if !valid_key(key) {
            return Err(label_error(raw, "invalid label key"));
        }
        let values: Vec<String> = req[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .collect();
        if values.iter().any(|v| !valid_value(v)) {
            return Err(label_error(raw, "invalid label value"));
        }
        return match *op {
            "in" => Ok(LabelReq::In(key.to_string(), values)),
            "notin" => Ok(LabelReq::NotIn(key.to_string(), values)),
            _ => Err(label_error(
                raw,
                "found unknown set operator, expected: in, notin",
            )),
        };
    }
    let (key, value, eq) = if let Some((k, v)) = req.split_once("!=") {
        (k, v, false)
    } else if let Some((k, v)) = req.split_once("==") {
        (k, v, true)
    } else if let Some((k, v)) = req.split_once('=') {
        (k, v, true)
    } else {
        let key = req;
        return if valid_key(key) {
            Ok(LabelReq::Exists(key.to_string()))
        } else {
            Err(label_error(raw, "invalid label key"))
        };
    };
    let (key, value) = (key.trim(), value.trim());
    if !valid_key(key) {
        return Err(label_error(raw, "invalid label key"));
    }
    if !valid_value(value) {
        return Err(label_error(raw, "invalid label value"));
    }
    Ok(if eq {
        LabelReq::Eq(key.into(), value.into())
    } else {
        LabelReq::NotEq(key.into(), value.into())
    })
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e,!f,g in (x,y),h notin (z)`; empty means everything.
    pub(crate) fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        split_top_level(s)
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<_, _>>()
            .map(LabelSelector)
    }

    /// Whether `labels` satisfy every requirement.
    pub(crate) fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v),
            LabelReq::NotEq(k, v) => get(k) != Some(v),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// The fields each kind can be selected on, as (selector name, JSON pointer).
/// These are the ones the real API server indexes for the kind (a subset for
/// pods and events: the ones an agent filters on).
fn fields(kind: Kind) -> &'static [(&'static str, &'static str)] {
    match kind {
        Kind::Pod => &[
            ("spec.nodeName", "/spec/nodeName"),
            ("spec.restartPolicy", "/spec/restartPolicy"),
            ("spec.schedulerName", "/spec/schedulerName"),
            ("spec.serviceAccountName", "/spec/serviceAccountName"),
            ("status.phase", "/status/phase"),
            ("status.podIP", "/status/podIP"),
            ("status.nominatedNodeName", "/status/nominatedNodeName"),
        ],
        Kind::Event => &[
            ("involvedObject.kind", "/involvedObject/kind"),
            ("involvedObject.namespace", "/involvedObject/namespace"),
            ("involvedObject.name", "/involvedObject/name"),
            ("involvedObject.uid", "/involvedObject/uid"),
            ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
            (
                "involvedObject.resourceVersion",
                "/involvedObject/resourceVersion",
            ),
            ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
            ("reason", "/reason"),
            ("reportingComponent", "/reportingComponent"),
            ("source", "/source/component"),
            ("type", "/type"),
        ],
        Kind::Node => &[("spec.unschedulable", "/spec/unschedulable")],
        Kind::Namespace => &[("status.phase", "/status/phase")],
        Kind::Job => &[("status.successful", "/status/succeeded")],
        _ => &[],
    }
}

#[derive(Clone, Debug, PartialEq)]
struct FieldReq {
    /// JSON pointer into the object; "" for metadata.name/namespace, which are
    /// read from metadata directly.
    field: &'static str,
    value: String,
    equal: bool,
}

/// A parsed field selector (AND of `field=value` / `field!=value`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FieldSelector(Vec<FieldReq>);

impl FieldSelector {
    /// Parses a field selector for `kind`; an unknown field is a 400 naming it.
    pub(crate) fn parse(kind: Kind, s: &str) -> Result<FieldSelector, ApiError> {
        if s.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        let mut reqs = Vec::new();
        for raw in s.split(',') {
            let (name, value, equal) = if let Some((k, v)) = raw.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = raw.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = raw.split_once('=') {
                (k, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{raw}'"
                )));
            };
            let name = name.trim();
            let field = match name {
                "metadata.name" => "/metadata/name",
                "metadata.namespace" => "/metadata/namespace",
                _ => fields(kind)
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| *p)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("field label not supported: {name}"))
                    })?,
            };
            reqs.push(FieldReq {
                field,
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether `object` satisfies every requirement.
    pub(crate) fn matches(&self, object: &Object) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let meta = object.meta();
        let json = if self.0.iter().any(|r| !r.field.starts_with("/metadata/")) {
            Some(object.to_value())
        } else {
            None
        };
        self.0.iter().all(|req| {
            let actual = match req.field {
                "/metadata/name" => meta.name.clone().unwrap_or_default(),
                "/metadata/namespace" => meta.namespace.clone().unwrap_or_default(),
                pointer => match json.as_ref().and_then(|j| j.pointer(pointer)) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Bool(b)) => b.to_string(),
                    Some(Value::Number(n)) => n.to_string(),
                    // An unset bool field selects as "false", like the server's
                    // field set (spec.unschedulable).
                    _ if pointer == "/spec/unschedulable" => "false".to_string(),
                    _ => String::new(),
                },
            };
            (actual == req.value) == req.equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_grammar() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"));
        assert!(m("app"));
        assert!(!m("!app"));
        assert!(m("!missing"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("missing notin (web)"));
        assert!(!m("missing in (web)"));
        assert!(m("app=web,tier in (front),!gone"));
        assert!(!m("app=web,tier=back"));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("app=we b").is_err());
        assert!(LabelSelector::parse("a b (x)").is_err());
        assert!(!LabelSelector::parse("app").unwrap().matches(None));
    }

    #[test]
    fn field_selector_rejects_unknown_fields() {
        assert!(FieldSelector::parse(Kind::Pod, "spec.nodeName=n1").is_ok());
        let err = FieldSelector::parse(Kind::Job, "spec.nodeName=n1").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("spec.nodeName"), "{}", err.message);
        assert!(FieldSelector::parse(Kind::Event, "involvedObject.name=j").is_ok());
        assert!(FieldSelector::parse(Kind::Pod, "nonsense").is_err());
    }
}
