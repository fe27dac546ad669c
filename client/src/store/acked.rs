//! Changes a user is told succeeded, confirmed by replicas: with
//! `redis.min_replicas_acked`, a script call goes on the connection kept for such
//! calls, pinned to the master it reaches, with `WAIT` behind it in one pipeline
//! (see `Call::invoke_then_wait`), so that the replicas counted are the very
//! master's that ran it: a push, a cancel, a reschedule, a replay alike; and plain
//! commands (a purge, a pause) with `WAIT` behind them in the same way.

use redis::Value;
use redis::aio::ConnectionLike;

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

impl Store {
    /// Runs the plain commands of `pipe` and answers `count` of their replies from
    /// `offset`, with `WAIT` behind them as [`Store::invoke_acked`] does.
    pub(super) async fn query_acked(
        &self,
        mut pipe: redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<(Vec<Value>, Option<(u32, u32)>)> {
        let (mut replies, wanted) = match (self.replicas_acked, &self.acked) {
            (Some((wanted, timeout)), Some(conn)) => {
                pipe.cmd("WAIT").arg(wanted).arg(timeout.as_millis() as u64);
                let replies = conn
                    .pinned()
                    .req_packed_commands(&pipe, offset, count + 1)
                    .await?;
                (replies, Some(wanted))
            }
            _ => (
                self.conn
                    .clone()
                    .req_packed_commands(&pipe, offset, count)
                    .await?,
                None,
            ),
        };
        let acked = wanted.map(|wanted| {
            let acked = match replies.pop() {
                Some(Value::Int(n)) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
                _ => 0,
            };
            (acked, wanted)
        });
        for reply in &replies {
            if let Value::ServerError(e) = reply {
                return Err(redis::RedisError::from(e.clone()).into());
            }
        }
        Ok((replies, acked))
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
