//! One integration binary: every test runs against real servers that it starts
//! itself (see `delayq::harness`).

mod support;

mod api;
mod bench;
mod edges;
mod forwarding;
mod fuzz;
mod ha;
mod interfaces;
mod ops;
mod store;
mod sweep;
