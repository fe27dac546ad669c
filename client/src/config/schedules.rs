//! `[schedules]`: recurring schedules' settings.

use std::time::Duration;

/// `[schedules]`: how far ahead the leader makes each schedule's occurrences.
#[derive(Clone, Debug)]
pub struct SchedulesConfig {
    pub horizon: Duration,
}

impl SchedulesConfig {
    /// The horizon the leader uses: at most half of `records.retention` (when one
    /// is kept), so that an occurrence a new leader makes again is still on record
    /// or pending, and so known as a duplicate.
    pub fn horizon_within(&self, retention: Duration) -> Duration {
        match retention.is_zero() {
            true => self.horizon,
            false => self.horizon.min(retention / 2),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::env;

    #[test]
    fn the_horizon_at_both_ends_and_within_the_records_retention() {
        for toml in [
            "[schedules]\nhorizon = \"999ms\"",
            "[schedules]\nhorizon = \"61m\"",
        ] {
            let err = Config::from_toml(toml, env(&[])).unwrap_err().to_string();
            assert!(err.contains("schedules.horizon: must be 1s to 1h"), "{err}");
        }
        for (toml, retention_s, used_s) in [
            ("[schedules]\nhorizon = \"1s\"", 86_400, 1),
            ("[schedules]\nhorizon = \"1h\"", 86_400, 3_600),
            (
                "[schedules]\nhorizon = \"1h\"\n[records]\nretention = \"10m\"",
                600,
                300,
            ),
            (
                "[schedules]\nhorizon = \"1h\"\n[records]\nretention = \"0s\"",
                0,
                3_600,
            ),
        ] {
            let c = Config::from_toml(toml, env(&[])).unwrap();
            assert_eq!(
                c.records.retention,
                Duration::from_secs(retention_s),
                "{toml}"
            );
            let used = c.schedules.horizon_within(c.records.retention);
            assert_eq!(used, Duration::from_secs(used_s), "{toml}");
        }
    }
}
