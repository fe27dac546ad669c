//! Connections to a Redis whose certificate names another host than the one in
//! `redis.url` (`redis.tls_server_name`: an address, a load balancer, or a name
//! that does not resolve here). The redis crate checks the certificate against the
//! host it connects to and has no setting to change that, so for these delayq
//! opens the TCP connection and the TLS session itself, checking the certificate
//! against the configured name, and hands the stream to the redis crate's
//! connection types. [`Redial`] then stands in for the crate's connection manager:
//! after a connection breaks, the next command dials again.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisConnectionInfo, RedisError, RedisResult,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use secrecy::ExposeSecret;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::tls::RedisTls;

/// How to reach one Redis over TLS, checking its certificate against `name`.
pub(super) struct Dialer {
    host: String,
    port: u16,
    name: ServerName<'static>,
    connector: TlsConnector,
    redis: RedisConnectionInfo,
    connect_timeout: Duration,
}

impl Dialer {
    /// The dialer for `client`'s address (which must be `rediss://`), with the
    /// CA and client certificate of `tls` and the certificate's `name`.
    pub(super) fn new(
        client: &redis::Client,
        tls: &RedisTls,
        name: &str,
        connect_timeout: Duration,
    ) -> RedisResult<Dialer> {
        let info = client.get_connection_info();
        let ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
            return Err(failure("redis.tls_server_name needs a rediss:// URL"));
        };
        let name = ServerName::try_from(name.to_owned())
            .map_err(|e| failure(format!("redis.tls_server_name {name:?}: {e}")))?;
        Ok(Dialer {
            host: host.clone(),
            port: *port,
            name,
            connector: TlsConnector::from(Arc::new(client_config(tls)?)),
            redis: info.redis_settings().clone(),
            connect_timeout,
        })
    }

    /// A TLS stream to the server, its certificate checked against the name.
    async fn stream(&self) -> RedisResult<TlsStream<TcpStream>> {
        let dial = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            tcp.set_nodelay(true)?;
            self.connector.connect(self.name.clone(), tcp).await
        };
        match tokio::time::timeout(self.connect_timeout, dial).await {
            Ok(stream) => Ok(stream?),
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "connecting to Redis timed out (redis.connect_timeout)",
            ))),
        }
    }

    /// A multiplexed connection of its own, set up as the URL says (user,
    /// password, database).
    pub(super) async fn multiplexed(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        let stream = self.stream().await?;
        let (connection, driver) =
            MultiplexedConnection::new_with_config(&self.redis, stream, config.clone()).await?;
        // The driver ends once every handle on the connection is dropped.
        tokio::spawn(driver);
        Ok(connection)
    }

    /// A pub/sub connection.
    pub(super) async fn pubsub(&self) -> RedisResult<PubSub> {
        PubSub::new(&self.redis, self.stream().await?).await
    }

    pub(super) fn db(&self) -> i64 {
        self.redis.db()
    }
}

/// rustls's client configuration: trust the CA file (or the system's roots),
/// present the client certificate if there is one. ring is the one provider.
fn client_config(tls: &RedisTls) -> RedisResult<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                let cert = cert.map_err(|e| failure(format!("redis.tls_ca_file: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| failure(format!("redis.tls_ca_file: {e}")))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            if let Some(e) = native.errors.first() {
                return Err(failure(format!("the system's CA certificates: {e}")));
            }
            for cert in native.certs {
                // The system's store may hold certificates rustls cannot use.
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| failure(e.to_string()))?
    .with_root_certificates(roots);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| failure(format!("redis.tls_cert_file: {e}")))?;
            // The key's own error text never quotes the key.
            let key = PrivateKeyDer::from_pem_slice(key.expose_secret().as_bytes())
                .map_err(|e| failure(format!("redis.tls_key_file: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| failure(format!("redis.tls_cert_file, redis.tls_key_file: {e}")))
        }
    }
}

fn failure(message: impl Into<String>) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, "TLS", message.into()))
}

/// A multiplexed connection that dials again, on the next command, after the
/// last one broke (the part of the redis crate's connection manager delayq uses).
/// The command that failed is not sent again: callers retry as after any error.
#[derive(Clone)]
pub(super) struct Redial {
    dialer: Arc<Dialer>,
    config: AsyncConnectionConfig,
    /// The live connection and its number, so that a failure reported late does
    /// not drop a connection made since.
    slot: Arc<tokio::sync::Mutex<(u64, Option<MultiplexedConnection>)>>,
}

impl Redial {
    /// Dials once now, so that a wrong address or certificate fails the start.
    pub(super) async fn connect(
        dialer: Arc<Dialer>,
        config: AsyncConnectionConfig,
    ) -> RedisResult<Redial> {
        let first = dialer.multiplexed(&config).await?;
        Ok(Redial {
            dialer,
            config,
            slot: Arc::new(tokio::sync::Mutex::new((0, Some(first)))),
        })
    }

    /// The live connection (dialed now if the last one broke) and its number.
    pub(super) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut slot = self.slot.lock().await;
        if let Some(connection) = &slot.1 {
            return Ok((slot.0, connection.clone()));
        }
        let connection = self.dialer.multiplexed(&self.config).await?;
        slot.0 += 1;
        slot.1 = Some(connection.clone());
        Ok((slot.0, connection))
    }

    /// After a command on connection `number` failed: a broken one is let go.
    pub(super) async fn failed(&self, number: u64, error: &RedisError) {
        if error.is_unrecoverable_error() {
            let mut slot = self.slot.lock().await;
            if slot.0 == number {
                slot.1 = None;
            }
        }
    }

    pub(super) fn get_db(&self) -> i64 {
        self.dialer.db()
    }
}
