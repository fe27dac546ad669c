//! Validation of `[inbox]`: its stream, group and rejected stream (defaults from
//! `redis.prefix`; on Redis Cluster the rejected stream in the inbox's slot), and
//! its batch and reclaim time. Off: no inbox.

use super::*;

impl RawInbox {
    pub(super) fn validate(self, redis: &RedisConfig) -> Result<Option<InboxConfig>, ConfigError> {
        let RawInbox {
            enabled,
            stream: inbox_stream,
            group: inbox_group,
            rejected_stream,
            batch_size: inbox_batch_size,
            reclaim_after,
        } = self;
        let inbox_stream = inbox_stream.unwrap_or_else(|| format!("{}:inbox", redis.prefix));
        let inbox_group = inbox_group.unwrap_or_else(|| redis.prefix.clone());
        let rejected_default = match &redis.cluster {
            // In the inbox's slot: the rejection script writes both.
            Some(_) => crate::store::cluster_dead_letter_stream(&inbox_stream, ":rejected"),
            None => None,
        };
        let rejected_stream = rejected_stream
            .or(rejected_default)
            .unwrap_or_else(|| format!("{}:inbox:rejected", redis.prefix));
        if !enabled {
            return Ok(None);
        }
        if redis.cluster.is_some() {
            cluster_same_slot(
                "inbox.rejected_stream",
                &rejected_stream,
                "inbox.stream",
                &inbox_stream,
            )?;
        }
        for (key, value) in [
            ("inbox.stream", &inbox_stream),
            ("inbox.group", &inbox_group),
            ("inbox.rejected_stream", &rejected_stream),
        ] {
            if value.is_empty() || !is_plain(value) {
                return Err(invalid(
                    key,
                    format!("{value:?}: must be non-empty, without spaces or control characters"),
                ));
            }
        }
        if rejected_stream == inbox_stream {
            return Err(invalid(
                "inbox.rejected_stream",
                "must differ from inbox.stream (rejected entries would be read again)",
            ));
        }
        if reclaim_after < Duration::from_millis(100) {
            return Err(invalid("inbox.reclaim_after", "must be at least 100ms"));
        }
        Ok(Some(InboxConfig {
            stream: inbox_stream,
            group: inbox_group,
            rejected_stream,
            batch_size: positive_because("inbox.batch_size", inbox_batch_size, 5000, LONG_CALL)?
                as usize,
            reclaim_after,
        }))
    }
}
