//! The example policy repo in `deploy/examples/policy` loads cleanly, means
//! what its comments say, and ships an up-to-date JSON Schema.

use std::path::PathBuf;

use axle_policy::{Milli, ProviderType, Role, json_schema, load_dir};

fn example_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/policy")
}

#[test]
fn example_policy_loads_without_errors_or_warnings() {
    let loaded = match load_dir(&example_dir()) {
        Ok(l) => l,
        Err(e) => panic!("example policy failed to load:\n{e}"),
    };
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    let p = &loaded.policy;
    assert!(p.revision.starts_with("fnv1a64-"));

    let teams: Vec<&str> = p.teams.keys().map(String::as_str).collect();
    assert_eq!(teams, ["nlp", "recsys", "research", "vision"]);
    let vision = &p.teams["vision"];
    assert_eq!(vision.quotas["H100"].guaranteed, Milli::gpus(8));
    assert_eq!(vision.quotas["H100"].limit, Milli::gpus(16));
    assert_eq!(vision.weight, 2.0);
    assert_eq!(
        vision.burst.monthly_budget,
        axle_policy::Usd::from_dollars(5000)
    );
    assert_eq!(vision.members[0].role, Role::Admin);
    assert_eq!(p.teams["research"].quotas["any"].guaranteed, Milli(500));

    let classes: Vec<(&str, i32)> = p
        .priority_classes
        .values()
        .map(|c| (c.name.as_str(), c.value))
        .collect();
    assert_eq!(
        classes,
        [
            ("batch", 0),
            ("development", 10),
            ("production", 1000),
            ("training", 100)
        ]
    );
    assert!(!p.priority_classes["production"].is_preemptible());
    assert!(p.priority_classes["batch"].idle_only);
    assert!(!p.priority_classes["batch"].burst_allowed);

    assert_eq!(p.clusters["eu-1"].declared_gpus()["H100"], 16);
    assert_eq!(p.clusters["eu-1"].region, "eu-west");
    assert_eq!(p.clusters["us-1"].declared_gpus()["A100"], 4);
    assert_eq!(p.clusters["us-1"].nodes[0].gpu_memory_gb, 80);

    assert_eq!(p.burst_providers.len(), 3);
    assert_eq!(
        p.burst_providers["runpod-secure"].provider_type,
        ProviderType::Runpod
    );
    assert_eq!(p.settings.fraction_granularity, Milli(250));
    assert_eq!(p.settings.default_priority_class, "development");
}

#[test]
fn example_guarantees_fit_declared_capacity() {
    let p = load_dir(&example_dir())
        .map_err(|e| e.to_string())
        .unwrap()
        .policy;
    for (class, capacity) in [("H100", 16), ("A100", 4)] {
        let sum: Milli = p
            .teams
            .values()
            .filter_map(|t| t.quotas.get(class))
            .map(|q| q.guaranteed)
            .sum();
        assert!(sum <= Milli::gpus(capacity), "{class}: {sum} > {capacity}");
    }
}

#[test]
fn example_schema_file_is_up_to_date() {
    let path = example_dir().join("policy.schema.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let on_disk: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        on_disk,
        json_schema(),
        "regenerate with `cargo run --bin axle -- policy schema > deploy/examples/policy/policy.schema.json`"
    );
}
