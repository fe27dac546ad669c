//! The journal's schema: its version, and the migrations that bring it up to date,
//! run by one node at a time under a named lock.

use super::*;

/// The migrations, in order: (version, name, SQL of `;`-separated statements).
pub(super) const MIGRATIONS: &[(u32, &str, &str)] = &[
    (1, "messages", include_str!("migrations/001_messages.sql")),
    (2, "marker", include_str!("migrations/002_marker.sql")),
    (3, "paused", include_str!("migrations/003_paused.sql")),
    (4, "schedules", include_str!("migrations/004_schedules.sql")),
    (
        5,
        "transitions",
        include_str!("migrations/005_transitions.sql"),
    ),
];

/// The schema version this delayq migrates to.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How long `migrate` waits for another instance's migration to finish.
pub(super) const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(60);

/// What [`Journal::migrate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub from: u32,
    pub to: u32,
}

/// The table of applied migrations.
pub(super) const SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS delayq_schema (\
    version INT UNSIGNED NOT NULL PRIMARY KEY, \
    name VARCHAR(64) NOT NULL, \
    applied_at DATETIME(6) NOT NULL) ENGINE = InnoDB";

/// The statements of a migration file: split at `;` ending a line, `--` comment
/// lines left out.
pub(super) fn statements(sql: &str) -> Vec<String> {
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

impl Journal {
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

    pub(super) async fn migrate_locked(&self, conn: &mut mysql_async::Conn) -> Result<Migrated> {
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
