//! Whether Redis may evict delayq's keys. delayq's data keys carry no expiry, so
//! `noeviction` and the `volatile-*` policies leave them be; an `allkeys-*` policy
//! with a `maxmemory` set evicts them when Redis is full, and with them pending
//! messages, their index and the records that catch a repeated id. Near its
//! `maxmemory` Redis refuses writes (OOM): [`Memory::nearly_full`] says so first.

use redis::Value;

use super::libraries::info_value;
use super::{Result, Store, text};

/// What the masters' `INFO memory` says of delayq's room there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Each master (named by its address on Redis Cluster) whose memory settings
    /// can evict delayq's keys, with those settings.
    pub evicting: Vec<String>,
    /// Each master whose `used_memory` is past [`NEARLY_FULL`] of its
    /// `maxmemory`, as "used 97% of maxmemory 1048576".
    pub nearly_full: Vec<String>,
}

/// The share of `maxmemory` past which a master is called nearly full: Redis
/// refuses writes (OOM) at 100%, and a batch needs room a probe write does not.
pub const NEARLY_FULL: f64 = 0.95;

impl Store {
    /// What every master's memory settings and use say (see [`Memory`]); empty
    /// when this user may not run `INFO` (nothing can be told).
    pub async fn memory(&self) -> Result<Memory> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let replies = match self.conn.on_every_master(info).await {
            Ok(replies) => replies,
            Err(e) if e.code() == Some("NOPERM") => return Ok(Memory::default()),
            Err(e) => return Err(e.into()),
        };
        let mut memory = Memory::default();
        for (node, reply) in replies {
            let info = match reply {
                Value::Nil => continue,
                reply => text(&reply)?,
            };
            let named = |what: String| match &node {
                Some(node) => format!("{node}: {what}"),
                None => what,
            };
            if let Some(settings) = evicts(&info) {
                memory.evicting.push(named(settings));
            }
            if let Some(full) = nearly_full(&info) {
                memory.nearly_full.push(named(full));
            }
        }
        memory.evicting.sort();
        memory.nearly_full.sort();
        Ok(memory)
    }
}

/// "used 97% of maxmemory 1048576" when an `INFO memory` text's `used_memory`
/// is past [`NEARLY_FULL`] of a `maxmemory` that is set.
pub(super) fn nearly_full(info: &str) -> Option<String> {
    let used: u64 = info_value(info, "used_memory")?.parse().ok()?;
    let max: u64 = info_value(info, "maxmemory")?.parse().ok()?;
    let share = used as f64 / max as f64;
    (max > 0 && share > NEARLY_FULL)
        .then(|| format!("used {:.0}% of maxmemory {max}", share * 100.0))
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
    fn a_master_is_nearly_full_past_95_percent_of_a_set_maxmemory() {
        let text = |used: u64, max: u64| format!("used_memory:{used}\r\nmaxmemory:{max}\r\n");
        let cases = [
            (1000, 0, None),
            (0, 0, None),
            (950, 1000, None),
            (951, 1000, Some("used 95% of maxmemory 1000")),
            (999, 1000, Some("used 100% of maxmemory 1000")),
            (2000, 1000, Some("used 200% of maxmemory 1000")),
            (
                u64::MAX,
                u64::MAX,
                Some("used 100% of maxmemory 18446744073709551615"),
            ),
            (0, u64::MAX, None),
        ];
        for (used, max, full) in cases {
            assert_eq!(
                nearly_full(&text(used, max)).as_deref(),
                full,
                "{used} of {max}"
            );
        }
        assert_eq!(nearly_full("maxmemory:10\r\n"), None);
        assert_eq!(nearly_full("used_memory:x\r\nmaxmemory:10\r\n"), None);
    }

    #[test]
    fn a_text_without_the_fields_tells_nothing() {
        assert_eq!(evicts(""), None);
        assert_eq!(evicts("maxmemory_policy:allkeys-lru\r\n"), None);
        assert_eq!(evicts(&info("lots", "allkeys-lru")), None);
    }
}
