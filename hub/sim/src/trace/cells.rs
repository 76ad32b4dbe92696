//! Cell parsers: each turns one trimmed cell into a value, or returns a message
//! that the caller prefixes with the file, line and column.

use axle_policy::{MILLI_PER_GPU, Milli};

pub(super) fn parse_nonempty(cell: &str) -> Result<String, String> {
    if cell.is_empty() {
        Err("must not be empty".to_string())
    } else {
        Ok(cell.to_string())
    }
}

pub(super) fn parse_u64(cell: &str) -> Result<u64, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    cell.parse()
        .map_err(|_| format!("`{cell}` is not a non-negative whole number"))
}

/// Whole GPUs, at least 1, small enough to count in milli-GPUs.
pub(super) fn parse_whole_gpus(cell: &str) -> Result<u64, String> {
    let gpus = parse_u64(cell)?;
    if gpus == 0 {
        return Err("must be at least 1".to_string());
    }
    check_whole_gpus(gpus)
}

pub(super) fn check_whole_gpus(gpus: u64) -> Result<u64, String> {
    if gpus > u64::MAX / MILLI_PER_GPU {
        Err(format!("`{gpus}` GPUs is too large"))
    } else {
        Ok(gpus)
    }
}

/// The largest number of seconds accepted (about 31.7 million years); keeps
/// float conversions exact enough and sums far from overflow.
const MAX_SECONDS: f64 = 1e15;

/// A non-negative number of seconds (whole or decimal) as an `f64`.
fn parse_seconds(cell: &str) -> Result<f64, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    let value: f64 = cell
        .parse()
        .map_err(|_| format!("`{cell}` is not a number"))?;
    if !value.is_finite() {
        Err(format!("`{cell}` is not a finite number"))
    } else if value < 0.0 {
        Err(format!("`{cell}` is negative"))
    } else if value > MAX_SECONDS {
        Err(format!("`{cell}` is too large"))
    } else {
        Ok(value)
    }
}

/// Seconds rounded up, at least 1 (a run time).
pub(super) fn parse_seconds_ceil(cell: &str) -> Result<u64, String> {
    if let Ok(whole) = cell.parse::<u64>() {
        return Ok(whole.max(1));
    }
    // In range by `parse_seconds`, so the cast is exact.
    Ok((parse_seconds(cell)?.ceil() as u64).max(1))
}

/// Seconds rounded down (a point in time).
pub(super) fn parse_seconds_floor(cell: &str) -> Result<u64, String> {
    if let Ok(whole) = cell.parse::<u64>() {
        return Ok(whole);
    }
    Ok(parse_seconds(cell)?.floor() as u64)
}

/// A GPU amount greater than 0 with at most three decimals (`0.25`, `2`, `8`).
pub(super) fn parse_gpus(cell: &str) -> Result<Milli, String> {
    if cell.is_empty() {
        return Err("must not be empty".to_string());
    }
    let value: f64 = cell
        .parse()
        .map_err(|_| format!("`{cell}` is not a number"))?;
    if !value.is_finite() {
        return Err(format!("`{cell}` is not a finite number"));
    }
    if value < 0.0 {
        return Err(format!("`{cell}` is negative; GPUs must be greater than 0"));
    }
    if value == 0.0 {
        return Err(format!("`{cell}` is zero; GPUs must be greater than 0"));
    }
    match Milli::from_gpus_f64(value) {
        Some(Milli(0)) => Err(format!(
            "`{cell}` rounds to zero; GPUs must be greater than 0"
        )),
        Some(milli) => Ok(milli),
        None if value > 1e12 => Err(format!("`{cell}` is too large")),
        None => Err(format!(
            "`{cell}` is finer than 0.001 GPU (at most three decimals)"
        )),
    }
}

/// Parses `YYYY-MM-DD HH:MM:SS` (or with `T` between date and time) into
/// seconds since 1970-01-01 00:00:00, treating the time as UTC.
pub(super) fn parse_datetime(cell: &str) -> Result<i64, String> {
    // jiff alone would also take a bare date, missing or fractional seconds,
    // signed six-digit years and a leap second (read as :59). Philly writes
    // exactly this shape, so anything else is a damaged cell; jiff then checks
    // the calendar (month, day of month, leap years, time of day).
    const SHAPE: &[u8; 19] = b"0000-00-00 00:00:00";
    let bytes = cell.as_bytes();
    let shaped = bytes.len() == SHAPE.len()
        && bytes.iter().zip(SHAPE).all(|(&byte, &shape)| match shape {
            b'0' => byte.is_ascii_digit(),
            b' ' => matches!(byte, b' ' | b'T'),
            _ => byte == shape,
        });
    if !shaped {
        return Err(format!(
            "`{cell}` is not a date-time of the form YYYY-MM-DD HH:MM:SS"
        ));
    }
    if bytes[17..] == *b"60" {
        return Err(format!("`{cell}` has second 60; expected 0..59"));
    }
    let datetime: jiff::civil::DateTime = cell
        .parse()
        .map_err(|error| format!("`{cell}` is not a valid date-time: {error}"))?;
    jiff::tz::TimeZone::UTC
        .to_timestamp(datetime)
        .map(|timestamp| timestamp.as_second())
        .map_err(|error| format!("`{cell}` is out of range: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_datetime_matches_known_dates() {
        // The day counts once checked against the hand-written calendar code.
        const DAY: i64 = 86_400;
        assert_eq!(parse_datetime("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(parse_datetime("2000-03-01 00:00:00"), Ok(11_017 * DAY));
        assert_eq!(parse_datetime("1969-12-31 00:00:00"), Ok(-DAY));
        assert_eq!(parse_datetime("1600-02-29 00:00:00"), Ok(-135_081 * DAY));
        assert_eq!(parse_datetime("2017-09-04 10:30:41"), Ok(1_504_521_041));
        assert_eq!(parse_datetime("2016-02-29T23:59:59"), Ok(1_456_790_399));
        assert_eq!(parse_datetime("2017-12-22 08:02:11"), Ok(1_513_929_731));
        assert!(parse_datetime("2017-02-29 00:00:00").is_err());
        assert!(parse_datetime("2017-13-01 00:00:00").is_err());
        assert!(parse_datetime("2017-01-01 24:00:00").is_err());
        assert!(parse_datetime("2017-1-01 00:00:00").is_err());
        assert!(parse_datetime("2017-01-01 00:00:0x").is_err());
        assert!(parse_datetime("2017-01-01 00:00:00é").is_err());
    }

    #[test]
    fn parse_datetime_rejects_what_jiff_alone_would_accept() {
        for cell in [
            "2017-01-01",
            "2017-01-01 00:00",
            "2017-01-01 00:00:00.5",
            "2017-01-01t00:00:00",
            "+002017-01-01 00:00:00",
            "2017-01-01 0:00:00",
            "2017-01-01  00:00:00",
        ] {
            let error = parse_datetime(cell).unwrap_err();
            assert!(error.contains("YYYY-MM-DD HH:MM:SS"), "{cell}: {error}");
        }
        assert!(
            parse_datetime("2017-01-01 00:00:60")
                .unwrap_err()
                .contains("second 60")
        );
        for cell in [
            "2017-00-01 00:00:00",
            "2017-04-31 00:00:00",
            "2017-01-01 12:60:00",
        ] {
            let error = parse_datetime(cell).unwrap_err();
            assert!(
                error.contains("is not a valid date-time"),
                "{cell}: {error}"
            );
        }
    }
}
