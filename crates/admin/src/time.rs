//! Times as Go marshals `time.Time` to JSON (RFC 3339 with nanoseconds,
//! trailing zeros of the fraction dropped), in UTC.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A time's UTC calendar fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utc {
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31.
    pub day: u32,
    /// Hour, 0–23.
    pub hour: u32,
    /// Minute.
    pub minute: u32,
    /// Second.
    pub second: u32,
    /// Nanoseconds within the second.
    pub nanos: u32,
}

impl Utc {
    /// The UTC calendar fields of `t` (times before 1970 count as 1970).
    pub fn of(t: SystemTime) -> Utc {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = d.as_secs() as i64;
        let (year, month, day) = civil(secs.div_euclid(86_400));
        let rem = secs.rem_euclid(86_400) as u32;
        Utc {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
            nanos: d.subsec_nanos(),
        }
    }
}

/// `2025-01-02T03:04:05.123456789Z`.
pub fn rfc3339_nano(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, mo, da) = civil(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let (h, mi, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let nanos = d.subsec_nanos();
    let frac = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_owned()
    };
    format!("{y:04}-{mo:02}-{da:02}T{h:02}:{mi:02}:{s:02}{frac}Z")
}

/// A civil date to days since 1970-01-01 (the inverse of [`civil`]).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `t` as Kubernetes' MicroTime writes it: exactly six fractional digits
/// (`2006-01-02T15:04:05.000000Z`), as Events' `eventTime` wants.
pub fn rfc3339_micro(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = UNIX_EPOCH + Duration::from_secs(d.as_secs());
    let text = rfc3339_nano(whole);
    format!("{}.{:06}Z", text.trim_end_matches('Z'), d.subsec_micros())
}

/// Parses an RFC 3339 time as Kubernetes writes it in annotations
/// (`2025-01-02T03:04:05Z`, optionally with a fraction and a `±hh:mm`
/// offset). `None` if it is not one.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<u32>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            return None;
        }
        let padded: String = digits
            .chars()
            .chain(std::iter::repeat('0'))
            .take(9)
            .collect();
        nanos = padded.parse().ok()?;
        rest = frac.get(digits.len()..)?;
    }
    let offset: i64 = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => {
            let oh: i64 = o.get(1..3)?.parse().ok()?;
            let om: i64 = o.get(4..6)?.parse().ok()?;
            let v = oh * 3600 + om * 60;
            if o.starts_with('-') { -v } else { v }
        }
        _ => return None,
    };
    let secs = days_from_civil(i64::from(y), mo, d) * 86_400
        + i64::from(h) * 3600
        + i64::from(mi) * 60
        + i64::from(sec)
        - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + std::time::Duration::new(secs, nanos))
}

/// A point in time read from both clocks, as Go's `time.Now()` is: the
/// wall clock for what is shown, the monotonic clock for how long ago. A
/// wall clock stepped by NTP (a node that booted with a wrong clock) must
/// not make a pending change look older or younger than it is, so every
/// duration between two moments is taken on the monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    /// The wall clock.
    pub wall: SystemTime,
    /// The monotonic clock.
    pub mono: Instant,
}

impl Moment {
    /// Now.
    pub fn now() -> Moment {
        Moment {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    /// How long after `earlier` this moment is (zero if it is not after).
    pub fn since(&self, earlier: Moment) -> Duration {
        self.mono.saturating_duration_since(earlier.mono)
    }
}

impl PartialOrd for Moment {
    fn partial_cmp(&self, other: &Moment) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Moments are ordered by the monotonic clock.
impl Ord for Moment {
    fn cmp(&self, other: &Moment) -> std::cmp::Ordering {
        self.mono.cmp(&other.mono)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_like_go() {
        let t = UNIX_EPOCH + Duration::new(1_735_787_045, 123_456_789);
        assert_eq!(rfc3339_nano(t), "2025-01-02T03:04:05.123456789Z");
        let t = UNIX_EPOCH + Duration::new(1_735_787_041, 100_000_000);
        assert_eq!(rfc3339_nano(t), "2025-01-02T03:04:01.1Z");
        assert_eq!(rfc3339_nano(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339_nano(t), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn parses_what_it_formats_and_offsets() {
        for t in [
            UNIX_EPOCH + Duration::new(1_735_787_045, 123_456_789),
            UNIX_EPOCH + Duration::from_secs(951_782_400),
            UNIX_EPOCH,
        ] {
            assert_eq!(parse_rfc3339(&rfc3339_nano(t)), Some(t));
        }
        assert_eq!(
            parse_rfc3339("2025-01-02T04:04:05+01:00"),
            parse_rfc3339("2025-01-02T03:04:05Z")
        );
        for bad in [
            "",
            "2025-01-02",
            "2025-13-02T03:04:05Z",
            "2025-01-02T03:04:05",
            "2025-01-02T03:04:05.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
