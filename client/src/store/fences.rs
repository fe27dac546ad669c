//! Fences: the leader epoch every leader-only script checks, raised at the start of
//! a term, read for the dashboard and `delayq fence`, reset by an operator.

use super::*;

impl Store {
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
    pub(super) async fn query_each<T: redis::FromRedisValue>(
        &self,
        cmds: Vec<redis::Cmd>,
    ) -> Result<Vec<T>> {
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
}
