//! The deployment's recurring schedules as the daemon changes them: a definition
//! written to Redis (confirmed by replicas) and then to the journal before it is
//! answered (`write.rs`), and the schedules the configuration file declares,
//! reconciled into Redis at start and at each reload (`declared.rs`). What a
//! schedule is lives in `crate::schedule`; the leader makes occurrences in
//! `leader::schedules`.

pub mod declared;
mod write;

pub use write::{Written, add, delete, put};
