//! Environment overrides: `DELAYQ_<SECTION>_<KEY>` written into the parsed TOML
//! table (lists comma-separated; tables such as `streams.maxlen` as a TOML inline
//! table, merged into the file's key by key) before it becomes the raw structs.

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
    "metrics",
    "scheduler",
];
/// Keys that hold tables; their environment values are TOML inline tables
/// (`{ orders = 100000 }`), merged into the file's table key by key.
const TABLE_KEYS: &[&str] = &[
    "redis.sentinel",
    "streams.maxlen",
    "streams.max_rate",
    "streams.key_field",
    "delivery.streams",
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
        .map_err(|e: toml::de::Error| ConfigError::Parse(one_line(text, &e)))?;
    apply_env(&mut table, env)?;
    table
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse(one_line(text, &e)))
}

/// `e` with the environment variable named, when the key it is about (or the
/// table holding it) was set by one: `redis.shards (from DELAYQ_REDIS_SHARDS):
/// must be 1 to 1024`, rather than blaming the file for it.
pub(super) fn blame_env(env: &[(String, String)], e: ConfigError) -> ConfigError {
    let set_by = |key: &str| {
        env.iter().find_map(|(name, _)| {
            let (section, rest) = env_key(name)?;
            let dotted = format!("{section}.{rest}");
            let covers = key == dotted || key.starts_with(&format!("{dotted}."));
            covers.then(|| name.clone())
        })
    };
    match e {
        ConfigError::Invalid { key, problem } => match set_by(&key) {
            Some(name) => ConfigError::Invalid {
                key: format!("{key} (from {name})"),
                problem,
            },
            None => ConfigError::Invalid { key, problem },
        },
        ConfigError::Parse(text) => {
            let key = text.split_once(": ").map(|(k, _)| k.to_owned());
            match key.as_deref().and_then(|k| Some((k, set_by(k)?))) {
                Some((key, name)) => {
                    ConfigError::Parse(text.replacen(key, &format!("{key} (from {name})"), 1))
                }
                None => ConfigError::Parse(text),
            }
        }
        other => other,
    }
}

/// The keys (`section.key`) that variables of `env` override, each with its
/// variable's name, in the order given.
pub fn overridden(env: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    env.into_iter()
        .filter_map(|(name, _)| {
            let (section, key) = env_key(&name)?;
            Some((format!("{section}.{key}"), name))
        })
        .collect()
}

/// The section and key a `DELAYQ_<SECTION>_<KEY>` variable overrides, lowercase;
/// None for any other name.
fn env_key(name: &str) -> Option<(String, String)> {
    let rest = name.strip_prefix("DELAYQ_")?.to_ascii_lowercase();
    let (section, key) = rest.split_once('_')?;
    SECTIONS
        .contains(&section)
        .then(|| (section.to_owned(), key.to_owned()))
}

/// A TOML error on one line: where (the line and column, or the key), then what.
/// An unknown key reads `redis.urll: unknown key (known: url, ...)`.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', "; ");
    if let Some(span) = e.span() {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        return format!("line {line}, column {column}: {message}");
    }
    // Without a position the error's text ends with the table it is about: "in `redis`".
    let shown = e.to_string();
    let section = shown
        .lines()
        .filter_map(|l| l.strip_prefix("in `")?.strip_suffix('`'))
        .next_back();
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((key, known)) = rest.split_once("`, expected one of ")
    {
        let dotted = section.map_or(key.to_owned(), |s| format!("{s}.{key}"));
        return format!("{dotted}: unknown key (known: {})", known.replace('`', ""));
    }
    match section {
        Some(section) => format!("{section}: {message}"),
        None => message,
    }
}

pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    for (name, value) in env {
        let Some((section, key)) = env_key(&name) else {
            continue;
        };
        let dotted = format!("{section}.{key}");
        let value = if TABLE_KEYS.contains(&dotted.as_str()) {
            match format!("v = {value}").parse::<toml::Table>() {
                Ok(mut t) if t.get("v").is_some_and(toml::Value::is_table) => {
                    t.remove("v").expect("parsed key")
                }
                _ => {
                    return Err(invalid(
                        &dotted,
                        "must be a TOML inline table such as { orders = 1000 }",
                    ));
                }
            }
        } else if LIST_KEYS.contains(&dotted.as_str()) {
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
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match section_table {
            toml::Value::Table(t) => match (t.get_mut(&key), value) {
                (Some(toml::Value::Table(file)), toml::Value::Table(env)) => merge(file, env),
                (_, value) => {
                    t.insert(key, value);
                }
            },
            _ => {
                return Err(invalid(
                    &section,
                    format!("must be a table to apply {name}"),
                ));
            }
        }
    }
    Ok(())
}

/// Writes `from` into `into` key by key, tables within tables likewise.
fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(value)) => merge(inner, value),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
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

    #[test]
    fn tables_come_from_the_environment_as_inline_tables_merged_into_the_file() {
        let c = Config::from_toml(
            "[streams.maxlen]\nbilling = 500\norders = 7\n[delivery.streams.orders]\ngroups = [\"g\"]\nmax_attempts = 2",
            env(&[
                ("DELAYQ_STREAMS_MAXLEN", "{ orders = 1000, \"audit:eu\" = 9 }"),
                ("DELAYQ_DELIVERY_STREAMS", "{ orders = { ack_timeout = \"1m\" } }"),
            ]),
        )
        .unwrap();
        let maxlen: Vec<(&str, u64)> = c
            .streams
            .maxlen
            .iter()
            .map(|(s, n)| (s.as_str(), *n))
            .collect();
        assert_eq!(
            maxlen,
            [("audit:eu", 9), ("billing", 500), ("orders", 1000)]
        );
        let orders = c.delivery.stream("orders").expect("orders is watched");
        assert_eq!(
            (orders.max_attempts, orders.ack_timeout),
            (2, Duration::from_secs(60))
        );
        let e = Config::from_toml("", env(&[("DELAYQ_STREAMS_MAXLEN", "1000")])).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "streams.maxlen (from DELAYQ_STREAMS_MAXLEN): must be a TOML inline table"
            ),
            "{e}"
        );
    }

    #[test]
    fn errors_about_what_the_environment_set_name_its_variable() {
        for (var, value, want) in [
            (
                "DELAYQ_REDIS_SHARDS",
                "0",
                "redis.shards (from DELAYQ_REDIS_SHARDS): must be 1 to 1024",
            ),
            (
                "DELAYQ_REDIS_URLL",
                "x",
                "redis.urll (from DELAYQ_REDIS_URLL): unknown key",
            ),
            (
                "DELAYQ_STREAMS_MAXLEN",
                "{ orders = -1 }",
                "streams.maxlen.orders (from DELAYQ_STREAMS_MAXLEN):",
            ),
        ] {
            let e = Config::from_toml("", env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(want), "{var}={value}: {e}");
        }
        let e = Config::from_toml(
            "[redis]\nshards = 0",
            env(&[("DELAYQ_REDIS_URL", "redis://x")]),
        );
        assert!(
            e.unwrap_err().to_string().starts_with("redis.shards: must"),
            "the file's own mistake"
        );
    }

    #[track_caller]
    fn refused(toml: &str, want: &str) {
        let e = Config::from_toml(toml, env(&[])).unwrap_err().to_string();
        assert_eq!(e, want);
    }

    #[test]
    fn errors_fit_on_one_line_and_name_the_key() {
        refused(
            "[redis]\nurll = \"x\"",
            "redis.urll: unknown key (known: url, password_file, tls_ca_file, tls_cert_file, \
             tls_key_file, tls_server_name, sentinel, mode, nodes, prefix, shards, timeout, \
             connect_timeout, min_replicas_acked, replicas_ack_timeout)",
        );
        refused(
            "[redis]\nurl = ",
            "line 2, column 7: string values must be quoted, expected literal string",
        );
        refused(
            "[redis]\nshards = \"x\"",
            "redis.shards: invalid type: string \"x\", expected i64",
        );
        refused(
            "colour = 1",
            "colour: unknown key (known: node, redis, etcd, api, streams, forwarder, records, pending, election, log, delivery, inbox, journal, metrics, scheduler, schedules)",
        );
    }
}
