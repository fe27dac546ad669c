//! When a recurring schedule fires: a cron expression read in an IANA time zone,
//! or a fixed interval from an anchor. Pure: instants in, instants out (epoch ms).
//!
//! Daylight saving time, as Vixie cron and most operators expect it:
//! - a local time a spring-forward skips fires once, at the first valid instant
//!   after it (the transition: 02:30 on a night that jumps from 02:00 to 03:00
//!   fires at 03:00), and an occurrence that falls on that instant anyway fires
//!   with it, once;
//! - a local time a fall-back repeats fires once, at its first (earlier) instant.
//!
//! The cron crate walks local wall-clock times in a zone without transitions
//! (UTC), so that it never meets a gap or a fold itself; each wall-clock time is
//! then placed in the schedule's zone by the rules above.

use std::str::FromStr;
use std::time::Duration;

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, Zoned};

/// How a schedule repeats.
#[derive(Clone, Debug)]
pub enum When {
    /// A cron expression (5 fields, or 6 with seconds first) in a time zone.
    /// With both a day of month and a weekday, Unix cron fires on either: two
    /// expressions, one for each, the earlier occurrence of the two.
    Cron {
        crons: Vec<jiff_cron::Schedule>,
        zone: TimeZone,
    },
    /// Every `every`, from `anchor` (epoch ms) on.
    Every { every: Duration, anchor: i64 },
}

/// Why a cron expression or a zone cannot be used; the text names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WhenError(pub String);

/// Candidates one search looks at before it gives up: enough for a per-second
/// cron across a repeated hour (3600) several times over.
const MAX_CANDIDATES: usize = 20_000;

impl When {
    /// A cron expression in the IANA zone `zone` (e.g. `Europe/Berlin`).
    pub fn cron(expression: &str, zone: &str) -> Result<When, WhenError> {
        let mut fields: Vec<&str> = expression.split_whitespace().collect();
        match fields.len() {
            5 => fields.insert(0, "0"),
            6 => {}
            n => {
                return Err(WhenError(format!(
                    "cron {expression:?}: {n} fields; give 5 (minute hour day month weekday) \
                     or 6 (seconds first)"
                )));
            }
        }
        let weekdays = unix_weekdays(fields[5])
            .map_err(|why| WhenError(format!("cron {expression:?}: weekday {why}")))?;
        fields[5] = &weekdays;
        let any = |f: &str| f == "*" || f == "?";
        let variants = if any(fields[3]) || any(fields[5]) {
            vec![fields.clone()]
        } else {
            let (mut by_day, mut by_weekday) = (fields.clone(), fields);
            by_day[5] = "*";
            by_weekday[3] = "*";
            vec![by_day, by_weekday]
        };
        let crons = variants
            .into_iter()
            .map(|f| jiff_cron::Schedule::from_str(&f.join(" ")))
            .collect::<Result<Vec<_>, _>>()
            // The crate's text points at the fault over several lines; its last says why.
            .map_err(|e| {
                let text = e.to_string();
                let why = text.lines().last().unwrap_or_default().trim().to_owned();
                WhenError(format!("cron {expression:?}: {why}"))
            })?;
        let zone = TimeZone::get(zone)
            .map_err(|_| WhenError(format!("timezone {zone:?}: not an IANA time zone")))?;
        Ok(When::Cron { crons, zone })
    }

    /// The first occurrence strictly after `after` (epoch ms), or None when there
    /// is none (a cron that matches no date left, such as `0 0 31 2 *`).
    pub fn next_after(&self, after: i64) -> Option<i64> {
        match self {
            When::Every { every, anchor } => {
                let every = i64::try_from(every.as_millis()).ok()?.max(1);
                if after < *anchor {
                    return Some(*anchor);
                }
                let k = (after - anchor) / every + 1;
                anchor.checked_add(k.checked_mul(every)?)
            }
            When::Cron { crons, zone } => crons
                .iter()
                .filter_map(|cron| cron_after(cron, zone, after))
                .min(),
        }
    }

    /// Up to `n` occurrences after `after`, in order.
    pub fn next_n(&self, after: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut at = after;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }
}

/// The first instant after `after` at which `cron`'s wall-clock times fire in `zone`.
fn cron_after(cron: &jiff_cron::Schedule, zone: &TimeZone, after: i64) -> Option<i64> {
    let after_ts = Timestamp::from_millisecond(after).ok()?;
    // From the wall-clock time of `after` on: an earlier wall-clock time never
    // fires later than `after` (a fold fires its first instant, a gap its
    // transition, both before the times that follow them).
    let local = after_ts.to_zoned(zone.clone()).datetime();
    let walk = local.to_zoned(TimeZone::UTC).ok()?;
    for candidate in cron.after(walk).take(MAX_CANDIDATES) {
        let at = place(candidate.datetime(), zone)?;
        if at > after {
            return Some(at);
        }
    }
    None
}

/// A weekday field as Unix cron writes it (0 to 7, Sunday 0 or 7, Monday 1; or
/// names) in the cron crate's numbering (Sunday 1 to Saturday 7).
fn unix_weekdays(field: &str) -> Result<String, String> {
    let number = |text: &str| -> Result<Option<u8>, String> {
        match text.parse::<u8>() {
            Ok(n) if n <= 7 => Ok(Some(n)),
            Ok(n) => Err(format!("{n}: must be 0 to 7 (Sunday is 0 or 7)")),
            Err(_) => Ok(None), // a name (MON) or `*` / `?`, as the crate reads it
        }
    };
    let mut out = Vec::new();
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (part, None),
        };
        let with_step = |text: String| match step {
            Some(step) => format!("{text}/{step}"),
            None => text,
        };
        match range.split_once('-') {
            Some((a, b)) => match (number(a)?, number(b)?) {
                (Some(a), Some(7)) if a > 0 => {
                    // Through Sunday at the end: the crate's week ends on Saturday.
                    if step.is_some() {
                        return Err(format!(
                            "{part:?}: a stepped range through 7; use 0 for Sunday"
                        ));
                    }
                    out.push(format!("{}-7", a + 1));
                    out.push("1".to_owned());
                }
                (Some(a), Some(b)) => out.push(with_step(format!("{}-{}", a % 7 + 1, b % 7 + 1))),
                (None, None) => out.push(part.to_owned()),
                _ => {
                    return Err(format!(
                        "{part:?}: give both ends as numbers or both as names"
                    ));
                }
            },
            None => match number(range)? {
                Some(n) => out.push(with_step(format!("{}", n % 7 + 1))),
                None => out.push(part.to_owned()),
            },
        }
    }
    Ok(out.join(","))
}

/// The instant a wall-clock time fires at in `zone`: its one instant; in a gap,
/// the transition that skipped it; in a fold, the earlier of its two.
fn place(local: DateTime, zone: &TimeZone) -> Option<i64> {
    let ambiguous = zone.to_ambiguous_timestamp(local);
    let ts = match ambiguous.offset() {
        AmbiguousOffset::Unambiguous { .. } | AmbiguousOffset::Fold { .. } => {
            ambiguous.earlier().ok()?
        }
        AmbiguousOffset::Gap { before, .. } => {
            // Read with the offset before the gap, the time lies past the
            // transition; the transition is the last one before it.
            let past = before.to_timestamp(local).ok()?;
            zone.preceding(past).next()?.timestamp()
        }
    };
    Some(ts.as_millisecond())
}

/// An instant as a time in `zone`, for messages and answers.
pub fn zoned(ms: i64, zone: &TimeZone) -> Option<Zoned> {
    Some(Timestamp::from_millisecond(ms).ok()?.to_zoned(zone.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(rfc3339: &str) -> i64 {
        rfc3339.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn text(at: i64) -> String {
        Timestamp::from_millisecond(at).unwrap().to_string()
    }

    /// `n` occurrences of `cron` in `zone` after `after`, as UTC instants.
    #[track_caller]
    fn check(cron: &str, zone: &str, after: &str, want: &[&str]) {
        let when = When::cron(cron, zone).unwrap();
        let got: Vec<String> = when
            .next_n(ms(after), want.len())
            .into_iter()
            .map(text)
            .collect();
        assert_eq!(got, want, "{cron} in {zone} after {after}");
    }

    #[test]
    fn a_plain_day_fires_at_its_local_times() {
        check(
            "30 9 * * *",
            "Europe/Berlin",
            "2026-06-01T00:00:00Z",
            &["2026-06-01T07:30:00Z", "2026-06-02T07:30:00Z"],
        );
        check(
            "0 */15 * * * *",
            "UTC",
            "2026-06-01T00:00:00Z",
            &["2026-06-01T00:15:00Z", "2026-06-01T00:30:00Z"],
        );
        check(
            "0 0 * * 1",
            "America/New_York",
            "2026-06-03T00:00:00Z",
            &["2026-06-08T04:00:00Z"],
        );
    }

    #[test]
    fn a_time_skipped_by_spring_forward_fires_once_at_the_transition() {
        // Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        check(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T00:00:00Z",
            &[
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z",
            ],
        );
        // Every 20 minutes: 02:00, 02:20, 02:40 are skipped and fire once together
        // at 03:00, which is itself an occurrence: one.
        check(
            "*/20 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:30:00Z",
            &[
                "2026-03-29T00:40:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:20:00Z",
            ],
        );
        // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
        check(
            "15 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            &["2026-03-08T07:00:00Z", "2026-03-09T06:15:00Z"],
        );
        // Lord Howe, 2026-10-04: a 30-minute shift, 02:00 +10:30 to 02:30 +11:00
        // (15:30 UTC the day before).
        check(
            "15 2 * * *",
            "Australia/Lord_Howe",
            "2026-10-02T12:00:00Z",
            &[
                "2026-10-02T15:45:00Z",
                "2026-10-03T15:30:00Z",
                "2026-10-04T15:15:00Z",
            ],
        );
    }

    #[test]
    fn a_time_repeated_by_fall_back_fires_once_at_its_first_instant() {
        // Berlin, 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00 UTC);
        // 02:30 happens at 00:30 and 01:30 UTC, and fires at 00:30 only.
        check(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        );
        // Asked during the second pass, it is not fired again.
        check(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-25T01:10:00Z",
            &["2026-10-26T01:30:00Z"],
        );
        // Hourly: 02:00 fires at its first instant, then 03:00 an hour after the
        // second 02:00 (two hours on).
        check(
            "0 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:30:00Z",
            &[
                "2026-10-25T00:00:00Z",
                "2026-10-25T02:00:00Z",
                "2026-10-25T03:00:00Z",
            ],
        );
        // New York, 2026-11-01: 01:00-01:59 EDT, then again EST.
        check(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        );
        // Lord Howe, 2026-04-05: 02:00 +11:00 falls back to 01:30 +10:30.
        check(
            "45 1 * * *",
            "Australia/Lord_Howe",
            "2026-04-03T12:00:00Z",
            &[
                "2026-04-03T14:45:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-05T15:15:00Z",
            ],
        );
    }

    #[test]
    fn weekdays_are_read_as_unix_cron_numbers_them() {
        // 2026-06-07 is a Sunday.
        let sunday = ["2026-06-07T00:00:00Z", "2026-06-14T00:00:00Z"];
        check("0 0 * * 0", "UTC", "2026-06-01T00:00:00Z", &sunday);
        check("0 0 * * 7", "UTC", "2026-06-01T00:00:00Z", &sunday);
        check("0 0 * * SUN", "UTC", "2026-06-01T00:00:00Z", &sunday);
        check(
            "0 0 * * 1-5",
            "UTC",
            "2026-06-05T12:00:00Z",
            &["2026-06-08T00:00:00Z"],
        );
        check(
            "0 0 * * 5-7",
            "UTC",
            "2026-06-01T12:00:00Z",
            &[
                "2026-06-05T00:00:00Z",
                "2026-06-06T00:00:00Z",
                "2026-06-07T00:00:00Z",
                "2026-06-12T00:00:00Z",
            ],
        );
        check(
            "0 0 * * 1,3",
            "UTC",
            "2026-06-01T12:00:00Z",
            &["2026-06-03T00:00:00Z", "2026-06-08T00:00:00Z"],
        );
        check(
            "0 0 * * */2",
            "UTC",
            "2026-06-01T12:00:00Z",
            &[
                "2026-06-02T00:00:00Z",
                "2026-06-04T00:00:00Z",
                "2026-06-06T00:00:00Z",
                "2026-06-07T00:00:00Z",
            ],
        );
        assert_eq!(
            unix_weekdays("8").unwrap_err(),
            "8: must be 0 to 7 (Sunday is 0 or 7)"
        );
        assert!(unix_weekdays("1-7/2").is_err());
    }

    #[test]
    fn a_day_of_month_and_a_weekday_fire_on_either_as_unix_cron_does() {
        // The 15th (a Monday in June 2026) and every Friday.
        check(
            "0 9 15 * 5",
            "UTC",
            "2026-06-10T00:00:00Z",
            &[
                "2026-06-12T09:00:00Z",
                "2026-06-15T09:00:00Z",
                "2026-06-19T09:00:00Z",
            ],
        );
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_a_schedule_or_refused(cron in delayq_harness::props::text(), zone in "[A-Za-z/_]{0,20}") {
            let _ = When::cron(&cron, &zone);
        }

        #[test]
        fn occurrences_only_move_forward(
            step in 1u32..60, zone in proptest::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
            start in 1_767_225_600_000i64..1_830_297_600_000,
        ) {
            let when = When::cron(&format!("*/{step} * * * *"), zone).unwrap();
            let mut at = start;
            for next in when.next_n(start, 50) {
                proptest::prop_assert!(next > at, "{} then {}", at, next);
                at = next;
            }
        }
    }

    #[test]
    fn every_counts_from_its_anchor() {
        let when = When::Every {
            every: Duration::from_secs(60),
            anchor: 1_000,
        };
        assert_eq!(when.next_after(0), Some(1_000));
        assert_eq!(when.next_after(1_000), Some(61_000));
        assert_eq!(when.next_after(60_999), Some(61_000));
        assert_eq!(when.next_n(61_000, 2), [121_000, 181_000]);
    }

    #[test]
    fn what_cannot_be_used_is_refused_naming_it() {
        let refused = |cron: &str, zone: &str| When::cron(cron, zone).unwrap_err().0;
        assert!(refused("0 0 * *", "UTC").starts_with("cron \"0 0 * *\": 4 fields"));
        assert_eq!(
            refused("61 * * * *", "UTC"),
            "cron \"61 * * * *\": Minutes must be less than 59. ('61' specified.)"
        );
        assert_eq!(
            refused("0 0 * * *", "Mars/Olympus"),
            "timezone \"Mars/Olympus\": not an IANA time zone"
        );
        // Parsed, but never fires.
        let never = When::cron("0 0 31 2 *", "UTC").unwrap();
        assert_eq!(never.next_after(ms("2026-01-01T00:00:00Z")), None);
    }
}
