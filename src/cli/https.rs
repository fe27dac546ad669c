//! The HTTP client of the CLI and the tools: `https://` URLs are checked against
//! the system's roots and, with `--ca-file` (`DELAYQ_CA_FILE`), the CAs of that
//! file, which a daemon's own certificate (`api.tls`) usually needs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A client for `url` trusting the system's roots and those of `ca_file`, each
/// request bounded by `timeout` when given. The roots are read only for an
/// `https://` URL: reading the system's takes a while, and plain HTTP needs none.
pub fn client(
    url: &str,
    ca_file: Option<&Path>,
    timeout: Option<Duration>,
) -> anyhow::Result<reqwest::Client> {
    let mut builder = builder(url.starts_with("https://"), ca_file)?;
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    Ok(builder.build()?)
}

/// [`client`]'s builder, for URLs that are `https` or not.
pub fn builder(https: bool, ca_file: Option<&Path>) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut roots = rustls::RootCertStore::empty();
    if https {
        for cert in rustls_native_certs::load_native_certs().certs {
            // A system root rustls cannot use is left out, as browsers do.
            let _ = roots.add(cert);
        }
    }
    if let Some(path) = ca_file.filter(|_| https) {
        let pem =
            std::fs::read(path).with_context(|| format!("read {} (--ca-file)", path.display()))?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.with_context(|| format!("{}: not PEM certificates", path.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("{}: a certificate rustls cannot use", path.display()))?;
            added += 1;
        }
        anyhow::ensure!(
            added > 0,
            "{}: holds no PEM certificate (--ca-file)",
            path.display()
        );
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(reqwest::Client::builder().use_preconfigured_tls(tls))
}
