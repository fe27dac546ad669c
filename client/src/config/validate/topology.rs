//! Redis topologies as configured: seed and Sentinel addresses (`host:port`), the
//! Sentinel settings, and the Cluster seeds; streams that must share a slot on Cluster.

use super::*;

/// `nodes` as (host, port) pairs; `key` names them in the error.
pub(super) fn host_ports(key: &str, nodes: &[String]) -> Result<Vec<(String, u16)>, ConfigError> {
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
pub(super) fn cluster_same_slot(
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
pub(super) fn cluster_seeds(
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
pub(super) fn sentinel_config(
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
