//! The TCP proxy that cuts a process off from Redis (see `delayq::harness::Proxy`).

pub use delayq::harness::Proxy;
