//! Time: when a message falls due, its place in a shard's due set, and the
//! durations clients write (`"20m"`, `1500`).

use std::time::Duration;

use super::MAX_PRIORITY;

/// When a message falls due. A relative delay is resolved against Redis's clock
/// inside the schedule script, never against this process's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    In(Duration),
    /// Epoch milliseconds. A time in the past means "as soon as possible".
    At(u64),
}

impl Due {
    pub fn as_ms(&self) -> u64 {
        match self {
            Due::In(d) => d.as_millis() as u64,
            Due::At(ms) => *ms,
        }
    }
}

/// Score of a message in its shard's due set: due milliseconds, then priority
/// (higher first) as the tie-break. Exact in an f64 until the year 30000.
pub fn due_score(due_ms: u64, priority: u8) -> u64 {
    due_ms * 10 + u64::from(MAX_PRIORITY - priority)
}

/// Parses a human duration such as `"20m"`, `"1500ms"` or `"1h 30m"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. \"20m\", \"1500ms\""))
}

/// Milliseconds (`1500`) or human text (`20m`), as an inbox field or a query
/// parameter gives a duration; never negative. Errors name the field.
pub fn parse_duration_field(name: &str, value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if value.starts_with('-') {
        return Err(format!("{name} {value:?}: must not be negative"));
    }
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    parse_duration(value).map_err(|e| format!("{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use delayq_harness::props::{beyond_u64, expect};

    proptest! {
        #[test]
        fn milliseconds_round_trip(ms: u64) {
            let text = ms.to_string();
            expect(&text, parse_duration_field("delay", &text), Some(Duration::from_millis(ms)))?;
        }

        #[test]
        fn human_durations_round_trip(secs: u64, nanos in 0u32..1_000_000_000) {
            let duration = Duration::new(secs, nanos);
            let text = humantime::format_duration(duration).to_string();
            expect(&text, parse_duration_field("delay", &text), Some(duration))?;
        }

        #[test]
        fn durations_beyond_u64_are_refused(n in beyond_u64(), unit in "|ms|s|m|h|d") {
            let text = format!("{n}{unit}");
            expect(&text, parse_duration_field("delay", &text), None)?;
        }

        #[test]
        fn durations_that_overflow_are_refused_not_wrapped(n: u64) {
            let text = format!("{n}h");
            expect(&text, parse_duration(&text), n.checked_mul(3600).map(Duration::from_secs))?;
        }

        #[test]
        fn negative_durations_are_refused(text in "-[0-9a-z ]{0,20}") {
            expect(&text, parse_duration_field("delay", &text), None)?;
        }
    }

    #[test]
    fn scores_order_by_due_then_priority() {
        assert!(due_score(1000, 0) < due_score(1001, 9));
        assert!(due_score(1000, 9) < due_score(1000, 0));
        assert_eq!(due_score(1000, 9), 10_000);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
    }
}
