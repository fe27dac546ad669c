//! What the leader reports of the pending messages: per shard and per stream, the
//! held ones, at a pace that follows how many there are.

use super::*;

/// How often the pending reports come: every [`REPORT_EVERY`], or [`REPORT_SHARE`]
/// times as long as the last count of overdue messages took, whichever is longer.
/// That count walks the due buckets (in short calls, see `Store::pending_report`),
/// which over a backlog of millions takes a good part of a second of Redis's time.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(5);

pub(super) const REPORT_SHARE: u32 = 20;

/// Publishes how many messages each shard holds, and how overdue the earliest one
/// is (the sign of stuck delivery). The term's end sets the latter back to 0: a
/// standby forwards nothing, so nothing is overdue on its account.
pub(super) async fn report_pending(
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
pub(super) fn report_held(
    held: &HeldBack,
    limits: &StreamLimits,
    shown: &mut BTreeSet<String>,
) -> f64 {
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
pub(super) const PENDING_STREAMS_SHOWN: usize = 100;

pub(super) const PENDING_STREAMS_EVER: usize = 200;

/// Most scheduled messages looked at per count: about 100 short script calls (see
/// `Store::pending_per_stream`). Past it, what was not looked at counts in the rest.
pub(super) const PENDING_STREAMS_LIMIT: usize = 100_000;

/// How often the leader counts per stream: [`PENDING_STREAMS_PER_MESSAGE`] for each
/// message scheduled (a count costs Redis about 1.5 µs a message, so this keeps it
/// under 1% of Redis's time), within these bounds.
pub(super) const PENDING_STREAMS_EVERY: (Duration, Duration) =
    (Duration::from_secs(2), Duration::from_secs(30));

pub(super) const PENDING_STREAMS_PER_MESSAGE: Duration = Duration::from_micros(300);

/// A term counts per stream at once only when no more than this is scheduled.
pub(super) const PENDING_STREAMS_AT_ONCE: u64 = 10_000;

/// Publishes scheduled messages per target stream, for the largest streams, at the
/// start of a term and then every 2 to 30 s (by the backlog: see
/// [`PENDING_STREAMS_EVERY`]); sets them to 0 when the term ends. Each count is also
/// kept in Redis (`Store::save_stream_counts`) for the dashboard's stream table,
/// so that no page makes Redis count again.
pub(super) async fn report_pending_streams(store: Store, cancel: CancellationToken) {
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
            let per_shard = store.pending_per_shard().await?;
            // A shard with nothing scheduled has no stream to count: an idle
            // leader's count then costs Redis no call a shard.
            let busy: Vec<u16> = per_shard
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(s, _)| *s)
                .collect();
            let per_stream = store
                .pending_per_stream_in(&busy, PENDING_STREAMS_LIMIT, now + 3_600_000)
                .await?;
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
