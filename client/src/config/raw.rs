//! The raw configuration: serde structs as the file and the environment spell
//! it, unknown keys refused, each section's defaults in its `Default`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod schedule;
pub(super) use schedule::{RawInstant, RawSchedule};

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct Raw {
    pub(super) node: RawNode,
    pub(super) redis: RawRedis,
    pub(super) etcd: RawEtcd,
    pub(super) api: RawApi,
    pub(super) streams: RawStreams,
    pub(super) forwarder: RawForwarder,
    pub(super) records: RawRecords,
    pub(super) pending: RawPending,
    pub(super) election: RawElection,
    pub(super) log: RawLog,
    pub(super) delivery: RawDelivery,
    pub(super) inbox: RawInbox,
    pub(super) journal: RawJournal,
    pub(super) metrics: RawMetrics,
    pub(super) scheduler: RawScheduler,
    pub(super) schedules: Vec<RawSchedule>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawScheduler {
    #[serde(with = "humantime_serde")]
    pub(super) horizon: Duration,
    pub(super) max_schedules: i64,
}

impl Default for RawScheduler {
    fn default() -> Self {
        RawScheduler {
            horizon: Duration::from_secs(60),
            max_schedules: 10_000,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) max_streams: i64,
}

impl Default for RawMetrics {
    fn default() -> Self {
        RawMetrics { max_streams: 100 }
    }
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawNode {
    /// Any non-empty name; a bare number (`id = 123`, `DELAYQ_NODE_ID=123`) too.
    #[serde(deserialize_with = "text_or_number")]
    pub(super) id: Option<String>,
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
pub(super) struct RawRedis {
    pub(super) url: String,
    /// A file holding the password, put into `url` (never logged).
    pub(super) password_file: Option<String>,
    /// TLS (`rediss://`): CA certificates to trust (PEM; default: the system's).
    pub(super) tls_ca_file: Option<String>,
    /// Mutual TLS: the client's certificate chain and private key (PEM).
    pub(super) tls_cert_file: Option<String>,
    pub(super) tls_key_file: Option<String>,
    /// The name the server's certificate must carry, when not the URL's host.
    pub(super) tls_server_name: Option<String>,
    /// Find the master through Sentinel instead of `url`'s host.
    pub(super) sentinel: Option<RawSentinel>,
    /// "standalone" (one Redis, or the master Sentinel names) or "cluster".
    pub(super) mode: String,
    /// Redis Cluster: more seed nodes, "host:port" each, besides `url`'s.
    pub(super) nodes: Vec<String>,
    pub(super) prefix: String,
    /// Standalone only (unset: 16); in cluster mode the units are the hash slots.
    pub(super) shards: Option<i64>,
    #[serde(with = "humantime_serde")]
    pub(super) timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(super) connect_timeout: Duration,
    /// Replicas that must confirm a push (`WAIT`) before it is acknowledged.
    pub(super) min_replicas_acked: i64,
    /// How long to wait for them.
    #[serde(with = "humantime_serde")]
    pub(super) replicas_ack_timeout: Duration,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSentinel {
    /// The name the Sentinels monitor the master under.
    pub(super) master: String,
    /// The Sentinels, "host:port" each.
    pub(super) nodes: Vec<String>,
    /// An ACL user on the Sentinels, with its password in `password_file`; a
    /// password alone (Sentinel's `requirepass`) needs no user.
    pub(super) user: Option<String>,
    pub(super) password_file: Option<String>,
    /// TLS to the Sentinels too, with `redis.tls_*` (default: as to the data nodes).
    pub(super) tls: Option<bool>,
}

impl Default for RawRedis {
    fn default() -> Self {
        RawRedis {
            url: "redis://127.0.0.1:6379".into(),
            password_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_server_name: None,
            sentinel: None,
            mode: "standalone".into(),
            nodes: Vec::new(),
            prefix: "delayq".into(),
            shards: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            min_replicas_acked: 0,
            replicas_ack_timeout: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawEtcd {
    pub(super) endpoints: Vec<String>,
    /// TLS (`https://` endpoints): CA certificates to trust (PEM; default: the system's).
    pub(super) tls_ca_file: Option<String>,
    /// Mutual TLS: the client's certificate chain and private key (PEM).
    pub(super) tls_cert_file: Option<String>,
    pub(super) tls_key_file: Option<String>,
    /// The name the members' certificates must carry, when not the endpoints' host.
    pub(super) tls_server_name: Option<String>,
    /// etcd user (RBAC), with its password in `password_file`.
    pub(super) user: Option<String>,
    pub(super) password_file: Option<String>,
    pub(super) cluster: String,
    pub(super) prefix: Option<String>,
    #[serde(with = "humantime_serde")]
    pub(super) lease_ttl: Duration,
    pub(super) failsafe: bool,
    #[serde(with = "humantime_serde")]
    pub(super) connect_timeout: Duration,
}

impl Default for RawEtcd {
    fn default() -> Self {
        RawEtcd {
            endpoints: Vec::new(),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_server_name: None,
            user: None,
            password_file: None,
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
pub(super) struct RawApi {
    pub(super) listen: String,
    /// The address other nodes, the dashboard and the CLI are told (host:port).
    pub(super) advertise: Option<String>,
    pub(super) max_message_bytes: i64,
    #[serde(with = "humantime_serde")]
    pub(super) max_delay: Duration,
    pub(super) max_fields: i64,
    pub(super) tokens: Vec<String>,
    /// A file with more tokens, one a line (never logged).
    pub(super) tokens_file: Option<String>,
    pub(super) write_tokens: Vec<String>,
    pub(super) write_tokens_file: Option<String>,
    pub(super) read_tokens: Vec<String>,
    pub(super) read_tokens_file: Option<String>,
    pub(super) max_batch: i64,
    pub(super) max_body_bytes: i64,
    #[serde(with = "humantime_serde")]
    pub(super) max_wait: Duration,
    pub(super) max_polls: i64,
    #[serde(with = "humantime_serde")]
    pub(super) request_timeout: Duration,
    pub(super) max_concurrent_requests: i64,
    /// HTTPS: `{ cert_file, key_file, client_ca_file }`.
    pub(super) tls: Option<RawApiTls>,
    /// Entries of the audit trail kept in Redis.
    pub(super) audit_length: i64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApiTls {
    pub(super) cert_file: String,
    pub(super) key_file: String,
    pub(super) client_ca_file: Option<String>,
}

impl Default for RawApi {
    fn default() -> Self {
        RawApi {
            listen: "127.0.0.1:7070".into(),
            advertise: None,
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
            tls: None,
            audit_length: 10_000,
            max_concurrent_requests: 1024,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawJournal {
    /// `mysql://user@host:port/database` (MySQL 8, MariaDB 10.6+); unset: no journal.
    pub(super) url: Option<String>,
    /// A file holding the password, put into `url` (never logged).
    pub(super) password_file: Option<String>,
    /// How long finished messages stay in the journal.
    #[serde(with = "humantime_serde")]
    pub(super) retention: Duration,
    /// Whether every change of a message is a row of the transition log.
    pub(super) transitions: bool,
    /// How long a message's steps stay in the transition log.
    #[serde(with = "humantime_serde")]
    pub(super) transitions_retention: Duration,
    /// When Redis has lost its data, schedule every message the journal holds not
    /// finished again by itself (false: wait for `delayq restore`).
    pub(super) auto_restore: bool,
    /// TLS to the server, required: `{ ca_file }` (none: the system's roots).
    pub(super) tls: Option<RawJournalTls>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJournalTls {
    pub(super) ca_file: Option<String>,
}

impl Default for RawJournal {
    fn default() -> Self {
        RawJournal {
            url: None,
            password_file: None,
            retention: Duration::from_secs(30 * 86_400),
            transitions: true,
            transitions_retention: Duration::from_secs(30 * 86_400),
            auto_restore: true,
            tls: None,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawInbox {
    pub(super) enabled: bool,
    /// Default `<redis.prefix>:inbox`, so deployments sharing a Redis never collide.
    pub(super) stream: Option<String>,
    /// Default `<redis.prefix>`.
    pub(super) group: Option<String>,
    /// Default `<redis.prefix>:inbox:rejected`.
    pub(super) rejected_stream: Option<String>,
    pub(super) batch_size: i64,
    #[serde(with = "humantime_serde")]
    pub(super) reclaim_after: Duration,
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
pub(super) struct RawStreams {
    pub(super) allow: Vec<String>,
    pub(super) default_maxlen: i64,
    pub(super) maxlen: BTreeMap<String, i64>,
    pub(super) max_rate: BTreeMap<String, i64>,
    pub(super) key_field: BTreeMap<String, String>,
}

impl Default for RawStreams {
    fn default() -> Self {
        RawStreams {
            allow: vec!["*".into()],
            default_maxlen: 0,
            maxlen: BTreeMap::new(),
            max_rate: BTreeMap::new(),
            key_field: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawForwarder {
    pub(super) batch_size: i64,
    #[serde(with = "humantime_serde")]
    pub(super) idle_wakeup: Duration,
    pub(super) id_field: String,
    pub(super) attempt_field: String,
    pub(super) key_field: String,
    pub(super) dead_letter_suffix: String,
    pub(super) max_rate: i64,
}

impl Default for RawForwarder {
    fn default() -> Self {
        RawForwarder {
            batch_size: 200,
            idle_wakeup: Duration::from_secs(1),
            id_field: "delayq-id".into(),
            attempt_field: "delayq-attempt".into(),
            key_field: String::new(),
            dead_letter_suffix: ":dead".into(),
            max_rate: 0,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRecords {
    #[serde(with = "humantime_serde")]
    pub(super) retention: Duration,
    #[serde(with = "humantime_serde")]
    pub(super) trim_interval: Duration,
    pub(super) layout: String,
    pub(super) finished_list: bool,
}

impl Default for RawRecords {
    fn default() -> Self {
        RawRecords {
            retention: Duration::from_secs(24 * 3600),
            trim_interval: Duration::from_secs(10),
            layout: "compact".into(),
            finished_list: true,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawPending {
    pub(super) layout: String,
}

impl Default for RawPending {
    fn default() -> Self {
        RawPending {
            layout: "compact".into(),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawElection {
    /// "single": one leader moves every shard; "per_shard": the shards are split
    /// into `groups`, each with an election of its own.
    pub(super) mode: String,
    /// Election groups with `mode = "per_shard"` (default: 4, at most `redis.shards`).
    pub(super) groups: Option<i64>,
}

impl Default for RawElection {
    fn default() -> Self {
        RawElection {
            mode: "single".into(),
            groups: None,
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawDelivery {
    pub(super) groups: Vec<String>,
    #[serde(with = "humantime_serde")]
    pub(super) ack_timeout: Duration,
    pub(super) max_attempts: i64,
    #[serde(with = "humantime_serde")]
    pub(super) backoff: Duration,
    #[serde(with = "humantime_serde")]
    pub(super) backoff_max: Duration,
    pub(super) backoff_jitter: f64,
    #[serde(with = "humantime_serde")]
    pub(super) sweep_interval: Duration,
    pub(super) sweep_batch: i64,
    pub(super) streams: BTreeMap<String, RawStreamDelivery>,
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
pub(super) struct RawStreamDelivery {
    pub(super) groups: Option<Vec<String>>,
    #[serde(with = "humantime_serde")]
    pub(super) ack_timeout: Option<Duration>,
    pub(super) max_attempts: Option<i64>,
    #[serde(with = "humantime_serde")]
    pub(super) backoff: Option<Duration>,
    #[serde(with = "humantime_serde")]
    pub(super) backoff_max: Option<Duration>,
    pub(super) backoff_jitter: Option<f64>,
    pub(super) dead_letter_stream: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) level: String,
    pub(super) format: String,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            level: "info".into(),
            format: "text".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::{env, exposed};

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
    fn inbox_defaults_and_switch() {
        let c = Config::from_toml("", env(&[])).unwrap();
        let inbox = c.inbox.expect("enabled by default");
        assert_eq!(inbox.stream, "delayq:inbox");
        assert_eq!(inbox.rejected_stream, "delayq:inbox:rejected");
        let c = Config::from_toml("", env(&[("DELAYQ_INBOX_ENABLED", "false")])).unwrap();
        assert!(c.inbox.is_none());
    }

    #[test]
    fn the_shipped_config_file_is_valid_and_matches_the_defaults() {
        let text = include_str!("../../../config/delayq.toml");
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
}
