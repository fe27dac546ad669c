//! Validation of `[streams]`: the allow list's patterns, the trim lengths and the
//! per-stream rates.

use super::*;

impl RawStreams {
    pub(super) fn validate(self) -> Result<StreamsConfig, ConfigError> {
        let RawStreams {
            allow,
            default_maxlen,
            maxlen,
            max_rate,
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
        Ok(StreamsConfig {
            allow,
            default_maxlen,
            maxlen,
            max_rate,
        })
    }
}
