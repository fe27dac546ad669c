//! Validation of `[streams]`: the allow list's patterns, the trim lengths, the
//! per-stream rates and key fields.

use super::*;

impl RawStreams {
    pub(super) fn validate(self) -> Result<StreamsConfig, ConfigError> {
        let RawStreams {
            allow,
            default_maxlen,
            maxlen,
            max_rate,
            key_field,
        } = self;
        if let Some(bad) = allow.iter().find(|p| p.is_empty()) {
            return Err(invalid(
                "streams.allow",
                format!("{bad:?}: an empty pattern matches nothing"),
            ));
        }
        let default_maxlen = non_negative("streams.default_maxlen", default_maxlen)?;
        let maxlen = maxlen
            .into_iter()
            .map(|(stream, n)| {
                Ok((
                    stream.clone(),
                    non_negative(&format!("streams.maxlen.{stream}"), n)?,
                ))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let max_rate = max_rate
            .into_iter()
            .map(|(stream, n)| {
                let key = format!("streams.max_rate.{stream}");
                Ok((stream, positive(&key, n, MAX_RATE as i64)? as u64))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let key_field = key_field
            .into_iter()
            .map(|(stream, field)| {
                let key = format!("streams.key_field.{stream}");
                Ok((stream, optional_field(&key, field)?))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Ok(StreamsConfig {
            allow,
            default_maxlen,
            maxlen,
            max_rate,
            key_field,
        })
    }
}

/// A stream's key field is not one of the fields every entry already carries.
pub(super) fn check_key_fields(
    streams: &StreamsConfig,
    forwarder: &ForwarderConfig,
) -> Result<(), ConfigError> {
    for (stream, field) in &streams.key_field {
        let Some(field) = field else { continue };
        for (other, name) in [
            ("forwarder.id_field", &forwarder.id_field),
            ("forwarder.attempt_field", &forwarder.attempt_field),
        ] {
            if name.as_deref() == Some(field.as_str()) {
                return Err(invalid(
                    &format!("streams.key_field.{stream}"),
                    format!("{field:?} is {other} already; name another field"),
                ));
            }
        }
    }
    Ok(())
}
