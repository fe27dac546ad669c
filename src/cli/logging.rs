//! Where log lines go and how they look: text or JSON on stderr, `RUST_LOG` winning
//! over `log.level`, a level that a reload can change, and, under systemd (stderr
//! connected to the journal, `$JOURNAL_STREAM` set), each line prefixed with its
//! syslog priority (`<3>` … `<7>`) so that the journal records the severity.
//! Errors that happen before logging is set up (a bad configuration) still come out
//! in the chosen format, with the exit code.

use std::io::Write;
use std::path::Path;

use tracing::{Level, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Sets up tracing: `RUST_LOG` wins over the configured level.
pub fn init_logging(level: &str, json: bool) {
    let _ = init_reloadable_logging(level, json);
}

/// Sets up tracing and returns how to change its level later (a reload). With
/// `RUST_LOG` set, the environment keeps winning and a reload leaves it alone.
pub fn init_reloadable_logging(level: &str, json: bool) -> delayq::reload::SetLogLevel {
    let from_env = EnvFilter::try_from_default_env().ok();
    let pinned = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(level));
    // Colours only for a person at a terminal, not in a journal or a log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(Stderr {
            journal: under_journal(),
        });
    // The handle's type differs per format; both become the same closure.
    fn setter<L: Send + Sync + 'static, S: 'static>(
        handle: tracing_subscriber::reload::Handle<L, S>,
        pinned: bool,
        make: fn(&str) -> anyhow::Result<L>,
    ) -> delayq::reload::SetLogLevel {
        Box::new(move |level: &str| {
            if pinned {
                tracing::warn!(
                    level,
                    "RUST_LOG is set and wins over log.level; log filter unchanged"
                );
                return Ok(());
            }
            handle.reload(make(level)?)?;
            Ok(())
        })
    }
    fn make_filter(level: &str) -> anyhow::Result<EnvFilter> {
        Ok(EnvFilter::try_new(level)?)
    }
    if json {
        let builder = builder.json().with_filter_reloading();
        let handle = builder.reload_handle();
        let _ = builder.try_init();
        setter(handle, pinned, make_filter)
    } else {
        let builder = builder.with_filter_reloading();
        let handle = builder.reload_handle();
        let _ = builder.try_init();
        setter(handle, pinned, make_filter)
    }
}

/// Whether systemd connected stderr to the journal.
fn under_journal() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some_and(|v| !v.is_empty())
}

/// The syslog priority the journal reads from a line's `<N>` prefix.
fn priority(level: Level) -> &'static str {
    match level {
        Level::ERROR => "<3>",
        Level::WARN => "<4>",
        Level::INFO => "<6>",
        Level::DEBUG | Level::TRACE => "<7>",
    }
}

/// stderr, one formatted event per write; under the journal with its priority first.
#[derive(Clone, Copy)]
struct Stderr {
    journal: bool,
}

struct Line {
    prefix: &'static str,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter hands over a whole event in one buffer; one locked write
        // keeps lines of concurrent events apart.
        let mut err = std::io::stderr().lock();
        err.write_all(self.prefix.as_bytes())?;
        err.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { prefix: "" }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        let prefix = if self.journal {
            priority(*meta.level())
        } else {
            ""
        };
        Line { prefix }
    }
}

/// Whether a configuration that failed to load asked for JSON logs: `log.format`
/// in the file, or `DELAYQ_LOG_FORMAT`, read as leniently as possible since the
/// configuration as a whole is not valid.
pub fn json_wanted(path: Option<&Path>) -> bool {
    if let Ok(format) = std::env::var("DELAYQ_LOG_FORMAT") {
        return format.trim().trim_matches('"') == "json";
    }
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return false;
    };
    match text.parse::<toml::Table>() {
        Ok(table) => {
            table
                .get("log")
                .and_then(|log| log.get("format"))
                .and_then(|f| f.as_str())
                == Some("json")
        }
        // Not even TOML: look for the line itself.
        Err(_) => text.lines().any(|l| {
            let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
            l == "format=\"json\""
        }),
    }
}

/// An error before logging is set up, on stderr: a JSON object shaped like the JSON
/// log's lines (level, target, fields.message, fields.error, fields.exit_code), or a
/// text line; under the journal with the error priority.
pub fn startup_error(json: bool, message: &str, error: &str, exit_code: u8) {
    let line = startup_error_line(json, message, error, exit_code);
    let prefix = if under_journal() { "<3>" } else { "" };
    let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
}

fn startup_error_line(json: bool, message: &str, error: &str, exit_code: u8) -> String {
    if json {
        serde_json::json!({
            "timestamp": jiff::Timestamp::now().to_string(),
            "level": "ERROR",
            "fields": { "message": message, "error": error, "exit_code": exit_code },
            "target": "delayq",
        })
        .to_string()
    } else {
        format!("delayq: {message}: {error} (exit code {exit_code})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_errors_in_either_format() {
        let line = startup_error_line(true, "bad configuration", "x: \"y\"\nz", 64);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "ERROR");
        assert_eq!(v["fields"]["message"], "bad configuration");
        assert_eq!(v["fields"]["error"], "x: \"y\"\nz");
        assert_eq!(v["fields"]["exit_code"], 64);
        assert!(!line.contains('\n'), "one line: {line}");
        assert_eq!(
            startup_error_line(
                false,
                "bad configuration",
                "redis.shards: must be 1 to 1024",
                64
            ),
            "delayq: bad configuration: redis.shards: must be 1 to 1024 (exit code 64)"
        );
    }

    #[test]
    fn priorities_follow_the_level() {
        for (level, prefix) in [
            (Level::ERROR, "<3>"),
            (Level::WARN, "<4>"),
            (Level::INFO, "<6>"),
            (Level::DEBUG, "<7>"),
            (Level::TRACE, "<7>"),
        ] {
            assert_eq!(priority(level), prefix);
        }
    }

    #[test]
    fn json_is_found_even_in_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, json) in [
            ("[log]\nformat = \"json\"\n", true),
            ("[log]\nformat = \"text\"\n", false),
            ("[log]\nformat = \"json\"\n[redis]\nshards = 0\n", true),
            ("[log\nformat = \"json\"\n", true),
            ("", false),
        ] {
            let path = dir.path().join("c.toml");
            std::fs::write(&path, text).unwrap();
            assert_eq!(json_wanted(Some(&path)), json, "{text:?}");
        }
        assert!(!json_wanted(None));
    }
}
