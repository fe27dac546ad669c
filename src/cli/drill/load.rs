//! The drill's traffic and its bookkeeping: a producer pushing delayed messages at
//! a steady rate through any node that answers, a consumer reading the target
//! stream on a connection of its own, and a ledger that says, per phase, what was
//! sent, delivered, lost, duplicated and how late.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::streams::{StreamReadOptions, StreamReadReply};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::target::Node;
use delayq_client::message::EntryId;

/// What the drill knows about its messages. Phase 0 is the steady run before the
/// first scenario; phase `k` is the `k`-th scenario. A message belongs to the
/// phase during which it fell due or, if it was still undelivered when a later
/// phase began, to that phase: a message due a moment before a fault and not yet
/// forwarded when the fault struck is late because of the fault, so the scenario
/// is charged with all the lateness its faults caused. Both times are Redis's.
///
/// Deliveries are stream entries, each counted once however often it is read.
/// What is read as it happens is provisional: a Redis failover can discard
/// entries a reader saw on the old master, and the stream read again at the end
/// ([`Ledger::recount`]) is what the drill counts.
#[derive(Default)]
pub struct Ledger {
    /// Accepted by a node: id → due time in Redis ms.
    sent: HashMap<String, u64>,
    /// Every attempt failed (timeouts, refusals); the message may or may not exist.
    unconfirmed: HashMap<String, Instant>,
    /// id → the stream entries carrying it, one per delivery.
    delivered: HashMap<String, BTreeSet<EntryId>>,
}

/// One phase's numbers (a row's `messages` in the report).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCount {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    /// Extra deliveries beyond the first.
    pub duplicated: u64,
    pub max_lateness_ms: u64,
    /// Pushes no node confirmed; counted as sent only if they were delivered.
    #[serde(rename = "unconfirmed_pushes")]
    pub unconfirmed: u64,
}

impl Ledger {
    pub fn sent(&mut self, id: String, due_ms: u64) {
        self.unconfirmed.remove(&id);
        self.sent.insert(id, due_ms);
    }

    pub fn unconfirmed(&mut self, id: String, sent_at: Instant) {
        if !self.sent.contains_key(&id) {
            self.unconfirmed.insert(id, sent_at);
        }
    }

    /// Entry `entry` of the stream carries message `id` (read again: no change).
    pub fn delivered(&mut self, id: String, entry: EntryId) {
        self.delivered.entry(id).or_default().insert(entry);
    }

    /// Replaces what was read as it happened with the stream as it stands, read
    /// whole: (message id, entry) for each entry, up to entry `read_to` (None:
    /// the stream is complete, nothing more will come). Entries read live after
    /// `read_to` are kept: they came after the stream was read. Returns how many
    /// entries read before are no longer in the stream (written on a Redis
    /// master that a failover then discarded: a consumer may have read those
    /// messages twice).
    pub fn recount(
        &mut self,
        entries: impl IntoIterator<Item = (String, EntryId)>,
        read_to: Option<EntryId>,
    ) -> usize {
        let before = std::mem::take(&mut self.delivered);
        for (id, entry) in entries {
            self.delivered(id, entry);
        }
        let mut gone = 0;
        for (id, seen) in before {
            for entry in seen {
                if read_to.is_some_and(|last| entry > last) {
                    self.delivered(id.clone(), entry);
                } else if !self.delivered.get(&id).is_some_and(|n| n.contains(&entry)) {
                    gone += 1;
                }
            }
        }
        gone
    }

    pub fn sent_count(&self) -> usize {
        self.sent.len()
    }

    pub fn delivered_count(&self) -> usize {
        self.delivered.len()
    }

    /// Sent messages not delivered yet.
    pub fn outstanding(&self) -> usize {
        self.sent
            .keys()
            .filter(|id| !self.delivered.contains_key(*id))
            .count()
    }

    /// Counts per phase; phase `k` began at `starts[k]`. Deliveries of ids never
    /// pushed by this drill are ignored (the stream is the drill's own).
    pub fn count(&self, starts: &[PhaseStart], delay: Duration) -> Vec<PhaseCount> {
        let mut out = vec![PhaseCount::default(); starts.len()];
        // By Redis time: the later of the due time and the first delivery (or the due
        // time alone for a message never delivered).
        let phase_at = |ms: u64| starts.iter().filter(|s| s.redis_ms <= ms).count().max(1) - 1;
        // Unconfirmed pushes have no due time: when they were sent, plus the delay.
        let phase_sent = |sent_at: Instant| {
            let due = sent_at + delay;
            starts.iter().filter(|s| s.at <= due).count().max(1) - 1
        };
        for (id, &due) in &self.sent {
            let delivered = self.delivered.get(id);
            let first = |times: &BTreeSet<EntryId>| times.first().map_or(0, |e| e.ms);
            let c = &mut out[phase_at(delivered.map_or(due, |times| first(times).max(due)))];
            c.sent += 1;
            match delivered {
                Some(times) => {
                    c.delivered += 1;
                    c.duplicated += times.len() as u64 - 1;
                    let late = first(times).saturating_sub(due);
                    c.max_lateness_ms = c.max_lateness_ms.max(late);
                }
                None => c.lost += 1,
            }
        }
        for (id, &sent_at) in &self.unconfirmed {
            let c = &mut out[phase_sent(sent_at)];
            c.unconfirmed += 1;
            // It did get in: it counts, but without a due time, no lateness.
            if let Some(times) = self.delivered.get(id) {
                c.sent += 1;
                c.delivered += 1;
                c.duplicated += times.len() as u64 - 1;
            }
        }
        out
    }
}

/// When a phase began, by this process's clock and by Redis's.
#[derive(Clone, Copy, Debug)]
pub struct PhaseStart {
    pub at: Instant,
    pub redis_ms: u64,
}

/// Shared between the drill and its traffic tasks.
pub struct Traffic {
    pub ledger: Mutex<Ledger>,
    /// When each phase began.
    pub phase_starts: Mutex<Vec<PhaseStart>>,
    /// Which nodes to send to now (a node down or paused is skipped).
    pub up: Vec<AtomicBool>,
}

impl Traffic {
    /// Phase 0 begins now, at `redis_ms` by Redis's clock.
    pub fn new(nodes: usize, redis_ms: u64) -> Arc<Traffic> {
        Arc::new(Traffic {
            ledger: Mutex::new(Ledger::default()),
            phase_starts: Mutex::new(vec![PhaseStart {
                at: Instant::now(),
                redis_ms,
            }]),
            up: (0..nodes).map(|_| AtomicBool::new(true)).collect(),
        })
    }

    pub fn set_up(&self, node: usize, up: bool) {
        self.up[node].store(up, Ordering::Relaxed);
    }

    pub fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the next phase now, at `redis_ms` by Redis's clock.
    pub fn next_phase(&self, redis_ms: u64) {
        self.phase_starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(PhaseStart {
                at: Instant::now(),
                redis_ms,
            });
    }

    pub fn count(&self, delay: Duration) -> Vec<PhaseCount> {
        let starts = self
            .phase_starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.ledger().count(&starts, delay)
    }
}

/// Where and what the producer sends.
pub struct Load {
    pub nodes: Vec<Node>,
    pub stream: String,
    pub rate: u32,
    pub delay: Duration,
    pub run_id: String,
    /// Bearer token for the nodes' API.
    pub token: Option<String>,
    /// More CAs for nodes served over https (`--ca-file`).
    pub ca_file: Option<std::path::PathBuf>,
}

/// An HTTP client for the nodes: a timeout per request, the bearer token on every
/// request when there is one, and for nodes served over https the system's roots
/// and those of `ca_file`.
pub fn http_client(
    timeout: Duration,
    token: Option<&str>,
    nodes: &[Node],
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = token {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let https = nodes.iter().any(|n| n.url.starts_with("https://"));
    Ok(crate::cli::https::builder(https, ca_file)?
        .timeout(timeout)
        .default_headers(headers)
        .build()?)
}

/// Pushes `rate` messages per second until `cancel`, each due `delay` after it
/// is sent. Each push goes to the next node that is up and is retried on the
/// following ones with the same id (a retry of a push that did get in is
/// answered as a duplicate), for up to 5 s.
pub async fn produce(load: Load, traffic: Arc<Traffic>, cancel: CancellationToken) {
    let http = http_client(
        Duration::from_millis(800),
        load.token.as_deref(),
        &load.nodes,
        load.ca_file.as_deref(),
    )
    .expect("build the HTTP client (checked by the drill before)");
    let load = Arc::new(load);
    // Bounds pushes in flight when nodes hang (SIGSTOP): the rate is kept by
    // the ticker, not by waiting for answers.
    let in_flight = Arc::new(Semaphore::new(256));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / load.rate.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        n += 1;
        let id = format!("{}-{n}", load.run_id);
        let sent_at = Instant::now();
        let (http, load, traffic) = (http.clone(), load.clone(), traffic.clone());
        tasks.spawn(async move {
            let _permit = permit;
            match push_one(&http, &load, &traffic, &id, n as usize).await {
                Some(due) => traffic.ledger().sent(id, due),
                None => traffic.ledger().unconfirmed(id, sent_at),
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    tasks.join_all().await;
}

/// The part of a push's answer the drill reads.
#[derive(Deserialize)]
struct Pushed {
    /// When the message falls due, by Redis's clock.
    deliver_at: u64,
}

async fn push_one(
    http: &reqwest::Client,
    load: &Load,
    traffic: &Traffic,
    id: &str,
    start: usize,
) -> Option<u64> {
    let body = serde_json::json!({
        "id": id,
        "stream": load.stream,
        "payload": id,
        "delay_ms": load.delay.as_millis() as u64,
    });
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    let nodes = load.nodes.len();
    let mut attempt = 0;
    while tokio::time::Instant::now() < give_up {
        let i = (start + attempt) % nodes;
        attempt += 1;
        if !traffic.up[i].load(Ordering::Relaxed) && attempt < nodes * 4 {
            continue;
        }
        let sent = http
            .post(format!("{}/v1/messages", load.nodes[i].url))
            .json(&body)
            .send()
            .await;
        if let Ok(resp) = sent
            && (resp.status().as_u16() == 201 || resp.status().as_u16() == 200)
            && let Ok(answer) = resp.json::<Pushed>().await
        {
            return Some(answer.deliver_at);
        }
        if attempt % nodes == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    None
}

/// Reads the stream from the start until `cancel`, on a connection of its own
/// (a blocking read on a shared connection would stall everything behind it),
/// made anew after a failed read: the connection may have been closed (Sentinel
/// closes clients' connections when it switches masters), and a new one goes to
/// the master as it is now.
pub async fn consume(
    store: delayq_client::store::Store,
    stream: String,
    id_field: String,
    traffic: Arc<Traffic>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let mut conn = store.blocking_connection().await?;
    let mut last = "0".to_owned();
    let options = StreamReadOptions::default().block(250).count(1000);
    let mut backoff =
        delayq_client::backoff::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    while !cancel.is_cancelled() {
        let reply: redis::RedisResult<Option<StreamReadReply>> =
            redis::AsyncCommands::xread_options(
                &mut conn,
                &[stream.as_str()],
                &[last.as_str()],
                &options,
            )
            .await;
        let reply = match reply {
            Ok(reply) => {
                backoff.reset();
                reply
            }
            Err(e) => {
                tracing::warn!(error = %e, "drill: reading the stream failed; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
                if let Ok(fresh) = store.blocking_connection().await {
                    conn = fresh;
                }
                continue;
            }
        };
        let Some(reply) = reply else { continue };
        let mut ledger = traffic.ledger();
        for key in reply.keys {
            for entry in key.ids {
                if let Some(value) = entry.map.get(&id_field)
                    && let Ok(id) = redis::from_redis_value_ref::<String>(value)
                    && let Some(at) = EntryId::parse(&entry.id)
                {
                    ledger.delivered(id, at);
                }
                last = entry.id;
            }
        }
    }
    Ok(())
}

/// Reads the whole stream as it stands and makes it the ledger's deliveries
/// (see [`Ledger::recount`]); returns how many entries read before are gone.
/// `complete`: nothing more is written to the stream (entries the live reader
/// read after this read are kept otherwise).
pub async fn recount(
    store: &delayq_client::store::Store,
    stream: &str,
    id_field: &str,
    traffic: &Traffic,
    complete: bool,
) -> anyhow::Result<usize> {
    let mut entries = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.stream_page(stream, after.as_deref(), 10_000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        entries.extend(page.into_iter().filter_map(|e| {
            let (_, id) = e.fields.into_iter().find(|(k, _)| k == id_field)?;
            Some((id, EntryId::parse(&e.id)?))
        }));
    }
    let read_to = (!complete).then(|| {
        after
            .as_deref()
            .and_then(EntryId::parse)
            .unwrap_or(EntryId { ms: 0, seq: None })
    });
    Ok(traffic.ledger().recount(entries, read_to))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ms: u64) -> EntryId {
        EntryId { ms, seq: Some(0) }
    }

    #[test]
    fn counts_per_phase_by_due_time() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Phases begin at 0, 1000 and 2000 ms (Redis: 9500, 10_500 and 20_500 ms);
        // messages are due 500 ms after sending.
        let start = |ms: u64, redis_ms: u64| PhaseStart {
            at: at(ms),
            redis_ms,
        };
        let starts = [start(0, 9500), start(1000, 10_500), start(2000, 20_500)];
        let delay = Duration::from_millis(500);
        let mut l = Ledger::default();
        l.sent("a".into(), 10_000);
        l.sent("b".into(), 10_500); // due as phase 1 begins
        l.sent("c".into(), 20_000);
        l.sent("d".into(), 30_000); // never delivered: phase 2 by its due time
        l.sent("g".into(), 20_499); // due in phase 1, delivered in phase 2
        l.unconfirmed("e".into(), at(1800));
        l.unconfirmed("f".into(), at(1900));
        l.delivered("a".into(), entry(10_005));
        l.delivered("b".into(), entry(12_500));
        l.delivered("b".into(), entry(12_600));
        l.delivered("c".into(), entry(20_001));
        l.delivered("g".into(), entry(22_499));
        l.delivered("e".into(), entry(3000));
        l.delivered("stranger".into(), entry(1));
        let counts = l.count(&starts, delay);
        assert_eq!(
            counts[0],
            PhaseCount {
                sent: 1,
                delivered: 1,
                max_lateness_ms: 5,
                ..PhaseCount::default()
            }
        );
        assert_eq!(
            counts[1],
            PhaseCount {
                sent: 2,
                delivered: 2,
                duplicated: 1,
                max_lateness_ms: 2000,
                ..PhaseCount::default()
            }
        );
        assert_eq!(
            counts[2],
            PhaseCount {
                sent: 3,
                delivered: 2,
                lost: 1,
                unconfirmed: 2,
                max_lateness_ms: 2000,
                ..PhaseCount::default()
            }
        );
        assert_eq!(l.outstanding(), 1);
    }

    #[test]
    fn an_entry_read_again_counts_once_and_the_stream_read_at_the_end_decides() {
        let t0 = Instant::now();
        let one = [PhaseStart {
            at: t0,
            redis_ms: 0,
        }];
        let mut l = Ledger::default();
        for id in ["a", "b", "c"] {
            l.sent(id.into(), 100);
        }
        l.delivered("a".into(), entry(110));
        l.delivered("a".into(), entry(110)); // the same entry read twice
        // b read on a master a failover discarded; written again on the new one,
        // at an id below what the reader had read (it never saw it).
        l.delivered("b".into(), entry(120));
        l.delivered("c".into(), entry(130));
        let live = l.count(&one, Duration::ZERO);
        assert_eq!((live[0].delivered, live[0].duplicated), (3, 0));
        let gone = l.recount(
            [
                ("a".to_owned(), entry(110)),
                ("c".to_owned(), entry(130)),
                ("b".to_owned(), entry(105)),
            ],
            None,
        );
        assert_eq!(gone, 1, "b's entry at 120 is gone");
        let counts = l.count(&one, Duration::ZERO);
        assert_eq!(
            counts[0],
            PhaseCount {
                sent: 3,
                delivered: 3,
                max_lateness_ms: 30,
                ..PhaseCount::default()
            }
        );
        // Two entries of one message in the stream as it stands: a duplicate.
        assert_eq!(
            l.recount(
                [
                    ("a".to_owned(), entry(110)),
                    ("a".to_owned(), entry(111)),
                    ("b".to_owned(), entry(105)),
                ],
                None,
            ),
            1,
            "c's entry is gone"
        );
        let counts = l.count(&one, Duration::ZERO);
        assert_eq!((counts[0].duplicated, counts[0].lost), (1, 1));
        assert_eq!(l.outstanding(), 1);
        // Read while entries still come: one the live reader saw after the
        // stream was read (c at 140, past 111) is kept, not counted gone.
        l.delivered("c".into(), entry(140));
        let gone = l.recount(
            [("a".to_owned(), entry(110)), ("a".to_owned(), entry(111))],
            Some(entry(111)),
        );
        assert_eq!(gone, 1, "b's entry at 105 is gone, c's at 140 kept");
        assert_eq!((l.outstanding(), l.delivered_count()), (1, 2));
    }

    #[test]
    fn a_confirmation_after_a_failed_attempt_wins() {
        let t0 = Instant::now();
        let mut l = Ledger::default();
        l.unconfirmed("a".into(), t0);
        l.sent("a".into(), 10);
        l.unconfirmed("a".into(), t0);
        let start = PhaseStart {
            at: t0,
            redis_ms: 0,
        };
        let counts = l.count(&[start], Duration::ZERO);
        assert_eq!(counts[0].unconfirmed, 0);
        assert_eq!(counts[0].lost, 1);
    }
}
