//! Validation of `[journal]`: its URL with the password read from its file, and the
//! retention; and that one step shared with `[redis]` (a URL with a password put in).

use super::*;

/// `url` with the password read from `redis.password_file`: in the userinfo, or as
/// the `pass` parameter of a `unix://` URL.
/// `[journal]`, checked: a `mysql://` URL with a host and a database, the password
/// from its file, a retention of a minute to ten years.
pub(super) fn journal_config(
    raw: RawJournal,
    read_secret: &dyn Fn(&str, &str) -> Result<SecretString, ConfigError>,
) -> Result<Option<JournalConfig>, ConfigError> {
    let RawJournal {
        url,
        password_file,
        retention,
        transitions,
        transitions_retention,
        auto_restore,
        tls,
    } = raw;
    let Some(url) = url else {
        if password_file.is_some() {
            return Err(invalid("journal.password_file", "needs journal.url"));
        }
        if tls.is_some() {
            return Err(invalid("journal.tls", "needs journal.url"));
        }
        return Ok(None);
    };
    let tls = match tls {
        None => None,
        Some(RawJournalTls { ca_file: None }) => Some(None),
        Some(RawJournalTls {
            ca_file: Some(path),
        }) => {
            let key = "journal.tls.ca_file";
            let pem = std::fs::read_to_string(&path)
                .map_err(|e| invalid(key, format!("cannot read {path}: {e}")))?;
            pem::check_certificates(&pem).map_err(|e| invalid(key, format!("{path}: {e}")))?;
            Some(Some(std::path::PathBuf::from(path)))
        }
    };
    let parsed = url::Url::parse(&url)
        .map_err(|e| invalid("journal.url", format!("{:?}: {e}", secret::shown_url(&url))))?;
    if parsed.scheme() != "mysql" {
        return Err(invalid(
            "journal.url",
            format!("{:?}: must start with mysql://", secret::shown_url(&url)),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty)
        || parsed.path().trim_start_matches('/').is_empty()
        || parsed.username().is_empty()
    {
        return Err(invalid(
            "journal.url",
            format!(
                "{:?}: must name a user, a host and a database (mysql://user@host:3306/delayq)",
                secret::shown_url(&url)
            ),
        ));
    }
    let url = match password_file {
        Some(path) => with_password(
            "journal",
            &url,
            read_secret("journal.password_file", &path)?,
        )?,
        None => url,
    };
    for (key, value) in [
        ("journal.retention", retention),
        ("journal.transitions_retention", transitions_retention),
    ] {
        if value < Duration::from_secs(60) || value > Duration::from_secs(3650 * 86_400) {
            return Err(invalid(
                key,
                format!("{}: must be 1m to 3650d", crate::human::duration(value)),
            ));
        }
    }
    Ok(Some(JournalConfig {
        url: RedisUrl::new(url),
        retention,
        transitions,
        transitions_retention,
        auto_restore,
        tls,
    }))
}

/// `url` with `password` in it; `section`'s `url` and `password_file` name the error.
pub(super) fn with_password(
    section: &str,
    url: &str,
    password: SecretString,
) -> Result<String, ConfigError> {
    let mut parsed = url::Url::parse(url).map_err(|e| {
        invalid(
            &format!("{section}.url"),
            format!("{:?}: {e}", secret::shown_url(url)),
        )
    })?;
    if parsed.scheme() == "unix" {
        parsed
            .query_pairs_mut()
            .append_pair("pass", password.expose_secret());
    } else if parsed.set_password(Some(password.expose_secret())).is_err() {
        return Err(invalid(
            &format!("{section}.password_file"),
            format!("{:?} has no host to log in to", secret::shown_url(url)),
        ));
    }
    Ok(parsed.into())
}
