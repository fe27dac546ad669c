//! Forwarding with running daemons:
//!
//! - `daemon`: exactly once, never early, through Redis crashes, flushes and shutdowns;
//! - `rate`: `forwarder.max_rate` and `streams.max_rate`.

mod daemon;
mod rate;
