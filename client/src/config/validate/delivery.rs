//! Validation of `[delivery]`: its defaults, then each watched stream under
//! `[delivery.streams]` with the defaults filled in and its dead-letter stream checked.

use std::time::Duration;

use super::{LONG_CALL, cluster_same_slot, positive, positive_because};
use crate::config::raw::{RawDelivery, RawStreamDelivery};
use crate::config::{
    Config, ConfigError, DeliveryConfig, ForwarderConfig, RetryBackoff, StreamDelivery, invalid,
};
use crate::message::is_plain;

impl RawDelivery {
    pub(super) fn validate(
        self,
        forwarder: &ForwarderConfig,
        retention: Duration,
        cluster: bool,
    ) -> Result<DeliveryConfig, ConfigError> {
        let RawDelivery {
            groups,
            ack_timeout,
            max_attempts,
            backoff,
            backoff_max,
            backoff_jitter,
            sweep_interval,
            sweep_batch,
            streams,
        } = self;
        let defaults = StreamDelivery {
            stream: String::new(),
            groups: consumer_groups("delivery.groups", groups)?,
            ack_timeout: ack_timeout_at_least("delivery.ack_timeout", ack_timeout)?,
            max_attempts: positive("delivery.max_attempts", max_attempts, 1000)? as u32,
            backoff: retry_backoff("delivery", backoff, backoff_max, backoff_jitter)?,
            dead_letter_stream: String::new(),
        };
        if sweep_interval < Duration::from_millis(10) {
            return Err(invalid("delivery.sweep_interval", "must be at least 10ms"));
        }
        let sweep_batch =
            positive_because("delivery.sweep_batch", sweep_batch, 10_000, LONG_CALL)? as usize;

        let mut watched = Vec::with_capacity(streams.len());
        for (stream, raw) in streams {
            let key = format!("delivery.streams.{stream}");
            crate::message::validate_stream(&stream).map_err(|e| invalid(&key, e.to_string()))?;
            // Destructured in full, so a new override cannot be forgotten here.
            let RawStreamDelivery {
                groups,
                ack_timeout,
                max_attempts,
                backoff,
                backoff_max,
                backoff_jitter,
                dead_letter_stream,
            } = raw;
            let groups = match groups {
                Some(groups) => consumer_groups(&format!("{key}.groups"), groups)?,
                None => defaults.groups.clone(),
            };
            if groups.is_empty() {
                return Err(invalid(
                    &format!("{key}.groups"),
                    "no consumer group to watch (set it here or in delivery.groups)",
                ));
            }
            let (ack_timeout, ack_timeout_key) = match ack_timeout {
                Some(t) => {
                    let key = format!("{key}.ack_timeout");
                    (ack_timeout_at_least(&key, t)?, key)
                }
                None => (defaults.ack_timeout, "delivery.ack_timeout".to_owned()),
            };
            // The delivery record tells a stale entry from an older delivery of the
            // same message; once the record is forgotten a sweep could redeliver twice.
            if ack_timeout >= retention {
                return Err(invalid(
                    &ack_timeout_key,
                    format!(
                        "must be shorter than records.retention ({}) for watched stream {stream:?}",
                        crate::human::duration(retention)
                    ),
                ));
            }
            let max_attempts = match max_attempts {
                Some(n) => positive(&format!("{key}.max_attempts"), n, 1000)? as u32,
                None => defaults.max_attempts,
            };
            let backoff = retry_backoff(
                &key,
                backoff.unwrap_or(defaults.backoff.first),
                backoff_max.unwrap_or(defaults.backoff.max),
                backoff_jitter.unwrap_or(defaults.backoff.jitter),
            )?;
            let dead_letter_stream = match dead_letter_stream {
                Some(dead) => {
                    crate::message::validate_stream(&dead).map_err(|e| {
                        invalid(&format!("{key}.dead_letter_stream"), e.to_string())
                    })?;
                    dead
                }
                None => crate::config::default_dead_letter_stream(
                    &stream,
                    &forwarder.dead_letter_suffix,
                    cluster,
                ),
            };
            if dead_letter_stream == stream {
                return Err(invalid(
                    &format!("{key}.dead_letter_stream"),
                    "must differ from the stream itself",
                ));
            }
            watched.push(StreamDelivery {
                stream,
                groups,
                ack_timeout,
                max_attempts,
                backoff,
                dead_letter_stream,
            });
        }
        // Replay reads a stream's dead letters back into that stream, so two streams
        // sharing a dead-letter stream, or one stream's dead letters landing in another
        // watched stream, would mix messages up.
        for s in &watched {
            if let Some(other) = watched.iter().find(|o| {
                o.stream != s.stream
                    && (o.dead_letter_stream == s.dead_letter_stream
                        || o.stream == s.dead_letter_stream)
            }) {
                return Err(invalid(
                    &format!("delivery.streams.{}.dead_letter_stream", s.stream),
                    format!(
                        "{:?} is also used by stream {:?}; every watched stream needs a dead-letter stream of its own",
                        s.dead_letter_stream, other.stream
                    ),
                ));
            }
        }
        if !watched.is_empty() {
            // The sweep finds a message by the id on its entry, and counts attempts by it.
            if forwarder.id_field.is_none() {
                return Err(invalid(
                    "forwarder.id_field",
                    "must be set while [delivery.streams] watches streams (redelivery finds messages by it)",
                ));
            }
            if forwarder.attempt_field.is_none() {
                return Err(invalid(
                    "forwarder.attempt_field",
                    "must be set while [delivery.streams] watches streams (redelivery counts attempts by it)",
                ));
            }
        }
        // On Redis Cluster a script touches one slot: a watched stream and its
        // dead letters share it.
        if cluster {
            for s in &watched {
                let key = format!("delivery.streams.{}", s.stream);
                if let Some(refusal) = crate::store::cluster_stream_refusal(&s.stream) {
                    return Err(invalid(&key, refusal));
                }
                cluster_same_slot(
                    &format!("{key}.dead_letter_stream"),
                    &s.dead_letter_stream,
                    "its stream",
                    &s.stream,
                )?;
            }
        }
        Ok(DeliveryConfig {
            sweep_interval,
            sweep_batch,
            streams: watched,
        })
    }
}

impl Config {
    /// Refuses a reloaded file (`self`) whose `[delivery]` breaks a rule against
    /// the running values of the keys it depends on that change only at a restart
    /// (`records.retention`, the forwarder's fields and dead-letter suffix, the
    /// Redis mode): the file was checked against its own values of those, which
    /// are not the ones that keep running.
    pub fn check_reload(&self, running: &Config) -> Result<(), ConfigError> {
        let watched = &self.delivery.streams;
        let Some(first) = watched.first() else {
            return Ok(());
        };
        let restart = "changes only at a restart";
        let retention = running.records.retention;
        if let Some(s) = watched.iter().find(|s| s.ack_timeout >= retention) {
            return Err(invalid(
                &format!("delivery.streams.{}.ack_timeout", s.stream),
                format!(
                    "must be shorter than records.retention for watched stream {:?}: the running \
                     records.retention is {} ({restart})",
                    s.stream,
                    crate::human::duration(retention)
                ),
            ));
        }
        for (key, field) in [
            ("forwarder.id_field", &running.forwarder.id_field),
            ("forwarder.attempt_field", &running.forwarder.attempt_field),
        ] {
            if field.is_none() {
                return Err(invalid(
                    key,
                    format!(
                        "must be set while [delivery.streams] watches streams (such as {:?}); it \
                         {restart}, and the running configuration has none",
                        first.stream
                    ),
                ));
            }
        }
        if self.is_cluster() != running.is_cluster() {
            return Err(invalid(
                "redis.mode",
                format!("{restart}, and [delivery.streams] is checked against it: restart first"),
            ));
        }
        // A watched stream without a dead-letter stream of its own got one named
        // by the file's suffix; it must be the one the running suffix names.
        let default = |suffix: &str, stream: &str| {
            crate::config::default_dead_letter_stream(stream, suffix, self.is_cluster())
        };
        if let Some(s) = watched.iter().find(|s| {
            s.dead_letter_stream == default(&self.forwarder.dead_letter_suffix, &s.stream)
                && s.dead_letter_stream != default(&running.forwarder.dead_letter_suffix, &s.stream)
        }) {
            return Err(invalid(
                "forwarder.dead_letter_suffix",
                format!(
                    "{restart}, and names the dead-letter stream of watched stream {:?}: restart \
                     to change it, or give that stream a dead_letter_stream",
                    s.stream
                ),
            ));
        }
        Ok(())
    }
}

fn consumer_groups(key: &str, groups: Vec<String>) -> Result<Vec<String>, ConfigError> {
    for group in &groups {
        if group.is_empty() || !is_plain(group) {
            return Err(invalid(
                key,
                format!(
                    "{group:?}: a group name must be non-empty, without spaces or control characters"
                ),
            ));
        }
    }
    let mut unique = groups.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != groups.len() {
        return Err(invalid(key, "lists a group twice"));
    }
    Ok(groups)
}

fn ack_timeout_at_least(key: &str, timeout: Duration) -> Result<Duration, ConfigError> {
    if timeout < Duration::from_millis(10) {
        return Err(invalid(key, "must be at least 10ms"));
    }
    Ok(timeout)
}

fn retry_backoff(
    section: &str,
    first: Duration,
    max: Duration,
    jitter: f64,
) -> Result<RetryBackoff, ConfigError> {
    if max < first {
        return Err(invalid(
            &format!("{section}.backoff_max"),
            format!(
                "must not be shorter than {section}.backoff ({})",
                crate::human::duration(first)
            ),
        ));
    }
    if !(0.0..=1.0).contains(&jitter) {
        return Err(invalid(
            &format!("{section}.backoff_jitter"),
            format!("must be 0 to 1 (got {jitter})"),
        ));
    }
    Ok(RetryBackoff { first, max, jitter })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::env;

    #[test]
    fn delivery_streams_inherit_the_defaults() {
        let c = Config::from_toml(
            "[delivery]\ngroups = [\"workers\"]\nack_timeout = \"30s\"\n\
             [delivery.streams.orders]\n\
             [delivery.streams.billing]\ngroups = [\"a\", \"b\"]\nmax_attempts = 3\nbackoff = \"2s\"\ndead_letter_stream = \"billing-failed\"\n",
            env(&[]),
        )
        .unwrap();
        let names: Vec<_> = c
            .delivery
            .streams
            .iter()
            .map(|s| s.stream.as_str())
            .collect();
        assert_eq!(names, ["billing", "orders"]);
        let orders = c.delivery.stream("orders").unwrap();
        assert_eq!(orders.groups, ["workers"]);
        assert_eq!(orders.ack_timeout, Duration::from_secs(30));
        assert_eq!(orders.max_attempts, 10);
        assert_eq!(orders.dead_letter_stream, "orders:dead");
        let billing = c.delivery.stream("billing").unwrap();
        assert_eq!(billing.groups, ["a", "b"]);
        assert_eq!(billing.ack_timeout, Duration::from_secs(30));
        assert_eq!(billing.max_attempts, 3);
        assert_eq!(billing.backoff.first, Duration::from_secs(2));
        assert_eq!(billing.backoff.max, Duration::from_secs(300));
        assert_eq!(c.dead_letter_stream("billing"), "billing-failed");
        assert_eq!(c.dead_letter_stream("unwatched"), "unwatched:dead");
    }
}

#[cfg(test)]
mod reload_tests {
    use crate::config::Config;
    use crate::config::tests::env;

    const WATCHED: &str = "[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"3s\"\n";

    /// A running file, a reloaded one, and the key a refusal names (None: taken).
    #[rustfmt::skip]
    const CASES: &[(&str, &str, Option<&str>)] = &[
        ("", WATCHED, None),
        ("[records]\nretention = \"10s\"\n", "[records]\nretention = \"10s\"\n[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"9s\"\n", None),
        // The file's longer retention does not run until a restart.
        ("[records]\nretention = \"10s\"\n", "[records]\nretention = \"1h\"\n[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"30s\"\n", Some("delivery.streams.orders.ack_timeout")),
        ("[records]\nretention = \"10s\"\n", "[records]\nretention = \"1h\"\n[delivery]\nack_timeout = \"10s\"\n[delivery.streams.orders]\ngroups = [\"g\"]\n", Some("delivery.streams.orders.ack_timeout")),
        ("[forwarder]\nid_field = \"\"\n", WATCHED, Some("forwarder.id_field")),
        ("[forwarder]\nattempt_field = \"\"\n", WATCHED, Some("forwarder.attempt_field")),
        // Without watched streams nothing depends on them.
        ("[forwarder]\nid_field = \"\"\n", "[forwarder]\nid_field = \"\"\n[streams]\ndefault_maxlen = 5\n", None),
        ("[forwarder]\ndead_letter_suffix = \":dlq\"\n", WATCHED, Some("forwarder.dead_letter_suffix")),
        ("[forwarder]\ndead_letter_suffix = \":dlq\"\n", "[forwarder]\ndead_letter_suffix = \":dlq\"\n[delivery.streams.orders]\ngroups = [\"g\"]\n", None),
        // A dead-letter stream of its own does not depend on the suffix.
        ("[forwarder]\ndead_letter_suffix = \":dlq\"\n", "[delivery.streams.orders]\ngroups = [\"g\"]\ndead_letter_stream = \"failed\"\n", None),
    ];

    #[test]
    fn a_reload_is_checked_against_the_running_restart_only_values() {
        for (running, file, refused) in CASES {
            let running = Config::from_toml(running, env(&[])).unwrap();
            let file = Config::from_toml(file, env(&[])).unwrap();
            let got = file.check_reload(&running);
            match (&got, refused) {
                (Ok(()), None) => {}
                (Err(crate::config::ConfigError::Invalid { key, .. }), Some(want)) => {
                    assert_eq!(key, want, "{file:?}")
                }
                _ => panic!("{running:?} then {file:?}: {got:?}, wanted {refused:?}"),
            }
        }
    }
}
