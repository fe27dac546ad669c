//! Durations and times as people read them: `365d`, `1h30m`, `1500ms` → `1s500ms`;
//! `2026-11-26 19:22:09.186 UTC`. Every text a person sees (errors, the CLI, logs)
//! uses these, and each duration reads back through `humantime::parse_duration`.

use std::time::Duration;

/// A duration in days, hours, minutes, seconds and milliseconds, largest first,
/// zero parts left out (`365d`, `1h30m`, `2s250ms`); below a millisecond, in
/// microseconds. Never months or years, whose length varies.
pub fn duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d < Duration::from_millis(1) {
        return format!("{}µs", d.as_micros());
    }
    let ms = d.as_millis();
    let parts = [
        (ms / 86_400_000, "d"),
        (ms / 3_600_000 % 24, "h"),
        (ms / 60_000 % 60, "m"),
        (ms / 1000 % 60, "s"),
        (ms % 1000, "ms"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

/// [`duration`] of a count of milliseconds.
pub fn millis(ms: u64) -> String {
    duration(Duration::from_millis(ms))
}

/// A count of milliseconds to the second past a second, to the minute past a day:
/// how far off a time is, where the calendar time beside it is exact.
pub fn roughly(ms: u64) -> String {
    let unit = match ms {
        0..1000 => 1,
        1000..86_400_000 => 1000,
        _ => 60_000,
    };
    millis((ms + unit / 2) / unit * unit)
}

/// An epoch-milliseconds time in UTC, to the millisecond: `2026-11-26 19:22:09.186 UTC`
/// (the raw number when it is past what a calendar holds).
pub fn time_utc(epoch_ms: u64) -> String {
    match timestamp(epoch_ms) {
        Some(t) => t.strftime("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
        None => format!("{epoch_ms} ms after 1970"),
    }
}

/// Epoch milliseconds as a calendar instant, if a calendar holds it.
fn timestamp(epoch_ms: u64) -> Option<jiff::Timestamp> {
    let ms = i64::try_from(epoch_ms).ok()?;
    jiff::Timestamp::from_millisecond(ms).ok()
}

/// An epoch-milliseconds time in this machine's time zone, with how far it is from
/// `now_ms`: `2026-11-26 20:22:09.186 CET (in 20m)`, `… (3s ago)`.
pub fn time_local(epoch_ms: u64, now_ms: u64) -> String {
    let Some(when) = timestamp(epoch_ms) else {
        return format!("{epoch_ms} ms after 1970");
    };
    let zoned = when.to_zoned(jiff::tz::TimeZone::system());
    let shown = zoned.strftime("%Y-%m-%d %H:%M:%S%.3f %Z");
    let relative = match epoch_ms.cmp(&now_ms) {
        std::cmp::Ordering::Greater => format!("in {}", roughly(epoch_ms - now_ms)),
        std::cmp::Ordering::Less => format!("{} ago", roughly(now_ms - epoch_ms)),
        std::cmp::Ordering::Equal => "now".to_owned(),
    };
    format!("{shown} ({relative})")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    #[track_caller]
    fn check(d: Duration, want: &str) {
        assert_eq!(duration(d), want);
    }

    #[test]
    fn durations_read_as_written_by_hand() {
        check(Duration::ZERO, "0s");
        check(Duration::from_micros(250), "250µs");
        check(Duration::from_millis(1500), "1s500ms");
        check(Duration::from_secs(90 * 60), "1h30m");
        check(Duration::from_secs(365 * 86_400), "365d");
        check(Duration::from_secs(6), "6s");
        check(Duration::from_millis(86_400_000 + 3_600_000 + 1), "1d1h1ms");
    }

    #[test]
    fn distances_are_rounded_to_what_matters() {
        for (ms, want) in [
            (0, "0s"),
            (250, "250ms"),
            (1629, "2s"),
            (1_199_899, "20m"),
            (90_061_500, "1d1h1m"),
        ] {
            assert_eq!(roughly(ms), want, "{ms}");
        }
    }

    #[test]
    fn times_read_as_calendar_times() {
        assert_eq!(time_utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(time_utc(1_795_719_729_214), "2026-11-26 19:02:09.214 UTC");
        assert_eq!(time_utc(u64::MAX), format!("{} ms after 1970", u64::MAX));
        assert!(time_local(61_000, 1_000).ends_with("(in 1m)"));
        assert!(time_local(1_200_000 - 101, 0).ends_with("(in 20m)"));
        assert!(time_local(1_000, 3_000).ends_with("(2s ago)"));
    }

    proptest! {
        #[test]
        fn durations_read_back(ms in 1u64..u64::MAX / 1000) {
            let d = Duration::from_millis(ms);
            let text = duration(d);
            prop_assert_eq!(humantime::parse_duration(&text).ok(), Some(d), "{}", text);
        }
    }
}
