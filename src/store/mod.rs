//! The only module that speaks Redis.
//!
//! Every change to delayq's data happens inside one of the Lua scripts in `lua/`,
//! so each operation is atomic on the Redis server. This module builds their keys
//! and arguments and turns their replies into types.

mod batch;
mod inbox;
mod keys;
mod stats;
mod streams;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, RedisError, Script, ScriptInvocation, Value};
use thiserror::Error;

pub use batch::{BatchItem, InboxAck};
pub use inbox::{
    CopyLimit, InboxEntry, InboxQueue, InboxReader, InboxStats, MAX_COPIED_PAIRS, Rejection,
};
pub use keys::{Keys, ShardKeys};
pub use stats::StreamCounts;
pub use streams::StreamEntry;

use crate::message::{Due, MessageId, NewMessage};
use crate::secret::RedisUrl;

macro_rules! script {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("lua/prelude.lua"),
            "\n",
            include_str!(concat!("lua/", $name, ".lua"))
        ))
    };
}

mod delivery;

pub use delivery::{
    DEAD_LETTER_FIELDS, DeadLetter, PendingEntry, RedeliverOptions, Redelivered, Replayed,
    split_own_fields,
};

/// The scripts, compiled into the binary and loaded lazily (`EVALSHA`, then
/// `SCRIPT LOAD` on `NOSCRIPT`, which also covers a Redis restart or `SCRIPT FLUSH`).
struct Scripts {
    schedule: Script,
    reschedule: Script,
    cancel: Script,
    get: Script,
    forward: Script,
    trim: Script,
    raise_fence: Script,
    redeliver: Script,
    replay_dead: Script,
    schedule_batch: Script,
    reject_inbox: Script,
    pending_streams: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            schedule: script!("schedule"),
            reschedule: script!("reschedule"),
            cancel: script!("cancel"),
            get: script!("get"),
            forward: script!("forward"),
            trim: script!("trim"),
            raise_fence: script!("raise_fence"),
            redeliver: script!("redeliver"),
            replay_dead: script!("replay_dead"),
            schedule_batch: script!("schedule_batch"),
            reject_inbox: script!("reject_inbox"),
            pending_streams: script!("pending_streams"),
        }
    }
}

/// How to reach Redis and lay out keys.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub url: RedisUrl,
    pub prefix: String,
    pub shards: u16,
    /// A reply slower than this fails the command (the connection is then re-established).
    pub response_timeout: Duration,
    pub connect_timeout: Duration,
    /// Most blocking stream reads (HTTP long polls) at once, each on a connection of its own.
    pub max_blocking_reads: usize,
}

/// A handle on delayq's Redis data. Cheap to clone: clones share one multiplexed connection.
#[derive(Clone)]
pub struct Store {
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keys,
    scripts: Arc<Scripts>,
    response_timeout: Duration,
    /// Connections for blocking reads on behalf of HTTP consumers.
    polls: Arc<streams::PollPool>,
}

#[derive(Clone, Debug, Error)]
pub enum StoreError {
    /// A newer leader has raised the shard's fence: this caller must stop leading.
    #[error("fenced: epoch {caller} is below the fence {held}")]
    Fenced { held: u64, caller: u64 },
    #[error("{0}")]
    TooFar(String),
    #[error("{0}")]
    Corrupt(String),
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
    /// Too many blocking reads are waiting already; retry later.
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Redis(#[from] RedisError),
}

impl StoreError {
    fn from_script(e: RedisError) -> Self {
        let detail = e.detail().unwrap_or_default().to_owned();
        match e.code() {
            Some("FENCED") => {
                let numbers: Vec<u64> = detail
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                match numbers[..] {
                    [caller, held] => StoreError::Fenced { held, caller },
                    _ => StoreError::Reply(format!("FENCED {detail}")),
                }
            }
            Some("TOO_FAR") => StoreError::TooFar(detail),
            Some("CORRUPT") => StoreError::Corrupt(detail),
            _ => StoreError::Redis(e),
        }
    }

    /// Redis's error reply as Redis wrote it (`READONLY You can't write…`, `OOM …`,
    /// `MISCONF …`) when it answered with one: it is up, but refused. None when it
    /// did not answer at all.
    pub fn refusal(&self) -> Option<String> {
        match self {
            StoreError::Redis(e) => {
                let code = e.code()?;
                Some(format!("{code} {}", e.detail().unwrap_or_default()))
            }
            _ => None,
        }
    }

    /// Whether retrying later may help (Redis down or slow) rather than the request being wrong.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Redis(_) | StoreError::Busy(_))
    }

    /// Whether the error says Redis does not take this call now (connection lost or
    /// refused, no answer in time, or a reply refusing work for a while: READONLY,
    /// OOM, MISCONF, LOADING, BUSY, ...) rather than that the call itself fails. A
    /// transient error is retried; any other one is the fault of what the call
    /// carried. A fence is neither: callers that can be fenced handle it first.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Busy(_) => true,
            StoreError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.code().is_some_and(|code| TRANSIENT_CODES.contains(&code))
            }
            StoreError::Fenced { .. }
            | StoreError::TooFar(_)
            | StoreError::Corrupt(_)
            | StoreError::Reply(_) => false,
        }
    }
}

/// Error replies by which Redis says it takes no writes (or no calls) for now.
const TRANSIENT_CODES: &[&str] = &[
    "READONLY",
    "OOM",
    "MISCONF",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleMode {
    /// An id that exists already is a duplicate and nothing changes.
    New,
    /// An id that exists already is overwritten and scheduled again.
    Replace,
}

impl ScheduleMode {
    /// The word the schedule scripts take for this mode.
    fn as_arg(self) -> &'static str {
        match self {
            ScheduleMode::New => "new",
            ScheduleMode::Replace => "replace",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheduled {
    Scheduled {
        due_ms: u64,
    },
    Replaced {
        due_ms: u64,
    },
    /// The id is known already; `due_ms` is set while it is still scheduled.
    Duplicate {
        due_ms: Option<u64>,
        state: String,
    },
}

impl Scheduled {
    /// Reads a schedule script's answer for one message: its status, due time and,
    /// for a duplicate only, the state it is in (`state` is not called otherwise).
    /// None for a status the scripts do not give.
    fn from_reply(
        status: &str,
        due: u64,
        state: impl FnOnce() -> Result<String>,
    ) -> Result<Option<Scheduled>> {
        Ok(Some(match status {
            "scheduled" => Scheduled::Scheduled { due_ms: due },
            "replaced" => Scheduled::Replaced { due_ms: due },
            "duplicate" => Scheduled::Duplicate {
                due_ms: (due > 0).then_some(due),
                state: state()?,
            },
            _ => return Ok(None),
        }))
    }
}

/// Final states, kept on record for the retention window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    Delivered,
    Expired,
    Dead,
    Cancelled,
}

impl RecordState {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "delivered" => RecordState::Delivered,
            "expired" => RecordState::Expired,
            "dead" => RecordState::Dead,
            "cancelled" => RecordState::Cancelled,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Delivered => "delivered",
            RecordState::Expired => "expired",
            RecordState::Dead => "dead",
            RecordState::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledMessage {
    pub stream: String,
    pub due_ms: u64,
    pub priority: u8,
    pub created_ms: u64,
    pub attempt: u64,
    pub expire_at_ms: Option<u64>,
    pub fields: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub state: RecordState,
    /// The stream written to: the target, its dead-letter stream, or none for a cancellation.
    pub stream: Option<String>,
    pub entry_id: Option<String>,
    pub at_ms: u64,
    pub attempt: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Scheduled(ScheduledMessage),
    Done(Record),
    /// The body is in Redis but cannot be read; the forwarder will dead-letter it.
    Corrupt(String),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    Cancelled,
    AlreadyDone(RecordState),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rescheduled {
    Rescheduled { due_ms: u64 },
    NotScheduled(RecordState),
    Unknown,
}

/// What a forward call does besides moving messages; fixed for a run.
#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub batch_size: usize,
    pub retention: Duration,
    /// Field added to every forwarded entry with the message id (None = not added).
    pub id_field: Option<String>,
    /// Field added to every forwarded entry with the delivery attempt (None = not added).
    pub attempt_field: Option<String>,
    pub dead_letter_suffix: String,
    /// `MAXLEN ~` applied to every target stream (0 = none) unless overridden per stream.
    pub default_maxlen: u64,
    pub maxlen: Vec<(String, u64)>,
}

/// What one forward call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    pub forwarded: u64,
    pub expired: u64,
    pub dead: u64,
    /// Due time of the shard's earliest remaining message.
    pub next_due_ms: Option<u64>,
    /// Redis's clock when the batch was taken.
    pub now_ms: u64,
    /// Forward time minus due time of each forwarded message, by Redis's clock.
    pub lateness_ms: Vec<u64>,
    pub per_stream: Vec<(String, u64)>,
    /// Messages kept for later because neither their stream nor their dead-letter
    /// stream takes them (both refuse for reasons of their own, e.g. a wrong type).
    pub parked: u64,
    /// The Redis error that stopped the batch part-way (OOM, READONLY, ...): the
    /// messages before it were moved, it and the rest stay scheduled.
    pub held_back: Option<String>,
}

impl ForwardBatch {
    pub fn moved(&self) -> u64 {
        self.forwarded + self.expired + self.dead
    }
}

/// What one trim call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub forgotten: u64,
    /// Record ids whose retention had passed, forgotten or not (an id recorded again
    /// since keeps its newer record).
    pub looked_at: u64,
}

impl Store {
    /// Connects (failing fast if Redis is unreachable now; later outages are retried).
    pub async fn connect(config: &StoreConfig) -> Result<Store> {
        let client = redis::Client::open(config.url.expose())?;
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config).await?;
        Ok(Store {
            client,
            conn,
            keys: Keys::new(&config.prefix, config.shards),
            scripts: Arc::new(Scripts::new()),
            response_timeout: config.response_timeout,
            polls: Arc::new(streams::PollPool::new(config.max_blocking_reads)),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn shards(&self) -> u16 {
        self.keys.shards()
    }

    fn shard_keys(&self, id: &MessageId) -> ShardKeys {
        self.keys.shard(id.shard(self.keys.shards()))
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
            .arg(60_000)
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

    /// Stores a message. `max_delay` bounds how far from Redis's now it may be due.
    pub async fn schedule(
        &self,
        msg: &NewMessage,
        mode: ScheduleMode,
        max_delay: Duration,
    ) -> Result<Scheduled> {
        let k = self.shard_keys(&msg.id);
        let (kind, value) = due_args(msg.due);
        let mut inv = shard_invocation(&self.scripts.schedule, &k);
        inv.arg(0)
            .arg(msg.id.as_str())
            .arg(mode.as_arg())
            .arg(kind)
            .arg(value)
            .arg(max_delay.as_millis() as u64)
            .arg(msg.priority)
            .arg(msg.ttl.map_or(0, |t| t.as_millis() as u64))
            .arg(&msg.stream)
            .arg(self.keys.wake_channel());
        push_fields(&mut inv, &msg.fields);
        let reply: Value = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let status = string_at(&items, 0)?;
        let due = int_at(&items, 1)?;
        Scheduled::from_reply(&status, due, || string_at(&items, 2))?
            .ok_or_else(|| StoreError::Reply(format!("schedule said {status:?}")))
    }

    pub async fn get(&self, id: &MessageId) -> Result<Status> {
        let k = self.shard_keys(id);
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
                let rest = &items[7.min(items.len())..];
                let mut fields = Vec::with_capacity(rest.len() / 2);
                for pair in rest.chunks(2) {
                    if let [name, value] = pair {
                        fields.push((text(name)?, text(value)?));
                    }
                }
                let expire_at = int_at(&items, 6)?;
                Status::Scheduled(ScheduledMessage {
                    stream: string_at(&items, 1)?,
                    due_ms: int_at(&items, 2)?,
                    priority: int_at(&items, 3)? as u8,
                    created_ms: int_at(&items, 4)?,
                    attempt: int_at(&items, 5)?,
                    expire_at_ms: (expire_at > 0).then_some(expire_at),
                    fields,
                })
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
        let k = self.shard_keys(id);
        let reply: String = shard_invocation(&self.scripts.cancel, &k)
            .arg(0)
            .arg(id.as_str())
            .arg(retention.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(match reply.as_str() {
            "cancelled" => Cancelled::Cancelled,
            "unknown" => Cancelled::Unknown,
            other => Cancelled::AlreadyDone(
                RecordState::parse(other)
                    .ok_or_else(|| StoreError::Reply(format!("cancel said {other:?}")))?,
            ),
        })
    }

    pub async fn reschedule(
        &self,
        id: &MessageId,
        due: Due,
        max_delay: Duration,
    ) -> Result<Rescheduled> {
        let k = self.shard_keys(id);
        let (kind, value) = due_args(due);
        let reply: Value = self
            .scripts
            .reschedule
            .key(&k.due)
            .key(&k.bodies)
            .key(&k.records)
            .key(&k.fence)
            .arg(0)
            .arg(id.as_str())
            .arg(kind)
            .arg(value)
            .arg(max_delay.as_millis() as u64)
            .arg(self.keys.wake_channel())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let state = string_at(&items, 0)?;
        Ok(match state.as_str() {
            "rescheduled" => Rescheduled::Rescheduled {
                due_ms: int_at(&items, 1)?,
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
        let k = self.keys.shard(shard);
        let mut inv = shard_invocation(&self.scripts.forward, &k);
        inv.arg(epoch)
            .arg(options.batch_size)
            .arg(options.retention.as_millis() as u64)
            .arg(options.id_field.as_deref().unwrap_or(""))
            .arg(options.attempt_field.as_deref().unwrap_or(""))
            .arg(&options.dead_letter_suffix)
            .arg(self.keys.unreadable_stream())
            .arg(options.default_maxlen);
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
        let counts = array(items.get(6).cloned().unwrap_or(Value::Nil))?;
        let mut per_stream = Vec::with_capacity(counts.len() / 2);
        for pair in counts.chunks(2) {
            if let [stream, count] = pair {
                per_stream.push((text(stream)?, int(count)? as u64));
            }
        }
        Ok(ForwardBatch {
            forwarded: int_at(&items, 0)?,
            expired: int_at(&items, 1)?,
            dead: int_at(&items, 2)?,
            next_due_ms: (next_due >= 0).then_some(next_due as u64),
            now_ms: int_at(&items, 4)?,
            lateness_ms: lateness,
            per_stream,
            parked: int_at(&items, 7)?,
            held_back: items
                .get(8)
                .map(text)
                .transpose()?
                .filter(|e| !e.is_empty()),
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

    /// Raises every shard's fence to `epoch`, so that an older leader is refused from
    /// its next script call on. Fails with `Fenced` if a newer leader got there first.
    pub async fn raise_fences(&self, epoch: u64) -> Result<()> {
        for shard in 0..self.keys.shards() {
            let k = self.keys.shard(shard);
            let _: u64 = self
                .scripts
                .raise_fence
                .key(&k.fence)
                .arg(epoch)
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(StoreError::from_script)?;
        }
        Ok(())
    }

    /// The highest fence over all shards (0 if none was ever raised).
    pub async fn highest_fence(&self) -> Result<u64> {
        let mut pipe = redis::pipe();
        for shard in 0..self.keys.shards() {
            pipe.get(self.keys.shard(shard).fence);
        }
        let fences: Vec<Option<u64>> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(fences.into_iter().flatten().max().unwrap_or(0))
    }

    /// Sets every shard's fence to `epoch`, downwards too. For operators after an etcd
    /// cluster was rebuilt from scratch (its revisions, and so epochs, restart low).
    pub async fn reset_fences(&self, epoch: u64) -> Result<()> {
        let mut pipe = redis::pipe();
        for shard in 0..self.keys.shards() {
            pipe.set(self.keys.shard(shard).fence, epoch).ignore();
        }
        let () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// A fresh epoch for an instance that leads without etcd. It exceeds every
    /// epoch handed out before, so the newest standalone instance fences out older ones.
    pub async fn next_standalone_epoch(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let floor = self.highest_fence().await?;
        let key = self.keys.standalone_epoch();
        let mut epoch: u64 = conn.incr(&key, 1).await?;
        if epoch <= floor {
            epoch = conn.incr(&key, floor + 1 - epoch).await?;
        }
        Ok(epoch)
    }

    /// Messages scheduled, per shard.
    pub async fn pending_per_shard(&self) -> Result<Vec<u64>> {
        let mut pipe = redis::pipe();
        for shard in 0..self.keys.shards() {
            pipe.zcard(self.keys.shard(shard).due);
        }
        Ok(pipe.query_async(&mut self.conn.clone()).await?)
    }

    /// Shards whose earliest message just changed, as the schedule script announces
    /// them. The stream ends when the subscription's connection is lost.
    pub async fn wakeups(&self) -> Result<impl Stream<Item = u16> + use<>> {
        let mut pubsub = self.client.get_async_pubsub().await?;
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
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }
}

/// An invocation of `script` with a shard's keys in the order every script that
/// changes a shard lists them in its contract: due set, bodies, records, records by
/// expiry, fence.
fn shard_invocation<'a>(script: &'a Script, k: &ShardKeys) -> ScriptInvocation<'a> {
    let mut inv = script.prepare_invoke();
    inv.key(&k.due)
        .key(&k.bodies)
        .key(&k.records)
        .key(&k.records_by_expiry)
        .key(&k.fence);
    inv
}

/// A message's fields as the schedule scripts take them: name, value, name, value, ...
fn push_fields(inv: &mut ScriptInvocation<'_>, fields: &[(String, String)]) {
    for (field, value) in fields {
        inv.arg(field).arg(value);
    }
}

fn due_args(due: Due) -> (&'static str, u64) {
    match due {
        Due::In(_) => ("in", due.as_ms()),
        Due::At(_) => ("at", due.as_ms()),
    }
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(StoreError::Reply(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn text(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Reply(format!("expected a number, got {b:?}"))),
        other => Err(StoreError::Reply(format!(
            "expected a number, got {other:?}"
        ))),
    }
}

fn string_at(items: &[Value], i: usize) -> Result<String> {
    text(items.get(i).unwrap_or(&Value::Nil))
}

fn int_signed_at(items: &[Value], i: usize) -> Result<i64> {
    int(items.get(i).unwrap_or(&Value::Nil))
}

fn int_at(items: &[Value], i: usize) -> Result<u64> {
    Ok(int_signed_at(items, i)?.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(error: StoreError, transient: bool) {
        assert_eq!(error.is_transient(), transient, "{error:?}");
    }

    fn reply(code: &str, detail: &str) -> StoreError {
        StoreError::Redis(redis::make_extension_error(
            code.to_owned(),
            Some(detail.to_owned()),
        ))
    }

    fn io(kind: std::io::ErrorKind) -> StoreError {
        StoreError::Redis(std::io::Error::new(kind, "test").into())
    }

    #[test]
    #[rustfmt::skip]
    fn transient_errors_are_those_of_redis_not_taking_calls_now() {
        check(io(std::io::ErrorKind::ConnectionReset), true);
        check(io(std::io::ErrorKind::ConnectionRefused), true);
        check(io(std::io::ErrorKind::TimedOut), true);
        check(StoreError::Redis(RedisError::from((redis::ErrorKind::Io, "timed out", "no answer".to_owned()))), true);
        check(reply("READONLY", "You can't write against a read only replica."), true);
        check(reply("OOM", "command not allowed when used memory > 'maxmemory'."), true);
        check(reply("MISCONF", "Redis is configured to save RDB snapshots"), true);
        check(reply("LOADING", "Redis is loading the dataset in memory"), true);
        check(reply("BUSY", "Redis is busy running a script."), true);
        check(reply("MASTERDOWN", "Link with MASTER is down"), true);
        check(StoreError::Busy("too many long polls".into()), true);
        check(reply("ERR", "user_script:1: too many results to unpack"), false);
        check(reply("WRONGTYPE", "Operation against a key holding the wrong kind of value"), false);
        check(reply("DEADLETTER", "cannot write to s:dead: WRONGTYPE"), false);
        check(StoreError::Reply("expected an array".into()), false);
        check(StoreError::Corrupt("undecodable body".into()), false);
        check(StoreError::TooFar("due time".into()), false);
        check(StoreError::Fenced { held: 2, caller: 1 }, false);
    }
}
