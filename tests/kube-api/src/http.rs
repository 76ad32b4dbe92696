//! HTTP routing: maps `/api/v1/...` and `/apis/{group}/{version}/...` paths
//! and their query parameters onto the verbs, watches and logs, and renders
//! every error as a `Status` body.

use std::collections::{BTreeSet, HashMap};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, DeleteOptions,
    GroupVersionForDiscovery, ServerAddressByClientCIDR,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use tokio::sync::watch;

use crate::api::{self, DeleteRequest, ListOptions, Part, PatchType};
use crate::cluster::Cluster;
use crate::errors::ApiError;
use crate::kinds::{Kind, Object, to_json};
use crate::logs;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::watch::{self as watches, WatchRequest};

/// Largest request body accepted: the API server's own limit (3 MiB); etcd
/// would refuse bigger objects anyway.
pub(crate) const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// What a server's handlers share.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) cluster: Cluster,
    /// Turns true when the server stops; open streams then break.
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// The router: one fallback handler parses every path itself, since the
/// API's path grammar (namespaced or not, subresources) is easier to read as
/// one match than as dozens of routes.
pub(crate) fn router(app: App) -> Router {
    Router::new().fallback(handle).with_state(app)
}

#[derive(Debug, PartialEq)]
enum Route {
    Version,
    ApiVersions,
    ApiGroups,
    Resources {
        group: String,
        version: String,
    },
    Collection {
        kind: Kind,
        namespace: Option<String>,
    },
    Item {
        kind: Kind,
        namespace: Option<String>,
        name: String,
        sub: Option<String>,
    },
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Option<Route> {
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(kind) = Kind::from_path(group, version, plural).filter(|k| k.namespaced())
    {
        let namespace = Some(ns.to_string());
        return match tail {
            [] => Some(Route::Collection { kind, namespace }),
            [name] => Some(Route::Item {
                kind,
                namespace,
                name: name.to_string(),
                sub: None,
            }),
            [name, sub] => Some(Route::Item {
                kind,
                namespace,
                name: name.to_string(),
                sub: Some(sub.to_string()),
            }),
            _ => None,
        };
    }
    let [plural, tail @ ..] = rest else {
        return None;
    };
    let kind = Kind::from_path(group, version, plural)?;
    match tail {
        [] => Some(Route::Collection {
            kind,
            namespace: None,
        }),
        [name] if !kind.namespaced() => Some(Route::Item {
            kind,
            namespace: None,
            name: name.to_string(),
            sub: None,
        }),
        [name, sub] if !kind.namespaced() => Some(Route::Item {
            kind,
            namespace: None,
            name: name.to_string(),
            sub: Some(sub.to_string()),
        }),
        _ => None,
    }
}

fn parse_route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["version"] => Some(Route::Version),
        ["api"] => Some(Route::ApiVersions),
        ["apis"] => Some(Route::ApiGroups),
        ["api", v] => Some(Route::Resources {
            group: String::new(),
            version: v.to_string(),
        }),
        ["apis", g, v] => Some(Route::Resources {
            group: g.to_string(),
            version: v.to_string(),
        }),
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => None,
    }
}

fn json(code: StatusCode, body: Vec<u8>) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn error_response(e: &ApiError) -> Response {
    json(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        to_json(&e.status()),
    )
}

async fn handle(State(app): State<App>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    app.cluster
        .write(|s| s.log_request(parts.method.clone(), path_and_query));
    // Refuse a declared oversize body before reading any of it.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES) {
        return error_response(&ApiError::too_large(MAX_BODY_BYTES));
    }
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => return error_response(&ApiError::too_large(MAX_BODY_BYTES)),
    };
    match route(&app, &parts, &body) {
        Ok(response) => response,
        Err(e) => error_response(&e),
    }
}

fn flag(q: &HashMap<String, String>, name: &str) -> bool {
    q.get(name).is_some_and(|v| v == "true" || v == "1")
}

fn dry_run(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
        ))),
    }
}

fn list_options(kind: Kind, q: &HashMap<String, String>) -> Result<ListOptions, ApiError> {
    Ok(ListOptions {
        labels: LabelSelector::parse(
            q.get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        fields: FieldSelector::parse(
            kind,
            q.get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        limit: q
            .get("limit")
            .map(|l| {
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("limit: invalid value {l:?}")))
            })
            .transpose()?,
        continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
    })
}

fn delete_request(body: &[u8], q: &HashMap<String, String>) -> Result<DeleteRequest, ApiError> {
    let mut options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    if let Some(p) = q.get("propagationPolicy") {
        options.propagation_policy = Some(p.clone());
    }
    if let Some(g) = q.get("gracePeriodSeconds") {
        options.grace_period_seconds = Some(g.parse().map_err(|_| {
            ApiError::bad_request(format!("gracePeriodSeconds: invalid value {g:?}"))
        })?);
    }
    if let Some(o) = q.get("orphanDependents") {
        options.orphan_dependents = Some(o == "true");
    }
    let dry = dry_run(q)?
        || options
            .dry_run
            .as_ref()
            .is_some_and(|d| d.iter().any(|x| x == "All"));
    Ok(DeleteRequest {
        options,
        dry_run: dry,
    })
}

fn object_response(code: StatusCode, obj: &Object) -> Response {
    json(code, obj.to_json())
}

fn route(app: &App, parts: &Parts, body: &[u8]) -> Result<Response, ApiError> {
    let route = parse_route(parts.uri.path()).ok_or_else(ApiError::no_route)?;
    let q: HashMap<String, String> = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
        .0
        .into_iter()
        .collect();
    let method = &parts.method;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let cluster = &app.cluster;
    match route {
        Route::Version => Ok(json(StatusCode::OK, to_json(&version_info()))),
        Route::ApiVersions => Ok(json(StatusCode::OK, to_json(&api_versions()))),
        Route::ApiGroups => Ok(json(StatusCode::OK, to_json(&api_groups()))),
        Route::Resources { group, version } => {
            let list = resource_list(&group, &version).ok_or_else(ApiError::no_route)?;
            Ok(json(StatusCode::OK, to_json(&list)))
        }
        Route::Collection { kind, namespace } => {
            let ns = namespace.as_deref();
            match *method {
                Method::GET if flag(&q, "watch") => {
                    let opts = list_options(kind, &q)?;
                    let req = WatchRequest {
                        kind,
                        namespace,
                        labels: opts.labels,
                        fields: opts.fields,
                        resource_version: q.get("resourceVersion").cloned(),
                        send_initial_events: flag(&q, "sendInitialEvents"),
                        bookmarks: flag(&q, "allowWatchBookmarks"),
                        timeout_seconds: q
                            .get("timeoutSeconds")
                            .map(|t| {
                                t.parse().map_err(|_| {
                                    ApiError::bad_request(format!(
                                        "timeoutSeconds: invalid value {t:?}"
                                    ))
                                })
                            })
                            .transpose()?
                            // 0 means "the server default", as for the real server.
                            .filter(|t: &u64| *t > 0),
                    };
                    let stream = watches::start(cluster, req, app.shutdown.clone())?;
                    Ok((
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        Body::from_stream(stream),
                    )
                        .into_response())
                }
                Method::GET => {
                    let opts = list_options(kind, &q)?;
                    if q.get("resourceVersionMatch").map(String::as_str) == Some("Exact")
                        && let Some(rv) =
                            q.get("resourceVersion").and_then(|v| v.parse::<u64>().ok())
                        && rv < cluster.read(|s| s.compacted_rv)
                    {
                        return Err(ApiError::gone(format!("too old resource version: {rv}")));
                    }
                    let (items, meta) = cluster.read(|s| api::list(s, kind, ns, &opts))?;
                    Ok(json(StatusCode::OK, kind.list_json(items, meta)))
                }
                Method::POST => {
                    if kind.namespaced() && ns.is_none() {
                        return Err(ApiError::method_not_allowed());
                    }
                    let value = api::parse_body(kind, body)?;
                    let dry = dry_run(&q)?;
                    let obj = cluster.write(|s| api::create(s, kind, ns, value, dry))?;
                    Ok(object_response(StatusCode::CREATED, &obj))
                }
                Method::DELETE => {
                    if kind.namespaced() && ns.is_none() {
                        return Err(ApiError::method_not_allowed());
                    }
                    let opts = list_options(kind, &q)?;
                    let req = delete_request(body, &q)?;
                    let (items, meta) =
                        cluster.write(|s| api::delete_collection(s, kind, ns, &opts, &req))?;
                    Ok(json(StatusCode::OK, kind.list_json(items, meta)))
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        Route::Item {
            kind,
            namespace,
            name,
            sub,
        } => {
            let ns = namespace.as_deref();
            let part = match sub.as_deref() {
                None => Part::Main,
                Some("status") if kind.has_status() => Part::Status,
                Some("log") if kind == Kind::Pod && *method == Method::GET => {
                    return logs::logs(
                        cluster,
                        ns.unwrap_or_default(),
                        &name,
                        &q,
                        app.shutdown.clone(),
                    );
                }
                Some(_) => return Err(ApiError::no_route()),
            };
            match (method.clone(), part) {
                (Method::GET, _) => Ok(object_response(
                    StatusCode::OK,
                    &cluster.read(|s| api::get(s, kind, ns, &name))?,
                )),
                (Method::PUT, _) => {
                    let value = api::parse_body(kind, body)?;
                    let dry = dry_run(&q)?;
                    let obj =
                        cluster.write(|s| api::update(s, kind, ns, &name, value, part, dry))?;
                    Ok(object_response(StatusCode::OK, &obj))
                }
                (Method::PATCH, _) => {
                    let patch_type = PatchType::from_content_type(content_type)?;
                    let dry = dry_run(&q)?;
                    let manager = q.get("fieldManager").map(String::as_str);
                    let existed = cluster.read(|s| api::get(s, kind, ns, &name).is_ok());
                    let obj = cluster.write(|s| {
                        api::patch(s, kind, ns, &name, patch_type, body, part, manager, dry)
                    })?;
                    Ok(object_response(
                        if existed {
                            StatusCode::OK
                        } else {
                            StatusCode::CREATED
                        },
                        &obj,
                    ))
                }
                (Method::DELETE, Part::Main) => {
                    let req = delete_request(body, &q)?;
                    let obj = cluster.write(|s| api::delete(s, kind, ns, &name, &req))?;
                    Ok(object_response(StatusCode::OK, &obj))
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
    }
}

fn version_info() -> Info {
    Info {
        major: "1".into(),
        minor: "34".into(),
        git_version: "v1.34.0-axle-kube-testserver".into(),
        git_commit: String::new(),
        git_tree_state: "clean".into(),
        build_date: "2025-08-27T00:00:00Z".into(),
        go_version: "go1.24".into(),
        compiler: "gc".into(),
        platform: "linux/amd64".into(),
        ..Default::default()
    }
}

fn api_versions() -> APIVersions {
    APIVersions {
        versions: vec!["v1".into()],
        server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
            client_cidr: "0.0.0.0/0".into(),
            server_address: String::new(),
        }],
    }
}

fn api_groups() -> APIGroupList {
    let groups: BTreeSet<(&str, &str)> = Kind::ALL
        .iter()
        .filter(|k| !k.group().is_empty())
        .map(|k| (k.group(), k.version()))
        .collect();
    APIGroupList {
        groups: groups
            .into_iter()
            .map(|(group, version)| {
                let gv = GroupVersionForDiscovery {
                    group_version: format!("{group}/{version}"),
                    version: version.into(),
                };
                APIGroup {
                    name: group.into(),
                    preferred_version: Some(gv.clone()),
                    versions: vec![gv],
                    server_address_by_client_cidrs: None,
                }
            })
            .collect(),
    }
}

fn resource_list(group: &str, version: &str) -> Option<APIResourceList> {
    let kinds: Vec<Kind> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| k.group() == group && k.version() == version)
        .collect();
    if kinds.is_empty() {
        return None;
    }
    let verbs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut resources = Vec::new();
    for kind in kinds {
        resources.push(APIResource {
            name: kind.plural().into(),
            kind: kind.name().into(),
            namespaced: kind.namespaced(),
            singular_name: kind.name().to_lowercase(),
            verbs: verbs(&[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]),
            ..Default::default()
        });
        if kind.has_status() {
            resources.push(APIResource {
                name: format!("{}/status", kind.plural()),
                kind: kind.name().into(),
                namespaced: kind.namespaced(),
                verbs: verbs(&["get", "patch", "update"]),
                ..Default::default()
            });
        }
        if kind == Kind::Pod {
            resources.push(APIResource {
                name: "pods/log".into(),
                kind: "Pod".into(),
                namespaced: true,
                verbs: verbs(&["get"]),
                ..Default::default()
            });
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(APIResourceList {
        group_version,
        resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_to_kinds() {
        assert_eq!(
            parse_route("/api/v1/pods"),
            Some(Route::Collection {
                kind: Kind::Pod,
                namespace: None
            })
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/pods/p/log"),
            Some(Route::Item {
                kind: Kind::Pod,
                namespace: Some("ns".into()),
                name: "p".into(),
                sub: Some("log".into())
            })
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/ns"),
            Some(Route::Item {
                kind: Kind::Namespace,
                namespace: None,
                name: "ns".into(),
                sub: None
            })
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/status"),
            Some(Route::Item {
                kind: Kind::Namespace,
                namespace: None,
                name: "ns".into(),
                sub: Some("status".into())
            })
        );
        assert_eq!(
            parse_route("/apis/batch/v1/jobs"),
            Some(Route::Collection {
                kind: Kind::Job,
                namespace: None
            })
        );
        assert_eq!(
            parse_route("/apis/scheduling.k8s.io/v1/priorityclasses/x"),
            Some(Route::Item {
                kind: Kind::PriorityClass,
                namespace: None,
                name: "x".into(),
                sub: None
            })
        );
        assert_eq!(parse_route("/api/v1/pods/p"), None);
        assert_eq!(parse_route("/apis/apps/v1/deployments"), None);
        assert_eq!(parse_route("/"), None);
    }
}
