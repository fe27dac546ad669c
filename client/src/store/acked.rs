//! Changes a user is told succeeded, confirmed by replicas: with
//! `redis.min_replicas_acked`, a script call goes on the connection kept for such
//! calls, pinned to the master it reaches, with `WAIT` behind it in one pipeline
//! (see `Call::invoke_then_wait`), so that the replicas counted are the very
//! master's that ran it: a push, a cancel, a reschedule alike.

use redis::Value;

use super::scripts::Call;
use super::{Result, Store, StoreError};

impl Store {
    /// Runs `call`, and with `redis.min_replicas_acked` counts the replicas that
    /// confirmed it: its reply, and (confirmed, wanted) when asked for.
    pub(super) async fn invoke_acked(
        &self,
        call: &Call<'_>,
    ) -> Result<(Value, Option<(u32, u32)>)> {
        match (self.replicas_acked, &self.acked) {
            (Some((wanted, timeout)), Some(conn)) => {
                let mut conn = conn.pinned();
                let (reply, acked) = call
                    .invoke_then_wait(&mut conn, wanted, timeout)
                    .await
                    .map_err(StoreError::from_script)?;
                Ok((reply, Some((acked, wanted))))
            }
            _ => {
                let reply = call
                    .invoke_async(&mut self.conn.clone())
                    .await
                    .map_err(StoreError::from_script)?;
                Ok((reply, None))
            }
        }
    }
}

/// `NotReplicated` when a change was made but fewer replicas than wanted
/// confirmed it.
pub(super) fn confirmed(acked: Option<(u32, u32)>) -> Result<()> {
    match acked {
        Some((acked, wanted)) if acked < wanted => Err(StoreError::NotReplicated { acked, wanted }),
        _ => Ok(()),
    }
}
