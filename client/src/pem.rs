//! PEM files named by `*.tls_*` settings, checked to parse before anything
//! connects. Errors say what is wrong, never the contents.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret, SecretString};

/// Checks that `pem` holds one certificate or more.
pub fn check_certificates(pem: &str) -> Result<(), String> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(())
}

/// Checks that `pem` holds a private key.
pub fn check_key(pem: &SecretString) -> Result<(), String> {
    PrivateKeyDer::from_pem_slice(pem.expose_secret().as_bytes())
        .map(|_| ())
        .map_err(|e| format!("not a PEM private key: {e}"))
}
