//! The burst budget ledger: money reserved before a launch and settled at
//! termination, per team and calendar month (UTC), all in exact [`Usd`].
//!
//! Before an instance is launched its estimated cost (run time × price) is
//! reserved; the reservation fits the team's monthly budget and the optional
//! global cap, or nothing is launched and the refusal says by how much it
//! missed. When the instance is gone its actual cost (per second, rounded up
//! to the micro-dollar) replaces the reservation and the rest is released. A
//! reservation counts against the month it was made in.

use std::collections::BTreeMap;
use std::fmt;

use axle_policy::Usd;
use serde::{Deserialize, Serialize};

/// A calendar month in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Month {
    pub year: i32,
    pub month: u8,
}

impl Month {
    /// The month `ms` (since 1970, UTC) falls in.
    pub fn of_ms(ms: u64) -> Month {
        // Past jiff's range (year 9999), the last month it knows.
        let t = i64::try_from(ms)
            .ok()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .unwrap_or(jiff::Timestamp::MAX);
        let d = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        Month {
            year: i32::from(d.year()),
            month: d.month() as u8,
        }
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

/// Money held for one burst instance, and what it cost in the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The burst instance's id.
    pub id: String,
    pub team: String,
    pub provider: String,
    pub month: Month,
    /// The estimate held while the instance lives.
    pub reserved: Usd,
    /// The actual cost, once settled; then `reserved` no longer counts.
    pub settled: Option<Usd>,
}

impl Reservation {
    /// What it counts against its budget now.
    pub fn counts(&self) -> Usd {
        self.settled.unwrap_or(self.reserved)
    }
}

/// Why a reservation does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("team {team} burst budget: {used} of {budget} used in {month}; this needs ≈ {needs}")]
    Team {
        team: String,
        month: Month,
        used: Usd,
        budget: Usd,
        needs: Usd,
    },
    #[error("the global burst budget: {used} of {cap} used in {month}; this needs ≈ {needs}")]
    Global {
        month: Month,
        used: Usd,
        cap: Usd,
        needs: Usd,
    },
    #[error("burst {0} already holds a reservation")]
    Duplicate(String),
}

/// A budget threshold a reservation or settlement crossed, for an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossed {
    pub team: String,
    pub month: Month,
    /// 80 or 100 (per cent of the team's monthly budget).
    pub percent: u64,
    pub used: Usd,
    pub budget: Usd,
}

/// Thresholds that emit events, in per cent of a monthly budget.
pub const THRESHOLDS: [u64; 2] = [80, 100];

/// Every reservation, by burst id (settled ones included, for the month's spend).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    reservations: BTreeMap<String, Reservation>,
}

impl Ledger {
    pub fn from_reservations(rs: impl IntoIterator<Item = Reservation>) -> Ledger {
        Ledger {
            reservations: rs.into_iter().map(|r| (r.id.clone(), r)).collect(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&Reservation> {
        self.reservations.get(id)
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values()
    }

    /// What `team` has used (reserved or settled) in `month`.
    pub fn used(&self, team: &str, month: Month) -> Usd {
        self.reservations
            .values()
            .filter(|r| r.team == team && r.month == month)
            .fold(Usd::ZERO, |a, r| a.saturating_add(r.counts()))
    }

    /// What every team together has used in `month`.
    pub fn used_by_all(&self, month: Month) -> Usd {
        self.reservations
            .values()
            .filter(|r| r.month == month)
            .fold(Usd::ZERO, |a, r| a.saturating_add(r.counts()))
    }

    /// Settled spend of `team` in `month` per provider.
    pub fn spend_by_provider(&self, team: &str, month: Month) -> BTreeMap<String, Usd> {
        let mut out: BTreeMap<String, Usd> = BTreeMap::new();
        for r in self
            .reservations
            .values()
            .filter(|r| r.team == team && r.month == month)
        {
            let e = out.entry(r.provider.clone()).or_default();
            *e = e.saturating_add(r.counts());
        }
        out
    }

    /// What `team` may still reserve in `month` under `budget` and `global`.
    pub fn headroom(&self, team: &str, month: Month, budget: Usd, global: Option<Usd>) -> Usd {
        let own = budget.saturating_sub(self.used(team, month));
        match global {
            Some(cap) => own.min(cap.saturating_sub(self.used_by_all(month))),
            None => own,
        }
    }

    /// Holds `amount` for burst `id` of `team` on `provider`, if it fits both
    /// budgets; returns the thresholds it crossed.
    #[allow(clippy::too_many_arguments)]
    pub fn reserve(
        &mut self,
        id: &str,
        team: &str,
        provider: &str,
        month: Month,
        amount: Usd,
        budget: Usd,
        global: Option<Usd>,
    ) -> Result<Vec<Crossed>, Refusal> {
        if self.reservations.contains_key(id) {
            return Err(Refusal::Duplicate(id.to_string()));
        }
        let used = self.used(team, month);
        if used.checked_add(amount).is_none_or(|after| after > budget) {
            return Err(Refusal::Team {
                team: team.to_string(),
                month,
                used,
                budget,
                needs: amount,
            });
        }
        if let Some(cap) = global {
            let all = self.used_by_all(month);
            if all.checked_add(amount).is_none_or(|after| after > cap) {
                return Err(Refusal::Global {
                    month,
                    used: all,
                    cap,
                    needs: amount,
                });
            }
        }
        self.reservations.insert(
            id.to_string(),
            Reservation {
                id: id.to_string(),
                team: team.to_string(),
                provider: provider.to_string(),
                month,
                reserved: amount,
                settled: None,
            },
        );
        Ok(crossed(
            team,
            month,
            used,
            used.saturating_add(amount),
            budget,
        ))
    }

    /// Settles burst `id` at its actual cost; the rest of its reservation is
    /// released. Returns the reservation as settled and the thresholds crossed.
    pub fn settle(
        &mut self,
        id: &str,
        actual: Usd,
        budget: Usd,
    ) -> Option<(Reservation, Vec<Crossed>)> {
        let r = self.reservations.get(id)?;
        if r.settled.is_some() {
            return Some((r.clone(), Vec::new()));
        }
        let (team, month) = (r.team.clone(), r.month);
        let before = self.used(&team, month);
        let r = self.reservations.get_mut(id)?;
        r.settled = Some(actual);
        let r = r.clone();
        let after = self.used(&team, month);
        Some((r, crossed(&team, month, before, after, budget)))
    }

    /// Holds `more` for burst `id` on top of what it holds, if it fits both
    /// budgets (a run outlasting its reservation); returns the thresholds crossed.
    pub fn extend(
        &mut self,
        id: &str,
        more: Usd,
        budget: Usd,
        global: Option<Usd>,
    ) -> Result<Vec<Crossed>, Refusal> {
        let Some(r) = self.reservations.get(id).cloned() else {
            return Err(Refusal::Duplicate(id.to_string()));
        };
        let probe = format!("{id}+");
        self.reservations.remove(id);
        let res = self.reserve(
            &probe,
            &r.team,
            &r.provider,
            r.month,
            r.reserved.saturating_add(more),
            budget,
            global,
        );
        self.reservations.remove(&probe);
        let mut r = r;
        if res.is_ok() {
            r.reserved = r.reserved.saturating_add(more);
        }
        self.reservations.insert(id.to_string(), r);
        res
    }

    /// Drops reservations of months before `month` (their spend is history).
    pub fn forget_before(&mut self, month: Month) -> Vec<String> {
        let old: Vec<String> = self
            .reservations
            .values()
            .filter(|r| r.month < month && r.settled.is_some())
            .map(|r| r.id.clone())
            .collect();
        for id in &old {
            self.reservations.remove(id);
        }
        old
    }
}

fn crossed(team: &str, month: Month, before: Usd, after: Usd, budget: Usd) -> Vec<Crossed> {
    if budget.is_zero() {
        return Vec::new();
    }
    THRESHOLDS
        .iter()
        .filter(|&&p| before.percent_of(budget) < p && after.percent_of(budget) >= p)
        .map(|&percent| Crossed {
            team: team.to_string(),
            month,
            percent,
            used: after,
            budget,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEC: Month = Month {
        year: 2026,
        month: 12,
    };

    #[test]
    fn months_come_from_utc_milliseconds() {
        assert_eq!(
            Month::of_ms(0),
            Month {
                year: 1970,
                month: 1
            }
        );
        // 2026-12-04T21:00:00Z and the last millisecond of 2026-12-31.
        assert_eq!(Month::of_ms(1_796_418_000_000), DEC);
        assert_eq!(Month::of_ms(1_798_761_599_999), DEC);
        assert_eq!(
            Month::of_ms(1_798_761_600_000),
            Month {
                year: 2027,
                month: 1
            }
        );
        assert_eq!(Month::of_ms(951_782_400_000).to_string(), "2000-02"); // 2000-02-29
        assert_eq!(DEC.to_string(), "2026-12");
    }

    #[test]
    fn reservations_fit_the_budget_to_the_micro_dollar() {
        let budget = Usd::from_dollars(5000);
        let mut l = Ledger::default();
        l.reserve(
            "b1",
            "vision",
            "aws",
            DEC,
            Usd::from_dollars(4980),
            budget,
            None,
        )
        .unwrap();
        let refused = l
            .reserve(
                "b2",
                "vision",
                "aws",
                DEC,
                Usd::from_dollars(37),
                budget,
                None,
            )
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "team vision burst budget: $4,980.00 of $5,000.00 used in 2026-12; this needs ≈ $37.00"
        );
        // Exactly the rest fits; one micro-dollar more does not.
        let rest = Usd::from_dollars(20);
        assert!(
            l.reserve(
                "b3",
                "vision",
                "aws",
                DEC,
                rest.saturating_add(Usd::from_micros(1)),
                budget,
                None
            )
            .is_err()
        );
        l.reserve("b3", "vision", "aws", DEC, rest, budget, None)
            .unwrap();
        assert_eq!(l.headroom("vision", DEC, budget, None), Usd::ZERO);
        // Another team, another budget; a duplicate id is refused.
        assert!(
            l.reserve("b4", "nlp", "aws", DEC, rest, budget, None)
                .is_ok()
        );
        assert!(matches!(
            l.reserve("b4", "nlp", "aws", DEC, rest, budget, None),
            Err(Refusal::Duplicate(_))
        ));
    }

    #[test]
    fn settling_releases_the_rest_and_thresholds_are_crossed_once() {
        let budget = Usd::from_dollars(100);
        let mut l = Ledger::default();
        let c = l
            .reserve(
                "b1",
                "t",
                "runpod",
                DEC,
                Usd::from_dollars(85),
                budget,
                None,
            )
            .unwrap();
        assert_eq!(c.iter().map(|c| c.percent).collect::<Vec<_>>(), [80]);
        let (r, c) = l.settle("b1", Usd::from_cents(1_234), budget).unwrap();
        assert_eq!(r.settled, Some(Usd::from_cents(1_234)));
        assert!(c.is_empty());
        assert_eq!(l.used("t", DEC), Usd::from_cents(1_234));
        assert_eq!(l.headroom("t", DEC, budget, None), Usd::from_cents(8_766));
        // Settling twice changes nothing.
        l.settle("b1", Usd::from_dollars(99), budget).unwrap();
        assert_eq!(l.used("t", DEC), Usd::from_cents(1_234));
        let c = l
            .reserve(
                "b2",
                "t",
                "runpod",
                DEC,
                Usd::from_cents(8_766),
                budget,
                None,
            )
            .unwrap();
        assert_eq!(c.iter().map(|c| c.percent).collect::<Vec<_>>(), [80, 100]);
        assert_eq!(
            l.spend_by_provider("t", DEC).get("runpod"),
            Some(&Usd::from_dollars(100))
        );
    }

    #[test]
    fn the_global_cap_binds_every_team_and_months_are_separate() {
        let budget = Usd::from_dollars(100);
        let cap = Some(Usd::from_dollars(150));
        let mut l = Ledger::default();
        l.reserve("a1", "a", "aws", DEC, Usd::from_dollars(100), budget, cap)
            .unwrap();
        let e = l
            .reserve("b1", "b", "aws", DEC, Usd::from_dollars(60), budget, cap)
            .unwrap_err();
        assert!(matches!(e, Refusal::Global { .. }), "{e}");
        assert_eq!(l.headroom("b", DEC, budget, cap), Usd::from_dollars(50));
        let jan = Month {
            year: 2027,
            month: 1,
        };
        assert_eq!(l.headroom("a", jan, budget, cap), budget);
        l.settle("a1", Usd::from_dollars(3), budget).unwrap();
        assert_eq!(l.forget_before(jan), vec!["a1".to_string()]);
        assert_eq!(l.used("a", DEC), Usd::ZERO);
    }
}
