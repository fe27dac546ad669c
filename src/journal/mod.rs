//! The journal: delayq's messages in MySQL or MariaDB (`[journal]`), so that what
//! Redis loses can be put back. The only module that speaks MySQL.
//!
//! Built so far: the connection (`mysql_async`, a small pool), the schema, created
//! and migrated by [`Journal::migrate`] (`delayq journal migrate`), and the
//! batched writes and reads the daemon will use: [`Journal::record_scheduled`],
//! [`Journal::record_finished`], [`Journal::unfinished`] and [`Journal::trim`]. Each
//! migration in `migrations/` runs once, in order, under a named lock so that
//! instances starting together migrate once; MySQL commits each DDL statement by
//! itself, so every statement is written to be run again safely (`IF NOT
//! EXISTS`), and a migration is recorded in `delayq_schema` only once all of its
//! statements ran.

mod commit;
mod paused;
mod replayed;

use std::time::Duration;

pub use commit::{Committer, WRITE_TIMEOUT, now_ms};

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use thiserror::Error;

use crate::config::JournalConfig;
use crate::message::{Due, MessageId, NewMessage};
use crate::store::{OutboxCode, OutboxLine};

/// A message's state in the journal (the `state` column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Scheduled = 0,
    Delivered = 1,
    Expired = 2,
    Dead = 3,
    Cancelled = 4,
}

impl State {
    fn from_code(code: u8) -> State {
        match code {
            1 => State::Delivered,
            2 => State::Expired,
            3 => State::Dead,
            4 => State::Cancelled,
            _ => State::Scheduled,
        }
    }

    /// The state's name, as the API says it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Scheduled => "scheduled",
            State::Delivered => "delivered",
            State::Expired => "expired",
            State::Dead => "dead",
            State::Cancelled => "cancelled",
        }
    }
}

/// The journal's state for what an outbox line says happened.
fn state_of(code: OutboxCode) -> State {
    match code {
        OutboxCode::Delivered => State::Delivered,
        OutboxCode::Expired => State::Expired,
        OutboxCode::Dead => State::Dead,
        OutboxCode::Cancelled => State::Cancelled,
        OutboxCode::Rescheduled | OutboxCode::Replayed => State::Scheduled,
    }
}

/// When a finished line may change a row: it is scheduled, or delivered and now
/// dead-lettered by redelivery, and the line happened after the row was last
/// written (a push stamps its row with Redis's time read before it is stored, an
/// outbox line with Redis's time of the change): a line copied late never undoes
/// a later push of the same id. Read before `updated_ms` is assigned.
const MAY_FINISH: &str =
    "(state = 0 OR (state = 1 AND VALUES(state) = 3)) AND updated_ms < VALUES(updated_ms)";

/// A push to journal: the message, its due time (epoch ms), and whether it
/// replaces a message of the same id.
#[derive(Clone, Copy, Debug)]
pub struct Push<'a> {
    pub msg: &'a NewMessage,
    pub due_ms: u64,
    pub replace: bool,
    /// Redis's time when the push began (its row's `updated_ms`).
    pub at_ms: u64,
}

/// A message as the journal knows it (see [`Journal::lookup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub stream: String,
    pub due_ms: u64,
    pub state: State,
    pub entry_id: Option<String>,
    pub updated_ms: u64,
}

/// Rows a statement carries at most (MySQL's placeholders per statement are
/// bounded, 65535; each row here takes at most 7).
const ROWS_PER_STATEMENT: usize = 1000;

/// The migrations, in order: (version, name, SQL of `;`-separated statements).
const MIGRATIONS: &[(u32, &str, &str)] = &[
    (1, "messages", include_str!("migrations/001_messages.sql")),
    (2, "marker", include_str!("migrations/002_marker.sql")),
    (3, "paused", include_str!("migrations/003_paused.sql")),
];

/// The schema version this delayq migrates to.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long `migrate` waits for another instance's migration to finish.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Error)]
pub enum JournalError {
    /// The journal's MySQL refused or failed a call; the text names no secret.
    #[error("{0}")]
    Mysql(String),
    /// The schema is newer than this delayq knows.
    #[error(
        "the journal's schema is at version {found}, newer than this delayq's {known}: upgrade delayq"
    )]
    TooNew { found: u32, known: u32 },
}

impl From<mysql_async::Error> for JournalError {
    fn from(e: mysql_async::Error) -> Self {
        // The driver's errors carry no URL or password.
        JournalError::Mysql(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, JournalError>;

/// What [`Journal::migrate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub from: u32,
    pub to: u32,
}

/// A handle on the journal. Cheap to clone: clones share one pool.
#[derive(Clone)]
pub struct Journal {
    pool: Pool,
    /// An id names one message whatever its stream (one Redis; not Redis Cluster,
    /// where it names one per slot): a replacing push to another stream retires
    /// the id's rows of other streams.
    unique_ids: bool,
}

impl Journal {
    /// A pool on `config.url` (connections are made when first used).
    pub fn new(config: &JournalConfig) -> Result<Journal> {
        let opts = Opts::from_url(config.url.expose())
            .map_err(|_| JournalError::Mysql(format!("{:?}: not a MySQL URL", config.url)))?;
        let pool_opts =
            PoolOpts::default().with_constraints(PoolConstraints::new(1, 8).expect("1 <= 8"));
        let opts = OptsBuilder::from_opts(opts)
            .pool_opts(pool_opts)
            .conn_ttl(Some(Duration::from_secs(60)));
        Ok(Journal {
            pool: Pool::new(opts),
            unique_ids: false,
        })
    }

    /// This journal, for a Redis where an id names one message whatever its stream
    /// (`unique`: one Redis, not Redis Cluster).
    pub fn with_unique_ids(self, unique: bool) -> Journal {
        Journal {
            unique_ids: unique,
            ..self
        }
    }

    /// The schema's version: the highest migration recorded (0: none).
    pub async fn version(&self) -> Result<u32> {
        let mut conn = self.pool.get_conn().await?;
        conn.query_drop(SCHEMA_TABLE).await?;
        let version: Option<u32> = conn
            .query_first("SELECT COALESCE(MAX(version), 0) FROM delayq_schema")
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// Runs every migration not yet recorded, in order, holding the named lock
    /// `delayq_journal_migrate` (instances that start together migrate once).
    pub async fn migrate(&self) -> Result<Migrated> {
        let mut conn = self.pool.get_conn().await?;
        let locked: Option<i64> = conn
            .exec_first(
                "SELECT GET_LOCK('delayq_journal_migrate', ?)",
                (MIGRATE_LOCK_WAIT.as_secs(),),
            )
            .await?;
        if locked != Some(1) {
            return Err(JournalError::Mysql(format!(
                "another instance held the migration lock for {}s",
                MIGRATE_LOCK_WAIT.as_secs()
            )));
        }
        let result = self.migrate_locked(&mut conn).await;
        conn.query_drop("DO RELEASE_LOCK('delayq_journal_migrate')")
            .await?;
        result
    }

    async fn migrate_locked(&self, conn: &mut mysql_async::Conn) -> Result<Migrated> {
        conn.query_drop(SCHEMA_TABLE).await?;
        let from: Option<u32> = conn
            .query_first("SELECT COALESCE(MAX(version), 0) FROM delayq_schema")
            .await?;
        let from = from.unwrap_or(0);
        let known = MIGRATIONS.last().map_or(0, |m| m.0);
        if from > known {
            return Err(JournalError::TooNew { found: from, known });
        }
        for &(version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > from) {
            for statement in statements(sql) {
                conn.query_drop(statement).await?;
            }
            conn.exec_drop(
                "INSERT INTO delayq_schema (version, name, applied_at) VALUES (?, ?, NOW(6))",
                (version, name),
            )
            .await?;
            tracing::info!(version, name, "journal schema migrated");
        }
        Ok(Migrated { from, to: known })
    }

    /// Records pushes as scheduled, in one transaction, each at its `at_ms` (its
    /// `updated_ms`, which [`Journal::discard`] matches): a new id is inserted; an id
    /// already journaled is left as it is (a duplicate push) unless it was
    /// cancelled (Redis takes a cancelled id pushed again as new) or, for a push
    /// that replaces, overwritten and scheduled again; neither over a row written
    /// later.
    pub async fn record_scheduled(&self, pushes: &[Push<'_>]) -> Result<()> {
        if pushes.is_empty() {
            return Ok(());
        }
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
        // confirmed before they ran).
        // A replace that retires other streams' rows stays in a transaction, so that
        // the two statements apply together.
        if let [(replace, rows)] = &groups[..]
            && rows.len() <= ROWS_PER_STATEMENT
            && !(*replace && self.unique_ids)
        {
            let mut conn = self.pool.get_conn().await?;
            return write_scheduled(&mut conn, rows, *replace, self.unique_ids).await;
        }
        let mut tx = self
            .pool
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        for (replace, rows) in &groups {
            for chunk in rows.chunks(ROWS_PER_STATEMENT) {
                write_scheduled(&mut tx, chunk, *replace, self.unique_ids).await?;
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
    /// of the same stream wrote no row, and none is removed.
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

    /// Applies the changes of outbox lines, in one transaction, each idempotently: a
    /// scheduled message becomes delivered, expired, dead-lettered or cancelled (a
    /// delivered one may still become dead-lettered, by redelivery), with its entry
    /// id and time; a new due time moves a message still scheduled. A finished
    /// message the journal never had (pushed before the journal was on) gets a row
    /// of its own, so its history is known.
    pub async fn apply(&self, lines: &[OutboxLine]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut tx = self
            .pool
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        let (finished, other): (Vec<&OutboxLine>, Vec<&OutboxLine>) = lines.iter().partition(|l| {
            !matches!(l.code, OutboxCode::Rescheduled | OutboxCode::Replayed) && l.stream.is_some()
        });
        for chunk in finished.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?, '', ?, ?, ?, ?)"; chunk.len()].join(", ");
            // Assignments run left to right, each reading the values assigned
            // before it: `entry_id` and `state` read the row as it was; `updated_ms`
            // last, set where the two now say what the line says.
            let sql = format!(
                "INSERT INTO delayq_messages (id, stream, body, due_ms, state, entry_id, updated_ms) \
                 VALUES {values} ON DUPLICATE KEY UPDATE \
                 entry_id = IF({MAY_FINISH}, VALUES(entry_id), entry_id), \
                 state = IF({MAY_FINISH}, VALUES(state), state), \
                 updated_ms = IF(state = VALUES(state) AND entry_id <=> VALUES(entry_id) \
                 AND updated_ms < VALUES(updated_ms), VALUES(updated_ms), updated_ms)"
            );
            let mut params: Vec<mysql_async::Value> = Vec::with_capacity(chunk.len() * 6);
            for line in chunk {
                params.push(line.id.as_str().into());
                params.push(line.stream.as_deref().unwrap_or("").into());
                params.push(line.at_ms.into());
                params.push((state_of(line.code) as u8).into());
                params.push(line.entry.clone().into());
                params.push(line.at_ms.into());
            }
            tx.exec_drop(sql, params).await?;
        }
        for line in other {
            match (line.code, &line.stream) {
                (OutboxCode::Rescheduled, stream) => {
                    let due: u64 = line
                        .entry
                        .as_deref()
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(line.at_ms);
                    tx.exec_drop(
                        "UPDATE delayq_messages SET due_ms = ?, updated_ms = ? \
                         WHERE id = ? AND stream = ? AND state = 0 AND updated_ms < ?",
                        (
                            due,
                            line.at_ms,
                            line.id.as_str(),
                            stream.as_deref().unwrap_or(""),
                            line.at_ms,
                        ),
                    )
                    .await?;
                }
                (OutboxCode::Replayed, stream) => {
                    tx.exec_drop(
                        replayed::REPLAYED,
                        replayed::params(line, stream.as_deref()),
                    )
                    .await?;
                }
                // A message whose body could not be read: its stream is unknown.
                (code, _) => {
                    tx.exec_drop(
                        "UPDATE delayq_messages SET state = ?, entry_id = ?, updated_ms = ? \
                         WHERE id = ? AND state = 0 AND updated_ms < ?",
                        (
                            state_of(code) as u8,
                            line.entry.clone(),
                            line.at_ms,
                            line.id.as_str(),
                            line.at_ms,
                        ),
                    )
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

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

    /// Deletes every message of the journal at once (`delayq bench` between
    /// scenarios, with Redis flushed beside it).
    pub async fn truncate(&self) -> Result<()> {
        let mut conn = self.pool.get_conn().await?;
        conn.query_drop("TRUNCATE TABLE delayq_messages").await?;
        Ok(())
    }

    /// How many messages the journal holds not finished.
    pub async fn count_unfinished(&self) -> Result<u64> {
        let mut conn = self.pool.get_conn().await?;
        let n: Option<u64> = conn
            .query_first("SELECT COUNT(*) FROM delayq_messages WHERE state = 0")
            .await?;
        Ok(n.unwrap_or(0))
    }

    /// The journal's marker token, made now if it has none: the token a Redis
    /// that holds this journal's data carries (see `keeper`).
    pub async fn marker(&self) -> Result<String> {
        let mut conn = self.pool.get_conn().await?;
        let fresh = ulid::Ulid::new().to_string();
        conn.exec_drop(
            "INSERT IGNORE INTO delayq_marker (name, token) VALUES ('redis', ?)",
            (fresh.as_str(),),
        )
        .await?;
        let token: Option<String> = conn
            .query_first("SELECT token FROM delayq_marker WHERE name = 'redis'")
            .await?;
        token.ok_or_else(|| JournalError::Mysql("the marker row vanished".into()))
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

    /// Deletes up to `limit` finished messages last changed before `before_ms`;
    /// how many it deleted (call again while it deletes `limit`).
    pub async fn trim(&self, before_ms: u64, limit: usize) -> Result<u64> {
        let mut conn = self.pool.get_conn().await?;
        let mut deleted = 0;
        for state in [
            State::Delivered,
            State::Expired,
            State::Dead,
            State::Cancelled,
        ] {
            conn.exec_drop(
                "DELETE FROM delayq_messages WHERE state = ? AND updated_ms < ? LIMIT ?",
                (state as u8, before_ms, limit as u64),
            )
            .await?;
            deleted += conn.affected_rows();
        }
        Ok(deleted)
    }

    /// Closes the pool's connections.
    pub async fn close(self) -> Result<()> {
        Ok(self.pool.disconnect().await?)
    }
}

/// A row as `unfinished` reads it: id, stream, body, due ms.
type PageRow = (Vec<u8>, Vec<u8>, Vec<u8>, u64);

/// A row as `lookup` reads it: stream, due ms, state, entry id, updated ms.
type LookupRow = (Vec<u8>, u64, u8, Option<Vec<u8>>, u64);

/// Affected rows of the last statement, on a connection or in a transaction.
trait Affected: Queryable {
    fn affected(&self) -> u64;
}

impl Affected for mysql_async::Conn {
    fn affected(&self) -> u64 {
        self.affected_rows()
    }
}

impl Affected for mysql_async::Transaction<'_> {
    fn affected(&self) -> u64 {
        self.affected_rows()
    }
}

/// Writes pushes as scheduled (at most [`ROWS_PER_STATEMENT`]): new ids inserted;
/// a known id overwritten and scheduled again where the push replaces or its row
/// is cancelled (Redis takes a cancelled id pushed again as new), unless the row
/// was written later; left as it is otherwise (a duplicate push). With
/// `unique_ids`, a replacing push also retires the id's scheduled rows of other
/// streams (Redis moved the message to its new stream). Pushes that are all new
/// cost one `INSERT IGNORE`, as they did before ids were ordered.
async fn write_scheduled<Q: Affected>(
    q: &mut Q,
    rows: &[&Push<'_>],
    replace: bool,
    unique_ids: bool,
) -> Result<()> {
    let values = vec!["(?, ?, ?, ?, 0, NULL, ?)"; rows.len()].join(", ");
    let columns = "delayq_messages (id, stream, body, due_ms, state, entry_id, updated_ms)";
    let mut params: Vec<mysql_async::Value> = Vec::with_capacity(rows.len() * 5);
    for push in rows {
        params.push(push.msg.id.as_str().into());
        params.push(push.msg.stream.as_str().into());
        params.push(body(push.msg).into());
        params.push(push.due_ms.into());
        params.push(push.at_ms.into());
    }
    if !replace {
        q.exec_drop(
            format!("INSERT IGNORE INTO {columns} VALUES {values}"),
            params,
        )
        .await?;
        if q.affected() < rows.len() as u64 {
            q.exec_batch(
                format!("UPDATE delayq_messages SET {OVERWRITE} WHERE id = ? AND stream = ? AND state = 4"),
                rows.iter().map(|p| overwrite_params(p)),
            )
            .await?;
        }
        return Ok(());
    }
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
             state = IF(updated_ms = VALUES(updated_ms), 0, state)"
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

/// A cancelled row scheduled again by a push of its id, unless written later.
const OVERWRITE: &str = "body = IF(updated_ms <= ?, ?, body), due_ms = IF(updated_ms <= ?, ?, due_ms), \
    entry_id = IF(updated_ms <= ?, NULL, entry_id), state = IF(updated_ms <= ?, 0, state), \
    updated_ms = IF(updated_ms <= ?, ?, updated_ms)";

/// [`OVERWRITE`]'s parameters for `push`, then its id and stream.
fn overwrite_params(push: &Push<'_>) -> Vec<mysql_async::Value> {
    let at: mysql_async::Value = push.at_ms.into();
    vec![
        at.clone(),
        body(push.msg).into(),
        at.clone(),
        push.due_ms.into(),
        at.clone(),
        at.clone(),
        at.clone(),
        at,
        push.msg.id.as_str().into(),
        push.msg.stream.as_str().into(),
    ]
}

/// A message's `body` column (see the migration).
fn body(msg: &NewMessage) -> Vec<u8> {
    let ttl_ms = msg.ttl.map(|t| t.as_millis() as u64);
    serde_json::to_vec(&serde_json::json!({
        "fields": msg.fields,
        "priority": msg.priority,
        "ttl_ms": ttl_ms,
    }))
    .expect("strings and numbers serialize")
}

/// The message a journal row holds, due at its journaled time.
fn message(id: &[u8], stream: &[u8], body: &[u8], due_ms: u64) -> Result<NewMessage> {
    #[derive(serde::Deserialize)]
    struct Body {
        fields: Vec<(String, String)>,
        priority: u8,
        ttl_ms: Option<u64>,
    }
    let bad = |what: &str| JournalError::Mysql(format!("journal row {id:?}: {what}"));
    let id = std::str::from_utf8(id).map_err(|_| bad("id is not UTF-8"))?;
    let id = MessageId::parse(id).map_err(|e| bad(&e.to_string()))?;
    let stream = String::from_utf8(stream.to_vec()).map_err(|_| bad("stream is not UTF-8"))?;
    let body: Body = serde_json::from_slice(body).map_err(|e| bad(&format!("body: {e}")))?;
    Ok(NewMessage {
        id,
        stream,
        fields: body.fields,
        due: Due::At(due_ms),
        priority: body.priority,
        ttl: body.ttl_ms.map(Duration::from_millis),
    })
}

/// The table of applied migrations.
const SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS delayq_schema (\
    version INT UNSIGNED NOT NULL PRIMARY KEY, \
    name VARCHAR(64) NOT NULL, \
    applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB";

/// The statements of a migration file: split at `;` ending a line, `--` comment
/// lines left out.
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let statement = current.trim().trim_end_matches(';').trim().to_owned();
            if !statement.is_empty() {
                out.push(statement);
            }
            current.clear();
        }
    }
    let rest = current.trim();
    if !rest.is_empty() {
        out.push(rest.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_statements_in_version_order() {
        let versions: Vec<u32> = MIGRATIONS.iter().map(|m| m.0).collect();
        let expected: Vec<u32> = (1..=MIGRATIONS.len() as u32).collect();
        assert_eq!(versions, expected);
        for (_, name, sql) in MIGRATIONS {
            let statements = statements(sql);
            assert!(!statements.is_empty(), "{name}");
            for s in &statements {
                assert!(!s.contains("--") && !s.ends_with(';'), "{name}: {s}");
                assert!(
                    s.contains("IF NOT EXISTS"),
                    "{name}: runs again safely: {s}"
                );
            }
        }
    }

    #[test]
    fn statements_split_at_line_ends() {
        assert_eq!(
            statements("-- c\nCREATE TABLE a (x INT);\n\nCREATE TABLE b (\n y INT\n);\nDO 1"),
            [
                "CREATE TABLE a (x INT)",
                "CREATE TABLE b (\n y INT\n)",
                "DO 1"
            ]
        );
    }
}
