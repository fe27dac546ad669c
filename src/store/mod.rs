//! The only module that speaks Redis.
//!
//! Every change to delayq's data happens inside one of the Lua scripts in `lua/`,
//! so each operation is atomic on the Redis server. This module builds their keys
//! and arguments and turns their replies into types.

mod acked;
mod batch;
#[cfg(feature = "server")]
mod board;
mod conn;
mod dial;
mod error;
mod eviction;
mod inbox;
mod journal;
mod keys;
mod libraries;
mod master;
mod outcome;
mod reply;
mod rights;
mod scripts;
mod shard_count;
mod stats;
mod streams;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use redis::{AsyncCommands, Value};

#[cfg(feature = "test-support")]
pub use batch::faults;
pub use batch::{BatchItem, InboxAck};
#[cfg(feature = "server")]
pub use board::{
    DueClasses, GroupInfo, NodeRecord, StreamCountRecord, TermRecord, Upcoming, UpcomingMessage,
};
pub use conn::{SentinelConfig, slot_master};
pub use error::{Result, StoreError, oom_refused_within};
pub use eviction::{Memory, NEARLY_FULL};
pub use inbox::{
    CopyLimit, EntryFields, InboxEntry, InboxQueue, InboxReader, InboxStats, MAX_COPIED_PAIRS,
    Rejection,
};
pub use journal::{OutboxCode, OutboxLine};
pub use keys::{
    CLUSTER_SLOTS, DEFAULT_SHARDS, Keys, MAX_SHARDS, ShardKeys, cluster_dead_letter_stream,
    cluster_stream_refusal, has_tag, slot_of,
};
pub use libraries::{Library, NodeLibraries, info_value};
pub use outcome::*;
use reply::{array, int, int_at, int_signed_at, string_at, text};
pub use rights::Rights;
pub use stats::{HeldBack, PendingReport, StreamCounts};
pub use streams::StreamEntry;
pub use tls::{RedisTls, client as redis_client};

use crate::message::{Due, MessageId, StoredMessage};
use crate::secret::RedisUrl;
use conn::Conn;
use scripts::{Call, Functions, Lua, lua};

/// Time to live of a node's health probe key (see [`Store::probe_write`]).
const PROBE_TTL_MS: u64 = 60_000;

mod delivery;
#[cfg(feature = "server")]
mod presence;

#[cfg(feature = "server")]
pub use presence::{Held, LeaderSigns};

pub use delivery::{
    DEAD_LETTER_FIELDS, DeadLetter, PendingEntry, RedeliverOptions, Redelivered, Replayed,
    split_own_fields,
};

/// The scripts, compiled into the binary and loaded lazily: as a library of Redis
/// Functions where Redis allows it, else each by `EVALSHA` (see `scripts`).
struct Scripts {
    reschedule: Lua,
    cancel: Lua,
    get: Lua,
    forward: Lua,
    trim: Lua,
    raise_fence: Lua,
    redeliver: Lua,
    replay_dead: Lua,
    schedule_batch: Lua,
    reject_inbox: Lua,
    ack_inbox: Lua,
    pending_streams: Lua,
    pending_count: Lua,
    journal_ack: Lua,
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    due_histogram: Lua,
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    clear_switchover: Lua,
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    upcoming: Lua,
}

impl Scripts {
    fn new() -> Self {
        let f = Functions::new();
        Scripts {
            reschedule: lua("reschedule", &f),
            cancel: lua("cancel", &f),
            get: lua("get", &f),
            forward: lua("forward", &f),
            trim: lua("trim", &f),
            raise_fence: lua("raise_fence", &f),
            redeliver: lua("redeliver", &f),
            replay_dead: lua("replay_dead", &f),
            schedule_batch: lua("schedule_batch", &f),
            reject_inbox: lua("reject_inbox", &f),
            ack_inbox: lua("ack_inbox", &f),
            pending_streams: lua("pending_streams", &f),
            pending_count: lua("pending_count", &f),
            journal_ack: lua("journal_ack", &f),
            due_histogram: lua("due_histogram", &f),
            clear_switchover: lua("clear_switchover", &f),
            upcoming: lua("upcoming", &f),
        }
    }
}

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
    keys: Keys,
    scripts: Arc<Scripts>,
    response_timeout: Duration,
    /// Connections for blocking reads on behalf of HTTP consumers.
    polls: Arc<streams::PollPool>,
    record_layout: RecordLayout,
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
}

/// Shards this process knows to be listed in use (a bit each).
struct InUse(Vec<std::sync::atomic::AtomicU64>);

impl InUse {
    fn new(shards: u16) -> Self {
        InUse(
            (0..usize::from(shards).div_ceil(64))
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
        )
    }

    fn has(&self, shard: u16) -> bool {
        let bit = 1u64 << (shard % 64);
        self.0[usize::from(shard / 64)].load(std::sync::atomic::Ordering::Relaxed) & bit != 0
    }

    fn add(&self, shard: u16) {
        let bit = 1u64 << (shard % 64);
        self.0[usize::from(shard / 64)].fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
    }
}

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
        Ok(Store {
            conn,
            acked,
            replicas_acked: config.replicas_acked,
            in_use: Arc::new(InUse::new(keys.shards())),
            apart: Arc::default(),
            coalescer: Arc::new(batch::Coalescer::new(&keys)),
            keys,
            scripts: Arc::new(Scripts::new()),
            response_timeout: config.response_timeout,
            polls: Arc::new(streams::PollPool::new(config.max_blocking_reads)),
            record_layout: config.record_layout,
            pending_layout: config.pending_layout,
            journal: config.journal,
            owned: None,
        })
    }

    /// The records argument of a script that writes terminal records: the layout
    /// and retention, marked for the journal's outbox while the journal is on (the
    /// prelude's `records_policy`).
    fn records_arg(&self, retention: Duration) -> String {
        let arg = self.record_layout.script_arg(retention);
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

    /// The shard a message to `stream` with id `id` lives in (see [`Keys::shard_of`]).
    pub fn shard_of(&self, id: &MessageId, stream: &str) -> u16 {
        self.keys.shard_of(id, stream)
    }

    /// The shards that may hold messages: every shard, or on Redis Cluster those
    /// listed in use (each listed before its first message was stored).
    pub async fn shards_in_use(&self) -> Result<Vec<u16>> {
        if !self.is_cluster() {
            return Ok((0..self.shards()).collect());
        }
        let mut conn = self.conn.clone();
        let listed: Vec<u16> = conn.smembers(self.keys.shards_in_use()).await?;
        let mut shards: Vec<u16> = listed.into_iter().filter(|&s| s < self.shards()).collect();
        shards.sort_unstable();
        for &s in &shards {
            self.in_use.add(s);
        }
        Ok(shards)
    }

    /// Lists `shard` in use before a message is first stored there (Redis Cluster;
    /// once per shard and process).
    async fn note_in_use(&self, shard: u16) -> Result<()> {
        if !self.is_cluster() || self.in_use.has(shard) {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let _: u64 = conn.sadd(self.keys.shards_in_use(), shard).await?;
        self.in_use.add(shard);
        Ok(())
    }

    /// The shards of [`Store::shards_in_use`] this store's leader-only work covers.
    pub async fn owned_in_use(&self) -> Result<Vec<u16>> {
        Ok(self
            .shards_in_use()
            .await?
            .into_iter()
            .filter(|&s| self.owns(s))
            .collect())
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

    /// The shards a message `id` may live in when its stream is not known: its
    /// one shard, or on Redis Cluster every shard in use.
    async fn shards_for(&self, id: &MessageId) -> Result<Vec<u16>> {
        if self.is_cluster() {
            self.shards_in_use().await
        } else {
            Ok(vec![id.shard(self.shards())])
        }
    }

    /// This store, with its leader-only work limited to `shards`: the fences it
    /// raises, the shards forwarded and trimmed, the entries redelivered (by their
    /// message's shard). What one election group's term works through.
    pub fn owning(&self, mut shards: Vec<u16>) -> Store {
        shards.sort_unstable();
        Store {
            owned: Some(shards.into()),
            ..self.clone()
        }
    }

    /// The shards this store's leader-only work covers, in order.
    pub fn owned_shards(&self) -> Vec<u16> {
        match &self.owned {
            Some(shards) => shards.to_vec(),
            None => (0..self.shards()).collect(),
        }
    }

    /// Whether `shard` is one of [`Store::owned_shards`].
    pub fn owns(&self, shard: u16) -> bool {
        self.owned
            .as_ref()
            .is_none_or(|s| s.binary_search(&shard).is_ok())
            && shard < self.shards()
    }

    /// Whether the message `id` to `stream` lives in one of [`Store::owned_shards`].
    pub fn owns_message(&self, id: &MessageId, stream: &str) -> bool {
        self.owns(self.shard_of(id, stream))
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
        let mut conn = self.conn.clone();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(secs * 1000 + micros / 1000)
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

    /// The state of message `id`: looked up in its shard, or on Redis Cluster in
    /// each shard in use until one knows it.
    pub async fn get(&self, id: &MessageId) -> Result<Status> {
        // A read changes nothing: the shards it may be in are asked 64 at a time.
        let shards = self.shards_for(id).await?;
        for chunk in shards.chunks(64) {
            let asked = chunk.iter().map(|&shard| self.get_in(shard, id));
            let answers = futures::future::try_join_all(asked).await?;
            if let Some(known) = answers.into_iter().find(|s| !matches!(s, Status::Unknown)) {
                return Ok(known);
            }
        }
        Ok(Status::Unknown)
    }

    async fn get_in(&self, shard: u16, id: &MessageId) -> Result<Status> {
        let k = self.keys.shard(shard);
        let reply: Value = self
            .scripts
            .get
            .key(&k.due)
            .key(&k.bodies)
            .key(&k.records)
            .arg(id.as_str())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let state = string_at(&items, 0)?;
        Ok(match state.as_str() {
            "unknown" => Status::Unknown,
            "corrupt" => Status::Corrupt(string_at(&items, 1)?),
            "scheduled" => {
                let values = array(items.into_iter().nth(1).unwrap_or(Value::Nil))?;
                Status::Scheduled(StoredMessage::from_values(&values).map_err(StoreError::Reply)?)
            }
            other => {
                let state = RecordState::parse(other)
                    .ok_or_else(|| StoreError::Reply(format!("get said {other:?}")))?;
                let stream = string_at(&items, 1)?;
                let entry = string_at(&items, 2)?;
                Status::Done(Record {
                    state,
                    stream: (!stream.is_empty()).then_some(stream),
                    entry_id: (!entry.is_empty()).then_some(entry),
                    at_ms: int_at(&items, 3)?,
                    attempt: int_at(&items, 4)?,
                })
            }
        })
    }

    /// Withdraws a scheduled message; the cancellation stays on record for `retention`.
    pub async fn cancel(&self, id: &MessageId, retention: Duration) -> Result<Cancelled> {
        Ok(self.cancel_timed(id, retention).await?.0)
    }

    /// [`Store::cancel`], with Redis's time of the cancellation when it happened now
    /// (what the journal orders it by) and the message's stream where its body said.
    pub async fn cancel_timed(
        &self,
        id: &MessageId,
        retention: Duration,
    ) -> Result<(Cancelled, Option<(u64, Option<String>)>)> {
        let found = self
            .probe(
                id,
                |(c, _)| !matches!(c, Cancelled::Unknown),
                |shard| self.cancel_in(shard, id, retention),
            )
            .await?;
        Ok(found.unwrap_or((Cancelled::Unknown, None)))
    }

    async fn cancel_in(
        &self,
        shard: u16,
        id: &MessageId,
        retention: Duration,
    ) -> Result<(Cancelled, Option<(u64, Option<String>)>)> {
        let k = self.keys.shard(shard);
        let mut call = shard_invocation(&self.scripts.cancel, &k);
        call.arg(0)
            .arg(id.as_str())
            .arg(self.records_arg(retention));
        let (reply, acked) = self.invoke_acked(&call).await?;
        let reply = text(&reply)?;
        if let Some(said) = reply.strip_prefix("cancelled ") {
            let (at, stream) = said.split_once(' ').unwrap_or((said, ""));
            let at = at
                .parse()
                .map_err(|_| StoreError::Reply(format!("cancel said {reply:?}")))?;
            acked::confirmed(acked)?;
            let stream = (!stream.is_empty()).then(|| stream.to_owned());
            return Ok((Cancelled::Cancelled, Some((at, stream))));
        }
        Ok((
            match reply.as_str() {
                // Answered as cancelled: confirmed by the replicas as the first
                // answer would have been (that one may have been not_replicated).
                "already_cancelled" => {
                    acked::confirmed(acked)?;
                    Cancelled::AlreadyDone(RecordState::Cancelled)
                }
                "unknown" => Cancelled::Unknown,
                other => Cancelled::AlreadyDone(
                    RecordState::parse(other)
                        .ok_or_else(|| StoreError::Reply(format!("cancel said {other:?}")))?,
                ),
            },
            None,
        ))
    }

    pub async fn reschedule(
        &self,
        id: &MessageId,
        due: Due,
        max_delay: Duration,
    ) -> Result<Rescheduled> {
        let found = self
            .probe(
                id,
                |r| !matches!(r, Rescheduled::Unknown),
                |shard| self.reschedule_in(shard, id, due, max_delay),
            )
            .await?;
        Ok(found.unwrap_or(Rescheduled::Unknown))
    }

    async fn reschedule_in(
        &self,
        shard: u16,
        id: &MessageId,
        due: Due,
        max_delay: Duration,
    ) -> Result<Rescheduled> {
        let k = self.keys.shard(shard);
        let [due_kind, due_value] = due.script_args();
        let mut inv = self.scripts.reschedule.prepare_invoke();
        inv.key(&k.due)
            .key(&k.bodies)
            .key(&k.records)
            .key(&k.fence)
            .key(&k.held)
            .arg(0)
            .arg(id.as_str())
            .arg(due_kind)
            .arg(due_value)
            .arg(max_delay.as_millis() as u64)
            .arg(self.keys.wake_channel())
            .arg(self.pending_layout.script_arg())
            .arg(if self.journal { "j" } else { "" });
        // The message's stream is known only to the script.
        for stream in self.kept_apart().iter() {
            inv.arg(stream);
        }
        let (reply, acked) = self.invoke_acked(&inv).await?;
        let items = array(reply)?;
        let state = string_at(&items, 0)?;
        if state == "rescheduled" {
            acked::confirmed(acked)?;
        }
        Ok(match state.as_str() {
            "rescheduled" => Rescheduled::Rescheduled {
                due_ms: int_at(&items, 1)?,
                at_ms: int_at(&items, 2)?,
                stream: string_at(&items, 3)?,
            },
            "unknown" => Rescheduled::Unknown,
            other => Rescheduled::NotScheduled(
                RecordState::parse(other)
                    .ok_or_else(|| StoreError::Reply(format!("reschedule said {other:?}")))?,
            ),
        })
    }

    /// Moves up to a batch of one shard's due messages into their streams, as the
    /// leader of `epoch`. Every forward goes through this one function, so the
    /// Redis Cluster path (claim, XADD, confirm) can replace it in one place.
    pub async fn forward(
        &self,
        shard: u16,
        epoch: u64,
        options: &ForwardOptions,
    ) -> Result<ForwardBatch> {
        self.forward_at_most(shard, epoch, options, options.batch_size, &[])
            .await
    }

    /// [`Store::forward`], moving at most `limit` messages (the global rate limit's
    /// permits) instead of `options.batch_size`, and at most its budget (permits) to
    /// each stream in `budgets`, which holds back the rest of its due messages (see
    /// `streams.max_rate`). Streams not in `budgets` have no limit.
    pub async fn forward_at_most(
        &self,
        shard: u16,
        epoch: u64,
        options: &ForwardOptions,
        limit: usize,
        budgets: &[(String, usize)],
    ) -> Result<ForwardBatch> {
        let k = self.keys.shard(shard);
        let mut inv = shard_invocation(&self.scripts.forward, &k);
        inv.arg(epoch)
            .arg(limit)
            .arg(self.records_arg(options.retention))
            .arg(options.id_field.as_deref().unwrap_or(""))
            .arg(options.attempt_field.as_deref().unwrap_or(""))
            .arg(&options.dead_letter_suffix)
            .arg(self.keys.unreadable_stream(shard))
            .arg(options.default_maxlen)
            .arg(if self.is_cluster() { "cluster" } else { "" })
            .arg(budgets.len());
        for (stream, budget) in budgets {
            inv.arg(stream).arg(*budget);
        }
        for (stream, maxlen) in &options.maxlen {
            inv.arg(stream).arg(*maxlen);
        }
        let reply: Value = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let next_due = int_signed_at(&items, 3)?;
        let lateness = array(items.get(5).cloned().unwrap_or(Value::Nil))?
            .iter()
            .map(|v| int(v).map(|n| n.max(0) as u64))
            .collect::<Result<Vec<_>>>()?;
        Ok(ForwardBatch {
            forwarded: int_at(&items, 0)?,
            expired: int_at(&items, 1)?,
            dead: int_at(&items, 2)?,
            next_due_ms: (next_due >= 0).then_some(next_due as u64),
            now_us: int_at(&items, 4)?
                .saturating_mul(1000)
                .saturating_add(int_at(&items, 11)?.min(999)),
            lateness_ms: lateness,
            per_stream: stream_counts(items.get(6))?,
            parked: int_at(&items, 7)?,
            held_back: items
                .get(8)
                .map(text)
                .transpose()?
                .filter(|e| !e.is_empty()),
            newly_held: int_at(&items, 9)?,
            holding: stream_counts(items.get(10))?,
        })
    }

    /// Forgets terminal records of a shard whose retention has passed, looking at about
    /// `limit` of them (a forward batch's records expire together and are taken whole).
    pub async fn trim_records(&self, shard: u16, epoch: u64, limit: usize) -> Result<Trimmed> {
        let k = self.keys.shard(shard);
        let (forgotten, looked_at): (u64, u64) = self
            .scripts
            .trim
            .key(&k.records)
            .key(&k.records_by_expiry)
            .key(&k.fence)
            .arg(epoch)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(Trimmed {
            forgotten,
            looked_at,
        })
    }

    /// Raises every owned shard's fence to `epoch`, so that an older leader is refused from
    /// its next script call on. Fails with `Fenced` if a newer leader got there first.
    pub async fn raise_fences(&self, epoch: u64) -> Result<()> {
        // All at once: the calls share the connection's pipeline (and go to each
        // shard's master on a cluster), so a takeover waits one round trip, not one
        // a shard.
        let raises = self
            .owned_in_use()
            .await?
            .into_iter()
            .map(|shard| self.raise_fence(shard, epoch));
        futures::future::try_join_all(raises).await?;
        Ok(())
    }

    /// Raises one shard's fence to `epoch` (see [`Store::raise_fences`]).
    pub async fn raise_fence(&self, shard: u16, epoch: u64) -> Result<()> {
        let k = self.keys.shard(shard);
        let _: u64 = self
            .scripts
            .raise_fence
            .key(&k.fence)
            .arg(epoch)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(())
    }

    /// Each shard in use and its fence (0: never raised).
    pub async fn fences(&self) -> Result<Vec<(u16, u64)>> {
        let shards = self.shards_in_use().await?;
        let gets = shards.iter().map(|&shard| {
            let mut get = redis::cmd("GET");
            get.arg(self.keys.shard(shard).fence);
            get
        });
        let fences: Vec<Option<u64>> = self.query_each(gets.collect()).await?;
        Ok(shards
            .into_iter()
            .zip(fences)
            .map(|(s, f)| (s, f.unwrap_or(0)))
            .collect())
    }

    /// The highest fence over all shards (0 if none was ever raised).
    pub async fn highest_fence(&self) -> Result<u64> {
        Ok(self
            .fences()
            .await?
            .into_iter()
            .map(|(_, f)| f)
            .max()
            .unwrap_or(0))
    }

    /// Sets every shard's fence to `epoch`, downwards too. For operators after an etcd
    /// cluster was rebuilt from scratch (its revisions, and so epochs, restart low).
    pub async fn reset_fences(&self, epoch: u64) -> Result<()> {
        let sets = self.shards_in_use().await?.into_iter().map(|shard| {
            let mut set = redis::cmd("SET");
            set.arg(self.keys.shard(shard).fence).arg(epoch);
            set
        });
        let _: Vec<Value> = self.query_each(sets.collect()).await?;
        Ok(())
    }

    /// Each of `cmds`' replies, in order: one pipeline on a standalone Redis; on
    /// Redis Cluster (where a pipeline must stay in one slot) the commands at once,
    /// each to its own slot's master.
    async fn query_each<T: redis::FromRedisValue>(&self, cmds: Vec<redis::Cmd>) -> Result<Vec<T>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        if !self.is_cluster() {
            let mut pipe = redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            return Ok(pipe.query_async(&mut self.conn.clone()).await?);
        }
        let calls = cmds.into_iter().map(|cmd| {
            let mut conn = self.conn.clone();
            async move { cmd.query_async::<T>(&mut conn).await }
        });
        Ok(futures::future::try_join_all(calls).await?)
    }

    /// A fresh epoch for an instance that leads without etcd. It exceeds every
    /// epoch handed out before, so the newest standalone instance fences out older ones,
    /// and `above` (an epoch this instance held before the master moved: the new
    /// master may have lost the writes that raised the fences to it).
    pub async fn next_standalone_epoch(&self, above: u64) -> Result<u64> {
        let mut conn = self.conn.clone();
        let floor = self.highest_fence().await?.max(above);
        let key = self.keys.standalone_epoch();
        let mut epoch: u64 = conn.incr(&key, 1).await?;
        if epoch <= floor {
            epoch = conn.incr(&key, floor + 1 - epoch).await?;
        }
        Ok(epoch)
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
    pub(crate) async fn blocking_connection(&self) -> Result<conn::Separate> {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self.conn.separate_any(&config).await?)
    }
}

/// An invocation of `script` with a shard's keys in the order every script that
/// A script's `{ stream, count, stream, count, ... }` list (absent: empty).
fn stream_counts(list: Option<&Value>) -> Result<Vec<(String, u64)>> {
    let items = array(list.cloned().unwrap_or(Value::Nil))?;
    let mut counts = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        if let [stream, count] = pair {
            counts.push((text(stream)?, int(count)? as u64));
        }
    }
    Ok(counts)
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
