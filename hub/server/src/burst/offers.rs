//! Choosing where a burst goes: among the team's providers, the offers that
//! meet the workload's GPU model, count and memory and its data residency
//! (the team's burst regions ∩ the workload's regions), cheapest first; ties
//! go to the provider the team lists first.

use axle_burst::Offer;
use axle_policy::Usd;

/// What one burst instance must give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// `None`: any model.
    pub gpu_model: Option<String>,
    /// GPUs on the one instance.
    pub gpus: u32,
    /// Memory per GPU, at least (0: any).
    pub gpu_memory_mb: u64,
    /// The workload's allowed regions (patterns like `eu-*`; empty: any).
    pub regions: Vec<String>,
    /// May run on spot (interruptible) capacity.
    pub spot_ok: bool,
}

/// One provider the team may use, in the team's order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The BurstProvider document's name.
    pub name: String,
    /// Its regions (the account's); empty: any the catalog lists.
    pub regions: Vec<String>,
    /// GPU models the policy allows on it (empty: any).
    pub gpu_models: Vec<String>,
    /// Instance types the policy allows on it (empty: any).
    pub instance_types: Vec<String>,
}

/// An offer worth trying, with where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub provider: String,
    pub offer: Offer,
}

impl Candidate {
    /// What running it for `seconds` is estimated to cost.
    pub fn estimate(&self, seconds: u64) -> Usd {
        self.offer.price_per_hour.per_hour_for_seconds(seconds)
    }
}

pub use axle_policy::region_matches;

fn any_match(patterns: &[String], region: &str) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| region_matches(p, region))
}

/// The offers (`(provider name, offer)`, from the providers' catalogs) that
/// meet `need` under the team's `allowed` providers and `team_regions`,
/// cheapest first, ties in the team's provider order, then by instance type.
pub fn rank(
    offers: &[(String, Offer)],
    need: &Need,
    allowed: &[Allowed],
    team_regions: &[String],
) -> Vec<Candidate> {
    let mut out: Vec<(Usd, usize, Candidate)> = offers
        .iter()
        .filter_map(|(provider, o)| {
            let pref = allowed.iter().position(|a| &a.name == provider)?;
            let a = &allowed[pref];
            let fits = o.available
                && o.gpus >= need.gpus
                && need.gpu_model.as_ref().is_none_or(|m| &o.gpu_model == m)
                && (need.gpu_memory_mb == 0 || o.gpu_memory_mb >= need.gpu_memory_mb)
                && (need.spot_ok || !o.spot)
                && (a.gpu_models.is_empty() || a.gpu_models.contains(&o.gpu_model))
                && (a.instance_types.is_empty() || a.instance_types.contains(&o.instance_type))
                && any_match(&a.regions, &o.region)
                && any_match(team_regions, &o.region)
                && any_match(&need.regions, &o.region);
            fits.then(|| {
                (
                    o.price_per_hour,
                    pref,
                    Candidate {
                        provider: provider.clone(),
                        offer: o.clone(),
                    },
                )
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (a.0, a.1, &a.2.offer.instance_type, &a.2.offer.region).cmp(&(
            b.0,
            b.1,
            &b.2.offer.instance_type,
            &b.2.offer.region,
        ))
    });
    out.into_iter().map(|(_, _, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(
        kind: &'static str,
        ty: &str,
        model: &str,
        gpus: u32,
        region: &str,
        cents: u64,
    ) -> Offer {
        Offer {
            provider: kind,
            instance_type: ty.into(),
            gpu_model: model.into(),
            gpus,
            gpu_memory_mb: 81_920,
            region: region.into(),
            price_per_hour: Usd::from_cents(cents),
            spot: false,
            available: true,
        }
    }

    fn allowed(name: &str) -> Allowed {
        Allowed {
            name: name.into(),
            regions: Vec::new(),
            gpu_models: Vec::new(),
            instance_types: Vec::new(),
        }
    }

    fn need(model: &str, gpus: u32) -> Need {
        Need {
            gpu_model: Some(model.into()),
            gpus,
            gpu_memory_mb: 0,
            regions: Vec::new(),
            spot_ok: false,
        }
    }

    fn catalog() -> Vec<(String, Offer)> {
        vec![
            (
                "aws".into(),
                offer("aws", "p5.48xlarge", "H100", 8, "us-east-1", 9_832),
            ),
            (
                "lambda".into(),
                offer("lambda", "gpu_8x_h100", "H100", 8, "us-east-1", 2_392),
            ),
            (
                "runpod".into(),
                offer("runpod", "H100x8", "H100", 8, "EU-RO-1", 2_392),
            ),
            (
                "runpod".into(),
                offer("runpod", "H100x1", "H100", 1, "EU-RO-1", 299),
            ),
            (
                "lambda".into(),
                offer("lambda", "gpu_1x_a100", "A100", 1, "us-west-1", 129),
            ),
        ]
    }

    #[test]
    fn the_cheapest_offer_that_fits_comes_first_and_ties_follow_the_team_order() {
        let team = [allowed("runpod"), allowed("lambda"), allowed("aws")];
        let r = rank(&catalog(), &need("H100", 8), &team, &[]);
        let got: Vec<(&str, &str)> = r
            .iter()
            .map(|c| (c.provider.as_str(), c.offer.instance_type.as_str()))
            .collect();
        // Lambda and RunPod cost the same: the team lists RunPod first.
        assert_eq!(
            got,
            [
                ("runpod", "H100x8"),
                ("lambda", "gpu_8x_h100"),
                ("aws", "p5.48xlarge")
            ]
        );
        // One GPU: the smallest that fits is cheapest.
        let one = rank(&catalog(), &need("H100", 1), &team, &[]);
        assert_eq!(one[0].offer.instance_type, "H100x1");
        // A provider the team may not use is never offered.
        let only_aws = rank(&catalog(), &need("H100", 8), &[allowed("aws")], &[]);
        assert_eq!(only_aws.len(), 1);
        assert_eq!(
            only_aws[0].estimate(1800),
            Usd::from_cents(4_916),
            "half an hour of $98.32/h"
        );
    }

    #[test]
    fn a_team_limited_to_eu_never_gets_a_us_instance() {
        let team = [allowed("runpod"), allowed("lambda"), allowed("aws")];
        let eu = ["EU-*".to_string()];
        let r = rank(&catalog(), &need("H100", 8), &team, &eu);
        assert!(!r.is_empty());
        assert!(r.iter().all(|c| c.offer.region.starts_with("EU-")), "{r:?}");
        // The workload's own regions narrow it further: nothing is left.
        let mut n = need("H100", 8);
        n.regions = vec!["us-east-1".into()];
        assert!(rank(&catalog(), &n, &team, &eu).is_empty());
    }

    #[test]
    fn model_memory_spot_and_the_policys_lists_are_respected() {
        let mut cat = catalog();
        cat[1].1.spot = true;
        cat[2].1.available = false;
        let team = [allowed("runpod"), allowed("lambda"), allowed("aws")];
        let r = rank(&cat, &need("H100", 8), &team, &[]);
        assert_eq!(r.len(), 1, "no spot unless allowed, nothing unavailable");
        let mut spot = need("H100", 8);
        spot.spot_ok = true;
        assert_eq!(rank(&cat, &spot, &team, &[])[0].provider, "lambda");
        let mut big = need("H100", 1);
        big.gpu_memory_mb = 100_000;
        assert!(rank(&cat, &big, &team, &[]).is_empty());
        let mut limited = allowed("aws");
        limited.instance_types = vec!["p4d.24xlarge".into()];
        assert!(rank(&cat, &need("H100", 8), &[limited], &[]).is_empty());
        assert!(region_matches("eu-*", "eu-west-1") && !region_matches("eu-*", "us-east-1"));
    }
}
