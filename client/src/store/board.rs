//! What the dashboard and its endpoints read and keep beyond the messages: the node
//! registry, the leadership history, the forwarding samples, paused streams, and
//! read-only views of the pending messages (the due-time histogram, the next ones
//! due) and of target streams (consumer groups, lengths). Everything here is small
//! and bounded: the registry forgets a node a day after it was last seen, the
//! history keeps [`TERMS_KEPT`] terms, the samples [`SAMPLES_KEPT`], their
//! quarter-hour rollups [`ROLLUPS_KEPT`].

use std::collections::BTreeSet;

use redis::Value;
use serde::{Deserialize, Serialize};

use super::reply::{array, int, text};
use super::{Result, Store, StoreError};

/// Terms the leadership history keeps (the oldest go first).
pub const TERMS_KEPT: usize = 200;
/// Samples kept: 15 minutes of one leader's, one every 5 s, and room for a few
/// leaders at once (`election.mode = "per_shard"`).
pub const SAMPLES_KEPT: usize = 180 * 8;
/// Quarter-hour rollups of the samples kept: a day of one leader's, and room for a
/// few leaders at once.
pub const ROLLUPS_KEPT: usize = 96 * 8;
/// A node not seen for this long is dropped from the registry.
const NODE_FORGOTTEN_MS: u64 = 24 * 3_600_000;
/// Most messages one shard's upcoming call looks at per source.
const UPCOMING_BUDGET: u64 = 5_000;

/// A node as it last described itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    /// Its API address.
    pub address: String,
    pub version: String,
    pub started_at_ms: u64,
    pub last_seen_ms: u64,
    /// Whether it led (any election group) when it wrote this.
    pub leader: bool,
    /// The epoch it led with (the highest, over its groups).
    pub epoch: Option<u64>,
    /// It stopped in order (shutdown) at `last_seen_ms`.
    #[serde(default)]
    pub stopped: bool,
}

/// One leadership term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermRecord {
    pub node_id: String,
    pub epoch: u64,
    /// The election group (`election.mode = "per_shard"`), or none.
    pub group: Option<u16>,
    pub from_ms: u64,
    /// When it ended, if its leader said so (a crashed leader says nothing: the
    /// next term's start ends it).
    pub to_ms: Option<u64>,
    /// Why it ended, as its leader said.
    pub ended: Option<String>,
}

impl TermRecord {
    fn field(&self) -> String {
        let group = self.group.map_or("-".to_owned(), |g| g.to_string());
        format!("{group}:{:020}", self.epoch)
    }
}

/// A count of the pending messages per target stream, as the leader made it last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCountRecord {
    /// When it was counted (epoch ms, Redis's clock).
    pub at_ms: u64,
    /// False when the count stopped at its limit before seeing every message.
    pub exact: bool,
    /// Stream → (pending, due within the hour after `at_ms`).
    pub streams: std::collections::BTreeMap<String, (u64, u64)>,
}

/// The next pending messages: [`Store::upcoming`].
/// Scheduled messages by due-time class (see [`Store::due_histogram`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueClasses {
    /// One count per class: due by the first bound, by each next one, and later.
    pub counts: Vec<u64>,
    /// Due time of the earliest scheduled message.
    pub earliest_due_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upcoming {
    pub messages: Vec<UpcomingMessage>,
    /// Where the next page starts (score, id); None once every message was listed.
    pub next: Option<(u64, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpcomingMessage {
    /// The due score (due ms × 10 + 9 − priority).
    pub score: u64,
    pub id: String,
    pub stream: String,
    /// Waiting for its stream's rate limit, or its stream is paused.
    pub held: bool,
}

/// A consumer group of a target stream, as `XINFO GROUPS` tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    pub name: String,
    /// Entries not yet delivered to the group (None when Redis cannot tell).
    pub lag: Option<u64>,
    /// Entries delivered and not acknowledged.
    pub pending: u64,
}

impl Store {
    /// Writes this node's registry entry.
    pub async fn register_node(&self, node: &NodeRecord) -> Result<()> {
        let json = serde_json::to_string(node).expect("a node record serializes");
        let () = redis::cmd("HSET")
            .arg(self.keys.nodes())
            .arg(&node.node_id)
            .arg(json)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Every node in the registry, by id; forgets those not seen for a day
    /// (`now_ms`: the reader's clock, as the nodes write theirs).
    pub async fn nodes(&self, now_ms: u64) -> Result<Vec<NodeRecord>> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.nodes())
            .query_async(&mut self.conn.clone())
            .await?;
        let mut nodes = Vec::new();
        let mut forget = Vec::new();
        for (id, json) in all {
            match serde_json::from_str::<NodeRecord>(&json) {
                Ok(n) if now_ms.saturating_sub(n.last_seen_ms) < NODE_FORGOTTEN_MS => nodes.push(n),
                _ => forget.push(id),
            }
        }
        if !forget.is_empty() {
            let _: i64 = redis::cmd("HDEL")
                .arg(self.keys.nodes())
                .arg(&forget)
                .query_async(&mut self.conn.clone())
                .await?;
        }
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        Ok(nodes)
    }

    /// Writes a term (its start, or later its end), keeping the newest
    /// `TERMS_KEPT`.
    pub async fn record_term(&self, term: &TermRecord) -> Result<()> {
        let key = self.keys.terms();
        let json = serde_json::to_string(term).expect("a term record serializes");
        let (_, len): (i64, usize) = redis::pipe()
            .cmd("HSET")
            .arg(&key)
            .arg(term.field())
            .arg(json)
            .cmd("HLEN")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await?;
        if len > TERMS_KEPT {
            let terms = self.terms().await?;
            let old: Vec<String> = terms
                .iter()
                .skip(TERMS_KEPT)
                .map(TermRecord::field)
                .collect();
            if !old.is_empty() {
                let _: i64 = redis::cmd("HDEL")
                    .arg(&key)
                    .arg(old)
                    .query_async(&mut self.conn.clone())
                    .await?;
            }
        }
        Ok(())
    }

    /// The terms kept, newest first.
    pub async fn terms(&self) -> Result<Vec<TermRecord>> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.terms())
            .query_async(&mut self.conn.clone())
            .await?;
        let mut terms: Vec<TermRecord> = all
            .into_iter()
            .filter_map(|(_, json)| serde_json::from_str(&json).ok())
            .collect();
        terms.sort_by_key(|t| std::cmp::Reverse((t.from_ms, t.epoch)));
        Ok(terms)
    }

    /// Adds a forwarding sample (JSON, made by the caller), keeping `SAMPLES_KEPT`.
    pub async fn push_sample(&self, json: &str) -> Result<()> {
        self.push_kept(&self.keys.samples(), json, SAMPLES_KEPT)
            .await
    }

    /// Adds a quarter-hour rollup of one node's samples (JSON, made by the caller),
    /// keeping `ROLLUPS_KEPT`.
    pub async fn push_rollup(&self, json: &str) -> Result<()> {
        self.push_kept(&self.keys.rollups(), json, ROLLUPS_KEPT)
            .await
    }

    /// The rollups kept, newest first.
    pub async fn rollups(&self) -> Result<Vec<String>> {
        self.whole_list(&self.keys.rollups()).await
    }

    /// Every element of the list at `key`.
    async fn whole_list(&self, key: &str) -> Result<Vec<String>> {
        Ok(redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Pushes `json` onto the list at `key`, keeping its newest `kept`.
    async fn push_kept(&self, key: &str, json: &str, kept: usize) -> Result<()> {
        let () = redis::pipe()
            .cmd("LPUSH")
            .arg(key)
            .arg(json)
            .ignore()
            .cmd("LTRIM")
            .arg(key)
            .arg(0)
            .arg(kept - 1)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The samples kept, newest first.
    pub async fn samples(&self) -> Result<Vec<String>> {
        self.whole_list(&self.keys.samples()).await
    }

    /// Keeps the leader's last count of pending messages per stream.
    pub async fn save_stream_counts(&self, counts: &StreamCountRecord) -> Result<()> {
        let json = serde_json::to_string(counts).expect("a count serializes");
        let () = redis::cmd("SET")
            .arg(self.keys.stream_counts())
            .arg(json)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The leader's last count of pending messages per stream, if any.
    pub async fn stream_counts(&self) -> Result<Option<StreamCountRecord>> {
        let json: Option<String> = redis::cmd("GET")
            .arg(self.keys.stream_counts())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
    }

    /// The streams whose forwarding is paused.
    pub async fn paused(&self) -> Result<BTreeSet<String>> {
        Ok(redis::cmd("SMEMBERS")
            .arg(self.keys.paused())
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Pauses (true) or resumes forwarding to `stream`; returns whether that changed
    /// anything, Redis's time of the change (ms), and whether enough replicas
    /// confirmed it (`NotReplicated` when fewer than `redis.min_replicas_acked` did;
    /// the change is made either way). On Redis Cluster the stream's slot keeps a copy
    /// of its name too ([`ShardKeys::paused`](super::keys::ShardKeys::paused)), which a
    /// pause writes after the set and a resume takes out before it: whatever fails in
    /// between, a stream is never left paused in its slot while the set says it is not
    /// (the leader also reads the set every 250 ms and holds back what it names).
    pub async fn set_paused(&self, stream: &str, paused: bool) -> Result<(bool, u64, Result<()>)> {
        let mut copied = Ok(());
        if !paused {
            copied = self.set_slot_paused(stream, false).await?;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI")
            .cmd(if paused { "SADD" } else { "SREM" })
            .arg(self.keys.paused())
            .arg(stream)
            .cmd("TIME")
            .cmd("EXEC");
        // The replies of MULTI and the two queued commands are skipped: EXEC's is both.
        let (replies, acked) = self.query_acked(pipe, 3, 1).await?;
        let (changed, (secs, micros)): (i64, (u64, u64)) = redis::from_redis_value(
            replies
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::Reply("pause: no reply".into()))?,
        )
        .map_err(|e| StoreError::Reply(format!("pause: {e}")))?;
        if paused {
            copied = self.set_slot_paused(stream, true).await?;
        }
        Ok((
            changed > 0,
            secs * 1000 + micros / 1000,
            super::acked::confirmed(acked).and(copied),
        ))
    }

    /// On Redis Cluster, adds `stream` to (or takes it out of) its slot's copy of the
    /// paused set; whether enough replicas confirmed it. Nothing on one Redis.
    async fn set_slot_paused(&self, stream: &str, paused: bool) -> Result<Result<()>> {
        if !self.is_cluster() {
            return Ok(Ok(()));
        }
        let mut pipe = redis::pipe();
        pipe.cmd(if paused { "SADD" } else { "SREM" })
            .arg(self.slot_paused(stream))
            .arg(stream);
        let (_, acked) = self.query_acked(pipe, 0, 1).await?;
        Ok(super::acked::confirmed(acked))
    }

    /// The copy of the paused set in `stream`'s slot (Redis Cluster).
    fn slot_paused(&self, stream: &str) -> String {
        self.keys.shard(super::keys::slot_of(stream)).paused
    }

    /// Pauses forwarding to every one of `streams` (one call; on Redis Cluster one
    /// more for each slot's copy they fall in).
    pub async fn pause_streams(&self, streams: &[String]) -> Result<()> {
        if streams.is_empty() {
            return Ok(());
        }
        let _: i64 = redis::cmd("SADD")
            .arg(self.keys.paused())
            .arg(streams)
            .query_async(&mut self.conn.clone())
            .await?;
        if self.is_cluster() {
            let mut by_slot: std::collections::BTreeMap<String, Vec<&String>> = Default::default();
            for stream in streams {
                by_slot
                    .entry(self.slot_paused(stream))
                    .or_default()
                    .push(stream);
            }
            for (copy, streams) in by_slot {
                let _: i64 = redis::cmd("SADD")
                    .arg(copy)
                    .arg(streams)
                    .query_async(&mut self.conn.clone())
                    .await?;
            }
        }
        Ok(())
    }

    /// How many scheduled messages, held ones included, fall due by each of
    /// `bounds_ms` (ascending epoch ms), and the earliest due time: `bounds_ms.len() +
    /// 1` counts, the first everything due by `bounds_ms[0]`, the last everything
    /// later than the last bound.
    pub async fn due_histogram(&self, bounds_ms: &[u64]) -> Result<DueClasses> {
        let scores: Vec<u64> = bounds_ms.iter().map(|b| b * 10 + 9).collect();
        let classes = bounds_ms.len() + 1;
        let calls = self.shards_in_use().await?.into_iter().map(|shard| {
            let scores = &scores;
            async move {
                // Summed over the walk's calls (see due_histogram.lua): a later call's
                // last class is what it moved out of it, so each sum is signed.
                let mut counts = vec![0i64; classes];
                let mut earliest = None;
                let script = &self.scripts.due_histogram;
                self.walk_buckets(script, shard, scores, |items| {
                    let [items @ .., first] = items else {
                        return Err(StoreError::Reply("due_histogram: no reply".into()));
                    };
                    if items.len() != classes {
                        return Err(StoreError::Reply(format!(
                            "due_histogram: {} counts, not {classes}",
                            items.len()
                        )));
                    }
                    for (sum, item) in counts.iter_mut().zip(items) {
                        *sum += int(item)?;
                    }
                    let first = int(first)?;
                    if first >= 0 {
                        earliest = Some(first as u64 / 10);
                    }
                    Ok(())
                })
                .await?;
                Ok::<_, StoreError>((counts, earliest))
            }
        });
        let per_shard = futures::future::try_join_all(calls).await?;
        let mut total = DueClasses {
            counts: vec![0u64; classes],
            earliest_due_ms: None,
        };
        for (counts, earliest) in per_shard {
            for (t, c) in total.counts.iter_mut().zip(counts) {
                // A walk whose buckets changed under it can count a message twice or
                // not at all; never below none.
                *t += c.max(0) as u64;
            }
            total.earliest_due_ms = total.earliest_due_ms.into_iter().chain(earliest).min();
        }
        Ok(total)
    }

    /// Up to `limit` pending messages (held ones too) after `after` (score, id), in
    /// due order, of every stream or of `stream` only. Each shard looks at a bounded
    /// number of messages; a page may come back short of `limit` (even empty) with
    /// a `next` to go on from when a filter matches little.
    pub async fn upcoming(
        &self,
        after: Option<(u64, &str)>,
        limit: usize,
        stream: Option<&str>,
    ) -> Result<Upcoming> {
        let (after_score, after_id) = match after {
            Some((score, id)) => (score as i64, id),
            None => (-1, ""),
        };
        let calls = self.shards_in_use().await?.into_iter().map(|shard| {
            let k = self.keys.shard(shard);
            let mut conn = self.conn.clone();
            let script = &self.scripts.upcoming;
            async move {
                let reply: Value = script
                    .key(&k.due)
                    .key(&k.bodies)
                    .key(&k.held)
                    .arg(after_score)
                    .arg(after_id)
                    .arg(limit)
                    .arg(stream.unwrap_or(""))
                    .arg(UPCOMING_BUDGET)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(StoreError::from_script)?;
                upcoming_reply(reply)
            }
        });
        let per_shard = futures::future::try_join_all(calls).await?;
        let mut messages = Vec::new();
        let mut frontier: Option<(u64, String)> = None;
        for (found, stopped) in per_shard {
            messages.extend(found);
            if let Some(f) = stopped
                && frontier.as_ref().is_none_or(|g| f < *g)
            {
                frontier = Some(f);
            }
        }
        messages.sort_by(|a, b| (a.score, a.id.as_bytes()).cmp(&(b.score, b.id.as_bytes())));
        if let Some(f) = &frontier {
            messages.retain(|m| (m.score, m.id.as_bytes()) <= (f.0, f.1.as_bytes()));
        }
        messages.truncate(limit);
        let next = if messages.len() == limit {
            messages.last().map(|m| (m.score, m.id.clone()))
        } else {
            frontier
        };
        Ok(Upcoming { messages, next })
    }

    /// The consumer groups of `stream` (none when it does not exist).
    pub async fn groups_of(&self, stream: &str) -> Result<Vec<GroupInfo>> {
        let reply: redis::RedisResult<Value> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(stream)
            .query_async(&mut self.conn.clone())
            .await;
        let reply = match reply {
            Ok(v) => v,
            Err(e) if e.to_string().contains("no such key") => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut groups = Vec::new();
        for group in array(reply)? {
            let mut info = GroupInfo {
                name: String::new(),
                lag: None,
                pending: 0,
            };
            let fields = match group {
                Value::Map(pairs) => pairs,
                other => array(other)?
                    .chunks(2)
                    .filter_map(|p| match p {
                        [k, v] => Some((k.clone(), v.clone())),
                        _ => None,
                    })
                    .collect(),
            };
            for (k, v) in fields {
                match text(&k)?.as_str() {
                    "name" => info.name = text(&v)?,
                    "pending" => info.pending = int(&v)?.max(0) as u64,
                    "lag" => info.lag = int(&v).ok().map(|n| n.max(0) as u64),
                    _ => {}
                }
            }
            groups.push(info);
        }
        Ok(groups)
    }

    /// Each stream's length (0 for one that does not exist), in order.
    pub async fn stream_lengths(&self, streams: &[String]) -> Result<Vec<u64>> {
        let cmds = streams
            .iter()
            .map(|s| {
                let mut c = redis::cmd("XLEN");
                c.arg(s);
                c
            })
            .collect();
        self.query_each(cmds).await
    }

    /// Asks for a switchover to `node`, for `ttl` (then it is over, done or not).
    pub async fn request_switchover(&self, node: &str, ttl: std::time::Duration) -> Result<()> {
        let () = redis::cmd("SET")
            .arg(self.keys.switchover())
            .arg(node)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The node a switchover in progress hands leadership to, if any.
    pub async fn switchover_target(&self) -> Result<Option<String>> {
        Ok(redis::cmd("GET")
            .arg(self.keys.switchover())
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Ends the switchover to `node` (it leads now, or it timed out); whether one
    /// was in progress. A request for another node is left alone (compared and
    /// deleted in one script, so one made in between is never lost).
    pub async fn clear_switchover(&self, node: &str) -> Result<bool> {
        let deleted: i64 = self
            .scripts
            .clear_switchover
            .key(self.keys.switchover())
            .arg(node)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(deleted == 1)
    }
}

/// One shard's upcoming messages, and where it stopped looking (if it did).
type ShardUpcoming = (Vec<UpcomingMessage>, Option<(u64, String)>);

/// One shard's upcoming reply: its messages and where it stopped looking.
fn upcoming_reply(reply: Value) -> Result<ShardUpcoming> {
    let mut parts = array(reply)?.into_iter();
    let found = array(parts.next().unwrap_or(Value::Nil))?;
    let mut messages = Vec::with_capacity(found.len());
    for m in found {
        let m = array(m)?;
        let [score, id, stream, held] = &m[..] else {
            return Err(StoreError::Reply(format!(
                "upcoming: malformed entry {m:?}"
            )));
        };
        messages.push(UpcomingMessage {
            score: int(score)?.max(0) as u64,
            id: text(id)?,
            stream: text(stream)?,
            held: int(held)? == 1,
        });
    }
    let frontier = array(parts.next().unwrap_or(Value::Nil))?;
    let frontier = match &frontier[..] {
        [score, id] => Some((int(score)?.max(0) as u64, text(id)?)),
        _ => None,
    };
    Ok((messages, frontier))
}
