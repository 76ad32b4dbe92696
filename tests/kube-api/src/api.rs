//! The verbs on stored objects (get, list, create, update, patch, delete)
//! with the API server's semantics: naming, optimistic concurrency, status
//! subresources, merge and apply patches, and garbage-collecting deletes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta};
use serde_json::{Map, Value};

use crate::DeleteRecord;
use crate::controller;
use crate::errors::ApiError;
use crate::kinds::{Kind, Object};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Key, State, now};

/// Which part of an object a write addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Main,
    Status,
}

/// How many times a `generateName` create tries a fresh suffix before
/// giving up with AlreadyExists (the server's own retry count is similar;
/// with 27^5 suffixes a clash is already rare).
const GENERATE_NAME_ATTEMPTS: usize = 8;

/// Parses a request body as a JSON object.
pub(crate) fn parse_body(kind: Kind, body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            kind.name(),
            kind.version(),
            kind.name()
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body of a {} request must be a JSON object",
            kind.name()
        )));
    }
    Ok(value)
}

fn decode(kind: Kind, value: Value) -> Result<Object, ApiError> {
    kind.decode(value).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            kind.name(),
            kind.version(),
            kind.name()
        ))
    })
}

fn key(kind: Kind, namespace: Option<&str>, name: &str) -> Key {
    (
        kind,
        if kind.namespaced() {
            namespace.unwrap_or_default().to_string()
        } else {
            String::new()
        },
        name.to_string(),
    )
}

/// Whether `name` is a lowercase RFC 1123 subdomain (or, with `label`, a
/// single RFC 1123 label as namespaces need).
fn valid_name(name: &str, label: bool) -> bool {
    let max = if label { 63 } else { 253 };
    !name.is_empty()
        && name.len() <= max
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
        && (!label || !name.contains('.'))
}

/// Reads an object.
pub(crate) fn get(
    s: &State,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
) -> Result<Object, ApiError> {
    s.get(&key(kind, namespace, name))
        .cloned()
        .ok_or_else(|| ApiError::not_found(kind, name))
}

/// List options after parsing.
#[derive(Debug, Default)]
pub(crate) struct ListOptions {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
}

fn encode_continue(rv: u64, key: &Key) -> String {
    hex::encode(format!("{rv}\u{0}{}\u{0}{}", key.1, key.2))
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let text = String::from_utf8(hex::decode(token).ok()?).ok()?;
    let mut parts = text.split('\u{0}');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_string(),
        parts.next()?.to_string(),
    ))
}

/// Lists objects matching the selectors, paged by `limit`/`continue`. A
/// continued list reports the first page's resourceVersion, so a watch from
/// it replays whatever changed while paging.
pub(crate) fn list(
    s: &State,
    kind: Kind,
    namespace: Option<&str>,
    opts: &ListOptions,
) -> Result<(Vec<Object>, ListMeta), ApiError> {
    let (list_rv, after) = match &opts.continue_token {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            if rv < s.compacted_rv {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some((ns, name)))
        }
        None => (s.rv, None),
    };
    let mut items = Vec::new();
    let mut next = None;
    let matching = s
        .iter_kind(kind, if kind.namespaced() { namespace } else { None })
        .filter(|o| {
            let k = State::key_of(o);
            after
                .as_ref()
                .is_none_or(|(ns, name)| (&k.1, &k.2) > (ns, name))
                && opts.labels.matches(o.meta().labels.as_ref())
                && opts.fields.matches(o)
        });
    let mut remaining = 0i64;
    for obj in matching {
        if opts.limit.is_some_and(|l| l > 0 && items.len() >= l) {
            remaining += 1;
            if next.is_none() {
                let last: &Object = items.last().unwrap_or(obj);
                next = Some(encode_continue(list_rv, &State::key_of(last)));
            }
            continue;
        }
        items.push(obj.clone());
    }
    let meta = ListMeta {
        resource_version: Some(list_rv.to_string()),
        remaining_item_count: next.as_ref().map(|_| remaining),
        continue_: next,
        ..Default::default()
    };
    Ok((items, meta))
}

/// Fixes the namespace of an incoming object against the URL's.
fn settle_namespace(kind: Kind, obj: &mut Object, namespace: Option<&str>) -> Result<(), ApiError> {
    let meta = obj.meta_mut();
    if kind.namespaced() {
        let url_ns = namespace.ok_or_else(ApiError::method_not_allowed)?;
        match meta.namespace.as_deref() {
            Some(ns) if !ns.is_empty() && ns != url_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => meta.namespace = Some(url_ns.to_string()),
        }
    } else {
        meta.namespace = None;
    }
    Ok(())
}

/// Creates an object (POST). The controller admits it first (defaults,
/// validation, quota, priority class).
pub(crate) fn create(
    s: &mut State,
    kind: Kind,
    namespace: Option<&str>,
    body: Value,
    dry_run: bool,
) -> Result<Object, ApiError> {
    let mut obj = decode(kind, body)?;
    settle_namespace(kind, &mut obj, namespace)?;
    create_object(s, obj, dry_run)
}

/// Creates a decoded object whose namespace is settled.
pub(crate) fn create_object(
    s: &mut State,
    mut obj: Object,
    dry_run: bool,
) -> Result<Object, ApiError> {
    let kind = obj.kind();
    let meta = obj.meta_mut();
    // Server-owned fields are never taken from the client.
    meta.uid = None;
    meta.resource_version = None;
    meta.deletion_timestamp = None;
    meta.managed_fields = None;
    let namespace = meta.namespace.clone();
    let mut name = meta.name.clone().unwrap_or_default();
    if name.is_empty() {
        let prefix = meta.generate_name.clone().unwrap_or_default();
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                kind,
                "",
                &["metadata.name: Required value: name or generateName is required".into()],
            ));
        }
        for _ in 0..GENERATE_NAME_ATTEMPTS {
            name = format!("{prefix}{}", s.random_suffix());
            if s.get(&key(kind, namespace.as_deref(), &name)).is_none() {
                break;
            }
        }
        obj.meta_mut().name = Some(name.clone());
    }
    let label = kind == Kind::Namespace;
    if !valid_name(&name, label) {
        let what = if label {
            "RFC 1123 label"
        } else {
            "RFC 1123 subdomain"
        };
        return Err(ApiError::invalid(
            kind,
            &name,
            &[format!(
                "metadata.name: Invalid value: \"{name}\": a lowercase {what} must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character"
            )],
        ));
    }
    if let Some(ns) = namespace.as_deref()
        && s.get(&(Kind::Namespace, String::new(), ns.to_string()))
            .is_none()
    {
        return Err(ApiError::not_found(Kind::Namespace, ns));
    }
    if s.get(&key(kind, namespace.as_deref(), &name)).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }
    controller::admit_create(s, &mut obj)?;
    if dry_run {
        return Ok(obj);
    }
    Ok(s.insert(obj))
}

/// Checks a client-sent resourceVersion against the stored one.
fn check_resource_version(
    kind: Kind,
    name: &str,
    sent: Option<&str>,
    stored: &Object,
) -> Result<(), ApiError> {
    match sent {
        Some(rv) if !rv.is_empty() && Some(rv) != stored.meta().resource_version.as_deref() => {
            Err(ApiError::conflict(kind, name))
        }
        _ => Ok(()),
    }
}

/// Combines a written object with the stored one per the addressed part:
/// a main write keeps the stored status, a status write keeps everything
/// but the status.
fn combine(kind: Kind, stored: &Object, mut written: Value, part: Part) -> Value {
    if !kind.has_status() {
        return written;
    }
    let mut stored = stored.to_value();
    match part {
        Part::Main => {
            match stored.get_mut("status").map(Value::take) {
                Some(status) => written["status"] = status,
                None => {
                    if let Some(map) = written.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
            written
        }
        Part::Status => {
            stored["status"] = written
                .get_mut("status")
                .map(Value::take)
                .unwrap_or(Value::Null);
            // Status writes may still carry optimistic concurrency.
            if let Some(rv) = written.pointer("/metadata/resourceVersion") {
                stored["metadata"]["resourceVersion"] = rv.clone();
            }
            stored
        }
    }
}

fn check_name(obj: &Object, name: &str) -> Result<(), ApiError> {
    match obj.meta().name.as_deref() {
        Some(n) if !n.is_empty() && n != name => Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// Replaces an object (PUT) with optimistic concurrency.
pub(crate) fn update(
    s: &mut State,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    body: Value,
    part: Part,
    dry_run: bool,
) -> Result<Object, ApiError> {
    let stored = get(s, kind, namespace, name)?;
    let sent_rv = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut obj = decode(kind, combine(kind, &stored, body, part))?;
    settle_namespace(kind, &mut obj, namespace)?;
    check_name(&obj, name)?;
    check_resource_version(kind, name, sent_rv.as_deref(), &stored)?;
    write_back(s, &stored, obj, dry_run)
}

fn write_back(
    s: &mut State,
    stored: &Object,
    mut obj: Object,
    dry_run: bool,
) -> Result<Object, ApiError> {
    let meta = obj.meta_mut();
    let old = stored.meta();
    meta.name = old.name.clone();
    meta.deletion_timestamp = old.deletion_timestamp.clone();
    meta.managed_fields = None;
    controller::admit_update(s, stored, &mut obj)?;
    if dry_run {
        return Ok(obj);
    }
    Ok(s.replace(obj))
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (k, v) in patch {
            if v.is_null() {
                map.remove(k);
            } else {
                merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The patch flavours a kube-rs client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    /// `application/merge-patch+json` (`Patch::Merge`).
    Merge,
    /// `application/strategic-merge-patch+json` (`Patch::Strategic`),
    /// applied as a merge patch: lists are replaced, not merged by key.
    Strategic,
    /// `application/apply-patch+yaml` (`Patch::Apply`): server-side apply,
    /// applied as a merge patch that creates the object when missing.
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(content_type: &str) -> Result<PatchType, ApiError> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }
}

/// Patches an object (PATCH).
#[allow(clippy::too_many_arguments)] // one per request parameter; a struct would only rename them
pub(crate) fn patch(
    s: &mut State,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    patch_type: PatchType,
    body: &[u8],
    part: Part,
    field_manager: Option<&str>,
    dry_run: bool,
) -> Result<Object, ApiError> {
    let patch: Value = serde_json::from_slice(body).map_err(|e| {
        let hint = if patch_type == PatchType::Apply {
            " (this test server accepts JSON-encoded apply patches only)"
        } else {
            ""
        };
        ApiError::bad_request(format!("error decoding patch: {e}{hint}"))
    })?;
    if patch_type == PatchType::Apply && field_manager.is_none_or(str::is_empty) {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    let stored = match get(s, kind, namespace, name) {
        Ok(stored) => stored,
        Err(e) if patch_type == PatchType::Apply && part == Part::Main && e.code == 404 => {
            // Server-side apply creates what does not exist.
            let mut obj = decode(kind, patch)?;
            settle_namespace(kind, &mut obj, namespace)?;
            check_name(&obj, name)?;
            obj.meta_mut().name = Some(name.to_string());
            return create_object(s, obj, dry_run);
        }
        Err(e) => return Err(e),
    };
    let sent_rv = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    let mut merged = stored.to_value();
    merge_patch(&mut merged, &patch);
    let mut obj = decode(kind, combine(kind, &stored, merged, part))?;
    settle_namespace(kind, &mut obj, namespace)?;
    check_name(&obj, name)?;
    check_resource_version(kind, name, sent_rv.as_deref(), &stored)?;
    write_back(s, &stored, obj, dry_run)
}

/// What a delete asked for, from the DeleteOptions body or query.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteRequest {
    pub(crate) options: DeleteOptions,
    pub(crate) dry_run: bool,
}

/// The deletion propagation the server applies when none is given: batch/v1
/// Jobs still default to orphaning their pods (a legacy the API keeps);
/// everything else cascades in the background.
fn default_propagation(kind: Kind) -> &'static str {
    if kind == Kind::Job {
        "Orphan"
    } else {
        "Background"
    }
}

/// Deletes an object (DELETE), garbage-collecting dependents per the
/// propagation policy, and records the request for tests.
pub(crate) fn delete(
    s: &mut State,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    req: &DeleteRequest,
) -> Result<Object, ApiError> {
    let stored = get(s, kind, namespace, name)?;
    if let Some(pre) = &req.options.preconditions {
        let meta = stored.meta();
        if let Some(uid) = &pre.uid
            && meta.uid.as_ref() != Some(uid)
        {
            return Err(ApiError {
                message: format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta.uid.clone().unwrap_or_default()
                ),
                ..ApiError::conflict(kind, name)
            });
        }
        if let Some(rv) = &pre.resource_version
            && meta.resource_version.as_ref() != Some(rv)
        {
            return Err(ApiError {
                message: format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta.resource_version.clone().unwrap_or_default()
                ),
                ..ApiError::conflict(kind, name)
            });
        }
    }
    let sent = req.options.propagation_policy.clone();
    let policy = match (&sent, req.options.orphan_dependents) {
        (Some(p), _) => p.clone(),
        (None, Some(true)) => "Orphan".to_string(),
        (None, Some(false)) => "Background".to_string(),
        (None, None) => default_propagation(kind).to_string(),
    };
    if !matches!(policy.as_str(), "Orphan" | "Background" | "Foreground") {
        return Err(ApiError::invalid(
            kind,
            name,
            &[format!(
                "propagationPolicy: Unsupported value: \"{policy}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
            )],
        ));
    }
    if req.dry_run {
        return Ok(stored);
    }
    s.log_delete(DeleteRecord {
        kind: kind.name().to_string(),
        namespace: namespace.filter(|_| kind.namespaced()).map(str::to_string),
        name: name.to_string(),
        propagation_policy: sent,
        grace_period_seconds: req.options.grace_period_seconds,
    });
    let k = key(kind, namespace, name);
    if kind == Kind::Namespace {
        return Ok(delete_namespace(s, name).unwrap_or(stored));
    }
    Ok(delete_with_policy(s, &k, &policy).unwrap_or(stored))
}

/// Deletes `key` and, per `policy`, its dependents (recursively).
pub(crate) fn delete_with_policy(s: &mut State, key: &Key, policy: &str) -> Option<Object> {
    let uid = s.get(key)?.meta().uid.clone().unwrap_or_default();
    let dependents = s.owned_by(&uid);
    match policy {
        "Orphan" => {
            for dep in dependents {
                if let Some(mut obj) = s.get(&dep).cloned() {
                    let refs = obj.meta_mut().owner_references.take().unwrap_or_default();
                    let kept: Vec<_> = refs.into_iter().filter(|r| r.uid != uid).collect();
                    obj.meta_mut().owner_references = (!kept.is_empty()).then_some(kept);
                    s.replace(obj);
                }
            }
            s.remove(key)
        }
        "Foreground" => {
            // Dependents go first; the owner is removed once they are gone.
            for dep in dependents {
                delete_with_policy(s, &dep, "Foreground");
            }
            s.remove(key)
        }
        _ => {
            let removed = s.remove(key);
            for dep in dependents {
                delete_with_policy(s, &dep, "Background");
            }
            removed
        }
    }
}

/// Deletes a namespace: it turns Terminating, everything in it is deleted,
/// then the namespace itself goes.
fn delete_namespace(s: &mut State, name: &str) -> Option<Object> {
    let ns_key = (Kind::Namespace, String::new(), name.to_string());
    if let Some(Object::Namespace(mut ns)) = s.get(&ns_key).cloned() {
        ns.metadata.deletion_timestamp = Some(now());
        ns.status.get_or_insert_with(Default::default).phase = Some("Terminating".to_string());
        s.replace(Object::Namespace(ns));
    }
    let contents: Vec<Key> = s
        .objects
        .keys()
        .filter(|(k, ns, _)| k.namespaced() && ns == name)
        .cloned()
        .collect();
    for key in contents {
        if s.get(&key).is_some() {
            delete_with_policy(s, &key, "Background");
        }
    }
    s.remove(&ns_key)
}

/// Deletes every object a list would return (DELETE on a collection).
pub(crate) fn delete_collection(
    s: &mut State,
    kind: Kind,
    namespace: Option<&str>,
    opts: &ListOptions,
    req: &DeleteRequest,
) -> Result<(Vec<Object>, ListMeta), ApiError> {
    let (items, _) = list(
        s,
        kind,
        namespace,
        &ListOptions {
            limit: None,
            continue_token: None,
            ..clone_selectors(opts)
        },
    )?;
    let mut deleted = Vec::new();
    for item in items {
        let meta = item.meta();
        let (ns, name) = (
            meta.namespace.clone(),
            meta.name.clone().unwrap_or_default(),
        );
        if let Ok(obj) = delete(s, kind, ns.as_deref(), &name, req) {
            deleted.push(obj);
        }
    }
    Ok((
        deleted,
        ListMeta {
            resource_version: Some(s.rv.to_string()),
            ..Default::default()
        },
    ))
}

fn clone_selectors(opts: &ListOptions) -> ListOptions {
    ListOptions {
        labels: opts.labels.clone(),
        fields: opts.fields.clone(),
        limit: None,
        continue_token: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
        merge_patch(&mut doc, &json!({"c": [1, 2]}));
        assert_eq!(doc, json!({"a": "z", "c": [1, 2]}));
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = (Kind::Pod, "ns".to_string(), "p-1".to_string());
        assert_eq!(
            decode_continue(&encode_continue(42, &key)),
            Some((42, "ns".into(), "p-1".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }

    #[test]
    fn names_are_validated() {
        assert!(valid_name("a-b.c", false));
        assert!(!valid_name("a-b.c", true));
        assert!(!valid_name("Upper", false));
        assert!(!valid_name("-a", false));
        assert!(!valid_name("", false));
    }
}
