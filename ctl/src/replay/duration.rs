//! Human durations on the command line: `5s`, `250ms`, `1.5s`, `2m`.

use std::time::Duration;

/// Units [`parse_duration`] reads, with their length in seconds.
const UNITS: [(&str, f64); 5] = [
    ("us", 1e-6),
    ("ms", 1e-3),
    ("s", 1.0),
    ("m", 60.0),
    ("h", 3600.0),
];

/// A duration string that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing was given.
    #[error("empty duration: expected a number and a unit, e.g. 5s or 250ms")]
    Empty,
    /// A number without a unit ("5": seconds or milliseconds?).
    #[error("duration {0:?} has no unit: write e.g. {0}s or {0}ms (units: us, ms, s, m, h)")]
    MissingUnit(String),
    /// A unit that is not one of [`UNITS`].
    #[error("duration {input:?}: unknown unit {unit:?} (units: us, ms, s, m, h)")]
    UnknownUnit {
        /// The whole string.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The number part is not a finite, non-negative decimal number.
    #[error("duration {0:?}: the amount is not a non-negative number")]
    BadNumber(String),
}

/// Parses a decimal amount followed by a unit (`us`, `ms`, `s`, `m`, `h`), e.g. `5s`, `250ms`,
/// `1.5s`; surrounding spaces and a space before the unit are allowed. Zero is allowed (callers
/// that need a positive duration check it).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(DurationError::Empty);
    }
    let split = input
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(input.len());
    let (amount, unit) = (&input[..split], input[split..].trim_start());
    if unit.is_empty() {
        return Err(DurationError::MissingUnit(input.to_owned()));
    }
    // Digits with at most one dot and at least one digit ("1.", ".5" are fine; "." and "1.2.3"
    // are not). A sign is never accepted, so negative durations fail here.
    let digits = amount.bytes().filter(u8::is_ascii_digit).count();
    let dots = amount.bytes().filter(|&b| b == b'.').count();
    if digits == 0 || dots > 1 {
        return Err(DurationError::BadNumber(input.to_owned()));
    }
    let value: f64 = amount
        .parse()
        .map_err(|_| DurationError::BadNumber(input.to_owned()))?;
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| DurationError::UnknownUnit {
            input: input.to_owned(),
            unit: unit.to_owned(),
        })?;
    Duration::try_from_secs_f64(value * scale)
        .map_err(|_| DurationError::BadNumber(input.to_owned()))
}

/// A duration in milliseconds, as SLOs are kept.
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_usual_forms() {
        let ms = |s: &str| millis(parse_duration(s).expect(s));
        assert_eq!(ms("5s"), 5000.0);
        assert_eq!(ms("250ms"), 250.0);
        assert_eq!(ms("1.5s"), 1500.0);
        assert_eq!(ms(" 2m "), 120_000.0);
        assert_eq!(ms("1h"), 3_600_000.0);
        assert_eq!(ms("500us"), 0.5);
        assert_eq!(ms("0.25 s"), 250.0);
        assert_eq!(ms(".5s"), 500.0);
        assert_eq!(ms("0ms"), 0.0);
    }

    #[test]
    fn refuses_with_a_reason() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert_eq!(parse_duration("  "), Err(DurationError::Empty));
        assert_eq!(
            parse_duration("5"),
            Err(DurationError::MissingUnit("5".into()))
        );
        assert!(matches!(
            parse_duration("5sec"),
            Err(DurationError::UnknownUnit { unit, .. }) if unit == "sec"
        ));
        assert!(matches!(
            parse_duration("5 S"),
            Err(DurationError::UnknownUnit { .. })
        ));
        for bad in ["-5s", "s", ".s", "1.2.3s", "+5s", "1e3ms"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_duration("-5s"),
            Err(DurationError::BadNumber(_))
        ));
        let msg = parse_duration("5").unwrap_err().to_string();
        assert!(msg.contains("5s or 5ms"), "{msg}");
    }
}
