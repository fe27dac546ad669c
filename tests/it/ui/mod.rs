//! The dashboard:
//!
//! - `endpoints`: its API on a leader and a standby, its operations, scopes and bad input;
//! - `stream_charts`: a stream's last hour and day (worst lateness, dead letters, held waits apart);
//! - `browser`: the page itself in headless Chromium, what an operator sees and clicks.

mod browser;
mod endpoints;
mod stream_charts;
