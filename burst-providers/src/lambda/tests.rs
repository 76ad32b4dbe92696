//! Unit tests of the Lambda adapter's parsing and mapping.

use super::*;

#[test]
fn statuses_map_to_states_and_unknown_ones_are_kept() {
    assert_eq!(state("booting"), InstanceState::Pending);
    assert_eq!(state("active"), InstanceState::Running);
    assert_eq!(state("terminating"), InstanceState::Stopping);
    assert_eq!(state("terminated"), InstanceState::Terminated);
    assert_eq!(state("preempted"), InstanceState::Interrupted);
    assert_eq!(state("unhealthy"), InstanceState::Other("unhealthy".into()));
    assert_eq!(state("rebooting"), InstanceState::Other("rebooting".into()));
}

#[test]
fn gpu_counts_models_and_memory_come_from_names_and_descriptions() {
    assert_eq!(gpus_from_name("gpu_8x_h100_sxm5"), Some(8));
    assert_eq!(gpus_from_name("gpu_1x_a100"), Some(1));
    assert_eq!(gpus_from_name("cpu_4x_general"), None);
    assert_eq!(gpus_from_name("gpu_x_a100"), None);
    assert_eq!(gpus_from_description("2x A6000 (48 GB)"), Some(2));
    assert_eq!(gpus_from_description(""), None);
    assert_eq!(gpu_name("8x H100 (80 GB SXM5)"), "H100");
    assert_eq!(gpu_name("A100 (40 GB SXM4)"), "A100");
    assert_eq!(gpu_name("(80 GB)"), "");
    assert_eq!(gpu_class(gpu_name("1x RTX A6000 (48 GB)")), "A6000");
    assert_eq!(gpu_memory_gb("8x H100 (80 GB SXM5)"), Some(80));
    assert_eq!(gpu_memory_gb("1x GH200 (96GB)"), Some(96));
    assert_eq!(gpu_memory_gb("1x A10 (24 GiB PCIe)"), Some(24));
    assert_eq!(gpu_memory_gb("1x A10"), None);
    assert_eq!(gpu_memory_gb("1x A10 (PCIe)"), None);
    assert_eq!(gpu_memory_gb("1x A10 (99999999999999999999999 GB)"), None);
    assert_eq!(gpu_memory_gb("("), None);
}

#[test]
fn tag_keys_follow_lambdas_rule() {
    for ok in ["axle-managed-by", "axle-hub", "axle-burst-id", "a:b", "ab"] {
        assert!(valid_tag_key(ok), "{ok}");
    }
    for bad in ["", "a", "Axle", "1abc", "a_b", "a b", &"a".repeat(56)] {
        assert!(!valid_tag_key(bad), "{bad}");
    }
}

#[test]
fn images_are_picked_by_family_unless_an_id_is_written() {
    assert_eq!(
        image_spec("lambda-stack-22-04"),
        json!({"family": "lambda-stack-22-04"})
    );
    assert_eq!(image_spec("family:x"), json!({"family": "x"}));
    assert_eq!(image_spec("id:0920582c"), json!({"id": "0920582c"}));
}

#[test]
fn secrets_are_cut_out_of_answers() {
    assert_eq!(redact("bad key sk-123 given", "sk-123"), "bad key … given");
    assert_eq!(redact("x", ""), "x");
}

#[test]
fn odd_catalog_answers_are_errors_not_panics() {
    for v in [
        json!(null),
        json!({"data": []}),
        json!({"data": {"t": 1}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10"}, "regions_with_capacity_available": []}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": -5}, "regions_with_capacity_available": []}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 1.5}, "regions_with_capacity_available": []}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": u64::MAX}, "regions_with_capacity_available": []}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5}}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5, "specs": {"gpus": -1}}, "regions_with_capacity_available": []}}}),
        json!({"data": {"t": {"instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 5}, "regions_with_capacity_available": [{}]}}}),
    ] {
        assert!(parse_catalog(&v, &[]).is_err(), "{v}");
    }
    let old = json!({"data": {"gpu_1x_a10": {
        "instance_type": {"name": "gpu_1x_a10", "description": "1x A10 (24 GB PCIe)", "price_cents_per_hour": "75"},
        "regions_with_capacity_available": [{"name": "us-east-1", "description": "Virginia"}]
    }}});
    let offers = parse_catalog(&old, &[]).unwrap();
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].price_per_hour, Usd::from_cents(75));
    assert_eq!(offers[0].gpu_model, "A10");
    assert_eq!(offers[0].gpu_memory_mb, 24 * 1024);
}

#[test]
fn odd_instances_are_errors_not_panics() {
    for v in [
        json!(null),
        json!({}),
        json!({"id": 5, "status": "active"}),
        json!({"id": "", "status": "active"}),
        json!({"id": "i", "status": 3}),
        json!({"id": "i", "status": "active", "tags": "x"}),
    ] {
        assert!(parse_instance("t", &v).is_err(), "{v}");
    }
    let p = parse_instance(
        "t",
        &json!({"id": "i", "status": "preempted", "name": null, "tags": [{"key": "a"}, {"key": "b", "value": "c"}]}),
    )
    .unwrap();
    assert!(p.tagged);
    assert_eq!(p.instance.state, InstanceState::Interrupted);
    assert_eq!(
        p.instance.tags,
        BTreeMap::from([("b".to_string(), "c".to_string())])
    );
    assert!(p.matches("b", "c"));
    assert!(!p.matches("a", ""));
    let untagged =
        parse_instance("t", &json!({"id": "i", "status": "active", "name": "k1"})).unwrap();
    assert!(!untagged.tagged);
    assert!(untagged.matches("axle-burst-id", "k1"));
    assert!(!untagged.matches("axle-burst-id", "k2"));
    let named_like_a_tag =
        parse_instance("t", &json!({"id": "i", "status": "active", "name": "axle"})).unwrap();
    assert!(!named_like_a_tag.matches(TAG_MANAGED_BY, "axle"));
    assert!(!named_like_a_tag.matches(TAG_HUB, "axle"));
    let nameless = parse_instance("t", &json!({"id": "i", "status": "active"})).unwrap();
    assert!(!nameless.matches("axle-burst-id", ""));
}
