//! Lateness of what this process forwarded, kept in memory for `/v1/stats`.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::stream_label;

/// How long the recent lateness window lasts (reported: the last one to two windows).
const LATENESS_WINDOW: Duration = Duration::from_secs(60);

/// Lateness of the messages this process forwarded, kept for `/v1/stats` (Prometheus
/// histograms cannot be read back): since start, and recently.
struct Lateness {
    since_start: Histogram<u64>,
    current: Histogram<u64>,
    previous: Histogram<u64>,
    current_since: Instant,
    /// Since the last [`take_sample`]: lateness, and messages forwarded per stream,
    /// the worst lateness per stream, and its messages dead-lettered.
    window: Histogram<u64>,
    window_streams: BTreeMap<String, u64>,
    window_worst: BTreeMap<String, u64>,
    window_dead: BTreeMap<String, u64>,
}

fn lateness() -> &'static Mutex<Lateness> {
    static LATENESS: OnceLock<Mutex<Lateness>> = OnceLock::new();
    LATENESS.get_or_init(|| {
        let new =
            || Histogram::new_with_bounds(1, 24 * 3_600_000, 2).expect("valid histogram bounds");
        Mutex::new(Lateness {
            since_start: new(),
            current: new(),
            previous: new(),
            current_since: Instant::now(),
            window: new(),
            window_streams: BTreeMap::new(),
            window_worst: BTreeMap::new(),
            window_dead: BTreeMap::new(),
        })
    })
}

impl Lateness {
    fn rotate(&mut self) {
        let elapsed = self.current_since.elapsed();
        if elapsed >= LATENESS_WINDOW {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.reset();
            if elapsed >= 2 * LATENESS_WINDOW {
                self.previous.reset();
            }
            self.current_since = Instant::now();
        }
    }

    /// Records the lateness (ms) of forwards no held set kept.
    fn record_lateness(&mut self, lateness_ms: &[u64]) {
        if lateness_ms.is_empty() {
            return;
        }
        self.rotate();
        for &ms in lateness_ms {
            // Zero-lateness forwards count as 1 ms: the histogram's floor.
            let ms = ms.max(1);
            self.since_start.saturating_record(ms);
            self.current.saturating_record(ms);
            self.window.saturating_record(ms);
        }
    }
}

/// Records one forward call's figures, under one lock: the lateness (forward time
/// − due time, ms) of the messages no held set kept, and for the next
/// [`take_sample`] the messages forwarded to each stream, each stream's worst
/// lateness and its messages dead-lettered (past their ttl). Streams are named as
/// the metrics name them (the first `metrics.max_streams`, the rest together as
/// [`super::OTHER_STREAMS`]), so that samples and rollups stay bounded too.
pub fn record_batch(batch: &delayq_client::store::ForwardBatch) {
    let per_stream: Vec<(String, u64)> = batch
        .per_stream
        .iter()
        .map(|(stream, n)| (stream_label(stream), *n))
        .collect();
    let times: Vec<(String, Option<u64>, u64)> = batch
        .per_stream_times
        .iter()
        .map(|t| (stream_label(&t.stream), t.worst_lateness_ms, t.expired))
        .collect();
    let mut l = lateness().lock().expect("lateness lock");
    l.record_lateness(&batch.lateness_ms);
    for (stream, n) in per_stream {
        *l.window_streams.entry(stream).or_default() += n;
    }
    for (stream, worst_ms, expired) in times {
        if let Some(ms) = worst_ms {
            let worst = l.window_worst.entry(stream.clone()).or_default();
            *worst = (*worst).max(ms);
        }
        if expired > 0 {
            *l.window_dead.entry(stream).or_default() += expired;
        }
    }
}

/// Percentiles of some forwards' lateness, in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatenessSummary {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

fn summarize(h: &Histogram<u64>) -> Option<LatenessSummary> {
    (!h.is_empty()).then(|| LatenessSummary {
        count: h.len(),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        max: h.max(),
    })
}

/// Lateness of what this process forwarded: (the last one to two minutes, since start).
pub fn lateness_summary() -> (Option<LatenessSummary>, Option<LatenessSummary>) {
    let mut l = lateness().lock().expect("lateness lock");
    l.rotate();
    let mut recent = l.previous.clone();
    recent.add(&l.current).expect("same bounds");
    (summarize(&recent), summarize(&l.since_start))
}

/// Counts a stream's messages dead-lettered after their last attempt, for the next
/// [`take_sample`].
pub fn record_dead(stream: &str, n: u64) {
    let stream = stream_label(stream);
    let mut l = lateness().lock().expect("lateness lock");
    *l.window_dead.entry(stream).or_default() += n;
}

/// What this process forwarded since the last sample was taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub forwarded: u64,
    pub per_stream: BTreeMap<String, u64>,
    /// Worst lateness (ms) per stream of its forwards no held set kept.
    pub worst_per_stream: BTreeMap<String, u64>,
    /// Messages dead-lettered per stream (past their ttl, or out of attempts).
    pub dead_per_stream: BTreeMap<String, u64>,
    /// Lateness percentiles (ms) of the forwards timed, if any.
    pub p50: Option<u64>,
    pub p99: Option<u64>,
}

/// Takes the sample of what was forwarded since the last one and starts the next.
pub fn take_sample() -> Sample {
    let mut l = lateness().lock().expect("lateness lock");
    let per_stream = std::mem::take(&mut l.window_streams);
    let worst_per_stream = std::mem::take(&mut l.window_worst);
    let dead_per_stream = std::mem::take(&mut l.window_dead);
    let summary = summarize(&l.window);
    l.window.reset();
    Sample {
        forwarded: per_stream.values().sum(),
        per_stream,
        worst_per_stream,
        dead_per_stream,
        p50: summary.map(|s| s.p50),
        p99: summary.map(|s| s.p99),
    }
}
