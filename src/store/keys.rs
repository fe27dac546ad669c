//! Every Redis key delayq uses is named here and nowhere else.
//!
//! A shard's keys share one hash tag, `{<prefix>:<shard>}`, so each script touches
//! a single Redis Cluster slot.

/// Key names for one deployment (one prefix, one shard count).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    shards: u16,
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
}

impl ShardKeys {
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
        }
    }

    pub fn shards(&self) -> u16 {
        self.shards
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn shard(&self, shard: u16) -> ShardKeys {
        let tag = format!("{{{}:{}}}", self.prefix, shard);
        ShardKeys {
            due: format!("{tag}:due"),
            bodies: format!("{tag}:msg"),
            records: format!("{tag}:done"),
            records_by_expiry: format!("{tag}:done-by-expiry"),
            fence: format!("{tag}:fence"),
            held: format!("{tag}:held"),
        }
    }

    /// Which shard a due-set key belongs to (wake-up messages carry the key).
    pub fn shard_of_due_key(&self, key: &str) -> Option<u16> {
        let rest = key.strip_prefix('{')?.strip_prefix(self.prefix.as_str())?;
        let rest = rest.strip_prefix(':')?;
        let (shard, tail) = rest.split_once('}')?;
        (tail == ":due").then(|| shard.parse().ok())?
    }

    /// Pub/sub channel the scripts that schedule a message publish to when the
    /// shard's earliest due time may have moved earlier.
    pub fn wake_channel(&self) -> String {
        format!("{}:wake", self.prefix)
    }

    /// Counter standalone instances take their epoch from.
    pub fn standalone_epoch(&self) -> String {
        format!("{}:standalone-epoch", self.prefix)
    }

    /// String a node writes (with an expiry) to learn whether Redis takes writes.
    pub fn write_probe(&self, node_id: &str) -> String {
        format!("{}:probe:{node_id}", self.prefix)
    }

    /// Pub/sub channel a node subscribes to while it campaigns or leads with the
    /// etcd lease `lease` (see `store::presence`).
    pub fn presence_channel(&self, lease: i64) -> String {
        format!("{}:presence:{lease:x}", self.prefix)
    }

    /// Stream that receives bodies too damaged to know their own target stream.
    pub fn unreadable_stream(&self) -> String {
        format!("{}:unreadable", self.prefix)
    }
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
    }
}
