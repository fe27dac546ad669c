//! Read-only views for operators: what is scheduled, where to, and when next.

use std::collections::BTreeMap;

use redis::Value;

use super::reply::bytes;
use super::scripts::Lua;
use super::{Result, Store, StoreError, array, int, text};

/// Bodies looked at per `pending_streams.lua` call.
const SCAN_STEP: usize = 1000;

/// Compact buckets looked at per call of a counting script (`pending_count.lua`,
/// `due_histogram.lua`): up to 8,192 messages, about 0.3 ms of Redis. A backlog of
/// millions is counted in many short calls, with other clients' commands between
/// them, where one call a shard held Redis for its whole length (a shard of 625,000
/// due messages, about 30 ms; the shards' calls queued back to back, about 0.5 s).
const COUNT_STEP: usize = 64;

/// Scheduled messages counted by target stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamCounts {
    pub per_stream: BTreeMap<String, u64>,
    /// Of those, the messages due at or before the call's `soon_ms`.
    pub due_soon: BTreeMap<String, u64>,
    /// False when the count stopped at its limit before seeing every message.
    pub exact: bool,
}

/// Messages held back by their stream's rate limit (`streams.max_rate`): due, and
/// waiting in their stream's held set (which also keeps, until they are due, the
/// messages pushed to a stream kept apart: those are not counted here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldBack {
    /// Per shard in use (see `Store::shards_in_use`), in order.
    pub per_shard: Vec<(u16, u64)>,
    pub per_stream: BTreeMap<String, u64>,
    /// Due time of the earliest held message.
    pub earliest_due_ms: Option<u64>,
}

impl HeldBack {
    pub fn total(&self) -> u64 {
        self.per_shard.iter().map(|(_, n)| n).sum()
    }
}

/// What is scheduled over all shards, held messages included (see
/// [`Store::pending_report`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingReport {
    /// Per shard in use (see [`Store::shards_in_use`]), in shard order.
    pub per_shard: Vec<(u16, u64)>,
    /// Of those, the messages due at or before the report's `now_ms`.
    pub due: u64,
    /// Due time of the earliest.
    pub earliest_due_ms: Option<u64>,
    /// Of the due ones, those held back by their stream's rate limit.
    pub held: HeldBack,
}

/// One shard's scheduled messages (see `pending_count.lua`).
pub(super) struct ShardPending {
    pub(super) shard: u16,
    pub(super) scheduled: u64,
    pub(super) due: u64,
    pub(super) earliest_due_ms: Option<u64>,
}

impl Store {
    /// What every shard holds back for its streams' rate limits now (Redis's clock).
    pub async fn held(&self) -> Result<HeldBack> {
        let (shards, now_ms) = tokio::try_join!(self.shards_in_use(), self.now_ms())?;
        self.held_in(&shards, now_ms).await
    }

    /// What `shards` hold back for their streams' rate limits: their held sets'
    /// messages due at or before `now_ms`.
    async fn held_in(&self, shards: &[u16], now_ms: u64) -> Result<HeldBack> {
        let mut held = HeldBack {
            per_shard: shards.iter().map(|&s| (s, 0)).collect(),
            ..HeldBack::default()
        };
        if shards.is_empty() {
            return Ok(held);
        }
        let members = shards.iter().map(|&shard| {
            let mut cmd = redis::cmd("SMEMBERS");
            cmd.arg(self.keys.shard(shard).held);
            cmd
        });
        let streams: Vec<Vec<String>> = self.query_each(members.collect()).await?;
        let mut cmds = Vec::new();
        let mut slots = Vec::new();
        for (i, names) in streams.iter().enumerate() {
            let k = self.keys.shard(shards[i]);
            for stream in names {
                let key = k.held_of(stream);
                // Scores are due_ms * 10 + (9 - priority): every priority of now_ms.
                let max = now_ms.saturating_mul(10).saturating_add(9);
                let mut count = redis::cmd("ZCOUNT");
                count.arg(&key).arg("-inf").arg(max);
                let mut first = redis::cmd("ZRANGE");
                first.arg(&key).arg(0).arg(0).arg("WITHSCORES");
                cmds.push(count);
                cmds.push(first);
                slots.push((i, stream));
            }
        }
        if slots.is_empty() {
            return Ok(held);
        }
        let replies: Vec<Value> = self.query_each(cmds).await?;
        for ((shard, stream), pair) in slots.into_iter().zip(replies.chunks(2)) {
            let n = int(&pair[0])?.max(0) as u64;
            held.per_shard[shard].1 += n;
            *held.per_stream.entry(stream.clone()).or_default() += n;
            if let Some(due) = earliest_of(pair[1].clone())?.filter(|&due| due <= now_ms) {
                held.earliest_due_ms = Some(held.earliest_due_ms.map_or(due, |e| e.min(due)));
            }
        }
        Ok(held)
    }

    /// What each of `shards` has scheduled, in both pending layouts and the held
    /// sets: `due` counts the messages due at or before `now_ms` (Redis's clock).
    async fn shard_pending(&self, shards: &[u16], now_ms: u64) -> Result<Vec<ShardPending>> {
        let calls = shards.iter().map(|&shard| async move {
            let mut pending = ShardPending {
                shard,
                scheduled: 0,
                due: 0,
                earliest_due_ms: None,
            };
            // Scores are due_ms * 10 + (9 - priority): every priority of now_ms.
            let script = &self.scripts.pending_count;
            self.walk_buckets(script, shard, &[now_ms * 10 + 9], |items| {
                let at = |i: usize| items.get(i).map_or(Ok(0), int);
                pending.scheduled += at(0)?.max(0) as u64;
                pending.due += at(1)?.max(0) as u64;
                let earliest = at(2)?;
                if earliest >= 0 {
                    pending.earliest_due_ms = Some(earliest as u64 / 10);
                }
                Ok(())
            })
            .await?;
            Ok(pending)
        });
        futures::future::try_join_all(calls).await
    }

    /// Walks one shard's compact buckets with a counting script (`pending_count.lua`,
    /// `due_histogram.lua`: KEYS the due set, the bodies and the held streams; ARGV the cursor, the
    /// step, then `args`; the reply's last value the next cursor), [`COUNT_STEP`]
    /// buckets a call until the cursor comes back empty, handing each reply's values
    /// before the cursor to `each`.
    pub(super) async fn walk_buckets(
        &self,
        script: &Lua,
        shard: u16,
        args: &[u64],
        mut each: impl FnMut(&[Value]) -> Result<()>,
    ) -> Result<()> {
        let k = self.keys.shard(shard);
        let mut conn = self.conn.clone();
        let mut from = b"-".to_vec();
        loop {
            let reply: Value = script
                .key(&k.due)
                .key(&k.bodies)
                .key(&k.held)
                .arg(&from)
                .arg(COUNT_STEP)
                .arg(args)
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::from_script)?;
            let mut items = array(reply)?;
            let cursor = items
                .pop()
                .ok_or_else(|| StoreError::Reply("a counting script replied nothing".into()))?;
            each(&items)?;
            from = bytes(&cursor)?;
            if from.is_empty() {
                return Ok(());
            }
        }
    }

    /// What is scheduled, with `now_ms` (Redis's clock) as the bound of what is due:
    /// one walk of the shards and one read of the held sets for all three counts.
    pub async fn pending_report(&self, now_ms: u64) -> Result<PendingReport> {
        let in_use = self.shards_in_use().await?;
        let (shards, held) = tokio::try_join!(
            self.shard_pending(&in_use, now_ms),
            self.held_in(&in_use, now_ms)
        )?;
        Ok(PendingReport {
            per_shard: shards.iter().map(|s| (s.shard, s.scheduled)).collect(),
            due: shards.iter().map(|s| s.due).sum::<u64>(),
            earliest_due_ms: shards.iter().filter_map(|s| s.earliest_due_ms).min(),
            held,
        })
    }

    /// Messages scheduled, per shard in use (see [`Store::shards_in_use`]), held
    /// ones included: (shard, count) in shard order.
    pub async fn pending_per_shard(&self) -> Result<Vec<(u16, u64)>> {
        Ok(self.pending_report(0).await?.per_shard)
    }

    /// Due time of the earliest scheduled message, over all shards, held ones
    /// included.
    pub async fn earliest_scheduled_ms(&self) -> Result<Option<u64>> {
        let shards = self.shard_pending(&self.shards_in_use().await?, 0).await?;
        Ok(shards.iter().filter_map(|s| s.earliest_due_ms).min())
    }

    /// Scheduled messages per target stream, looking at no more than `limit` of them
    /// (a scan in small steps, so Redis is never held for long). Messages whose body
    /// cannot be read count under "".
    /// `due_soon` counts those due at or before `soon_ms` (0: none asked).
    pub async fn pending_per_stream(&self, limit: usize, soon_ms: u64) -> Result<StreamCounts> {
        let shards = self.shards_in_use().await?;
        self.pending_per_stream_in(&shards, limit, soon_ms).await
    }

    /// [`Store::pending_per_stream`] over `shards` alone (a caller that has just
    /// counted the shards leaves out those with nothing scheduled: two calls each).
    pub async fn pending_per_stream_in(
        &self,
        shards: &[u16],
        limit: usize,
        soon_ms: u64,
    ) -> Result<StreamCounts> {
        let mut counts = StreamCounts {
            per_stream: BTreeMap::new(),
            due_soon: BTreeMap::new(),
            exact: true,
        };
        let mut seen = 0usize;
        'shards: for &shard in shards {
            let k = self.keys.shard(shard);
            let mut cursor = "0".to_owned();
            loop {
                if seen >= limit {
                    counts.exact = false;
                    break 'shards;
                }
                let reply: Value = self
                    .scripts
                    .pending_streams
                    .key(&k.bodies)
                    .key(&k.due)
                    .arg(&cursor)
                    .arg(SCAN_STEP)
                    .arg(soon_ms.saturating_mul(10).saturating_add(9))
                    .invoke_async(&mut self.conn.clone())
                    .await
                    .map_err(StoreError::from_script)?;
                let mut parts = array(reply)?.into_iter();
                cursor = text(&parts.next().unwrap_or(Value::Nil))?;
                seen += int(&parts.next().unwrap_or(Value::Nil))?.max(0) as usize;
                let flat = array(parts.next().unwrap_or(Value::Nil))?;
                for triple in flat.chunks(3) {
                    if let [stream, n, soon] = triple {
                        let stream = text(stream)?;
                        *counts.due_soon.entry(stream.clone()).or_default() +=
                            int(soon)?.max(0) as u64;
                        *counts.per_stream.entry(stream).or_default() += int(n)?.max(0) as u64;
                    }
                }
                if cursor == "0" {
                    break;
                }
            }
        }
        Ok(counts)
    }
}

/// The due time in a `ZRANGE key 0 0 WITHSCORES` reply of a due or held set (None
/// when the set is empty).
fn earliest_of(reply: Value) -> Result<Option<u64>> {
    let items = array(reply)?;
    let Some(score) = items.get(1) else {
        return Ok(None);
    };
    let score: f64 = text(score)?
        .parse()
        .map_err(|_| StoreError::Reply(format!("due score {score:?} is not a number")))?;
    Ok(Some((score / 10.0).floor() as u64))
}
