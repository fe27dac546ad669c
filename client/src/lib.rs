//! delayq's producer side, and the part of delayq that speaks Redis.
//!
//! A producer depends on this crate alone: no etcd, gRPC, HTTP server, MySQL or
//! command-line crates. The daemon (`delayq`) builds on it.
//!
//! - [`client`]: the Rust producer API (Redis directly, the daemon's own scripts).
//! - [`config`]: TOML + environment → validated [`config::Config`] (the daemon's
//!   whole file: a producer reads the same one to agree on prefix and shards).
//! - [`message`]: ids, due times, validation, the codec of a stored message; pure.
//! - [`store`]: the only module that speaks Redis; all changes happen in its Lua
//!   scripts.
//! - [`secret`], [`pem`]: credentials that never reach a log, and PEM files.
//! - [`schedule`]: recurring schedules: when they fire, through daylight saving time.
//! - [`human`]: durations and times as people read them.
//! - [`complaint`], [`backoff`]: one log line per condition, and growing delays,
//!   for loops that retry.
//!
//! # Features
//! - `faults`: fault points for tests (`store::faults`); off in every build that
//!   ships.

pub mod backoff;
pub mod client;
pub mod complaint;
pub mod config;
pub mod human;
pub mod message;
pub mod pem;
pub mod schedule;
pub mod secret;
pub mod store;
