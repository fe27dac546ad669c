//! Forwarding with running daemons:
//!
//! - `daemon`: exactly once, never early, through Redis crashes, flushes and shutdowns;
//! - `keys`: cancelling by business key while the same messages are forwarded;
//! - `rate`: `forwarder.max_rate` and `streams.max_rate`.

mod daemon;
mod keys;
mod rate;
