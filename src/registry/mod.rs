//! What every node tells the others through Redis, for the dashboard and its
//! endpoints: its registry entry (who it is, its API address, version, whether it
//! leads; every [`HEARTBEAT`]), the terms it leads (start and end, for the leadership
//! history), and while it leads, what it forwarded (a sample every [`SAMPLE_EVERY`]:
//! how many messages, to which streams, how late; and each quarter hour's rollup of
//! them, for a day's view). Writes that fail are logged and
//! tried again on the next round; none of this is on any message's path.

pub mod rollup;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::leadership::{Leadership, Role};
use crate::metrics as m;
use crate::store::{NodeRecord, Store, TermRecord};

/// How often a node writes its registry entry.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How often a leader writes a forwarding sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// A node whose entry is older than this shows as gone.
pub const GONE_AFTER: Duration = Duration::from_secs(10);

/// One forwarding sample as kept in Redis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// When it was taken (epoch ms), covering the [`SAMPLE_EVERY`] before.
    pub t_ms: u64,
    pub node_id: String,
    pub forwarded: u64,
    pub streams: std::collections::BTreeMap<String, u64>,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    /// Worst lateness (ms) per stream of its forwards no held set kept.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub worst_ms: std::collections::BTreeMap<String, u64>,
    /// Messages dead-lettered per stream.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub dead: std::collections::BTreeMap<String, u64>,
}

#[cfg(test)]
impl SampleRecord {
    /// A sample of node `n`: `count` messages forwarded to stream `s`, `worst` ms
    /// late at worst, none dead.
    pub fn of_stream_s(t_ms: u64, count: u64, worst: u64) -> SampleRecord {
        SampleRecord {
            t_ms,
            node_id: "n".into(),
            forwarded: count,
            streams: [("s".to_owned(), count)].into(),
            p50_ms: None,
            p99_ms: None,
            worst_ms: [("s".to_owned(), worst)].into(),
            dead: std::collections::BTreeMap::new(),
        }
    }
}

/// Epoch milliseconds of `t`.
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This process's clock, in epoch milliseconds (what nodes write as last seen).
pub fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

/// Whether `node` has left: it said it stopped, or has been silent for
/// [`GONE_AFTER`] by the reader's clock (`now_ms`).
pub fn is_gone(node: &NodeRecord, now_ms: u64) -> bool {
    node.stopped || now_ms.saturating_sub(node.last_seen_ms) > GONE_AFTER.as_millis() as u64
}

/// Who this node is, for its registry entry.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_id: String,
    pub address: String,
    pub started_at_ms: u64,
}

/// Runs until `cancel`: the heartbeat, the samples, and the terms of each of
/// `leaderships` (one, or one per election group with its group number). On
/// cancellation writes a last entry that says the node stopped.
pub async fn run(
    store: Store,
    me: Identity,
    node: Leadership,
    leaderships: Vec<(Option<u16>, Leadership)>,
    cancel: CancellationToken,
) {
    let mut tasks = JoinSet::new();
    for (group, leadership) in leaderships {
        tasks.spawn(follow_terms(
            store.clone(),
            me.node_id.clone(),
            group,
            leadership,
            cancel.clone(),
        ));
    }
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut sample = tokio::time::interval(SAMPLE_EVERY);
    sample.tick().await;
    let mut roles = node.subscribe();
    let mut rollup = rollup::Rollup::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            // A change of role is written at once, not at the next heartbeat.
            changed = roles.changed() => if changed.is_ok() {
                heartbeat.reset_immediately();
            },
            _ = heartbeat.tick() => {
                if let Err(e) = store.register_node(&entry(&me, &node, false)).await {
                    tracing::debug!(error = %e, "cannot write this node's registry entry");
                }
            }
            _ = sample.tick() => {
                let taken = m::take_sample();
                if taken.forwarded == 0 && !node.current().is_leader() {
                    continue;
                }
                let record = SampleRecord {
                    t_ms: now_ms(),
                    node_id: me.node_id.clone(),
                    forwarded: taken.forwarded,
                    streams: taken.per_stream,
                    p50_ms: taken.p50,
                    p99_ms: taken.p99,
                    worst_ms: taken.worst_per_stream,
                    dead: taken.dead_per_stream,
                };
                let json = serde_json::to_string(&record).expect("a sample serializes");
                if let Err(e) = store.push_sample(&json).await {
                    tracing::debug!(error = %e, "cannot write a forwarding sample");
                }
                if let Some(done) = rollup.add(&record) {
                    push_rollup(&store, &done).await;
                }
            }
        }
    }
    tasks.join_all().await;
    // What it forwarded in the quarter hour under way is kept too.
    if let Some(partial) = rollup.take() {
        let _ = tokio::time::timeout(Duration::from_secs(1), push_rollup(&store, &partial)).await;
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        store.register_node(&entry(&me, &node, true)),
    )
    .await;
}

/// Writes a quarter hour's rollup, unless nothing was forwarded nor dead-lettered.
async fn push_rollup(store: &Store, rollup: &SampleRecord) {
    if rollup.forwarded == 0 && rollup.dead.is_empty() {
        return;
    }
    let json = serde_json::to_string(rollup).expect("a rollup serializes");
    if let Err(e) = store.push_rollup(&json).await {
        tracing::debug!(error = %e, "cannot write a quarter hour's rollup");
    }
}

fn entry(me: &Identity, node: &Leadership, stopped: bool) -> NodeRecord {
    let role = node.current();
    NodeRecord {
        node_id: me.node_id.clone(),
        address: me.address.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at_ms: me.started_at_ms,
        last_seen_ms: now_ms(),
        leader: role.is_leader() && !stopped,
        epoch: role.epoch(),
        stopped,
    }
}

/// Writes each term of `leadership` as it starts and as it ends.
async fn follow_terms(
    store: Store,
    node_id: String,
    group: Option<u16>,
    leadership: Leadership,
    cancel: CancellationToken,
) {
    let mut roles = leadership.subscribe();
    let mut ends = leadership.ends();
    let mut open: Option<TermRecord> = None;
    loop {
        // The end first: a term that ended while the next began is closed before
        // the next one is opened.
        let ended = ends.borrow_and_update().clone();
        if let Some(ended) = ended
            && let Some(mut record) = open.take_if(|t| t.epoch == ended.epoch)
        {
            record.to_ms = Some(epoch_ms(ended.at));
            record.ended = Some(ended.why.to_owned());
            write(&store, &record, &cancel).await;
        }
        let role = roles.borrow_and_update().clone();
        if let Role::Leader(term) = role
            && open.as_ref().is_none_or(|t| t.epoch != term.epoch)
        {
            let record = TermRecord {
                node_id: node_id.clone(),
                epoch: term.epoch,
                group,
                from_ms: epoch_ms(term.since),
                to_ms: None,
                ended: None,
            };
            write(&store, &record, &cancel).await;
            open = Some(record);
        }
        // Cancelled: the loop went round once more for an end published last.
        if cancel.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => {}
            r = roles.changed() => if r.is_err() { return },
            r = ends.changed() => if r.is_err() { return },
        }
    }
}

/// Writes a term, retrying for a while (the history is worth a few tries, not a
/// stuck task): up to about half a minute, or until `cancel` (then one last try).
async fn write(store: &Store, record: &TermRecord, cancel: &CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    for _ in 0..10 {
        match store.record_term(record).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e, epoch = record.epoch, "cannot write a leadership term; retrying");
                if cancel.is_cancelled() {
                    return;
                }
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
}
