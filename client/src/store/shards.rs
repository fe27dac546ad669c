//! Shards: which one an id or a stream lives in, which are in use (on Redis Cluster,
//! the slots that ever held a message), and which this node's terms own.

use super::*;

/// Shards this process knows to be listed in use (a bit each).
pub(super) struct InUse(Vec<std::sync::atomic::AtomicU64>);

impl InUse {
    pub(super) fn new(shards: u16) -> Self {
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

impl Store {
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
    pub(super) async fn note_in_use(&self, shard: u16) -> Result<()> {
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

    /// The shards a message `id` may live in when its stream is not known: its
    /// one shard, or on Redis Cluster every shard in use.
    pub(super) async fn shards_for(&self, id: &MessageId) -> Result<Vec<u16>> {
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
}
