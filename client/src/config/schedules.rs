//! `[scheduler]`: how the leader makes recurring schedules' occurrences; and
//! `[[schedules]]`: schedules declared in the file (checked with the deployment's
//! message rules, reconciled into Redis at start and at each reload).

use std::time::Duration;

/// `[scheduler]`: how far ahead the leader makes each schedule's occurrences, and
/// how many schedules a deployment keeps at most.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub horizon: Duration,
    /// Most schedules kept, declared and made through the API together.
    pub max_schedules: usize,
}

/// The least and most `scheduler.max_schedules` may be.
pub const MAX_SCHEDULES_RANGE: (i64, i64) = (1, 1_000_000);

impl SchedulerConfig {
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

    fn refused(toml: &str) -> String {
        Config::from_toml(toml, env(&[])).unwrap_err().to_string()
    }

    #[test]
    fn the_horizon_at_both_ends_and_within_the_records_retention() {
        for toml in [
            "[scheduler]\nhorizon = \"999ms\"",
            "[scheduler]\nhorizon = \"61m\"",
        ] {
            let err = refused(toml);
            assert!(err.contains("scheduler.horizon: must be 1s to 1h"), "{err}");
        }
        for (toml, retention_s, used_s) in [
            ("[scheduler]\nhorizon = \"1s\"", 86_400, 1),
            ("[scheduler]\nhorizon = \"1h\"", 86_400, 3_600),
            (
                "[scheduler]\nhorizon = \"1h\"\n[records]\nretention = \"10m\"",
                600,
                300,
            ),
            (
                "[scheduler]\nhorizon = \"1h\"\n[records]\nretention = \"0s\"",
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
            let used = c.scheduler.horizon_within(c.records.retention);
            assert_eq!(used, Duration::from_secs(used_s), "{toml}");
        }
    }

    #[test]
    fn the_most_schedules_at_both_ends() {
        for (toml, kept) in [
            ("", 10_000),
            ("[scheduler]\nmax_schedules = 1", 1),
            ("[scheduler]\nmax_schedules = 1000000", 1_000_000),
        ] {
            let c = Config::from_toml(toml, env(&[])).unwrap();
            assert_eq!(c.scheduler.max_schedules, kept, "{toml}");
        }
        for toml in [
            "[scheduler]\nmax_schedules = 0",
            "[scheduler]\nmax_schedules = 1000001",
        ] {
            let err = refused(toml);
            assert!(err.contains("scheduler.max_schedules"), "{err}");
        }
    }

    const NIGHTLY: &str = "[[schedules]]\nid = \"nightly\"\nstream = \"reports\"\npayload = \"go\"\ncron = \"0 3 * * *\"\ntimezone = \"Europe/Berlin\"\n";

    #[test]
    fn declared_schedules_are_read_and_marked_declared() {
        let toml = format!(
            "{NIGHTLY}[[schedules]]\nid = \"tick\"\nstream = \"ticks\"\nfields = {{ a = \"1\", b = \"2\" }}\nkey = \"k1\"\nevery = \"15m\"\nstart_at = \"2027-01-01T00:00:00Z\"\nend_at = 1830297600000\njitter = \"2s\"\nmisfire = \"all\"\nmax_catch_up = 3\npaused = true\n"
        );
        let c = Config::from_toml(&toml, env(&[])).unwrap();
        assert_eq!(c.schedules.len(), 2);
        let nightly = &c.schedules[0];
        assert_eq!(nightly.id, "nightly");
        assert!(nightly.declared);
        assert_eq!(nightly.fields, vec![("payload".into(), "go".into())]);
        assert_eq!(nightly.cron.as_deref(), Some("0 3 * * *"));
        assert_eq!(nightly.timezone.as_deref(), Some("Europe/Berlin"));
        assert_eq!(nightly.misfire, crate::schedule::Misfire::Skip);
        assert_eq!(nightly.max_catch_up, 10);
        let tick = &c.schedules[1];
        assert_eq!(
            tick.fields,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!(tick.key.as_deref(), Some("k1"));
        assert_eq!(tick.every, Some(Duration::from_secs(900)));
        assert_eq!(tick.start_at, Some(1_798_761_600_000));
        assert_eq!(tick.end_at, Some(1_830_297_600_000));
        assert_eq!(tick.jitter, Some(Duration::from_secs(2)));
        assert_eq!(tick.misfire, crate::schedule::Misfire::All);
        assert_eq!(tick.max_catch_up, 3);
        assert!(tick.paused);
    }

    #[test]
    fn a_declared_schedule_breaking_a_rule_is_refused_naming_it() {
        let with = |extra: &str| format!("{NIGHTLY}{extra}");
        for (toml, says) in [
            (
                NIGHTLY.replace("0 3 * * *", "0 0 31 2 *"),
                "schedules[0] (nightly): cron \"0 0 31 2 *\": never fires",
            ),
            (
                NIGHTLY.replace("Europe/Berlin", "Mars/Olympus"),
                "schedules[0] (nightly): ",
            ),
            (
                NIGHTLY.replace(
                    "cron = \"0 3 * * *\"\ntimezone = \"Europe/Berlin\"\n",
                    "every = \"999ms\"\n",
                ),
                "schedules[0] (nightly): every 999ms: must be at least 1s",
            ),
            (
                with("start_at = 20\nend_at = 10\n"),
                "schedules[0] (nightly): end_at 10: before start_at 20",
            ),
            (
                with("start_at = \"yesterday\"\n"),
                "schedules[0] (nightly): start_at \"yesterday\": not an RFC 3339 time",
            ),
            (
                with("misfire = \"later\"\n"),
                "schedules[0] (nightly): misfire \"later\": must be skip, once or all",
            ),
            (
                with("fields = { a = \"1\" }\n"),
                "schedules[0] (nightly): payload, fields: give one, not both",
            ),
            (
                NIGHTLY.replace("payload = \"go\"\n", ""),
                "schedules[0] (nightly): fields: required (or payload)",
            ),
            (
                NIGHTLY.replace("reports", "bad stream"),
                "schedules[0] (nightly): ",
            ),
            (
                format!("{NIGHTLY}[streams]\nallow = [\"orders\"]\n"),
                "schedules[0] (nightly): stream \"reports\": not in streams.allow",
            ),
            (
                format!("{NIGHTLY}{NIGHTLY}"),
                "schedules[1] (nightly): declared twice",
            ),
            (
                format!(
                    "[scheduler]\nmax_schedules = 1\n{NIGHTLY}{}",
                    NIGHTLY.replace("nightly", "other")
                ),
                "schedules: 2 declared, more than scheduler.max_schedules (1)",
            ),
            (
                NIGHTLY.replace("nightly", "no/slash"),
                "schedules[0] (no/slash): id",
            ),
        ] {
            let err = refused(&toml);
            assert!(err.contains(says), "{toml}\n{err}\nwants {says:?}");
        }
    }
}
