//! Waiting on conditions, never on the clock alone: every wait polls what it stands
//! for, and every limit is multiplied by the patience factor, so that a loaded or
//! slow machine makes a test slower, not flaky.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a cheap condition is checked again.
const POLL: Duration = Duration::from_millis(10);

/// The longest pause between two checks: a check slowed down by a stall of the
/// machine (seconds, now and then, beside other tests) must not keep the next one
/// waiting three times as long, after the condition held.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// The pause before the next check, after one that took `took`: a check that reads
/// much (every entry of a 100k stream, every row of a table) is asked again only
/// after three times its own length, so that waiting never takes more than a
/// quarter of a core from the servers and the tests beside it; at most [`MAX_PAUSE`].
fn pause_after(took: Duration) -> Duration {
    POLL.max(took * 3).min(MAX_PAUSE)
}

/// Multiplies test timeouts: `DELAYQ_TEST_PATIENCE` (default 1, or 3 when `CI` is set).
pub fn patience() -> u32 {
    std::env::var("DELAYQ_TEST_PATIENCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() {
            3
        } else {
            1
        })
}

/// Polls `check` until it returns Some, for at most `timeout` × patience; None if it
/// never did, so that the caller can report everything it found.
pub async fn within<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout * patience();
    loop {
        let began = Instant::now();
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(pause_after(began.elapsed())).await;
    }
}

/// Polls `check` until it returns Some, or panics with `what` after `timeout` × patience.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match within(timeout, check).await {
        Some(v) => v,
        None => panic!(
            "timed out after {:?} waiting for: {what}",
            timeout * patience()
        ),
    }
}

/// The negative case: polls `happened` for `window` × patience (the longer a machine
/// is slow, the longer something that must not happen has to show) and panics with
/// `what` and the evidence as soon as it returns Some.
pub async fn never<T, F, Fut>(window: Duration, what: &str, mut happened: F)
where
    T: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + window * patience();
    loop {
        let began = Instant::now();
        if let Some(evidence) = happened().await {
            panic!("{what}: {evidence:?}");
        }
        if Instant::now() > end {
            return;
        }
        tokio::time::sleep(pause_after(began.elapsed())).await;
    }
}

/// Lets `time` pass where its passing is what a test is about (a lease running out,
/// an outage lasting, a due time coming); never a stand-in for a condition.
pub async fn let_pass(time: Duration) {
    tokio::time::sleep(time).await;
}

/// This machine's clock in epoch milliseconds (Redis's nodes in tests share it).
pub fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

/// `t` in epoch milliseconds.
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn a_check_is_asked_again_after_three_times_its_length_within_bounds() {
    for (took_ms, pause_ms) in [
        (0, 10),
        (2, 10),
        (100, 300),
        (333, 999),
        (400, 1000),
        (5000, 1000),
    ] {
        assert_eq!(
            pause_after(Duration::from_millis(took_ms)),
            Duration::from_millis(pause_ms),
            "{took_ms} ms"
        );
    }
}
