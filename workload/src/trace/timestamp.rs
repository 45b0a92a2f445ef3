//! Wall-clock timestamps of the Azure trace, `YYYY-MM-DD HH:MM:SS[.fffffff]`, to nanoseconds
//! since 1970-01-01 (UTC; the trace has no zone, and only differences are used).

/// Nanoseconds since the Unix epoch of `s`, or why it is not a timestamp.
pub(crate) fn parse_ns(s: &str) -> Result<i64, String> {
    let bad = || format!("timestamp {s:?} is not YYYY-MM-DD HH:MM:SS[.fraction]");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let mut d = date.splitn(3, '-');
    let (Some(y), Some(mo), Some(da)) = (d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let (Some(h), Some(mi), Some(se)) = (t.next(), t.next(), t.next()) else {
        return Err(bad());
    };
    let num = |x: &str, digits: std::ops::RangeInclusive<usize>| -> Result<i64, String> {
        if !digits.contains(&x.len()) || !x.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        x.parse::<i64>().map_err(|_| bad())
    };
    let (year, month, day) = (num(y, 4..=4)?, num(mo, 1..=2)?, num(da, 1..=2)?);
    let (hour, minute, second) = (num(h, 1..=2)?, num(mi, 1..=2)?, num(se, 1..=2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return Err(format!("timestamp {s:?}: no such date"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!("timestamp {s:?}: no such time of day"));
    }
    let nanos = if frac.is_empty() {
        if time.contains('.') {
            return Err(bad());
        }
        0
    } else {
        // Up to nanoseconds: right-pad the fraction to nine digits.
        num(frac, 1..=9)? * 10i64.pow(9 - frac.len() as u32)
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Ok(secs * 1_000_000_000 + nanos)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12; // March = 0
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn known_instants() {
        assert_eq!(parse_ns("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(parse_ns("2000-03-01 00:00:00"), Ok(951_868_800 * S));
        // The Azure trace's first row (1700158546 s is 2023-11-16 18:15:46 UTC).
        assert_eq!(
            parse_ns("2023-11-16 18:15:46.6805900"),
            Ok(1_700_158_546 * S + 680_590_000)
        );
        assert_eq!(
            parse_ns("2024-02-29T23:59:59.5"),
            Ok(1_709_251_199 * S + S / 2)
        );
    }

    #[test]
    fn differences_cross_midnight_and_month_ends() {
        let a = parse_ns("2023-12-31 23:59:59.9").unwrap();
        let b = parse_ns("2024-01-01 00:00:00.1").unwrap();
        assert_eq!(b - a, S / 5);
    }

    #[test]
    fn malformed_stamps_are_refused() {
        for s in [
            "",
            "2023-11-16",
            "2023-11-16 18:15",
            "2023-11-16 18:15:46.",
            "2023-11-16 18:15:46.1234567890",
            "2023-13-01 00:00:00",
            "2023-02-29 00:00:00",
            "2023-11-16 24:00:00",
            "2023-11-16 18:60:00",
            "23-11-16 18:15:46",
            "2023-11-16 18:15:4x",
            "2023-11-+6 18:15:46",
        ] {
            assert!(parse_ns(s).is_err(), "{s:?} accepted");
        }
    }
}
