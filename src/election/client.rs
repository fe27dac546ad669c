//! The etcd connection: how it is made (keepalive pings, leader required) and one
//! request sent again while etcd does not answer.

use super::*;
use crate::secret::ExposeSecret;

/// HTTP/2 pings on the etcd connections, so that a member that hangs (stopped,
/// partitioned) breaks the streams waiting on it (campaign, watch) instead of
/// leaving them hanging. etcd answers pings closer than 5 s apart
/// (`--grpc-keepalive-min-time`) with "too many pings" and drops the connection,
/// hence 6 s.
const HTTP2_PING_EVERY: Duration = Duration::from_secs(6);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(3);
pub(super) async fn connect(config: &EtcdConfig) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_keep_alive(HTTP2_PING_EVERY, HTTP2_PING_TIMEOUT)
        // Pings on a connection without streams count against us in etcd's
        // policy, and an idle connection needs no liveness check.
        .with_keep_alive_while_idle(false)
        // A member cut off from its cluster refuses instead of answering stale.
        .with_require_leader(true);
    let options = match &config.tls {
        Some(tls) => options.with_tls(tls_options(tls)),
        None => options,
    };
    let options = match &config.auth {
        // etcd's tokens expire (5 minutes idle by default): asked again when one has.
        Some((user, password)) => options
            .with_user(user, password.expose_secret())
            .with_auto_token_refresh(true),
        None => options,
    };
    // No request timeout on the channel: it would also cut the campaign, which
    // waits as long as another node leads. Each call is bounded by `call` instead.
    Client::connect(&config.endpoints, Some(options)).await
}

/// `etcd.tls_*` as the client takes them: the CA given (or the system's trust
/// store), the client certificate for mutual TLS, the name to check.
fn tls_options(tls: &EtcdTls) -> TlsOptions {
    let mut options = TlsOptions::new();
    options = match &tls.ca {
        Some(ca) => options.ca_certificate(Certificate::from_pem(ca)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.client {
        options = options.identity(Identity::from_pem(cert, key.expose_secret()));
    }
    if let Some(name) = &tls.server_name {
        options = options.domain_name(name);
    }
    options
}

/// An (etcd) error in one readable line: each error of its chain by `Display`, those
/// that add nothing left out. etcd-client's error gives no sources (the transport's
/// own message is only "transport error": the why is in its sources), and a gRPC
/// status's `Display` shows its source as a `Debug` struct: both are read apart.
pub(super) fn readable(e: &(dyn std::error::Error + 'static)) -> String {
    use std::error::Error;
    /// One error's own words, and the next in its chain.
    fn link<'e>(e: &'e (dyn Error + 'static)) -> (String, Option<&'e (dyn Error + 'static)>) {
        match e.downcast_ref::<etcd_client::Error>() {
            Some(etcd_client::Error::GRpcStatus(status)) => {
                let mut text = format!("grpc request error: {}", status.code());
                if !status.message().is_empty() {
                    text = format!("{text}: {}", status.message());
                }
                (text, status.source())
            }
            Some(etcd_client::Error::TransportError(t)) => (t.to_string(), t.source()),
            _ => (e.to_string(), e.source()),
        }
    }
    let (mut text, mut source) = link(e);
    while let Some(s) = source {
        let (more, next) = link(s);
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = next;
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `e` with a hint at the settings that decide it, when they may be why: TLS
/// failures name `etcd.tls_*`, refused credentials `etcd.user`/`etcd.password_file`.
pub(super) fn explain(config: &EtcdConfig, e: &(dyn std::error::Error + 'static)) -> String {
    let text = readable(e);
    let lower = text.to_lowercase();
    if config.auth.is_some()
        && (lower.contains("authentication failed") || lower.contains("invalid auth token"))
    {
        return format!("{text} (check etcd.user and etcd.password_file)");
    }
    if lower.contains("permission denied") {
        return format!(
            "{text} (etcd.user needs read and write on the election prefix {}/)",
            config.election_prefix
        );
    }
    let tls_words = ["certificate", "tls", "handshake", "unknownissuer", "ssl"];
    if config.tls.is_some() && tls_words.iter().any(|w| lower.contains(w)) {
        return format!(
            "{text} (check etcd.tls_ca_file, etcd.tls_cert_file, etcd.tls_key_file, etcd.tls_server_name)"
        );
    }
    text
}

/// Whether an error is etcd's answer (retrying will not change it) rather than
/// a failure to reach it.
pub(super) fn is_answer(e: &etcd_client::Error) -> bool {
    // gRPC codes: InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
    // FailedPrecondition, Unauthenticated.
    matches!(e, etcd_client::Error::GRpcStatus(status) if matches!(status.code() as i32, 3 | 5 | 6 | 7 | 9 | 16))
}

/// One etcd request, sent again while etcd does not answer, for at most `limit`
/// in all. The balancer still routes some requests to a dead member for a while
/// (they fail at once), so a retry soon reaches a live one.
pub(super) async fn call<T, F, Fut>(limit: Duration, mut request: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let give_up = Instant::now() + limit;
    let mut retry = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
    loop {
        match tokio::time::timeout_at(give_up, request()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if is_answer(&e) => return Err(e.into()),
            Ok(Err(e)) => {
                let delay = retry.next_delay();
                if Instant::now() + delay >= give_up {
                    return Err(e.into());
                }
                tokio::time::sleep(delay).await;
            }
            Err(_) => {
                return Err(anyhow!(
                    "no answer from etcd within {}",
                    crate::human::duration(limit)
                ));
            }
        }
    }
}
