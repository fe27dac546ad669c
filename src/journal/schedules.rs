//! Recurring schedules' definitions in the journal, so that a restore after Redis
//! lost its data puts them back; and how far each was made, read from its
//! occurrences' messages.

use mysql_async::prelude::Queryable;

use super::{Journal, Result};

impl Journal {
    /// Records schedule `id`'s definition (JSON; None: deleted) as of `at_ms`
    /// (Redis's time of the change); an older change than the one recorded changes
    /// nothing.
    pub async fn set_schedule(&self, id: &str, definition: Option<&str>, at_ms: u64) -> Result<()> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "INSERT INTO delayq_schedules (id, definition, updated_ms) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE \
             definition = IF(updated_ms <= VALUES(updated_ms), VALUES(definition), definition), \
             updated_ms = GREATEST(updated_ms, VALUES(updated_ms))",
            (id, definition, at_ms),
        )
        .await?;
        Ok(())
    }

    /// Every schedule's definition the journal holds (the deleted left out), by id.
    pub async fn schedules(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Vec<u8>> = conn
            .query(
                "SELECT definition FROM delayq_schedules WHERE definition IS NOT NULL ORDER BY id",
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .collect())
    }

    /// The latest occurrence of schedule `id` the journal has a message of (epoch
    /// ms): its messages' ids are `<id>.<ms>`.
    pub async fn last_occurrence(&self, id: &str) -> Result<Option<i64>> {
        let mut pattern = String::with_capacity(id.len() + 2);
        for c in id.chars() {
            if matches!(c, '%' | '_' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(".%");
        let from = id.len() as u64 + 2;
        let mut conn = self.pool.get_conn().await?;
        let last: Option<Option<i64>> = conn
            .exec_first(
                "SELECT MAX(CAST(SUBSTRING(id, ?) AS SIGNED)) FROM delayq_messages \
                 WHERE id LIKE ? AND SUBSTRING(id, ?) REGEXP '^[0-9]{1,18}$'",
                (from, pattern, from),
            )
            .await?;
        Ok(last.flatten())
    }
}
