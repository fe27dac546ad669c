//! A certificate authority and the certificates it signs, as PEM files in a temp
//! dir: for the TLS tests (Redis, etcd, MariaDB, the API) and `delayq demo --tls`.

use std::path::PathBuf;

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use tempfile::TempDir;

use crate::{RedisOptions, RedisServer, RedisTlsFiles};

/// The one name the "named" server certificate carries.
pub const NAMED_HOST: &str = "redis.delayq.test";

/// A CA's files and those of the certificates it signed, gone when dropped.
pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    /// A CA (`ca.pem`), a server certificate for localhost and 127.0.0.1
    /// (`server.pem`, `server-key.pem`), one for [`NAMED_HOST`] only (`named*`) and
    /// a client certificate (`client*`), all signed by it, and a second CA that
    /// signs nothing (`other-ca.pem`).
    pub fn new() -> anyhow::Result<Pki> {
        let dir = tempfile::Builder::new()
            .prefix("delayq-pki-")
            .tempdir()
            .context("a temp dir for the certificates")?;
        let (ca, ca_key) = authority("delayq test CA")?;
        let (other, _) = authority("another CA")?;
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).with_context(|| format!("write {name}"))
        };
        write("ca.pem", ca.pem())?;
        write("other-ca.pem", other.pem())?;
        // "named" carries only a name that resolves nowhere: reached by address,
        // it takes redis.tls_server_name.
        for (name, sans, dns) in [
            ("server", true, "localhost"),
            ("client", false, "localhost"),
            ("named", false, NAMED_HOST),
        ] {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(vec![dns.to_owned()])?;
            // A subject of its own: one equal to its issuer's reads as self-signed.
            params
                .distinguished_name
                .push(DnType::CommonName, format!("delayq test {name}"));
            if sans {
                params
                    .subject_alt_names
                    .push(SanType::IpAddress("127.0.0.1".parse()?));
            }
            let cert = params.signed_by(&key, &ca, &ca_key)?;
            write(&format!("{name}.pem"), cert.pem())?;
            write(&format!("{name}-key.pem"), key.serialize_pem())?;
        }
        Ok(Pki { dir })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The server's files, for a server that needs client certificates or not.
    pub fn server(&self, client_auth: bool) -> RedisTlsFiles {
        RedisTlsFiles {
            cert: self.path("server.pem"),
            key: self.path("server-key.pem"),
            ca: self.path("ca.pem"),
            client_auth,
        }
    }

    /// A redis-server serving TLS with the server certificate.
    pub fn redis(&self, client_auth: bool) -> anyhow::Result<RedisServer> {
        RedisServer::start_with(RedisOptions {
            tls: Some(self.server(client_auth)),
            ..RedisOptions::default()
        })
    }

    /// `<section>.tls_*` lines: the CA, and the client certificate for mutual TLS.
    pub fn settings(&self, ca: &str, client: bool) -> String {
        let mut lines = format!("tls_ca_file = \"{}\"\n", self.path(ca).display());
        if client {
            lines += &format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
                self.path("client.pem").display(),
                self.path("client-key.pem").display()
            );
        }
        lines
    }
}

/// A self-signed CA named `name`, and its key.
pub fn authority(name: &str) -> anyhow::Result<(rcgen::Certificate, KeyPair)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Ok((params.self_signed(&key)?, key))
}
