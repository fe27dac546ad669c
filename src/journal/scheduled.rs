//! Messages scheduled into the journal (rows written before Redis is asked), and rows
//! taken back: a push Redis refused, or answered as a duplicate.

use super::*;
use crate::journal::transitions;

/// Writes pushes as scheduled (at most [`ROWS_PER_STATEMENT`]): new ids inserted;
/// a known id overwritten and scheduled again where the push replaces or its row
/// is cancelled (Redis takes a cancelled id pushed again as new), unless the row
/// was written later; left as it is otherwise (a duplicate push). With
/// `unique_ids`, a replacing push also retires the id's scheduled rows of other
/// streams (Redis moved the message to its new stream). Pushes that are all new
/// cost one `INSERT IGNORE`, as they did before ids were ordered.
pub(super) async fn write_scheduled<Q: Affected>(
    q: &mut Q,
    rows: &[&Push<'_>],
    replace: bool,
    unique_ids: bool,
    log: bool,
) -> Result<()> {
    let values = vec!["(?, ?, ?, ?, 0, NULL, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
    let columns = "delayq_messages (id, stream, body, due_ms, state, entry_id, updated_ms, \
                   came_step, came_how, came_node, came_token)";
    let mut params: Vec<mysql_async::Value> = Vec::with_capacity(rows.len() * 9);
    for push in rows {
        params.push(push.msg.id.as_str().into());
        params.push(push.msg.stream.as_str().into());
        params.push(push.msg.journal_body().into());
        params.push(push.due_ms.into());
        params.push(push.at_ms.into());
        params.extend(came_params(push, log));
    }
    if !replace {
        q.exec_drop(
            format!("INSERT IGNORE INTO {columns} VALUES {values}"),
            params,
        )
        .await?;
        if q.affected() < rows.len() as u64 {
            q.exec_batch(
                format!(
                    "UPDATE delayq_messages SET {} WHERE id = ? AND stream = ? AND state = 4",
                    overwrite()
                ),
                rows.iter().map(|p| overwrite_params(p, log)),
            )
            .await?;
        }
        return Ok(());
    }
    // A replacing push's step overwrites the row's (the row's own was copied into
    // the log before).
    let came = transitions::came_where("updated_ms = VALUES(updated_ms)", |c| {
        format!("VALUES({c})")
    });
    // `updated_ms` first: the row it moves to the push's time is the one the
    // assignments after it overwrite (a row already at that time too: the later
    // of two writes in one millisecond wins).
    q.exec_drop(
        format!(
            "INSERT INTO {columns} VALUES {values} ON DUPLICATE KEY UPDATE \
             updated_ms = IF(updated_ms <= VALUES(updated_ms), VALUES(updated_ms), updated_ms), \
             body = IF(updated_ms = VALUES(updated_ms), VALUES(body), body), \
             due_ms = IF(updated_ms = VALUES(updated_ms), VALUES(due_ms), due_ms), \
             entry_id = IF(updated_ms = VALUES(updated_ms), NULL, entry_id), \
             state = IF(updated_ms = VALUES(updated_ms), 0, state), {came}"
        ),
        params,
    )
    .await?;
    if unique_ids {
        q.exec_batch(
            "DELETE FROM delayq_messages WHERE id = ? AND stream <> ? AND state = 0 \
             AND updated_ms <= ?",
            rows.iter()
                .map(|p| (p.msg.id.as_str().to_owned(), p.msg.stream.clone(), p.at_ms)),
        )
        .await?;
    }
    Ok(())
}

/// The push's own step, which its row holds until the row next changes (the
/// `came_*` columns): step, how it came, node, token; all NULL without the log.
fn came_params(push: &Push<'_>, log: bool) -> [mysql_async::Value; 4] {
    if !log {
        return std::array::from_fn(|_| mysql_async::Value::NULL);
    }
    let step = transitions::Step::of_push(push.replace) as u8;
    let who = &push.came.who;
    [
        step.into(),
        push.came.how.into(),
        who.node.clone().into(),
        who.token.clone().into(),
    ]
}

/// A cancelled row scheduled again by a push of its id, unless written later (a
/// cancelled row holds no push step: it was copied into the log when cancelled).
pub(super) fn overwrite() -> String {
    format!(
        "body = IF(updated_ms <= ?, ?, body), due_ms = IF(updated_ms <= ?, ?, due_ms), \
         entry_id = IF(updated_ms <= ?, NULL, entry_id), state = IF(updated_ms <= ?, 0, state), \
         {}, updated_ms = IF(updated_ms <= ?, ?, updated_ms)",
        transitions::came_where("updated_ms <= ?", |_| "?".into())
    )
}

/// [`overwrite`]'s parameters for `push`, then its id and stream.
pub(super) fn overwrite_params(push: &Push<'_>, log: bool) -> Vec<mysql_async::Value> {
    let at: mysql_async::Value = push.at_ms.into();
    let mut params = vec![
        at.clone(),
        push.msg.journal_body().into(),
        at.clone(),
        push.due_ms.into(),
        at.clone(),
        at.clone(),
    ];
    for came in came_params(push, log) {
        params.push(at.clone());
        params.push(came);
    }
    params.extend([
        at.clone(),
        at,
        push.msg.id.as_str().into(),
        push.msg.stream.as_str().into(),
    ]);
    params
}

/// The message a journal row holds, due at its journaled time.
pub(super) fn message(id: &[u8], stream: &[u8], body: &[u8], due_ms: u64) -> Result<NewMessage> {
    let bad = |what: &str| JournalError::Mysql(format!("journal row {id:?}: {what}"));
    let id = std::str::from_utf8(id).map_err(|_| bad("id is not UTF-8"))?;
    let id = MessageId::parse(id).map_err(|e| bad(&e.to_string()))?;
    let stream = String::from_utf8(stream.to_vec()).map_err(|_| bad("stream is not UTF-8"))?;
    NewMessage::from_journal(id, stream, body, Due::At(due_ms)).map_err(|e| bad(&e))
}

impl Journal {
    /// Records pushes as scheduled, in one transaction, each at its `at_ms` (its
    /// `updated_ms`, which [`Journal::discard`] matches): a new id is inserted; an id
    /// already journaled is left as it is (a duplicate push) unless it was
    /// cancelled (Redis takes a cancelled id pushed again as new) or, for a push
    /// that replaces, overwritten and scheduled again; neither over a row written
    /// later. Each push is a step of its message's transition log too.
    pub async fn record_scheduled(&self, pushes: &[Push<'_>]) -> Result<()> {
        if pushes.is_empty() {
            return Ok(());
        }
        super::deadlock::retried("push", || self.record_scheduled_once(pushes)).await
    }

    /// [`Journal::record_scheduled`]'s statement or transaction, once.
    async fn record_scheduled_once(&self, pushes: &[Push<'_>]) -> Result<()> {
        let groups: Vec<(bool, Vec<&Push<'_>>)> = [false, true]
            .into_iter()
            .map(|replace| {
                let rows = pushes.iter().filter(|p| p.replace == replace).collect();
                (replace, rows)
            })
            .filter(|(_, rows): &(bool, Vec<_>)| !rows.is_empty())
            .collect();
        // One statement commits by itself: one round trip instead of four (the
        // statements that may follow it are idempotent, and the pushes are not
        // confirmed before they ran). A push's step goes in its row. A replace
        // that retires other streams' rows, or overwrites rows whose push steps go
        // to the log first, stays in a transaction, so that they apply together.
        let log = self.transitions;
        if let [(replace, rows)] = &groups[..]
            && rows.len() <= ROWS_PER_STATEMENT
            && !(*replace && (self.unique_ids || log))
        {
            let mut conn = self.pool.get_conn().await?;
            return write_scheduled(&mut conn, rows, *replace, self.unique_ids, log).await;
        }
        let mut tx = self
            .pool
            .start_transaction(transitions::locking_only_rows())
            .await?;
        for (replace, rows) in &groups {
            for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                if *replace {
                    let ids: Vec<&str> = chunk.iter().map(|p| p.msg.id.as_str()).collect();
                    self.keep_pushes(&mut tx, &ids).await?;
                }
                write_scheduled(&mut tx, chunk, *replace, self.unique_ids, log).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Removes what [`Journal::record_scheduled`] wrote for pushes Redis then
    /// refused (a due time too far, a stream it cannot hold): rows still scheduled
    /// and last written at `at_ms`, so that an earlier push of the same id stays.
    pub async fn discard(&self, refused: &[(&NewMessage, u64)]) -> Result<()> {
        if refused.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool.get_conn().await?;
        conn.exec_batch(
            "DELETE FROM delayq_messages WHERE id = ? AND stream = ? AND state = 0 AND updated_ms = ?",
            refused
                .iter()
                .map(|(m, at)| (m.id.as_str().to_owned(), m.stream.clone(), *at)),
        )
        .await?;
        Ok(())
    }

    /// Removes the rows [`Journal::record_scheduled`] wrote at `at_ms` for pushes
    /// Redis answered as duplicates of a message of another stream (on one Redis,
    /// where an id names one message whatever its stream): such a row is no
    /// message Redis holds, and a restore would send it. A duplicate of a message
    /// of the same stream wrote no row, and none is removed. (A duplicate's push
    /// is no step of its message: its step went with the row, or was never written.)
    pub async fn retire_duplicates(&self, duplicates: &[(&NewMessage, u64)]) -> Result<()> {
        if duplicates.is_empty() || !self.unique_ids {
            return Ok(());
        }
        let mut conn = self.pool.get_conn().await?;
        conn.exec_batch(
            "DELETE t FROM delayq_messages t JOIN delayq_messages o \
             ON o.id = t.id AND o.stream <> t.stream \
             WHERE t.id = ? AND t.stream = ? AND t.state = 0 AND t.updated_ms = ?",
            duplicates
                .iter()
                .map(|(m, at)| (m.id.as_str().to_owned(), m.stream.clone(), *at)),
        )
        .await?;
        Ok(())
    }
}
