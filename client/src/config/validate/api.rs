//! Validation of `[api]`: the tokens of each scope (each token in one), the address
//! (loopback unless tokens are set) and the bounds of requests and messages.

use std::time::Duration;

use super::{
    LONG_CALL, MAX_DELAY_LIMIT, MAX_REQUEST_TIMEOUT, listen_address, positive, positive_because,
    token_list,
};
use crate::config::raw::{RawApi, RawApiTls};
use crate::config::{ApiConfig, ApiTls, ApiToken, ConfigError, invalid};
use crate::message::Limits;
use crate::secret::ExposeSecret;
use crate::secret::SecretString;
use crate::{pem, secret};

impl RawApi {
    pub(super) fn validate(
        self,
        read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
    ) -> Result<ApiConfig, ConfigError> {
        let RawApi {
            listen,
            advertise,
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
            tls,
            audit_length,
        } = self;
        let tokens = token_list("api.tokens", tokens, tokens_file, read_secret)?;
        let write_tokens = token_list(
            "api.write_tokens",
            write_tokens,
            write_tokens_file,
            read_secret,
        )?;
        let read_tokens = token_list(
            "api.read_tokens",
            read_tokens,
            read_tokens_file,
            read_secret,
        )?;
        if tokens.iter().any(|t| t.streams.is_some()) {
            return Err(invalid(
                "api.tokens_file",
                "streams=: an admin token reaches every stream; limit write or read tokens",
            ));
        }
        let secret = |t: &ApiToken| t.secret.expose_secret().to_owned();
        for (key, list, others) in [
            ("api.write_tokens", &write_tokens, vec![&tokens]),
            (
                "api.read_tokens",
                &read_tokens,
                vec![&tokens, &write_tokens],
            ),
        ] {
            if list.iter().any(|t| {
                others
                    .iter()
                    .any(|o| o.iter().any(|o| secret(o) == secret(t)))
            }) {
                return Err(invalid(
                    key,
                    "a token is also of a higher scope: list each token once, in the scope it needs",
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (key, list) in [
            ("api.tokens_file", &tokens),
            ("api.write_tokens_file", &write_tokens),
            ("api.read_tokens_file", &read_tokens),
        ] {
            if let Some(name) = list
                .iter()
                .filter_map(|t| t.name.as_deref())
                .find(|n| !names.insert(*n))
            {
                return Err(invalid(
                    key,
                    format!("name={name}: another token has this name; names tell tokens apart"),
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
        Ok(ApiConfig {
            listen,
            advertise: advertise.map(|a| advertised(&a)).transpose()?,
            limits,
            tokens,
            write_tokens,
            read_tokens,
            max_batch,
            max_body_bytes,
            max_wait,
            max_polls,
            request_timeout,
            max_concurrent_requests,
            tls: tls.map(api_tls).transpose()?,
            audit_length: match audit_length {
                0..=1_000_000 => audit_length as u64,
                _ => {
                    return Err(invalid(
                        "api.audit_length",
                        format!("must be 0 (only logged) to 1000000 (got {audit_length})"),
                    ));
                }
            },
        })
    }
}

/// `api.advertise`: `host:port`, the host a DNS name (letters, digits and hyphens
/// in dot-separated labels of at most 63, 253 in all), an IPv4 address or an IPv6
/// one in brackets; the port 1 to 65535. Kept as written.
pub(super) fn advertised(text: &str) -> Result<String, ConfigError> {
    let refuse = |why: &str| {
        Err(invalid(
            "api.advertise",
            format!("{text:?}: {why} (write it host:port, as \"delayq-1:7070\")"),
        ))
    };
    let Some((host, port)) = text.rsplit_once(':') else {
        return refuse("no port");
    };
    if !matches!(port.parse::<u32>(), Ok(1..=65535)) || port.starts_with(['+', '0']) {
        return refuse("the port must be 1 to 65535");
    }
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            host.parse::<std::net::Ipv4Addr>().is_ok()
                || (!host.is_empty()
                    && host.len() <= 253
                    && host.split('.').all(|label| {
                        (1..=63).contains(&label.len())
                            && !label.starts_with('-')
                            && !label.ends_with('-')
                            && label
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    }))
        }
    };
    if !host_ok {
        return refuse("the host must be a DNS name, an IPv4 address or [an IPv6 one]");
    }
    Ok(text.to_owned())
}

/// `api.tls`, its files checked to parse (and read again at each reload).
fn api_tls(raw: RawApiTls) -> Result<ApiTls, ConfigError> {
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(std::path::PathBuf::from);
    let resolved = |path: &str| secret::credential_path(path, credentials.as_deref());
    let read = |key: &str, path: &std::path::Path| {
        std::fs::read_to_string(path)
            .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))
    };
    let cert_file = resolved(&raw.cert_file);
    pem::check_certificates(&read("api.tls.cert_file", &cert_file)?)
        .map_err(|e| invalid("api.tls.cert_file", format!("{}: {e}", cert_file.display())))?;
    let key_file = resolved(&raw.key_file);
    pem::check_key(&SecretString::from(read("api.tls.key_file", &key_file)?))
        .map_err(|e| invalid("api.tls.key_file", format!("{}: {e}", key_file.display())))?;
    let client_ca = match raw.client_ca_file {
        None => None,
        Some(path) => {
            let path = resolved(&path);
            let pem = read("api.tls.client_ca_file", &path)?;
            pem::check_certificates(&pem).map_err(|e| {
                invalid("api.tls.client_ca_file", format!("{}: {e}", path.display()))
            })?;
            Some(pem)
        }
    };
    Ok(ApiTls {
        cert_file,
        key_file,
        client_ca,
    })
}

#[cfg(test)]
mod tests {
    use super::advertised;
    use crate::config::Config;

    #[test]
    fn an_advertised_address_is_a_host_and_a_port() {
        for good in [
            "delayq-1:7070",
            "node.example.com:1",
            "10.0.0.7:65535",
            "[::1]:7070",
            "[fd00::7]:443",
            "a:80",
        ] {
            assert_eq!(advertised(good).ok().as_deref(), Some(good), "{good}");
        }
        for (bad, why) in [
            ("delayq-1", "no port"),
            ("delayq-1:", "the port"),
            ("delayq-1:0", "the port"),
            ("delayq-1:65536", "the port"),
            ("delayq-1:+80", "the port"),
            ("delayq-1:080", "the port"),
            (":7070", "the host"),
            ("-node:7070", "the host"),
            ("node-:7070", "the host"),
            ("a..b:7070", "the host"),
            ("no de:7070", "the host"),
            ("::1:7070", "the host"),
            ("[nope]:7070", "the host"),
            ("http://node:7070", "the host"),
        ] {
            let err = advertised(bad).expect_err(bad).to_string();
            assert!(
                err.starts_with("api.advertise") && err.contains(why),
                "{bad}: {err}"
            );
        }
        let long_label = format!("{}:7070", "a".repeat(64));
        assert!(advertised(&long_label).is_err());
        let label = "a".repeat(63);
        let long_name = format!("{}:7070", [label.as_str(); 4].join("."));
        assert!(advertised(&long_name).is_err(), "255 characters");
        let longest = format!("{}.{}:7070", [label.as_str(); 3].join("."), "a".repeat(61));
        assert_eq!(advertised(&longest).ok(), Some(longest.clone()));
    }

    #[test]
    fn the_setting_and_its_variable_reach_the_config() {
        let unset = Config::from_toml("", std::iter::empty()).unwrap();
        assert_eq!(unset.api.advertise, None);
        let set = Config::from_toml("[api]\nadvertise = \"delayq-2:7070\"", std::iter::empty());
        assert_eq!(set.unwrap().api.advertise.as_deref(), Some("delayq-2:7070"));
        let env = [("DELAYQ_API_ADVERTISE".to_owned(), "bad".to_owned())];
        let err = Config::from_toml("", env).unwrap_err().to_string();
        assert!(
            err.contains("api.advertise") && err.contains("DELAYQ_API_ADVERTISE"),
            "{err}"
        );
    }

    mod props {
        use super::advertised;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn names_and_ports_in_range_are_kept_as_written(
                labels in proptest::collection::vec("[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", 1..5),
                port in 1u32..=65535,
            ) {
                let text = format!("{}:{port}", labels.join("."));
                prop_assert_eq!(advertised(&text).ok(), Some(text.clone()));
            }

            #[test]
            fn anything_else_is_refused_without_panicking(text in "\\PC{0,80}") {
                if let Ok(kept) = advertised(&text) {
                    prop_assert_eq!(&kept, &text);
                    let (host, port) = text.rsplit_once(':').unwrap();
                    prop_assert!(!host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
                }
            }
        }
    }
}
