//! Forwarding due messages of one shard (`forward.lua`), and trimming its records.

use super::*;

/// An invocation of `script` with a shard's keys in the order every script that
/// A script's `{ stream, count, stream, count, ... }` list (absent: empty).
pub(super) fn stream_counts(list: Option<&Value>) -> Result<Vec<(String, u64)>> {
    let items = array(list.cloned().unwrap_or(Value::Nil))?;
    let mut counts = Vec::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        if let [stream, count] = pair {
            counts.push((text(stream)?, int(count)? as u64));
        }
    }
    Ok(counts)
}

/// forward.lua's `{ stream, worst_ms, expired, ... }` list (absent: empty).
fn stream_times(list: Option<&Value>) -> Result<Vec<StreamTimes>> {
    let items = array(list.cloned().unwrap_or(Value::Nil))?;
    let mut times = Vec::with_capacity(items.len() / 3);
    for triple in items.chunks(3) {
        if let [stream, worst, expired] = triple {
            let worst = int(worst)?;
            times.push(StreamTimes {
                stream: text(stream)?,
                worst_lateness_ms: (worst >= 0).then_some(worst as u64),
                expired: int(expired)?.max(0) as u64,
            });
        }
    }
    Ok(times)
}

impl Store {
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
        // Read by the script itself: a pause is in force once Redis took it. On Redis
        // Cluster, the slot's own copy of the paused set (in the script's slot).
        if self.is_cluster() {
            inv.key(&k.paused);
        } else {
            inv.key(self.keys.paused());
        }
        inv.arg(epoch)
            .arg(limit)
            .arg(self.records_arg(options.retention))
            .arg(options.id_field.as_deref().unwrap_or(""))
            .arg(options.attempt_field.as_deref().unwrap_or(""))
            .arg(&options.dead_letter_suffix)
            .arg(self.keys.unreadable_stream(shard))
            .arg(options.default_maxlen)
            .arg(if self.is_cluster() { "cluster" } else { "" })
            .arg(options.key_field.as_deref().unwrap_or(""))
            .arg(budgets.len());
        for (stream, budget) in budgets {
            inv.arg(stream).arg(*budget);
        }
        inv.arg(options.stream_key_fields.len());
        for (stream, field) in &options.stream_key_fields {
            inv.arg(stream).arg(field.as_deref().unwrap_or(""));
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
        let ms_list = |at: usize| {
            array(items.get(at).cloned().unwrap_or(Value::Nil))?
                .iter()
                .map(|v| int(v).map(|n| n.max(0) as u64))
                .collect::<Result<Vec<_>>>()
        };
        let lateness = ms_list(5)?;
        let held_wait = ms_list(12)?;
        Ok(ForwardBatch {
            forwarded: int_at(&items, 0)?,
            expired: int_at(&items, 1)?,
            dead: int_at(&items, 2)?,
            next_due_ms: (next_due >= 0).then_some(next_due as u64),
            now_us: int_at(&items, 4)?
                .saturating_mul(1000)
                .saturating_add(int_at(&items, 11)?.min(999)),
            lateness_ms: lateness,
            held_wait_ms: held_wait,
            per_stream: stream_counts(items.get(6))?,
            parked: int_at(&items, 7)?,
            held_back: items
                .get(8)
                .map(text)
                .transpose()?
                .filter(|e| !e.is_empty()),
            newly_held: int_at(&items, 9)?,
            holding: stream_counts(items.get(10))?,
            per_stream_times: stream_times(items.get(13))?,
        })
    }

    /// Forgets terminal records of a shard whose retention has passed, looking at about
    /// `limit` of them (a forward batch's records expire together and are taken whole).
    pub async fn trim_records(&self, shard: u16, epoch: u64, limit: usize) -> Result<Trimmed> {
        let k = self.keys.shard(shard);
        let (forgotten, looked_at, keys_pruned, unlisted, more): (u64, u64, u64, u64, u8) = self
            .scripts
            .trim
            .key(&k.records)
            .key(&k.records_by_expiry)
            .key(&k.fence)
            .key(&k.due)
            .key(&k.bodies)
            .arg(epoch)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(Trimmed {
            forgotten,
            looked_at,
            keys_pruned,
            unlisted,
            more_to_unlist: more == 1,
        })
    }
}
