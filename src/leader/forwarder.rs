//! Leader-only work: forwarding due messages into their streams, forgetting old
//! records, and reporting what is pending.
//!
//! [`start`] is called by each [`Term`] once its fences are raised: one forward
//! loop per shard plus the housekeeping loops, all ending with the term. A loop
//! finishes at most the script call in flight; a `FENCED` reply goes to
//! [`Term::fenced`].

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
static WAKEUPS_LOST: Complaint = Complaint::new(
    "cannot subscribe to wake-ups; forwarding on timers until it works",
    "subscribed to wake-ups again",
);
static TRIM_FAILED: Complaint = Complaint::across(
    "shard",
    "trimming records failed; next round will retry",
    "trimming records works again",
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
                    m::record_lateness(&batch.lateness_ms);
                    m::record_forwarded(&batch.per_stream);
                    for (stream, count) in &batch.per_stream {
                        metrics::counter!(m::FORWARDED, "stream" => stream.clone())
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

/// How often a term reads the paused streams: a pause or resume takes effect
/// within this.
pub const PAUSED_EVERY: Duration = Duration::from_millis(250);

/// Follows the paused streams (an operator's `POST /v1/streams/{stream}/pause`)
/// until the term ends, waking every loop when they change: a resumed stream's
/// held messages go at once. A read that fails keeps the last set; until the first
/// read succeeds the loops forward nothing. While the term is held (Redis lost its
/// data, and a restore puts the paused streams back) the set is unknown again:
/// the loops wait for a read made after the hold.
async fn follow_paused(
    store: Store,
    term: Term,
    paused: watch::Sender<Option<Arc<BTreeSet<String>>>>,
    wakers: Arc<Vec<Notify>>,
    cancel: CancellationToken,
) {
    loop {
        if term.is_held() {
            paused.send_replace(None);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = term.unheld() => {}
            }
            continue;
        }
        let read = store.paused().await;
        if term.is_held() {
            continue; // read across a hold: perhaps from before the restore
        }
        match read {
            Ok(now) if paused.borrow().as_deref() != Some(&now) => {
                if paused.borrow().is_some() || !now.is_empty() {
                    tracing::info!(paused = ?now, "paused streams");
                }
                paused.send_replace(Some(Arc::new(now)));
                wakers.iter().for_each(Notify::notify_one);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read the paused streams"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = term.held() => {}
            _ = tokio::time::sleep(PAUSED_EVERY) => {}
        }
    }
}

/// A paused stream's budget is 0 for the call: its due messages move to its held
/// set, in due order, and wait there (the permits a limited stream had taken go
/// back to its bucket).
fn pause_budgets(
    budgets: &mut Vec<(String, usize)>,
    paused: &BTreeSet<String>,
    limits: &StreamLimits,
) {
    for stream in paused {
        match budgets.iter_mut().find(|(s, _)| s == stream) {
            Some((_, budget)) => {
                limits.give_back(&[(stream.clone(), *budget)], &[]);
                *budget = 0;
            }
            None => budgets.push((stream.clone(), 0)),
        }
    }
}

/// Turns the schedule script's announcements into per-shard wake-ups. After every
/// (re)subscription all shards are woken, since announcements may have been missed.
async fn dispatch_wakeups(store: Store, wakers: Arc<Vec<Notify>>, cancel: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    while !cancel.is_cancelled() {
        match store.wakeups().await {
            Ok(mut wakeups) => {
                backoff.reset();
                if let Some(said) = WAKEUPS_LOST.recovered() {
                    tracing::info!("{said}");
                }
                wakers.iter().for_each(Notify::notify_one);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        shard = wakeups.next() => match shard {
                            Some(shard) => {
                                if let Some(w) = wakers.get(shard as usize) { w.notify_one() }
                                if store.is_cluster() {
                                    discover_waker(&wakers).notify_one();
                                }
                            }
                            None => break,
                        }
                    }
                }
                if let Some(said) = WAKEUPS_LOST.failed() {
                    tracing::warn!(error = %"the subscription was lost", "{said}");
                }
            }
            Err(e) => {
                if let Some(said) = WAKEUPS_LOST.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// Forgets delivery, expiry and cancellation records past their retention.
async fn trim_records(store: Store, term: Term, every: Duration) {
    const LIMIT: usize = 1000;
    loop {
        tokio::select! {
            _ = term.ended() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let shards = match store.owned_in_use().await {
            Ok(shards) => shards,
            Err(e) => {
                if let Some(said) = TRIM_FAILED.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
                continue;
            }
        };
        let mut failed = false;
        for shard in shards {
            loop {
                if term.is_over() {
                    return;
                }
                match store.trim_records(shard, term.epoch(), LIMIT).await {
                    Ok(trimmed) => {
                        metrics::counter!(m::RECORDS_TRIMMED).increment(trimmed.forgotten);
                        if (trimmed.looked_at as usize) < LIMIT {
                            break;
                        }
                    }
                    Err(StoreError::Fenced { held, .. }) => return term.fenced("trimming", held),
                    Err(e) => {
                        failed = true;
                        if let Some(said) = TRIM_FAILED.failed_on(shard.into()) {
                            tracing::warn!(shard, error = %e, "{said}");
                        }
                        break;
                    }
                }
            }
        }
        if !failed && let Some(said) = TRIM_FAILED.recovered() {
            tracing::info!("{said}");
        }
    }
}

/// How often the pending reports come: every [`REPORT_EVERY`], or [`REPORT_SHARE`]
/// times as long as the last count of overdue messages took, whichever is longer.
/// That count walks the due buckets (in short calls, see `Store::pending_report`),
/// which over a backlog of millions takes a good part of a second of Redis's time.
const REPORT_EVERY: Duration = Duration::from_secs(5);
const REPORT_SHARE: u32 = 20;

/// Publishes how many messages each shard holds, and how overdue the earliest one
/// is (the sign of stuck delivery). The term's end sets the latter back to 0: a
/// standby forwards nothing, so nothing is overdue on its account.
async fn report_pending(
    store: Store,
    limiter: Arc<Limiter>,
    stream_limits: Arc<StreamLimits>,
    cancel: CancellationToken,
) {
    let overdue = metrics::gauge!(m::OLDEST_OVERDUE);
    let overdue_count = metrics::gauge!(m::OVERDUE);
    let drain = metrics::gauge!(m::THROTTLE_DRAIN);
    // Streams with a `delayq_held_messages` series, to set back to 0 when they
    // hold nothing any more (a limit lifted, a backlog drained, the term over).
    let mut held_shown = BTreeSet::new();
    loop {
        // The time a count took that succeeded: a round of failures (Redis away,
        // each call waiting out its timeout) must not put the next round off.
        let mut counting = Duration::ZERO;
        // One walk and one read of the held sets for every count, bounded by
        // Redis's clock read just before: a message that falls due during the walk
        // counts as not yet due, and its lateness as 0.
        let report = async {
            let now = store.now_ms().await?;
            let started = Instant::now();
            let report = store.pending_report(now).await?;
            Ok::<_, StoreError>((now, report, started.elapsed()))
        };
        match report.await {
            Ok((now, report, took)) => {
                counting = took;
                for (shard, n) in report.per_shard {
                    metrics::gauge!(m::PENDING, "shard" => shard.to_string()).set(n as f64);
                }
                let late_ms = report
                    .earliest_due_ms
                    .map_or(0, |due| now.saturating_sub(due));
                overdue.set(late_ms as f64 / 1000.0);
                overdue_count.set(report.due as f64);
                let rate = limiter.rate();
                let global = if rate == 0.0 {
                    0.0
                } else {
                    report.due as f64 / rate
                };
                let held = report_held(&report.held, &stream_limits, &mut held_shown);
                drain.set(global.max(held));
            }
            Err(e) => tracing::debug!(error = %e, "cannot count pending messages"),
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                overdue.set(0.0);
                overdue_count.set(0.0);
                drain.set(0.0);
                report_held(&HeldBack::default(), &StreamLimits::default(), &mut held_shown);
                return;
            }
            _ = tokio::time::sleep(REPORT_EVERY.max(counting * REPORT_SHARE)) => {}
        }
    }
}

/// Publishes what each rate-limited stream holds back (`delayq_held_messages`) and
/// returns the longest time a stream's limit takes to drain its held messages.
/// `shown` names the streams with a series; one that holds nothing now and has no
/// limit any more is set to 0 and forgotten.
fn report_held(held: &HeldBack, limits: &StreamLimits, shown: &mut BTreeSet<String>) -> f64 {
    let rates = limits.rates();
    let mut longest: f64 = 0.0;
    let mut now_shown = BTreeSet::new();
    for (stream, rate) in &rates {
        let n = held.per_stream.get(stream).copied().unwrap_or(0);
        metrics::gauge!(m::HELD, "stream" => stream.clone()).set(n as f64);
        longest = longest.max(n as f64 / *rate);
        now_shown.insert(stream.clone());
    }
    // A stream whose limit was lifted drains at once: it holds nothing for long.
    for (stream, n) in &held.per_stream {
        if now_shown.insert(stream.clone()) {
            metrics::gauge!(m::HELD, "stream" => stream.clone()).set(*n as f64);
        }
    }
    for gone in shown.difference(&now_shown) {
        metrics::gauge!(m::HELD, "stream" => gone.clone()).set(0.0);
    }
    *shown = now_shown;
    longest
}

/// Streams with a series of their own in `delayq_pending_stream_messages` (the
/// largest), and the most that ever get one in a process's life.
const PENDING_STREAMS_SHOWN: usize = 100;
const PENDING_STREAMS_EVER: usize = 200;
/// Most scheduled messages looked at per count: about 100 short script calls (see
/// `Store::pending_per_stream`). Past it, what was not looked at counts in the rest.
const PENDING_STREAMS_LIMIT: usize = 100_000;
/// How often the leader counts per stream: [`PENDING_STREAMS_PER_MESSAGE`] for each
/// message scheduled (a count costs Redis about 1.5 µs a message, so this keeps it
/// under 1% of Redis's time), within these bounds.
const PENDING_STREAMS_EVERY: (Duration, Duration) =
    (Duration::from_secs(2), Duration::from_secs(30));
const PENDING_STREAMS_PER_MESSAGE: Duration = Duration::from_micros(300);
/// A term counts per stream at once only when no more than this is scheduled.
const PENDING_STREAMS_AT_ONCE: u64 = 10_000;

/// Publishes scheduled messages per target stream, for the largest streams, at the
/// start of a term and then every 2 to 30 s (by the backlog: see
/// [`PENDING_STREAMS_EVERY`]); sets them to 0 when the term ends. Each count is also
/// kept in Redis (`Store::save_stream_counts`) for the dashboard's stream table,
/// so that no page makes Redis count again.
async fn report_pending_streams(store: Store, cancel: CancellationToken) {
    static SHOWN: std::sync::Mutex<Option<m::PendingStreams>> = std::sync::Mutex::new(None);
    let publish = |values: Vec<(String, u64)>| {
        for (stream, n) in values {
            metrics::gauge!(m::PENDING_STREAM, "stream" => stream).set(n as f64);
        }
    };
    // Counting walks the scheduled bodies (up to PENDING_STREAMS_LIMIT). At a term's
    // start a new leader may have a backlog to drain: then the first count waits a
    // full interval, like every later one.
    let (fastest, slowest) = PENDING_STREAMS_EVERY;
    let mut wait = match store.pending_per_shard().await {
        Ok(per_shard) => per_shard.iter().map(|(_, n)| n).sum::<u64>() > PENDING_STREAMS_AT_ONCE,
        Err(_) => true,
    };
    let mut interval = slowest;
    loop {
        if wait {
            tokio::select! {
            _ = cancel.cancelled() => {
                let shown = SHOWN.lock().expect("pending streams lock");
                if let Some(shown) = shown.as_ref() {
                    publish(shown.zeroes());
                }
                return;
            }
            _ = tokio::time::sleep(interval) => {}
            }
        }
        wait = true;
        let counted = async {
            let now = store.now_ms().await?;
            let (per_stream, per_shard) = tokio::try_join!(
                store.pending_per_stream(PENDING_STREAMS_LIMIT, now + 3_600_000),
                store.pending_per_shard()
            )?;
            Ok::<_, StoreError>((now, per_stream, per_shard))
        };
        match counted.await {
            Ok((now, per_stream, per_shard)) => {
                let total: u64 = per_shard.iter().map(|(_, n)| n).sum();
                interval = (PENDING_STREAMS_PER_MESSAGE * total.min(u32::MAX as u64) as u32)
                    .clamp(fastest, slowest);
                let record = crate::store::StreamCountRecord {
                    at_ms: now,
                    exact: per_stream.exact,
                    streams: per_stream
                        .per_stream
                        .iter()
                        .map(|(s, n)| {
                            (
                                s.clone(),
                                (*n, per_stream.due_soon.get(s).copied().unwrap_or(0)),
                            )
                        })
                        .collect(),
                };
                if let Err(e) = store.save_stream_counts(&record).await {
                    tracing::debug!(error = %e, "cannot keep the per-stream count");
                }
                let mut shown = SHOWN.lock().expect("pending streams lock");
                let shown = shown.get_or_insert_with(|| {
                    m::PendingStreams::new(PENDING_STREAMS_SHOWN, PENDING_STREAMS_EVER)
                });
                publish(shown.values(&per_stream.per_stream, total));
            }
            Err(e) => tracing::debug!(error = %e, "cannot count pending messages per stream"),
        }
    }
}
