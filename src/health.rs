//! Whether this node can do its job: a loop writes a probe key to Redis every
//! second, so that a Redis that answers but refuses writes (a replica after a
//! failover answers READONLY, a full one OOM, one whose last save failed MISCONF)
//! shows as clearly as one that does not answer. `/healthz`, `/readyz`, the service
//! manager's status line and `delayq_redis_writable` read the outcome; nothing waits
//! on a probe. Each round also reads whether Redis's memory settings can evict
//! delayq's keys and whether a master is nearly full (`/readyz`'s warnings,
//! `delayq_redis_evicting`, `delayq_redis_nearly_full`), and, at start, after every
//! reconnection (Redis took writes again, the connection was made anew to a new
//! master or cluster), every [`RIGHTS_EVERY`] and every round while one is
//! missing, whether the Redis user may run what delayq runs (a missing right
//! makes `/readyz` 503). The watchdog reads when
//! the loop last finished a round, which proves this process's own loops run,
//! whatever state Redis is in.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::store::{Memory, Rights, Store};

/// How often the probe writes.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How often the Redis user's rights are checked while Redis takes writes.
pub const RIGHTS_EVERY: Duration = Duration::from_secs(60);

/// How long a write Redis refused for want of memory (OOM) keeps a warning up.
pub const OOM_WARNS_FOR: Duration = Duration::from_secs(10);

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
    /// Masters whose memory settings can evict delayq's keys, or that are nearly
    /// full, as last read.
    pub memory: Memory,
    /// Whether the Redis user may run what delayq runs, as last checked.
    pub rights: Rights,
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
    /// Redis's that can lose messages, a master nearly full, writes refused for
    /// want of memory just now, rights Redis cannot tell.
    pub fn warnings(&self) -> Vec<String> {
        let probe = self.rx.borrow();
        let mut warnings: Vec<String> = probe
            .memory
            .evicting
            .iter()
            .map(|settings| format!("redis may evict delayq's keys ({settings})"))
            .collect();
        warnings.extend(probe.memory.nearly_full.iter().map(|full| {
            format!(
                "redis is nearly full ({full}): writes will be refused for want of memory (OOM)"
            )
        }));
        if crate::store::oom_refused_within(OOM_WARNS_FOR) {
            warnings.push(format!(
                "redis refused a write for want of memory (OOM) within the last {}",
                crate::human::duration(OOM_WARNS_FOR)
            ));
        }
        if let Rights::Unknown(why) = &probe.rights {
            warnings.push(format!("the Redis user's rights are not checked: {why}"));
        }
        warnings
    }

    /// A right the Redis user lacks, as last checked: this node cannot do its job.
    pub fn rights_problem(&self) -> Option<String> {
        self.rx.borrow().rights.problem()
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
/// probe loop: one write every [`PROBE_EVERY`], each bounded by `timeout`. The
/// rights are checked for `streams` too (see [`Store::rights`]).
pub async fn start(
    store: Store,
    node_id: String,
    timeout: Duration,
    streams: Vec<String>,
    cancel: CancellationToken,
) -> (Health, JoinHandle<()>) {
    let first = probe(&store, &node_id, timeout).await;
    let mut last = RedisState::Starting;
    report(&mut last, &first);
    let memory = memory(&store, timeout, &Memory::default()).await;
    report_memory(&Memory::default(), &memory);
    let rights = rights(&store, timeout, &streams, &Rights::Granted).await;
    report_rights(&Rights::Granted, &rights);
    let (tx, rx) = watch::channel(Probe {
        redis: first,
        memory,
        rights,
        finished: Instant::now(),
    });
    let health = Health {
        rx,
        stale_after: (timeout + PROBE_EVERY) * 3,
    };
    let task = tokio::spawn(run(store, node_id, timeout, streams, tx, last, cancel));
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

/// What the masters' memory says; `before` when Redis does not say (no answer
/// within `timeout`, an error).
async fn memory(store: &Store, timeout: Duration, before: &Memory) -> Memory {
    match tokio::time::timeout(timeout, store.memory()).await {
        Ok(Ok(memory)) => memory,
        _ => before.clone(),
    }
}

/// The user's rights; `before` when Redis does not say.
async fn rights(store: &Store, timeout: Duration, streams: &[String], before: &Rights) -> Rights {
    match tokio::time::timeout(timeout, store.rights(streams)).await {
        Ok(Ok(rights)) => rights,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the Redis user's rights could not be checked");
            before.clone()
        }
        Err(_) => before.clone(),
    }
}

/// Logs a change of what the memory says and sets the gauges.
fn report_memory(before: &Memory, now: &Memory) {
    metrics::gauge!(m::REDIS_EVICTING).set(if now.evicting.is_empty() { 0.0 } else { 1.0 });
    let full = !now.nearly_full.is_empty() || crate::store::oom_refused_within(OOM_WARNS_FOR);
    metrics::gauge!(m::REDIS_NEARLY_FULL).set(if full { 1.0 } else { 0.0 });
    if before.evicting != now.evicting {
        if now.evicting.is_empty() {
            tracing::info!("redis no longer evicts delayq's keys");
        } else {
            tracing::warn!(
                settings = %now.evicting.join("; "),
                "redis may evict delayq's keys when full, and with them messages not yet \
                 delivered: set maxmemory-policy to noeviction (or a volatile-* policy)"
            );
        }
    }
    if before.nearly_full != now.nearly_full {
        if now.nearly_full.is_empty() {
            tracing::info!("redis is no longer nearly full");
        } else {
            tracing::warn!(
                masters = %now.nearly_full.join("; "),
                "redis is nearly full: pushes will be refused for want of memory (OOM); \
                 raise maxmemory or drain streams"
            );
        }
    }
}

/// Logs a change of the user's rights.
fn report_rights(before: &Rights, now: &Rights) {
    if before == now {
        return;
    }
    match now {
        Rights::Granted => tracing::info!("the Redis user may run what delayq runs"),
        Rights::Unknown(why) => tracing::info!(%why, "the Redis user's rights are not checked"),
        Rights::Missing(refused) => tracing::warn!(
            refused = %refused.join("; "),
            "the Redis user may not run what delayq runs: this node is not ready until it may \
             (grant the rule in docs/redis-rights.md)"
        ),
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
    streams: Vec<String>,
    tx: watch::Sender<Probe>,
    mut last: RedisState,
    cancel: CancellationToken,
) {
    let mut rights_checked = Instant::now();
    let mut renewals = store.renewals();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
        let state = probe(&store, &node_id, timeout).await;
        // The rights again after every reconnection (Redis takes writes after it
        // did not; the connection was made anew, to another master or a renewed
        // cluster connection), every while, and every round while one is missing
        // (readiness comes back as soon as an operator grants it).
        let (before_memory, before_rights) = {
            let probe = tx.borrow();
            (probe.memory.clone(), probe.rights.clone())
        };
        let renewed = store.renewals();
        let check_rights = (state == RedisState::Writable && last != RedisState::Writable)
            || renewed != renewals
            || matches!(before_rights, Rights::Missing(_))
            || rights_checked.elapsed() >= RIGHTS_EVERY;
        renewals = renewed;
        report(&mut last, &state);
        let memory = memory(&store, timeout, &before_memory).await;
        report_memory(&before_memory, &memory);
        let rights = if check_rights {
            rights_checked = Instant::now();
            let rights = rights(&store, timeout, &streams, &before_rights).await;
            report_rights(&before_rights, &rights);
            rights
        } else {
            before_rights
        };
        tx.send_replace(Probe {
            redis: state,
            memory,
            rights,
            finished: Instant::now(),
        });
    }
}
