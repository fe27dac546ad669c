//! The audit trail in Redis: a stream under the deployment's prefix
//! (`<prefix>:audit`), capped at `api.audit_length` entries (`MAXLEN ~`), one entry
//! an action, its fields as the API records them.

use redis::Value;

use super::{Result, Store};

/// One recorded action: its stream entry id and fields, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    pub id: String,
    pub fields: Vec<(String, String)>,
}

impl Store {
    /// Adds an action to the trail, keeping about `keep` entries (0: none kept).
    pub async fn append_audit(&self, fields: &[(&str, String)], keep: u64) -> Result<()> {
        if keep == 0 {
            return Ok(());
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.keys.audit())
            .arg("MAXLEN")
            .arg("~")
            .arg(keep)
            .arg("*");
        for (name, value) in fields {
            cmd.arg(*name).arg(value);
        }
        let _: String = cmd.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// The newest `count` actions, newest first, older than entry `before` when given.
    pub async fn audit(&self, count: usize, before: Option<&str>) -> Result<Vec<AuditEntry>> {
        let end = before.map_or_else(|| "+".to_owned(), |b| format!("({b}"));
        let reply: Value = redis::cmd("XREVRANGE")
            .arg(self.keys.audit())
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(super::streams::stream_entries(reply)?
            .into_iter()
            .map(|(id, fields)| AuditEntry { id, fields })
            .collect())
    }
}
