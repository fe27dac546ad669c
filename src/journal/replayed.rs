//! A dead letter replayed: its journal row scheduled again, before the replay is
//! answered and again when the outbox's line is copied.

use mysql_async::prelude::Queryable;

use super::{Journal, Result, State, Who, transitions};
use crate::store::OutboxLine;

/// A dead letter replayed: its row scheduled again, due when replayed (the line's
/// entry), unless the row changed since. A row without a body (a message the
/// journal learned of only when it finished) stays as it is.
pub(super) const REPLAYED: &str = "UPDATE delayq_messages SET state = 0, due_ms = ?, entry_id = NULL, \
     updated_ms = ? WHERE id = ? AND stream = ? AND state = 3 AND body <> '' AND updated_ms < ?";

pub(super) fn params(line: &OutboxLine, stream: Option<&str>) -> Vec<mysql_async::Value> {
    let due: u64 = line
        .entry
        .as_deref()
        .and_then(|d| d.parse().ok())
        .unwrap_or(line.at_ms);
    vec![
        due.into(),
        line.at_ms.into(),
        line.id.as_str().into(),
        stream.unwrap_or("").into(),
        line.at_ms.into(),
    ]
}

impl Journal {
    /// Records one replayed dead letter before its answer: whether the journal
    /// now holds it scheduled again (false: it has no row of it with a body, say
    /// trimmed after `journal.retention`, so a restore could not bring it back).
    /// The replay is a step of the message's transition log, made by `who`.
    pub async fn replayed(&self, line: &OutboxLine, who: &Who) -> Result<bool> {
        let mut conn = self.pool.get_conn().await?;
        self.write_steps(&mut conn, &[transitions::Row::of_line(line, who)])
            .await?;
        conn.exec_drop(REPLAYED, params(line, line.stream.as_deref()))
            .await?;
        if conn.affected_rows() == 1 {
            return Ok(true);
        }
        // Unchanged: scheduled already (the outbox's copy came first), or no row
        // with a body to change.
        let rows: Option<u8> = conn
            .exec_first(
                "SELECT state FROM delayq_messages WHERE id = ? AND stream = ? AND body <> ''",
                (line.id.as_str(), line.stream.as_deref().unwrap_or("")),
            )
            .await?;
        Ok(rows == Some(State::Scheduled as u8))
    }
}
