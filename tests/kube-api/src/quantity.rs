//! Resource quantities ("2", "500m", "1Gi", "1e3") as exact milli-units, for
//! quota sums and comparisons.

/// Parses a Kubernetes quantity into thousandths of a unit, rounding up
/// like the API server does below milli precision. None if malformed or out
/// of range.
pub(crate) fn parse_millis(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !(int_part
            .chars()
            .chain(frac_part.chars())
            .all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().ok()?;
    // value = mantissa * 10^-frac_len * multiplier; keep it as a fraction
    // num/den to stay exact, then scale to millis.
    let (mut num, mut den) = (
        mantissa,
        10i128.checked_pow(u32::try_from(frac_part.len()).ok()?)?,
    );
    let binary = |p: u32| 1024i128.checked_pow(p);
    let decimal = |p: u32| 10i128.checked_pow(p);
    match suffix {
        "" => {}
        "m" => den = den.checked_mul(1000)?,
        "k" => num = num.checked_mul(decimal(3)?)?,
        "M" => num = num.checked_mul(decimal(6)?)?,
        "G" => num = num.checked_mul(decimal(9)?)?,
        "T" => num = num.checked_mul(decimal(12)?)?,
        "P" => num = num.checked_mul(decimal(15)?)?,
        "E" => num = num.checked_mul(decimal(18)?)?,
        "Ki" => num = num.checked_mul(binary(1)?)?,
        "Mi" => num = num.checked_mul(binary(2)?)?,
        "Gi" => num = num.checked_mul(binary(3)?)?,
        "Ti" => num = num.checked_mul(binary(4)?)?,
        "Pi" => num = num.checked_mul(binary(5)?)?,
        "Ei" => num = num.checked_mul(binary(6)?)?,
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            if e >= 0 {
                num = num.checked_mul(decimal(u32::try_from(e).ok()?)?)?;
            } else {
                den = den.checked_mul(decimal(e.unsigned_abs())?)?;
            }
        }
        _ => return None,
    }
    let scaled = num.checked_mul(1000)?;
    let millis = scaled.checked_add(den - 1)? / den; // round up
    Some(if negative { -millis } else { millis })
}

/// Formats milli-units back: whole units as an integer, else with `m`.
pub(crate) fn format_millis(millis: i128) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_common_forms() {
        assert_eq!(parse_millis("2"), Some(2000));
        assert_eq!(parse_millis("500m"), Some(500));
        assert_eq!(parse_millis("1.5"), Some(1500));
        assert_eq!(parse_millis("1Ki"), Some(1024 * 1000));
        assert_eq!(parse_millis("1Gi"), Some(1024 * 1024 * 1024 * 1000));
        assert_eq!(parse_millis("1k"), Some(1_000_000));
        assert_eq!(parse_millis("1e3"), Some(1_000_000));
        assert_eq!(parse_millis("0.0001"), Some(1)); // rounds up
        assert_eq!(parse_millis("abc"), None);
        assert_eq!(parse_millis("1Zi"), None);
        assert_eq!(parse_millis(""), None);
        assert_eq!(format_millis(3000), "3");
        assert_eq!(format_millis(1500), "1500m");
    }
}
