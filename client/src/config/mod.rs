//! The validated configuration every module is handed ([`Config`] and its
//! sections), its helpers, and the public API: a TOML file, then
//! `DELAYQ_<SECTION>_<KEY>` environment overrides, then validation into [`Config`],
//! once, at start. Every error names the key.
//!
//! The stages: `raw.rs` (serde structs, defaults), `env.rs` (overrides),
//! `validate.rs` (raw into [`Config`], a file a section under `validate/`) and
//! `effective.rs` (the table check-config prints and a reload compares).

mod effective;
mod env;
mod fields;
mod glob;
mod raw;
mod schedules;
mod token;
mod topology;
mod validate;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use crate::message::Limits;
use crate::secret::{RedisUrl, SecretString};

pub use effective::redact;
pub use env::overridden as overridden_by_env;
pub use glob::glob_match;
pub use schedules::{MAX_SCHEDULES_RANGE, SchedulerConfig};
pub use token::{ApiToken, MAX_NAME as MAX_TOKEN_NAME};

use env::read_raw;

#[derive(Debug, Error)]
pub enum ConfigError {
    /// Shown after the file's name, which every caller puts first.
    #[error("cannot read it: {source}")]
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
    pub pending: PendingConfig,
    pub election: ElectionConfig,
    pub log: LogConfig,
    pub delivery: DeliveryConfig,
    /// None: producers cannot schedule through the inbox stream.
    pub inbox: Option<InboxConfig>,
    /// `[journal]`: None unless `journal.url` is set.
    pub journal: Option<JournalConfig>,
    pub metrics: MetricsConfig,
    pub scheduler: SchedulerConfig,
    /// `[[schedules]]`: the schedules the file declares (each `declared`).
    pub schedules: Vec<crate::schedule::ScheduleSpec>,
}

/// `[metrics]`: what the exported series may grow to.
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    /// Streams named in the per-stream series (`stream` label) of targets any
    /// push may name; the others are counted under `stream="_other"`.
    pub max_streams: usize,
}

/// `[journal]`: the MySQL / MariaDB journal of messages.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Shown redacted; `expose()` only to connect.
    pub url: crate::secret::RedisUrl,
    /// How long finished messages stay in the journal.
    pub retention: Duration,
    /// Whether every change of a message is a row of the transition log, and how
    /// long a message's steps stay there.
    pub transitions: bool,
    pub transitions_retention: Duration,
    /// Restore by itself when Redis has lost its data (see `keeper`).
    pub auto_restore: bool,
    /// `journal.tls`: TLS required, the server's certificate checked against these
    /// CAs (PEM; None: the system's roots) and the URL's host.
    pub tls: Option<Option<std::path::PathBuf>>,
}

#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// Shown redacted; `expose()` only to connect.
    pub url: RedisUrl,
    /// `redis.tls_*` for a `rediss://` URL (None: plain TCP, or TLS with the system's
    /// trust store and no client certificate).
    pub tls: Option<crate::store::RedisTls>,
    /// The master found through Sentinel (`url` then gives scheme, user, password
    /// and database only).
    pub sentinel: Option<crate::store::SentinelConfig>,
    /// `redis.mode = "cluster"`: the seed nodes, host and port (`url`'s first; the
    /// URL then gives scheme, user and password).
    pub cluster: Option<Vec<(String, u16)>>,
    /// Replicas that must confirm each push, and how long to wait for them.
    pub replicas_acked: Option<(u32, Duration)>,
    pub prefix: String,
    /// Standalone: `redis.shards`; cluster: one unit per hash slot (16384).
    pub shards: u16,
    pub timeout: Duration,
    pub connect_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// TLS to the members (`https://` endpoints).
    pub tls: Option<EtcdTls>,
    /// The etcd user delayq authenticates as, and its password.
    pub auth: Option<(String, SecretString)>,
    /// Election key prefix, `/delayq/<cluster>/leader` unless set.
    pub election_prefix: String,
    pub lease_ttl: Duration,
    pub failsafe: bool,
    pub connect_timeout: Duration,
}

/// The PEM contents of `etcd.tls_*` files, checked to parse.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// CA certificates to trust instead of the system's.
    pub ca: Option<String>,
    /// Client certificate chain and private key, for mutual TLS.
    pub client: Option<(String, SecretString)>,
    /// The name the members' certificates are checked against, instead of the
    /// endpoint's host.
    pub server_name: Option<String>,
}

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// What this node tells others to reach it at (`host:port`), when the address
    /// it listens on is not that (0.0.0.0 in a container); None: the bound address.
    pub advertise: Option<String>,
    pub limits: Limits,
    /// Bearer tokens of the admin scope: every `/v1/*` endpoint. With no token of
    /// any scope there is no authentication (loopback only).
    pub tokens: Vec<ApiToken>,
    /// Bearer tokens of the write scope: scheduling, consuming, and what `read`
    /// allows; each may be limited to some streams.
    pub write_tokens: Vec<ApiToken>,
    /// Bearer tokens of the read scope: looking, without changing anything; each
    /// may be limited to some streams.
    pub read_tokens: Vec<ApiToken>,
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
    /// HTTPS instead of HTTP (`api.tls`).
    pub tls: Option<ApiTls>,
    /// Entries of the audit trail kept in Redis (`<prefix>:audit`; 0: only logged).
    pub audit_length: u64,
}

/// `api.tls`: the certificate the API serves, read again at each reload, and the
/// CAs whose client certificates it asks for (mutual TLS).
#[derive(Clone, Debug)]
pub struct ApiTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    /// PEM; None: no client certificate asked for.
    pub client_ca: Option<String>,
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
    /// Most messages a second forwarded to each listed stream (the others have no
    /// limit but `forwarder.max_rate`).
    pub max_rate: Vec<(String, u64)>,
    /// Streams whose entries carry the business key in a field of their own
    /// (None: none), instead of `forwarder.key_field`.
    pub key_field: Vec<(String, Option<String>)>,
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
    /// Most messages forwarded a second, over all shards (0 = no limit): after an
    /// outage, or when many fall due at once, the backlog drains at this rate in
    /// due order instead of flooding consumers. Reloadable.
    pub max_rate: u64,
    pub id_field: Option<String>,
    pub attempt_field: Option<String>,
    /// Field that carries a message's business key on its entry (None = not added).
    pub key_field: Option<String>,
    pub dead_letter_suffix: String,
}

#[derive(Clone, Debug)]
pub struct RecordsConfig {
    pub retention: Duration,
    pub trim_interval: Duration,
    /// How terminal records are kept in Redis (see `store::RecordLayout`).
    pub layout: crate::store::RecordLayout,
    /// Whether each stream's finished messages are listed too (newest first).
    pub finished_list: bool,
}

#[derive(Clone, Debug)]
pub struct PendingConfig {
    /// How scheduled messages are kept in Redis (see `store::PendingLayout`).
    pub layout: crate::store::PendingLayout,
}

/// Who moves which shards: one leader for all, or one per group of shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    /// Election groups: 1 in the single-leader mode; with `election.mode =
    /// "per_shard"`, shard `s` belongs to group `s % groups`, and each group has an
    /// election (and epochs) of its own.
    pub groups: u16,
    pub per_shard: bool,
}

impl ElectionConfig {
    /// The shards of `group`, in order.
    pub fn shards_of(&self, group: u16, shards: u16) -> Vec<u16> {
        (0..shards).filter(|s| s % self.groups == group).collect()
    }

    /// One group leader's share of a rate limit (0: unlimited), so that the
    /// groups' leaders together keep to it: a fraction of a message a second when
    /// the limit is below the number of groups.
    pub fn rate_share(&self, rate: u64) -> f64 {
        rate as f64 / f64::from(self.groups)
    }
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
        let env: Vec<(String, String)> = env.into_iter().collect();
        read_raw(text, env.iter().cloned())
            .and_then(|raw| raw.validate())
            .map_err(|e| env::blame_env(&env, e))
    }

    /// The streams whose pushes are kept apart from the others' (see
    /// `Store::keep_apart`): those with a rate limit of their own.
    pub fn kept_apart(&self) -> Vec<String> {
        self.streams
            .max_rate
            .iter()
            .map(|(stream, _)| stream.clone())
            .collect()
    }

    /// Options of the forward script for this configuration.
    pub fn forward_options(&self) -> crate::store::ForwardOptions {
        crate::store::ForwardOptions {
            batch_size: self.forwarder.batch_size,
            retention: self.records.retention,
            id_field: self.forwarder.id_field.clone(),
            attempt_field: self.forwarder.attempt_field.clone(),
            key_field: self.forwarder.key_field.clone(),
            stream_key_fields: self.streams.key_field.clone(),
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
            None => default_dead_letter_stream(
                stream,
                &self.forwarder.dead_letter_suffix,
                self.redis.cluster.is_some(),
            ),
        }
    }

    /// The streams whose rights the Redis user is checked for: each name in
    /// `streams.allow` that is no pattern and its dead-letter stream, and the
    /// inbox's streams (see `Store::rights`).
    pub fn checked_streams(&self) -> Vec<String> {
        let mut streams = Vec::new();
        for name in &self.streams.allow {
            if !name.contains(['*', '?', '[', '\\']) {
                streams.push(name.clone());
                streams.push(self.dead_letter_stream(name));
            }
        }
        if let Some(inbox) = &self.inbox {
            streams.push(inbox.stream.clone());
            streams.push(inbox.rejected_stream.clone());
        }
        streams.sort();
        streams.dedup();
        streams
    }

    /// Whether delayq runs on Redis Cluster (`redis.mode = "cluster"`).
    pub fn is_cluster(&self) -> bool {
        self.redis.cluster.is_some()
    }

    /// Where the store connects, as an error's context shows it: the URL (its
    /// password redacted) and, over TLS, the settings a failed handshake points at.
    pub fn redis_target(&self) -> String {
        if let Some(seeds) = &self.redis.cluster {
            return format!(
                "Redis Cluster through {} (redis.url, redis.nodes)",
                seeds
                    .iter()
                    .map(|(host, port)| format!("{host}:{port}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if let Some(sentinel) = &self.redis.sentinel {
            return format!(
                "the Redis master {:?} through Sentinel at {} (redis.sentinel)",
                sentinel.master,
                sentinel
                    .nodes
                    .iter()
                    .map(|(host, port)| format!("{host}:{port}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let server_name = self
            .redis
            .tls
            .as_ref()
            .and_then(|t| t.server_name.as_deref());
        if let Some(name) = server_name {
            format!(
                "Redis at {} over TLS, its certificate checked for {name} (redis.tls_server_name, redis.tls_ca_file, redis.tls_cert_file, redis.tls_key_file)",
                self.redis.url
            )
        } else if self.redis.url.expose().starts_with("rediss://") {
            format!(
                "Redis at {} over TLS (redis.tls_ca_file, redis.tls_cert_file, redis.tls_key_file, redis.tls_server_name)",
                self.redis.url
            )
        } else {
            format!("Redis at {}", self.redis.url)
        }
    }

    pub fn store_config(&self) -> crate::store::StoreConfig {
        crate::store::StoreConfig {
            url: self.redis.url.clone(),
            tls: self.redis.tls.clone(),
            sentinel: self.redis.sentinel.clone(),
            cluster: self.redis.cluster.clone(),
            replicas_acked: self.redis.replicas_acked,
            prefix: self.redis.prefix.clone(),
            shards: self.redis.shards,
            response_timeout: self.redis.timeout,
            connect_timeout: self.redis.connect_timeout,
            max_blocking_reads: self.api.max_polls,
            record_layout: self.records.layout,
            finished_list: self.records.finished_list,
            pending_layout: self.pending.layout,
            journal: self.journal.is_some(),
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
            let allowed = match self.streams.allow.join(", ") {
                none if none.is_empty() => "none: streams.allow is empty".to_owned(),
                some => some,
            };
            return Some(format!(
                "stream {stream:?}: not allowed (allowed: {allowed})"
            ));
        }
        if self.is_cluster() {
            return crate::store::cluster_stream_refusal(stream);
        }
        None
    }
}

/// A stream's dead-letter stream unless configured: `<stream><suffix>`, or on Redis
/// Cluster the name in the stream's own slot (see `store::cluster_dead_letter_stream`).
pub fn default_dead_letter_stream(stream: &str, suffix: &str, cluster: bool) -> String {
    match cluster {
        true => crate::store::cluster_dead_letter_stream(stream, suffix)
            .unwrap_or_else(|| format!("{stream}{suffix}")),
        false => format!("{stream}{suffix}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::ExposeSecret;

    pub(super) fn exposed(tokens: &[ApiToken]) -> Vec<&str> {
        tokens.iter().map(|t| t.secret.expose_secret()).collect()
    }

    pub(super) fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
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
        check_target(
            "[streams]\nallow = []",
            "orders",
            Some("not allowed (allowed: none: streams.allow is empty)"),
        );
    }
}
