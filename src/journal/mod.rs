//! The journal: delayq's messages in MySQL or MariaDB (`[journal]`), so that what
//! Redis loses can be put back. The only module that speaks MySQL.
//!
//! Layout: this file is the connection (`mysql_async`, a small pool), the states a
//! message goes through and [`Journal::apply`], which writes what the shards'
//! outboxes say happened; `schema.rs` the schema, created and migrated by
//! [`Journal::migrate`] (each migration in `migrations/` once, in order, under a
//! named lock; every statement safe to run again, and a migration recorded in
//! `delayq_schema` only once all of it ran); `scheduled.rs` the rows written before
//! Redis is asked (and taken back); `read.rs` the reads (one message, the
//! unfinished ones for a restore); `commit.rs` the group commit of pushes;
//! `paused.rs` and `replayed.rs` the operator's pauses and replays; `schedules.rs`
//! recurring schedules' definitions; `transitions.rs` the transition log, a row per
//! change of a message, written with the change.

mod commit;
mod deadlock;
pub mod durable;
mod paused;
mod read;
pub use read::Changed;
mod replayed;
mod scheduled;
mod schedules;
mod schema;
mod transitions;
pub use transitions::{Came, Step, Transition, Who};

pub use schema::{Migrated, SCHEMA_VERSION};

use std::time::Duration;

pub use commit::{Committer, WRITE_TIMEOUT, now_ms};

/// Longest a change's answer waits for the journal (MySQL hung) beyond Redis's
/// replicas (`redis.min_replicas_acked`): see [`change_window`].
pub const CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after it is sent to Redis a change answered as journaled (a cancel,
/// reschedule, replay, pause or resume) is in the journal at the latest: the
/// replicas' wait, then [`CHANGE_WAIT`]. A change answered later says
/// `not_journaled`.
pub fn change_window(replicas_wait: std::time::Duration) -> std::time::Duration {
    replicas_wait + CHANGE_WAIT
}

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use thiserror::Error;

use crate::config::JournalConfig;
use crate::message::{Due, MessageId, NewMessage};
use crate::store::{OutboxCode, OutboxLine};
use transitions::CAME_EMPTIED;

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

/// Whether an outbox line tells the transition log only, not the message's row: a
/// redelivery, or why a message was dead-lettered.
fn log_only(code: OutboxCode) -> bool {
    matches!(code, OutboxCode::Redelivered | OutboxCode::DeadReason)
}

/// The journal's state for what an outbox line says happened.
fn state_of(code: OutboxCode) -> State {
    match code {
        OutboxCode::Delivered => State::Delivered,
        OutboxCode::Expired => State::Expired,
        OutboxCode::Dead | OutboxCode::DeadReason => State::Dead,
        OutboxCode::Cancelled => State::Cancelled,
        OutboxCode::Rescheduled | OutboxCode::Replayed | OutboxCode::Redelivered => {
            State::Scheduled
        }
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
    /// How it came, for its transition log.
    pub came: &'a Came,
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
/// bounded, 65535; each row here takes at most 9).
const ROWS_PER_STATEMENT: usize = 1000;

#[derive(Clone, Debug, Error)]
pub enum JournalError {
    /// The journal's MySQL refused or failed a call; the text names no secret.
    #[error("{0}")]
    Mysql(String),
    /// The journal's MySQL ended the transaction as a deadlock's victim (rolled back
    /// whole; see `deadlock::retried`).
    #[error("{0}")]
    Deadlock(String),
    /// The schema is newer than this delayq knows.
    #[error(
        "the journal's schema is at version {found}, newer than this delayq's {known}: upgrade delayq"
    )]
    TooNew { found: u32, known: u32 },
}

impl From<mysql_async::Error> for JournalError {
    fn from(e: mysql_async::Error) -> Self {
        // The driver's errors carry no URL or password. Those about TLS name the
        // setting that decides it.
        let text = e.to_string();
        if let mysql_async::Error::Server(server) = &e
            && server.code == deadlock::DEADLOCK
        {
            return JournalError::Deadlock(text);
        }
        let setting = match &e {
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
                Some("the server offers no TLS, which journal.tls requires")
            }
            _ if text.contains("insecure transport") => {
                Some("the server requires TLS: set journal.tls")
            }
            _ if text.to_lowercase().contains("certificate") => Some("journal.tls"),
            // MariaDB answers so a connection without the TLS it requires.
            _ if text.contains("Access denied") => {
                Some("or the server requires TLS, which journal.tls sets")
            }
            _ => None,
        };
        match setting {
            Some(setting) => JournalError::Mysql(format!("{text} ({setting})")),
            None => JournalError::Mysql(text),
        }
    }
}

pub type Result<T> = std::result::Result<T, JournalError>;

/// A handle on the journal. Cheap to clone: clones share one pool.
#[derive(Clone)]
pub struct Journal {
    pool: Pool,
    /// An id names one message whatever its stream (one Redis; not Redis Cluster,
    /// where it names one per slot): a replacing push to another stream retires
    /// the id's rows of other streams.
    unique_ids: bool,
    /// `journal.transitions`: every change is a row of the transition log too.
    pub(super) transitions: bool,
    /// Rows last written before this (epoch ms) hold no push step past its
    /// retention any more (see [`Journal::trim_transitions`]).
    came_pruned_to: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Journal {
    /// A pool on `config.url` (connections are made when first used).
    pub fn new(config: &JournalConfig) -> Result<Journal> {
        let opts = Opts::from_url(config.url.expose())
            .map_err(|_| JournalError::Mysql(format!("{:?}: not a MySQL URL", config.url)))?;
        let pool_opts =
            PoolOpts::default().with_constraints(PoolConstraints::new(1, 8).expect("1 <= 8"));
        let mut opts = OptsBuilder::from_opts(opts)
            .pool_opts(pool_opts)
            .conn_ttl(Some(Duration::from_secs(60)));
        // `journal.tls`: TLS required, the server's name and CA checked (a server
        // that offers no TLS is refused).
        if let Some(ca_file) = &config.tls {
            let mut ssl = mysql_async::SslOpts::default();
            if let Some(ca_file) = ca_file {
                ssl = ssl
                    .with_root_certs(vec![ca_file.clone().into()])
                    .with_disable_built_in_roots(true);
            }
            opts = opts.ssl_opts(ssl);
        }
        Ok(Journal {
            pool: Pool::new(opts),
            unique_ids: false,
            transitions: config.transitions,
            came_pruned_to: Default::default(),
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

    /// Applies the changes of outbox lines, in one transaction, each idempotently: a
    /// scheduled message becomes delivered, expired, dead-lettered or cancelled (a
    /// delivered one may still become dead-lettered, by redelivery), with its entry
    /// id and time; a new due time moves a message still scheduled. A finished
    /// message the journal never had (pushed before the journal was on) gets a row
    /// of its own, so its history is known. Each line is a step of its message's
    /// transition log too (made by nobody known: see [`Journal::apply_as`]).
    pub async fn apply(&self, lines: &[OutboxLine]) -> Result<()> {
        self.apply_as(lines, &Who::default()).await
    }

    /// [`Journal::apply`] of changes `who` made (as far as it is known).
    pub async fn apply_as(&self, lines: &[OutboxLine], who: &Who) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        deadlock::retried("copy", || self.apply_once(lines, who)).await
    }

    /// [`Journal::apply_as`]'s transaction, once.
    async fn apply_once(&self, lines: &[OutboxLine], who: &Who) -> Result<()> {
        let mut tx = self
            .pool
            .start_transaction(transitions::locking_only_rows())
            .await?;
        // The push steps the rows about to change still hold go to the log first.
        let changing: Vec<&str> = lines
            .iter()
            .filter(|l| !log_only(l.code) && l.code != OutboxCode::Replayed)
            .map(|l| l.id.as_str())
            .collect();
        self.keep_pushes(&mut tx, &changing).await?;
        let (finished, other): (Vec<&OutboxLine>, Vec<&OutboxLine>) = lines.iter().partition(|l| {
            !matches!(l.code, OutboxCode::Rescheduled | OutboxCode::Replayed)
                && !log_only(l.code)
                && l.stream.is_some()
        });
        for chunk in finished.chunks(ROWS_PER_STATEMENT) {
            let values = vec!["(?, ?, '', ?, ?, ?, ?)"; chunk.len()].join(", ");
            // Assignments run left to right, each reading the values assigned
            // before it: `entry_id` and `state` read the row as it was; `updated_ms`
            // last, set where the two now say what the line says.
            let came = transitions::came_where(MAY_FINISH, |_| "NULL".into());
            let sql = format!(
                "INSERT INTO delayq_messages (id, stream, body, due_ms, state, entry_id, updated_ms) \
                 VALUES {values} ON DUPLICATE KEY UPDATE {came}, \
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
                        format!(
                            "UPDATE delayq_messages SET due_ms = ?, updated_ms = ?, {CAME_EMPTIED} \
                             WHERE id = ? AND stream = ? AND state = 0 AND updated_ms < ?"
                        ),
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
                // Steps (or a step's reason) of the transition log only (below).
                (code, _) if log_only(code) => {}
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
                        format!(
                            "UPDATE delayq_messages SET state = ?, entry_id = ?, updated_ms = ?, \
                             {CAME_EMPTIED} WHERE id = ? AND state = 0 AND updated_ms < ?"
                        ),
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
        let steps: Vec<transitions::Row> = lines
            .iter()
            .map(|line| transitions::Row::of_line(line, who))
            .collect();
        self.write_steps(&mut tx, &steps).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes every message of the journal at once (`delayq bench` between
    /// scenarios, with Redis flushed beside it).
    pub async fn truncate(&self) -> Result<()> {
        let mut conn = self.pool.get_conn().await?;
        conn.query_drop("TRUNCATE TABLE delayq_messages").await?;
        conn.query_drop("TRUNCATE TABLE delayq_transitions").await?;
        Ok(())
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
