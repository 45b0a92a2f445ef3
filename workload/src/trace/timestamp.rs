//! Wall-clock timestamps of the Azure traces to nanoseconds since 1970-01-01 UTC:
//! `YYYY-MM-DD HH:MM:SS[.fraction][offset]`, with `T` also accepted between date and time. The
//! 2023 traces have no zone (`2023-11-16 18:15:46.6805900`, taken as UTC: only differences are
//! used); the 2024 ones end in a UTC offset (`2024-05-12 00:00:00.009930+00:00`), which is
//! applied, so rows written in different zones still order correctly. The offset is `Z`, or a
//! sign and `HH:MM`, `HHMM` or `HH`. Fractions beyond nanoseconds are cut to nanoseconds.

/// Nanoseconds since the Unix epoch of `s`, or why it is not a timestamp.
pub(crate) fn parse_ns(s: &str) -> Result<i64, String> {
    let bad = || format!("timestamp {s:?} is not YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]");
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let (time, offset_s) = split_offset(time).ok_or_else(bad)?;
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
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        // To nanoseconds: cut past nine digits, right-pad to nine.
        let ns = &frac[..frac.len().min(9)];
        num(ns, 1..=9)? * 10i64.pow(9 - ns.len() as u32)
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Ok((secs - offset_s) * 1_000_000_000 + nanos)
}

/// Splits a trailing UTC offset off a time of day: the time without it and the offset in
/// seconds east of UTC (0 when there is none). `None` when the offset is malformed.
fn split_offset(time: &str) -> Option<(&str, i64)> {
    if let Some(t) = time.strip_suffix(['Z', 'z']) {
        return Some((t, 0));
    }
    let Some(at) = time.rfind(['+', '-']) else {
        return Some((time, 0));
    };
    let (t, offset) = time.split_at(at);
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let hhmm = &offset[1..];
    let (h, m) = match hhmm.len() {
        2 => (hhmm, "00"),
        4 => hhmm.split_at(2),
        5 if hhmm.as_bytes()[2] == b':' => (&hhmm[..2], &hhmm[3..]),
        _ => return None,
    };
    let two = |x: &str| {
        x.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| x.parse::<i64>().ok())
            .flatten()
    };
    let (hours, minutes) = (two(h)?, two(m)?);
    (hours <= 23 && minutes <= 59).then_some((t, sign * (hours * 3600 + minutes * 60)))
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
    fn utc_offsets_are_applied() {
        // The 2024 traces' form.
        assert_eq!(
            parse_ns("2024-05-12 00:00:00.009930+00:00"),
            Ok(1_715_472_000 * S + 9_930_000)
        );
        let utc = parse_ns("2024-05-12 00:00:00").unwrap();
        assert_eq!(parse_ns("2024-05-12 00:00:00Z"), Ok(utc));
        assert_eq!(parse_ns("2024-05-12T02:30:00+02:30"), Ok(utc));
        assert_eq!(parse_ns("2024-05-12 02:00:00+0200"), Ok(utc));
        assert_eq!(parse_ns("2024-05-11 19:00:00-05"), Ok(utc));
        // A fraction past nanoseconds is cut, not refused.
        assert_eq!(
            parse_ns("2024-05-12 00:00:00.1234567891+00:00"),
            Ok(utc + 123_456_789)
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
            "2023-11-16 18:15:46.12345x",
            "2024-05-12 00:00:00+0",
            "2024-05-12 00:00:00+24:00",
            "2024-05-12 00:00:00+01:60",
            "2024-05-12 00:00:00+01:",
            "2024-05-12 00:00:00.5+1:00",
            "2024-05-12 00:00:00++01:00",
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
