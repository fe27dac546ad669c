//! The journal: delayq's messages in MySQL or MariaDB (`[journal]`), so that what
//! Redis loses can be put back. The only module that speaks MySQL.
//!
//! Built so far: the connection (`mysql_async`, a small pool) and the schema,
//! created and migrated by [`Journal::migrate`] (`delayq journal migrate`). Each
//! migration in `migrations/` runs once, in order, under a named lock so that
//! instances starting together migrate once; MySQL commits each DDL statement by
//! itself, so every statement is written to be run again safely (`IF NOT
//! EXISTS`), and a migration is recorded in `delayq_schema` only once all of its
//! statements ran.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use thiserror::Error;

use crate::config::JournalConfig;

/// The migrations, in order: (version, name, SQL of `;`-separated statements).
const MIGRATIONS: &[(u32, &str, &str)] =
    &[(1, "messages", include_str!("migrations/001_messages.sql"))];

/// The schema version this delayq migrates to.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long `migrate` waits for another instance's migration to finish.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
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
        })
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

    /// Closes the pool's connections.
    pub async fn close(self) -> Result<()> {
        Ok(self.pool.disconnect().await?)
    }
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
