//! Configuration: TOML file, then `DELAYQ_<SECTION>_<KEY>` environment overrides,
//! then validation into [`Config`], once, at start. Every error names the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::message::{Limits, is_plain};
use crate::secret::{self, ExposeSecret, RedisUrl, SecretString};

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

#[derive(Debug, Default, Deserialize, Serialize)]
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
    delivery: RawDelivery,
    inbox: RawInbox,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawNode {
    /// Any non-empty name; a bare number (`id = 123`, `DELAYQ_NODE_ID=123`) too.
    #[serde(deserialize_with = "text_or_number")]
    id: Option<String>,
}

fn text_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum TextOrNumber {
        Text(String),
        Integer(i64),
        Float(f64),
    }
    Ok(Some(match TextOrNumber::deserialize(d)? {
        TextOrNumber::Text(s) => s,
        TextOrNumber::Integer(n) => n.to_string(),
        TextOrNumber::Float(n) => n.to_string(),
    }))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawRedis {
    url: String,
    /// A file holding the password, put into `url` (never logged).
    password_file: Option<String>,
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
            password_file: None,
            prefix: "delayq".into(),
            shards: 16,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
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

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawApi {
    listen: String,
    max_message_bytes: i64,
    #[serde(with = "humantime_serde")]
    max_delay: Duration,
    max_fields: i64,
    tokens: Vec<String>,
    /// A file with more tokens, one a line (never logged).
    tokens_file: Option<String>,
    write_tokens: Vec<String>,
    write_tokens_file: Option<String>,
    read_tokens: Vec<String>,
    read_tokens_file: Option<String>,
    max_batch: i64,
    max_body_bytes: i64,
    #[serde(with = "humantime_serde")]
    max_wait: Duration,
    max_polls: i64,
    #[serde(with = "humantime_serde")]
    request_timeout: Duration,
    max_concurrent_requests: i64,
}

impl Default for RawApi {
    fn default() -> Self {
        RawApi {
            listen: "127.0.0.1:7070".into(),
            max_message_bytes: 1 << 20,
            max_delay: Duration::from_secs(365 * 24 * 3600),
            max_fields: 1000,
            tokens: Vec::new(),
            tokens_file: None,
            write_tokens: Vec::new(),
            write_tokens_file: None,
            read_tokens: Vec::new(),
            read_tokens_file: None,
            max_batch: 1000,
            max_body_bytes: 16 << 20,
            max_wait: Duration::from_secs(60),
            max_polls: 64,
            request_timeout: Duration::from_secs(30),
            max_concurrent_requests: 1024,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawInbox {
    enabled: bool,
    /// Default `<redis.prefix>:inbox`, so deployments sharing a Redis never collide.
    stream: Option<String>,
    /// Default `<redis.prefix>`.
    group: Option<String>,
    /// Default `<redis.prefix>:inbox:rejected`.
    rejected_stream: Option<String>,
    batch_size: i64,
    #[serde(with = "humantime_serde")]
    reclaim_after: Duration,
}

impl Default for RawInbox {
    fn default() -> Self {
        RawInbox {
            enabled: true,
            stream: None,
            group: None,
            rejected_stream: None,
            batch_size: 500,
            reclaim_after: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
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

#[derive(Debug, Deserialize, Serialize)]
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

#[derive(Debug, Deserialize, Serialize)]
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

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawDelivery {
    groups: Vec<String>,
    #[serde(with = "humantime_serde")]
    ack_timeout: Duration,
    max_attempts: i64,
    #[serde(with = "humantime_serde")]
    backoff: Duration,
    #[serde(with = "humantime_serde")]
    backoff_max: Duration,
    backoff_jitter: f64,
    #[serde(with = "humantime_serde")]
    sweep_interval: Duration,
    sweep_batch: i64,
    streams: BTreeMap<String, RawStreamDelivery>,
}

impl Default for RawDelivery {
    fn default() -> Self {
        RawDelivery {
            groups: Vec::new(),
            ack_timeout: Duration::from_secs(60),
            max_attempts: 10,
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            backoff_jitter: 0.2,
            sweep_interval: Duration::from_secs(1),
            sweep_batch: 100,
            streams: BTreeMap::new(),
        }
    }
}

/// One stream's overrides of the `[delivery]` defaults; unset keys inherit them.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct RawStreamDelivery {
    groups: Option<Vec<String>>,
    #[serde(with = "humantime_serde")]
    ack_timeout: Option<Duration>,
    max_attempts: Option<i64>,
    #[serde(with = "humantime_serde")]
    backoff: Option<Duration>,
    #[serde(with = "humantime_serde")]
    backoff_max: Option<Duration>,
    backoff_jitter: Option<f64>,
    dead_letter_stream: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
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
    pub delivery: DeliveryConfig,
    /// None: producers cannot schedule through the inbox stream.
    pub inbox: Option<InboxConfig>,
}

#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// Shown redacted; `expose()` only to connect.
    pub url: RedisUrl,
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
    /// Bearer tokens of the admin scope: every `/v1/*` endpoint. With no token of
    /// any scope there is no authentication (loopback only).
    pub tokens: Vec<SecretString>,
    /// Bearer tokens of the write scope: scheduling, consuming, and what `read` allows.
    pub write_tokens: Vec<SecretString>,
    /// Bearer tokens of the read scope: looking, without changing anything.
    pub read_tokens: Vec<SecretString>,
    /// Most messages in one `POST /v1/messages/batch`.
    pub max_batch: usize,
    /// Largest request body of a batch.
    pub max_body_bytes: usize,
    /// Longest a `GET /v1/streams/{stream}/next` may wait for entries.
    pub max_wait: Duration,
    /// Most long polls waiting at once (each holds a Redis connection).
    pub max_polls: usize,
    /// Longest a request may take before it is answered `503 timeout`; long polls
    /// get `max_wait` on top.
    pub request_timeout: Duration,
    /// Most requests under `/v1` being served at once; more are answered `429`.
    pub max_concurrent_requests: usize,
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

impl InboxConfig {
    /// The inbox's streams and group, as the store reads and acknowledges them.
    pub fn queue(&self) -> crate::store::InboxQueue {
        crate::store::InboxQueue {
            stream: self.stream.clone(),
            group: self.group.clone(),
            rejected_stream: self.rejected_stream.clone(),
        }
    }
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

/// Redelivery of entries consumer groups never acknowledged.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryConfig {
    /// How often the leader looks for entries pending too long.
    pub sweep_interval: Duration,
    /// Most pending entries looked at per stream and group in one pass.
    pub sweep_batch: usize,
    /// The watched streams (those under `[delivery.streams]`), in name order.
    pub streams: Vec<StreamDelivery>,
}

/// Delivery settings of one watched stream, defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamDelivery {
    pub stream: String,
    /// Consumer groups whose unacknowledged entries are redelivered; never empty.
    pub groups: Vec<String>,
    /// An entry pending longer than this in a group counts as lost by its consumer.
    pub ack_timeout: Duration,
    /// Deliveries before a message goes to the dead-letter stream instead.
    pub max_attempts: u32,
    pub backoff: RetryBackoff,
    pub dead_letter_stream: String,
}

/// Delay before redelivery attempt n + 1: `first` × 2^(n − 1), at most `max`,
/// less up to `jitter` (a fraction) of it at random.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBackoff {
    pub first: Duration,
    pub max: Duration,
    pub jitter: f64,
}

impl DeliveryConfig {
    pub fn stream(&self, stream: &str) -> Option<&StreamDelivery> {
        self.streams.iter().find(|s| s.stream == stream)
    }
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

    /// Where a stream's dead letters go: its `dead_letter_stream` under
    /// `[delivery.streams]`, else `<stream><forwarder.dead_letter_suffix>`.
    pub fn dead_letter_stream(&self, stream: &str) -> String {
        match self.delivery.stream(stream) {
            Some(s) => s.dead_letter_stream.clone(),
            None => format!("{stream}{}", self.forwarder.dead_letter_suffix),
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
        let prefix = self.redis.prefix.as_str();
        // "<prefix>:…" or "{<prefix>:…", checked without building either pattern.
        let own = |s: &str| s.strip_prefix(prefix).is_some_and(|r| r.starts_with(':'));
        if own(stream) || stream.strip_prefix('{').is_some_and(own) {
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
    "delivery",
    "inbox",
];
/// Keys that hold lists; their environment values are comma-separated.
const LIST_KEYS: &[&str] = &[
    "etcd.endpoints",
    "streams.allow",
    "delivery.groups",
    "api.tokens",
    "api.write_tokens",
    "api.read_tokens",
];

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

/// The longest `api.request_timeout`.
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

fn positive(key: &str, value: i64, max: i64) -> Result<i64, ConfigError> {
    if value < 1 || value > max {
        return Err(invalid(key, format!("must be 1 to {max} (got {value})")));
    }
    Ok(value)
}

/// The tokens of one scope: `key`'s list and those of its `_file`, one a line.
fn token_list(
    key: &str,
    mut tokens: Vec<String>,
    file: Option<String>,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<Vec<String>, ConfigError> {
    if let Some(path) = file {
        let file = read_secret(&format!("{key}_file"), &path)?;
        tokens.extend(
            file.expose_secret()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
    }
    if let Some(bad) = tokens.iter().find(|t| t.is_empty() || !is_plain(t)) {
        let shown = if bad.is_empty() {
            "an empty token"
        } else {
            "a token"
        };
        return Err(invalid(
            key,
            format!("{shown}: must be non-empty, without spaces or control characters"),
        ));
    }
    Ok(tokens)
}

fn non_negative(key: &str, value: i64) -> Result<u64, ConfigError> {
    u64::try_from(value).map_err(|_| invalid(key, format!("must not be negative (got {value})")))
}

fn optional_field(key: &str, value: String) -> Result<Option<String>, ConfigError> {
    if !is_plain(&value) {
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
            delivery,
            inbox,
        } = self;

        let node_id = match id {
            Some(id) if id.trim().is_empty() => {
                return Err(invalid("node.id", "must not be empty"));
            }
            Some(id) => id,
            None => default_node_id(),
        };

        let credentials_dir = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        let read_secret = |key: &str, path: &str| {
            secret::read_file(&secret::credential_path(path, credentials_dir.as_deref()))
                .map_err(|e| invalid(key, e))
        };
        let RawRedis {
            url,
            password_file,
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
                format!(
                    "{:?}: must start with redis://, rediss:// or unix://",
                    secret::shown_url(&url)
                ),
            ));
        }
        let url = match password_file {
            Some(path) => with_password(&url, read_secret("redis.password_file", &path)?)?,
            None => url,
        };
        let url = RedisUrl::new(url);
        redis::Client::open(url.expose()).map_err(|e| {
            // The client's own message may quote the URL: show neither.
            let _ = e;
            invalid("redis.url", format!("{url:?}: not a valid Redis URL"))
        })?;
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
        if connect_timeout < Duration::from_millis(50) {
            return Err(invalid("redis.connect_timeout", "must be at least 50ms"));
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
                if endpoint.starts_with("https://") {
                    // Refused here rather than failing at run time: the etcd client is
                    // built without TLS.
                    return Err(invalid(
                        "etcd.endpoints",
                        format!(
                            "{endpoint:?}: TLS to etcd is not supported yet; use http:// (e.g. over a private network or a local TLS-terminating proxy)"
                        ),
                    ));
                }
                if !endpoint.starts_with("http://") {
                    return Err(invalid(
                        "etcd.endpoints",
                        format!("{endpoint:?}: must start with http://"),
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
            tokens_file,
            write_tokens,
            write_tokens_file,
            read_tokens,
            read_tokens_file,
            max_batch,
            max_body_bytes,
            max_wait,
            max_polls,
            request_timeout,
            max_concurrent_requests,
        } = api;
        let tokens = token_list("api.tokens", tokens, tokens_file, &read_secret)?;
        let write_tokens = token_list(
            "api.write_tokens",
            write_tokens,
            write_tokens_file,
            &read_secret,
        )?;
        let read_tokens = token_list(
            "api.read_tokens",
            read_tokens,
            read_tokens_file,
            &read_secret,
        )?;
        for (key, list, others) in [
            ("api.write_tokens", &write_tokens, vec![&tokens]),
            (
                "api.read_tokens",
                &read_tokens,
                vec![&tokens, &write_tokens],
            ),
        ] {
            if list.iter().any(|t| others.iter().any(|o| o.contains(t))) {
                return Err(invalid(
                    key,
                    "a token is also of a higher scope: list each token once, in the scope it needs",
                ));
            }
        }
        let listen: SocketAddr = listen.parse().map_err(|_| {
            invalid(
                "api.listen",
                format!("{listen:?}: must be an address such as 127.0.0.1:7070"),
            )
        })?;
        // Without tokens anyone who can connect may schedule and cancel: only loopback is safe.
        let no_tokens = tokens.is_empty() && write_tokens.is_empty() && read_tokens.is_empty();
        if no_tokens && !listen.ip().is_loopback() {
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
        if request_timeout < Duration::from_millis(100) || request_timeout > MAX_REQUEST_TIMEOUT {
            return Err(invalid(
                "api.request_timeout",
                format!(
                    "{}: must be 100ms to 1h",
                    humantime::format_duration(request_timeout)
                ),
            ));
        }
        let max_concurrent_requests = positive(
            "api.max_concurrent_requests",
            max_concurrent_requests,
            100_000,
        )? as usize;
        let limits = Limits {
            max_delay,
            max_message_bytes: positive("api.max_message_bytes", max_message_bytes, 64 << 20)?
                as usize,
            max_fields: positive("api.max_fields", max_fields, 2000)? as usize,
        };
        if max_delay.is_zero() {
            return Err(invalid("api.max_delay", "must be longer than 0"));
        }
        // Due scores are due_ms * 10 in a double: exact far beyond this, and no
        // delay this long is a delay.
        if max_delay > MAX_DELAY_LIMIT {
            return Err(invalid(
                "api.max_delay",
                "must be at most 36500d (100 years)",
            ));
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

        let forwarder = ForwarderConfig {
            batch_size,
            idle_wakeup,
            id_field: optional_field("forwarder.id_field", id_field)?,
            attempt_field: optional_field("forwarder.attempt_field", attempt_field)?,
            dead_letter_suffix,
        };
        let delivery = delivery.validate(&forwarder, retention)?;
        let RawInbox {
            enabled,
            stream: inbox_stream,
            group: inbox_group,
            rejected_stream,
            batch_size: inbox_batch_size,
            reclaim_after,
        } = inbox;
        let inbox_stream = inbox_stream.unwrap_or_else(|| format!("{prefix}:inbox"));
        let inbox_group = inbox_group.unwrap_or_else(|| prefix.clone());
        let rejected_stream = rejected_stream.unwrap_or_else(|| format!("{prefix}:inbox:rejected"));
        let inbox = if enabled {
            for (key, value) in [
                ("inbox.stream", &inbox_stream),
                ("inbox.group", &inbox_group),
                ("inbox.rejected_stream", &rejected_stream),
            ] {
                if value.is_empty() || !is_plain(value) {
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
                tokens: tokens.into_iter().map(SecretString::from).collect(),
                write_tokens: write_tokens.into_iter().map(SecretString::from).collect(),
                read_tokens: read_tokens.into_iter().map(SecretString::from).collect(),
                max_batch,
                max_body_bytes,
                max_wait,
                max_polls,
                request_timeout,
                max_concurrent_requests,
            },
            streams: StreamsConfig {
                allow,
                default_maxlen,
                maxlen,
            },
            forwarder,
            records: RecordsConfig {
                retention,
                trim_interval,
            },
            log: LogConfig { level, json },
            delivery,
            inbox,
        })
    }
}

impl RawDelivery {
    fn validate(
        self,
        forwarder: &ForwarderConfig,
        retention: Duration,
    ) -> Result<DeliveryConfig, ConfigError> {
        let RawDelivery {
            groups,
            ack_timeout,
            max_attempts,
            backoff,
            backoff_max,
            backoff_jitter,
            sweep_interval,
            sweep_batch,
            streams,
        } = self;
        let defaults = StreamDelivery {
            stream: String::new(),
            groups: consumer_groups("delivery.groups", groups)?,
            ack_timeout: ack_timeout_at_least("delivery.ack_timeout", ack_timeout)?,
            max_attempts: positive("delivery.max_attempts", max_attempts, 1000)? as u32,
            backoff: retry_backoff("delivery", backoff, backoff_max, backoff_jitter)?,
            dead_letter_stream: String::new(),
        };
        if sweep_interval < Duration::from_millis(10) {
            return Err(invalid("delivery.sweep_interval", "must be at least 10ms"));
        }
        let sweep_batch = positive("delivery.sweep_batch", sweep_batch, 10_000)? as usize;

        let mut watched = Vec::with_capacity(streams.len());
        for (stream, raw) in streams {
            let key = format!("delivery.streams.{stream}");
            crate::message::validate_stream(&stream).map_err(|e| invalid(&key, e.to_string()))?;
            // Destructured in full, so a new override cannot be forgotten here.
            let RawStreamDelivery {
                groups,
                ack_timeout,
                max_attempts,
                backoff,
                backoff_max,
                backoff_jitter,
                dead_letter_stream,
            } = raw;
            let groups = match groups {
                Some(groups) => consumer_groups(&format!("{key}.groups"), groups)?,
                None => defaults.groups.clone(),
            };
            if groups.is_empty() {
                return Err(invalid(
                    &format!("{key}.groups"),
                    "no consumer group to watch (set it here or in delivery.groups)",
                ));
            }
            let (ack_timeout, ack_timeout_key) = match ack_timeout {
                Some(t) => {
                    let key = format!("{key}.ack_timeout");
                    (ack_timeout_at_least(&key, t)?, key)
                }
                None => (defaults.ack_timeout, "delivery.ack_timeout".to_owned()),
            };
            // The delivery record tells a stale entry from an older delivery of the
            // same message; once the record is forgotten a sweep could redeliver twice.
            if ack_timeout >= retention {
                return Err(invalid(
                    &ack_timeout_key,
                    format!(
                        "must be shorter than records.retention ({}) for watched stream {stream:?}",
                        humantime::format_duration(retention)
                    ),
                ));
            }
            let max_attempts = match max_attempts {
                Some(n) => positive(&format!("{key}.max_attempts"), n, 1000)? as u32,
                None => defaults.max_attempts,
            };
            let backoff = retry_backoff(
                &key,
                backoff.unwrap_or(defaults.backoff.first),
                backoff_max.unwrap_or(defaults.backoff.max),
                backoff_jitter.unwrap_or(defaults.backoff.jitter),
            )?;
            let dead_letter_stream = match dead_letter_stream {
                Some(dead) => {
                    crate::message::validate_stream(&dead).map_err(|e| {
                        invalid(&format!("{key}.dead_letter_stream"), e.to_string())
                    })?;
                    dead
                }
                None => format!("{stream}{}", forwarder.dead_letter_suffix),
            };
            if dead_letter_stream == stream {
                return Err(invalid(
                    &format!("{key}.dead_letter_stream"),
                    "must differ from the stream itself",
                ));
            }
            watched.push(StreamDelivery {
                stream,
                groups,
                ack_timeout,
                max_attempts,
                backoff,
                dead_letter_stream,
            });
        }
        // Replay reads a stream's dead letters back into that stream, so two streams
        // sharing a dead-letter stream, or one stream's dead letters landing in another
        // watched stream, would mix messages up.
        for s in &watched {
            if let Some(other) = watched.iter().find(|o| {
                o.stream != s.stream
                    && (o.dead_letter_stream == s.dead_letter_stream
                        || o.stream == s.dead_letter_stream)
            }) {
                return Err(invalid(
                    &format!("delivery.streams.{}.dead_letter_stream", s.stream),
                    format!(
                        "{:?} is also used by stream {:?}; every watched stream needs a dead-letter stream of its own",
                        s.dead_letter_stream, other.stream
                    ),
                ));
            }
        }
        if !watched.is_empty() {
            // The sweep finds a message by the id on its entry, and counts attempts by it.
            if forwarder.id_field.is_none() {
                return Err(invalid(
                    "forwarder.id_field",
                    "must be set while [delivery.streams] watches streams (redelivery finds messages by it)",
                ));
            }
            if forwarder.attempt_field.is_none() {
                return Err(invalid(
                    "forwarder.attempt_field",
                    "must be set while [delivery.streams] watches streams (redelivery counts attempts by it)",
                ));
            }
        }
        Ok(DeliveryConfig {
            sweep_interval,
            sweep_batch,
            streams: watched,
        })
    }
}

fn consumer_groups(key: &str, groups: Vec<String>) -> Result<Vec<String>, ConfigError> {
    for group in &groups {
        if group.is_empty() || !is_plain(group) {
            return Err(invalid(
                key,
                format!(
                    "{group:?}: a group name must be non-empty, without spaces or control characters"
                ),
            ));
        }
    }
    let mut unique = groups.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != groups.len() {
        return Err(invalid(key, "lists a group twice"));
    }
    Ok(groups)
}

fn ack_timeout_at_least(key: &str, timeout: Duration) -> Result<Duration, ConfigError> {
    if timeout < Duration::from_millis(10) {
        return Err(invalid(key, "must be at least 10ms"));
    }
    Ok(timeout)
}

fn retry_backoff(
    section: &str,
    first: Duration,
    max: Duration,
    jitter: f64,
) -> Result<RetryBackoff, ConfigError> {
    if max < first {
        return Err(invalid(
            &format!("{section}.backoff_max"),
            format!(
                "must not be shorter than {section}.backoff ({})",
                humantime::format_duration(first)
            ),
        ));
    }
    if !(0.0..=1.0).contains(&jitter) {
        return Err(invalid(
            &format!("{section}.backoff_jitter"),
            format!("must be 0 to 1 (got {jitter})"),
        ));
    }
    Ok(RetryBackoff { first, max, jitter })
}

// ---- effective configuration: what check-config prints and SIGHUP compares -------

/// Key names whose values are secrets wherever they appear: printed as `<redacted>`.
/// The longest `api.max_delay` allowed.
const MAX_DELAY_LIMIT: Duration = Duration::from_secs(36_500 * 24 * 3600);

const SECRET_KEY_PARTS: &[&str] = &["token", "password", "secret"];

impl Config {
    /// Like [`Config::from_toml`], and also returns the effective configuration as
    /// a table: every key with its value after defaults and environment overrides,
    /// secrets redacted.
    pub fn effective(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, toml::Table), ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        apply_env(&mut table, env)?;
        let raw: Raw = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        let mut effective = toml::Table::try_from(&raw)
            .map_err(|e| ConfigError::Parse(format!("render the configuration: {e}")))?;
        let config = raw.validate()?;
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
        if let Some(etcd) = &config.etcd {
            set_key(
                &mut effective,
                "etcd",
                "prefix",
                etcd.election_prefix.clone().into(),
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

/// `url` with the password read from `redis.password_file`: in the userinfo, or as
/// the `pass` parameter of a `unix://` URL.
fn with_password(url: &str, password: SecretString) -> Result<String, ConfigError> {
    let mut parsed = url::Url::parse(url)
        .map_err(|e| invalid("redis.url", format!("{:?}: {e}", secret::shown_url(url))))?;
    if parsed.scheme() == "unix" {
        parsed
            .query_pairs_mut()
            .append_pair("pass", password.expose_secret());
    } else if parsed.set_password(Some(password.expose_secret())).is_err() {
        return Err(invalid(
            "redis.password_file",
            format!("{:?} has no host to log in to", secret::shown_url(url)),
        ));
    }
    Ok(parsed.into())
}

fn default_node_id() -> String {
    format!("{}-{}", hostname(), std::process::id())
}

/// The host's name from uname(2), which works where /proc/sys is hidden (the
/// systemd unit's ProcSubset=pid).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer outlives the call and its length is passed; on success
    // the name is NUL-terminated within it (the last byte stays 0).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(0);
        String::from_utf8_lossy(&buf[..end]).trim().to_owned()
    } else {
        String::new()
    };
    if name.is_empty() { "node".into() } else { name }
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

    fn exposed(tokens: &[SecretString]) -> Vec<&str> {
        tokens.iter().map(|t| t.expose_secret()).collect()
    }

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
    fn any_non_empty_node_id_is_a_name_numbers_too() {
        for (toml, env_pairs, expected) in [
            ("[node]\nid = \"n1\"", &[][..], "n1"),
            ("[node]\nid = 123", &[], "123"),
            ("", &[("DELAYQ_NODE_ID", "123")], "123"),
            ("", &[("DELAYQ_NODE_ID", "0042")], "0042"),
            ("", &[("DELAYQ_NODE_ID", "1.5")], "1.5"),
        ] {
            let c = Config::from_toml(toml, env(env_pairs)).unwrap();
            assert_eq!(c.node_id, expected, "{toml} {env_pairs:?}");
        }
    }

    #[test]
    fn the_inbox_lives_under_the_prefix_unless_named() {
        for (toml, expected) in [
            ("", ("delayq:inbox", "delayq", "delayq:inbox:rejected")),
            (
                "[redis]\nprefix = \"b\"",
                ("b:inbox", "b", "b:inbox:rejected"),
            ),
            (
                "[redis]\nprefix = \"b\"\n[inbox]\nstream = \"mq\"\ngroup = \"g\"\nrejected_stream = \"r\"",
                ("mq", "g", "r"),
            ),
        ] {
            let c = Config::from_toml(toml, env(&[])).unwrap();
            let inbox = c.inbox.expect("enabled");
            assert_eq!(
                (
                    inbox.stream.as_str(),
                    inbox.group.as_str(),
                    inbox.rejected_stream.as_str()
                ),
                expected,
                "{toml}"
            );
        }
        let (_, table) = Config::effective("[redis]\nprefix = \"b\"", env(&[])).unwrap();
        assert_eq!(table["inbox"]["stream"].as_str(), Some("b:inbox"));
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
        assert!(c.delivery.streams.is_empty());
        assert_eq!(c.delivery.sweep_interval, Duration::from_secs(1));
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
        check_err(
            "[etcd]\nendpoints = [\"https://e:2379\"]",
            &[],
            "etcd.endpoints: \"https://e:2379\": TLS to etcd is not supported yet",
        );
        check_err("[node]\nid = \" \"", &[], "node.id: must not be empty");
        check_err("[node]\nid = true", &[], "node");
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
        check_err(
            "[delivery]\nmax_attempts = 0",
            &[],
            "delivery.max_attempts: must be 1 to 1000 (got 0)",
        );
        check_err(
            "[delivery]\nack_timeout = \"1ms\"",
            &[],
            "delivery.ack_timeout: must be at least 10ms",
        );
        check_err(
            "[delivery]\nack_timeout = \"2d\"\ngroups = [\"g\"]\n[delivery.streams.orders]",
            &[],
            "delivery.ack_timeout: must be shorter than records.retention (1day) for watched stream \"orders\"",
        );
        check_err(
            "[records]\nretention = \"1m\"\n[delivery.streams.orders]\ngroups = [\"g\"]\nack_timeout = \"90s\"",
            &[],
            "delivery.streams.orders.ack_timeout: must be shorter than records.retention",
        );
        check_err(
            "[delivery]\nbackoff = \"10s\"\nbackoff_max = \"1s\"",
            &[],
            "delivery.backoff_max: must not be shorter than delivery.backoff",
        );
        check_err(
            "[delivery]\nbackoff_jitter = 1.5",
            &[],
            "delivery.backoff_jitter: must be 0 to 1",
        );
        check_err("[delivery]\nsweep_batch = 0", &[], "delivery.sweep_batch");
        check_err(
            "[delivery]\nsweep_interval = \"1ms\"",
            &[],
            "delivery.sweep_interval",
        );
        check_err("[delivery]\ngroups = [\"a b\"]", &[], "delivery.groups");
        check_err(
            "[delivery]\ngroups = [\"g\", \"g\"]",
            &[],
            "delivery.groups: lists a group twice",
        );
        check_err(
            "[delivery.streams.orders]\n",
            &[],
            "delivery.streams.orders.groups: no consumer group to watch",
        );
        check_err(
            "[delivery.streams.orders]\ngroups = []",
            &[],
            "delivery.streams.orders.groups: no consumer group",
        );
        check_err(
            "[delivery.streams.orders]\ngroups = [\"g\"]\nmax_attempts = -1",
            &[],
            "delivery.streams.orders.max_attempts",
        );
        check_err(
            "[delivery.streams.orders]\ngroups = [\"g\"]\nbackoff_jitter = -0.1",
            &[],
            "delivery.streams.orders.backoff_jitter",
        );
        check_err(
            "[delivery.streams.orders]\ngroups = [\"g\"]\nback_off = \"1s\"",
            &[],
            "unknown field `back_off`",
        );
        check_err(
            "[delivery.streams.orders]\ngroups = [\"g\"]\ndead_letter_stream = \"orders\"",
            &[],
            "delivery.streams.orders.dead_letter_stream: must differ",
        );
        check_err(
            "[delivery]\ngroups = [\"g\"]\n[delivery.streams.a]\ndead_letter_stream = \"x\"\n[delivery.streams.b]\ndead_letter_stream = \"x\"",
            &[],
            "dead_letter_stream: \"x\" is also used by stream",
        );
        check_err(
            "[delivery]\ngroups = [\"g\"]\n[delivery.streams.a]\ndead_letter_stream = \"b\"\n[delivery.streams.b]\n",
            &[],
            "delivery.streams.a.dead_letter_stream",
        );
        check_err(
            "[forwarder]\nid_field = \"\"\n[delivery.streams.orders]\ngroups = [\"g\"]",
            &[],
            "forwarder.id_field: must be set while",
        );
        check_err(
            "[forwarder]\nattempt_field = \"\"\n[delivery.streams.orders]\ngroups = [\"g\"]",
            &[],
            "forwarder.attempt_field: must be set while",
        );
        check_err(
            "",
            &[("DELAYQ_DELIVERY_MAX_ATTEMPTS", "0")],
            "delivery.max_attempts",
        );
    }

    #[test]
    fn request_timeout_and_max_concurrent_requests_at_the_ends_of_their_range() {
        let ms = Duration::from_millis;
        /// TOML, environment, and (request_timeout, max_concurrent_requests) or a refusal.
        type Case = (
            &'static str,
            &'static [(&'static str, &'static str)],
            Result<(Duration, usize), &'static str>,
        );
        #[rustfmt::skip]
        let cases: [Case; 11] = [
            ("", &[], Ok((ms(30_000), 1024))),
            ("[api]\nrequest_timeout = \"100ms\"", &[], Ok((ms(100), 1024))),
            ("[api]\nrequest_timeout = \"1h\"", &[], Ok((ms(3_600_000), 1024))),
            ("", &[("DELAYQ_API_REQUEST_TIMEOUT", "250ms")], Ok((ms(250), 1024))),
            ("[api]\nmax_concurrent_requests = 1", &[], Ok((ms(30_000), 1))),
            ("", &[("DELAYQ_API_MAX_CONCURRENT_REQUESTS", "100000")], Ok((ms(30_000), 100_000))),
            ("[api]\nrequest_timeout = \"99ms\"", &[], Err("api.request_timeout: 99ms: must be 100ms to 1h")),
            ("[api]\nrequest_timeout = \"1h 1ms\"", &[], Err("api.request_timeout: 1h 1ms: must be 100ms to 1h")),
            ("[api]\nrequest_timeout = \"soon\"", &[], Err("request_timeout")),
            ("[api]\nmax_concurrent_requests = 0", &[], Err("api.max_concurrent_requests: must be 1 to 100000 (got 0)")),
            ("[api]\nmax_concurrent_requests = 100001", &[], Err("api.max_concurrent_requests: must be 1 to 100000 (got 100001)")),
        ];
        for (toml, env_pairs, expected) in cases {
            match expected {
                Ok(want) => {
                    let c = Config::from_toml(toml, env(env_pairs)).unwrap();
                    let got = (c.api.request_timeout, c.api.max_concurrent_requests);
                    assert_eq!(got, want, "{toml} {env_pairs:?}");
                }
                Err(part) => check_err(toml, env_pairs, part),
            }
        }
    }

    #[test]
    fn delivery_streams_inherit_the_defaults() {
        let c = Config::from_toml(
            "[delivery]\ngroups = [\"workers\"]\nack_timeout = \"30s\"\n\
             [delivery.streams.orders]\n\
             [delivery.streams.billing]\ngroups = [\"a\", \"b\"]\nmax_attempts = 3\nbackoff = \"2s\"\ndead_letter_stream = \"billing-failed\"\n",
            env(&[]),
        )
        .unwrap();
        let names: Vec<_> = c
            .delivery
            .streams
            .iter()
            .map(|s| s.stream.as_str())
            .collect();
        assert_eq!(names, ["billing", "orders"]);
        let orders = c.delivery.stream("orders").unwrap();
        assert_eq!(orders.groups, ["workers"]);
        assert_eq!(orders.ack_timeout, Duration::from_secs(30));
        assert_eq!(orders.max_attempts, 10);
        assert_eq!(orders.dead_letter_stream, "orders:dead");
        let billing = c.delivery.stream("billing").unwrap();
        assert_eq!(billing.groups, ["a", "b"]);
        assert_eq!(billing.ack_timeout, Duration::from_secs(30));
        assert_eq!(billing.max_attempts, 3);
        assert_eq!(billing.backoff.first, Duration::from_secs(2));
        assert_eq!(billing.backoff.max, Duration::from_secs(300));
        assert_eq!(c.dead_letter_stream("billing"), "billing-failed");
        assert_eq!(c.dead_letter_stream("unwatched"), "unwatched:dead");
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
    fn tokens_open_non_loopback_addresses() {
        let c = Config::from_toml(
            "[api]\nlisten = \"0.0.0.0:7070\"",
            env(&[("DELAYQ_API_TOKENS", "s3cret, other")]),
        )
        .unwrap();
        assert_eq!(exposed(&c.api.tokens), ["s3cret", "other"]);
        let c = Config::from_toml("[api]\nlisten = \"[::1]:7070\"", env(&[])).unwrap();
        assert!(c.api.tokens.is_empty());
    }

    #[test]
    fn tokens_of_each_scope_come_from_lists_files_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let (admin, write, read) = (
            file("admin", "a2\n"),
            file("write", "w2\n\n  w3  \n"),
            file("read", "r2"),
        );
        let c = Config::from_toml(
            &format!(
                "[api]\nlisten = \"0.0.0.0:7070\"\ntokens = [\"a1\"]\ntokens_file = \"{admin}\"\n\
                 write_tokens = [\"w1\"]\nwrite_tokens_file = \"{write}\"\nread_tokens_file = \"{read}\""
            ),
            env(&[("DELAYQ_API_READ_TOKENS", "r1, r0")]),
        )
        .unwrap();
        assert_eq!(exposed(&c.api.tokens), ["a1", "a2"]);
        assert_eq!(exposed(&c.api.write_tokens), ["w1", "w2", "w3"]);
        assert_eq!(exposed(&c.api.read_tokens), ["r1", "r0", "r2"]);
        // Tokens of a lower scope alone are authentication enough to listen beyond loopback.
        for (toml, env_pairs) in [
            (
                "[api]\nlisten = \"0.0.0.0:7070\"\nread_tokens = [\"r\"]",
                &[][..],
            ),
            (
                "[api]\nlisten = \"0.0.0.0:7070\"",
                &[("DELAYQ_API_WRITE_TOKENS", "w")][..],
            ),
        ] {
            let c = Config::from_toml(toml, env(env_pairs)).unwrap();
            assert!(c.api.tokens.is_empty(), "{toml}");
        }
        #[rustfmt::skip]
        let refusals = [
            ("[api]\nwrite_tokens = [\"\"]", "api.write_tokens: an empty token"),
            ("[api]\nread_tokens = [\"a b\"]", "api.read_tokens: a token: must be non-empty"),
            ("[api]\nread_tokens_file = \"/nonexistent/read\"", "api.read_tokens_file: cannot read /nonexistent/read"),
            ("[api]\nwrite_tokens_file = \"/nonexistent/write\"", "api.write_tokens_file: cannot read"),
            ("[api]\ntokens = [\"t\"]\nwrite_tokens = [\"t\"]", "api.write_tokens: a token is also of a higher scope"),
            ("[api]\ntokens = [\"t\"]\nread_tokens = [\"t\"]", "api.read_tokens: a token is also of a higher scope"),
            ("[api]\nwrite_tokens = [\"t\"]\nread_tokens = [\"u\", \"t\"]", "api.read_tokens: a token is also of a higher scope"),
        ];
        for (toml, expected) in refusals {
            check_err(toml, &[], expected);
        }
        let err = Config::from_toml(
            "[api]\ntokens = [\"t0p\"]\nread_tokens = [\"t0p\"]",
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("t0p"), "{err}");
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
        check_target("[redis]\nprefix = \"dq\"", "delayq:inbox", None);
        check_target(
            "[redis]\nprefix = \"dq\"",
            "dq:inbox",
            Some("delayq's own keys"),
        );
        check_target("[inbox]\nstream = \"mq\"", "mq", Some("delayq's inbox"));
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
        assert_eq!(c.api.request_timeout, d.api.request_timeout);
        assert_eq!(c.api.max_concurrent_requests, d.api.max_concurrent_requests);
        assert_eq!(exposed(&c.api.tokens), exposed(&d.api.tokens));
        assert_eq!(exposed(&c.api.write_tokens), exposed(&d.api.write_tokens));
        assert_eq!(exposed(&c.api.read_tokens), exposed(&d.api.read_tokens));
        let (ci, di) = (c.inbox.expect("enabled"), d.inbox.expect("enabled"));
        assert_eq!(
            (ci.stream, ci.group, ci.rejected_stream),
            (di.stream, di.group, di.rejected_stream)
        );
        assert_eq!(
            (ci.batch_size, ci.reclaim_after),
            (di.batch_size, di.reclaim_after)
        );
        assert_eq!(c.delivery.streams, d.delivery.streams);
        assert_eq!(c.delivery.sweep_interval, d.delivery.sweep_interval);
        assert_eq!(c.delivery.sweep_batch, d.delivery.sweep_batch);
    }

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
