//! The dashboard:
//!
//! - `endpoints`: its API on a leader and a standby, its operations, scopes and bad input;
//! - `last_hour`: a stream's worst lateness and dead letters a minute, held waits apart;
//! - `browser`: the page itself in headless Chromium, what an operator sees and clicks.

mod browser;
mod endpoints;
mod last_hour;
