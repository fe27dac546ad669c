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
