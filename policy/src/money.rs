//! Money, exact: US dollars as integer micro-dollars.
//!
//! Budgets, prices, estimates, reservations and settlements are all [`Usd`]:
//! adding, comparing and multiplying by time never rounds by accident, so a
//! budget check is exact to the micro-dollar. A policy file writes amounts as
//! decimal numbers (`5000`, `2.75`); each is read as the decimal it was
//! written as, with at most six decimal places.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Micro-dollars in a dollar.
pub const MICROS_PER_USD: u64 = 1_000_000;

/// The largest amount a policy may write: a billion dollars, far above any
/// budget, and small enough that an hourly price times a year of seconds
/// cannot overflow.
pub const MAX_POLICY_USD: u64 = 1_000_000_000;

/// An amount of US dollars, in micro-dollars.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Usd(u64);

/// Why an amount is not money.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("{0} is not an amount of dollars (write e.g. 5000 or 2.75)")]
    NotANumber(String),
    #[error("{0} is negative; amounts of money are 0 or more")]
    Negative(String),
    #[error("{0} has more than six decimal places (a micro-dollar is the smallest amount)")]
    TooPrecise(String),
    #[error("{0} is more than ${MAX_POLICY_USD}")]
    TooLarge(String),
}

impl Usd {
    pub const ZERO: Usd = Usd(0);

    pub const fn from_micros(micros: u64) -> Usd {
        Usd(micros)
    }

    pub const fn from_cents(cents: u64) -> Usd {
        Usd(cents * 10_000)
    }

    pub const fn from_dollars(dollars: u64) -> Usd {
        Usd(dollars * MICROS_PER_USD)
    }

    pub const fn micros(self) -> u64 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// A decimal amount as written: `5000`, `2.75`, `0.000001`.
    pub fn parse(text: &str) -> Result<Usd, MoneyError> {
        let t = text.trim().trim_start_matches('$').replace([',', '_'], "");
        if t.starts_with('-') {
            return Err(MoneyError::Negative(text.to_string()));
        }
        let (whole, frac) = t.split_once('.').unwrap_or((&t, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
            return Err(MoneyError::NotANumber(text.to_string()));
        }
        let frac = frac.trim_end_matches('0');
        if frac.len() > 6 {
            return Err(MoneyError::TooPrecise(text.to_string()));
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole
                .parse()
                .map_err(|_| MoneyError::TooLarge(text.to_string()))?
        };
        if whole > MAX_POLICY_USD {
            return Err(MoneyError::TooLarge(text.to_string()));
        }
        let frac_micros: u64 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<6}")
                .parse()
                .map_err(|_| MoneyError::NotANumber(text.to_string()))?
        };
        let micros = whole * MICROS_PER_USD + frac_micros;
        if micros > MAX_POLICY_USD * MICROS_PER_USD {
            return Err(MoneyError::TooLarge(text.to_string()));
        }
        Ok(Usd(micros))
    }

    /// The amount a YAML number stands for. A number is read as the shortest
    /// decimal that gives it back (`2.75` is 2.75, never 2.7499999…), so a
    /// policy's `2.75` is exactly $2.75.
    pub fn from_number(v: f64) -> Result<Usd, MoneyError> {
        if !v.is_finite() {
            return Err(MoneyError::NotANumber(v.to_string()));
        }
        if v < 0.0 {
            return Err(MoneyError::Negative(v.to_string()));
        }
        Usd::parse(&format!("{v}"))
    }

    pub fn checked_add(self, other: Usd) -> Option<Usd> {
        self.0.checked_add(other.0).map(Usd)
    }

    pub fn saturating_add(self, other: Usd) -> Usd {
        Usd(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Usd) -> Usd {
        Usd(self.0.saturating_sub(other.0))
    }

    /// What `seconds` cost at this price per hour, rounded up to the
    /// micro-dollar: a reservation or a charge is never short.
    pub fn per_hour_for_seconds(self, seconds: u64) -> Usd {
        let micros = (u128::from(self.0) * u128::from(seconds)).div_ceil(3600);
        Usd(u64::try_from(micros).unwrap_or(u64::MAX))
    }

    /// This amount times `n` (a count of GPUs or instances), saturating.
    pub fn times(self, n: u64) -> Usd {
        Usd(self.0.saturating_mul(n))
    }

    /// This amount as a fraction of `of` in per cent, rounded down (0 when
    /// `of` is zero).
    pub fn percent_of(self, of: Usd) -> u64 {
        if of.0 == 0 {
            return 0;
        }
        u64::try_from(u128::from(self.0) * 100 / u128::from(of.0)).unwrap_or(u64::MAX)
    }

    /// Dollars for display only (tables, reports); never for a decision.
    pub fn as_f64_for_display(self) -> f64 {
        self.0 as f64 / MICROS_PER_USD as f64
    }
}

/// `$4,980.00`; sub-cent amounts show their micro-dollars (`$0.000125`).
impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / MICROS_PER_USD;
        let frac = self.0 % MICROS_PER_USD;
        let digits = whole.to_string();
        let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if frac.is_multiple_of(10_000) {
            write!(f, "${grouped}.{:02}", frac / 10_000)
        } else {
            let mut s = format!("{frac:06}");
            while s.ends_with('0') {
                s.pop();
            }
            write!(f, "${grouped}.{s}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_read_exactly() {
        assert_eq!(Usd::parse("5000"), Ok(Usd::from_dollars(5000)));
        assert_eq!(Usd::parse("2.75"), Ok(Usd::from_cents(275)));
        assert_eq!(Usd::parse("$1,234.5"), Ok(Usd::from_micros(1_234_500_000)));
        assert_eq!(Usd::parse("0.000001"), Ok(Usd::from_micros(1)));
        assert_eq!(Usd::parse(".5"), Ok(Usd::from_cents(50)));
        assert_eq!(Usd::from_number(0.1), Ok(Usd::from_micros(100_000)));
        assert_eq!(Usd::from_number(32.77), Ok(Usd::from_micros(32_770_000)));
        for bad in [
            "",
            ".",
            "abc",
            "1.2.3",
            "1e3",
            "0.0000001",
            "-1",
            "2000000000",
        ] {
            assert!(Usd::parse(bad).is_err(), "{bad}");
        }
        assert!(Usd::from_number(f64::NAN).is_err());
        assert!(Usd::from_number(-0.5).is_err());
    }

    #[test]
    fn time_costs_round_up_and_display_reads_well() {
        // $2.75/h for one second: 763.88… micro-dollars, charged as 764.
        assert_eq!(
            Usd::from_cents(275).per_hour_for_seconds(1),
            Usd::from_micros(764)
        );
        assert_eq!(
            Usd::from_cents(275).per_hour_for_seconds(3600),
            Usd::from_cents(275)
        );
        assert_eq!(Usd::from_dollars(4980).to_string(), "$4,980.00");
        assert_eq!(Usd::from_micros(125).to_string(), "$0.000125");
        assert_eq!(Usd::from_cents(3705).to_string(), "$37.05");
        assert_eq!(
            Usd::from_dollars(4000).percent_of(Usd::from_dollars(5000)),
            80
        );
        assert_eq!(Usd::from_dollars(1).percent_of(Usd::ZERO), 0);
    }
}
