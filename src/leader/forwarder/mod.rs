//! Leader-only work: forwarding due messages into their streams, forgetting old
//! records, and reporting what is pending.
//!
//! `start` is called by each [`Term`] once its fences are raised: one forward
//! loop per shard plus the housekeeping loops, all ending with the term. A loop
//! finishes at most the script call in flight; a `FENCED` reply goes to
//! [`Term::fenced`].

mod paused;
mod reports;
mod trim;
mod wakeups;

use paused::{follow_paused, pause_budgets};
use reports::{report_pending, report_pending_streams};
use trim::trim_records;
use wakeups::dispatch_wakeups;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::rate::{Limiter, StreamLimits};
use super::term::Term;
use super::timer::Timer;
use crate::backoff::Backoff;
use crate::complaint::Complaint;
use crate::config::Config;
use crate::metrics as m;
use crate::store::{ForwardOptions, HeldBack, Store, StoreError};

/// Starts a term's forwarding work on `workers`: one forward loop per shard, the
/// wake-up dispatcher, record trimming and the pending reports. Each stops when
/// the term ends, after at most the script call in flight.
pub(crate) fn start(
    workers: &mut JoinSet<()>,
    term: &Term,
    live: watch::Receiver<Arc<Config>>,
    store: &Store,
) {
    let config = live.borrow().clone();
    let cancel = term.child_token();
    let options = Arc::new(config.forward_options());
    // One per shard, and one more for new shards (see discover_waker).
    let wakers: Arc<Vec<Notify>> = Arc::new(
        (0..=usize::from(store.shards()))
            .map(|_| Notify::new())
            .collect(),
    );
    let in_flight = Arc::new(Semaphore::new(FORWARDS_IN_FLIGHT));
    let (rate, stream_rates) = term_rates(&config);
    let limiter = Arc::new(Limiter::new(rate, Instant::now()));
    let stream_limits = Arc::new(StreamLimits::new(&stream_rates, Instant::now()));
    let (paused_tx, paused) = watch::channel(None);
    let tasks = workers;
    tasks.spawn(follow_paused(
        store.clone(),
        term.clone(),
        paused_tx,
        wakers.clone(),
        cancel.clone(),
    ));
    tasks.spawn(dispatch_wakeups(
        store.clone(),
        wakers.clone(),
        cancel.clone(),
    ));
    tasks.spawn(run_shards(
        ForwardLoop {
            store: store.clone(),
            term: term.clone(),
            options: options.clone(),
            live: live.clone(),
            idle_wakeup: config.forwarder.idle_wakeup,
            shard: 0,
            wakers: wakers.clone(),
            in_flight: in_flight.clone(),
            limiter: limiter.clone(),
            stream_limits: stream_limits.clone(),
            paused,
        },
        cancel.clone(),
    ));
    tasks.spawn(trim_records(
        store.clone(),
        term.clone(),
        config.records.trim_interval,
    ));
    // The reports count every shard: one term of each node does them (with
    // `election.mode = "per_shard"`, the one whose group holds shard 0).
    if store.owns(0) {
        tasks.spawn(report_pending(
            store.clone(),
            limiter,
            stream_limits,
            cancel.clone(),
        ));
        tasks.spawn(report_pending_streams(store.clone(), cancel));
    }
}

// What the forwarder's loops log while they fail: one line per condition for the
// whole process (every shard loop of every term), not one per shard and retry.
static SHARDS_UNREAD: Complaint = Complaint::new(
    "cannot read the shards in use",
    "the shards in use are read again",
);

static FORWARD_FAILED: Complaint =
    Complaint::across("shard", "forward failed", "forwarding works again");
static FORWARD_HELD_BACK: Complaint = Complaint::across(
    "shard",
    "forward held back",
    "forwarding is no longer held back",
);

/// How often a term on Redis Cluster looks for shards (hash slots) newly in use.
const DISCOVER_EVERY: Duration = Duration::from_secs(1);

/// Runs one forward loop per owned shard in use, each a copy of `template` with its
/// shard, until the term ends; then waits for them (each finishes at most its call
/// in flight). On a standalone Redis every shard is in use from the start; on
/// Redis Cluster a shard is a hash slot, in use from its first message, so the
/// list is read again every [`DISCOVER_EVERY`] and on each wake-up (at most every
/// 100 ms), and a new shard's loop starts within that.
async fn run_shards(template: ForwardLoop, cancel: CancellationToken) {
    let mut loops = JoinSet::new();
    let mut running = std::collections::HashSet::new();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let cluster = template.store.is_cluster();
    while !cancel.is_cancelled() {
        let wait = match template.store.owned_in_use().await {
            Ok(shards) => {
                backoff.reset();
                if let Some(said) = SHARDS_UNREAD.recovered() {
                    tracing::info!("{said}");
                }
                for shard in shards {
                    if !running.insert(shard) {
                        continue;
                    }
                    // At 0 from the loop's start, so that a rate() over it sees the first error.
                    metrics::counter!(m::FORWARD_ERRORS, "shard" => shard.to_string()).increment(0);
                    loops.spawn(forward_shard(ForwardLoop {
                        store: template.store.clone(),
                        term: template.term.clone(),
                        options: template.options.clone(),
                        live: template.live.clone(),
                        idle_wakeup: template.idle_wakeup,
                        shard,
                        wakers: template.wakers.clone(),
                        in_flight: template.in_flight.clone(),
                        limiter: template.limiter.clone(),
                        stream_limits: template.stream_limits.clone(),
                        paused: template.paused.clone(),
                    }));
                }
                if !cluster {
                    break;
                }
                DISCOVER_EVERY
            }
            Err(e) => {
                let delay = backoff.next_delay();
                if let Some(said) = SHARDS_UNREAD.failed() {
                    tracing::warn!(error = %e, retry_in = ?delay, "{said}");
                }
                delay
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
            _ = discover_waker(&template.wakers).notified(), if cluster => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    while loops.join_next().await.is_some() {}
}

/// The waker past the shards' own: on Redis Cluster any wake-up notifies it too, so
/// that a shard newly in use gets its loop at once.
fn discover_waker(wakers: &[Notify]) -> &Notify {
    wakers.last().expect("one waker past the shards'")
}

/// `forwarder.max_rate` and `streams.max_rate`, each limit this term's share (see
/// `ElectionConfig::rate_share`).
fn term_rates(config: &Config) -> (f64, Vec<(String, f64)>) {
    let share = |rate| config.election.rate_share(rate);
    let streams = config
        .streams
        .max_rate
        .iter()
        .map(|(stream, rate)| (stream.clone(), share(*rate)))
        .collect();
    (share(config.forwarder.max_rate), streams)
}

/// Forward calls of draining shards in flight at once. The shard loops share one
/// pipelined connection, and Redis runs the scripts queued on a connection back to
/// back: with every shard draining a backlog, 16 full batches kept other clients
/// waiting about 40 ms. Two keep Redis busy (one runs while the next is on its way)
/// and bound that wait to about two batches. Loops forwarding what just fell due
/// (small batches, latency-bound) do not take turns: gating them too made a 20k
/// msg/s steady load late (p99 21-69 ms instead of 4-5 ms). They move at most
/// [`UNGATED_BATCH`] a call, so that when a burst falls due at one instant every
/// idle loop's first call is small (a full one takes its turn next).
const FORWARDS_IN_FLIGHT: usize = 2;

/// Most messages a loop moves in a call that takes no turn: more than a steady
/// load brings due at once per shard, few enough that all shards' loops finding
/// a burst due at the same instant hold Redis for milliseconds, not the ~40 ms of
/// 16 full batches.
const UNGATED_BATCH: usize = 50;

/// Shortest wait before a loop tries again for messages held back by their stream's
/// limit: another shard's loop may hold that stream's permits for the length of
/// its call, and would otherwise be raced in a tight loop.
const MIN_HELD_WAIT: Duration = Duration::from_millis(1);

struct ForwardLoop {
    store: Store,
    term: Term,
    options: Arc<ForwardOptions>,
    /// Rebuilds `options` when a reload changed the configuration.
    live: watch::Receiver<Arc<Config>>,
    idle_wakeup: Duration,
    shard: u16,
    wakers: Arc<Vec<Notify>>,
    /// Shared by the term's shard loops: see [`FORWARDS_IN_FLIGHT`].
    in_flight: Arc<Semaphore>,
    /// `forwarder.max_rate`, shared by the term's shard loops.
    limiter: Arc<Limiter>,
    /// `streams.max_rate`, shared by the term's shard loops.
    stream_limits: Arc<StreamLimits>,
    /// The streams paused by an operator (see [`follow_paused`]); None until read
    /// once this term.
    paused: watch::Receiver<Option<Arc<BTreeSet<String>>>>,
}

/// Forwards one shard: a batch at a time while batches come back full, otherwise
/// sleeps until the shard's next due time, a wake-up, or `idle_wakeup`.
async fn forward_shard(mut l: ForwardLoop) {
    let cancel = l.term.child_token();
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(2));
    // Wakes to the µs for the next due time (the runtime's timer is ms-coarse).
    let mut timer = Timer::new();
    let waker = &l.wakers[l.shard as usize];
    let shard_label = l.shard.to_string();
    let script_seconds = metrics::histogram!(m::SCRIPT_SECONDS, "script" => "forward");
    let lateness = metrics::histogram!(m::LATENESS_SECONDS);
    let held_wait = metrics::histogram!(m::HELD_WAIT_SECONDS);
    let batch_size = metrics::histogram!(m::FORWARD_BATCH);
    // Until a batch says otherwise, assume a backlog (a new term often starts on one).
    let mut draining = true;
    while !cancel.is_cancelled() {
        if l.live.has_changed().unwrap_or(false) {
            let config = l.live.borrow_and_update().clone();
            l.options = Arc::new(config.forward_options());
            let (rate, stream_rates) = term_rates(&config);
            l.limiter.set_rate(rate, Instant::now());
            l.stream_limits.set_rates(&stream_rates, Instant::now());
        }
        // Held while Redis has lost the journal's data (see `keeper`).
        l.term.unheld().await;
        // No call before the paused streams are read this term, so that no message
        // of a paused stream goes out at the start of a term.
        let read = l.paused.borrow().clone();
        let paused = match read {
            Some(paused) => paused,
            None => {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = l.paused.changed() => {}
                }
                continue;
            }
        };
        // Permits first, the turn after: a loop waiting for the rate holds no turn.
        let allowed = tokio::select! {
            _ = cancel.cancelled() => break,
            n = l.limiter.acquire(l.options.batch_size) => n,
        };
        let (turn, limit) = if draining {
            tokio::select! {
                _ = cancel.cancelled() => break,
                turn = l.in_flight.acquire() => (Some(turn.expect("the semaphore is never closed")), allowed),
            }
        } else {
            (None, allowed.min(UNGATED_BATCH))
        };
        let started = Instant::now();
        // One permit more than the call may send: a stream that gets it is not at its
        // limit, and what the call leaves of it stays in due order (see forward.lua);
        // the permit goes back unused.
        let mut budgets = l.stream_limits.take_budgets(limit + 1, started);
        pause_budgets(&mut budgets, &paused, &l.stream_limits);
        let result = l
            .store
            .forward_at_most(l.shard, l.term.epoch(), &l.options, limit, &budgets)
            .await;
        drop(turn);
        let moved = result.as_ref().map_or(0, |b| b.moved() as usize);
        l.limiter.give_back(allowed.saturating_sub(moved));
        let sent = result.as_ref().map_or(&[][..], |b| &b.per_stream[..]);
        l.stream_limits.give_back(&budgets, sent);
        match result {
            Ok(batch) => {
                if let Some(said) = FORWARD_FAILED.recovered_on(l.shard.into()) {
                    tracing::info!("{said}");
                }
                script_seconds.record(started.elapsed().as_secs_f64());
                if batch.moved() > 0 {
                    l.term.forwarded(batch.moved());
                    batch_size.record(batch.moved() as f64);
                    for &ms in &batch.lateness_ms {
                        lateness.record(ms as f64 / 1000.0);
                    }
                    for &ms in &batch.held_wait_ms {
                        held_wait.record(ms as f64 / 1000.0);
                    }
                    m::record_batch(&batch);
                    for (stream, count) in &batch.per_stream {
                        metrics::counter!(m::FORWARDED, "stream" => m::stream_label(stream))
                            .increment(*count);
                    }
                    if batch.expired > 0 {
                        tracing::info!(
                            shard = l.shard,
                            expired = batch.expired,
                            "messages past their ttl were dead-lettered to <stream>{}",
                            l.options.dead_letter_suffix
                        );
                        metrics::counter!(m::EXPIRED).increment(batch.expired);
                    }
                    if batch.dead > 0 {
                        tracing::warn!(
                            shard = l.shard,
                            dead = batch.dead,
                            "messages could not be forwarded and were dead-lettered"
                        );
                        metrics::counter!(m::DEAD).increment(batch.dead);
                    }
                }
                if batch.parked > 0 {
                    tracing::error!(
                        shard = l.shard,
                        parked = batch.parked,
                        "messages whose stream and dead-letter stream both refuse them are kept and tried again in a minute"
                    );
                    metrics::counter!(m::FORWARD_ERRORS, "shard" => shard_label.clone())
                        .increment(batch.parked);
                }
                if let Some(error) = &batch.held_back {
                    // Redis refused a write that is not the message's fault (OOM,
                    // READONLY, ...): what went before is committed, the rest waits.
                    metrics::counter!(m::FORWARD_ERRORS, "shard" => shard_label.clone())
                        .increment(1);
                    let delay = backoff.next_delay();
                    if let Some(said) = FORWARD_HELD_BACK.failed_on(l.shard.into()) {
                        tracing::warn!(shard = l.shard, %error, retry_in = ?delay, "{said}");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
                backoff.reset();
                if let Some(said) = FORWARD_HELD_BACK.recovered_on(l.shard.into()) {
                    tracing::info!("{said}");
                }
                draining = batch.progressed() as usize >= limit;
                if draining {
                    // More is due: go again at once, letting other shards' loops in.
                    tokio::task::yield_now().await;
                    continue;
                }
                let mut wait = batch
                    .until_next_due()
                    .map_or(l.idle_wakeup, |w| w.min(l.idle_wakeup));
                // Messages held back for their stream's limit go when it has permits.
                let holding = batch
                    .holding
                    .iter()
                    .map(|(stream, _)| stream.as_str())
                    .filter(|stream| !paused.contains(*stream));
                if let Some(permit) = l.stream_limits.until_permit(holding, Instant::now()) {
                    wait = wait.min(permit.max(MIN_HELD_WAIT));
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = waker.notified() => {}
                    _ = timer.sleep(wait) => {}
                }
            }
            Err(StoreError::Fenced { held, .. }) => {
                l.term.fenced("forward", held);
                break;
            }
            Err(e) => {
                metrics::counter!(m::FORWARD_ERRORS, "shard" => shard_label.clone()).increment(1);
                let delay = backoff.next_delay();
                if let Some(said) = FORWARD_FAILED.failed_on(l.shard.into()) {
                    tracing::warn!(shard = l.shard, error = %e, retry_in = ?delay, "{said}");
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
