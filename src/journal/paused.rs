//! The streams an operator paused, kept in the journal so that a restore after
//! Redis lost its data pauses them again before forwarding resumes.

use mysql_async::prelude::Queryable;

use super::{Journal, Result};

impl Journal {
    /// Records that `stream` was paused (or resumed) at `at_ms` (Redis's time of
    /// the change); an older change than the one recorded changes nothing.
    pub async fn set_paused(&self, stream: &str, paused: bool, at_ms: u64) -> Result<()> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(
            "INSERT INTO delayq_paused (stream, paused, updated_ms) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE \
             paused = IF(updated_ms < VALUES(updated_ms), VALUES(paused), paused), \
             updated_ms = GREATEST(updated_ms, VALUES(updated_ms))",
            (stream, u8::from(paused), at_ms),
        )
        .await?;
        Ok(())
    }

    /// The streams recorded as paused.
    pub async fn paused(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.get_conn().await?;
        let rows: Vec<Vec<u8>> = conn
            .query("SELECT stream FROM delayq_paused WHERE paused = 1 ORDER BY stream")
            .await?;
        Ok(rows
            .into_iter()
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .collect())
    }
}
