//! Environment overrides: `DELAYQ_<SECTION>_<KEY>` written into the parsed TOML
//! table (lists comma-separated) before it becomes the raw structs.

use super::raw::Raw;
use super::{ConfigError, invalid};

/// Sections whose keys the environment may override.
const SECTIONS: &[&str] = &[
    "node",
    "redis",
    "etcd",
    "api",
    "streams",
    "forwarder",
    "records",
    "pending",
    "election",
    "log",
    "delivery",
    "inbox",
    "journal",
];
/// Keys that hold lists; their environment values are comma-separated.
const LIST_KEYS: &[&str] = &[
    "redis.nodes",
    "etcd.endpoints",
    "streams.allow",
    "delivery.groups",
    "api.tokens",
    "api.write_tokens",
    "api.read_tokens",
];

/// The raw configuration of TOML `text` with the `DELAYQ_*` overrides of `env`
/// applied: the step both [`super::Config::from_toml`] and the effective view start with.
pub(super) fn read_raw(
    text: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Raw, ConfigError> {
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
    apply_env(&mut table, env)?;
    table
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))
}

pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("DELAYQ_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        let Some((section, key)) = rest.split_once('_') else {
            continue;
        };
        if !SECTIONS.contains(&section) {
            continue;
        }
        let dotted = format!("{section}.{key}");
        let value = if LIST_KEYS.contains(&dotted.as_str()) {
            toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_owned()))
                    .collect(),
            )
        } else {
            // A number or boolean where TOML reads one; a plain string otherwise.
            match format!("v = {value}").parse::<toml::Table>() {
                Ok(mut t)
                    if !matches!(
                        t.get("v"),
                        Some(toml::Value::Array(_) | toml::Value::Table(_))
                    ) =>
                {
                    t.remove("v").expect("parsed key")
                }
                _ => toml::Value::String(value.clone()),
            }
        };
        let section_table = table
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section_table {
            toml::Value::Table(t) => {
                t.insert(key.to_owned(), value);
            }
            _ => return Err(invalid(section, format!("must be a table to apply {name}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::env;

    #[test]
    fn environment_overrides_the_file() {
        let c = Config::from_toml(
            "[redis]\nurl = \"redis://file:6379\"\nshards = 4",
            env(&[
                ("DELAYQ_REDIS_URL", "redis://env:6379"),
                ("DELAYQ_ETCD_ENDPOINTS", "http://a:2379, http://b:2379"),
                ("DELAYQ_ETCD_LEASE_TTL", "3s"),
                ("DELAYQ_NODE_ID", "n7"),
                ("DELAYQ_STREAMS_ALLOW", "orders,billing*"),
                ("UNRELATED", "x"),
                ("DELAYQ_TEST_SOMETHING", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(c.redis.url.expose(), "redis://env:6379");
        assert_eq!(c.redis.shards, 4);
        assert_eq!(c.node_id, "n7");
        let etcd = c.etcd.unwrap();
        assert_eq!(etcd.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!(etcd.lease_ttl, Duration::from_secs(3));
        assert_eq!(etcd.election_prefix, "/delayq/default/leader");
        assert!(c.streams.allows("billing-eu") && !c.streams.allows("payroll"));
    }
}
