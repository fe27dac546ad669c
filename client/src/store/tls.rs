//! TLS to Redis (`rediss://`): the CA to trust and, for mutual TLS, the client's
//! certificate and key, as `redis.tls_*` name them. Without a CA file the system's
//! trust store is used. Every connection delayq makes to Redis comes from the one
//! client built here ([`client`]).

use redis::{ClientTlsConfig, TlsCertificates};
use secrecy::{ExposeSecret, SecretString};

use crate::secret::RedisUrl;

/// The PEM contents of `redis.tls_*` files, checked to parse.
#[derive(Clone, Debug, Default)]
pub struct RedisTls {
    /// CA certificates to trust instead of the system's.
    pub ca: Option<String>,
    /// Client certificate chain and private key, for mutual TLS.
    pub client: Option<(String, SecretString)>,
    /// The name to check the server's certificate against instead of the URL's
    /// host (`redis.tls_server_name`; connections then come from `store::dial`).
    pub server_name: Option<String>,
}

/// The Redis client for `url`, with `tls` for a `rediss://` URL.
pub fn client(url: &RedisUrl, tls: Option<&RedisTls>) -> redis::RedisResult<redis::Client> {
    match tls {
        None => redis::Client::open(url.expose()),
        Some(tls) => redis::Client::build_with_tls(url.expose(), certificates(tls)),
    }
}

/// `tls` as the redis crate takes it.
pub(super) fn certificates(tls: &RedisTls) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.as_bytes().to_vec(),
            client_key: key.expose_secret().as_bytes().to_vec(),
        }),
        root_cert: tls.ca.as_ref().map(|ca| ca.as_bytes().to_vec()),
    }
}

/// A plain client of the node at `host`:`port` (a Cluster node, the master a
/// Sentinel names), with `info`'s scheme, user, password and TLS settings, and
/// its connection info.
pub(super) fn node_client(
    info: &redis::ConnectionInfo,
    tls: Option<&RedisTls>,
    host: &str,
    port: u16,
) -> redis::RedisResult<(redis::ConnectionInfo, redis::Client)> {
    let addr = match info.addr() {
        redis::ConnectionAddr::TcpTls { insecure, .. } => redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
    };
    let node = info.clone().set_addr(addr);
    let client = match tls {
        Some(t) => redis::Client::build_with_tls(node.clone(), certificates(t))?,
        None => redis::Client::open(node.clone())?,
    };
    Ok((node, client))
}
