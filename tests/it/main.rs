//! One integration binary: every test runs against real servers that it starts
//! itself (see `delayq::harness`).

mod support;

mod api;
mod bench;
mod forwarding;
mod ha;
mod interfaces;
mod ops;
mod poison;
mod store;
mod sweep;
