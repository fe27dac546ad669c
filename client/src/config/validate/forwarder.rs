//! Validation of `[forwarder]`: batch size, idle wake-up, overall rate, the
//! fields it adds to each entry (each once) and the dead-letter suffix.

use super::*;

impl RawForwarder {
    pub(super) fn validate(self) -> Result<ForwarderConfig, ConfigError> {
        let RawForwarder {
            batch_size,
            idle_wakeup,
            id_field,
            attempt_field,
            key_field,
            dead_letter_suffix,
            max_rate,
        } = self;
        let batch_size =
            positive_because("forwarder.batch_size", batch_size, 10_000, LONG_CALL)? as usize;
        if idle_wakeup < Duration::from_millis(10) {
            return Err(invalid("forwarder.idle_wakeup", "must be at least 10ms"));
        }
        let max_rate = non_negative("forwarder.max_rate", max_rate)?;
        if max_rate > MAX_RATE {
            return Err(invalid(
                "forwarder.max_rate",
                format!("must be 0 (no limit) to {MAX_RATE} (got {max_rate})"),
            ));
        }
        if dead_letter_suffix.is_empty() {
            return Err(invalid(
                "forwarder.dead_letter_suffix",
                "must not be empty (dead letters would go to the stream itself)",
            ));
        }
        let id_field = optional_field("forwarder.id_field", id_field)?;
        let attempt_field = optional_field("forwarder.attempt_field", attempt_field)?;
        let key_field = optional_field("forwarder.key_field", key_field)?;
        // An entry carries each of them once.
        for (key, a, other, b) in [
            (
                "forwarder.attempt_field",
                &attempt_field,
                "forwarder.id_field",
                &id_field,
            ),
            (
                "forwarder.key_field",
                &key_field,
                "forwarder.id_field",
                &id_field,
            ),
            (
                "forwarder.key_field",
                &key_field,
                "forwarder.attempt_field",
                &attempt_field,
            ),
        ] {
            if let (Some(a), Some(b)) = (a, b)
                && a == b
            {
                return Err(invalid(
                    key,
                    format!("{a:?} is {other} already; name another field"),
                ));
            }
        }
        Ok(ForwarderConfig {
            batch_size,
            idle_wakeup,
            id_field,
            attempt_field,
            key_field,
            dead_letter_suffix,
            max_rate,
        })
    }
}
