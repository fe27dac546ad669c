//! Reading the journal: one message, the unfinished ones page by page (for a restore
//! and the keeper's reconciliation), the stale ones, the counts.

use super::scheduled::message;
use super::*;

/// A row as `unfinished` reads it: id, stream, body, due ms.
pub(super) type PageRow = (Vec<u8>, Vec<u8>, Vec<u8>, u64);

/// A row as `changed_between` reads it: id, stream, body, due ms, state.
type ChangedRow = (Vec<u8>, Vec<u8>, Vec<u8>, u64, u8);

/// A row as `lookup` reads it: stream, due ms, state, entry id, updated ms.
pub(super) type LookupRow = (Vec<u8>, u64, u8, Option<Vec<u8>>, u64);

impl Journal {
    /// What the journal holds of `id`: a row per target stream (one, but on Redis
    /// Cluster, where an id is unique per stream's slot only).
    pub async fn lookup(&self, id: &MessageId) -> Result<Vec<Row>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<LookupRow> = conn
            .exec(
                "SELECT stream, due_ms, state, entry_id, updated_ms FROM delayq_messages \
                 WHERE id = ? ORDER BY updated_ms DESC",
                (id.as_str(),),
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(stream, due_ms, state, entry_id, updated_ms)| Row {
                stream: String::from_utf8_lossy(&stream).into_owned(),
                due_ms,
                state: State::from_code(state),
                entry_id: entry_id.map(|e| String::from_utf8_lossy(&e).into_owned()),
                updated_ms,
            })
            .collect())
    }

    /// The messages of `id` the journal holds not finished (one, but on Redis
    /// Cluster), each due at its journaled time.
    pub async fn unfinished_by_id(&self, id: &MessageId) -> Result<Vec<NewMessage>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<PageRow> = conn
            .exec(
                "SELECT id, stream, body, due_ms FROM delayq_messages WHERE id = ? AND state = 0",
                (id.as_str(),),
            )
            .await?;
        rows.into_iter()
            .map(|(id, stream, body, due_ms)| message(&id, &stream, &body, due_ms))
            .collect()
    }

    /// Up to `limit` messages not finished, due before `due_before` and last
    /// written before `written_before`, in due order after `after` (the
    /// reconciliation's page): each as its id, target stream and due time.
    pub async fn stale(
        &self,
        after: Option<&(u64, String, String)>,
        due_before: u64,
        written_before: u64,
        limit: usize,
    ) -> Result<Vec<(MessageId, String, u64)>> {
        let mut conn = self.pool.get_conn().await?;
        let (due, id, stream) = after.cloned().unwrap_or((0, String::new(), String::new()));
        let rows: Vec<(Vec<u8>, Vec<u8>, u64)> = conn
            .exec(
                "SELECT id, stream, due_ms FROM delayq_messages WHERE state = 0 \
                 AND due_ms >= ? AND (due_ms > ? OR id > ? OR (id = ? AND stream > ?)) \
                 AND due_ms < ? AND updated_ms < ? ORDER BY due_ms, id, stream LIMIT ?",
                (
                    due,
                    due,
                    id.as_str(),
                    id.as_str(),
                    stream.as_str(),
                    due_before,
                    written_before,
                    limit as u64,
                ),
            )
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, stream, due)| {
                let id = MessageId::parse(std::str::from_utf8(&id).ok()?).ok()?;
                Some((id, String::from_utf8_lossy(&stream).into_owned(), due))
            })
            .collect())
    }

    /// How many messages the journal holds not finished.
    pub async fn count_unfinished(&self) -> Result<u64> {
        let mut conn = self.pool.get_conn().await?;
        let n: Option<u64> = conn
            .query_first("SELECT COUNT(*) FROM delayq_messages WHERE state = 0")
            .await?;
        Ok(n.unwrap_or(0))
    }

    /// What a restore would bring back: messages not finished, schedules kept and
    /// streams paused. Nothing of it: a Redis without the marker is new, not one
    /// that lost its data.
    pub async fn count_restorable(&self) -> Result<u64> {
        let mut conn = self.pool.get_conn().await?;
        let n: Option<u64> = conn
            .query_first(
                "SELECT (SELECT COUNT(*) FROM delayq_messages WHERE state = 0)                  + (SELECT COUNT(*) FROM delayq_schedules WHERE definition IS NOT NULL)                  + (SELECT COUNT(*) FROM delayq_paused WHERE paused = 1)",
            )
            .await?;
        Ok(n.unwrap_or(0))
    }

    /// Up to `limit` messages not finished, in due order after `after` (a page's
    /// last message's due time, id and stream), each as the message to schedule
    /// again (due at its journaled due time).
    pub async fn unfinished(
        &self,
        after: Option<&(u64, String, String)>,
        limit: usize,
    ) -> Result<Vec<NewMessage>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<PageRow> = match after {
            None => {
                conn.exec(
                    "SELECT id, stream, body, due_ms FROM delayq_messages WHERE state = 0 \
                     ORDER BY due_ms, id, stream LIMIT ?",
                    (limit as u64,),
                )
                .await?
            }
            // Spelled out rather than as a row comparison, with `due_ms >= ?` on
            // its own, so that the page is a range of by_state_due (state, due_ms,
            // and the primary key after them) and not a scan from its start.
            Some((due, id, stream)) => {
                conn.exec(
                    "SELECT id, stream, body, due_ms FROM delayq_messages WHERE state = 0 \
                     AND due_ms >= ? AND (due_ms > ? OR id > ? OR (id = ? AND stream > ?)) \
                     ORDER BY due_ms, id, stream LIMIT ?",
                    (
                        *due,
                        *due,
                        id.as_str(),
                        id.as_str(),
                        stream.as_str(),
                        limit as u64,
                    ),
                )
                .await?
            }
        };
        rows.into_iter()
            .map(|(id, stream, body, due_ms)| message(&id, &stream, &body, due_ms))
            .collect()
    }

    /// Every message last written from `since_ms` to before `until_ms` (Redis's
    /// time of its last change), as it is now: what a restore reads again once the
    /// changes answered around a loss of Redis's data are all in (see
    /// `restore::settle`). A range of by_state_updated per state.
    pub async fn changed_between(&self, since_ms: u64, until_ms: u64) -> Result<Vec<Changed>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<ChangedRow> = conn
            .exec(
                "SELECT id, stream, body, due_ms, state FROM delayq_messages \
                 WHERE state IN (0, 1, 2, 3, 4) AND updated_ms >= ? AND updated_ms < ?",
                (since_ms, until_ms),
            )
            .await?;
        rows.into_iter()
            .map(|(id, stream, body, due_ms, state)| {
                let state = State::from_code(state);
                // A finished row the journal learned only from the outbox has no body.
                let scheduled = match state {
                    State::Scheduled => Some(message(&id, &stream, &body, due_ms)?),
                    _ => None,
                };
                Ok(Changed {
                    id: String::from_utf8_lossy(&id).into_owned(),
                    stream: String::from_utf8_lossy(&stream).into_owned(),
                    due_ms,
                    state,
                    scheduled,
                })
            })
            .collect()
    }
}

/// A message as the journal holds it now (see [`Journal::changed_between`]).
#[derive(Clone, Debug)]
pub struct Changed {
    pub id: String,
    pub stream: String,
    pub due_ms: u64,
    pub state: State,
    /// The message to schedule, while it is scheduled.
    pub scheduled: Option<NewMessage>,
}
