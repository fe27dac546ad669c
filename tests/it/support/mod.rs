//! Shared test support, one file per concept:
//!
//! - `env`: a Redis with a store on it (`Bare`), the same with an in-process daemon
//!   (`Env`), and the configurations tests write (`config`, `toml_layers`);
//! - `http`: `Api`, the one way tests speak HTTP to a node;
//! - `waiting`: the patience factor and every wait on a condition (`eventually`,
//!   `within`), on its absence (`never`), and on time itself (`let_pass`, and the
//!   clock in epoch milliseconds: `now_ms`, `epoch_ms`);
//! - `streams`: Redis streams as producers and consumers see them;
//! - `tally`: exactly once, counted: which ids were lost, doubled or never expected;
//! - `cluster`: `delayq run` processes elected through etcd, and who leads;
//! - `rights`: the Redis user of docs/redis-rights.md, from the rule's text;
//! - `scrape`: reading a `/metrics` text, and the metrics table of docs/metrics.md;
//! - `browser`: headless Chromium over WebDriver, for the dashboard;
//! - `panics`: a failure named again after a long message (nodes' logs), and the
//!   last one kept for teardowns that print more.

#![allow(dead_code)]

pub mod browser;
mod cluster;
mod env;
mod http;
pub mod panics;
mod rights;
mod scrape;
mod streams;
mod tally;
mod waiting;

use std::path::PathBuf;

pub use cluster::*;
pub use env::*;
pub use http::*;
pub use rights::*;
pub use scrape::*;
pub use streams::*;
pub use tally::*;
pub use waiting::*;

/// The `delayq` binary cargo built for these tests.
pub fn delayq_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_delayq"))
}

/// Runs `delayq <args> --config <config>` (the environment's DELAYQ_CONFIG left out)
/// to its end.
pub async fn delayq_with_config(args: &[&str], config: &std::path::Path) -> std::process::Output {
    tokio::process::Command::new(delayq_bin())
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("DELAYQ_CONFIG")
        .output()
        .await
        .expect("run delayq")
}

/// A property test's settings when each case costs a Redis session: `cases` in the
/// suite, or `PROPTEST_CASES` when set (a deeper run).
pub fn redis_cases(cases: u32) -> proptest::test_runner::Config {
    let default = proptest::test_runner::Config::default();
    let deep = std::env::var_os("PROPTEST_CASES").is_some();
    proptest::test_runner::Config {
        cases: if deep { default.cases } else { cases },
        ..default
    }
}

/// The repository's root, where the files tests read (README, docker/, systemd/) are.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Bytes a command printed, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
