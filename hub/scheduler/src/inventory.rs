//! Inventory from the policy's declared `Cluster` capacity (planning and simulation).

use axle_policy::Policy;

use crate::types::{ClusterInventory, Inventory, NodeInventory};

/// One `ClusterInventory` per `Cluster` document, nodes named `node-0`, `node-1`, …
pub fn declared(policy: &Policy) -> Inventory {
    let clusters = policy
        .clusters
        .values()
        .map(|c| {
            let mut nodes = Vec::new();
            for g in &c.nodes {
                for _ in 0..g.count {
                    nodes.push(NodeInventory {
                        name: format!("node-{}", nodes.len()),
                        gpu_model: g.gpu_model.clone(),
                        gpu_count: g.gpus_per_node as u32,
                        gpu_memory_mb: g.gpu_memory_gb * 1024,
                        fractions_only: false,
                        whole_only: false,
                        units: Vec::new(),
                        topology: g.topology.clone(),
                    });
                }
            }
            ClusterInventory {
                name: c.name.clone(),
                region: c.region.clone(),
                schedulable: true,
                needs_image: false,
                price_per_gpu_hour: c.price_per_gpu_hour,
                owner_team: None,
                nodes,
            }
        })
        .collect();
    let mut inv = Inventory { clusters };
    inv.order_by_price();
    inv
}

/// One cluster of `gpus` GPUs of `model` in nodes of `per_node` (the last node
/// takes the remainder).
pub fn uniform(name: &str, region: &str, model: &str, gpus: u64, per_node: u32) -> Inventory {
    let mut nodes = Vec::new();
    let mut left = gpus;
    while left > 0 {
        let n = left.min(u64::from(per_node));
        nodes.push(NodeInventory {
            name: format!("node-{}", nodes.len()),
            gpu_model: model.to_string(),
            gpu_count: n as u32,
            gpu_memory_mb: 80 * 1024,
            fractions_only: false,
            whole_only: false,
            units: Vec::new(),
            topology: None,
        });
        left -= n;
    }
    Inventory {
        clusters: vec![ClusterInventory {
            name: name.to_string(),
            region: region.to_string(),
            schedulable: true,
            needs_image: false,
            price_per_gpu_hour: axle_policy::Usd::ZERO,
            owner_team: None,
            nodes,
        }],
    }
}
