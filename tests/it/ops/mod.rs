//! Operating delayq, with real processes throughout:
//!
//! - `config`: check-config, bad configurations at start, the journal, SIGHUP;
//! - `notify`: the service manager protocol (readiness, status, watchdog);
//! - `packaging`: the systemd unit, the compose files, the Dockerfile, the health
//!   command;
//! - `drill`: the failover drill and the quickstart demo;
//! - `functions`: listing and pruning the function libraries of other versions;
//! - `metrics`: the metrics table of docs/metrics.md and the alert rules against what
//!   delayq exports; `grafana`: the shipped dashboard against the same; `exported`: what `/metrics` shows an operator;
//! - `health`: `/healthz` and `/readyz` through Redis that refuses writes;
//! - `logs`: the log through an outage; `secrets`: secrets never show;
//! - `reload`: SIGHUP reaching every component; `declared`: schedules the file
//!   declares, reconciled at start and at a reload;
//! - `bench`: `delayq bench` at a tiny scale; `audit`: the audit trail;
//! - `deps`: the producer client's dependency tree; `modules`: no circles, no long files;
//! - `docs`: README.md and docs/ as a new user reads them.

mod audit;
mod bench;
mod config;
mod declared;
mod deps;
mod docs;
pub(crate) mod drill;
mod exported;
pub(crate) mod functions;
mod grafana;
mod health;
mod logs;
mod metrics;
mod modules;
mod notify;
mod packaging;
mod reload;
mod secrets;
mod tokens;

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::support::delayq_bin;

/// Runs `delayq args` to its end, without the caller's log filter.
fn delayq(args: &[&str]) -> Output {
    Command::new(delayq_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run delayq")
}

/// A tool these tests need from `PATH`, or a failure that says how to install it.
fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{name} is not installed: run .ci/install-deps --tests"))
}
