//! The `grpc-timeout` header: how long a call may take, as gRPC carries a deadline between
//! processes (router to decode worker to prefill worker).

use std::time::Duration;

/// The header's name.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Parses a header value: at most 8 digits, then a unit (`H`, `M`, `S`, `m`, `u`, `n`).
pub fn parse(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A header value for `left`, in milliseconds (at least 1: 0 would mean "already over").
pub fn format(left: Duration) -> String {
    format!("{}m", left.as_millis().clamp(1, 99_999_999))
}

/// The timeout a request's metadata carries, if any (and valid).
pub fn of(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    parse(metadata.get(GRPC_TIMEOUT)?.to_str().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_the_spec_writes_them() {
        assert_eq!(parse("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse("7u"), Some(Duration::from_micros(7)));
        for bad in ["", "S", "5", "123456789m", "5s", "-5S", "5 S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(format(Duration::from_millis(1500)), "1500m");
        assert_eq!(format(Duration::ZERO), "1m");
        assert_eq!(
            parse(&format(Duration::from_secs(3))),
            Some(Duration::from_secs(3))
        );
    }
}
