//! delayq delivers delayed messages into Redis Streams on time.
//!
//! # Layout
//! The producer client, built with or without the daemon (see "Features" below):
//! - [`client`]: the Rust producer API (Redis directly, the daemon's own scripts).
//! - [`config`]: TOML + environment → validated [`config::Config`].
//! - [`message`]: ids, due times, validation; pure.
//! - [`store`]: the only module that speaks Redis; all changes happen in its Lua scripts.
//! - [`secret`]: credentials that never reach a log.
//! - [`human`]: durations and times as people read them.
//!
//! The daemon (feature `server`):
//! - `leadership`: leadership as a watch value; the standalone elector.
//! - `election`: the only module that speaks etcd: lease, campaign, keepalive
//!   deadline, resign.
//! - `leader`: what runs only while this node leads: the term handle (fences),
//!   the forward loops, the rate limits and their µs timer, the redelivery sweep
//!   and the journal's keeper, started each term by `leader::run_while_leading`.
//! - `inbox`: every instance schedules what producers XADD into the inbox stream.
//! - `api`: the HTTP API (axum).
//! - `reload`: SIGHUP: what may change at run time, and the live configuration.
//! - `service`: running under a service manager: readiness, status, watchdog.
//! - `cli`: the `delayq` command's subcommands other than `run`, with the tools
//!   (bench, drill, demo) and the process harness they start redis-server, etcd and
//!   delayq with.
//! - `start` brings a daemon up; `Daemon::stop` takes it down in order.
//!
//! # Features
//! - `server` (default): everything above; the `delayq` binary requires it.
//! - `test-support`: makes the process harness public for this crate's own tests.
//!
//! A producer depends on `delayq = { default-features = false }`: no etcd, gRPC,
//! HTTP server or CLI crates.

// The producer client and what it shares with the daemon: no server crates.
pub mod client;
pub mod config;
pub mod human;
pub mod message;
pub mod pem;
pub mod secret;
pub mod store;

// The daemon (feature `server`, on by default).
#[cfg(feature = "server")]
pub mod api;
#[cfg(feature = "server")]
pub mod backoff;
// One log line per condition for retrying loops; the store's Redis resolution
// uses it too, so it is not `server`'s alone (std only).
#[cfg(feature = "server")]
pub mod cli;
pub mod complaint;
#[cfg(feature = "server")]
mod daemon;
#[cfg(feature = "server")]
pub mod election;
#[cfg(feature = "server")]
pub mod health;
#[cfg(feature = "server")]
pub mod inbox;
#[cfg(feature = "server")]
pub mod ingest;
#[cfg(feature = "server")]
pub mod journal;
#[cfg(feature = "server")]
pub mod leader;
#[cfg(feature = "server")]
pub mod leadership;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod registry;
#[cfg(feature = "server")]
pub mod reload;
#[cfg(feature = "server")]
pub mod restore;
#[cfg(feature = "server")]
pub mod service;

#[cfg(feature = "server")]
pub use daemon::{Daemon, run, start};

// Real redis-server, etcd and delayq processes: the daemon's bench, drill and demo
// use them; only this crate's tests (feature `test-support`) see them.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod harness;
#[cfg(all(feature = "server", not(feature = "test-support")))]
#[allow(dead_code, unused_imports)]
mod harness;
