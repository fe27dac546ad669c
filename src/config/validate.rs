//! Validation: [`Raw`] into [`Config`], each section destructured in full so a new
//! raw field cannot be forgotten, every refusal naming its key.

mod delivery;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::store::{PendingLayout, RecordLayout};

use super::raw::{
    Raw, RawApi, RawElection, RawEtcd, RawForwarder, RawInbox, RawJournal, RawLog, RawNode,
    RawPending, RawRecords, RawRedis, RawSentinel, RawStreams,
};
use super::{
    ApiConfig, Config, ConfigError, ElectionConfig, EtcdConfig, EtcdTls, ForwarderConfig,
    InboxConfig, JournalConfig, LogConfig, PendingConfig, RecordsConfig, RedisConfig,
    StreamsConfig, invalid,
};
use crate::message::{Limits, is_plain};
use crate::pem;
use crate::secret::{self, ExposeSecret, RedisUrl, SecretString};
use crate::store::{RedisTls, SentinelConfig};

/// The longest `api.request_timeout`.
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// The longest `api.max_delay` allowed.
const MAX_DELAY_LIMIT: Duration = Duration::from_secs(36_500 * 24 * 3600);

/// Highest `redis.min_replicas_acked`.
const MAX_REPLICAS: i64 = 64;

/// Highest `forwarder.max_rate`, messages a second: ten times what one Redis moves.
const MAX_RATE: u64 = 10_000_000;
/// The longest `records.retention`: ten years, as for the journal.
const MAX_RETENTION: Duration = Duration::from_secs(3650 * 86_400);
/// The longest `etcd.lease_ttl`.
const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

fn positive(key: &str, value: i64, max: i64) -> Result<i64, ConfigError> {
    if value < 1 || value > max {
        return Err(invalid(key, format!("must be 1 to {max} (got {value})")));
    }
    Ok(value)
}

/// Why a batch setting ends where it does.
pub(super) const LONG_CALL: &str = "a longer batch holds Redis for longer in one script call";

/// [`positive`], a refusal past `max` saying why the range ends there.
pub(super) fn positive_because(
    key: &str,
    value: i64,
    max: i64,
    why: &str,
) -> Result<i64, ConfigError> {
    if value > max {
        return Err(invalid(
            key,
            format!("must be 1 to {max} (got {value}): {why}"),
        ));
    }
    positive(key, value, max)
}

/// The PEM files of `<section>.tls_*`, read and checked: each must hold what its
/// key names, and only TLS endpoints (`needs`) take them.
struct TlsFiles {
    ca: Option<String>,
    client: Option<(String, SecretString)>,
}

fn tls_files(
    section: &str,
    tls: Result<(), &str>,
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<Option<TlsFiles>, ConfigError> {
    let key = |name: &str| format!("{section}.{name}");
    if let Err(needs) = tls {
        for (name, set) in [
            ("tls_ca_file", &ca_file),
            ("tls_cert_file", &cert_file),
            ("tls_key_file", &key_file),
        ] {
            if set.is_some() {
                return Err(invalid(&key(name), needs));
            }
        }
        return Ok(None);
    }
    let read_pem = |key: &str, path: &str| -> Result<String, ConfigError> {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| invalid(key, format!("cannot read {path}: {e}")))?;
        pem::check_certificates(&pem).map_err(|e| invalid(key, format!("{path}: {e}")))?;
        Ok(pem)
    };
    let ca = ca_file
        .map(|path| read_pem(&key("tls_ca_file"), &path))
        .transpose()?;
    let client = match (cert_file, key_file) {
        (None, None) => None,
        (Some(cert), Some(path)) => {
            let cert = read_pem(&key("tls_cert_file"), &cert)?;
            let pem = read_secret(&key("tls_key_file"), &path)?;
            pem::check_key(&pem)
                .map_err(|e| invalid(&key("tls_key_file"), format!("{path}: {e}")))?;
            Some((cert, pem))
        }
        (Some(_), None) => {
            return Err(invalid(
                &key("tls_key_file"),
                format!("must be set with {section}.tls_cert_file"),
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                &key("tls_cert_file"),
                format!("must be set with {section}.tls_key_file"),
            ));
        }
    };
    Ok(Some(TlsFiles { ca, client }))
}

/// `nodes` as (host, port) pairs; `key` names them in the error.
fn host_ports(key: &str, nodes: &[String]) -> Result<Vec<(String, u16)>, ConfigError> {
    let mut addresses = Vec::with_capacity(nodes.len());
    for node in nodes {
        let parsed = node
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .filter(|(host, port)| !host.is_empty() && *port != 0);
        match parsed {
            Some((host, port)) => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                addresses.push((host.to_owned(), port));
            }
            None => return Err(invalid(key, format!("{node:?}: must be host:port"))),
        }
    }
    Ok(addresses)
}

/// On Redis Cluster, `key`'s `value` must share `other`'s hash slot: one script
/// writes both.
fn cluster_same_slot(
    key: &str,
    value: &str,
    other_key: &str,
    other: &str,
) -> Result<(), ConfigError> {
    use crate::store::slot_of;
    if slot_of(value) == slot_of(other) {
        return Ok(());
    }
    let hint = match crate::store::cluster_dead_letter_stream(other, ":x") {
        Some(example) => format!(" (for example {example:?}: a name with its hash tag)"),
        None => String::new(),
    };
    Err(invalid(
        key,
        format!(
            "{value:?} must be in the same Redis Cluster hash slot as {other_key} {other:?}{hint}"
        ),
    ))
}

/// `redis.mode = "cluster"`, checked: the seed nodes (`url`'s host first, then
/// `redis.nodes`), reached over TCP, without Sentinel or a certificate name of
/// their own (each node is dialed at the address the cluster announces).
fn cluster_seeds(
    url: &RedisUrl,
    nodes: &[String],
    sentinel: bool,
    tls: Option<&RedisTls>,
) -> Result<Option<Vec<(String, u16)>>, ConfigError> {
    if sentinel {
        return Err(invalid(
            "redis.sentinel",
            "cannot be used with redis.mode = \"cluster\" (Redis Cluster fails masters over by itself)",
        ));
    }
    if tls.is_some_and(|t| t.server_name.is_some()) {
        return Err(invalid(
            "redis.tls_server_name",
            "cannot be used with redis.mode = \"cluster\" (each node is dialed at the address the cluster announces; its certificate must carry that address)",
        ));
    }
    let Ok(parsed) = url::Url::parse(url.expose()) else {
        return Err(invalid(
            "redis.url",
            format!("{url:?}: not a valid Redis URL"),
        ));
    };
    let (Some(host), false) = (parsed.host_str(), url.expose().starts_with("unix://")) else {
        return Err(invalid(
            "redis.url",
            "redis.mode = \"cluster\" needs a redis:// or rediss:// URL with a host (a seed node)",
        ));
    };
    if parsed
        .path()
        .trim_start_matches('/')
        .parse::<u32>()
        .is_ok_and(|db| db != 0)
    {
        return Err(invalid(
            "redis.url",
            "Redis Cluster has one database: leave the URL's database out (or 0)",
        ));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut seeds = vec![(host, parsed.port().unwrap_or(6379))];
    for seed in host_ports("redis.nodes", nodes)? {
        if !seeds.contains(&seed) {
            seeds.push(seed);
        }
    }
    Ok(Some(seeds))
}

/// `redis.sentinel`, checked: a master name, Sentinels as host:port, a user only
/// with its password, and a data URL over TCP (its host is not used).
fn sentinel_config(
    raw: RawSentinel,
    url: &RedisUrl,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<SentinelConfig, ConfigError> {
    let RawSentinel {
        master,
        nodes,
        user,
        password_file,
        tls,
    } = raw;
    if url.expose().starts_with("unix://") {
        return Err(invalid(
            "redis.sentinel",
            "needs a redis:// or rediss:// redis.url (Sentinel names TCP addresses)",
        ));
    }
    if master.is_empty() || master.chars().any(char::is_whitespace) {
        return Err(invalid(
            "redis.sentinel.master",
            format!("{master:?}: must be non-empty, without spaces"),
        ));
    }
    if nodes.is_empty() {
        return Err(invalid(
            "redis.sentinel.nodes",
            "must name one Sentinel or more",
        ));
    }
    let addresses = host_ports("redis.sentinel.nodes", &nodes)?;
    let password = password_file
        .map(|path| read_secret("redis.sentinel.password_file", &path))
        .transpose()?;
    if user.is_some() && password.is_none() {
        return Err(invalid(
            "redis.sentinel.password_file",
            "must be set with redis.sentinel.user",
        ));
    }
    if user.as_deref() == Some("") {
        return Err(invalid("redis.sentinel.user", "must not be empty"));
    }
    Ok(SentinelConfig {
        master,
        nodes: addresses,
        user,
        password,
        tls: tls.unwrap_or_else(|| url.expose().starts_with("rediss://")),
    })
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
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        // Destructured in full, so a new raw field cannot be forgotten here.
        let Raw {
            node: RawNode { id },
            redis,
            etcd,
            api,
            streams,
            forwarder,
            records,
            pending: RawPending {
                layout: pending_layout,
            },
            election,
            log,
            delivery,
            inbox,
            journal,
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
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
            tls_server_name,
            sentinel,
            mode,
            nodes,
            prefix,
            shards,
            timeout,
            connect_timeout,
            min_replicas_acked,
            replicas_ack_timeout,
        } = redis;
        let redis_cluster = match mode.as_str() {
            "standalone" => {
                if !nodes.is_empty() {
                    return Err(invalid(
                        "redis.nodes",
                        "names Redis Cluster seed nodes: set redis.mode = \"cluster\" too",
                    ));
                }
                false
            }
            "cluster" => true,
            other => {
                return Err(invalid(
                    "redis.mode",
                    format!("{other:?}: must be \"standalone\" or \"cluster\""),
                ));
            }
        };
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
            Some(path) => with_password("redis", &url, read_secret("redis.password_file", &path)?)?,
            None => url,
        };
        let url = RedisUrl::new(url);
        let tls = tls_files(
            "redis",
            if url.expose().starts_with("rediss://") {
                Ok(())
            } else {
                Err("needs a rediss:// redis.url (TLS)")
            },
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
            &read_secret,
        )?
        .map(|TlsFiles { ca, client }| RedisTls {
            ca,
            client,
            server_name: None,
        });
        let tls = match tls_server_name {
            None => tls,
            Some(name) => {
                let key = "redis.tls_server_name";
                if !url.expose().starts_with("rediss://") {
                    return Err(invalid(key, "needs a rediss:// redis.url (TLS)"));
                }
                if sentinel.is_some() {
                    return Err(invalid(
                        key,
                        "cannot be used with redis.sentinel (the Sentinels name the master by address; its certificate must carry that address)",
                    ));
                }
                if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                    return Err(invalid(
                        key,
                        format!("{name:?}: must be a DNS name or an IP address"),
                    ));
                }
                tls.map(|t| RedisTls {
                    server_name: Some(name),
                    ..t
                })
            }
        };
        let sentinel = sentinel
            .map(|raw| sentinel_config(raw, &url, &read_secret))
            .transpose()?;
        let redis_cluster = if redis_cluster {
            cluster_seeds(&url, &nodes, sentinel.is_some(), tls.as_ref())?
        } else {
            None
        };
        crate::store::redis_client(&url, tls.as_ref()).map_err(|e| {
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
        let shards = match (&redis_cluster, shards) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "redis.shards",
                    "cannot be set with redis.mode = \"cluster\": there a stream's messages live in its own hash slot",
                ));
            }
            (Some(_), None) => crate::store::CLUSTER_SLOTS,
            (None, shards) => positive_because(
                "redis.shards",
                shards.unwrap_or(i64::from(crate::store::DEFAULT_SHARDS)),
                i64::from(crate::store::MAX_SHARDS),
                "each shard has its own forward loop, fence and keys",
            )? as u16,
        };
        if timeout < Duration::from_millis(50) {
            return Err(invalid("redis.timeout", "must be at least 50ms"));
        }
        if connect_timeout < Duration::from_millis(50) {
            return Err(invalid("redis.connect_timeout", "must be at least 50ms"));
        }
        if !(0..=MAX_REPLICAS).contains(&min_replicas_acked) {
            return Err(invalid(
                "redis.min_replicas_acked",
                format!("must be 0 to {MAX_REPLICAS} (got {min_replicas_acked})"),
            ));
        }
        if replicas_ack_timeout < Duration::from_millis(1)
            || replicas_ack_timeout > Duration::from_secs(60)
        {
            return Err(invalid(
                "redis.replicas_ack_timeout",
                format!(
                    "{}: must be 1ms to 60s",
                    crate::human::duration(replicas_ack_timeout)
                ),
            ));
        }
        if min_replicas_acked > 0 && replicas_ack_timeout >= timeout {
            return Err(invalid(
                "redis.replicas_ack_timeout",
                "must be shorter than redis.timeout (the WAIT's reply would time out first)",
            ));
        }
        let replicas_acked =
            (min_replicas_acked > 0).then_some((min_replicas_acked as u32, replicas_ack_timeout));

        let RawEtcd {
            endpoints,
            tls_ca_file: etcd_ca_file,
            tls_cert_file: etcd_cert_file,
            tls_key_file: etcd_key_file,
            tls_server_name,
            user: etcd_user,
            password_file: etcd_password_file,
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
            let https = endpoints
                .iter()
                .filter(|e| e.starts_with("https://"))
                .count();
            if https != 0 && https != endpoints.len() {
                return Err(invalid(
                    "etcd.endpoints",
                    "mixes http:// and https://: use one scheme for every member",
                ));
            }
            let files = tls_files(
                "etcd",
                if https == 0 {
                    Err("needs https:// etcd.endpoints (TLS)")
                } else {
                    Ok(())
                },
                etcd_ca_file,
                etcd_cert_file,
                etcd_key_file,
                &read_secret,
            )?;
            if let Some(name) = &tls_server_name {
                if https == 0 {
                    return Err(invalid(
                        "etcd.tls_server_name",
                        "needs https:// etcd.endpoints (TLS)",
                    ));
                }
                if name.is_empty() || name.chars().any(char::is_whitespace) {
                    return Err(invalid(
                        "etcd.tls_server_name",
                        format!("{name:?}: must be a host name"),
                    ));
                }
            }
            let tls = files.map(|TlsFiles { ca, client }| EtcdTls {
                ca,
                client,
                server_name: tls_server_name,
            });
            let auth = match (etcd_user, etcd_password_file) {
                (None, None) => None,
                (Some(user), Some(path)) => {
                    if user.is_empty() {
                        return Err(invalid("etcd.user", "must not be empty"));
                    }
                    Some((user, read_secret("etcd.password_file", &path)?))
                }
                (Some(_), None) => {
                    return Err(invalid("etcd.password_file", "must be set with etcd.user"));
                }
                (None, Some(_)) => {
                    return Err(invalid("etcd.user", "must be set with etcd.password_file"));
                }
            };
            if lease_ttl > MAX_LEASE_TTL {
                return Err(invalid(
                    "etcd.lease_ttl",
                    format!(
                        "{}: must be at most {} (a leader paused for its lease holds up \
                         every delivery that long)",
                        crate::human::duration(lease_ttl),
                        crate::human::duration(MAX_LEASE_TTL)
                    ),
                ));
            }
            if lease_ttl < Duration::from_secs(2) {
                return Err(invalid(
                    "etcd.lease_ttl",
                    format!(
                        "{}: etcd's minimum lease is 2s",
                        crate::human::duration(lease_ttl)
                    ),
                ));
            }
            if lease_ttl.subsec_nanos() != 0 {
                return Err(invalid(
                    "etcd.lease_ttl",
                    format!(
                        "{}: must be whole seconds (etcd grants leases in seconds)",
                        crate::human::duration(lease_ttl)
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
                tls,
                auth,
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
        let listen = listen_address(&listen)?;
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
        let max_batch = positive_because("api.max_batch", max_batch, 5000, LONG_CALL)? as usize;
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
                    crate::human::duration(request_timeout)
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
            max_fields: positive_because(
                "api.max_fields",
                max_fields,
                2000,
                "one command from a Lua script carries at most a few thousand values",
            )? as usize,
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
            max_rate: stream_rates,
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
        let stream_rates = stream_rates
            .into_iter()
            .map(|(stream, n)| {
                let key = format!("streams.max_rate.{stream}");
                Ok((stream, positive(&key, n, MAX_RATE as i64)? as u64))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;

        let RawForwarder {
            batch_size,
            idle_wakeup,
            id_field,
            attempt_field,
            dead_letter_suffix,
            max_rate,
        } = forwarder;
        let batch_size =
            positive_because("forwarder.batch_size", batch_size, 10_000, LONG_CALL)? as usize;
        if idle_wakeup < Duration::from_millis(10) {
            return Err(invalid("forwarder.idle_wakeup", "must be at least 10ms"));
        }
        let max_rate = non_negative("forwarder.max_rate", max_rate)?;
        if max_rate > MAX_RATE {
            return Err(invalid(
                "forwarder.max_rate",
                format!("must be 0 (no limit) to {MAX_RATE} (got {max_rate})"),
            ));
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
            layout: records_layout,
        } = records;
        if trim_interval < Duration::from_millis(100) {
            return Err(invalid("records.trim_interval", "must be at least 100ms"));
        }
        if retention > MAX_RETENTION {
            return Err(invalid(
                "records.retention",
                format!(
                    "must be 0s (no records) to {} (got {})",
                    crate::human::duration(MAX_RETENTION),
                    crate::human::duration(retention)
                ),
            ));
        }
        let records_layout = layout(
            "records.layout",
            &records_layout,
            RecordLayout::Compact,
            RecordLayout::Hash,
        )?;
        let pending_layout = layout(
            "pending.layout",
            &pending_layout,
            PendingLayout::Compact,
            PendingLayout::Hash,
        )?;
        let election = election_config(election, shards, etcd.is_some())?;

        let forwarder = ForwarderConfig {
            batch_size,
            idle_wakeup,
            id_field: optional_field("forwarder.id_field", id_field)?,
            attempt_field: optional_field("forwarder.attempt_field", attempt_field)?,
            dead_letter_suffix,
            max_rate,
        };
        let delivery = delivery.validate(&forwarder, retention, redis_cluster.is_some())?;
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
        let rejected_default = match &redis_cluster {
            // In the inbox's slot: the rejection script writes both.
            Some(_) => crate::store::cluster_dead_letter_stream(&inbox_stream, ":rejected"),
            None => None,
        };
        let rejected_stream = rejected_stream
            .or(rejected_default)
            .unwrap_or_else(|| format!("{prefix}:inbox:rejected"));
        if let (Some(_), true) = (&redis_cluster, enabled) {
            cluster_same_slot(
                "inbox.rejected_stream",
                &rejected_stream,
                "inbox.stream",
                &inbox_stream,
            )?;
        }
        if redis_cluster.is_some() {
            for s in &delivery.streams {
                let key = format!("delivery.streams.{}", s.stream);
                if let Some(refusal) = crate::store::cluster_stream_refusal(&s.stream) {
                    return Err(invalid(&key, refusal));
                }
                cluster_same_slot(
                    &format!("{key}.dead_letter_stream"),
                    &s.dead_letter_stream,
                    "its stream",
                    &s.stream,
                )?;
            }
        }
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
                batch_size: positive_because("inbox.batch_size", inbox_batch_size, 5000, LONG_CALL)?
                    as usize,
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

        let journal = journal_config(journal, &read_secret)?;

        Ok(Config {
            node_id,
            redis: RedisConfig {
                url,
                tls,
                sentinel,
                cluster: redis_cluster,
                replicas_acked,
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
                max_rate: stream_rates,
            },
            forwarder,
            records: RecordsConfig {
                retention,
                trim_interval,
                layout: records_layout,
            },
            pending: PendingConfig {
                layout: pending_layout,
            },
            election,
            log: LogConfig { level, json },
            delivery,
            inbox,
            journal,
        })
    }
}

/// `[election]`: the mode, and the groups of `per_shard` (each an etcd election,
/// so it needs `[etcd]`), at most one per shard.
fn election_config(
    raw: RawElection,
    shards: u16,
    etcd: bool,
) -> Result<ElectionConfig, ConfigError> {
    let RawElection { mode, groups } = raw;
    match mode.as_str() {
        "single" => Ok(ElectionConfig {
            groups: 1,
            per_shard: false,
        }),
        "per_shard" => {
            if !etcd {
                return Err(invalid(
                    "election.mode",
                    "\"per_shard\" needs etcd.endpoints: each group is an etcd election",
                ));
            }
            let groups = match groups {
                Some(n) => positive("election.groups", n, i64::from(shards)).map_err(|_| {
                    invalid(
                        "election.groups",
                        format!("must be 1 to redis.shards ({shards}) (got {n})"),
                    )
                })? as u16,
                None => shards.min(DEFAULT_GROUPS),
            };
            Ok(ElectionConfig {
                groups,
                per_shard: true,
            })
        }
        other => Err(invalid(
            "election.mode",
            format!("{other:?}: must be \"single\" or \"per_shard\""),
        )),
    }
}

/// `election.groups` unless set (or `redis.shards`, when fewer).
const DEFAULT_GROUPS: u16 = 4;

/// A `*.layout` setting: "compact" or "hash".
fn layout<T>(key: &str, value: &str, compact: T, hash: T) -> Result<T, ConfigError> {
    match value {
        "compact" => Ok(compact),
        "hash" => Ok(hash),
        other => Err(invalid(
            key,
            format!("{other:?}: must be \"compact\" or \"hash\""),
        )),
    }
}

/// `url` with the password read from `redis.password_file`: in the userinfo, or as
/// the `pass` parameter of a `unix://` URL.
/// `[journal]`, checked: a `mysql://` URL with a host and a database, the password
/// from its file, a retention of a minute to ten years.
fn journal_config(
    raw: RawJournal,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<Option<JournalConfig>, ConfigError> {
    let RawJournal {
        url,
        password_file,
        retention,
        auto_restore,
    } = raw;
    let Some(url) = url else {
        if password_file.is_some() {
            return Err(invalid("journal.password_file", "needs journal.url"));
        }
        return Ok(None);
    };
    let parsed = url::Url::parse(&url)
        .map_err(|e| invalid("journal.url", format!("{:?}: {e}", secret::shown_url(&url))))?;
    if parsed.scheme() != "mysql" {
        return Err(invalid(
            "journal.url",
            format!("{:?}: must start with mysql://", secret::shown_url(&url)),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty)
        || parsed.path().trim_start_matches('/').is_empty()
        || parsed.username().is_empty()
    {
        return Err(invalid(
            "journal.url",
            format!(
                "{:?}: must name a user, a host and a database (mysql://user@host:3306/delayq)",
                secret::shown_url(&url)
            ),
        ));
    }
    let url = match password_file {
        Some(path) => with_password(
            "journal",
            &url,
            read_secret("journal.password_file", &path)?,
        )?,
        None => url,
    };
    if retention < Duration::from_secs(60) || retention > Duration::from_secs(3650 * 86_400) {
        return Err(invalid(
            "journal.retention",
            format!("{}: must be 1m to 3650d", crate::human::duration(retention)),
        ));
    }
    Ok(Some(JournalConfig {
        url: RedisUrl::new(url),
        retention,
        auto_restore,
    }))
}

/// `url` with `password` in it; `section`'s `url` and `password_file` name the error.
fn with_password(section: &str, url: &str, password: SecretString) -> Result<String, ConfigError> {
    let mut parsed = url::Url::parse(url).map_err(|e| {
        invalid(
            &format!("{section}.url"),
            format!("{:?}: {e}", secret::shown_url(url)),
        )
    })?;
    if parsed.scheme() == "unix" {
        parsed
            .query_pairs_mut()
            .append_pair("pass", password.expose_secret());
    } else if parsed.set_password(Some(password.expose_secret())).is_err() {
        return Err(invalid(
            &format!("{section}.password_file"),
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

/// `api.listen` as an address: an IP and port, or `localhost:PORT` (loopback,
/// 127.0.0.1). Other host names are refused: which address a name resolves to can
/// change under a running daemon, and whether it is loopback decides if tokens are needed.
fn listen_address(listen: &str) -> Result<SocketAddr, ConfigError> {
    if let Some(port) = listen.strip_prefix("localhost:")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    listen.parse().map_err(|_| {
        invalid(
            "api.listen",
            format!("{listen:?}: must be an IP address and port such as 127.0.0.1:7070, [::]:7070 or localhost:7070"),
        )
    })
}
