//! Validation of `[forwarder]`: batch size, idle wake-up, overall rate, the
//! fields it adds to each entry and the dead-letter suffix.

use super::*;

impl RawForwarder {
    pub(super) fn validate(self) -> Result<ForwarderConfig, ConfigError> {
        let RawForwarder {
            batch_size,
            idle_wakeup,
            id_field,
            attempt_field,
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
        Ok(ForwarderConfig {
            batch_size,
            idle_wakeup,
            id_field: optional_field("forwarder.id_field", id_field)?,
            attempt_field: optional_field("forwarder.attempt_field", attempt_field)?,
            dead_letter_suffix,
            max_rate,
        })
    }
}
