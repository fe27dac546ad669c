//! One message by id: looked up, cancelled or rescheduled, in the shard its id names
//! (or, on Redis Cluster, in the shards in use until one has it).

use super::*;

impl Store {
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

    pub(super) async fn get_in(&self, shard: u16, id: &MessageId) -> Result<Status> {
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
                    late_ms: number_text_at(&items, 5)?,
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

    pub(super) async fn cancel_in(
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

    pub(super) async fn reschedule_in(
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
}
