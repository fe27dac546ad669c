//! The effective configuration: every key with its value after defaults and
//! environment overrides, as check-config prints it and a reload compares it,
//! secrets redacted.

use std::path::Path;

use super::env::read_raw;
use super::{Config, ConfigError};
use crate::secret;

/// Key names whose values are secrets wherever they appear: printed as `<redacted>`.
const SECRET_KEY_PARTS: &[&str] = &["token", "password", "secret"];

impl Config {
    /// Like [`Config::from_toml`], and also returns the effective configuration as
    /// a table: every key with its value after defaults and environment overrides,
    /// secrets redacted.
    pub fn effective(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, toml::Table), ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let blame = |e| super::env::blame_env(&env, e);
        let raw = read_raw(text, env.iter().cloned()).map_err(blame)?;
        let mut effective = toml::Table::try_from(&raw)
            .map_err(|e| ConfigError::Parse(format!("render the configuration: {e}")))?;
        let config = raw.validate().map_err(blame)?;
        // Values chosen during validation, shown as they will be used.
        set_key(&mut effective, "node", "id", config.node_id.clone().into());
        if let Some(inbox) = &config.inbox {
            for (key, value) in [
                ("stream", &inbox.stream),
                ("group", &inbox.group),
                ("rejected_stream", &inbox.rejected_stream),
            ] {
                set_key(&mut effective, "inbox", key, value.clone().into());
            }
        }
        if !config.is_cluster() {
            set_key(
                &mut effective,
                "redis",
                "shards",
                i64::from(config.redis.shards).into(),
            );
        }
        if let Some(etcd) = &config.etcd {
            set_key(
                &mut effective,
                "etcd",
                "prefix",
                etcd.election_prefix.clone().into(),
            );
        }
        if config.election.per_shard {
            set_key(
                &mut effective,
                "election",
                "groups",
                i64::from(config.election.groups).into(),
            );
        }
        redact(&mut effective);
        plain_long_durations(&mut effective);
        Ok((config, effective))
    }

    /// Reads a file and returns [`Config::effective`] of it, with this process's environment.
    pub fn load_effective(path: &Path) -> Result<(Config, toml::Table), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::effective(&text, std::env::vars())
    }
}

/// Durations of a month or more render in calendar units ("365days" becomes
/// "11months 30days 3h 50m 24s"); shows them in days and smaller units instead.
fn plain_long_durations(table: &mut toml::Table) {
    for (_, value) in table.iter_mut() {
        match value {
            toml::Value::Table(t) => plain_long_durations(t),
            toml::Value::String(s) if s.contains("month") || s.contains("year") => {
                if let Ok(d) = humantime::parse_duration(s) {
                    let secs = d.as_secs();
                    let units = [
                        (secs / 86_400, "d"),
                        (secs % 86_400 / 3600, "h"),
                        (secs % 3600 / 60, "m"),
                        (secs % 60, "s"),
                        (u64::from(d.subsec_millis()), "ms"),
                    ];
                    let parts: Vec<String> = units
                        .iter()
                        .filter(|(n, _)| *n > 0)
                        .map(|(n, unit)| format!("{n}{unit}"))
                        .collect();
                    *s = parts.join(" ");
                }
            }
            _ => {}
        }
    }
}

fn set_key(table: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    if let Some(toml::Value::Table(t)) = table.get_mut(section) {
        t.insert(key.to_owned(), value);
    }
}

/// Replaces secrets in a configuration table: values of keys named like a secret,
/// and passwords inside URLs (`redis://user:secret@host` → `redis://user:<redacted>@host`).
pub fn redact(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        let secret = SECRET_KEY_PARTS
            .iter()
            .any(|part| key.to_ascii_lowercase().contains(part));
        redact_value(value, secret);
    }
}

fn redact_value(value: &mut toml::Value, secret: bool) {
    match value {
        toml::Value::Table(t) if secret => {
            t.iter_mut().for_each(|(_, v)| redact_value(v, true));
        }
        toml::Value::Table(t) => redact(t),
        toml::Value::Array(items) => items.iter_mut().for_each(|v| redact_value(v, secret)),
        toml::Value::String(s) if secret => *s = "<redacted>".into(),
        toml::Value::String(s) => {
            if let Some(clean) = secret::redacted(s) {
                *s = clean;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::redact;
    use crate::config::Config;
    use crate::config::tests::env;

    #[test]
    fn the_effective_configuration_fills_defaults_and_hides_secrets() {
        let (config, table) = Config::effective(
            "[redis]\nurl = \"redis://app:hunter2@db:6379\"\n[etcd]\nendpoints = [\"http://e:2379\"]",
            env(&[("DELAYQ_REDIS_SHARDS", "8"), ("DELAYQ_NODE_ID", "n1")]),
        )
        .unwrap();
        assert_eq!(config.redis.url.expose(), "redis://app:hunter2@db:6379");
        let text = toml::to_string(&table).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(
            table["redis"]["url"].as_str(),
            Some("redis://app:<redacted>@db:6379")
        );
        assert_eq!(table["redis"]["shards"].as_integer(), Some(8));
        assert_eq!(table["node"]["id"].as_str(), Some("n1"));
        assert_eq!(
            table["etcd"]["prefix"].as_str(),
            Some("/delayq/default/leader")
        );
        assert_eq!(table["etcd"]["lease_ttl"].as_str(), Some("6s"));
        assert_eq!(table["forwarder"]["batch_size"].as_integer(), Some(200));
        assert_eq!(table["api"]["max_delay"].as_str(), Some("365d"));
        // Keys named like secrets are hidden whole, wherever they are.
        let mut t: toml::Table = "[api]\ntokens = [\"abc\"]\n[x]\npassword = \"pw\""
            .parse()
            .unwrap();
        redact(&mut t);
        assert_eq!(t["api"]["tokens"][0].as_str(), Some("<redacted>"));
        assert_eq!(t["x"]["password"].as_str(), Some("<redacted>"));
        // The rendering reads back as the same configuration.
        let again = Config::from_toml(&text.replace("<redacted>", "pw"), env(&[])).unwrap();
        assert_eq!(again.redis.shards, 8);
        assert_eq!(again.etcd.unwrap().lease_ttl, Duration::from_secs(6));
    }
}
