//! HTTPS for the API (`api.tls`): the certificate served, read again from its files
//! at each reload (SIGHUP, `POST /v1/admin/reload`) without touching the connections
//! open, and the client certificates asked for with `client_ca_file`.

use std::sync::{Arc, RwLock};

use anyhow::Context;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::config::ApiTls;

/// The API's TLS: its files, and the certificate served now.
#[derive(Debug)]
pub struct ServerTls {
    files: ApiTls,
    current: RwLock<Arc<CertifiedKey>>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl ServerTls {
    /// Reads the certificate and key of `files`.
    pub fn load(files: &ApiTls) -> anyhow::Result<Arc<ServerTls>> {
        Ok(Arc::new(ServerTls {
            current: RwLock::new(Arc::new(certified_key(files)?)),
            files: files.clone(),
        }))
    }

    /// Reads the certificate and key again: new connections get them, open ones
    /// keep theirs. On an error the one served stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let key = certified_key(&self.files)?;
        *self.current.write().expect("not poisoned") = Arc::new(key);
        Ok(())
    }

    /// The acceptor of the API's connections: HTTP/1.1, the certificate served now,
    /// and with `client_ca_file` a client certificate of those CAs required.
    pub fn acceptor(self: &Arc<Self>) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.files.client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    roots.add(cert?)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for ServerTls {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("not poisoned").clone())
    }
}

/// The chain of `cert_file` and the key of `key_file`, which must match.
fn certified_key(files: &ApiTls) -> anyhow::Result<CertifiedKey> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("read {}", path.display()))
    };
    let chain = CertificateDer::pem_slice_iter(&read(&files.cert_file)?)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", files.cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key_file)?)
        .with_context(|| format!("{}: not a PEM private key", files.key_file.display()))?;
    let key = CertifiedKey::from_der(chain, key, &provider()).with_context(|| {
        format!(
            "{} and {} do not make a certificate and its key",
            files.cert_file.display(),
            files.key_file.display()
        )
    })?;
    Ok(key)
}
