//! Axle's hub: the control plane process. It holds the policy, keeps every
//! accepted workload and decision in a durable store, runs the scheduling
//! loop over `axle-scheduler`, talks to spokes over gRPC, and serves the
//! HTTP/JSON and gRPC user APIs.

pub mod auth;
pub mod burst;
pub mod dev;
pub mod grpc;
pub mod grpc_serve;
pub mod ha;
pub mod http;
pub mod http_serve;
pub mod hub;
pub mod isolation;
pub mod lifecycle;
pub mod logs;
pub mod oidc;
pub mod page_cache;
pub mod rate;
pub mod read_lane;
pub mod records;
pub mod request_limits;
pub mod server;
pub mod spoke_ca;
pub mod store;
pub mod tls;
pub mod views;

#[cfg(test)]
mod layering {
    //! The production hub links no spoke code and no Kubernetes client:
    //! walked from the workspace's Cargo.lock (which lists every kind of
    //! dependency, so this is stricter than `cargo tree -e normal`).

    use std::collections::{BTreeMap, BTreeSet};

    fn lock_graph() -> BTreeMap<String, Vec<String>> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock");
        let text = std::fs::read_to_string(path).expect("read Cargo.lock");
        let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut name = String::new();
        let mut in_deps = false;
        for line in text.lines() {
            let line = line.trim();
            if line == "[[package]]" {
                in_deps = false;
            } else if let Some(n) = line.strip_prefix("name = ") {
                name = n.trim_matches('"').to_string();
                graph.entry(name.clone()).or_default();
            } else if line.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && line == "]" {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"` (or with a source).
                let dep = line.trim_matches(|c| c == '"' || c == ',');
                let dep = dep.split(' ').next().unwrap_or(dep).to_string();
                graph.entry(name.clone()).or_default().push(dep);
            }
        }
        graph
    }

    #[test]
    fn the_hub_links_neither_the_spoke_agent_nor_kube() {
        let graph = lock_graph();
        assert!(graph.contains_key("axle-hub"), "Cargo.lock lists axle-hub");
        let mut seen = BTreeSet::new();
        let mut todo = vec!["axle-hub".to_string()];
        while let Some(p) = todo.pop() {
            if seen.insert(p.clone()) {
                todo.extend(graph.get(&p).into_iter().flatten().cloned());
            }
        }
        for banned in ["axle-spoke-agent", "kube", "kube-runtime", "k8s-openapi"] {
            assert!(!seen.contains(banned), "axle-hub depends on {banned}");
        }
        // The walk found the hub's real dependencies.
        assert!(seen.contains("axle-scheduler") && seen.contains("tonic"));
    }

    #[test]
    fn the_core_knows_neither_grpc_nor_http() {
        // Observed: hub.rs held tonic types and an HTTP-coded error type.
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/hub"
        ))];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src/hub") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 10, "the walk found the core: {files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            for word in ["tonic::", "axum::", "StatusCode", "hyper::"] {
                assert!(
                    !text.contains(word),
                    "{} uses {word}: map to HubError at the edges instead",
                    path.display()
                );
            }
        }
    }
}
