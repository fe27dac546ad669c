//! Reloading the configuration while running (SIGHUP): which keys may change
//! without a restart, what changed, and the live configuration that readers of
//! those keys follow.
//!
//! The daemon keeps its start-time [`Config`] for everything else; a reload builds
//! a new `Config` that is the running one with only the [`RELOADABLE`] keys taken
//! from the file, and publishes it on a watch channel. Keys that changed in the
//! file but cannot change at run time are reported, and keep their running value.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{Config, ConfigError};

/// Dotted keys, or sections ending in `.`, that take effect without a restart.
/// `log.level`: the filter of the tracing subscriber. `streams.`: the allow list
/// (read by the API on every push) and the MAXLEN settings (read by the forward
/// loops before every batch). `forwarder.max_rate`: the forward loops' shared
/// rate limit, read before every batch. `schedules`: the declared schedules, which
/// every node reconciles into Redis when they change; `scheduler.max_schedules`,
/// read by the API at every create. The tokens ([`TOKEN_KEYS`], reloadable as
/// well): read by the API on every request, their files again at every reload.
pub const RELOADABLE: &[&str] = &[
    "log.level",
    "streams.",
    "delivery.",
    "forwarder.max_rate",
    "schedules",
    "scheduler.max_schedules",
];

/// The keys that set tokens. A reload reports the tokens of a scope that changed
/// as one change of its list's key, each token by name or fingerprint (never the
/// token), wherever it was set.
pub const TOKEN_KEYS: [&str; 6] = [
    "api.tokens",
    "api.tokens_file",
    "api.write_tokens",
    "api.write_tokens_file",
    "api.read_tokens",
    "api.read_tokens_file",
];

/// Each scope's list key and its tokens as a reload reports them: sorted names or
/// fingerprints, each with its streams.
fn token_summaries(api: &crate::config::ApiConfig) -> [(&'static str, String); 3] {
    let summary = |tokens: &[crate::config::ApiToken]| {
        let mut shown: Vec<String> = tokens
            .iter()
            .map(|t| match &t.streams {
                None => crate::who::token(t),
                Some(streams) => {
                    format!("{} (streams={})", crate::who::token(t), streams.join(","))
                }
            })
            .collect();
        shown.sort();
        shown.join(", ")
    };
    [
        ("api.tokens", summary(&api.tokens)),
        ("api.write_tokens", summary(&api.write_tokens)),
        ("api.read_tokens", summary(&api.read_tokens)),
    ]
}

/// The token changes between two configurations: one per scope whose tokens differ.
pub fn token_changes(
    running: &crate::config::ApiConfig,
    file: &crate::config::ApiConfig,
) -> Vec<Change> {
    token_summaries(running)
        .into_iter()
        .zip(token_summaries(file))
        .filter(|((_, old), (_, new))| old != new)
        .map(|((key, old), (_, new))| Change {
            key: key.to_owned(),
            old: Some(old).filter(|s| !s.is_empty()),
            new: Some(new).filter(|s| !s.is_empty()),
        })
        .collect()
}

pub fn is_reloadable(key: &str) -> bool {
    TOKEN_KEYS.contains(&key)
        || RELOADABLE.iter().any(|r| match r.strip_suffix('.') {
            Some(section) => key
                .strip_prefix(section)
                .is_some_and(|k| k.starts_with('.')),
            None => key == *r,
        })
}

/// One key whose value differs between the running configuration and the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    /// None: the key was absent (a per-stream entry added or removed).
    pub old: Option<String>,
    pub new: Option<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
        write!(
            f,
            "{}: {} -> {}",
            self.key,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// Flattens a configuration table to `section.key[.subkey]` → value text. Arrays
/// stay one value: a changed allow list is one change.
pub fn flatten(table: &toml::Table) -> BTreeMap<String, String> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
        for (key, value) in table {
            let dotted = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                toml::Value::Table(t) => walk(&dotted, t, out),
                toml::Value::String(s) => {
                    out.insert(dotted, format!("{s:?}"));
                }
                other => {
                    out.insert(dotted, other.to_string());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", table, &mut out);
    out
}

/// Every key whose value differs, in key order.
pub fn diff(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Vec<Change> {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| Change {
            key: k.clone(),
            old: old.get(k).cloned(),
            new: new.get(k).cloned(),
        })
        .collect()
}

/// The running configuration with the reloadable parts of `file` taken over.
/// Must cover exactly the keys [`RELOADABLE`] names.
pub fn merge(running: &Config, file: &Config) -> Config {
    let mut merged = running.clone();
    merged.log.level = file.log.level.clone();
    merged.streams = file.streams.clone();
    merged.delivery = file.delivery.clone();
    merged.forwarder.max_rate = file.forwarder.max_rate;
    merged.schedules = file.schedules.clone();
    merged.scheduler.max_schedules = file.scheduler.max_schedules;
    merged.api.tokens = file.api.tokens.clone();
    merged.api.write_tokens = file.api.write_tokens.clone();
    merged.api.read_tokens = file.api.read_tokens.clone();
    merged
}

/// What one reload did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub applied: Vec<Change>,
    /// Changed in the file; the running value stays until a restart.
    pub needs_restart: Vec<Change>,
    /// Reloadable keys that a `DELAYQ_*` variable sets (key, variable): the process's
    /// environment does not change, so the file's value of these is never used.
    pub from_environment: Vec<(String, String)>,
}

/// Changes the log filter; an error means the level was not applied.
pub type SetLogLevel = Box<dyn Fn(&str) -> anyhow::Result<()> + Send + Sync>;

/// Rereads the config file on request and publishes its reloadable parts.
pub struct Reloader {
    path: PathBuf,
    running: BTreeMap<String, String>,
    live: watch::Sender<Arc<Config>>,
    set_log_level: SetLogLevel,
}

impl Reloader {
    /// `effective` is the running configuration's table, as
    /// [`Config::effective`] rendered it at start.
    pub fn new(
        path: PathBuf,
        effective: &toml::Table,
        live: watch::Sender<Arc<Config>>,
        set_log_level: SetLogLevel,
    ) -> Reloader {
        Reloader {
            path,
            running: flatten(effective),
            live,
            set_log_level,
        }
    }

    /// The file this reloader rereads.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads the file again (with this process's environment). A bad file changes
    /// nothing and returns the error, naming the key.
    pub fn reload(&mut self) -> Result<Outcome, ConfigError> {
        let (file, table) = Config::load_effective(&self.path)?;
        file.check_reload(&self.live.borrow())?;
        // Tokens are compared as what they are, not as the file's redacted text
        // (a tokens file's lines change under the same path).
        let mut changes: Vec<Change> = diff(&self.running, &flatten(&table))
            .into_iter()
            .filter(|c| !TOKEN_KEYS.contains(&c.key.as_str()))
            .collect();
        changes.extend(token_changes(&self.live.borrow().api, &file.api));
        let (applied, needs_restart): (Vec<Change>, Vec<Change>) =
            changes.into_iter().partition(|c| is_reloadable(&c.key));
        if applied.iter().any(|c| c.key == "log.level") {
            (self.set_log_level)(&file.log.level).map_err(|e| ConfigError::Invalid {
                key: "log.level".into(),
                problem: e.to_string(),
            })?;
        }
        let merged = merge(&self.live.borrow(), &file);
        self.live.send_replace(Arc::new(merged));
        for change in applied
            .iter()
            .filter(|c| !TOKEN_KEYS.contains(&c.key.as_str()))
        {
            match &change.new {
                Some(v) => self.running.insert(change.key.clone(), v.clone()),
                None => self.running.remove(&change.key),
            };
        }
        let from_environment = crate::config::overridden_by_env(std::env::vars())
            .into_iter()
            .filter(|(key, _)| is_reloadable(key))
            .collect();
        Ok(Outcome {
            applied,
            needs_restart,
            from_environment,
        })
    }

    /// Logs and counts a reload's outcome; returns whether it was applied.
    pub fn report(&self, outcome: &Result<Outcome, ConfigError>) -> bool {
        match outcome {
            Ok(outcome) => {
                for change in &outcome.applied {
                    tracing::info!(key = %change.key, old = %change.old.as_deref().unwrap_or("(unset)"), new = %change.new.as_deref().unwrap_or("(unset)"), "configuration reloaded: key changed");
                }
                for change in &outcome.needs_restart {
                    tracing::warn!(key = %change.key, running = %change.old.as_deref().unwrap_or("(unset)"), file = %change.new.as_deref().unwrap_or("(unset)"), "configuration reload: this key changes only at a restart; keeping the running value");
                }
                for (key, variable) in &outcome.from_environment {
                    tracing::warn!(%key, %variable, "configuration reload: this key comes from the environment, which a reload does not change; the file's value is not used");
                }
                let keys: Vec<&str> = outcome.applied.iter().map(|c| c.key.as_str()).collect();
                tracing::info!(
                    path = %self.path.display(),
                    changed = %keys.join(", "),
                    needs_restart = outcome.needs_restart.len(),
                    "configuration reloaded"
                );
                metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => "applied")
                    .increment(1);
                true
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "configuration reload refused; keeping the running configuration");
                metrics::counter!(crate::metrics::CONFIG_RELOADS, "result" => "refused")
                    .increment(1);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_reloadable(key: &str, expected: bool) {
        assert_eq!(is_reloadable(key), expected, "{key}");
    }

    #[test]
    fn reloadable_keys() {
        check_reloadable("log.level", true);
        check_reloadable("log.format", false);
        check_reloadable("streams.allow", true);
        check_reloadable("streams.maxlen.orders", true);
        check_reloadable("streams", false);
        check_reloadable("streamsx.allow", false);
        check_reloadable("redis.url", false);
        check_reloadable("api.listen", false);
        check_reloadable("schedules", true);
        check_reloadable("scheduler.max_schedules", true);
        check_reloadable("scheduler.horizon", false);
    }

    fn effective(text: &str) -> (Config, BTreeMap<String, String>) {
        let (config, table) =
            Config::effective(text, [("DELAYQ_NODE_ID".into(), "n".into())]).expect("valid config");
        (config, flatten(&table))
    }

    #[test]
    fn diff_names_every_changed_key() {
        let (_, old) = effective("[streams]\nallow = [\"a\"]\n[streams.maxlen]\nx = 5");
        let (_, new) = effective(
            "[streams]\nallow = [\"a\", \"b\"]\n[streams.maxlen]\ny = 7\n[redis]\nshards = 4",
        );
        let keys: Vec<String> = diff(&old, &new)
            .into_iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            keys,
            [
                "redis.shards: 16 -> 4",
                "streams.allow: [\"a\"] -> [\"a\", \"b\"]",
                "streams.maxlen.x: 5 -> (unset)",
                "streams.maxlen.y: (unset) -> 7",
            ]
        );
    }

    #[test]
    fn merge_takes_only_the_reloadable_parts() {
        let (running, _) = effective("[streams]\nallow = [\"a\"]\n[redis]\nshards = 8");
        let (file, _) = effective(
            "[streams]\nallow = [\"b*\"]\ndefault_maxlen = 10\n[redis]\nshards = 2\n[log]\nlevel = \"debug\"\nformat = \"json\"\n[forwarder]\nmax_rate = 7\nbatch_size = 5",
        );
        let merged = merge(&running, &file);
        assert!(merged.streams.allows("b1") && !merged.streams.allows("a"));
        assert_eq!(merged.streams.default_maxlen, 10);
        assert_eq!(merged.log.level, "debug");
        assert_eq!(merged.redis.shards, 8);
        assert!(!merged.log.json);
        assert_eq!(merged.forwarder.max_rate, 7);
        assert_eq!(merged.forwarder.batch_size, running.forwarder.batch_size);
        let (file, _) = effective("[delivery.streams.orders]\ngroups = [\"g\"]\nmax_attempts = 3");
        let merged = merge(&running, &file);
        assert_eq!(
            merged.delivery.stream("orders").map(|s| s.max_attempts),
            Some(3)
        );
        let (file, _) = effective(
            "[scheduler]\nmax_schedules = 3\nhorizon = \"2s\"\n[[schedules]]\nid = \"t\"\nstream = \"s\"\npayload = \"p\"\nevery = \"1m\"",
        );
        let merged = merge(&running, &file);
        assert_eq!(merged.scheduler.max_schedules, 3);
        assert_eq!(merged.scheduler.horizon, running.scheduler.horizon);
        assert_eq!(merged.schedules.len(), 1);
    }
}
