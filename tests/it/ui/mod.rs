//! The dashboard:
//!
//! - `endpoints`: its API on a leader and a standby, its operations, scopes and bad input;
//! - `browser`: the page itself in headless Chromium, what an operator sees and clicks.

mod browser;
mod endpoints;
