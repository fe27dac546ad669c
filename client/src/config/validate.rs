//! Validation: [`Raw`] into [`Config`], each section destructured in full so a new
//! raw field cannot be forgotten, every refusal naming its key.

mod api;
mod delivery;
mod election;
mod etcd;
mod forwarder;
mod inbox;
mod journal;
mod log;
mod records;
mod redis;
mod schedules;
mod streams;
mod topology;

use election::election_config;
use journal::{journal_config, with_password};
use records::layout;
use topology::{cluster_same_slot, cluster_seeds, sentinel_config};
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::store::{PendingLayout, RecordLayout};

use super::raw::{
    Raw, RawElection, RawForwarder, RawInbox, RawJournal, RawJournalTls, RawLog, RawMetrics,
    RawNode, RawPending, RawRecords, RawSentinel, RawStreams,
};
use super::token::{self, ApiToken};
use super::{
    Config, ConfigError, ElectionConfig, ForwarderConfig, InboxConfig, JournalConfig, LogConfig,
    MetricsConfig, PendingConfig, RecordsConfig, RedisConfig, StreamsConfig, invalid,
};
use crate::message::is_plain;
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

/// The tokens of one scope: `key`'s list and the lines of its `_file` (see
/// [`super::token`]).
fn token_list(
    key: &str,
    tokens: Vec<String>,
    file: Option<String>,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<Vec<ApiToken>, ConfigError> {
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
    let mut tokens: Vec<ApiToken> = tokens.into_iter().map(ApiToken::plain).collect();
    if let Some(path) = file {
        let file_key = format!("{key}_file");
        let file = read_secret(&file_key, &path)?;
        for (i, line) in file.expose_secret().lines().enumerate() {
            tokens.extend(token::parse_line(&file_key, i + 1, line)?);
        }
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
            metrics: RawMetrics { max_streams },
            scheduler,
            schedules,
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
        let redis = redis.validate(&read_secret)?;

        let etcd = etcd.validate(&read_secret)?;

        let api = api.validate(&read_secret)?;

        let streams = streams.validate()?;
        let forwarder = forwarder.validate()?;
        streams::check_key_fields(&streams, &forwarder)?;
        let records = records.validate()?;
        let pending = PendingConfig {
            layout: layout(
                "pending.layout",
                &pending_layout,
                PendingLayout::Compact,
                PendingLayout::Hash,
            )?,
        };
        let election = election_config(election, redis.shards, etcd.is_some())?;
        let delivery = delivery.validate(&forwarder, records.retention, redis.cluster.is_some())?;
        let inbox = inbox.validate(&redis)?;
        let log = log.validate()?;
        let journal = journal_config(journal, &read_secret)?;
        let metrics = MetricsConfig {
            max_streams: positive("metrics.max_streams", max_streams, 10_000)? as usize,
        };

        let scheduler = scheduler.validate()?;
        let schedules = schedules::declared(schedules, &scheduler, &streams, &forwarder)?;

        Ok(Config {
            node_id,
            redis,
            etcd,
            api,
            streams,
            forwarder,
            records,
            pending,
            election,
            log,
            delivery,
            inbox,
            journal,
            metrics,
            scheduler,
            schedules,
        })
    }
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
