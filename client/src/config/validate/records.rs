//! Validation of `[records]` (retention, trim interval, layout) and the
//! `*.layout` settings `[pending]` shares.

use super::*;

impl RawRecords {
    pub(super) fn validate(self) -> Result<RecordsConfig, ConfigError> {
        let RawRecords {
            retention,
            trim_interval,
            layout: records_layout,
            finished_list,
        } = self;
        if trim_interval < Duration::from_millis(100) {
            return Err(invalid("records.trim_interval", "must be at least 100ms"));
        }
        if retention > MAX_RETENTION {
            return Err(invalid(
                "records.retention",
                format!(
                    "must be 0s (no records) to {} (got {})",
                    crate::human::duration(MAX_RETENTION),
                    crate::human::duration(retention)
                ),
            ));
        }
        Ok(RecordsConfig {
            retention,
            trim_interval,
            layout: layout(
                "records.layout",
                &records_layout,
                RecordLayout::Compact,
                RecordLayout::Hash,
            )?,
            finished_list,
        })
    }
}

/// A `*.layout` setting: "compact" or "hash".
pub(super) fn layout<T>(key: &str, value: &str, compact: T, hash: T) -> Result<T, ConfigError> {
    match value {
        "compact" => Ok(compact),
        "hash" => Ok(hash),
        other => Err(invalid(
            key,
            format!("{other:?}: must be \"compact\" or \"hash\""),
        )),
    }
}
