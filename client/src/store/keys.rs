//! Every Redis key delayq uses is named here and nowhere else.
//!
//! A shard's keys share one hash tag, so each script touches a single Redis
//! Cluster slot. On a standalone Redis the tag is `{<prefix>:<shard>}` and a
//! message's shard is its id's CRC-32 modulo `redis.shards`. On Redis Cluster
//! there is one shard per hash slot, its tag `{<prefix>:@<k>}` with the smallest
//! `k` that lands in that slot, and a message lives in the shard of its target
//! stream's slot: the forward script then writes only keys of one slot.

use std::sync::{Arc, OnceLock};

/// Redis Cluster's hash slots: the shards of a cluster deployment.
pub const CLUSTER_SLOTS: u16 = 16384;

/// The most shards a standalone deployment may have (`redis.shards`).
pub const MAX_SHARDS: u16 = 1024;
/// `redis.shards` when it is not set.
pub const DEFAULT_SHARDS: u16 = 16;

/// Key names for one deployment (one prefix, one shard count).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    shards: u16,
    /// Redis Cluster: each slot's hash tag, made once.
    slot_tags: Option<Arc<OnceLock<Vec<String>>>>,
}

/// The Redis Cluster hash slot of `key` (CRC-16/XMODEM of its hash tag, or of the
/// whole key when it has none).
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % CLUSTER_SLOTS
}

/// `stream`'s dead-letter stream on Redis Cluster: `<stream><suffix>` when the
/// stream's name has a hash tag (the name keeps it), else `{<stream>}<suffix>`, so
/// that it lives in the stream's slot either way. None for a name with braces but
/// no hash tag (such a stream cannot be a target on Redis Cluster).
pub fn cluster_dead_letter_stream(stream: &str, suffix: &str) -> Option<String> {
    if has_tag(stream) {
        Some(format!("{stream}{suffix}"))
    } else if stream.contains(['{', '}']) {
        None
    } else {
        Some(format!("{{{stream}}}{suffix}"))
    }
}

/// Why `stream` cannot be a target on Redis Cluster, if it cannot: a name with
/// braces must have a hash tag, so that its dead letters can share its slot.
pub fn cluster_stream_refusal(stream: &str) -> Option<String> {
    cluster_dead_letter_stream(stream, "").is_none().then(|| {
        format!(
            "stream {stream:?}: on Redis Cluster a name with braces must have a hash tag (\"{{tag}}rest\")"
        )
    })
}

/// Whether `key` has a hash tag: a `{` followed, later, by a `}` with something between.
pub fn has_tag(key: &str) -> bool {
    key.find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0))
}

/// The keys of one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardKeys {
    /// Sorted set: id → due score (due ms × 10 + 9 − priority).
    pub due: String,
    /// Hash: id → message body.
    pub bodies: String,
    /// Terminal records (delivered, expired, dead, cancelled). In the `hash` layout, a
    /// hash id → record; in the `compact` layout, the prefix of the names the scripts
    /// derive for its generations (`<records>:gens`, `<records>:gone`,
    /// `<records>:<start>:<bucket>`; see the prelude).
    pub records: String,
    /// Sorted set (the `hash` layout): the ids recorded at one instant (a forward
    /// batch's) → the time their records may be forgotten.
    pub records_by_expiry: String,
    /// String: the highest leader epoch that has touched this shard.
    pub fence: String,
    /// Set: the streams with due messages held back by their rate limit
    /// (`streams.max_rate`). Each such stream's held messages are a sorted set, like
    /// the due set, at `<held>:<stream>` (the scripts derive that name).
    pub held: String,
    /// Set (Redis Cluster): the streams of this slot whose forwarding is paused, a
    /// copy of their names in [`Keys::paused`] kept where the forward script can read
    /// it (a script touches one slot), so that a pause is in force once Redis took it.
    pub paused: String,
}

impl ShardKeys {
    /// Sorted set of the compact pending layout's buckets (the prelude derives its
    /// name, and each bucket list's, from the due set's).
    pub fn buckets(&self) -> String {
        format!("{}:q", self.due)
    }

    /// Sorted set of `stream`'s messages held back by its rate limit in this shard.
    pub fn held_of(&self, stream: &str) -> String {
        format!("{}:{stream}", self.held)
    }
}

impl Keys {
    pub fn new(prefix: &str, shards: u16) -> Self {
        Keys {
            prefix: prefix.to_owned(),
            shards,
            slot_tags: None,
        }
    }

    /// Keys of a Redis Cluster deployment: one shard per hash slot.
    pub fn cluster(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
            shards: CLUSTER_SLOTS,
            slot_tags: Some(Arc::new(OnceLock::new())),
        }
    }

    /// Whether shards are Redis Cluster hash slots.
    pub fn is_cluster(&self) -> bool {
        self.slot_tags.is_some()
    }

    /// The shard a message to `stream` with id `id` lives in.
    pub fn shard_of(&self, id: &crate::message::MessageId, stream: &str) -> u16 {
        if self.is_cluster() {
            slot_of(stream)
        } else {
            id.shard(self.shards)
        }
    }

    /// A shard's hash tag, braces included.
    fn tag(&self, shard: u16) -> String {
        match &self.slot_tags {
            None => format!("{{{}:{}}}", self.prefix, shard),
            Some(tags) => {
                let tags = tags.get_or_init(|| slot_tags(&self.prefix));
                format!("{{{}}}", tags[usize::from(shard % CLUSTER_SLOTS)])
            }
        }
    }

    pub fn shards(&self) -> u16 {
        self.shards
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn shard(&self, shard: u16) -> ShardKeys {
        let tag = self.tag(shard);
        ShardKeys {
            due: format!("{tag}:due"),
            bodies: format!("{tag}:msg"),
            records: format!("{tag}:done"),
            records_by_expiry: format!("{tag}:done-by-expiry"),
            fence: format!("{tag}:fence"),
            held: format!("{tag}:held"),
            paused: format!("{tag}:paused"),
        }
    }

    /// Which shard a due-set key belongs to (wake-up messages carry the key).
    pub fn shard_of_due_key(&self, key: &str) -> Option<u16> {
        let rest = key.strip_prefix('{')?.strip_prefix(self.prefix.as_str())?;
        let rest = rest.strip_prefix(':')?;
        let (shard, tail) = rest.split_once('}')?;
        if tail != ":due" {
            return None;
        }
        if self.is_cluster() {
            shard.strip_prefix('@')?.parse::<u64>().ok()?;
            Some(slot_of(key))
        } else {
            shard.parse().ok().filter(|&s| s < self.shards)
        }
    }

    /// Set of the shards that ever held a message (Redis Cluster: the slots in use;
    /// a shard is added before its first message is stored).
    pub fn shards_in_use(&self) -> String {
        format!("{}:shards", self.prefix)
    }

    /// String (standalone Redis): the shard count (`redis.shards`) the deployment's
    /// messages are stored with, written by the first store to connect (see
    /// `shard_count`).
    pub fn shard_count(&self) -> String {
        format!("{}:shard-count", self.prefix)
    }

    /// Pub/sub channel the scripts that schedule a message publish to when the
    /// shard's earliest due time may have moved earlier.
    pub fn wake_channel(&self) -> String {
        format!("{}:wake", self.prefix)
    }

    /// String: the journal's marker, the token of the journal this Redis belongs to
    /// (see `journal::Marker`); gone means this Redis lost its data.
    pub fn journal_marker(&self) -> String {
        format!("{}:journal", self.prefix)
    }

    /// Hash: node id → the node's registry entry (JSON; see `store::board`).
    pub fn nodes(&self) -> String {
        format!("{}:nodes", self.prefix)
    }

    /// Hash: `<group or ->:<epoch>` → a leadership term (JSON).
    pub fn terms(&self) -> String {
        format!("{}:terms", self.prefix)
    }

    /// List: forwarding samples (JSON), newest first.
    pub fn samples(&self) -> String {
        format!("{}:samples", self.prefix)
    }

    /// List: quarter-hour rollups of each node's samples (JSON), newest first.
    pub fn rollups(&self) -> String {
        format!("{}:samples:day", self.prefix)
    }

    /// String (expiring): the node a switchover hands leadership to (see
    /// `election::run`).
    pub fn switchover(&self) -> String {
        format!("{}:switchover", self.prefix)
    }

    /// String: the leader's last count of pending messages per stream (JSON; see
    /// `forwarder::report_pending_streams`).
    pub fn stream_counts(&self) -> String {
        format!("{}:stream-counts", self.prefix)
    }

    /// Stream: the audit trail of admin and state-changing actions (capped).
    pub fn audit(&self) -> String {
        format!("{}:audit", self.prefix)
    }

    /// Hash: schedule id → its definition (JSON), and `<that>:state`, schedule id →
    /// `<next> <last>`: the first occurrence not yet made and the last one made
    /// (epoch ms, 0 for none). In shard 0's slot, beside the fence the leader's
    /// advance is checked against.
    pub fn schedules(&self) -> String {
        let fence = self.shard(0).fence;
        let tag_end = fence.find('}').map_or(0, |i| i + 1);
        format!("{}:schedules", &fence[..tag_end])
    }

    /// Set: the streams whose forwarding is paused.
    pub fn paused(&self) -> String {
        format!("{}:paused", self.prefix)
    }

    /// Counter standalone instances take their epoch from.
    pub fn standalone_epoch(&self) -> String {
        format!("{}:standalone-epoch", self.prefix)
    }

    /// String a node writes (with an expiry) to learn whether Redis takes writes.
    /// On Redis Cluster every node's probe lives in the presence slot, so that a
    /// standby compares its own probe with the leader's on one master.
    pub fn write_probe(&self, node_id: &str) -> String {
        match self.is_cluster() {
            true => format!("{{{}:presence}}:probe:{node_id}", self.prefix),
            false => format!("{}:probe:{node_id}", self.prefix),
        }
    }

    /// Redis Cluster: the slot whose master holds every node's presence (the
    /// subscriptions a standby counts with `PUBSUB NUMSUB`, which counts one
    /// node's own) and probe.
    pub fn presence_slot(&self) -> u16 {
        slot_of(&self.write_probe(""))
    }

    /// Pub/sub channel a node subscribes to while it campaigns or leads with the
    /// etcd lease `lease` (see `store::presence`).
    pub fn presence_channel(&self, lease: i64) -> String {
        format!("{}:presence:{lease:x}", self.prefix)
    }

    /// Stream that receives shard `shard`'s bodies too damaged to know their own
    /// target stream: one for all shards, or on Redis Cluster one per slot, in it.
    pub fn unreadable_stream(&self, shard: u16) -> String {
        if self.is_cluster() {
            format!("{}:unreadable", self.tag(shard))
        } else {
            format!("{}:unreadable", self.prefix)
        }
    }
}

/// Each hash slot's tag: `<prefix>:@<k>` with the smallest `k` in that slot.
fn slot_tags(prefix: &str) -> Vec<String> {
    let mut tags: Vec<Option<String>> = vec![None; usize::from(CLUSTER_SLOTS)];
    let mut missing = tags.len();
    let mut k = 0u64;
    while missing > 0 {
        let tag = format!("{prefix}:@{k}");
        let slot = usize::from(slot_of(&tag));
        if tags[slot].is_none() {
            tags[slot] = Some(tag);
            missing -= 1;
        }
        k += 1;
    }
    tags.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_share_a_hash_tag() {
        let keys = Keys::new("dq", 16);
        let k = keys.shard(3);
        for key in [
            &k.due,
            &k.bodies,
            &k.records,
            &k.records_by_expiry,
            &k.fence,
            &k.held,
        ] {
            assert!(key.starts_with("{dq:3}:"), "{key}");
        }
        assert_eq!(keys.shard_of_due_key(&k.due), Some(3));
        assert_eq!(keys.shard_of_due_key(&k.bodies), None);
        assert_eq!(keys.shard_of_due_key("{other:3}:due"), None);
        assert_eq!(keys.shard_of_due_key("{dq:16}:due"), None);
    }

    #[test]
    fn slots_as_redis_computes_them() {
        // Values from CLUSTER KEYSLOT on Redis 7.
        for (key, slot) in [
            ("foo", 12182),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("foo{bar}{zap}", 5061),
            ("", 0),
        ] {
            assert_eq!(slot_of(key), slot, "{key}");
        }
    }

    #[test]
    fn cluster_shards_are_slots() {
        let keys = Keys::cluster("dq");
        for slot in [0, 1, 3443, CLUSTER_SLOTS - 1] {
            let k = keys.shard(slot);
            for key in [&k.due, &k.bodies, &k.records, &k.fence, &k.held] {
                assert_eq!(slot_of(key), slot, "{key}");
            }
            assert_eq!(slot_of(&keys.unreadable_stream(slot)), slot);
            assert_eq!(keys.shard_of_due_key(&k.due), Some(slot));
        }
        let id = crate::message::MessageId::parse("m1").unwrap();
        assert_eq!(keys.shard_of(&id, "orders"), slot_of("orders"));
    }

    #[test]
    fn cluster_probes_share_the_presence_slot() {
        let keys = Keys::cluster("dq");
        let slot = keys.presence_slot();
        assert_eq!(slot, slot_of("dq:presence"));
        for node in ["a", "node-2", "{x}"] {
            assert_eq!(slot_of(&keys.write_probe(node)), slot, "{node}");
        }
        assert_eq!(Keys::new("dq", 16).write_probe("a"), "dq:probe:a");
    }

    #[test]
    fn cluster_dead_letters_share_the_stream_slot() {
        for (stream, dead) in [
            ("orders", "{orders}:dead"),
            ("{t}orders", "{t}orders:dead"),
            ("x{t}", "x{t}:dead"),
        ] {
            assert_eq!(
                cluster_dead_letter_stream(stream, ":dead").as_deref(),
                Some(dead)
            );
            assert_eq!(slot_of(dead), slot_of(stream), "{stream}");
        }
        for stream in ["a{}b", "a}b", "{a"] {
            assert_eq!(
                cluster_dead_letter_stream(stream, ":dead"),
                None,
                "{stream}"
            );
        }
    }
}
