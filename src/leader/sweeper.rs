//! Leader-only: entries that consumer groups of watched streams never acknowledged.
//!
//! A plain consumer group keeps an entry pending forever when its consumer dies. For
//! every stream under `[delivery.streams]` and each of its groups, [`run`] looks
//! every `delivery.sweep_interval` for entries pending longer than `ack_timeout`
//! and hands each to the redeliver script, which in one atomic call schedules the
//! message again (same id and fields, next attempt, after a backoff) or, after
//! `max_attempts`, writes it to the dead-letter stream, and acknowledges the stale
//! entry. Each script call checks the leader's fence, so a deposed leader's sweep is
//! refused; a crash between calls leaves every entry either handled or still pending.
//! An entry whose call fails for reasons of its own (say, its dead-letter stream's
//! key holds another type) is passed over and tried again on each sweep, logged
//! when it starts failing (the first few of a group one by one), then in one line
//! per group every few minutes; Redis unreachable or refusing writes ends the pass.
//!
//! A pass looks at no more than `delivery.sweep_batch` entries per stream and group,
//! one short script call each, so forwarding (separate calls on the same
//! connection) is never held up for long.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::term::Term;
use crate::backoff::Backoff;
use crate::config::{Config, DeliveryConfig, StreamDelivery};
use crate::message::MessageId;
use crate::metrics as m;
use crate::store::{RedeliverOptions, Redelivered, Store, StoreError};

/// Sweeps the watched streams' consumer groups for one leader term (until `cancel`),
/// following the live configuration: when a reload changes `[delivery]`, the sweep
/// starts over with the new settings.
pub async fn run(mut live: watch::Receiver<Arc<Config>>, store: Store, term: Term) {
    let epoch = term.epoch();
    loop {
        let config = live.borrow_and_update().clone();
        let pass = term.child_token();
        let sweep = sweep_term(config.clone(), store.clone(), term.clone(), pass.clone());
        // The pass ends with the term or with a reload that changes `[delivery]`; the
        // sweep may end sooner on its own (nothing watched, or fenced). Either way it
        // finishes the step in flight before anything else starts.
        let reload = async {
            let reloaded = tokio::select! {
                _ = pass.cancelled() => false,
                changed = delivery_changed(&mut live, &config.delivery) => changed,
            };
            pass.cancel();
            reloaded
        };
        let ((), reloaded) = tokio::join!(sweep, reload);
        if !reloaded {
            return;
        }
        tracing::info!(epoch, "delivery settings reloaded; sweeping with them");
    }
}

/// Waits for a reload that changes `[delivery]` from `current`; false once the
/// configuration can no longer change (its sender is gone).
async fn delivery_changed(
    live: &mut watch::Receiver<Arc<Config>>,
    current: &DeliveryConfig,
) -> bool {
    loop {
        if live.changed().await.is_err() {
            return false;
        }
        if live.borrow().delivery != *current {
            return true;
        }
    }
}

/// Failed passes, for the sweeps of every term (one per election group: the place
/// of a failure is the term's, see `Term::place`).
static SWEEP_FAILED: crate::complaint::Complaint =
    crate::complaint::Complaint::new("sweep failed", "sweeping works again");

/// Sweeps with one configuration until `cancel`. Returns at once when no stream is
/// watched.
async fn sweep_term(config: Arc<Config>, store: Store, term: Term, cancel: CancellationToken) {
    let epoch = term.epoch();
    let mut watches: Vec<GroupSweep> = config
        .delivery
        .streams
        .iter()
        .flat_map(|s| s.groups.iter().map(|g| GroupSweep::new(&config, s, g)))
        .collect();
    if watches.is_empty() {
        return;
    }
    let interval = config.delivery.sweep_interval;
    let batch = config.delivery.sweep_batch;
    let seconds = metrics::histogram!(m::SWEEP_SECONDS);
    let mut backoff = Backoff::new(interval, Duration::from_secs(5).max(interval));
    let mut wait = interval;
    tracing::info!(
        epoch,
        groups = watches.len(),
        "sweeping unacknowledged entries"
    );
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        term.unheld().await;
        let started = Instant::now();
        let mut failure = None;
        for w in &mut watches {
            if cancel.is_cancelled() {
                return;
            }
            match w.sweep(&store, epoch, batch, &cancel).await {
                Ok(()) => {}
                Err(StoreError::Fenced { held, .. }) => return term.fenced("sweep", held),
                Err(e) => {
                    failure = Some((w.stream.clone(), w.group.clone(), e));
                    break;
                }
            }
        }
        seconds.record(started.elapsed().as_secs_f64());
        wait = match failure {
            None => {
                backoff.reset();
                if let Some(said) = SWEEP_FAILED.recovered_on(term.place()) {
                    tracing::info!("{said}");
                }
                interval
            }
            Some((stream, group, e)) => {
                metrics::counter!(m::SWEEP_ERRORS).increment(1);
                let delay = backoff.next_delay();
                if let Some(said) = SWEEP_FAILED.failed_on(term.place()) {
                    tracing::warn!(%stream, %group, error = %e, retry_in = ?delay, "{said}");
                }
                delay
            }
        };
    }
}

/// One stream and group being swept, and where the sweep stands.
struct GroupSweep {
    stream: String,
    group: String,
    options: RedeliverOptions,
    /// Last pending entry looked at; the next pass goes on after it, so entries
    /// delayq did not write cannot fill every pass's batch.
    cursor: Option<String>,
    /// The stream or group does not exist (yet): checked again after a backoff,
    /// logged once.
    missing: bool,
    recheck_at: Instant,
    missing_backoff: Backoff,
    /// Entries whose redelivery failed for reasons of their own: passed over, so the
    /// others are still handled, and tried again on later sweeps.
    failing: Failing,
}

impl GroupSweep {
    fn new(config: &Config, s: &StreamDelivery, group: &str) -> Self {
        let interval = config.delivery.sweep_interval;
        GroupSweep {
            stream: s.stream.clone(),
            group: group.to_owned(),
            options: RedeliverOptions {
                ack_timeout: s.ack_timeout,
                max_attempts: s.max_attempts,
                backoff_first: s.backoff.first,
                backoff_max: s.backoff.max,
                backoff_jitter: s.backoff.jitter,
                dead_letter_stream: s.dead_letter_stream.clone(),
                // Validation makes both set whenever a stream is watched.
                id_field: config.forwarder.id_field.clone().unwrap_or_default(),
                attempt_field: config.forwarder.attempt_field.clone().unwrap_or_default(),
                key_field: config
                    .key_field_for(&s.stream)
                    .unwrap_or_default()
                    .to_owned(),
                retention: config.records.retention,
            },
            cursor: None,
            missing: false,
            recheck_at: Instant::now(),
            missing_backoff: Backoff::new(interval, (interval * 10).min(Duration::from_secs(30))),
            failing: Failing::default(),
        }
    }

    /// One batch of this group's stale entries; stops between entries once `cancel`
    /// fires (the term or the pass ended).
    async fn sweep(
        &mut self,
        store: &Store,
        epoch: u64,
        batch: usize,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        if self.missing && Instant::now() < self.recheck_at {
            return Ok(());
        }
        let scan = store
            .stale_entries(
                &self.stream,
                &self.group,
                self.cursor.as_deref(),
                batch,
                &self.options,
            )
            .await?;
        let Some(entries) = scan else {
            self.mark_missing();
            return Ok(());
        };
        if self.missing {
            tracing::info!(stream = %self.stream, group = %self.group, "consumer group found; redelivering what it leaves unacknowledged");
            self.missing = false;
            self.missing_backoff.reset();
            metrics::gauge!(m::SWEEP_GROUP_MISSING, "stream" => self.stream.clone(), "group" => self.group.clone()).set(0.0);
        }
        self.cursor = if entries.len() < batch {
            None
        } else {
            entries.last().map(|e| e.entry_id.clone())
        };
        let ours: Vec<_> = entries
            .into_iter()
            .filter_map(|e| e.message_id.clone().map(|id| (e, id)))
            .collect();
        metrics::gauge!(m::PENDING_TOO_LONG, "stream" => self.stream.clone(), "group" => self.group.clone())
            .set(ours.len() as f64);
        // With `election.mode = "per_shard"`, each group's leader redelivers the
        // entries of its own shards' messages.
        for (entry, id) in ours
            .into_iter()
            .filter(|(_, id)| store.owns_message(id, &self.stream))
        {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let random = rand::rng().random::<f64>();
            let outcome = match store
                .redeliver(
                    epoch,
                    &self.stream,
                    &self.group,
                    &entry.entry_id,
                    &id,
                    &self.options,
                    random,
                )
                .await
            {
                Ok(outcome) => outcome,
                // Redis not taking calls, or a newer leader: the whole sweep stops.
                Err(e @ StoreError::Fenced { .. }) => return Err(e),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    self.failing
                        .failed(&self.stream, &self.group, &entry.entry_id, &id, &e);
                    metrics::counter!(m::SWEEP_ENTRIES, "stream" => self.stream.clone(), "group" => self.group.clone(), "outcome" => "failed")
                        .increment(1);
                    continue;
                }
            };
            self.failing
                .handled(&self.stream, &self.group, &entry.entry_id);
            let label = match &outcome {
                Redelivered::Rescheduled { attempt, due_ms } => {
                    metrics::counter!(m::REDELIVERED, "stream" => self.stream.clone()).increment(1);
                    tracing::debug!(stream = %self.stream, group = %self.group, %id, entry = %entry.entry_id, consumer = %entry.consumer, idle_ms = entry.idle_ms, attempt, due_ms, "unacknowledged: scheduled again");
                    "rescheduled"
                }
                Redelivered::DeadLettered { attempts, entry_id } => {
                    metrics::counter!(m::DEAD_LETTERED, "stream" => self.stream.clone(), "reason" => "max_attempts").increment(1);
                    m::record_dead(&self.stream, 1);
                    tracing::info!(stream = %self.stream, group = %self.group, %id, attempts, dead_letter_stream = %self.options.dead_letter_stream, dead_entry = %entry_id, "unacknowledged after the last attempt: dead-lettered");
                    "dead"
                }
                Redelivered::Gone => {
                    tracing::warn!(stream = %self.stream, group = %self.group, %id, entry = %entry.entry_id, "pending entry was deleted from the stream (MAXLEN?) before anyone acknowledged it; acknowledged, cannot redeliver");
                    "gone"
                }
                Redelivered::NoGroup => {
                    self.mark_missing();
                    return Ok(());
                }
                Redelivered::Fresh => "fresh",
                Redelivered::Superseded => "superseded",
                Redelivered::Foreign => "foreign",
            };
            metrics::counter!(m::SWEEP_ENTRIES, "stream" => self.stream.clone(), "group" => self.group.clone(), "outcome" => label)
                .increment(1);
        }
        Ok(())
    }

    fn mark_missing(&mut self) {
        if !self.missing {
            tracing::warn!(stream = %self.stream, group = %self.group, "consumer group does not exist (yet); redelivery for it waits until it does");
            metrics::gauge!(m::SWEEP_GROUP_MISSING, "stream" => self.stream.clone(), "group" => self.group.clone()).set(1.0);
            self.missing = true;
        }
        self.cursor = None;
        self.recheck_at = Instant::now() + self.missing_backoff.next_delay();
    }
}

/// How often a group's entries that keep failing are logged again, as one line.
const FAILING_LOG_EVERY: Duration = Duration::from_secs(300);
/// Entries that start failing logged one by one per [`FAILING_LOG_EVERY`] and group;
/// more are counted in the next summary line.
const FAILING_LOG_ENTRIES: u32 = 5;
/// An entry not seen failing for this long is forgotten (acknowledged, or trimmed).
const FAILING_FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Entries of one group whose redeliver call fails on its own (say, `DEADLETTER
/// cannot write` because the dead-letter key holds another type). The first few to
/// start failing are logged one by one; then one line every [`FAILING_LOG_EVERY`]
/// says how many still fail, and each is logged once more when handled at last.
struct Failing {
    entries: HashMap<String, FailingEntry>,
    window_start: Instant,
    logged_in_window: u32,
}

struct FailingEntry {
    last_seen: Instant,
    attempts: u64,
}

impl Default for Failing {
    fn default() -> Self {
        Failing {
            entries: HashMap::new(),
            window_start: Instant::now(),
            logged_in_window: 0,
        }
    }
}

impl Failing {
    fn failed(&mut self, stream: &str, group: &str, entry: &str, id: &MessageId, e: &StoreError) {
        let now = Instant::now();
        self.entries
            .retain(|_, f| now.duration_since(f.last_seen) < FAILING_FORGET_AFTER);
        if now.duration_since(self.window_start) >= FAILING_LOG_EVERY {
            self.window_start = now;
            self.logged_in_window = 0;
            if !self.entries.is_empty() {
                tracing::error!(%stream, %group, entries = self.entries.len(), example = %entry, error = %e, "entries still cannot be redelivered or dead-lettered; tried again on each sweep until the cause is fixed");
            }
        }
        match self.entries.get_mut(entry) {
            None => {
                self.entries.insert(
                    entry.to_owned(),
                    FailingEntry {
                        last_seen: now,
                        attempts: 1,
                    },
                );
                if self.logged_in_window < FAILING_LOG_ENTRIES {
                    self.logged_in_window += 1;
                    tracing::error!(%stream, %group, %entry, %id, error = %e, "cannot redeliver or dead-letter this entry; the sweep goes on with the others and tries it again on each sweep until the cause is fixed");
                } else {
                    tracing::debug!(%stream, %group, %entry, %id, error = %e, "cannot redeliver or dead-letter this entry");
                }
            }
            Some(f) => {
                f.attempts += 1;
                f.last_seen = now;
                tracing::debug!(%stream, %group, %entry, error = %e, attempts = f.attempts, "redelivery failed again");
            }
        }
    }

    fn handled(&mut self, stream: &str, group: &str, entry: &str) {
        if let Some(f) = self.entries.remove(entry) {
            tracing::info!(%stream, %group, %entry, attempts = f.attempts, "entry handled after its redelivery failed before");
        }
    }
}
