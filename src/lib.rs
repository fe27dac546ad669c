//! delayq delivers delayed messages into Redis Streams on time: the daemon.
//!
//! The producer side and everything that speaks Redis live in `delayq-client`
//! (`client/`): the message model, the configuration and the store. This crate
//! is the daemon built on it; the `delayq` binary (`src/main.rs`, `src/cli/`)
//! holds the command line and the tools (bench, drill, demo).
//!
//! # Layout
//! - `leadership`: leadership as a watch value; the standalone elector.
//! - `election`: the only module that speaks etcd: lease, campaign, keepalive
//!   deadline, resign.
//! - `leader`: what runs only while this node leads: the term handle (fences),
//!   the forward loops, the rate limits and their µs timer, the redelivery sweep
//!   and the journal's keeper, started each term by `leader::run_while_leading`.
//! - `inbox`: every instance schedules what producers XADD into the inbox stream.
//! - `schedules`: recurring schedules' definitions written through to the journal,
//!   and the ones the configuration file declares, reconciled.
//! - `api`: the HTTP API (axum).
//! - `journal`: the only module that speaks MySQL; `restore` refills Redis from it.
//! - `reload`: SIGHUP: what may change at run time, and the live configuration.
//! - `service`: running under a service manager: readiness, status, watchdog.
//! - `who`: what logs and the audit trail call a token (its name or fingerprint).
//! - `start` brings a daemon up; `Daemon::stop` takes it down in order.
//!
//! # A producer and a daemon on one Redis
//! With a daemon running on the same Redis (here in-process), the message arrives in
//! its stream when due, with its fields in order, plus `delayq-id`:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> anyhow::Result<()> {
//! # let redis = delayq_harness::RedisServer::start()?;
//! use std::time::Duration;
//!
//! use delayq_client::client::{Producer, ProducerOptions};
//! use delayq_client::config::Config;
//! use redis::streams::{StreamReadOptions, StreamReadReply};
//!
//! let config = Config::from_toml(
//!     &format!("[redis]\nurl = \"{}\"\n[api]\nlisten = \"127.0.0.1:0\"", redis.url()),
//!     std::iter::empty(),
//! )?;
//! let daemon = delayq::start(config.clone()).await?;
//! let producer = Producer::with_options(ProducerOptions::from_config(&config)).await?;
//! producer.send("orders", &[("order", "42")], Duration::from_millis(200)).await?;
//!
//! let mut conn = producer.store().separate_connection().await?;
//! let reply: StreamReadReply = redis::AsyncCommands::xread_options(
//!     &mut conn,
//!     &["orders"],
//!     &["0"],
//!     &StreamReadOptions::default().block(10_000),
//! )
//! .await?;
//! let entry = &reply.keys[0].ids[0];
//! assert_eq!(entry.get::<String>("order").as_deref(), Some("42"));
//! assert!(entry.map.contains_key("delayq-id"));
//! daemon.stop().await;
//! # Ok(())
//! # }
//! ```

// What the daemon shares with producers, as `crate::…` paths.
use delayq_client::{backoff, complaint, config, human, message, schedule, secret, store};

pub mod api;
mod daemon;
pub mod election;
pub mod health;
pub mod inbox;
pub mod ingest;
pub mod journal;
pub mod leader;
pub mod leadership;
pub mod metrics;
pub mod registry;
pub mod reload;
pub mod restore;
pub mod schedules;
pub mod service;
pub mod who;

pub use daemon::{Daemon, run, start};
