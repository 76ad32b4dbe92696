//! Every kind of policy error and warning is reported with the right file,
//! line, column and field path; all of them at once; and no input panics.

use axle_policy::{Diagnostic, LoadFailure, Loaded, Milli, Severity, load_dir, load_sources};

const CLUSTER: &str = "apiVersion: axle.dev/v1
kind: Cluster
metadata:
  name: c1
spec:
  region: us-east
  nodes:
    - {count: 1, gpuModel: H100, gpusPerNode: 8, gpuMemoryGb: 80}
";

const PROVIDER: &str = "apiVersion: axle.dev/v1
kind: BurstProvider
metadata:
  name: aws-east
spec:
  type: aws
  regions: [us-east-1]
  gpuModels: [H100]
  maxInstances: 4
";

const TEAM: &str = "apiVersion: axle.dev/v1
kind: Team
metadata:
  name: a
spec:
  quotas:
    H100: {guaranteed: 4, limit: 8}
  burst:
    budgetUsdPerMonth: 100
    providers: [aws-east]
    regions: [us-east-1]
";

/// A valid policy, with `extra` files added or replacing files of the same path.
fn policy(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = [
        ("clusters.yaml", CLUSTER),
        ("providers.yaml", PROVIDER),
        ("teams/a.yaml", TEAM),
    ]
    .iter()
    .map(|(p, c)| (p.to_string(), c.to_string()))
    .collect();
    for (path, content) in extra {
        files.retain(|(p, _)| p != path);
        files.push((path.to_string(), content.to_string()));
    }
    files
}

fn ok(files: &[(String, String)]) -> Loaded {
    match load_sources(files) {
        Ok(l) => l,
        Err(e) => panic!("expected the policy to load:\n{e}"),
    }
}

fn fail(files: &[(String, String)]) -> LoadFailure {
    match load_sources(files) {
        Ok(l) => panic!("expected errors, policy loaded: {:#?}", l.warnings),
        Err(e) => e,
    }
}

/// The one diagnostic whose message contains `needle`.
fn find<'a>(diags: &'a [Diagnostic], needle: &str) -> &'a Diagnostic {
    let hits: Vec<&Diagnostic> = diags
        .iter()
        .filter(|d| d.message.contains(needle))
        .collect();
    match hits.as_slice() {
        [one] => one,
        _ => panic!(
            "expected one diagnostic containing {needle:?}, got {}:\n{}",
            hits.len(),
            diags
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

#[track_caller]
fn at(d: &Diagnostic, file: &str, line: u32, column: u32, path: &str) {
    assert_eq!(
        (d.file.as_str(), d.line, d.column),
        (file, line, column),
        "{d}"
    );
    assert!(
        d.path.contains(path),
        "path {:?} lacks {path:?}\n{d}",
        d.path
    );
    assert!(d.hint.is_some(), "no hint:\n{d}");
}

fn team(name: &str, spec: &str) -> String {
    format!("apiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

#[test]
fn base_policy_is_valid_and_gets_default_priority_classes() {
    let loaded = ok(&policy(&[]));
    assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
    let classes = &loaded.policy.priority_classes;
    assert_eq!(classes.len(), 4);
    assert_eq!(classes["production"].value, 1000);
    assert!(classes["production"].preemptible_by.is_empty());
    assert_eq!(classes["training"].preemptible_by, ["production"]);
    assert_eq!(
        classes["development"].preemptible_by,
        ["training", "production"]
    );
    assert!(classes["batch"].idle_only && !classes["batch"].burst_allowed);
    let a = &loaded.policy.teams["a"];
    assert_eq!(a.weight, 1.0);
    assert_eq!(a.quotas["H100"].limit, Milli::gpus(8));
}

#[test]
fn yaml_syntax_error() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata: {name: b\n",
    )]));
    assert_eq!(f.errors.len(), 1, "{f}");
    let d = &f.errors[0];
    assert_eq!(d.file, "teams/b.yaml");
    assert_eq!(d.line, 3);
    assert!(d.column >= 11, "{d}");
}

#[test]
fn unknown_field_in_spec() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        &team("b", "  quotas:\n    H100: {guaranted: 1}\n"),
    )]));
    let d = find(&f.errors, "unknown field `guaranted`");
    at(d, "teams/b.yaml", 7, 12, "Team/b.spec");
}

#[test]
fn unknown_top_level_field() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        &format!("{}status: {{}}\n", team("b", "  weight: 1\n")),
    )]));
    at(
        find(&f.errors, "unknown field `status`"),
        "teams/b.yaml",
        7,
        1,
        "document 1",
    );
}

#[test]
fn wrong_api_version_and_unknown_kind() {
    let f = fail(&policy(&[(
        "x.yaml",
        "apiVersion: axle.dev/v2\nkind: team\nmetadata:\n  name: b\nspec: {}\n",
    )]));
    at(
        find(&f.errors, "unsupported apiVersion `axle.dev/v2`"),
        "x.yaml",
        1,
        13,
        "document 1",
    );
    let d = find(&f.errors, "unknown kind `team`");
    at(d, "x.yaml", 2, 7, "document 1");
    assert!(d.hint.as_deref().unwrap().contains("`Team`"));
}

#[test]
fn missing_name_and_missing_spec() {
    let f = fail(&policy(&[(
        "x.yaml",
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata: {}\nspec: {}\n---\n# c\napiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: z\n",
    )]));
    at(
        find(&f.errors, "missing metadata.name"),
        "x.yaml",
        3,
        11,
        "Team/?",
    );
    at(find(&f.errors, "missing spec"), "x.yaml", 7, 1, "Team/z");
}

#[test]
fn invalid_name() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        &team("Vision_1", "  weight: 1\n"),
    )]));
    let d = find(&f.errors, "invalid name `Vision_1`");
    at(d, "teams/b.yaml", 4, 9, "Team/Vision_1.metadata.name");
}

#[test]
fn duplicate_name_points_at_second_and_mentions_first() {
    let f = fail(&policy(&[("teams/z.yaml", &team("a", "  weight: 1\n"))]));
    let d = find(&f.errors, "duplicate Team name `a`");
    at(d, "teams/z.yaml", 4, 9, "Team/a");
    assert!(
        d.hint.as_deref().unwrap().contains("teams/a.yaml:4:9"),
        "{d}"
    );
    // Same name in another kind is fine.
    ok(&policy(&[("teams/c1.yaml", &team("c1", "  weight: 1\n"))]));
}

#[test]
fn dangling_references() {
    let classes = "apiVersion: axle.dev/v1
kind: PriorityClass
metadata:
  name: development
spec:
  value: 10
  preemptibleBy: [trainng]
";
    let settings = "apiVersion: axle.dev/v1
kind: Settings
metadata:
  name: default
spec:
  defaultPriorityClass: dev
";
    let f = fail(&policy(&[
        ("classes.yaml", classes),
        ("settings.yaml", settings),
        (
            "teams/b.yaml",
            &team("b", "  burst:\n    providers: [aws-east, gcp]\n"),
        ),
    ]));
    at(
        find(&f.errors, "unknown priority class `trainng`"),
        "classes.yaml",
        7,
        19,
        "PriorityClass/development.spec.preemptibleBy[0]",
    );
    at(
        find(&f.errors, "default priority class `dev`"),
        "settings.yaml",
        6,
        25,
        "Settings/default.spec.defaultPriorityClass",
    );
    let d = find(&f.errors, "unknown burst provider `gcp`");
    at(d, "teams/b.yaml", 7, 27, "Team/b.spec.burst.providers[1]");
    assert!(d.hint.as_deref().unwrap().contains("aws-east"));
    assert_eq!(f.errors.len(), 3, "{f}");
}

#[test]
fn default_class_must_exist_when_classes_are_defined() {
    let classes = "apiVersion: axle.dev/v1\nkind: PriorityClass\nmetadata:\n  name: prod\nspec:\n  value: 1\n";
    let f = fail(&policy(&[("classes.yaml", classes)]));
    at(
        find(&f.errors, "default priority class `development`"),
        "classes.yaml",
        4,
        9,
        "defaultPriorityClass",
    );
}

#[test]
fn guaranteed_above_limit() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        &team(
            "b",
            "  quotas:\n    H100:\n      guaranteed: 3\n      limit: 2\n",
        ),
    )]));
    let d = find(&f.errors, "guaranteed (3) exceeds limit (2)");
    at(
        d,
        "teams/b.yaml",
        8,
        19,
        "Team/b.spec.quotas.H100.guaranteed",
    );
    let text = d.to_string();
    assert!(text.contains("--> teams/b.yaml:8:19"), "{text}");
    assert!(text.contains("8 |       guaranteed: 3\n"), "{text}");
}

#[test]
fn negative_and_non_finite_numbers() {
    let f = fail(&policy(&[
        (
            "teams/b.yaml",
            &team(
                "b",
                "  quotas:\n    H100: {guaranteed: -1, limit: .nan}\n    any: {limit: .inf}\n  weight: 0\n  burst:\n    budgetUsdPerMonth: -5\n",
            ),
        ),
        ("teams/c.yaml", &team("c", "  weight: .nan\n")),
        (
            "clusters.yaml",
            &CLUSTER.replace(
                "region: us-east",
                "region: us-east\n  priceUsdPerGpuHour: -.inf",
            ),
        ),
    ]));
    at(
        find(&f.errors, "quotas.H100.guaranteed must not be negative"),
        "teams/b.yaml",
        7,
        24,
        "quotas.H100.guaranteed",
    );
    at(
        find(&f.errors, "quotas.H100.limit must be a finite number"),
        "teams/b.yaml",
        7,
        35,
        "quotas.H100.limit",
    );
    at(
        find(&f.errors, "quotas.any.limit must be a finite number"),
        "teams/b.yaml",
        8,
        18,
        "quotas.any.limit",
    );
    at(
        find(&f.errors, "weight must be a finite number above 0, not 0"),
        "teams/b.yaml",
        9,
        11,
        "Team/b.spec.weight",
    );
    at(
        find(&f.errors, "weight must be a finite number above 0, not NaN"),
        "teams/c.yaml",
        6,
        11,
        "Team/c.spec.weight",
    );
    at(
        find(
            &f.errors,
            "budgetUsdPerMonth must be an amount of dollars: -5 is negative",
        ),
        "teams/b.yaml",
        11,
        24,
        "burst.budgetUsdPerMonth",
    );
    at(
        find(&f.errors, "priceUsdPerGpuHour must be"),
        "clusters.yaml",
        7,
        23,
        "Cluster/c1.spec.priceUsdPerGpuHour",
    );
    assert_eq!(f.errors.len(), 7, "{f}");
}

#[test]
fn fractions_must_be_multiples_of_granularity() {
    let f = fail(&policy(&[(
        "teams/b.yaml",
        &team("b", "  quotas:\n    any: {guaranteed: 0.3, limit: 0.5}\n"),
    )]));
    at(
        find(&f.errors, "not a multiple of fractionGranularity (0.25)"),
        "teams/b.yaml",
        7,
        23,
        "quotas.any.guaranteed",
    );

    let settings = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  fractionGranularity: 0.5\n";
    let f = fail(&policy(&[
        ("settings.yaml", settings),
        (
            "teams/b.yaml",
            &team("b", "  quotas:\n    any: {limit: 1.25}\n"),
        ),
    ]));
    at(
        find(&f.errors, "not a multiple of fractionGranularity (0.5)"),
        "teams/b.yaml",
        7,
        18,
        "quotas.any.limit",
    );
    ok(&policy(&[
        ("settings.yaml", settings),
        (
            "teams/b.yaml",
            &team("b", "  quotas:\n    any: {limit: 1.5}\n"),
        ),
    ]));
}

#[test]
fn granularity_must_divide_one_gpu() {
    for bad in ["0.3", "0", "2", "-0.25", ".nan"] {
        let settings = format!(
            "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  fractionGranularity: {bad}\n"
        );
        let f = fail(&policy(&[("settings.yaml", &settings)]));
        at(
            find(&f.errors, "must divide one GPU exactly"),
            "settings.yaml",
            6,
            24,
            "fractionGranularity",
        );
    }
}

#[test]
fn unknown_gpu_classes() {
    let f = fail(&policy(&[
        (
            "teams/b.yaml",
            &team(
                "b",
                "  quotas:\n    h100: {limit: 1}\n    TPU: {limit: 1}\n",
            ),
        ),
        (
            "clusters.yaml",
            &CLUSTER.replace("gpuModel: H100", "gpuModel: H1OO"),
        ),
        ("providers.yaml", &PROVIDER.replace("[H100]", "[H100, any]")),
    ]));
    let d = find(&f.errors, "unknown GPU class `h100`");
    at(d, "teams/b.yaml", 7, 5, "Team/b.spec.quotas.h100");
    assert!(d.hint.as_deref().unwrap().contains("did you mean `H100`"));
    at(
        find(&f.errors, "unknown GPU class `TPU`"),
        "teams/b.yaml",
        8,
        5,
        "quotas.TPU",
    );
    at(
        find(&f.errors, "unknown GPU class `H1OO`"),
        "clusters.yaml",
        8,
        28,
        "Cluster/c1.spec.nodes[0].gpuModel",
    );
    at(
        find(&f.errors, "unknown GPU class `any`"),
        "providers.yaml",
        8,
        21,
        "BurstProvider/aws-east.spec.gpuModels[1]",
    );

    // Settings.gpuClasses adds models.
    let settings = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  gpuClasses: [TPU]\n";
    let loaded = ok(&policy(&[
        ("settings.yaml", settings),
        (
            "teams/b.yaml",
            &team("b", "  quotas:\n    TPU: {limit: 1}\n"),
        ),
    ]));
    assert!(
        loaded
            .policy
            .settings
            .gpu_classes
            .iter()
            .any(|c| c == "TPU")
    );
    assert!(
        loaded
            .policy
            .settings
            .gpu_classes
            .iter()
            .any(|c| c == "H100")
    );
}

#[test]
fn only_one_settings_document() {
    let settings = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec: {}\n---\napiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec: {}\n";
    let f = fail(&policy(&[("settings.yaml", settings)]));
    let d = find(&f.errors, "more than one Settings document");
    at(d, "settings.yaml", 10, 9, "Settings/s");
    assert!(d.hint.as_deref().unwrap().contains("settings.yaml:4:9"));
}

#[test]
fn empty_node_groups() {
    let f = fail(&policy(&[(
        "clusters.yaml",
        &CLUSTER
            .replace("count: 1", "count: 0")
            .replace("gpusPerNode: 8", "gpusPerNode: 0"),
    )]));
    at(
        find(&f.errors, "count must be between 1"),
        "clusters.yaml",
        8,
        15,
        "nodes[0].count",
    );
    at(
        find(&f.errors, "gpusPerNode must be between 1"),
        "clusters.yaml",
        8,
        47,
        "nodes[0].gpusPerNode",
    );
}

#[test]
fn burst_region_not_served_is_a_warning() {
    let loaded = ok(&policy(&[(
        "teams/a.yaml",
        &TEAM.replace("regions: [us-east-1]", "regions: [us-east-1, eu-west-1]"),
    )]));
    let d = find(&loaded.warnings, "region `eu-west-1` is not served");
    assert_eq!(d.severity, Severity::Warning);
    at(d, "teams/a.yaml", 11, 26, "Team/a.spec.burst.regions[1]");
    assert!(d.hint.as_deref().unwrap().contains("aws-east: us-east-1"));
}

#[test]
fn a_provider_region_not_named_as_its_catalog_names_regions_is_a_warning() {
    // RunPod names data centers `US-KS-2`; a provider region `US` matched
    // none of them, so the example policy's RunPod provider offered nothing.
    let runpod = PROVIDER
        .replace("name: aws-east", "name: rp")
        .replace("type: aws", "type: runpod")
        .replace("regions: [us-east-1]", "regions: [US-KS-2, US, eu-ro-1]");
    let loaded = ok(&policy(&[(
        "providers.yaml",
        &format!("{PROVIDER}---\n{runpod}"),
    )]));
    let d = find(
        &loaded.warnings,
        "region `US` is not a RunPod data-center id",
    );
    assert_eq!(d.severity, Severity::Warning);
    at(
        d,
        "providers.yaml",
        17,
        22,
        "BurstProvider/rp.spec.regions[1]",
    );
    assert!(d.hint.as_deref().unwrap().contains("US-KS-2"), "{d:?}");
    find(
        &loaded.warnings,
        "region `eu-ro-1` is not a RunPod data-center id",
    );
    assert!(
        !loaded
            .warnings
            .iter()
            .any(|d| d.message.contains("`US-KS-2`") || d.message.contains("`us-east-1`")),
        "{:?}",
        loaded.warnings
    );
    // EC2 and Lambda regions are lower case.
    let loaded = ok(&policy(&[(
        "providers.yaml",
        &PROVIDER.replace("regions: [us-east-1]", "regions: [us-east-1, US-EAST-1]"),
    )]));
    find(
        &loaded.warnings,
        "region `US-EAST-1` is not an AWS region name",
    );
}

#[test]
fn burst_region_patterns_match_the_providers_regions() {
    // `us-*` is served (us-east-1); `eu-*` is not.
    let loaded = ok(&policy(&[(
        "teams/a.yaml",
        &TEAM.replace("regions: [us-east-1]", "regions: [us-*, eu-*]"),
    )]));
    assert!(
        !loaded
            .warnings
            .iter()
            .any(|d| d.message.contains("region `us-*`")),
        "{:?}",
        loaded.warnings
    );
    let d = find(&loaded.warnings, "region `eu-*` is not served");
    at(d, "teams/a.yaml", 11, 21, "Team/a.spec.burst.regions[1]");
}

#[test]
fn overcommitted_guarantees_warn_per_class_and_for_any() {
    let loaded = ok(&policy(&[
        (
            "teams/b.yaml",
            &team(
                "b",
                "  quotas:\n    H100: {guaranteed: 5, limit: 8}\n    any: {guaranteed: 6}\n",
            ),
        ),
        (
            "teams/c.yaml",
            &team(
                "c",
                "  quotas:\n    A100: {guaranteed: 1}\n    any: {guaranteed: 3}\n",
            ),
        ),
    ]));
    let d = find(&loaded.warnings, "guarantees for `H100` are over-committed");
    assert!(
        d.message.contains("guarantee 9 in total") && d.message.contains("declare 8"),
        "{d}"
    );
    // Teams in name order: a (4) + b (5) crosses 8 at team b.
    at(
        d,
        "teams/b.yaml",
        7,
        24,
        "Team/b.spec.quotas.H100.guaranteed",
    );
    let d = find(&loaded.warnings, "guarantees for `A100`");
    assert!(d.message.contains("declare 0"), "{d}");
    let d = find(&loaded.warnings, "guarantees for `any`");
    assert!(d.message.contains("guarantee 9 in total"), "{d}");
    at(d, "teams/c.yaml", 8, 23, "Team/c.spec.quotas.any");
    assert_eq!(loaded.warnings.len(), 3);
}

#[test]
fn all_errors_across_files_and_documents_are_reported_in_order() {
    let multi = "apiVersion: axle.dev/v1
kind: Team
metadata:
  name: b
spec:
  weight: -1
---
this: [is, not
---
apiVersion: axle.dev/v1
kind: Team
metadata:
  name: c
spec:
  quotas:
    H100: {guaranteed: 9, limit: 1}
";
    let f = fail(&policy(&[
        ("teams/multi.yaml", multi),
        (
            "clusters.yaml",
            &CLUSTER.replace("gpusPerNode: 8", "gpusPerNode: 0"),
        ),
        ("a.yaml", "kind: Nope\n"),
    ]));
    let got: Vec<(&str, u32)> = f.errors.iter().map(|d| (d.file.as_str(), d.line)).collect();
    assert_eq!(
        got,
        [
            ("a.yaml", 1),
            ("a.yaml", 1),
            ("clusters.yaml", 8),
            ("teams/multi.yaml", 6),
            ("teams/multi.yaml", 8),
            ("teams/multi.yaml", 16),
        ],
        "{f}"
    );
    let text = f.to_string();
    assert!(
        text.ends_with("policy invalid: 6 errors, 1 warning"),
        "{text}"
    );
}

#[test]
fn revision_is_stable_and_content_addressed() {
    let files = policy(&[]);
    let mut reversed = files.clone();
    reversed.reverse();
    let r1 = ok(&files).policy.revision;
    assert_eq!(r1, ok(&reversed).policy.revision);
    let changed = policy(&[(
        "teams/a.yaml",
        &TEAM.replace("budgetUsdPerMonth: 100", "budgetUsdPerMonth: 101"),
    )]);
    assert_ne!(r1, ok(&changed).policy.revision);
}

#[test]
fn garbage_never_panics() {
    let nasty = [
        "",
        "---",
        "---\n---\n---",
        "\u{0}\u{1}\u{2}",
        "[",
        "{",
        "a: &a [*a]",
        "x: !!binary AAAA",
        "- - - - -",
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata: 7\nspec: []",
        "apiVersion: [1]\nkind: {a: b}\n",
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: a\nspec:\n  quotas: [1, 2]\n",
        "apiVersion: axle.dev/v1\nkind: Team\nmetadata:\n  name: a\nspec:\n  quotas:\n    H100: {guaranteed: 1e300, limit: 1e308}\n",
        "apiVersion: axle.dev/v1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  region: r\n  nodes: [{count: 18446744073709551615, gpuModel: H100, gpusPerNode: 18446744073709551615}]\n",
        "apiVersion: axle.dev/v1\nkind: PriorityClass\nmetadata:\n  name: a\nspec:\n  value: 99999999999\n",
        "\t\tkey: value",
        "%YAML 1.2\n---\na: 1\n...\n---\nb: 2\n",
        "a: b\r\n---\r\nc: d\r\n",
        "\u{feff}apiVersion: axle.dev/v1",
        "key: \"unterminated",
        "? complex\n: key\n",
        "a: 1\na: 2\n",
        "--- |\n  literal\n",
        &"[".repeat(10_000),
        &"a:\n ".repeat(2_000),
    ];
    for (i, text) in nasty.iter().enumerate() {
        let files = policy(&[("zz.yaml", text)]);
        if let Err(f) = load_sources(&files) {
            for d in &f.errors {
                let _ = d.to_string();
                assert_eq!(d.severity, Severity::Error);
            }
            let _ = f.to_string();
        }
        // Also alone, without a valid policy around it.
        let _ = load_sources(&[(format!("f{i}.yaml"), text.to_string())]);
    }
}

#[test]
fn load_dir_walks_sorted_skips_hidden_and_non_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("teams/deep")).unwrap();
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::write(root.join("clusters.yml"), CLUSTER).unwrap();
    std::fs::write(root.join("providers.yaml"), PROVIDER).unwrap();
    std::fs::write(root.join("teams/deep/a.yaml"), TEAM).unwrap();
    std::fs::write(root.join(".git/bad.yaml"), "garbage: [").unwrap();
    std::fs::write(root.join(".hidden.yaml"), "garbage: [").unwrap();
    std::fs::write(root.join("README.md"), "not yaml").unwrap();
    let loaded = ok_dir(root);
    assert_eq!(loaded.policy.teams.len(), 1);
    assert_eq!(loaded.policy.clusters.len(), 1);

    std::fs::write(root.join("teams/deep/b.yaml"), team("b", "  weight: 0\n")).unwrap();
    let f = load_dir(root).unwrap_err();
    at(
        find(&f.errors, "weight must be"),
        "teams/deep/b.yaml",
        6,
        11,
        "Team/b",
    );

    let missing = load_dir(&root.join("nope")).unwrap_err();
    assert!(missing.errors[0].message.contains("cannot read directory"));

    let empty = tempfile::tempdir().unwrap();
    // Observed: `axle policy check` of an empty directory said "policy OK".
    let failure = load_dir(empty.path()).unwrap_err();
    find(&failure.errors, "no policy files");
}

fn ok_dir(dir: &std::path::Path) -> Loaded {
    match load_dir(dir) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn unknown_cross_team_preemption_names_the_line() {
    let settings = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  crossTeamPreemption: always\n";
    let f = fail(&policy(&[("settings.yaml", settings)]));
    let d = find(&f.errors, "unknown crossTeamPreemption `always`");
    at(d, "settings.yaml", 6, 24, "crossTeamPreemption");
    assert!(d.hint.as_deref().unwrap().contains("borrowedOnly"), "{d}");
    for good in ["borrowedOnly", "any"] {
        let settings = format!(
            "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  crossTeamPreemption: {good}\n"
        );
        let loaded = ok(&policy(&[("settings.yaml", &settings)]));
        assert_eq!(loaded.policy.settings.cross_team_preemption.as_str(), good);
    }
}

#[test]
fn checkpoint_interval_and_signal_are_checked() {
    let class = |extra: &str| {
        format!(
            "apiVersion: axle.dev/v1\nkind: PriorityClass\nmetadata:\n  name: development\nspec:\n  value: 10\n  preemptibleBy: []\n{extra}"
        )
    };
    for bad in ["-5", "0"] {
        let c = class(&format!(
            "  checkpointable: true\n  checkpointIntervalSeconds: {bad}\n"
        ));
        let f = fail(&policy(&[("classes.yaml", &c)]));
        at(
            find(
                &f.errors,
                "checkpointIntervalSeconds must be at least 1 second",
            ),
            "classes.yaml",
            9,
            30,
            "PriorityClass/development.spec.checkpointIntervalSeconds",
        );
    }
    let c = class("  checkpointable: true\n  checkpointSignal: SIGKILL\n");
    let f = fail(&policy(&[("classes.yaml", &c)]));
    at(
        find(&f.errors, "uncatchable checkpointSignal `SIGKILL`"),
        "classes.yaml",
        9,
        21,
        "checkpointSignal",
    );
    let c = class("  checkpointIntervalSeconds: 600\n");
    let loaded = ok(&policy(&[("classes.yaml", &c)]));
    assert!(
        loaded.warnings.iter().any(|w| w
            .message
            .contains("no effect without `checkpointable: true`")),
        "{:?}",
        loaded.warnings
    );
    let c = class(
        "  checkpointable: true\n  checkpointIntervalSeconds: 600\n  checkpointSignal: SIGUSR1\n",
    );
    let pc = &ok(&policy(&[("classes.yaml", &c)])).policy.priority_classes["development"];
    assert!(pc.checkpointable);
    assert_eq!(pc.checkpoint_interval_s, 600);
    assert_eq!(pc.checkpoint_signal, "SIGUSR1");
}

#[test]
fn placement_and_churn_controls_are_checked() {
    let class = |extra: &str| {
        format!(
            "apiVersion: axle.dev/v1\nkind: PriorityClass\nmetadata:\n  name: development\nspec:\n  value: 100\n  preemptibleBy: []\n{extra}"
        )
    };
    let f = fail(&policy(&[(
        "classes.yaml",
        &class("  placement: scattered\n"),
    )]));
    let d = find(&f.errors, "unknown placement `scattered`");
    at(
        d,
        "classes.yaml",
        8,
        14,
        "PriorityClass/development.spec.placement",
    );
    assert!(d.hint.as_deref().unwrap().contains("wholeNodes"), "{d}");
    let f = fail(&policy(&[(
        "classes.yaml",
        &class("  minRuntimeSeconds: 999999999\n"),
    )]));
    at(
        find(&f.errors, "minRuntimeSeconds (999999999) exceeds 604800"),
        "classes.yaml",
        8,
        22,
        "PriorityClass/development.spec.minRuntimeSeconds",
    );
    let c =
        class("  placement: wholeNodes\n  minRuntimeSeconds: 600\n  tolerableWaitSeconds: 1800\n");
    let pc = &ok(&policy(&[("classes.yaml", &c)])).policy.priority_classes["development"];
    assert_eq!(pc.placement, axle_policy::GangPlacement::WholeNodes);
    assert_eq!((pc.min_runtime_s, pc.tolerable_wait_s), (600, 1800));
    let pc = &ok(&policy(&[("classes.yaml", &class(""))]))
        .policy
        .priority_classes["development"];
    assert_eq!(pc.placement, axle_policy::GangPlacement::Packed);
}

#[test]
fn retention_and_log_limits_are_checked() {
    let settings = |spec: &str| {
        format!("apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n{spec}")
    };
    let f = fail(&policy(&[(
        "settings.yaml",
        &settings("  retainFinishedHours: 0.001\n"),
    )]));
    at(
        find(
            &f.errors,
            "retainFinishedHours (0.001) must be a window of at least a minute",
        ),
        "settings.yaml",
        6,
        24,
        "retainFinishedHours",
    );
    let f = fail(&policy(&[(
        "settings.yaml",
        &settings("  retainEventsDays: 0\n"),
    )]));
    find(
        &f.errors,
        "retainEventsDays (0) must be a window of at least a minute",
    );
    let f = fail(&policy(&[(
        "settings.yaml",
        &settings("  maxLogBytesPerWorkload: 100\n"),
    )]));
    find(
        &f.errors,
        "maxLogBytesPerWorkload (100) is below the smallest useful log",
    );
    let loaded = ok(&policy(&[(
        "settings.yaml",
        &settings(
            "  retainFinishedHours: 0.1\n  retainEventsDays: 2\n  maxLogBytesPerWorkload: 1048576\n",
        ),
    )]));
    let s = &loaded.policy.settings;
    assert_eq!(s.retain_finished_ms, 360_000);
    assert_eq!(s.retain_events_ms, 2 * 86_400_000);
    assert_eq!(s.max_log_bytes_per_workload, 1 << 20);
    let defaults = ok(&policy(&[])).policy.settings;
    assert_eq!(defaults.retain_finished_ms, 168 * 3_600_000);
    assert_eq!(defaults.retain_events_ms, 90 * 86_400_000);
    assert_eq!(defaults.max_log_bytes_per_workload, 64 << 20);
}

#[test]
fn money_is_read_as_the_decimal_written_and_sub_micro_amounts_are_refused() {
    // Observed: money was an f64 everywhere, so a budget check could round.
    let ok = axle_policy::load_sources(&[(
        "p.yaml".to_string(),
        "apiVersion: axle.dev/v1\nkind: Cluster\nmetadata: {name: c1}\nspec:\n  region: eu\n  priceUsdPerGpuHour: 2.75\n".to_string(),
    )])
    .expect("policy");
    assert_eq!(
        ok.policy.clusters["c1"].price_per_gpu_hour,
        axle_policy::Usd::from_cents(275)
    );
    let f = fail(&policy(&[(
        "p.yaml",
        "apiVersion: axle.dev/v1\nkind: Cluster\nmetadata: {name: c9}\nspec:\n  region: eu\n  priceUsdPerGpuHour: 0.0000001\n",
    )]));
    assert!(
        f.errors
            .iter()
            .any(|e| e.message.contains("more than six decimal places")),
        "{f}"
    );
}

#[test]
fn fraction_memory_names_a_known_model_and_a_sane_size() {
    let settings = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  fractionMemoryGb:\n    H100: 80\n";
    let loaded = ok(&policy(&[("settings.yaml", settings)]));
    assert_eq!(loaded.policy.settings.fraction_memory_gb["H100"], 80);
    let bad = "apiVersion: axle.dev/v1\nkind: Settings\nmetadata:\n  name: s\nspec:\n  fractionMemoryGb:\n    H100: 0\n    H999: 80\n";
    let f = fail(&policy(&[("settings.yaml", bad)]));
    find(&f.errors, "fractionMemoryGb.H100 (0) must be 1 to 4096 GB");
    find(&f.errors, "unknown GPU model `H999` in fractionMemoryGb");
}

#[test]
fn user_names_that_hide_characters_are_refused() {
    // Observed at the hub: `d2\u{200B}-victim` looked like `d2-victim`; a
    // member or admin named with U+202E or U+200B would look like another.
    let files = policy(&[(
        "teams/b.yaml",
        &team(
            "b",
            "  quotas:\n    H100: {guaranteed: 1, limit: 2}\n  members:\n    - {user: \"ali\u{200B}ce\", role: member}\n",
        ),
    )]);
    let f = fail(&files);
    let d = find(&f.errors, "not shown as itself");
    assert!(d.message.contains("\\u{200b}"), "{}", d.message);
}
