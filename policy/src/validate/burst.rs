//! Burst validation: BurstProvider documents and each team's `burst`
//! section (budget, providers, regions).

use std::collections::{BTreeMap, BTreeSet};

use super::{check_gpu_class, usd};
use crate::document::{Doc, Docs};
use crate::file::ProviderTypeSpec;
use crate::model::{BurstProvider, ProviderType, TeamBurst};
use crate::money::Usd;
use crate::report::Reporter;

pub(super) fn burst_providers(
    docs: &Docs,
    rep: &mut Reporter<'_>,
    gpu_classes: &BTreeSet<String>,
) -> BTreeMap<String, BurstProvider> {
    let mut out = BTreeMap::new();
    for doc in &docs.burst_providers {
        let s = &doc.spec;
        if s.regions.is_empty() {
            rep.error(
                doc.spec_pos,
                doc.path("regions"),
                "a burst provider needs at least one region".to_string(),
                "list the provider regions this account may launch in",
            );
        }
        for (i, r) in s.regions.iter().enumerate() {
            if r.value.trim().is_empty() {
                rep.error(
                    doc.at(r),
                    doc.path(&format!("regions[{i}]")),
                    "empty region".to_string(),
                    "write a region such as us-east-1",
                );
            } else if let Err((what, example)) = region_shape(s.provider_type, &r.value) {
                rep.warning(
                    doc.at(r),
                    doc.path(&format!("regions[{i}]")),
                    format!(
                        "region `{}` is not {what}: offers are matched to those, so this region never has any",
                        r.value
                    ),
                    &format!("write {what}, such as {example}"),
                );
            }
        }
        for (i, m) in s.gpu_models.iter().enumerate() {
            check_gpu_class(rep, doc, m, &format!("gpuModels[{i}]"), gpu_classes, false);
        }
        if s.max_instances.value == 0 {
            rep.warning(
                doc.at(&s.max_instances),
                doc.path("maxInstances"),
                "maxInstances is 0: this provider never launches anything".to_string(),
                "raise maxInstances or remove the provider",
            );
        }
        out.insert(
            doc.name.clone(),
            BurstProvider {
                name: doc.name.clone(),
                provider_type: match s.provider_type {
                    ProviderTypeSpec::Aws => ProviderType::Aws,
                    ProviderTypeSpec::Runpod => ProviderType::Runpod,
                    ProviderTypeSpec::Lambda => ProviderType::Lambda,
                },
                regions: s.regions.iter().map(|r| r.value.clone()).collect(),
                instance_types: s.instance_types.clone(),
                gpu_models: s.gpu_models.iter().map(|m| m.value.clone()).collect(),
                max_instances: s.max_instances.value,
                prices: s
                    .prices
                    .iter()
                    .map(|(ty, p)| {
                        let path = format!("prices.{ty}");
                        (
                            ty.clone(),
                            crate::model::Price {
                                on_demand: usd(rep, doc, &p.on_demand, &format!("{path}.onDemand")),
                                spot: p
                                    .spot
                                    .as_ref()
                                    .map(|v| usd(rep, doc, v, &format!("{path}.spot"))),
                            },
                        )
                    })
                    .collect(),
                allow_spot: s.allow_spot.unwrap_or(false),
                images: s.images.clone(),
                join_timeout_s: s
                    .join_timeout_seconds
                    .as_ref()
                    .map_or(crate::model::DEFAULT_BURST_JOIN_TIMEOUT_S, |v| v.value),
                idle_timeout_s: s
                    .idle_timeout_seconds
                    .as_ref()
                    .map_or(crate::model::DEFAULT_BURST_IDLE_TIMEOUT_S, |v| v.value),
            },
        );
    }
    out
}

pub(super) fn team_burst(
    rep: &mut Reporter<'_>,
    doc: &Doc<crate::file::TeamSpec>,
    b: &crate::file::TeamBurstSpec,
    providers: &BTreeMap<String, BurstProvider>,
) -> TeamBurst {
    let budget = b
        .budget_usd_per_month
        .as_ref()
        .map_or(Usd::ZERO, |v| usd(rep, doc, v, "burst.budgetUsdPerMonth"));
    let mut allowed = Vec::new();
    for (i, p) in b.providers.iter().enumerate() {
        match providers.get(&p.value) {
            Some(provider) => allowed.push(provider),
            None => {
                let known: Vec<&str> = providers.keys().map(String::as_str).collect();
                let hint = if known.is_empty() {
                    "no BurstProvider documents are defined".to_string()
                } else {
                    format!("defined burst providers: {}", known.join(", "))
                };
                rep.error(
                    doc.at(p),
                    doc.path(&format!("burst.providers[{i}]")),
                    format!("unknown burst provider `{}`", p.value),
                    &hint,
                );
            }
        }
    }
    if let Some(v) = &b.budget_usd_per_month
        && !budget.is_zero()
        && b.providers.is_empty()
    {
        rep.warning(
            doc.at(v),
            doc.path("burst.budgetUsdPerMonth"),
            "burst budget set but no providers listed: the team can never burst".to_string(),
            "list providers under burst.providers",
        );
    }
    // Only judge regions against the providers that resolved; a dangling
    // provider is already an error.
    if allowed.len() == b.providers.len() {
        for (i, r) in b.regions.iter().enumerate() {
            if !allowed.iter().any(|p| {
                p.regions
                    .iter()
                    .any(|served| crate::model::region_matches(&r.value, served))
            }) {
                let served: Vec<String> = allowed
                    .iter()
                    .map(|p| format!("{}: {}", p.name, p.regions.join(", ")))
                    .collect();
                let hint = if served.is_empty() {
                    "list providers under burst.providers".to_string()
                } else {
                    format!("the team's providers serve {}", served.join("; "))
                };
                rep.warning(
                    doc.at(r),
                    doc.path(&format!("burst.regions[{i}]")),
                    format!(
                        "region `{}` is not served by any of the team's burst providers",
                        r.value
                    ),
                    &hint,
                );
            }
        }
    }
    TeamBurst {
        monthly_budget: budget,
        providers: b.providers.iter().map(|p| p.value.clone()).collect(),
        regions: b.regions.iter().map(|r| r.value.clone()).collect(),
    }
}

/// Whether `region` has the shape of the regions `provider` names in its
/// catalog; else what those look like and an example. The catalogs' region
/// names are matched exactly, so a provider region such as `US` for RunPod
/// (whose data centers are `US-KS-2`, `EU-RO-1`, …) silently offers nothing.
fn region_shape(
    provider: ProviderTypeSpec,
    region: &str,
) -> Result<(), (&'static str, &'static str)> {
    let (upper, what, example) = match provider {
        ProviderTypeSpec::Runpod => (true, "a RunPod data-center id", "US-KS-2 or EU-RO-1"),
        ProviderTypeSpec::Aws => (false, "an AWS region name", "us-east-1 or eu-west-1"),
        ProviderTypeSpec::Lambda => (
            false,
            "a Lambda region name",
            "us-east-1 or europe-central-1",
        ),
    };
    let letter = |b: u8| {
        if upper {
            b.is_ascii_uppercase()
        } else {
            b.is_ascii_lowercase()
        }
    };
    // Words of that case, the last one a number: `us-east-1`, `US-KS-2`.
    let parts: Vec<&str> = region.split('-').collect();
    let shaped = parts.len() >= 3
        && parts
            .last()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| letter(b) || b.is_ascii_digit()));
    if shaped { Ok(()) } else { Err((what, example)) }
}
