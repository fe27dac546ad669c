//! Validation of `[etcd]`: the members' scheme and TLS, the etcd user, the lease.
//! No endpoints: no etcd (the instance leads alone).

use std::time::Duration;

use super::{MAX_LEASE_TTL, TlsFiles, tls_files};
use crate::config::raw::RawEtcd;
use crate::config::{ConfigError, EtcdConfig, EtcdTls, invalid};
use crate::secret::SecretString;

impl RawEtcd {
    pub(super) fn validate(
        self,
        read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
    ) -> Result<Option<EtcdConfig>, ConfigError> {
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
        } = self;
        if endpoints.is_empty() {
            return Ok(None);
        }
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
        Ok(Some(EtcdConfig {
            endpoints,
            tls,
            auth,
            election_prefix: election_prefix.unwrap_or_else(|| format!("/delayq/{cluster}/leader")),
            lease_ttl,
            failsafe,
            connect_timeout: etcd_connect_timeout,
        }))
    }
}
