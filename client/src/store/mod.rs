//! The only module that speaks Redis.
//!
//! Every change to delayq's data happens inside one of the Lua scripts in `lua/`,
//! so each operation is atomic on the Redis server. This module builds their keys
//! and arguments and turns their replies into types.

mod acked;
mod audit;
mod batch;
mod board;
mod by_key;
mod conn;
mod dial;
mod error;
mod eviction;
#[cfg(feature = "faults")]
pub mod faults;
mod fences;
mod finished;
mod forward;
#[cfg(test)]
mod id_order;
mod inbox;
#[cfg(test)]
mod inbox_forget;
mod inbox_read;
mod journal;
mod keys;
mod libraries;
mod master;
mod message;
mod outcome;
#[cfg(test)]
mod packed_bodies;
#[cfg(test)]
mod placed_ids;
mod push_args;
mod reply;
mod rights;
mod schedules;
mod scripts;
mod shard_count;
mod shards;
mod stats;
mod streams;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use redis::{AsyncCommands, Value};
use shards::InUse;

pub use audit::AuditEntry;
pub use batch::{BatchItem, InboxAck, MAX_PER_CALL};
pub use board::{
    DueClasses, GroupInfo, NodeRecord, StreamCountRecord, TermRecord, Upcoming, UpcomingMessage,
};
pub use by_key::{KeyCancelled, KeyedMessage, KeyedState};
pub use conn::{SentinelConfig, Separate, slot_master};
pub use error::{Result, StoreError, oom_refused_within};
pub use eviction::{Memory, NEARLY_FULL};
pub use finished::{FinishedCursor, FinishedMessage, FinishedPage};
pub use inbox::{
    CopyLimit, EntryFields, InboxEntry, InboxQueue, InboxReader, InboxStats, MAX_COPIED_PAIRS,
    Rejection,
};
pub use inbox_read::{Read as InboxRead, is_read_consumer};
pub use journal::{OutboxCode, OutboxLine};
pub use keys::{
    CLUSTER_SLOTS, DEFAULT_SHARDS, Keys, MAX_SHARDS, ShardKeys, cluster_dead_letter_stream,
    cluster_stream_refusal, has_tag, slot_of,
};
pub use libraries::{Library, NodeLibraries, info_value};
pub use outcome::*;
use reply::{array, int, int_at, int_signed_at, number_text_at, string_at, text};
pub use rights::Rights;
pub use schedules::{Advanced, Changed as ScheduleChanged, ScheduleState};
pub use stats::{HeldBack, PendingReport, StreamCounts};
pub use streams::StreamEntry;
pub use tls::{RedisTls, client as redis_client};

use crate::message::{Due, MessageId, MessageKey, StoredMessage};
use crate::secret::RedisUrl;
use conn::Conn;
use scripts::{Call, Lua, Scripts};

/// Time to live of a node's health probe key (see [`Store::probe_write`]).
const PROBE_TTL_MS: u64 = 60_000;

mod delivery;
mod presence;

pub use presence::{Held, LeaderSigns};

pub use delivery::{
    DEAD_LETTER_FIELDS, DeadLetter, PendingEntry, RedeliverOptions, Redelivered, Replayed,
    split_own_fields,
};

/// How to reach Redis and lay out keys.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub url: RedisUrl,
    /// For a `rediss://` URL: the CA and client certificate the config names.
    pub tls: Option<RedisTls>,
    /// Find the master through Sentinel (`url` then gives scheme, user, password, db).
    pub sentinel: Option<SentinelConfig>,
    /// Redis Cluster's seed nodes (host, port): one shard per hash slot.
    pub cluster: Option<Vec<(String, u16)>>,
    /// Replicas that must confirm each schedule call (`WAIT`), and how long to wait.
    pub replicas_acked: Option<(u32, Duration)>,
    pub prefix: String,
    /// `redis.shards` (standalone Redis); 0 takes the count Redis keeps.
    pub shards: u16,
    /// A reply slower than this fails the command (the connection is then re-established).
    pub response_timeout: Duration,
    pub connect_timeout: Duration,
    /// Most blocking stream reads (HTTP long polls) at once, each on a connection of its own.
    pub max_blocking_reads: usize,
    /// How the scripts write terminal records.
    pub record_layout: RecordLayout,
    /// Whether they list each stream's finished messages too (`records.finished_list`).
    pub finished_list: bool,
    /// How the scripts store scheduled messages.
    pub pending_layout: PendingLayout,
    /// Whether the scripts write each change to a shard's journal outbox
    /// (`[journal]` on; see `journal_outbox` in the prelude).
    pub journal: bool,
}

/// How terminal records (delivered, expired, dead, cancelled) are written. Either
/// layout reads, trims and forgets records of the other, so the setting can change
/// on a running deployment's data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordLayout {
    /// Small hashes Redis keeps in its listpack encoding, in generations that expire
    /// whole: about a third of the memory of `Hash`, and more Redis time per forwarded
    /// message and per push (see docs/performance.md).
    #[default]
    Compact,
    /// One hash field per record and an expiry entry per forward batch: faster to
    /// write and to look up, about three times the memory.
    Hash,
}

impl RecordLayout {
    /// The scripts' records argument: the retention in ms, prefixed by `hash:` for
    /// the hash layout (the prelude's `records_policy` reads it).
    fn script_arg(self, retention: Duration) -> String {
        let ms = retention.as_millis();
        match self {
            RecordLayout::Compact => ms.to_string(),
            RecordLayout::Hash => format!("hash:{ms}"),
        }
    }
}

/// How scheduled messages are stored. Every script reads, forwards and removes
/// messages of either layout, so the setting can change on a running deployment's
/// data (see the prelude).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PendingLayout {
    /// Lists of at most 128 messages in due order and an id index of small hashes:
    /// about 175 bytes a 100-byte message (see docs/performance.md).
    #[default]
    Compact,
    /// A sorted set of ids by due time and a hash of bodies: about 320 bytes a
    /// 100-byte message, and less Redis time per message.
    Hash,
}

impl PendingLayout {
    /// The scripts' pending layout argument.
    fn script_arg(self) -> &'static str {
        match self {
            PendingLayout::Compact => "compact",
            PendingLayout::Hash => "hash",
        }
    }
}

/// A handle on delayq's Redis data. Cheap to clone: clones share one multiplexed connection.
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    /// With `replicas_acked`: a connection of its own for schedule calls, each
    /// followed by a `WAIT` (which counts the writes of its own connection, and
    /// holds up whatever is queued behind it there while it waits).
    acked: Option<Conn>,
    replicas_acked: Option<(u32, Duration)>,
    /// With the journal on: a connection of its own for Redis's clock
    /// ([`Store::now_ms`]), which every journaled push reads first, so that it does
    /// not wait behind the script calls queued on `conn`.
    clock: Option<Conn>,
    keys: Keys,
    scripts: Arc<Scripts>,
    response_timeout: Duration,
    /// Connections for blocking reads on behalf of HTTP consumers.
    polls: Arc<streams::PollPool>,
    record_layout: RecordLayout,
    finished_list: bool,
    pending_layout: PendingLayout,
    journal: bool,
    /// The shards a leader's term works on: every shard, or one election group's
    /// (`election.mode = "per_shard"`, see [`Store::owning`]).
    owned: Option<Arc<[u16]>>,
    /// Single pushes waiting for their shard's call in flight (see `batch.rs`).
    coalescer: Arc<batch::Coalescer>,
    /// Redis Cluster: the shards known to be in [`Keys::shards_in_use`].
    in_use: Arc<InUse>,
    /// Streams whose messages go to their held set when pushed (see
    /// [`Store::keep_apart`]); shared by every clone.
    apart: Arc<std::sync::RwLock<Arc<[String]>>>,
    /// When Redis's clock was last asked, and what it said, in epoch ms
    /// ([`Store::clock_ahead_ms`]); shared by every clone.
    clock_read: Arc<std::sync::Mutex<Option<(std::time::Instant, u64)>>>,
}

/// How long [`Store::clock_ahead_ms`] carries a reading of Redis's clock forward.
const CLOCK_READ_FOR: Duration = Duration::from_secs(1);

/// The longest round trip of a reading of Redis's clock that is carried forward
/// (a reading that waited behind other calls would put due times late).
const CLOCK_TRIP: Duration = Duration::from_millis(2);

/// Fails with `Unsupported` when `conn` reaches a Redis Cluster node without
/// `redis.mode = "cluster"`: a standalone deployment's shards hold messages to any
/// stream, whose writes Cluster refuses (or redirects) call by call. A Redis that will not say (`INFO` not allowed to this
/// user) is taken at its word of being standalone.
async fn refuse_cluster(conn: &Conn) -> Result<()> {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn.clone())
        .await;
    match info {
        Ok(info) if info.lines().any(|l| l.trim() == "cluster_enabled:1") => {
            Err(StoreError::Unsupported(
                "this is a Redis Cluster node (cluster_enabled:1): set redis.mode = \"cluster\" \
                 to run on Redis Cluster (seed nodes in redis.url and redis.nodes)"
                    .to_owned(),
            ))
        }
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("NOPERM") => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Store {
    /// Connects (failing fast if Redis is unreachable now; later outages are retried).
    pub async fn connect(config: &StoreConfig) -> Result<Store> {
        let conn = Conn::connect(config).await?;
        if !conn.is_cluster() {
            refuse_cluster(&conn).await?;
        }
        let keys = if conn.is_cluster() {
            Keys::cluster(&config.prefix)
        } else {
            shard_count::keys(&conn, &config.prefix, config.shards).await?
        };
        let acked = match config.replicas_acked {
            Some(_) => Some(Conn::connect(config).await?),
            None => None,
        };
        let clock = if config.journal {
            Some(Conn::connect(config).await?)
        } else {
            None
        };
        Ok(Store {
            conn,
            acked,
            replicas_acked: config.replicas_acked,
            clock,
            in_use: Arc::new(InUse::new(keys.shards())),
            apart: Arc::default(),
            clock_read: Arc::default(),
            coalescer: Arc::new(batch::Coalescer::new(&keys)),
            keys,
            scripts: Arc::new(Scripts::new()),
            response_timeout: config.response_timeout,
            polls: Arc::new(streams::PollPool::new(config.max_blocking_reads)),
            record_layout: config.record_layout,
            finished_list: config.finished_list,
            pending_layout: config.pending_layout,
            journal: config.journal,
            owned: None,
        })
    }

    /// The records argument of a script that writes terminal records: the layout
    /// and retention, marked when finished messages are not listed and for the
    /// journal's outbox while the journal is on (the prelude's `records_policy`).
    fn records_arg(&self, retention: Duration) -> String {
        let mut arg = self.record_layout.script_arg(retention);
        if !self.finished_list {
            arg.insert_str(0, "n:");
        }
        if self.journal {
            format!("j:{arg}")
        } else {
            arg
        }
    }

    /// Whether this store works on Redis Cluster (one shard per hash slot).
    pub fn is_cluster(&self) -> bool {
        self.keys.is_cluster()
    }

    /// `call` on each shard message `id` may live in (see [`Store::shards_for`]), in
    /// order, until an answer is `known`: that answer, or None. A call on a shard
    /// that does not know the id changes nothing there.
    async fn probe<T, F>(
        &self,
        id: &MessageId,
        known: impl Fn(&T) -> bool,
        call: impl Fn(u16) -> F,
    ) -> Result<Option<T>>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        for shard in self.shards_for(id).await? {
            let answer = call(shard).await?;
            if known(&answer) {
                return Ok(Some(answer));
            }
        }
        Ok(None)
    }

    /// This store, refusing every command once the Redis master has moved (a
    /// Sentinel failover) from the one it reaches now: what a leader's term works
    /// through. On one Redis it never refuses.
    pub fn pinned(&self) -> Store {
        Store {
            conn: self.conn.pinned(),
            ..self.clone()
        }
    }

    /// Keeps the messages pushed to `streams` apart from the other streams' (the
    /// rate-limited ones, `streams.max_rate`), for this store and every clone of it:
    /// each goes to its stream's held set when stored (pushed, rescheduled,
    /// redelivered or replayed from its dead letters), so that a backlog of a limited
    /// stream never lies in front of the others' messages in the due order and
    /// nothing need be set aside when it falls due (see `schedule_batch.lua`). Any
    /// set of streams is safe, and a stream not kept apart is set aside when due.
    pub fn keep_apart(&self, streams: impl IntoIterator<Item = String>) {
        let mut streams: Vec<String> = streams.into_iter().collect();
        streams.sort();
        streams.dedup();
        *self.apart.write().unwrap_or_else(|e| e.into_inner()) = streams.into();
    }

    /// The streams kept apart (see [`Store::keep_apart`]).
    pub fn kept_apart(&self) -> Arc<[String]> {
        self.apart.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The argument telling a script that stores one message for `stream` whether
    /// to keep it apart.
    fn apart_arg(&self, stream: &str) -> &'static str {
        if self.kept_apart().iter().any(|s| s == stream) {
            "apart"
        } else {
            ""
        }
    }

    /// This store, writing scheduled messages in `layout` (every layout is read).
    pub fn with_pending_layout(&self, layout: PendingLayout) -> Store {
        Store {
            pending_layout: layout,
            // Its pushes never share a call with another layout's.
            coalescer: Arc::new(batch::Coalescer::new(&self.keys)),
            ..self.clone()
        }
    }

    /// The master moves a pinned store was made after (see [`Store::pinned`]).
    pub fn pinned_to(&self) -> Option<u64> {
        self.conn.pin()
    }

    /// How many times the connection was made anew: a master followed through
    /// Sentinel, a cluster connection renewed.
    pub fn renewals(&self) -> u64 {
        self.conn.renewals()
    }

    /// Each move of the Redis master through Sentinel (a count and the new
    /// address); None without Sentinel.
    pub fn master_changes(&self) -> Option<tokio::sync::watch::Receiver<(u64, String)>> {
        self.conn.master_changes()
    }

    /// Asks a Sentinel for a planned failover of the master (`SENTINEL
    /// FAILOVER`), as an operator's drill does. Sentinel refuses while a failover
    /// is under way (`INPROG`) or no replica is fit to promote (`NOGOODSLAVE`).
    pub async fn sentinel_failover(&self) -> Result<()> {
        self.conn.sentinel_failover().await?;
        Ok(())
    }

    /// Whether every replica of the master Sentinel knows is a replica of the
    /// master this store follows, with its link up: ready for another failover
    /// without discarding what the master took since the last one.
    /// How long a change waits for replicas after it is made
    /// (`redis.replicas_ack_timeout` with `redis.min_replicas_acked`; else none).
    pub fn replicas_wait(&self) -> Duration {
        self.replicas_acked.map_or(Duration::ZERO, |(_, wait)| wait)
    }

    pub async fn sentinel_replicas_in_sync(&self) -> Result<bool> {
        Ok(self.conn.replicas_in_sync().await?)
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn shards(&self) -> u16 {
        self.keys.shards()
    }

    fn shard_keys(&self, id: &MessageId, stream: &str) -> ShardKeys {
        self.keys.shard(self.shard_of(id, stream))
    }

    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    /// Writes this node's probe key (expiring in a minute): Ok when Redis takes
    /// writes. A replica answers READONLY, a full Redis OOM, one whose last save
    /// failed MISCONF; those are [`StoreError::Redis`] with Redis's code.
    pub async fn probe_write(&self, node_id: &str) -> Result<()> {
        let mut conn = self.conn.clone();
        let () = redis::cmd("SET")
            .arg(self.keys.write_probe(node_id))
            .arg(1)
            .arg("PX")
            .arg(PROBE_TTL_MS)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Redis's clock, in epoch milliseconds.
    pub async fn now_ms(&self) -> Result<u64> {
        let mut conn = self.clock.as_ref().unwrap_or(&self.conn).clone();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Redis's clock now, in epoch ms, never behind it but by a millisecond's
    /// rounding: `TIME` read now, or a reading of at most a second ago whose round
    /// trip took at most `CLOCK_TRIP`, carried forward on this process's monotonic
    /// clock from when it was sent (ahead by up to that trip; a step of the wall
    /// clock here changes nothing).
    pub async fn clock_ahead_ms(&self) -> Result<u64> {
        let known = *self.clock_read.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sent, redis_ms)) = known
            && sent.elapsed() < CLOCK_READ_FOR
        {
            return Ok(redis_ms + sent.elapsed().as_millis() as u64);
        }
        let sent = std::time::Instant::now();
        let redis_ms = self.now_ms().await?;
        if sent.elapsed() <= CLOCK_TRIP {
            *self.clock_read.lock().unwrap_or_else(|e| e.into_inner()) = Some((sent, redis_ms));
        }
        Ok(redis_ms)
    }

    /// [`Store::get`] of each of `ids`, in order, 64 lookups at once.
    pub async fn statuses<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a MessageId>,
    ) -> Vec<Result<Status>> {
        let ids: Vec<&MessageId> = ids.into_iter().collect();
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(64) {
            found.extend(futures::future::join_all(chunk.iter().map(|id| self.get(id))).await);
        }
        found
    }

    /// Shards whose earliest message just changed, as the schedule script announces
    /// them. The stream ends when the subscription's connection is lost.
    pub async fn wakeups(&self) -> Result<impl Stream<Item = u16> + use<>> {
        let mut pubsub = self.conn.pubsub().await?;
        pubsub.subscribe(self.keys.wake_channel()).await?;
        let keys = self.keys.clone();
        Ok(pubsub.into_on_message().filter_map(move |msg| {
            let shard = msg
                .get_payload::<String>()
                .ok()
                .and_then(|key| keys.shard_of_due_key(&key));
            futures::future::ready(shard)
        }))
    }

    /// A connection of its own, for callers outside delayq's data model (the demo,
    /// the benchmark, the drill) that read target streams. Never the shared one: a
    /// blocking read there would stall every command queued behind it. No response
    /// timeout, so `XREAD BLOCK` works.
    pub async fn separate_connection(&self) -> Result<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self.conn.separate(&config).await?)
    }

    /// A connection of its own for blocking reads (the inbox, HTTP long polls, the
    /// benchmark's reads of target streams): to the one Redis, or on Redis Cluster a
    /// cluster connection of its own, which follows each key to its slot's master.
    pub async fn blocking_connection(&self) -> Result<conn::Separate> {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self.conn.separate_any(&config).await?)
    }
}

/// changes a shard lists them in its contract: due set, bodies, records, records by
/// expiry, fence, held streams.
fn shard_invocation<'a>(script: &'a Lua, k: &ShardKeys) -> Call<'a> {
    let mut inv = script.prepare_invoke();
    shard_keys(&mut inv, k);
    inv
}

/// Adds a shard's keys to a call, in the order of [`shard_invocation`].
fn shard_keys(inv: &mut Call<'_>, k: &ShardKeys) {
    inv.key(&k.due)
        .key(&k.bodies)
        .key(&k.records)
        .key(&k.records_by_expiry)
        .key(&k.fence)
        .key(&k.held);
}
