//! One integration binary: every test runs against real servers that it starts
//! itself (see `delayq_harness`).

mod support;

mod deployed;
mod docker;
mod edges;
mod forwarding;
mod fuzz;
mod ha;
mod interfaces;
mod journal;
mod ops;
mod redis_cluster;
mod sentinel;
mod store;
mod sweep;
mod tls;
mod ui;
