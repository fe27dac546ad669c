//! Bearer tokens as configured: the secret and, for a line of a tokens file, the
//! name the audit trail and the logs call it by and the streams it may reach.
//!
//! A tokens file holds one token a line, then optional `name=` and `streams=`
//! fields separated by spaces; blank lines and lines starting with `#` are skipped:
//!
//! ```text
//! # token                           fields
//! 3c1e6b0c9f0e4a8d                  name=billing streams=invoices,invoices.*
//! 9a77d2f0b5be41c3                  name=reporting
//! ```
//!
//! `streams=` takes patterns as `streams.allow` does (`*`, `?`), comma-separated;
//! a token without it reaches every stream. An admin token (`api.tokens_file`)
//! reaches every stream: `streams=` is refused there.

use super::glob::glob_match;
use super::{ConfigError, invalid};
use crate::message::is_plain;
use crate::secret::SecretString;

/// Longest token name.
pub const MAX_NAME: usize = 64;

/// One configured token.
#[derive(Clone, Debug)]
pub struct ApiToken {
    pub secret: SecretString,
    /// `name=`; None: known by its fingerprint.
    pub name: Option<String>,
    /// `streams=`: the patterns of the streams it may reach; None: every stream.
    pub streams: Option<Vec<String>>,
}

impl ApiToken {
    /// A token of an inline list: no name, every stream.
    pub fn plain(secret: String) -> ApiToken {
        ApiToken {
            secret: SecretString::from(secret),
            name: None,
            streams: None,
        }
    }

    /// Whether this token may reach `stream`.
    pub fn reaches(&self, stream: &str) -> bool {
        match &self.streams {
            None => true,
            Some(patterns) => patterns.iter().any(|p| glob_match(p, stream)),
        }
    }
}

/// The fields a tokens file's line may carry after the token.
const FIELDS: &str = "name=<name>, streams=<pattern>[,<pattern>...]";

/// Reads line `number` (from 1) of the file `key` names; None for a blank line or
/// a comment. The error names the key and the line, never the token.
pub fn parse_line(key: &str, number: usize, line: &str) -> Result<Option<ApiToken>, ConfigError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let refuse = |problem: String| invalid(key, format!("line {number}: {problem}"));
    let mut words = line.split_ascii_whitespace();
    let secret = words.next().unwrap_or_default();
    if !is_plain(secret) {
        return Err(refuse(
            "a token: must be without control characters".to_owned(),
        ));
    }
    let mut token = ApiToken::plain(secret.to_owned());
    for word in words {
        let Some((field, value)) = word.split_once('=') else {
            return Err(refuse(format!("{word:?}: not a field ({FIELDS})")));
        };
        match field {
            "name" if token.name.is_some() => return Err(refuse("name= given twice".into())),
            "name" => token.name = Some(name(value).map_err(refuse)?),
            "streams" if token.streams.is_some() => {
                return Err(refuse("streams= given twice".into()));
            }
            "streams" => token.streams = Some(patterns(value).map_err(refuse)?),
            other => {
                return Err(refuse(format!("{other:?}: not a field ({FIELDS})")));
            }
        }
    }
    Ok(Some(token))
}

fn name(value: &str) -> Result<String, String> {
    let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if value.is_empty() || value.len() > MAX_NAME || !value.chars().all(fits) {
        return Err(format!(
            "name={value:?}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(value.to_owned())
}

fn patterns(value: &str) -> Result<Vec<String>, String> {
    let patterns: Vec<String> = value.split(',').map(str::to_owned).collect();
    if patterns.iter().any(|p| p.is_empty() || !is_plain(p)) {
        return Err(format!(
            "streams={value:?}: comma-separated patterns, none empty"
        ));
    }
    Ok(patterns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::ExposeSecret;

    /// A line read: the token, its name and its streams.
    type Read<'a> = (&'a str, Option<&'a str>, Option<&'a [&'a str]>);

    #[track_caller]
    fn check(line: &str, want: Option<Read<'_>>) {
        let got = parse_line("api.read_tokens_file", 1, line).unwrap();
        let got = got.as_ref().map(|t| {
            (
                t.secret.expose_secret(),
                t.name.as_deref(),
                t.streams
                    .as_ref()
                    .map(|s| s.iter().map(String::as_str).collect::<Vec<_>>()),
            )
        });
        let want = want.map(|(s, n, p)| (s, n, p.map(<[&str]>::to_vec)));
        assert_eq!(got, want, "{line:?}");
    }

    #[track_caller]
    fn check_err(line: &str, says: &str) {
        let e = parse_line("api.read_tokens_file", 7, line)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("api.read_tokens_file: line 7: "), "{e}");
        assert!(e.contains(says), "{e} should contain {says:?}");
        assert!(!e.contains("s3cret"), "{e} shows the token");
    }

    #[test]
    fn lines() {
        check("", None);
        check("   ", None);
        check("# a comment s3cret", None);
        check("s3cret", Some(("s3cret", None, None)));
        check("  s3cret  ", Some(("s3cret", None, None)));
        check(
            "s3cret name=billing",
            Some(("s3cret", Some("billing"), None)),
        );
        check(
            "s3cret\tstreams=a,b.*  name=b-1.x_y",
            Some(("s3cret", Some("b-1.x_y"), Some(&["a", "b.*"]))),
        );
        check("s3cret streams=*", Some(("s3cret", None, Some(&["*"]))));
    }

    #[test]
    fn refusals_name_the_line_and_never_the_token() {
        check_err("s3cret name", "\"name\": not a field");
        check_err("s3cret owner=x", "\"owner\": not a field");
        check_err("s3cret name=", "name=\"\": 1 to 64");
        check_err("s3cret name=a/b", "name=\"a/b\"");
        check_err(&format!("s3cret name={}", "n".repeat(65)), "1 to 64");
        check_err("s3cret name=a name=b", "name= given twice");
        check_err("s3cret streams=a streams=b", "streams= given twice");
        check_err("s3cret streams=", "none empty");
        check_err("s3cret streams=a,,b", "none empty");
        check_err("s3\u{7}cret", "a token: must be without control characters");
    }

    #[test]
    fn a_token_reaches_the_streams_its_patterns_match() {
        let token = parse_line("k", 1, "t streams=orders,billing.*")
            .unwrap()
            .unwrap();
        for (stream, reached) in [
            ("orders", true),
            ("billing.eu", true),
            ("billing", false),
            ("orders2", false),
            ("", false),
        ] {
            assert_eq!(token.reaches(stream), reached, "{stream}");
        }
        assert!(ApiToken::plain("t".into()).reaches("anything"));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_line_is_read_or_refused_without_panic(line in "\\PC{0,80}") {
                let _ = parse_line("k", 1, &line);
            }

            #[test]
            fn written_lines_read_back(
                secret in "[!-~&&[^#]][!-~]{0,40}",
                name in proptest::option::of("[A-Za-z0-9._-]{1,64}"),
                streams in proptest::option::of(proptest::collection::vec("[a-z0-9.*?:-]{1,12}", 1..4)),
            ) {
                let mut line = secret.clone();
                if let Some(name) = &name {
                    line.push_str(&format!(" name={name}"));
                }
                if let Some(streams) = &streams {
                    line.push_str(&format!(" streams={}", streams.join(",")));
                }
                let token = parse_line("k", 1, &line).unwrap().unwrap();
                prop_assert_eq!(token.secret.expose_secret(), secret.as_str());
                prop_assert_eq!(token.name, name);
                prop_assert_eq!(token.streams, streams);
            }
        }
    }
}
