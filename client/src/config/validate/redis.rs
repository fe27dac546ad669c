//! Validation of `[redis]`: the URL and its password, TLS, Sentinel or Cluster, the
//! shard count and the bounds of every wait.

use std::time::Duration;

use super::{
    MAX_REPLICAS, TlsFiles, cluster_seeds, positive_because, sentinel_config, tls_files,
    with_password,
};
use crate::config::raw::RawRedis;
use crate::config::{ConfigError, RedisConfig, invalid};
use crate::secret::{self, RedisUrl, SecretString};
use crate::store::RedisTls;

impl RawRedis {
    pub(super) fn validate(
        self,
        read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
    ) -> Result<RedisConfig, ConfigError> {
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
        } = self;
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
            read_secret,
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
            .map(|raw| sentinel_config(raw, &url, read_secret))
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
        Ok(RedisConfig {
            url,
            tls,
            sentinel,
            cluster: redis_cluster,
            replicas_acked,
            prefix,
            shards,
            timeout,
            connect_timeout,
        })
    }
}
