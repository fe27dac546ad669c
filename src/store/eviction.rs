//! Whether Redis may evict delayq's keys. delayq's data keys carry no expiry, so
//! `noeviction` and the `volatile-*` policies leave them be; an `allkeys-*` policy
//! with a `maxmemory` set evicts them when Redis is full, and with them pending
//! messages, their index and the records that catch a repeated id.

use redis::Value;

use super::libraries::info_value;
use super::{Result, Store, text};

impl Store {
    /// Each master (named by its address on Redis Cluster) whose memory settings
    /// can evict delayq's keys, with those settings: empty when none can. Empty too
    /// when this user may not run `INFO` (nothing can be told).
    pub async fn evicting_masters(&self) -> Result<Vec<String>> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let replies = match self.conn.on_every_master(info).await {
            Ok(replies) => replies,
            Err(e) if e.code() == Some("NOPERM") => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut evicting = Vec::new();
        for (node, reply) in replies {
            let info = match reply {
                Value::Nil => continue,
                reply => text(&reply)?,
            };
            if let Some(settings) = evicts(&info) {
                evicting.push(match node {
                    Some(node) => format!("{node}: {settings}"),
                    None => settings,
                });
            }
        }
        evicting.sort();
        Ok(evicting)
    }
}

/// The settings of an `INFO memory` text that evict keys without an expiry, as
/// "maxmemory-policy allkeys-lru with maxmemory 1048576"; None when Redis keeps them.
pub(super) fn evicts(info: &str) -> Option<String> {
    let policy = info_value(info, "maxmemory_policy")?;
    let maxmemory: u64 = info_value(info, "maxmemory")?.parse().ok()?;
    (maxmemory > 0 && policy.starts_with("allkeys-"))
        .then(|| format!("maxmemory-policy {policy} with maxmemory {maxmemory}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(maxmemory: &str, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1000\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\n\
             maxmemory_policy:{policy}\r\n"
        )
    }

    #[test]
    fn only_allkeys_policies_under_a_limit_evict() {
        let cases = [
            ("0", "noeviction", false),
            ("0", "allkeys-lru", false),
            ("1", "noeviction", false),
            ("1048576", "volatile-lru", false),
            ("1048576", "volatile-lfu", false),
            ("1048576", "volatile-random", false),
            ("1048576", "volatile-ttl", false),
            ("1", "allkeys-lru", true),
            ("1048576", "allkeys-lfu", true),
            ("18446744073709551615", "allkeys-random", true),
        ];
        for (maxmemory, policy, evicting) in cases {
            let found = evicts(&info(maxmemory, policy));
            assert_eq!(found.is_some(), evicting, "{maxmemory} {policy}");
            if let Some(found) = found {
                assert_eq!(
                    found,
                    format!("maxmemory-policy {policy} with maxmemory {maxmemory}")
                );
            }
        }
    }

    #[test]
    fn a_text_without_the_fields_tells_nothing() {
        assert_eq!(evicts(""), None);
        assert_eq!(evicts("maxmemory_policy:allkeys-lru\r\n"), None);
        assert_eq!(evicts(&info("lots", "allkeys-lru")), None);
    }
}
