//! Scheduling: on standalone Redis one `schedule_batch.lua` call carries the
//! messages of every shard (a call costs Redis more than a message does: the
//! script's set-up and each shard's reads come once a call); on Redis Cluster one
//! call per shard (its keys must share a slot), the calls running concurrently. A
//! batch costs a few round trips, not one per message. A single push is a batch of
//! one, so every message reaches the script in one layout. Single pushes that
//! arrive while a call of theirs is in flight (any shard's on standalone Redis, their
//! shard's on Redis Cluster) wait for it and then go together in one call (group
//! commit, see [`Coalescer`]): no push waits for a timer, and under load one call
//! carries many.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use super::push_args::{ToSchedule, write_messages};
use super::{Result, ScheduleMode, Scheduled, Store, StoreError, array, shard_keys};
use crate::message::NewMessage;

/// Most messages in one script call: bounds how long one call holds Redis (and
/// stays clear of Lua's limit on unpacked values).
pub const MAX_PER_CALL: usize = 1000;

/// One message of a batch.
#[derive(Clone, Debug)]
pub struct BatchItem {
    pub msg: NewMessage,
    pub mode: ScheduleMode,
    /// The inbox entry this message came from, acknowledged when it is stored.
    pub inbox_entry: Option<String>,
}

impl BatchItem {
    /// `msg` as a new message (an id that exists already is a duplicate), not
    /// from the inbox.
    pub fn new(msg: NewMessage) -> BatchItem {
        BatchItem {
            msg,
            mode: ScheduleMode::New,
            inbox_entry: None,
        }
    }
}

/// Where the inbox entries of a batch are acknowledged.
#[derive(Clone, Copy, Debug)]
pub struct InboxAck<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    /// The marked read (its consumer) the batch stores whole, settled by the same
    /// call instead of each entry acknowledged (standalone Redis, one call).
    pub read: Option<&'a str>,
}

/// Single pushes waiting for the call in flight of their lane: one lane on
/// standalone Redis (a call carries any shards), one per shard on Redis Cluster.
pub(super) struct Coalescer {
    slots: Vec<Mutex<Slot>>,
}

#[derive(Default)]
struct Slot {
    /// A call of single pushes for the lane is in flight.
    in_flight: bool,
    waiting: Vec<Waiting>,
}

/// A single push waiting for the next call of its lane.
struct Waiting {
    shard: u16,
    msg: NewMessage,
    mode: ScheduleMode,
    max_delay: Duration,
    done: oneshot::Sender<Result<Scheduled>>,
}

impl Coalescer {
    /// The lanes of a store with these keys.
    pub(super) fn new(keys: &super::Keys) -> Coalescer {
        let lanes = if keys.is_cluster() { keys.shards() } else { 1 };
        Coalescer {
            slots: (0..lanes).map(|_| Mutex::default()).collect(),
        }
    }

    /// The lane of `shard`'s pushes.
    fn lane_of(&self, shard: u16) -> usize {
        match self.slots.len() {
            1 => 0,
            _ => usize::from(shard),
        }
    }

    fn slot(&self, lane: usize) -> std::sync::MutexGuard<'_, Slot> {
        // Nothing panics while a slot is held; a poisoned one is still consistent.
        self.slots[lane].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A lane's call of single pushes in flight: when it ends, or its future is
/// dropped (a request cancelled), what waited goes next (see `Store::hand_over`).
struct Turn<'a> {
    store: &'a Store,
    lane: usize,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.store.hand_over(self.lane);
    }
}

/// The messages of one script call, by shard: each shard once, with the places
/// (in the caller's list) of its messages.
type CallPlan<'a> = Vec<(u16, &'a [usize])>;

impl Store {
    /// Stores a message, idempotently by id (see [`ScheduleMode`]). `max_delay` bounds
    /// how far from Redis's now it may be due: a message due later is `TooFar`.
    /// While another push's call of the same lane is in flight (see `Coalescer`),
    /// the message waits and goes in the next call with whatever else waited
    /// meanwhile.
    pub async fn schedule(
        &self,
        msg: &NewMessage,
        mode: ScheduleMode,
        max_delay: Duration,
    ) -> Result<Scheduled> {
        if let Some(refusal) = self.stream_refusal(&msg.stream) {
            return Err(StoreError::BadStream(refusal));
        }
        let shard = self.shard_of(&msg.id, &msg.stream);
        self.note_in_use(shard).await?;
        let lane = self.coalescer.lane_of(shard);
        let waiting = {
            let mut slot = self.coalescer.slot(lane);
            if slot.in_flight {
                let (done, result) = oneshot::channel();
                slot.waiting.push(Waiting {
                    shard,
                    msg: msg.clone(),
                    mode,
                    max_delay,
                    done,
                });
                Some(result)
            } else {
                slot.in_flight = true;
                None
            }
        };
        if let Some(result) = waiting {
            return result.await.unwrap_or_else(|_| {
                Err(StoreError::Reply(
                    "the call carrying this message ended without an outcome".into(),
                ))
            });
        }
        // This push's call; whatever waits when it ends (or is dropped) goes next.
        let _turn = Turn { store: self, lane };
        let one = ToSchedule {
            msg,
            mode,
            inbox_entry: "",
        };
        let mut outcomes = self
            .schedule_call(&[(shard, &[0][..])], &[one], max_delay, None)
            .await?;
        outcomes
            .pop()
            .unwrap_or_else(|| Err(StoreError::Reply("no outcome for the message".into())))
    }

    /// Ends a lane's call of single pushes: sends what waited meanwhile in one
    /// call (of a task of its own, so the push that ended returns now), or marks
    /// the lane free.
    fn hand_over(&self, lane: usize) {
        let mut batch = {
            let mut slot = self.coalescer.slot(lane);
            if slot.waiting.is_empty() {
                slot.in_flight = false;
                return;
            }
            // One call carries one max_delay (the API's, the same for all pushes).
            let max_delay = slot.waiting[0].max_delay;
            let mut batch = Vec::new();
            for w in std::mem::take(&mut slot.waiting) {
                if batch.len() < MAX_PER_CALL && w.max_delay == max_delay {
                    batch.push(w);
                } else {
                    slot.waiting.push(w);
                }
            }
            batch
        };
        // By shard (stable: each shard's pushes keep their order), so that the call's
        // order, which the outcomes come back in, is the batch's.
        batch.sort_by_key(|w| w.shard);
        // Outside a runtime (it is shutting down) the waiters are dropped, and each
        // answers that its call ended without an outcome.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let turn = Turn {
                store: &store,
                lane,
            };
            let messages: Vec<ToSchedule<'_>> = batch
                .iter()
                .map(|w| ToSchedule {
                    msg: &w.msg,
                    mode: w.mode,
                    inbox_entry: "",
                })
                .collect();
            let by_shard = by_shard(batch.iter().map(|w| w.shard).enumerate());
            let plan: CallPlan<'_> = by_shard.iter().map(|(&s, i)| (s, &i[..])).collect();
            let outcome = store
                .schedule_call(&plan, &messages, batch[0].max_delay, None)
                .await;
            drop(messages);
            match outcome {
                Ok(results) => {
                    for (w, result) in batch.into_iter().zip(results) {
                        let _ = w.done.send(result);
                    }
                }
                Err(e) => {
                    for w in batch {
                        let _ = w.done.send(Err(e.clone()));
                    }
                }
            }
            drop(turn);
        });
    }

    /// Stores many messages, each idempotently by id as [`Store::schedule`] does, and
    /// acknowledges (and deletes) the inbox entry of each one stored, in the same
    /// atomic call (on Redis Cluster, where the inbox lives in another slot, right
    /// after it: an entry whose acknowledgement is lost is read again, and its
    /// message, stored already, is a duplicate then). Outcomes come back in input order: a due time too far ahead is
    /// `TooFar` for that message alone (its inbox entry stays unacknowledged); a
    /// failed call fails each message it carried, which may or may not have been
    /// stored (retrying with the same ids is safe).
    pub async fn schedule_many(
        &self,
        items: &[BatchItem],
        max_delay: Duration,
        ack: Option<InboxAck<'_>>,
    ) -> Vec<Result<Scheduled>> {
        let mut refused: Vec<Option<String>> = vec![None; items.len()];
        let mut shards = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            if let Some(refusal) = self.stream_refusal(&item.msg.stream) {
                refused[i] = Some(refusal);
                continue;
            }
            shards.push((i, self.shard_of(&item.msg.id, &item.msg.stream)));
        }
        let mut by_shard = by_shard(shards);
        for places in by_shard.values_mut() {
            in_stored_order(places, items);
        }
        let mut unlisted = None;
        for &shard in by_shard.keys() {
            if let Err(e) = self.note_in_use(shard).await {
                unlisted = Some(e);
                break;
            }
        }
        if let Some(e) = unlisted {
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        // On Redis Cluster the inbox is acknowledged after the scripts.
        let (script_ack, after_ack) = match self.is_cluster() {
            true => (None, ack),
            false => (ack, None),
        };
        let messages: Vec<ToSchedule<'_>> = items
            .iter()
            .map(|item| ToSchedule {
                msg: &item.msg,
                mode: item.mode,
                inbox_entry: item.inbox_entry.as_deref().unwrap_or(""),
            })
            .collect();
        let plans = plan_calls(&by_shard, self.is_cluster());
        if ack.is_some_and(|a| a.read.is_some()) && (self.is_cluster() || plans.len() > 1) {
            let e = StoreError::Reply(format!(
                "a marked inbox read is stored in one call of at most {MAX_PER_CALL} messages, on standalone Redis"
            ));
            return items.iter().map(|_| Err(e.clone())).collect();
        }
        let calls = plans.iter().map(|plan| {
            let messages = &messages;
            async move {
                let outcome = self
                    .schedule_call(plan, messages, max_delay, script_ack)
                    .await;
                (plan, outcome)
            }
        });
        let mut out: Vec<Option<Result<Scheduled>>> = refused
            .into_iter()
            .map(|r| r.map(|r| Err(StoreError::BadStream(r))))
            .collect();
        for (plan, outcome) in futures::future::join_all(calls).await {
            let places = plan.iter().flat_map(|(_, places)| places.iter());
            match outcome {
                Ok(results) => {
                    for (&i, result) in places.zip(results) {
                        out[i] = Some(result);
                    }
                }
                Err(e) => {
                    for &i in places {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let mut out: Vec<Result<Scheduled>> = out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(StoreError::Reply("no outcome for a batch item".into())))
            })
            .collect();
        if let Some(ack) = after_ack {
            let stored: Vec<usize> = (0..items.len())
                .filter(|&i| out[i].is_ok() && items[i].inbox_entry.is_some())
                .collect();
            let entries: Vec<&str> = stored
                .iter()
                .filter_map(|&i| items[i].inbox_entry.as_deref())
                .collect();
            if let Err(e) = self.ack_inbox(ack, &entries).await {
                // Stored, but still in the inbox: read again, they are duplicates.
                for i in stored {
                    out[i] = Err(e.clone());
                }
            }
        }
        out
    }

    /// Why `stream` cannot be a target of this store, if it cannot (Redis Cluster).
    fn stream_refusal(&self, stream: &str) -> Option<String> {
        self.is_cluster()
            .then(|| super::cluster_stream_refusal(stream))
            .flatten()
    }

    /// Acknowledges and deletes inbox entries whose messages are stored, in one call.
    async fn ack_inbox(&self, ack: InboxAck<'_>, entries: &[&str]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "faults")]
        if super::faults::losing_acks_of(ack.stream) {
            return Err(StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "test fault: the connection dropped before the inbox acknowledgement",
            ))));
        }
        let mut inv = self.scripts.ack_inbox.prepare_invoke();
        inv.key(ack.stream).arg(ack.group);
        for entry in entries {
            inv.arg(*entry);
        }
        let _: u64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(())
    }

    /// One script call storing the messages `plan` names (of `messages`), shard by
    /// shard: the outcome of each in the plan's order, or the call's error.
    async fn schedule_call(
        &self,
        plan: &[(u16, &[usize])],
        messages: &[ToSchedule<'_>],
        max_delay: Duration,
        ack: Option<InboxAck<'_>>,
    ) -> Result<Vec<Result<Scheduled>>> {
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.scripts.schedule_batch.prepare_invoke();
        for &(shard, _) in plan {
            shard_keys(&mut inv, &self.keys.shard(shard));
        }
        inv.arg(0)
            .arg(max_delay.as_millis() as u64)
            .arg(self.keys.wake_channel())
            .arg(ack.map_or("", |a| a.stream))
            .arg(ack.map_or(String::new(), |a| match a.read {
                Some(read) => format!("{}\n{read}", a.group),
                None => a.group.to_owned(),
            }))
            .arg(self.pending_layout.script_arg());
        let apart = self.kept_apart();
        inv.arg(apart.len());
        for stream in apart.iter() {
            inv.arg(stream);
        }
        let in_call = plan
            .iter()
            .enumerate()
            .flat_map(|(g, &(_, places))| places.iter().map(move |&i| (g + 1, &messages[i])));
        let carried = write_messages(&mut inv, in_call, ack.is_some());
        let (reply, acked) = self.invoke_acked(&inv).await?;
        super::acked::confirmed(acked)?;
        let outcomes = Scheduled::answers(array(reply)?)?;
        if outcomes.len() != carried {
            return Err(StoreError::Reply(format!(
                "schedule_batch answered {} outcomes for {carried} messages",
                outcomes.len(),
            )));
        }
        Ok(outcomes)
    }
}

/// Places (in a caller's list) grouped by shard, each shard's in the list's order.
fn by_shard(
    shards: impl IntoIterator<Item = (usize, u16)>,
) -> std::collections::BTreeMap<u16, Vec<usize>> {
    let mut by_shard: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
    for (i, shard) in shards {
        by_shard.entry(shard).or_default().push(i);
    }
    by_shard
}

/// Puts a shard's places in the order the script stores messages, (score, id): due
/// time, higher priority first, then id bytes, so that its check finds them sorted
/// and it does not sort them itself (about 1 µs of Redis a message for ids in no
/// order, 400 a call: `python3 bench/levers.py random 400 10 order`). Left in the
/// caller's order when the order can tell: an id that repeats (its first is the one
/// stored), a business key (a key lists its messages in the order they came), or
/// due times of both kinds (a delay and a time compare only once Redis's clock reads
/// them). Order is all this changes: each outcome is still matched to its place.
fn in_stored_order(places: &mut [usize], items: &[BatchItem]) {
    let Some(&first) = places.first() else {
        return;
    };
    let kind = std::mem::discriminant(&items[first].msg.due);
    let mut ids = std::collections::HashSet::with_capacity(places.len());
    let free = places.iter().all(|&i| {
        let msg = &items[i].msg;
        std::mem::discriminant(&msg.due) == kind && msg.key.is_none() && ids.insert(msg.id.as_str())
    });
    if free {
        places.sort_unstable_by_key(|&i| {
            let msg = &items[i].msg;
            (
                msg.due.as_ms(),
                std::cmp::Reverse(msg.priority),
                msg.id.as_str(),
            )
        });
    }
}

/// The script calls that store `by_shard`, at most [`MAX_PER_CALL`] messages each:
/// on standalone Redis a call takes as many shards as fit, on Redis Cluster one
/// shard (a call's keys must share a slot).
fn plan_calls(
    by_shard: &std::collections::BTreeMap<u16, Vec<usize>>,
    one_shard_a_call: bool,
) -> Vec<CallPlan<'_>> {
    let mut plans = Vec::new();
    let (mut plan, mut carried): (CallPlan<'_>, usize) = (Vec::new(), 0);
    for (&shard, places) in by_shard {
        let mut rest = &places[..];
        while !rest.is_empty() {
            if carried == MAX_PER_CALL || (one_shard_a_call && carried > 0) {
                plans.push(std::mem::take(&mut plan));
                carried = 0;
            }
            let take = rest.len().min(MAX_PER_CALL - carried);
            plan.push((shard, &rest[..take]));
            carried += take;
            rest = &rest[take..];
        }
    }
    if !plan.is_empty() {
        plans.push(plan);
    }
    plans
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every message goes in exactly one call, each shard's in their order; no
        /// call carries more than MAX_PER_CALL, a call names a shard once, and on
        /// Redis Cluster a call carries one shard.
        #[test]
        fn calls_carry_every_message_once(
            shards in proptest::collection::vec(0u16..40, 0..3000),
            cluster in any::<bool>(),
        ) {
            let by_shard = by_shard(shards.iter().copied().enumerate());
            let plans = plan_calls(&by_shard, cluster);
            let mut seen = vec![0; shards.len()];
            let mut last_place: std::collections::HashMap<u16, usize> = Default::default();
            for plan in &plans {
                let carried: usize = plan.iter().map(|(_, places)| places.len()).sum();
                prop_assert!(carried > 0 && carried <= MAX_PER_CALL);
                let named: std::collections::BTreeSet<u16> = plan.iter().map(|(s, _)| *s).collect();
                prop_assert_eq!(named.len(), plan.len());
                if cluster {
                    prop_assert_eq!(plan.len(), 1);
                }
                for &(shard, places) in plan {
                    for &i in places {
                        prop_assert_eq!(shards[i], shard);
                        seen[i] += 1;
                        if let Some(&before) = last_place.get(&shard) {
                            prop_assert!(before < i);
                        }
                        last_place.insert(shard, i);
                    }
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            // Standalone: as few calls as the bound allows.
            if !cluster {
                prop_assert_eq!(plans.len(), shards.len().div_ceil(MAX_PER_CALL));
            }
        }

        /// A shard's places come out in the script's (score, id) order when nothing
        /// tells their order, as they came otherwise, and always the same places.
        #[test]
        fn a_shard_s_places_take_the_stored_order_unless_their_order_tells(
            messages in proptest::collection::vec(
                (0u16..3000, 0u64..4, 0u8..10, prop::bool::weighted(0.03), prop::bool::weighted(0.03)),
                0..40,
            ),
        ) {
            use crate::message::{Due, MessageId, MessageKey};
            let items: Vec<BatchItem> = messages
                .iter()
                .map(|&(id, due, priority, at, keyed)| {
                    let mut msg = NewMessage::payload("s", "x", Duration::ZERO)
                        .with_id(MessageId::parse(&format!("m{id}")).unwrap())
                        .with_key(keyed.then(|| MessageKey::parse("k").unwrap()));
                    msg.due = if at { Due::At(due) } else { Due::In(Duration::from_millis(due)) };
                    msg.priority = priority;
                    BatchItem::new(msg)
                })
                .collect();
            let mut places: Vec<usize> = (0..items.len()).collect();
            in_stored_order(&mut places, &items);
            let mut same = places.clone();
            same.sort_unstable();
            prop_assert_eq!(&same, &(0..items.len()).collect::<Vec<_>>());
            let ids: std::collections::HashSet<u16> = messages.iter().map(|m| m.0).collect();
            let free = ids.len() == messages.len()
                && messages.iter().all(|m| !m.4 && m.3 == messages[0].3);
            if free {
                for pair in places.windows(2) {
                    let key = |i: usize| {
                        let msg = &items[i].msg;
                        (msg.due.as_ms(), std::cmp::Reverse(msg.priority), msg.id.as_str().to_owned())
                    };
                    prop_assert!(key(pair[0]) < key(pair[1]), "{:?}", places);
                }
            } else {
                prop_assert_eq!(places, same);
            }
        }
    }
}
