//! Fault points for this crate's tests (feature `faults`): ways to make a store
//! fail or slow down at one step, to check what the rest does about it.

use std::sync::Mutex;
use std::time::Duration;

/// Inboxes whose entries are never acknowledged after their schedule call on Redis
/// Cluster (the step in another slot), as if the process died or its connection
/// dropped between the two.
static LOSING_ACKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Loses (`true`) or stops losing the acknowledgements of inbox `stream`.
pub fn lose_inbox_acks(stream: &str, lose: bool) {
    let mut losing = LOSING_ACKS.lock().unwrap_or_else(|e| e.into_inner());
    losing.retain(|s| s != stream);
    if lose {
        losing.push(stream.to_owned());
    }
}

pub(super) fn losing_acks_of(stream: &str) -> bool {
    let losing = LOSING_ACKS.lock().unwrap_or_else(|e| e.into_inner());
    losing.iter().any(|s| s == stream)
}

/// How long a move to the master Sentinel names waits once the new master
/// answered, before the connection moves (zero: not at all).
static SLOW_MOVES: Mutex<Duration> = Mutex::new(Duration::ZERO);

/// Makes every move to a new master through Sentinel wait `by` before it takes
/// effect, so that the announcements of several Sentinels are followed at once.
pub fn slow_master_moves(by: Duration) {
    *SLOW_MOVES.lock().unwrap_or_else(|e| e.into_inner()) = by;
}

pub(super) fn master_moves_slowed_by() -> Duration {
    *SLOW_MOVES.lock().unwrap_or_else(|e| e.into_inner())
}
