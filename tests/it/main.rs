//! One integration binary: every test runs against real servers that it starts
//! itself (see `delayq::harness`).

mod support;

mod api;
mod bench;
mod board;
mod deployed;
mod deps;
mod docker;
mod edges;
mod forwarding;
mod fuzz;
mod ha;
mod health;
mod http;
mod interfaces;
mod journal;
mod journaled;
mod limits;
mod logs;
mod metrics;
mod ops;
mod pending;
mod poison;
mod proxy;
mod rate;
mod readme;
mod records;
mod redis_cluster;
mod reload;
mod secrets;
mod sentinel;
mod store;
mod stored;
mod sweep;
mod tls;
mod ui;
