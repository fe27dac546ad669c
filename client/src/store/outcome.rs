//! What the store answers: the typed outcomes of its scripts.

use std::time::Duration;

use redis::Value;

use super::{Result, StoreError, int, text};
use crate::message::StoredMessage;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScheduleMode {
    /// An id that exists already is a duplicate and nothing changes.
    New,
    /// An id that exists already is overwritten and scheduled again.
    Replace,
    /// An id this node has just made ([`crate::message::MessageId::generate`]),
    /// which nothing can hold yet: stored without looking it up in the pending
    /// index or the records (a push's largest cost but its storing). Never for an
    /// id a producer gave or one made again from something (an inbox entry's id):
    /// those are [`ScheduleMode::New`].
    Fresh,
}

impl ScheduleMode {
    /// The word the schedule script takes for this mode.
    pub(super) fn as_arg(self) -> &'static str {
        match self {
            ScheduleMode::New => "new",
            ScheduleMode::Replace => "replace",
            ScheduleMode::Fresh => "fresh",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheduled {
    Scheduled {
        due_ms: u64,
    },
    Replaced {
        due_ms: u64,
    },
    /// The id is known already; `due_ms` is set while it is still scheduled.
    Duplicate {
        due_ms: Option<u64>,
        state: String,
    },
}

impl Scheduled {
    /// Reads the schedule script's answer for one message: its status, due time and,
    /// for a duplicate, the state it is in. None for a status the script does not give.
    pub(super) fn from_reply(status: &str, due: u64, state: String) -> Option<Scheduled> {
        Some(match status {
            "scheduled" => Scheduled::Scheduled { due_ms: due },
            "replaced" => Scheduled::Replaced { due_ms: due },
            "duplicate" => Scheduled::Duplicate {
                due_ms: (due > 0).then_some(due),
                state,
            },
            _ => return None,
        })
    }

    /// schedule_batch.lua's answer, message by message: a due time alone for a
    /// message stored as new, its status, due time and detail for any other; a due
    /// time too far ahead is that message's error.
    pub(super) fn answers(values: Vec<Value>) -> Result<Vec<Result<Scheduled>>> {
        let mut values = values.into_iter();
        let mut outcomes = Vec::with_capacity(values.len());
        while let Some(first) = values.next() {
            if let Value::Int(due) = first {
                outcomes.push(Ok(Scheduled::Scheduled {
                    due_ms: due.max(0) as u64,
                }));
                continue;
            }
            let (Some(due), Some(detail)) = (values.next(), values.next()) else {
                return Err(StoreError::Reply(
                    "schedule_batch answered an outcome cut short".into(),
                ));
            };
            let (status, due, detail) = (text(&first)?, int(&due)?.max(0) as u64, text(&detail)?);
            if status == "too_far" {
                outcomes.push(Err(StoreError::too_far(&detail)));
                continue;
            }
            match Scheduled::from_reply(&status, due, detail) {
                Some(scheduled) => outcomes.push(Ok(scheduled)),
                None => return Err(StoreError::Reply(format!("schedule_batch said {status:?}"))),
            }
        }
        Ok(outcomes)
    }
}

/// Final states, kept on record for the retention window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    Delivered,
    Expired,
    Dead,
    Cancelled,
}

impl RecordState {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "delivered" => RecordState::Delivered,
            "expired" => RecordState::Expired,
            "dead" => RecordState::Dead,
            "cancelled" => RecordState::Cancelled,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Delivered => "delivered",
            RecordState::Expired => "expired",
            RecordState::Dead => "dead",
            RecordState::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub state: RecordState,
    /// The stream written to: the target, its dead-letter stream, or none for a cancellation.
    pub stream: Option<String>,
    pub entry_id: Option<String>,
    pub at_ms: u64,
    pub attempt: u64,
    /// Delivered: how long after its due time it was sent (ms), when the record says
    /// (records written before this was kept do not).
    pub late_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Scheduled(StoredMessage),
    Done(Record),
    /// The body is in Redis but cannot be read; the forwarder will dead-letter it.
    Corrupt(String),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    Cancelled,
    AlreadyDone(RecordState),
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rescheduled {
    /// Moved to `due_ms`, at Redis's time `at_ms`, a message to `stream`.
    Rescheduled {
        due_ms: u64,
        at_ms: u64,
        stream: String,
    },
    NotScheduled(RecordState),
    Unknown,
}

/// What a forward call does besides moving messages; fixed for a run.
#[derive(Clone, Debug)]
pub struct ForwardOptions {
    pub batch_size: usize,
    pub retention: Duration,
    /// Field added to every forwarded entry with the message id (None = not added).
    pub id_field: Option<String>,
    /// Field added to every forwarded entry with the delivery attempt (None = not added).
    pub attempt_field: Option<String>,
    /// Field added to a forwarded entry with the message's business key, if it has
    /// one (None = not added).
    pub key_field: Option<String>,
    /// Streams whose entries carry the key in a field of their own (None: none).
    pub stream_key_fields: Vec<(String, Option<String>)>,
    pub dead_letter_suffix: String,
    /// `MAXLEN ~` applied to every target stream (0 = none) unless overridden per stream.
    pub default_maxlen: u64,
    pub maxlen: Vec<(String, u64)>,
}

/// What one forward call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    pub forwarded: u64,
    pub expired: u64,
    pub dead: u64,
    /// Due time of the shard's earliest remaining message.
    pub next_due_ms: Option<u64>,
    /// Redis's clock when the batch was taken, in µs.
    pub now_us: u64,
    /// Forward time minus due time of each forwarded message no held set kept,
    /// by Redis's clock.
    pub lateness_ms: Vec<u64>,
    /// The same of each forwarded message its stream held on purpose (paused, or
    /// kept to its rate limit): counted apart from lateness.
    pub held_wait_ms: Vec<u64>,
    pub per_stream: Vec<(String, u64)>,
    /// Messages kept for later because neither their stream nor their dead-letter
    /// stream takes them (both refuse for reasons of their own, e.g. a wrong type).
    pub parked: u64,
    /// The Redis error that stopped the batch part-way (OOM, READONLY, ...): the
    /// messages before it were moved, it and the rest stay scheduled.
    pub held_back: Option<String>,
    /// Due messages of rate-limited streams moved to their stream's held set.
    pub newly_held: u64,
    /// Messages each rate-limited stream (of the call's budgets) still holds in this
    /// shard, for the streams that hold any.
    pub holding: Vec<(String, u64)>,
    /// Per stream the call forwarded or expired messages of: the worst lateness of
    /// its forwards no held set kept, and how many expired into its dead letters.
    pub per_stream_times: Vec<StreamTimes>,
}

/// One stream's share of a forward call, for the dashboard's charts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamTimes {
    pub stream: String,
    /// Worst forward time minus due time (ms) of the call's forwards to it that no
    /// held set kept; None when there were none.
    pub worst_lateness_ms: Option<u64>,
    /// Its messages past their ttl, written to its dead-letter stream.
    pub expired: u64,
}

impl ForwardBatch {
    pub fn moved(&self) -> u64 {
        self.forwarded + self.expired + self.dead
    }

    /// Messages the call moved on: sent, or set aside for their stream's limit.
    pub fn progressed(&self) -> u64 {
        self.moved() + self.newly_held
    }

    /// How long from the call until the shard's next message falls due, by Redis's
    /// clock to the µs (a due time is a whole ms: waiting whole ms from a clock
    /// read to the ms would wake up to a ms late). None when nothing is scheduled.
    pub fn until_next_due(&self) -> Option<Duration> {
        let due = self.next_due_ms?;
        Some(Duration::from_micros(
            due.saturating_mul(1000).saturating_sub(self.now_us),
        ))
    }
}

/// What one trim call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub forgotten: u64,
    /// Record ids whose retention had passed, forgotten or not (an id recorded again
    /// since keeps its newer record).
    pub looked_at: u64,
    /// Ids the key index dropped: neither pending nor on record any more.
    pub keys_pruned: u64,
    /// Ids the finished lists dropped: no longer on record.
    pub unlisted: u64,
    /// Whether the finished lists may have more such ids (the call stopped at its
    /// bound): another call drops them.
    pub more_to_unlist: bool,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The script's answer reads back as the outcomes it tells, in order: a due
        /// time alone for a message stored as new, three values for any other; an
        /// answer cut short is an error, not fewer outcomes.
        #[test]
        fn the_schedule_answer_reads_back_outcome_by_outcome(
            told in proptest::collection::vec((0u8..4, 0i64..(1 << 53), "[a-z]{0,12}"), 0..200),
            cut in 1usize..3,
        ) {
            let mut values = Vec::new();
            for (kind, due, detail) in &told {
                let status = match kind {
                    0 => {
                        values.push(Value::Int(*due));
                        continue;
                    }
                    1 => "replaced",
                    2 => "duplicate",
                    _ => "too_far",
                };
                let detail = match kind {
                    3 => format!("TOO_FAR due time {due} is more than max_delay 5 ms after now 1"),
                    _ => detail.clone(),
                };
                values.push(Value::BulkString(status.into()));
                values.push(Value::Int(*due));
                values.push(Value::BulkString(detail.into_bytes()));
            }
            let read = Scheduled::answers(values.clone()).unwrap();
            prop_assert_eq!(read.len(), told.len());
            for ((kind, due, detail), outcome) in told.iter().zip(&read) {
                let due = *due as u64;
                match (kind, outcome) {
                    (0, Ok(Scheduled::Scheduled { due_ms })) | (1, Ok(Scheduled::Replaced { due_ms })) => {
                        prop_assert_eq!(*due_ms, due)
                    }
                    (2, Ok(Scheduled::Duplicate { due_ms, state })) => {
                        prop_assert_eq!((*due_ms, state), ((due > 0).then_some(due), detail))
                    }
                    (3, Err(StoreError::TooFar { due_ms, .. })) => prop_assert_eq!(*due_ms, due),
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            if let Some(last) = told.iter().rposition(|t| t.0 != 0) {
                // The last message of three values loses its end (the ones after it
                // are one value each).
                let mut short = values;
                short.truncate(short.len() - (told.len() - last - 1) - cut);
                prop_assert!(Scheduled::answers(short).is_err());
            }
        }
    }

    fn batch(next_due_ms: Option<u64>, now_ms: u64, now_us: u64) -> ForwardBatch {
        ForwardBatch {
            next_due_ms,
            now_us: now_ms * 1000 + now_us,
            ..ForwardBatch::default()
        }
    }

    #[test]
    fn the_wait_for_the_next_due_time_counts_the_microseconds_already_past() {
        #[rustfmt::skip]
        let cases = [
            (None, 1_000, 0, None),
            (Some(1_005), 1_000, 0, Some(5_000)),
            (Some(1_005), 1_000, 999, Some(4_001)),
            (Some(1_001), 1_000, 400, Some(600)),
            (Some(1_000), 1_000, 400, Some(0)),
            (Some(900), 1_000, 0, Some(0)),
            (Some(u64::MAX), 0, 0, Some(u64::MAX)),
        ];
        for (due, now_ms, now_us, want) in cases {
            assert_eq!(
                batch(due, now_ms, now_us).until_next_due(),
                want.map(Duration::from_micros),
                "{due:?} at {now_ms} ms + {now_us} µs"
            );
        }
    }
}
