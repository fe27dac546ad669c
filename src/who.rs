//! Who a token is, as the logs and the audit trail say it: its name (a line of a
//! tokens file may give one; no `:` in it), else its fingerprint. Never the token.

use sha2::{Digest, Sha256};

use crate::config::ApiToken;
use crate::secret::ExposeSecret;

/// `token:` and the first 12 hex digits of the token's SHA-256: enough to tell
/// tokens apart, useless to present.
pub fn fingerprint(token: &[u8]) -> String {
    let digest = Sha256::digest(token);
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("token:{hex}")
}

/// A configured token's name, else its fingerprint.
pub fn token(token: &ApiToken) -> String {
    match &token.name {
        Some(name) => name.clone(),
        None => fingerprint(token.secret.expose_secret().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_tells_tokens_apart_and_shows_none() {
        let (a, b) = (fingerprint(b"s3cret-a"), fingerprint(b"s3cret-b"));
        assert_ne!(a, b);
        assert_eq!(a, fingerprint(b"s3cret-a"));
        assert!(
            a.starts_with("token:") && a.len() == "token:".len() + 12,
            "{a}"
        );
        assert!(!a.contains("s3cret"));
        let named = crate::config::ApiToken {
            name: Some("billing".into()),
            ..ApiToken::plain("s3cret-a".into())
        };
        assert_eq!(token(&named), "billing");
        assert_eq!(token(&ApiToken::plain("s3cret-a".into())), a);
    }
}
