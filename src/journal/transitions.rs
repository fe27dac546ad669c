//! The transition log (`delayq_transitions`): every change of a message, a row
//! each, written in the transaction that writes the change to `delayq_messages`, so
//! that a message's journey can be told once Redis has forgotten it
//! (`GET /v1/messages/{id}/history`). Pruned past `journal.transitions_retention`.
//! A push's own step is kept in the row the push writes (`came_*`), so that a
//! push writes one row, not two, and goes into the log when the row next changes.

use std::sync::atomic::Ordering;

use mysql_async::prelude::Queryable;

use super::{Journal, ROWS_PER_STATEMENT, Result};
use crate::store::{OutboxCode, OutboxLine};

/// What a change did to a message (the `step` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Pushed = 1,
    Replaced = 2,
    Rescheduled = 3,
    Cancelled = 4,
    Forwarded = 5,
    Redelivered = 6,
    Dead = 7,
    Expired = 8,
    Replayed = 9,
    Restored = 10,
}

impl Step {
    fn from_code(code: u8) -> Option<Step> {
        Some(match code {
            1 => Step::Pushed,
            2 => Step::Replaced,
            3 => Step::Rescheduled,
            4 => Step::Cancelled,
            5 => Step::Forwarded,
            6 => Step::Redelivered,
            7 => Step::Dead,
            8 => Step::Expired,
            9 => Step::Replayed,
            10 => Step::Restored,
            _ => return None,
        })
    }

    /// The step's name, as the API says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Pushed => "pushed",
            Step::Replaced => "replaced",
            Step::Rescheduled => "rescheduled",
            Step::Cancelled => "cancelled",
            Step::Forwarded => "forwarded",
            Step::Redelivered => "redelivered",
            Step::Dead => "dead_lettered",
            Step::Expired => "expired",
            Step::Replayed => "replayed",
            Step::Restored => "restored",
        }
    }

    /// The step of a push: pushed, or replaced (a push that replaces a message).
    pub(super) fn of_push(replace: bool) -> Step {
        if replace {
            Step::Replaced
        } else {
            Step::Pushed
        }
    }

    /// The step an outbox line tells of.
    fn of_line(code: OutboxCode) -> Step {
        match code {
            OutboxCode::Delivered => Step::Forwarded,
            OutboxCode::Expired => Step::Expired,
            OutboxCode::Dead => Step::Dead,
            OutboxCode::Cancelled => Step::Cancelled,
            OutboxCode::Rescheduled => Step::Rescheduled,
            OutboxCode::Replayed => Step::Replayed,
            OutboxCode::Redelivered => Step::Redelivered,
            OutboxCode::DeadReason => Step::Dead,
        }
    }
}

/// Who made a change, as far as its writer knows: the node, the shard, the
/// leader's epoch (a leader's step) and the API token's name (a step asked over
/// HTTP). What one copy of a change leaves out, another may fill in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Who {
    pub node: Option<String>,
    pub shard: Option<u16>,
    pub epoch: Option<u64>,
    pub token: Option<String>,
}

impl Who {
    /// A change asked over HTTP of this node, with this token.
    pub fn api(node: &str, token: &str) -> Who {
        Who {
            node: Some(node.to_owned()),
            token: Some(token.to_owned()),
            ..Who::default()
        }
    }
}

/// How pushes came: the path (`http`, `batch`, `inbox`, `schedule`) and who sent
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Came {
    pub how: &'static str,
    pub who: Who,
}

impl Came {
    /// Pushes asked over HTTP of this node, with this token.
    pub fn api(how: &'static str, node: &str, token: &str) -> Came {
        Came {
            how,
            who: Who::api(node, token),
        }
    }

    /// Pushes this node makes of its own accord (the inbox, schedules).
    pub fn node(how: &'static str, node: &str) -> Came {
        Came {
            how,
            who: Who {
                node: Some(node.to_owned()),
                ..Who::default()
            },
        }
    }
}

/// One step of a message's journey.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub stream: String,
    pub step: Step,
    /// Redis's time of the change (epoch ms).
    pub at_ms: u64,
    pub who: Who,
    /// The entry written (forwarded, dead-lettered, expired), the new due time
    /// (rescheduled, epoch ms), or how it came (pushed).
    pub detail: Option<String>,
    /// A redelivery's attempt.
    pub attempt: Option<u32>,
    /// Why: a redelivery's (`ack_timeout`), a dead letter's (`corrupt`,
    /// `unwritable`, `max_attempts`).
    pub reason: Option<String>,
}

/// The upsert of transition rows: a change copied again adds no row, and fills in
/// who made it where the copy before did not know.
const UPSERT: &str = "ON DUPLICATE KEY UPDATE node = COALESCE(node, VALUES(node)), \
     shard = COALESCE(shard, VALUES(shard)), epoch = COALESCE(epoch, VALUES(epoch)), \
     token = COALESCE(token, VALUES(token)), detail = COALESCE(detail, VALUES(detail)), \
     attempt = COALESCE(attempt, VALUES(attempt)), reason = COALESCE(reason, VALUES(reason))";

/// A row to write: id, stream, step, at, who, detail.
pub(super) struct Row<'a> {
    pub id: &'a str,
    pub stream: &'a str,
    pub step: Step,
    pub at_ms: u64,
    pub who: &'a Who,
    pub detail: Option<&'a str>,
    pub attempt: Option<u32>,
    pub reason: Option<&'a str>,
}

impl<'a> Row<'a> {
    /// The row of an outbox line.
    pub(super) fn of_line(line: &'a OutboxLine, who: &'a Who) -> Row<'a> {
        let step = Step::of_line(line.code);
        Row {
            id: &line.id,
            stream: line.stream.as_deref().unwrap_or(""),
            step,
            at_ms: line.at_ms,
            who,
            // A replay's line carries its due time, which is the change's time; a
            // reason's line its reason.
            detail: (step != Step::Replayed && line.code != OutboxCode::DeadReason)
                .then_some(line.entry.as_deref())
                .flatten(),
            attempt: line.attempt,
            reason: match line.code {
                OutboxCode::Redelivered => Some("ack_timeout"),
                OutboxCode::DeadReason => line.entry.as_deref(),
                _ => None,
            },
        }
    }
}

/// The columns of a push's step still held by its row (`delayq_messages.came_*`,
/// at the row's `updated_ms`), as the log's columns: what [`Journal::history`]
/// reads beside the log's rows, and what [`Journal::keep_pushes`] copies.
const CAME: &str =
    "id, updated_ms, came_step, stream, came_node, NULL, NULL, came_token, came_how, NULL, NULL";

/// Empties a row's push step (once it is in the log, or past its retention).
pub(super) const CAME_EMPTIED: &str =
    "came_step = NULL, came_how = NULL, came_node = NULL, came_token = NULL";

/// The columns of `delayq_messages` that hold a push's own step.
const CAME_COLUMNS: [&str; 4] = ["came_step", "came_how", "came_node", "came_token"];

/// Assignments of the push-step columns, in [`CAME_COLUMNS`]' order: each set to
/// `value(column)` where `cond` holds, left as it is elsewhere.
pub(super) fn came_where(cond: &str, value: impl Fn(&str) -> String) -> String {
    CAME_COLUMNS
        .iter()
        .map(|c| format!("{c} = IF({cond}, {}, {c})", value(c)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The options of a transaction that may copy push steps (see
/// [`Journal::keep_pushes`]): `READ COMMITTED`, where locking the rows about to
/// change locks those rows only, not the gaps beside them, which new pushes'
/// rows would wait for (and deadlock on, with a copy of deliveries under way).
pub(super) fn locking_only_rows() -> mysql_async::TxOpts {
    let mut opts = mysql_async::TxOpts::default();
    opts.with_isolation_level(mysql_async::IsolationLevel::ReadCommitted);
    opts
}

impl Journal {
    /// Copies into the log the push steps that the rows of `ids` still hold: called
    /// in the transaction that is about to change those rows, which empty them,
    /// with the rows locked. Nothing while the log is off.
    pub(super) async fn keep_pushes<Q: Queryable>(&self, conn: &mut Q, ids: &[&str]) -> Result<()> {
        if !self.transitions || ids.is_empty() {
            return Ok(());
        }
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            let marks = vec!["?"; chunk.len()].join(", ");
            // The rows locked for the change first: copying under shared locks and
            // then changing them would deadlock two transactions doing so at once
            // (a cancel told to the journal and its outbox copy).
            conn.exec_drop(
                format!("SELECT 1 FROM delayq_messages WHERE id IN ({marks}) FOR UPDATE"),
                chunk.to_vec(),
            )
            .await?;
            conn.exec_drop(
                format!(
                    "INSERT INTO delayq_transitions \
                     (id, at_ms, step, stream, node, shard, epoch, token, detail, attempt, reason) \
                     SELECT {CAME} FROM delayq_messages \
                     WHERE id IN ({marks}) AND came_step IS NOT NULL {UPSERT}"
                ),
                chunk.to_vec(),
            )
            .await?;
        }
        Ok(())
    }

    /// Writes `rows` on `conn` (a transaction's, so that they go with the change).
    /// Nothing while the log is off (`journal.transitions = false`).
    pub(super) async fn write_steps<Q: Queryable>(
        &self,
        conn: &mut Q,
        rows: &[Row<'_>],
    ) -> Result<()> {
        if !self.transitions {
            return Ok(());
        }
        for chunk in rows.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
            let sql = format!(
                "INSERT INTO delayq_transitions \
                 (id, stream, step, at_ms, node, shard, epoch, token, detail, attempt, reason) \
                 VALUES {values} {UPSERT}"
            );
            let mut params: Vec<mysql_async::Value> = Vec::with_capacity(chunk.len() * 11);
            for row in chunk {
                params.push(row.id.into());
                params.push(row.stream.into());
                params.push((row.step as u8).into());
                params.push(row.at_ms.into());
                params.push(row.who.node.clone().into());
                params.push(row.who.shard.into());
                params.push(row.who.epoch.into());
                params.push(row.who.token.clone().into());
                params.push(row.detail.into());
                params.push(row.attempt.into());
                params.push(row.reason.into());
            }
            conn.exec_drop(sql, params).await?;
        }
        Ok(())
    }
}

type HistoryRow = (
    Vec<u8>,
    u8,
    u64,
    Option<Vec<u8>>,
    Option<u16>,
    Option<u64>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<u32>,
    Option<Vec<u8>>,
);

impl Journal {
    /// Every step of message `id` (of any stream) the journal keeps, oldest first.
    pub async fn history(&self, id: &str) -> Result<Vec<Transition>> {
        let mut conn = self.pool.get_conn().await?;
        // The log's rows, and the push steps rows still hold.
        let rows: Vec<HistoryRow> = conn
            .exec(
                // (UNION, not UNION ALL: a step copied into the log from a row
                // that kept it too is told once.)
                "SELECT stream, step, at_ms, node, shard, epoch, token, detail, attempt, reason \
                 FROM delayq_transitions WHERE id = ? \
                 UNION SELECT stream, came_step, updated_ms, came_node, NULL, NULL, \
                 came_token, came_how, NULL, NULL FROM delayq_messages \
                 WHERE id = ? AND came_step IS NOT NULL ORDER BY 3, 2",
                (id, id),
            )
            .await?;
        let text = |b: Option<Vec<u8>>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
        Ok(rows
            .into_iter()
            .filter_map(
                |(stream, step, at_ms, node, shard, epoch, token, detail, attempt, reason)| {
                    Some(Transition {
                        stream: String::from_utf8_lossy(&stream).into_owned(),
                        step: Step::from_code(step)?,
                        at_ms,
                        who: Who {
                            node: text(node),
                            shard,
                            epoch,
                            token: text(token),
                        },
                        detail: text(detail),
                        attempt,
                        reason: text(reason),
                    })
                },
            )
            .collect())
    }

    /// Deletes up to `limit` steps made before `before_ms`, the log's rows first,
    /// then the push steps rows still hold; how many it deleted (call again while
    /// it deletes `limit`). A row holds its push step only while unchanged since,
    /// so those older than `before_ms` are rows of pending messages last written
    /// before it; the ones emptied by an earlier call (`came_pruned_to`) are not
    /// looked at again.
    pub async fn trim_transitions(&self, before_ms: u64, limit: usize) -> Result<u64> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "DELETE FROM delayq_transitions WHERE at_ms < ? ORDER BY at_ms LIMIT ?",
            (before_ms, limit as u64),
        )
        .await?;
        let steps = conn.affected_rows();
        if steps >= limit as u64 {
            return Ok(steps);
        }
        let from = self.came_pruned_to.load(Ordering::Relaxed).min(before_ms);
        conn.exec_drop(
            format!(
                "UPDATE delayq_messages SET {CAME_EMPTIED} WHERE state = 0 \
                 AND updated_ms >= ? AND updated_ms < ? AND came_step IS NOT NULL LIMIT ?"
            ),
            (from, before_ms, limit as u64 - steps),
        )
        .await?;
        let came = conn.affected_rows();
        if steps + came < limit as u64 {
            self.came_pruned_to.fetch_max(before_ms, Ordering::Relaxed);
        }
        Ok(steps + came)
    }
}

impl Journal {
    /// A "restored" step for each message (id, stream) a restore put back, at
    /// `at_ms`, made by `who`.
    pub async fn restored(&self, messages: &[(&str, &str)], at_ms: u64, who: &Who) -> Result<()> {
        let rows: Vec<Row> = messages
            .iter()
            .map(|&(id, stream)| Row {
                id,
                stream,
                step: Step::Restored,
                at_ms,
                who,
                detail: None,
                attempt: None,
                reason: None,
            })
            .collect();
        let mut conn = self.pool.get_conn().await?;
        self.write_steps(&mut conn, &rows).await
    }
}
