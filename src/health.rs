//! Whether this node can do its job: a loop writes a probe key to Redis every
//! second, so that a Redis that answers but refuses writes (a replica after a
//! failover answers READONLY, a full one OOM, one whose last save failed MISCONF)
//! shows as clearly as one that does not answer. `/healthz`, `/readyz`, the service
//! manager's status line and `delayq_redis_writable` read the outcome; nothing waits
//! on a probe. Each round also reads whether Redis's memory settings can evict
//! delayq's keys (`/readyz`'s warnings, `delayq_redis_evicting`). The watchdog reads when the loop last finished a round, which proves
//! this process's own loops run, whatever state Redis is in.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::store::Store;

/// How often the probe writes.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What the last probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisState {
    /// No probe has finished yet.
    Starting,
    Writable,
    /// Redis answered the write with an error (READONLY, OOM, MISCONF, …).
    Refuses(String),
    /// No answer: connection refused or lost, or no reply within `redis.timeout`.
    Unreachable(String),
}

impl RedisState {
    /// Why this node cannot do its job, or None when Redis takes writes.
    pub fn problem(&self) -> Option<String> {
        match self {
            RedisState::Writable => None,
            RedisState::Starting => Some("redis: not probed yet".to_owned()),
            RedisState::Refuses(e) => Some(format!("redis refuses writes: {e}")),
            RedisState::Unreachable(e) => Some(format!("redis unreachable: {e}")),
        }
    }
}

/// One probe round's outcome.
#[derive(Clone, Debug)]
pub struct Probe {
    pub redis: RedisState,
    /// Masters whose memory settings can evict delayq's keys, as last read.
    pub evicting: Vec<String>,
    /// When the round finished.
    pub finished: Instant,
}

/// The probe loop's findings, for readers anywhere in the daemon.
#[derive(Clone)]
pub struct Health {
    rx: watch::Receiver<Probe>,
    /// A round takes at most the probe's timeout plus [`PROBE_EVERY`]; one older than
    /// this means the loop itself is stuck.
    stale_after: Duration,
}

impl Health {
    /// Redis as last probed; `Unreachable` when no round finished for too long.
    pub fn redis(&self) -> RedisState {
        let probe = self.rx.borrow();
        if probe.finished.elapsed() > self.stale_after {
            return RedisState::Unreachable(format!(
                "no probe finished for {} ms",
                probe.finished.elapsed().as_millis()
            ));
        }
        probe.redis.clone()
    }

    /// What an operator should know although Redis takes writes: settings of
    /// Redis's that can lose messages.
    pub fn warnings(&self) -> Vec<String> {
        self.rx
            .borrow()
            .evicting
            .iter()
            .map(|settings| format!("redis may evict delayq's keys ({settings})"))
            .collect()
    }

    /// When the probe loop last finished a round (the watchdog's proof of progress).
    pub fn last_round(&self) -> Instant {
        self.rx.borrow().finished
    }

    /// Every round, as it finishes.
    pub fn updates(&self) -> watch::Receiver<Probe> {
        self.rx.clone()
    }
}

/// Probes once (so the state is known before the API answers), then starts the
/// probe loop: one write every [`PROBE_EVERY`], each bounded by `timeout`.
pub async fn start(
    store: Store,
    node_id: String,
    timeout: Duration,
    cancel: CancellationToken,
) -> (Health, JoinHandle<()>) {
    let first = probe(&store, &node_id, timeout).await;
    let mut last = RedisState::Starting;
    report(&mut last, &first);
    let evicting = evicting(&store, timeout, &[]).await;
    report_evicting(&[], &evicting);
    let (tx, rx) = watch::channel(Probe {
        redis: first,
        evicting,
        finished: Instant::now(),
    });
    let health = Health {
        rx,
        stale_after: (timeout + PROBE_EVERY) * 3,
    };
    let task = tokio::spawn(run(store, node_id, timeout, tx, last, cancel));
    (health, task)
}

async fn probe(store: &Store, node_id: &str, timeout: Duration) -> RedisState {
    match tokio::time::timeout(timeout, store.probe_write(node_id)).await {
        Ok(Ok(())) => RedisState::Writable,
        Ok(Err(e)) => match e.refusal() {
            Some(refusal) => RedisState::Refuses(refusal),
            None => RedisState::Unreachable(e.to_string()),
        },
        Err(_) => RedisState::Unreachable(format!("no answer within {timeout:?}")),
    }
}

/// Masters that can evict delayq's keys; `before` when Redis does not say (no
/// answer within `timeout`, an error).
async fn evicting(store: &Store, timeout: Duration, before: &[String]) -> Vec<String> {
    match tokio::time::timeout(timeout, store.evicting_masters()).await {
        Ok(Ok(evicting)) => evicting,
        _ => before.to_vec(),
    }
}

/// Logs a change of what can evict delayq's keys and sets the gauge.
fn report_evicting(before: &[String], now: &[String]) {
    metrics::gauge!(m::REDIS_EVICTING).set(if now.is_empty() { 0.0 } else { 1.0 });
    if before == now {
        return;
    }
    if now.is_empty() {
        tracing::info!("redis no longer evicts delayq's keys");
    } else {
        tracing::warn!(
            settings = %now.join("; "),
            "redis may evict delayq's keys when full, and with them messages not yet \
             delivered: set maxmemory-policy to noeviction (or a volatile-* policy)"
        );
    }
}

/// Logs a change of condition (one line per change, not one per round) and sets the
/// gauge; `last` becomes `state`. Unreachable for another reason (refused, then
/// timed out) is no change: only what Redis answers is.
fn report(last: &mut RedisState, state: &RedisState) {
    if state == last {
        return;
    }
    if let (RedisState::Unreachable(_), RedisState::Unreachable(_)) = (&*last, state) {
        *last = state.clone();
        return;
    }
    match (state, state.problem()) {
        (_, None) if *last == RedisState::Starting => {}
        (_, None) => tracing::info!("redis takes writes again"),
        (RedisState::Refuses(_), Some(problem)) => {
            tracing::warn!(%problem, "this node cannot do its job until Redis takes writes")
        }
        (_, Some(problem)) => tracing::warn!(%problem, "redis does not answer"),
    }
    let writable = *state == RedisState::Writable;
    metrics::gauge!(m::REDIS_WRITABLE).set(if writable { 1.0 } else { 0.0 });
    *last = state.clone();
}

async fn run(
    store: Store,
    node_id: String,
    timeout: Duration,
    tx: watch::Sender<Probe>,
    mut last: RedisState,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
        let state = probe(&store, &node_id, timeout).await;
        report(&mut last, &state);
        let before = tx.borrow().evicting.clone();
        let evicting = evicting(&store, timeout, &before).await;
        report_evicting(&before, &evicting);
        tx.send_replace(Probe {
            redis: state,
            evicting,
            finished: Instant::now(),
        });
    }
}
