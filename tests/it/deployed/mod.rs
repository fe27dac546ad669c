//! Deployments as production runs them, every feature at once, each fault in
//! turn against real processes: what each feature's own tests prove must still
//! hold when they are combined.

mod cluster;
mod sentinel;
