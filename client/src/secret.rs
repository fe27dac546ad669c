//! Secrets in the configuration: Redis URLs with a password and API tokens are kept
//! in [`SecretString`], whose `Debug` prints `[REDACTED]`, so a secret reaches a log,
//! an error or an answer only where code asks for it by name (`expose_secret`).
//! URLs are shown through [`shown_url`], which parses them (`url`) and replaces the
//! password, so redaction does not depend on how the URL happens to be spelled.
//! Secrets may also come from files (`*_file` keys): a relative path is taken in
//! systemd's `$CREDENTIALS_DIRECTORY` when it is set (`LoadCredential=`).

use std::fmt;
use std::path::{Path, PathBuf};

pub use secrecy::{ExposeSecret, SecretString};

/// What a redacted secret shows.
pub const REDACTED: &str = "<redacted>";

/// A Redis URL that may carry a password. `Display` and `Debug` show it redacted.
#[derive(Clone)]
pub struct RedisUrl {
    url: SecretString,
    shown: String,
}

impl RedisUrl {
    pub fn new(url: impl Into<String>) -> Self {
        let url: String = url.into();
        let shown = shown_url(&url);
        RedisUrl {
            url: SecretString::from(url),
            shown,
        }
    }

    /// The URL with its password: for connecting, nothing else.
    pub fn expose(&self) -> &str {
        self.url.expose_secret()
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.shown)
    }
}

/// Query parameters that carry a password (`unix:///run/redis.sock?pass=…`).
const SECRET_PARAMS: &[&str] = &["pass", "password"];

/// `url` with any password replaced by [`REDACTED`]: the userinfo's password, a lone
/// userinfo of a Redis URL (Redis reads `redis://secret@host` as a password), and
/// password query parameters. Text that does not parse as a URL is not shown at all.
pub fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(_) => redacted(url).unwrap_or_else(|| url.to_owned()),
        Err(_) => format!("{REDACTED} (not a URL)"),
    }
}

/// [`shown_url`] of a URL that carries a secret; None when it carries none (or is
/// not a URL), so that text without secrets is left exactly as written.
pub fn redacted(url: &str) -> Option<String> {
    let mut parsed = url::Url::parse(url).ok()?;
    let mut changed = false;
    if parsed.password().is_some() {
        changed |= parsed.set_password(Some(REDACTED)).is_ok();
    } else if !parsed.username().is_empty() && parsed.scheme().starts_with("redis") {
        changed |= parsed.set_username(REDACTED).is_ok();
    }
    if parsed
        .query_pairs()
        .any(|(k, _)| SECRET_PARAMS.contains(&k.as_ref()))
    {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if SECRET_PARAMS.contains(&k.as_ref()) {
                    REDACTED.to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
        changed = true;
    }
    // The url crate percent-encodes the marker's angle brackets; show it as written.
    changed.then(|| {
        parsed
            .as_str()
            .replace("%3Credacted%3E", REDACTED)
            .replace("%3credacted%3e", REDACTED)
    })
}

/// Where a `*_file` key's path points: relative paths are in `$CREDENTIALS_DIRECTORY`
/// when the service manager set one, else relative to the working directory.
pub fn credential_path(path: &str, credentials_dir: Option<&Path>) -> PathBuf {
    let path = Path::new(path);
    match credentials_dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_owned(),
    }
}

/// Reads a secret from a file: its contents without the trailing newline. The error
/// names the path and the cause, never the contents.
pub fn read_file(path: &Path) -> Result<SecretString, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(SecretString::from(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(url: &str, shown: &str) {
        assert_eq!(shown_url(url), shown);
        let wrapped = RedisUrl::new(url);
        assert_eq!(wrapped.to_string(), shown);
        assert_eq!(format!("{wrapped:?}"), format!("{shown:?}"));
        assert_eq!(wrapped.expose(), url);
    }

    #[test]
    fn passwords_never_show() {
        check("redis://127.0.0.1:6379", "redis://127.0.0.1:6379");
        check(
            "redis://app:hunter2@db:6379/0",
            "redis://app:<redacted>@db:6379/0",
        );
        check("redis://:hunter2@db", "redis://:<redacted>@db");
        check("rediss://hunter2@db:6380", "rediss://<redacted>@db:6380");
        check("redis://app:p%40ss%3Aw@db", "redis://app:<redacted>@db");
        check(
            "unix:///run/redis.sock?db=1&pass=hunter2",
            "unix:///run/redis.sock?db=1&pass=<redacted>",
        );
        check("not a url hunter2", "<redacted> (not a URL)");
        check(
            "http://root:pw@etcd:2379",
            "http://root:<redacted>@etcd:2379/",
        );
        check("http://etcd:2379/a@b", "http://etcd:2379/a@b");
        check("unix:///run/redis.sock", "unix:///run/redis.sock");
        assert_eq!(redacted("redis://127.0.0.1:6379"), None);
        assert_eq!(redacted("http://etcd:2379"), None, "left as written");
    }

    #[test]
    fn credential_paths() {
        let dir = Path::new("/run/credentials/delayq.service");
        assert_eq!(credential_path("redis", Some(dir)), dir.join("redis"));
        assert_eq!(
            credential_path("/etc/delayq/redis", Some(dir)),
            Path::new("/etc/delayq/redis")
        );
        assert_eq!(credential_path("redis", None), Path::new("redis"));
    }

    #[test]
    fn files_lose_their_trailing_newline_only() {
        let dir = tempfile::tempdir().unwrap();
        for (contents, expected) in [
            ("s3cret\n", Ok("s3cret")),
            ("s3cret\r\n", Ok("s3cret")),
            (" s3cret ", Ok(" s3cret ")),
            ("\n", Err("is empty")),
        ] {
            let path = dir.path().join("secret");
            std::fs::write(&path, contents).unwrap();
            match (read_file(&path), expected) {
                (Ok(s), Ok(e)) => assert_eq!(s.expose_secret(), e),
                (Err(s), Err(e)) => assert!(s.contains(e) && !s.contains("s3cret"), "{s}"),
                (got, want) => panic!("{contents:?}: {:?} vs {want:?}", got.map(|_| ())),
            }
        }
        let missing = read_file(&dir.path().join("missing")).unwrap_err();
        assert!(missing.contains("cannot read"), "{missing}");
    }
}
