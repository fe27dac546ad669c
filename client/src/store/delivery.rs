//! After delivery: entries consumer groups never acknowledged (found, then
//! redelivered or dead-lettered by `redeliver.lua`), and the dead-letter streams
//! operators list, replay (`replay_dead.lua`) and purge.

use std::time::Duration;

use redis::Value;

use super::streams::{stream_entries, wrong_type};
use super::{Result, Store, StoreError, array, shard_invocation};
use crate::message::{Fields, MessageId};

/// Fields delayq appends to dead-letter entries after the producer's own (besides
/// the id and attempt fields): the forward script's for expired messages and the
/// redeliver script's for messages out of attempts.
pub const DEAD_LETTER_FIELDS: &[&str] = &[
    "delayq-reason",
    "delayq-due",
    "delayq-first-delivery",
    "delayq-last-delivery",
    "delayq-group",
    "delayq-consumer",
];

/// An entry pending in a consumer group past the ack timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingEntry {
    pub entry_id: String,
    pub consumer: String,
    pub idle_ms: u64,
    /// How often the group handed the entry out (XREADGROUP, XCLAIM).
    pub deliveries: u64,
    /// The message id delayq wrote on the entry; None for entries delayq did not
    /// write (other producers share the stream) or that were deleted meanwhile.
    pub message_id: Option<MessageId>,
}

/// How one watched stream redelivers; fixed for a run.
#[derive(Clone, Debug)]
pub struct RedeliverOptions {
    pub ack_timeout: Duration,
    pub max_attempts: u32,
    pub backoff_first: Duration,
    pub backoff_max: Duration,
    pub backoff_jitter: f64,
    pub dead_letter_stream: String,
    pub id_field: String,
    pub attempt_field: String,
    /// The field a delivered entry carries its message's business key in ("" =
    /// none): the next attempt keeps the key.
    pub key_field: String,
    /// How long the dead-letter record stays, like every terminal record.
    pub retention: Duration,
}

/// What the redeliver script did with one stale entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redelivered {
    /// Scheduled again as `attempt`, due at `due_ms`; the stale entry acknowledged.
    Rescheduled { attempt: u64, due_ms: u64 },
    /// Out of attempts: written to the dead-letter stream as `entry_id`.
    DeadLettered { attempts: u64, entry_id: String },
    /// No longer pending that long: acknowledged or claimed meanwhile.
    Fresh,
    /// The message is scheduled again or had a later delivery; only the entry was acknowledged.
    Superseded,
    /// Pending but deleted from the stream; acknowledged.
    Gone,
    /// Not an entry delayq wrote for that id; left alone.
    Foreign,
    /// The stream or the consumer group does not exist.
    NoGroup,
}

/// One entry of a dead-letter stream, split into the producer's fields and delayq's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub entry_id: String,
    /// None if the entry carries no message id (the id field was disabled).
    pub message_id: Option<MessageId>,
    /// The fields the producer sent, in order.
    pub fields: Vec<(String, String)>,
    /// The fields delayq appended (id, attempt, reason, delivery times, ...), in order.
    pub annotations: Vec<(String, String)>,
}

impl DeadLetter {
    pub fn annotation(&self, name: &str) -> Option<&str> {
        self.annotations
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replayed {
    Replayed {
        due_ms: u64,
    },
    /// The id is scheduled already; the dead letter stays.
    AlreadyScheduled,
    /// No such entry (replayed or purged meanwhile).
    Gone,
    /// The entry does not carry a usable message id.
    Foreign,
}

/// Splits an entry's fields as the scripts do (`split_own_fields` in `lua/prelude/20-body.lua`):
/// trailing pairs named in `own`, each name once, are delayq's.
pub fn split_own_fields(mut fields: Fields, own: &[&str]) -> (Fields, Fields) {
    let mut appended = Vec::new();
    while let Some((name, _)) = fields.last() {
        if !own.contains(&name.as_str())
            || appended.iter().any(|(n, _): &(String, String)| n == name)
        {
            break;
        }
        appended.push(fields.pop().expect("checked above"));
    }
    appended.reverse();
    (fields, appended)
}

impl Store {
    /// Entries of `group` on `stream` pending at least `options.ack_timeout`, after
    /// entry `after` (exclusive; None: from the start), at most `count`, each with
    /// the message id delayq wrote on it. None when the stream or the group does not exist.
    pub async fn stale_entries(
        &self,
        stream: &str,
        group: &str,
        after: Option<&str>,
        count: usize,
        options: &RedeliverOptions,
    ) -> Result<Option<Vec<PendingEntry>>> {
        let (id_field, attempt_field) = (options.id_field.as_str(), options.attempt_field.as_str());
        let mut conn = self.conn.clone();
        let start = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
        let reply: Value = match redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg("IDLE")
            .arg(options.ack_timeout.as_millis() as u64)
            .arg(start)
            .arg("+")
            .arg(count)
            .query_async(&mut conn)
            .await
        {
            Ok(reply) => reply,
            Err(e) if e.code() == Some("NOGROUP") => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut entries = Vec::new();
        for item in array(reply)? {
            let parts = array(item)?;
            entries.push(PendingEntry {
                entry_id: super::string_at(&parts, 0)?,
                consumer: super::string_at(&parts, 1)?,
                idle_ms: super::int_at(&parts, 2)?,
                deliveries: super::int_at(&parts, 3)?,
                message_id: None,
            });
        }
        if entries.is_empty() {
            return Ok(Some(entries));
        }
        let mut pipe = redis::pipe();
        for e in &entries {
            pipe.cmd("XRANGE")
                .arg(stream)
                .arg(&e.entry_id)
                .arg(&e.entry_id);
        }
        let reads: Vec<Value> = pipe.query_async(&mut conn).await?;
        for (entry, read) in entries.iter_mut().zip(reads) {
            if let Some((_, fields)) = stream_entries(read)?.into_iter().next() {
                let (_, own) = split_own_fields(fields, &[id_field, attempt_field]);
                entry.message_id = own
                    .into_iter()
                    .find(|(k, _)| k == id_field)
                    .and_then(|(_, v)| MessageId::parse(&v).ok());
            }
        }
        Ok(Some(entries))
    }

    /// Redelivers or dead-letters one stale entry, as the leader of `epoch`, in one
    /// script call. `random` in [0, 1) draws the jitter.
    #[allow(clippy::too_many_arguments)]
    pub async fn redeliver(
        &self,
        epoch: u64,
        stream: &str,
        group: &str,
        entry_id: &str,
        id: &MessageId,
        options: &RedeliverOptions,
        random: f64,
    ) -> Result<Redelivered> {
        let k = self.shard_keys(id, stream);
        let reply: Value = shard_invocation(&self.scripts.redeliver, &k)
            .arg(epoch)
            .arg(stream)
            .arg(group)
            .arg(entry_id)
            .arg(id.as_str())
            .arg(options.ack_timeout.as_millis() as u64)
            .arg(options.max_attempts)
            .arg(options.backoff_first.as_millis() as u64)
            .arg(options.backoff_max.as_millis() as u64)
            .arg(options.backoff_jitter)
            .arg(random)
            .arg(&options.dead_letter_stream)
            .arg(&options.id_field)
            .arg(&options.attempt_field)
            .arg(self.records_arg(options.retention))
            .arg(self.keys.wake_channel())
            .arg(self.pending_layout.script_arg())
            .arg(self.apart_arg(stream))
            .arg(&options.key_field)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        let outcome = super::string_at(&items, 0)?;
        Ok(match outcome.as_str() {
            "rescheduled" => Redelivered::Rescheduled {
                attempt: super::int_at(&items, 1)?,
                due_ms: super::int_at(&items, 2)?,
            },
            "dead" => Redelivered::DeadLettered {
                attempts: super::int_at(&items, 1)?,
                entry_id: super::string_at(&items, 2)?,
            },
            "fresh" => Redelivered::Fresh,
            "superseded" => Redelivered::Superseded,
            "gone" => Redelivered::Gone,
            "foreign" => Redelivered::Foreign,
            "nogroup" => Redelivered::NoGroup,
            other => return Err(StoreError::Reply(format!("redeliver said {other:?}"))),
        })
    }

    /// Up to `count` entries of a dead-letter stream after entry `after` (exclusive;
    /// None: from the start), oldest first. A missing stream has none, and so has
    /// anything after the last possible id.
    pub async fn dead_letters(
        &self,
        dead_stream: &str,
        after: Option<&str>,
        count: usize,
        id_field: &str,
        attempt_field: &str,
        key_field: &str,
    ) -> Result<Vec<DeadLetter>> {
        let entries = self.stream_page(dead_stream, after, count).await?;
        let own = own_field_names(id_field, attempt_field, key_field);
        Ok(entries
            .into_iter()
            .map(
                |super::StreamEntry {
                     id: entry_id,
                     fields,
                 }| {
                    let (fields, annotations) = split_own_fields(fields, &own);
                    let message_id = annotations
                        .iter()
                        .find(|(k, _)| k == id_field)
                        .and_then(|(_, v)| MessageId::parse(v).ok());
                    DeadLetter {
                        entry_id,
                        message_id,
                        fields,
                        annotations,
                    }
                },
            )
            .collect())
    }

    /// Schedules a dead letter again, due now, into `target`, and deletes it from the
    /// dead-letter stream, in one script call. Any instance may do this.
    pub async fn replay_dead_letter(
        &self,
        dead_stream: &str,
        letter: &DeadLetter,
        target: &str,
        id_field: &str,
        attempt_field: &str,
        key_field: &str,
    ) -> Result<Replayed> {
        let Some(id) = &letter.message_id else {
            return Ok(Replayed::Foreign);
        };
        let shard = self.shard_of(id, target);
        self.note_in_use(shard).await?;
        let k = self.keys.shard(shard);
        let mut inv = shard_invocation(&self.scripts.replay_dead, &k);
        inv.arg(0)
            .arg(dead_stream)
            .arg(&letter.entry_id)
            .arg(id.as_str())
            .arg(target)
            .arg(id_field)
            .arg(self.keys.wake_channel())
            .arg(self.pending_layout.script_arg())
            .arg(self.apart_arg(target))
            .arg(if self.journal { "j" } else { "" })
            .arg(key_field);
        for name in own_field_names(id_field, attempt_field, key_field) {
            inv.arg(name);
        }
        let (reply, acked) = self.invoke_acked(&inv).await?;
        let items = array(reply)?;
        let outcome = super::string_at(&items, 0)?;
        // Replayed, or found replayed: confirmed by the replicas as the first answer
        // would have been (that one may have been not_replicated).
        if matches!(outcome.as_str(), "replayed" | "scheduled") {
            super::acked::confirmed(acked)?;
        }
        Ok(match outcome.as_str() {
            "replayed" => Replayed::Replayed {
                due_ms: super::int_at(&items, 1)?,
            },
            "scheduled" => Replayed::AlreadyScheduled,
            "gone" => Replayed::Gone,
            "foreign" => Replayed::Foreign,
            other => return Err(StoreError::Reply(format!("replay said {other:?}"))),
        })
    }

    /// Deletes the given entries of a dead-letter stream, or all of them (None). The
    /// stream itself, and any consumer group on it, stays. Returns how many went;
    /// `NotReplicated` (they went) when fewer replicas than `redis.min_replicas_acked`
    /// confirmed it.
    pub async fn purge_dead_letters(
        &self,
        dead_stream: &str,
        entries: Option<&[String]>,
    ) -> Result<u64> {
        let mut pipe = redis::pipe();
        match entries {
            None => pipe.cmd("XTRIM").arg(dead_stream).arg("MAXLEN").arg(0),
            Some([]) => return Ok(0),
            Some(ids) => pipe.cmd("XDEL").arg(dead_stream).arg(ids),
        };
        let (replies, acked) = match self.query_acked(pipe, 0, 1).await {
            Ok(done) => done,
            Err(StoreError::Redis(e)) => return Err(wrong_type(e, dead_stream)),
            Err(e) => return Err(e),
        };
        let n: u64 = redis::from_redis_value(
            replies
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::Reply("purge: no reply".into()))?,
        )
        .map_err(|e| StoreError::Reply(format!("purge: {e}")))?;
        super::acked::confirmed(acked)?;
        Ok(n)
    }
}

fn own_field_names<'a>(
    id_field: &'a str,
    attempt_field: &'a str,
    key_field: &'a str,
) -> Vec<&'a str> {
    let mut names = vec![id_field, attempt_field, key_field];
    names.extend_from_slice(DEAD_LETTER_FIELDS);
    names.retain(|n| !n.is_empty());
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(flat: &[&str]) -> Vec<(String, String)> {
        flat.chunks(2)
            .map(|p| (p[0].to_owned(), p[1].to_owned()))
            .collect()
    }

    #[track_caller]
    fn check(entry: &[&str], own: &[&str], producer: &[&str], appended: &[&str]) {
        let (fields, annotations) = split_own_fields(pairs(entry), own);
        assert_eq!(fields, pairs(producer), "producer's fields of {entry:?}");
        assert_eq!(annotations, pairs(appended), "delayq's fields of {entry:?}");
    }

    #[test]
    fn splits_delayq_fields_off_the_end_only() {
        let own = ["delayq-id", "delayq-attempt", "delayq-reason"];
        check(
            &["a", "1", "delayq-id", "m1", "delayq-attempt", "2"],
            &own,
            &["a", "1"],
            &["delayq-id", "m1", "delayq-attempt", "2"],
        );
        check(&["a", "1"], &own, &["a", "1"], &[]);
        check(
            &["delayq-id", "x", "a", "1", "delayq-id", "m1"],
            &own,
            &["delayq-id", "x", "a", "1"],
            &["delayq-id", "m1"],
        );
        check(
            &["a", "1", "delayq-id", "m1", "delayq-id", "m2"],
            &own,
            &["a", "1", "delayq-id", "m1"],
            &["delayq-id", "m2"],
        );
        check(
            &["a", "1", "delayq-id", "m1", "delayq-reason", "max_attempts"],
            &own,
            &["a", "1"],
            &["delayq-id", "m1", "delayq-reason", "max_attempts"],
        );
        check(&["delayq-id", "m1"], &own, &[], &["delayq-id", "m1"]);
    }
}
