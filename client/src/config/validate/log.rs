//! Validation of `[log]`: the level as a tracing filter, the format.

use super::*;

impl RawLog {
    pub(super) fn validate(self) -> Result<LogConfig, ConfigError> {
        let RawLog { level, format } = self;
        tracing_subscriber::EnvFilter::try_new(&level)
            .map_err(|e| invalid("log.level", format!("{level:?}: {e}")))?;
        let json = match format.as_str() {
            "text" => false,
            "json" => true,
            other => {
                return Err(invalid(
                    "log.format",
                    format!("{other:?}: must be \"text\" or \"json\""),
                ));
            }
        };
        Ok(LogConfig { level, json })
    }
}
