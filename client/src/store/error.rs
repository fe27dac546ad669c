//! What can go wrong in a store call, and which failures are Redis not taking
//! calls now (retry later) rather than a call at fault.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::RedisError;
use thiserror::Error;

#[derive(Clone, Debug, Error)]
pub enum StoreError {
    /// A newer leader has raised the shard's fence: this caller must stop leading.
    #[error("fenced: epoch {caller} is below the fence {held}")]
    Fenced { held: u64, caller: u64 },
    /// A due time more than `max_delay` after Redis's now (the schedule scripts'
    /// `TOO_FAR`, read here once: callers get the times, not a text to parse).
    #[error("due time {due_ms} is more than max_delay {max_delay_ms} ms after now {now_ms}")]
    TooFar {
        due_ms: u64,
        max_delay_ms: u64,
        now_ms: u64,
    },
    #[error("{0}")]
    Corrupt(String),
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
    /// Too many blocking reads are waiting already; retry later.
    #[error("{0}")]
    Busy(String),
    /// Stored on the master, but fewer replicas than `redis.min_replicas_acked`
    /// confirmed it in time: a failover now could lose it.
    #[error(
        "stored on the Redis master, but {acked} of the {wanted} replicas asked for (redis.min_replicas_acked) confirmed it in time; sending it again with the same id is safe"
    )]
    NotReplicated { acked: u32, wanted: u32 },
    /// The message's target stream cannot be one here (on Redis Cluster: a name
    /// with braces but no hash tag, whose dead letters could not share its slot).
    #[error("{0}")]
    BadStream(String),
    /// The journal (`[journal]`) did not commit the push, so Redis was not asked:
    /// nothing was stored.
    #[error(
        "the journal did not take the message ({0}); nothing was stored: send it again with the same id"
    )]
    NotJournaled(String),
    /// The Redis reached is of a kind delayq cannot run on.
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Redis(#[from] RedisError),
}

impl StoreError {
    pub(super) fn from_script(e: RedisError) -> Self {
        let detail = e.detail().unwrap_or_default().to_owned();
        match e.code() {
            Some("OOM") => {
                note_oom();
                StoreError::Redis(e)
            }
            Some("FENCED") => {
                let numbers: Vec<u64> = detail
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                match numbers[..] {
                    [caller, held] => StoreError::Fenced { held, caller },
                    _ => StoreError::Reply(format!("FENCED {detail}")),
                }
            }
            Some("TOO_FAR") => StoreError::too_far(&detail),
            Some("CORRUPT") => StoreError::Corrupt(detail),
            _ => StoreError::Redis(e),
        }
    }

    /// The schedule scripts' `due time D is more than max_delay M ms after now N`
    /// (with or without its `TOO_FAR` code) as [`StoreError::TooFar`].
    pub(super) fn too_far(detail: &str) -> Self {
        // Lua writes a due time past 2^53 as a double (`1.844674407371e+19`):
        // read as one, saturating into u64.
        let numbers: Vec<u64> = detail
            .split_whitespace()
            .filter_map(|w| w.parse::<f64>().ok().filter(|n| n.is_finite()))
            .map(|n| n as u64)
            .collect();
        match numbers[..] {
            [due_ms, max_delay_ms, now_ms] => StoreError::TooFar {
                due_ms,
                max_delay_ms,
                now_ms,
            },
            _ => StoreError::Reply(format!("TOO_FAR {detail}")),
        }
    }

    /// Redis's error reply as Redis wrote it (`READONLY You can't write…`, `OOM …`,
    /// `MISCONF …`) when it answered with one: it is up, but refused. None when it
    /// did not answer at all.
    pub fn refusal(&self) -> Option<String> {
        match self {
            StoreError::Redis(e) => {
                let code = e.code()?;
                Some(format!("{code} {}", e.detail().unwrap_or_default()))
            }
            _ => None,
        }
    }

    /// Whether the error says Redis does not take this call now (connection lost or
    /// refused, no answer in time, or a reply refusing work for a while: READONLY,
    /// OOM, MISCONF, LOADING, BUSY, ...) rather than that the call itself fails. A
    /// transient error is retried; any other one is the fault of what the call
    /// carried. A fence is neither: callers that can be fenced handle it first.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Busy(_)
            | StoreError::NotReplicated { .. }
            | StoreError::NotJournaled(_) => true,
            StoreError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.code().is_some_and(|code| TRANSIENT_CODES.contains(&code))
            }
            StoreError::Fenced { .. }
            | StoreError::TooFar { .. }
            | StoreError::BadStream(_)
            | StoreError::Corrupt(_)
            | StoreError::Reply(_)
            | StoreError::Unsupported(_) => false,
        }
    }
}

/// When Redis last refused a script for want of memory (`OOM`), in ms since the
/// Unix epoch; 0 never.
static LAST_OOM_MS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn note_oom() {
    LAST_OOM_MS.store(now_ms(), Ordering::Relaxed);
}

/// Whether Redis refused one of this process's scripts for want of memory within
/// `window` (a batch can be refused while a small probe write still passes).
pub fn oom_refused_within(window: std::time::Duration) -> bool {
    let at = LAST_OOM_MS.load(Ordering::Relaxed);
    at != 0 && now_ms().saturating_sub(at) <= window.as_millis() as u64
}

/// Error replies by which Redis says it takes no writes (or no calls) for now.
const TRANSIENT_CODES: &[&str] = &[
    "READONLY",
    "OOM",
    "MISCONF",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    // Redis Cluster's redirections the connection did not follow in time (a
    // failover or a reshard under way): the slot is served again shortly.
    "MOVED",
    "ASK",
];

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(error: StoreError, transient: bool) {
        assert_eq!(error.is_transient(), transient, "{error:?}");
    }

    fn reply(code: &str, detail: &str) -> StoreError {
        StoreError::Redis(redis::make_extension_error(
            code.to_owned(),
            Some(detail.to_owned()),
        ))
    }

    fn io(kind: std::io::ErrorKind) -> StoreError {
        StoreError::Redis(std::io::Error::new(kind, "test").into())
    }

    #[test]
    #[rustfmt::skip]
    fn transient_errors_are_those_of_redis_not_taking_calls_now() {
        check(io(std::io::ErrorKind::ConnectionReset), true);
        check(io(std::io::ErrorKind::ConnectionRefused), true);
        check(io(std::io::ErrorKind::TimedOut), true);
        check(StoreError::Redis(RedisError::from((redis::ErrorKind::Io, "timed out", "no answer".to_owned()))), true);
        check(reply("READONLY", "You can't write against a read only replica."), true);
        check(reply("OOM", "command not allowed when used memory > 'maxmemory'."), true);
        check(reply("MISCONF", "Redis is configured to save RDB snapshots"), true);
        check(reply("LOADING", "Redis is loading the dataset in memory"), true);
        check(reply("BUSY", "Redis is busy running a script."), true);
        check(reply("MASTERDOWN", "Link with MASTER is down"), true);
        check(StoreError::Busy("too many long polls".into()), true);
        check(reply("ERR", "user_script:1: too many results to unpack"), false);
        check(reply("WRONGTYPE", "Operation against a key holding the wrong kind of value"), false);
        check(reply("DEADLETTER", "cannot write to s:dead: WRONGTYPE"), false);
        check(StoreError::Reply("expected an array".into()), false);
        check(StoreError::Corrupt("undecodable body".into()), false);
        check(StoreError::too_far("due time 9 is more than max_delay 5 ms after now 1"), false);
        assert!(matches!(
            StoreError::too_far("TOO_FAR due time 1.844674407371e+19 is more than max_delay 5 ms after now 1"),
            StoreError::TooFar { due_ms, max_delay_ms: 5, now_ms: 1 } if due_ms > 1 << 63
        ));
        check(StoreError::Fenced { held: 2, caller: 1 }, false);
    }

    #[test]
    fn a_script_refused_for_memory_is_remembered_for_a_while() {
        let oom =
            redis::make_extension_error("OOM".to_owned(), Some("command not allowed".to_owned()));
        let e = StoreError::from_script(oom);
        assert!(e.is_transient(), "{e:?}");
        assert!(oom_refused_within(std::time::Duration::from_secs(10)));
        LAST_OOM_MS.store(now_ms() - 11_000, Ordering::Relaxed);
        assert!(!oom_refused_within(std::time::Duration::from_secs(10)));
        assert!(oom_refused_within(std::time::Duration::from_secs(12)));
    }
}
