//! The Kubernetes deployment (`deploy/kustomize`): every base and overlay
//! builds with `kubectl kustomize`, each object parses as its Kubernetes
//! type, the hub and spoke Deployments are shaped as documented (one
//! replica, probes, limits, non-root), the dev overlay's policy is a valid
//! Axle policy naming the spoke's cluster, and the spoke's ClusterRole
//! grants exactly the API calls the kubernetes driver makes — no wildcards.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use axle_spoke_agent::driver::kubernetes::access::API_ACCESS;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

/// Every kustomization directory under deploy/kustomize.
const KUSTOMIZATIONS: &[&str] = &["hub", "spoke", "overlays/dev", "overlays/ha"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

#[derive(Default)]
struct Built {
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    claims: Vec<PersistentVolumeClaim>,
    config_maps: Vec<ConfigMap>,
    secrets: Vec<Secret>,
    namespaces: Vec<Namespace>,
    accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    budgets: Vec<PodDisruptionBudget>,
}

fn parse<T: serde::de::DeserializeOwned>(doc: Value, dir: &str) -> T {
    let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{dir}: {what} does not parse: {e}"))
}

/// `kubectl kustomize deploy/kustomize/<dir>`, every object typed.
fn build(dir: &str) -> Built {
    let path = repo().join("deploy/kustomize").join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl (scripts/test.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text)
        .unwrap_or_else(|e| panic!("kustomize output of {dir} is not YAML: {e}"));
    assert!(!docs.is_empty(), "{dir} builds no objects");
    let mut b = Built::default();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "Deployment" => b.deployments.push(parse(doc, dir)),
            "Service" => b.services.push(parse(doc, dir)),
            "PersistentVolumeClaim" => b.claims.push(parse(doc, dir)),
            "ConfigMap" => b.config_maps.push(parse(doc, dir)),
            "Secret" => b.secrets.push(parse(doc, dir)),
            "Namespace" => b.namespaces.push(parse(doc, dir)),
            "ServiceAccount" => b.accounts.push(parse(doc, dir)),
            "ClusterRole" => b.cluster_roles.push(parse(doc, dir)),
            "ClusterRoleBinding" => b.bindings.push(parse(doc, dir)),
            "PodDisruptionBudget" => b.budgets.push(parse(doc, dir)),
            other => panic!("{dir}: unexpected kind {other:?}; add it to this test"),
        }
    }
    b
}

fn deployment<'a>(b: &'a Built, name: &str) -> &'a Deployment {
    b.deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Deployment {name}"))
}

/// Every directory under deploy/kustomize that holds a kustomization.
fn kustomizations_on_disk(dir: &Path, base: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir)
        .expect("read deploy/kustomize")
        .flatten()
    {
        let p = entry.path();
        if p.is_dir() {
            if p.join("kustomization.yaml").exists() {
                let rel = p.strip_prefix(base).expect("under base");
                out.push(rel.to_string_lossy().into_owned());
            }
            kustomizations_on_disk(&p, base, out);
        }
    }
}

#[test]
fn no_kustomization_escapes_the_checks() {
    let base = repo().join("deploy/kustomize");
    let mut found = Vec::new();
    kustomizations_on_disk(&base, &base, &mut found);
    found.sort();
    let mut listed: Vec<String> = KUSTOMIZATIONS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "add new bases and overlays to KUSTOMIZATIONS"
    );
}

#[test]
fn every_kustomization_builds_into_valid_objects() {
    for dir in KUSTOMIZATIONS {
        let b = build(dir);
        for d in &b.deployments {
            let name = d.metadata.name.clone().unwrap_or_default();
            let spec = d.spec.as_ref().expect("deployment spec");
            // The replicated hub is checked on its own (below).
            if !(*dir == "overlays/ha" && name == "axle-hub") {
                assert_eq!(spec.replicas, Some(1), "{dir}/{name}: one replica");
                assert_eq!(
                    spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
                    Some("Recreate"),
                    "{dir}/{name}: the old pod must be gone before the new one starts"
                );
            }
            let pod = spec.template.spec.as_ref().expect("pod spec");
            assert_eq!(
                pod.security_context
                    .as_ref()
                    .and_then(|s| s.run_as_non_root),
                Some(true),
                "{dir}/{name}: runs as non-root"
            );
            for c in &pod.containers {
                let r = c.resources.as_ref().expect("resources");
                assert!(r.requests.is_some(), "{dir}/{name}: requests");
                assert!(
                    r.limits.as_ref().is_some_and(|l| l.contains_key("memory")),
                    "{dir}/{name}: a memory limit"
                );
            }
        }
    }
}

#[test]
fn the_ha_overlay_runs_three_replicas_on_etcd_under_a_disruption_budget() {
    let b = build("overlays/ha");
    let hub = deployment(&b, "axle-hub");
    let spec = hub.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("RollingUpdate")
    );
    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    for want in [
        "--replica-id=$(POD_NAME)",
        "--advertise-http=http://$(POD_IP):7070",
        "--advertise-grpc=http://$(POD_IP):7071",
    ] {
        assert!(
            args.iter().any(|a| a == want),
            "hub args {args:?} lack {want}"
        );
    }
    let env = c.env.clone().unwrap_or_default();
    let store = env
        .iter()
        .find(|e| e.name == "AXLE_STORE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("AXLE_STORE from a Secret");
    assert_eq!(
        (store.name.as_str(), store.key.as_str()),
        ("axle-etcd", "store")
    );
    // No claim: the state is in etcd; logs on an emptyDir.
    assert!(b.claims.is_empty(), "no PersistentVolumeClaim");
    let volumes = pod.volumes.clone().unwrap_or_default();
    assert!(volumes.iter().all(|v| v.persistent_volume_claim.is_none()));
    assert!(
        volumes
            .iter()
            .any(|v| v.name == "data" && v.empty_dir.is_some())
    );
    // Followers are serving (they redirect): readiness must not be /readyz.
    let ready = c
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .and_then(|h| h.path.clone());
    assert_eq!(ready.as_deref(), Some("/healthz"));
    let pdb = b.budgets.first().expect("a PodDisruptionBudget");
    let pdb_spec = pdb.spec.as_ref().unwrap();
    assert_eq!(
        pdb_spec.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
    );
}

#[test]
fn the_hub_has_probes_storage_and_its_policy() {
    let b = build("hub");
    let hub = deployment(&b, "axle-hub");
    let pod = hub.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/healthz"));
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/readyz"));
    let args = c.args.clone().unwrap_or_default();
    for want in ["--policy=/etc/axle/policy", "--data-dir=/var/lib/axle"] {
        assert!(
            args.iter().any(|a| a == want),
            "hub args {args:?} lack {want}"
        );
    }
    let volumes = pod.volumes.clone().unwrap_or_default();
    let claim = volumes
        .iter()
        .find_map(|v| v.persistent_volume_claim.as_ref())
        .expect("the store on a PersistentVolumeClaim");
    assert!(
        b.claims
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(claim.claim_name.as_str())),
        "the claim {} is part of the base",
        claim.claim_name
    );
    assert!(
        volumes.iter().any(|v| v
            .config_map
            .as_ref()
            .is_some_and(|m| m.name == "axle-policy")),
        "the policy comes from the ConfigMap axle-policy"
    );
    let svc = &b.services[0];
    let ports: BTreeSet<i32> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, BTreeSet::from([7070, 7071]));
}

/// (group, resource, verb) triples of a ClusterRole; panics on wildcards.
fn grants(role: &ClusterRole) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role.rules.clone().unwrap_or_default() {
        assert!(
            rule.non_resource_urls.is_none() && rule.resource_names.is_none(),
            "unexpected rule {rule:?}"
        );
        for g in rule.api_groups.clone().unwrap_or_default() {
            for r in rule.resources.clone().unwrap_or_default() {
                for v in &rule.verbs {
                    assert!(
                        g != "*" && r != "*" && v != "*",
                        "a wildcard in the spoke's ClusterRole: {rule:?}"
                    );
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn the_spoke_cluster_role_grants_exactly_what_the_driver_calls() {
    let b = build("spoke");
    assert_eq!(b.cluster_roles.len(), 1);
    let granted = grants(&b.cluster_roles[0]);
    let needed: BTreeSet<(String, String, String)> = API_ACCESS
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_string(), a.resource.to_string(), v.to_string()))
        })
        .collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "deploy/kustomize/spoke/rbac.yaml vs the driver's API_ACCESS:\n missing {missing:?}\n extra {extra:?}"
    );
    let spoke = deployment(&b, "axle-spoke");
    let pod = spoke.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("axle-spoke"));
    let binding = &b.bindings[0];
    assert_eq!(binding.role_ref.name, "axle-spoke");
    let subject = &binding.subjects.as_ref().unwrap()[0];
    assert_eq!(
        (subject.kind.as_str(), subject.name.as_str()),
        ("ServiceAccount", "axle-spoke")
    );
    let args = pod.containers[0].args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--driver=kubernetes"), "{args:?}");
}

#[test]
fn the_dev_overlay_deploys_a_valid_policy_for_its_spoke() {
    let b = build("overlays/dev");
    for d in &b.deployments {
        assert_eq!(d.metadata.namespace.as_deref(), Some("axle-system"));
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("axle:dev"));
    }
    assert!(
        b.namespaces
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("axle-system"))
    );
    // The binding names the ServiceAccount where kustomize put it.
    let subject = &b.bindings[0].subjects.as_ref().unwrap()[0];
    assert_eq!(subject.namespace.as_deref(), Some("axle-system"));
    // The generated ConfigMap (hash-suffixed) is the one the hub mounts.
    let hub = deployment(&b, "axle-hub");
    let mounted: Vec<String> = hub
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.config_map.map(|c| c.name))
        .collect();
    let policy = b
        .config_maps
        .iter()
        .find(|c| mounted.contains(c.metadata.name.as_ref().unwrap()))
        .expect("the hub mounts a generated policy ConfigMap");
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, text) in policy.data.clone().unwrap_or_default() {
        std::fs::write(dir.path().join(file), text).expect("write policy file");
    }
    let loaded = axle_policy::load_dir(dir.path())
        .unwrap_or_else(|f| panic!("the dev overlay's policy does not load:\n{f}"));
    let spoke_cm = b
        .config_maps
        .iter()
        .find(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("axle-spoke"))
        })
        .expect("the spoke ConfigMap");
    let cluster = spoke_cm.data.as_ref().unwrap()["cluster"].clone();
    assert!(
        loaded.policy.clusters.contains_key(&cluster),
        "the spoke's cluster {cluster:?} is not in the dev policy"
    );
    assert!(
        b.secrets.iter().any(|s| s
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("axle-spoke-token"))),
        "the dev overlay makes the spoke token"
    );
}
