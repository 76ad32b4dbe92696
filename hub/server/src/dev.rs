//! `axle-hub --dev`: the whole system on one machine with one command — the
//! example policy, a temporary data dir and two in-process spokes with
//! declared GPUs.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Context;
use axle_policy::Policy;
use axle_spoke_agent::{GpuSpec, NodeSpec, SpokeConfig};
use tracing::error;

use crate::server::{self, Listeners};

/// The example policy repository, embedded so `--dev` works from any directory.
/// (`embedded_policy_matches_the_repository` keeps this list in step with
/// `deploy/examples/policy/`.)
pub const EXAMPLE_POLICY: &[(&str, &str)] = &[
    (
        "burst-providers.yaml",
        include_str!("../../../deploy/examples/policy/burst-providers.yaml"),
    ),
    (
        "clusters/eu-1.yaml",
        include_str!("../../../deploy/examples/policy/clusters/eu-1.yaml"),
    ),
    (
        "clusters/us-1.yaml",
        include_str!("../../../deploy/examples/policy/clusters/us-1.yaml"),
    ),
    (
        "priority-classes.yaml",
        include_str!("../../../deploy/examples/policy/priority-classes.yaml"),
    ),
    (
        "settings.yaml",
        include_str!("../../../deploy/examples/policy/settings.yaml"),
    ),
    (
        "teams/nlp.yaml",
        include_str!("../../../deploy/examples/policy/teams/nlp.yaml"),
    ),
    (
        "teams/recsys.yaml",
        include_str!("../../../deploy/examples/policy/teams/recsys.yaml"),
    ),
    (
        "teams/research.yaml",
        include_str!("../../../deploy/examples/policy/teams/research.yaml"),
    ),
    (
        "teams/vision.yaml",
        include_str!("../../../deploy/examples/policy/teams/vision.yaml"),
    ),
];

pub fn example_policy() -> anyhow::Result<Policy> {
    let sources: Vec<(String, String)> = EXAMPLE_POLICY
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
    axle_policy::load_sources(&sources)
        .map(|l| l.policy)
        .map_err(|f| anyhow::anyhow!("{f}"))
}

pub fn temp_data_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("axle-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// The dev spokes: eu-1 with 2 nodes × 8 H100 80GB, us-1 with 1 node × 4 A100 80GB.
pub fn dev_spokes(grpc_url: &str, data_dir: &std::path::Path, policy: &Policy) -> Vec<SpokeConfig> {
    let node = |name: &str, n: u32, model: &str| NodeSpec {
        name: name.to_string(),
        gpus: (0..n)
            .map(|index| GpuSpec {
                index,
                model: model.to_string(),
                memory_mb: 80 * 1024,
            })
            .collect(),
    };
    let region = |c: &str, default: &str| {
        policy
            .clusters
            .get(c)
            .map(|x| x.region.clone())
            .unwrap_or_else(|| default.to_string())
    };
    vec![
        SpokeConfig {
            hub_url: grpc_url.to_string(),
            cluster: "eu-1".into(),
            region: region("eu-1", "eu-west"),
            labels: Default::default(),
            nodes: vec![node("node-0", 8, "H100"), node("node-1", 8, "H100")],
            data_dir: data_dir.join("spokes/eu-1"),
            token: None,
        },
        SpokeConfig {
            hub_url: grpc_url.to_string(),
            cluster: "us-1".into(),
            region: region("us-1", "us-east"),
            labels: Default::default(),
            nodes: vec![node("node-0", 4, "A100")],
            data_dir: data_dir.join("spokes/us-1"),
            token: None,
        },
    ]
}

pub async fn run(
    data_dir: PathBuf,
    policy: Policy,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let http = listeners.http.local_addr()?;
    let grpc = listeners.grpc.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let spokes = dev_spokes(&format!("http://{grpc}"), &data_dir, &policy);
    let mut tasks = Vec::new();
    for cfg in spokes {
        let mut rx = stop_rx.clone();
        let name = cfg.cluster.clone();
        tasks.push(tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axle_spoke_agent::run(cfg, stop).await {
                error!("dev spoke {name} failed: {e:#}");
            }
        }));
    }
    println!(
        "\nAxle hub (dev) is up: HTTP http://{http}  gRPC {grpc}  data {}\n\
         spokes: eu-1 (2 nodes × 8 H100, {}), us-1 (1 node × 4 A100, {})\n\
         teams: {}\n\n\
         try, in another terminal (AXLE_HUB=http://{http}):\n  \
         cargo run --release --bin axle -- submit --team vision --gpus 0.25 --priority development -- sleep 60\n  \
         cargo run --release --bin axle -- submit --team nlp --gpus 8 --gang 2 --priority training -- sleep 120\n  \
         cargo run --release --bin axle -- get workloads\n  \
         cargo run --release --bin axle -- get teams\n",
        data_dir.display(),
        policy
            .clusters
            .get("eu-1")
            .map(|c| c.region.as_str())
            .unwrap_or("eu-west"),
        policy
            .clusters
            .get("us-1")
            .map(|c| c.region.as_str())
            .unwrap_or("us-east"),
        policy.teams.keys().cloned().collect::<Vec<_>>().join(", "),
    );
    let hub_shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    let res = server::run(data_dir, policy, None, listeners, hub_shutdown).await;
    for t in tasks {
        let _ = t.await;
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_policy_matches_the_repository() {
        let root =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/policy");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("example policy dir") {
                let p = e.expect("entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "yaml") {
                    on_disk.push(
                        p.strip_prefix(&root)
                            .expect("under root")
                            .display()
                            .to_string(),
                    );
                }
            }
        }
        on_disk.sort();
        let embedded: Vec<String> = EXAMPLE_POLICY.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(embedded, on_disk);
        for (p, c) in EXAMPLE_POLICY {
            assert_eq!(
                &std::fs::read_to_string(root.join(p)).expect("read"),
                c,
                "{p}"
            );
        }
        example_policy().expect("the example policy loads");
    }
}
