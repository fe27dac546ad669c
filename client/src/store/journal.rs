//! The store's side of the journal: each shard's outbox, which the scripts fill in
//! the same call as the change they journal, and the marker that tells whether
//! this Redis still holds the data the journal describes. (The journal itself, in
//! MySQL, is `crate::journal`'s.)

use redis::AsyncCommands;

use super::{Result, Store, StoreError};

/// What an outbox line says happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutboxCode {
    #[default]
    Delivered,
    Expired,
    Dead,
    Cancelled,
    /// A new due time (`reschedule`).
    Rescheduled,
    /// A dead letter scheduled again (`replay`); the "entry" is its due time.
    Replayed,
    /// A delivery no consumer acknowledged in time, scheduled again (`redeliver`);
    /// the "entry" is the entry left unacknowledged, and the line ends with the
    /// redelivery's attempt. The journal's message row stays as it is: this is a
    /// step of its transition log only.
    Redelivered,
    /// Why the dead line before it was dead-lettered; the "entry" is the reason
    /// (`corrupt`, `unwritable`, `max_attempts`). A step's detail only.
    DeadReason,
}

/// One change, as a script wrote it to the outbox: `<code> <id> <at ms> <entry id
/// or -> <stream or ->`, a redelivery's then its attempt; a new due time's "entry"
/// is that due time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboxLine {
    pub code: OutboxCode,
    pub id: String,
    pub at_ms: u64,
    pub entry: Option<String>,
    pub stream: Option<String>,
    /// A redelivery's attempt (the first delivery is attempt 1).
    pub attempt: Option<u32>,
}

impl OutboxLine {
    /// Reads one line; None for a line this delayq does not write.
    pub fn parse(line: &str) -> Option<OutboxLine> {
        let mut parts = line.split(' ');
        let code = match parts.next()? {
            "D" => OutboxCode::Delivered,
            "E" => OutboxCode::Expired,
            "X" => OutboxCode::Dead,
            "C" => OutboxCode::Cancelled,
            "R" => OutboxCode::Rescheduled,
            "P" => OutboxCode::Replayed,
            "A" => OutboxCode::Redelivered,
            "W" => OutboxCode::DeadReason,
            _ => return None,
        };
        let id = parts.next().filter(|s| !s.is_empty())?.to_owned();
        let at_ms = parts.next()?.parse().ok()?;
        let dash = |s: &str| (s != "-").then(|| s.to_owned());
        let entry = dash(parts.next()?);
        let stream = dash(parts.next()?);
        let attempt = match (code, parts.next()) {
            (OutboxCode::Redelivered, Some(attempt)) => Some(attempt.parse().ok()?),
            (_, None) => None,
            (_, Some(_)) => return None,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(OutboxLine {
            code,
            id,
            at_ms,
            entry,
            stream,
            attempt,
        })
    }
}

impl Store {
    /// The outbox key of `shard` (the prelude's `journal_outbox`).
    fn outbox(&self, shard: u16) -> String {
        format!("{}:journal", self.keys.shard(shard).records)
    }

    /// The first `items` items of each shard's outbox (an item is one script
    /// call's lines), shard by shard.
    pub async fn outbox_items(&self, shards: &[u16], items: usize) -> Result<Vec<Vec<String>>> {
        let cmds = shards
            .iter()
            .map(|&shard| {
                let mut cmd = redis::cmd("LRANGE");
                cmd.arg(self.outbox(shard))
                    .arg(0)
                    .arg(items.max(1) as i64 - 1);
                cmd
            })
            .collect();
        self.query_each(cmds).await
    }

    /// Drops the first `copied` items of a shard's outbox, as the leader of
    /// `epoch`, once they are in the journal; the items left.
    pub async fn outbox_ack(&self, shard: u16, epoch: u64, copied: usize) -> Result<u64> {
        let k = self.keys.shard(shard);
        self.scripts
            .journal_ack
            .key(self.outbox(shard))
            .key(&k.fence)
            .arg(epoch)
            .arg(copied)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)
    }

    /// The journal marker this Redis holds, if any (a provisional one, not yet
    /// confirmed, is none: see [`Store::confirm_journal_marker`]).
    pub async fn journal_marker(&self) -> Result<Option<String>> {
        let marker: Option<String> = self.conn.clone().get(self.keys.journal_marker()).await?;
        Ok(marker.filter(|m| !m.starts_with(PROVISIONAL)))
    }

    /// Writes the journal marker provisionally, before the journal is counted,
    /// unless Redis holds a final marker: one a restore wrote after the caller read
    /// none is never overwritten (a keeper's check would otherwise take it for a
    /// loss until the next restore). Returns the provisional value for
    /// [`Store::confirm_journal_marker`] (one an earlier check left, or this one),
    /// or None when a final marker is there. One command (`SET … NX GET`), so that
    /// no restore's write falls between the read and the write.
    pub async fn set_provisional_journal_marker(&self, token: &str) -> Result<Option<String>> {
        let provisional = format!("{PROVISIONAL}{token}");
        let before: Option<String> = redis::cmd("SET")
            .arg(self.keys.journal_marker())
            .arg(&provisional)
            .arg("NX")
            .arg("GET")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match before {
            None => Some(provisional),
            Some(left) if left.starts_with(PROVISIONAL) => Some(left),
            Some(_) => None,
        })
    }

    /// Makes the provisional marker final (`token`) if Redis still holds it: false
    /// when Redis lost its data since it was written (the marker stays missing, and
    /// the next check finds the loss).
    pub async fn confirm_journal_marker(&self, provisional: &str, token: &str) -> Result<bool> {
        let confirmed: i64 = self
            .scripts
            .confirm_marker
            .key(self.keys.journal_marker())
            .arg(provisional)
            .arg(token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(confirmed == 1)
    }

    /// Writes the journal marker.
    pub async fn set_journal_marker(&self, token: &str) -> Result<()> {
        let () = self
            .conn
            .clone()
            .set(self.keys.journal_marker(), token)
            .await?;
        Ok(())
    }
}

/// How a provisional journal marker's value begins.
const PROVISIONAL: &str = "provisional:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_lines_read_back() {
        assert_eq!(
            OutboxLine::parse("D m-1 1700000000123 1700000000120-3 orders"),
            Some(OutboxLine {
                code: OutboxCode::Delivered,
                id: "m-1".into(),
                at_ms: 1_700_000_000_123,
                entry: Some("1700000000120-3".into()),
                stream: Some("orders".into()),
                attempt: None,
            })
        );
        let again = OutboxLine::parse("A m-1 9 1700000000120-3 orders 3").expect("a redelivery");
        assert_eq!(
            (again.code, again.attempt),
            (OutboxCode::Redelivered, Some(3))
        );
        let why = OutboxLine::parse("W m-1 9 max_attempts orders").expect("a reason");
        assert_eq!(
            (why.code, why.entry.as_deref()),
            (OutboxCode::DeadReason, Some("max_attempts"))
        );
        let cancelled = OutboxLine::parse("C m-2 5 - -").expect("a cancellation");
        assert_eq!((cancelled.entry, cancelled.stream), (None, None));
        for bad in [
            "",
            "Q m 1 - -",
            "D  1 - -",
            "D m x - -",
            "D m 1 -",
            "D m 1 - - x",
            "D m 1 - - 3",
            "A m 1 e s x",
            "A m 1 e s 3 4",
            "W m 1 corrupt s 2",
        ] {
            assert_eq!(OutboxLine::parse(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_line_is_read_or_refused_without_panicking(line in ".{0,80}") {
            let _ = OutboxLine::parse(&line);
        }

        #[test]
        fn a_redelivery_s_line_reads_back(
            id in "[a-z0-9-]{1,20}", at in 0u64..u64::MAX, attempt in 2u32..u32::MAX,
        ) {
            let line = OutboxLine::parse(&format!("A {id} {at} 5-0 s {attempt}")).unwrap();
            proptest::prop_assert_eq!((line.id, line.at_ms, line.attempt), (id, at, Some(attempt)));
        }
    }
}
