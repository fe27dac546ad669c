//! Configuration: TOML file, then `DELAYQ_<SECTION>_<KEY>` environment overrides,
//! then validation into [`Config`], once, at start. Every error names the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::message::Limits;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: String },
}

fn invalid(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

// ---- raw: what the file says, with defaults -------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Raw {
    node: RawNode,
    redis: RawRedis,
    etcd: RawEtcd,
    api: RawApi,
    streams: RawStreams,
    forwarder: RawForwarder,
    records: RawRecords,
    log: RawLog,
    inbox: RawInbox,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawNode {
    id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRedis {
    url: String,
    prefix: String,
    shards: i64,
    #[serde(with = "humantime_serde")]
    timeout: Duration,
    #[serde(with = "humantime_serde")]
    connect_timeout: Duration,
}

impl Default for RawRedis {
    fn default() -> Self {
        RawRedis {
            url: "redis://127.0.0.1:6379".into(),
            prefix: "delayq".into(),
            shards: 16,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawEtcd {
    endpoints: Vec<String>,
    cluster: String,
    prefix: Option<String>,
    #[serde(with = "humantime_serde")]
    lease_ttl: Duration,
    failsafe: bool,
    #[serde(with = "humantime_serde")]
    connect_timeout: Duration,
}

impl Default for RawEtcd {
    fn default() -> Self {
        RawEtcd {
            endpoints: Vec::new(),
            cluster: "default".into(),
            prefix: None,
            lease_ttl: Duration::from_secs(6),
            failsafe: true,
            connect_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawApi {
    listen: String,
    max_message_bytes: i64,
    #[serde(with = "humantime_serde")]
    max_delay: Duration,
    max_fields: i64,
    tokens: Vec<String>,
    max_batch: i64,
    max_body_bytes: i64,
    #[serde(with = "humantime_serde")]
    max_wait: Duration,
    max_polls: i64,
}

impl Default for RawApi {
    fn default() -> Self {
        RawApi {
            listen: "127.0.0.1:7070".into(),
            max_message_bytes: 1 << 20,
            max_delay: Duration::from_secs(365 * 24 * 3600),
            max_fields: 1000,
            tokens: Vec::new(),
            max_batch: 1000,
            max_body_bytes: 16 << 20,
            max_wait: Duration::from_secs(60),
            max_polls: 64,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawInbox {
    enabled: bool,
    stream: String,
    group: String,
    rejected_stream: String,
    batch_size: i64,
    #[serde(with = "humantime_serde")]
    reclaim_after: Duration,
}

impl Default for RawInbox {
    fn default() -> Self {
        RawInbox {
            enabled: true,
            stream: "delayq:inbox".into(),
            group: "delayq".into(),
            rejected_stream: "delayq:inbox:rejected".into(),
            batch_size: 500,
            reclaim_after: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawStreams {
    allow: Vec<String>,
    default_maxlen: i64,
    maxlen: BTreeMap<String, i64>,
}

impl Default for RawStreams {
    fn default() -> Self {
        RawStreams {
            allow: vec!["*".into()],
            default_maxlen: 0,
            maxlen: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawForwarder {
    batch_size: i64,
    #[serde(with = "humantime_serde")]
    idle_wakeup: Duration,
    id_field: String,
    attempt_field: String,
    dead_letter_suffix: String,
}

impl Default for RawForwarder {
    fn default() -> Self {
        RawForwarder {
            batch_size: 200,
            idle_wakeup: Duration::from_secs(1),
            id_field: "delayq-id".into(),
            attempt_field: "delayq-attempt".into(),
            dead_letter_suffix: ":dead".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRecords {
    #[serde(with = "humantime_serde")]
    retention: Duration,
    #[serde(with = "humantime_serde")]
    trim_interval: Duration,
}

impl Default for RawRecords {
    fn default() -> Self {
        RawRecords {
            retention: Duration::from_secs(24 * 3600),
            trim_interval: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLog {
    level: String,
    format: String,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

// ---- validated ------------------------------------------------------------------

/// The validated configuration every module is handed.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_id: String,
    pub redis: RedisConfig,
    /// None: no etcd, the instance leads alone (standalone mode).
    pub etcd: Option<EtcdConfig>,
    pub api: ApiConfig,
    pub streams: StreamsConfig,
    pub forwarder: ForwarderConfig,
    pub records: RecordsConfig,
    pub log: LogConfig,
    /// None: producers cannot schedule through the inbox stream.
    pub inbox: Option<InboxConfig>,
}

#[derive(Clone, Debug)]
pub struct RedisConfig {
    pub url: String,
    pub prefix: String,
    pub shards: u16,
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Election key prefix, `/delayq/<cluster>/leader` unless set.
    pub election_prefix: String,
    pub lease_ttl: Duration,
    pub failsafe: bool,
    pub connect_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    pub limits: Limits,
    /// Bearer tokens accepted on `/v1/*`; empty means no authentication (loopback only).
    pub tokens: Vec<String>,
    /// Most messages in one `POST /v1/messages/batch`.
    pub max_batch: usize,
    /// Largest request body of a batch.
    pub max_body_bytes: usize,
    /// Longest a `GET /v1/streams/{stream}/next` may wait for entries.
    pub max_wait: Duration,
    /// Most long polls waiting at once (each holds a Redis connection).
    pub max_polls: usize,
}

#[derive(Clone, Debug)]
pub struct InboxConfig {
    /// The stream producers XADD delayed sends into.
    pub stream: String,
    /// The consumer group every instance reads the inbox through.
    pub group: String,
    /// Where malformed inbox entries go, with the reason.
    pub rejected_stream: String,
    /// Entries read per XREADGROUP.
    pub batch_size: usize,
    /// How long an entry may stay unacknowledged before another instance takes it over.
    pub reclaim_after: Duration,
}

#[derive(Clone, Debug)]
pub struct StreamsConfig {
    pub allow: Vec<String>,
    pub default_maxlen: u64,
    pub maxlen: Vec<(String, u64)>,
}

impl StreamsConfig {
    /// Whether `streams.allow` permits writing to this stream.
    pub fn allows(&self, stream: &str) -> bool {
        self.allow.iter().any(|pattern| glob_match(pattern, stream))
    }
}

#[derive(Clone, Debug)]
pub struct ForwarderConfig {
    pub batch_size: usize,
    pub idle_wakeup: Duration,
    pub id_field: Option<String>,
    pub attempt_field: Option<String>,
    pub dead_letter_suffix: String,
}

#[derive(Clone, Debug)]
pub struct RecordsConfig {
    pub retention: Duration,
    pub trim_interval: Duration,
}

#[derive(Clone, Debug)]
pub struct LogConfig {
    pub level: String,
    pub json: bool,
}

impl Config {
    /// Reads a file (or the defaults when `path` is None), applies environment
    /// overrides and validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.display().to_string(),
                source,
            })?,
            None => String::new(),
        };
        Config::from_toml(&text, std::env::vars())
    }

    /// Parses TOML text with the given environment (pairs of name and value).
    pub fn from_toml(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        apply_env(&mut table, env)?;
        let raw: Raw = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        raw.validate()
    }

    /// Options of the forward script for this configuration.
    pub fn forward_options(&self) -> crate::store::ForwardOptions {
        crate::store::ForwardOptions {
            batch_size: self.forwarder.batch_size,
            retention: self.records.retention,
            id_field: self.forwarder.id_field.clone(),
            attempt_field: self.forwarder.attempt_field.clone(),
            dead_letter_suffix: self.forwarder.dead_letter_suffix.clone(),
            default_maxlen: self.streams.default_maxlen,
            maxlen: self.streams.maxlen.clone(),
        }
    }

    pub fn store_config(&self) -> crate::store::StoreConfig {
        crate::store::StoreConfig {
            url: self.redis.url.clone(),
            prefix: self.redis.prefix.clone(),
            shards: self.redis.shards,
            response_timeout: self.redis.timeout,
            connect_timeout: self.redis.connect_timeout,
            max_blocking_reads: self.api.max_polls,
        }
    }

    /// Why a producer may not target `stream`, if it may not: delayq's own keys and
    /// streams, and names outside `streams.allow`. The text names the rule.
    pub fn target_refusal(&self, stream: &str) -> Option<String> {
        let prefix = &self.redis.prefix;
        if stream.starts_with(&format!("{{{prefix}:")) || stream.starts_with(&format!("{prefix}:"))
        {
            return Some(format!(
                "stream {stream:?}: names starting with \"{prefix}:\" are delayq's own keys"
            ));
        }
        if let Some(inbox) = &self.inbox
            && (stream == inbox.stream || stream == inbox.rejected_stream)
        {
            return Some(format!(
                "stream {stream:?}: is delayq's inbox (inbox.stream, inbox.rejected_stream)"
            ));
        }
        if !self.streams.allows(stream) {
            return Some(format!(
                "stream {stream:?}: not allowed (allowed: {})",
                self.streams.allow.join(", ")
            ));
        }
        None
    }
}

/// Sections whose keys the environment may override.
const SECTIONS: &[&str] = &[
    "node",
    "redis",
    "etcd",
    "api",
    "streams",
    "forwarder",
    "records",
    "log",
    "inbox",
];
/// Keys that hold lists; their environment values are comma-separated.
const LIST_KEYS: &[&str] = &["etcd.endpoints", "streams.allow", "api.tokens"];

fn apply_env(
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

fn positive(key: &str, value: i64, max: i64) -> Result<i64, ConfigError> {
    if value < 1 || value > max {
        return Err(invalid(key, format!("must be 1 to {max} (got {value})")));
    }
    Ok(value)
}

fn non_negative(key: &str, value: i64) -> Result<u64, ConfigError> {
    u64::try_from(value).map_err(|_| invalid(key, format!("must not be negative (got {value})")))
}

fn optional_field(key: &str, value: String) -> Result<Option<String>, ConfigError> {
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(
            key,
            format!("{value:?}: no spaces or control characters"),
        ));
    }
    Ok((!value.is_empty()).then_some(value))
}

impl Raw {
    fn validate(self) -> Result<Config, ConfigError> {
        // Destructured in full, so a new raw field cannot be forgotten here.
        let Raw {
            node: RawNode { id },
            redis,
            etcd,
            api,
            streams,
            forwarder,
            records,
            log,
            inbox,
        } = self;

        let node_id = match id {
            Some(id) if id.trim().is_empty() => {
                return Err(invalid("node.id", "must not be empty"));
            }
            Some(id) => id,
            None => default_node_id(),
        };

        let RawRedis {
            url,
            prefix,
            shards,
            timeout,
            connect_timeout,
        } = redis;
        if !(url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("unix://"))
        {
            return Err(invalid(
                "redis.url",
                format!("{url:?}: must start with redis://, rediss:// or unix://"),
            ));
        }
        redis::Client::open(url.as_str())
            .map_err(|e| invalid("redis.url", format!("{url:?}: {e}")))?;
        if prefix.is_empty()
            || prefix.contains(['{', '}'])
            || prefix.chars().any(char::is_whitespace)
        {
            return Err(invalid(
                "redis.prefix",
                format!("{prefix:?}: must be non-empty, without braces or spaces"),
            ));
        }
        let shards = positive("redis.shards", shards, 1024)? as u16;
        if timeout < Duration::from_millis(50) {
            return Err(invalid("redis.timeout", "must be at least 50ms"));
        }

        let RawEtcd {
            endpoints,
            cluster,
            prefix: election_prefix,
            lease_ttl,
            failsafe,
            connect_timeout: etcd_connect_timeout,
        } = etcd;
        let etcd = if endpoints.is_empty() {
            None
        } else {
            for endpoint in &endpoints {
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(invalid(
                        "etcd.endpoints",
                        format!("{endpoint:?}: must start with http:// or https://"),
                    ));
                }
            }
            if lease_ttl < Duration::from_secs(2) {
                return Err(invalid(
                    "etcd.lease_ttl",
                    format!(
                        "{}: etcd's minimum lease is 2s",
                        humantime::format_duration(lease_ttl)
                    ),
                ));
            }
            if lease_ttl.subsec_nanos() != 0 {
                return Err(invalid(
                    "etcd.lease_ttl",
                    format!(
                        "{}: must be whole seconds (etcd grants leases in seconds)",
                        humantime::format_duration(lease_ttl)
                    ),
                ));
            }
            if etcd_connect_timeout < Duration::from_millis(100) {
                return Err(invalid("etcd.connect_timeout", "must be at least 100ms"));
            }
            if cluster.is_empty() || cluster.contains('/') {
                return Err(invalid(
                    "etcd.cluster",
                    format!("{cluster:?}: must be non-empty, without '/'"),
                ));
            }
            Some(EtcdConfig {
                endpoints,
                election_prefix: election_prefix
                    .unwrap_or_else(|| format!("/delayq/{cluster}/leader")),
                lease_ttl,
                failsafe,
                connect_timeout: etcd_connect_timeout,
            })
        };

        let RawApi {
            listen,
            max_message_bytes,
            max_delay,
            max_fields,
            tokens,
            max_batch,
            max_body_bytes,
            max_wait,
            max_polls,
        } = api;
        let listen: SocketAddr = listen.parse().map_err(|_| {
            invalid(
                "api.listen",
                format!("{listen:?}: must be an address such as 127.0.0.1:7070"),
            )
        })?;
        if let Some(bad) = tokens
            .iter()
            .find(|t| t.is_empty() || t.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            let shown = if bad.is_empty() {
                "an empty token"
            } else {
                "a token"
            };
            return Err(invalid(
                "api.tokens",
                format!("{shown}: must be non-empty, without spaces or control characters"),
            ));
        }
        // Without tokens anyone who can connect may schedule and cancel: only loopback is safe.
        if tokens.is_empty() && !listen.ip().is_loopback() {
            return Err(invalid(
                "api.listen",
                format!(
                    "{listen} is not loopback and api.tokens is empty: set api.tokens (or DELAYQ_API_TOKENS) or listen on 127.0.0.1"
                ),
            ));
        }
        let max_batch = positive("api.max_batch", max_batch, 5000)? as usize;
        let max_body_bytes = positive("api.max_body_bytes", max_body_bytes, 1 << 30)? as usize;
        let max_polls = positive("api.max_polls", max_polls, 10_000)? as usize;
        if max_wait > Duration::from_secs(3600) {
            return Err(invalid("api.max_wait", "must be at most 1h"));
        }
        let limits = Limits {
            max_delay,
            max_message_bytes: positive("api.max_message_bytes", max_message_bytes, 64 << 20)?
                as usize,
            max_fields: positive("api.max_fields", max_fields, 2000)? as usize,
        };
        if max_delay.is_zero() {
            return Err(invalid("api.max_delay", "must be longer than 0"));
        }

        let RawStreams {
            allow,
            default_maxlen,
            maxlen,
        } = streams;
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

        let RawForwarder {
            batch_size,
            idle_wakeup,
            id_field,
            attempt_field,
            dead_letter_suffix,
        } = forwarder;
        let batch_size = positive("forwarder.batch_size", batch_size, 10_000)? as usize;
        if idle_wakeup < Duration::from_millis(10) {
            return Err(invalid("forwarder.idle_wakeup", "must be at least 10ms"));
        }
        if dead_letter_suffix.is_empty() {
            return Err(invalid(
                "forwarder.dead_letter_suffix",
                "must not be empty (dead letters would go to the stream itself)",
            ));
        }

        let RawRecords {
            retention,
            trim_interval,
        } = records;
        if trim_interval < Duration::from_millis(100) {
            return Err(invalid("records.trim_interval", "must be at least 100ms"));
        }

        let RawInbox {
            enabled,
            stream: inbox_stream,
            group: inbox_group,
            rejected_stream,
            batch_size: inbox_batch_size,
            reclaim_after,
        } = inbox;
        let inbox = if enabled {
            for (key, value) in [
                ("inbox.stream", &inbox_stream),
                ("inbox.group", &inbox_group),
                ("inbox.rejected_stream", &rejected_stream),
            ] {
                if value.is_empty() || value.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(invalid(
                        key,
                        format!(
                            "{value:?}: must be non-empty, without spaces or control characters"
                        ),
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
            Some(InboxConfig {
                stream: inbox_stream,
                group: inbox_group,
                rejected_stream,
                batch_size: positive("inbox.batch_size", inbox_batch_size, 5000)? as usize,
                reclaim_after,
            })
        } else {
            None
        };

        let RawLog { level, format } = log;
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

        Ok(Config {
            node_id,
            redis: RedisConfig {
                url,
                prefix,
                shards,
                timeout,
                connect_timeout,
            },
            etcd,
            api: ApiConfig {
                listen,
                limits,
                tokens,
                max_batch,
                max_body_bytes,
                max_wait,
                max_polls,
            },
            streams: StreamsConfig {
                allow,
                default_maxlen,
                maxlen,
            },
            forwarder: ForwarderConfig {
                batch_size,
                idle_wakeup,
                id_field: optional_field("forwarder.id_field", id_field)?,
                attempt_field: optional_field("forwarder.attempt_field", attempt_field)?,
                dead_letter_suffix,
            },
            records: RecordsConfig {
                retention,
                trim_interval,
            },
            log: LogConfig { level, json },
            inbox,
        })
    }
}

fn default_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "node".into());
    format!("{host}-{}", std::process::id())
}

/// Shell-style glob: `*` matches any run of characters, `?` any one character.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[track_caller]
    fn check_err(toml: &str, env_pairs: &[(&str, &str)], expected: &str) {
        let err = Config::from_toml(toml, env(env_pairs))
            .expect_err("should be refused")
            .to_string();
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }

    #[test]
    fn defaults() {
        let c = Config::from_toml("", env(&[])).unwrap();
        assert_eq!(c.redis.shards, 16);
        assert_eq!(c.api.listen.to_string(), "127.0.0.1:7070");
        assert!(c.etcd.is_none());
        assert_eq!(c.records.retention, Duration::from_secs(86400));
        assert_eq!(c.forwarder.id_field.as_deref(), Some("delayq-id"));
        assert!(c.streams.allows("anything"));
    }

    #[test]
    fn bad_values_name_their_key() {
        check_err(
            "[redis]\nshards = 0",
            &[],
            "redis.shards: must be 1 to 1024 (got 0)",
        );
        check_err("[redis]\nurl = \"http://x\"", &[], "redis.url");
        check_err("[redis]\nprefix = \"a{b\"", &[], "redis.prefix");
        check_err(
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"1s\"",
            &[],
            "etcd.lease_ttl",
        );
        check_err(
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"2500ms\"",
            &[],
            "etcd.lease_ttl: 2s 500ms: must be whole seconds",
        );
        check_err(
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nconnect_timeout = \"0s\"",
            &[],
            "etcd.connect_timeout",
        );
        check_err(
            "[etcd]\nendpoints = [\"127.0.0.1:2379\"]",
            &[],
            "etcd.endpoints",
        );
        check_err("[api]\nlisten = \"nowhere\"", &[], "api.listen");
        check_err(
            "[api]\nmax_message_bytes = -1",
            &[],
            "api.max_message_bytes",
        );
        check_err("[forwarder]\nbatch_size = 0", &[], "forwarder.batch_size");
        check_err("[forwarder]\nid_field = \"a b\"", &[], "forwarder.id_field");
        check_err(
            "[streams.maxlen]\norders = -5",
            &[],
            "streams.maxlen.orders",
        );
        check_err("[log]\nformat = \"xml\"", &[], "log.format");
        check_err("[redis]\nshard = 3", &[], "unknown field `shard`");
        check_err("[redis]\ntimeout = \"soon\"", &[], "redis.timeout");
        check_err("", &[("DELAYQ_REDIS_SHARDS", "0")], "redis.shards");
        check_err("", &[("DELAYQ_API_LISTEN", "x")], "api.listen");
        check_err(
            "[api]\nlisten = \"0.0.0.0:7070\"",
            &[],
            "api.listen: 0.0.0.0:7070 is not loopback and api.tokens is empty",
        );
        check_err("[api]\ntokens = [\"\"]", &[], "api.tokens: an empty token");
        check_err("[api]\ntokens = [\"a b\"]", &[], "api.tokens: a token");
        check_err(
            "[api]\nmax_batch = 0",
            &[],
            "api.max_batch: must be 1 to 5000",
        );
        check_err("[api]\nmax_body_bytes = 0", &[], "api.max_body_bytes");
        check_err("[api]\nmax_wait = \"2h\"", &[], "api.max_wait");
        check_err("[api]\nmax_polls = 0", &[], "api.max_polls");
        check_err("[inbox]\nstream = \"\"", &[], "inbox.stream");
        check_err("[inbox]\ngroup = \"a b\"", &[], "inbox.group");
        check_err(
            "[inbox]\nrejected_stream = \"delayq:inbox\"",
            &[],
            "inbox.rejected_stream: must differ",
        );
        check_err("[inbox]\nbatch_size = 0", &[], "inbox.batch_size");
        check_err(
            "[inbox]\nreclaim_after = \"1ms\"",
            &[],
            "inbox.reclaim_after",
        );
    }

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
        assert_eq!(c.redis.url, "redis://env:6379");
        assert_eq!(c.redis.shards, 4);
        assert_eq!(c.node_id, "n7");
        let etcd = c.etcd.unwrap();
        assert_eq!(etcd.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!(etcd.lease_ttl, Duration::from_secs(3));
        assert_eq!(etcd.election_prefix, "/delayq/default/leader");
        assert!(c.streams.allows("billing-eu") && !c.streams.allows("payroll"));
    }

    #[test]
    fn tokens_open_non_loopback_addresses() {
        let c = Config::from_toml(
            "[api]\nlisten = \"0.0.0.0:7070\"",
            env(&[("DELAYQ_API_TOKENS", "s3cret, other")]),
        )
        .unwrap();
        assert_eq!(c.api.tokens, ["s3cret", "other"]);
        let c = Config::from_toml("[api]\nlisten = \"[::1]:7070\"", env(&[])).unwrap();
        assert!(c.api.tokens.is_empty());
    }

    #[test]
    fn inbox_defaults_and_switch() {
        let c = Config::from_toml("", env(&[])).unwrap();
        let inbox = c.inbox.expect("enabled by default");
        assert_eq!(inbox.stream, "delayq:inbox");
        assert_eq!(inbox.rejected_stream, "delayq:inbox:rejected");
        let c = Config::from_toml("", env(&[("DELAYQ_INBOX_ENABLED", "false")])).unwrap();
        assert!(c.inbox.is_none());
    }

    #[track_caller]
    fn check_target(toml: &str, stream: &str, refusal: Option<&str>) {
        let c = Config::from_toml(toml, env(&[])).unwrap();
        match (c.target_refusal(stream), refusal) {
            (None, None) => {}
            (Some(got), Some(part)) => {
                assert!(got.contains(part), "{got:?} should contain {part:?}")
            }
            (got, want) => panic!("{stream}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn targets() {
        check_target("", "orders", None);
        check_target("", "delayq:inbox", Some("delayq's own keys"));
        check_target(
            "[redis]\nprefix = \"dq\"",
            "delayq:inbox",
            Some("delayq's inbox"),
        );
        check_target(
            "[redis]\nprefix = \"dq\"",
            "{dq:1}:due",
            Some("delayq's own keys"),
        );
        check_target(
            "[streams]\nallow = [\"orders*\"]",
            "billing",
            Some("not allowed (allowed: orders*)"),
        );
        check_target("[streams]\nallow = [\"orders*\"]", "orders:eu", None);
    }

    #[track_caller]
    fn check_glob(pattern: &str, text: &str, expected: bool) {
        assert_eq!(glob_match(pattern, text), expected, "{pattern} ~ {text}");
    }

    #[test]
    fn globs() {
        check_glob("*", "", true);
        check_glob("*", "orders", true);
        check_glob("orders", "orders", true);
        check_glob("orders", "orders2", false);
        check_glob("orders*", "orders:eu", true);
        check_glob("*:eu", "orders:eu", true);
        check_glob("*:eu", "orders:us", false);
        check_glob("o?ders", "orders", true);
        check_glob("a*b*c", "aXXbYYc", true);
        check_glob("a*b*c", "aXXbYY", false);
    }

    #[test]
    fn the_shipped_config_file_is_valid_and_matches_the_defaults() {
        let text = include_str!("../config/delayq.toml");
        let c = Config::from_toml(text, env(&[])).unwrap();
        let d = Config::from_toml("", env(&[])).unwrap();
        assert_eq!(c.redis.shards, d.redis.shards);
        assert_eq!(c.api.listen, d.api.listen);
        assert_eq!(c.records.retention, d.records.retention);
        assert_eq!(c.forwarder.batch_size, d.forwarder.batch_size);
        assert_eq!(c.api.limits.max_delay, d.api.limits.max_delay);
        assert_eq!(c.api.max_batch, d.api.max_batch);
        assert_eq!(c.api.max_body_bytes, d.api.max_body_bytes);
        assert_eq!(c.api.max_wait, d.api.max_wait);
        assert_eq!(c.api.max_polls, d.api.max_polls);
        assert_eq!(c.api.tokens, d.api.tokens);
        let (ci, di) = (c.inbox.expect("enabled"), d.inbox.expect("enabled"));
        assert_eq!(
            (ci.stream, ci.group, ci.rejected_stream),
            (di.stream, di.group, di.rejected_stream)
        );
        assert_eq!(
            (ci.batch_size, ci.reclaim_after),
            (di.batch_size, di.reclaim_after)
        );
    }
}
