//! Recurring schedules as Redis keeps them: their definitions (any node writes
//! them, for the API) and how far the leader has made their occurrences (only the
//! leader, fenced by shard 0's fence).

use super::*;
use crate::schedule::ScheduleSpec;

/// How far a schedule's occurrences are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleState {
    /// The first occurrence not yet made (epoch ms).
    pub next: i64,
    /// The last occurrence made (epoch ms), if any.
    pub last: Option<i64>,
    /// Occurrences missed while no leader made them, since the schedule was last
    /// stored (its misfire policy sent some of them).
    pub missed: u64,
}

/// A definition's change: whether it changed anything (a new schedule, one
/// deleted), Redis's time of it, and whether enough replicas confirmed it.
#[derive(Debug)]
pub struct Changed {
    pub changed: bool,
    pub at_ms: u64,
    pub replicated: Result<()>,
}

/// What the leader's advance did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advanced {
    Advanced,
    /// Another leader advanced it first; nothing was written.
    Moved,
    /// The schedule was deleted meanwhile.
    Gone,
}

fn state_key(schedules: &str) -> String {
    format!("{schedules}:state")
}

/// String: a counter every change of a definition moves, so that the leader reads
/// the definitions again only when one changed.
fn version_key(schedules: &str) -> String {
    format!("{schedules}:version")
}

/// `<next> <last> [<missed>]` (a state written before misfires were counted has
/// none).
fn parse_state(text: &str) -> Option<ScheduleState> {
    let mut parts = text.split(' ');
    let next = parts.next()?.parse().ok()?;
    let last: i64 = parts.next()?.parse().ok()?;
    let missed = match parts.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(ScheduleState {
        next,
        last: (last > 0).then_some(last),
        missed,
    })
}

/// How `state` is written, after its next occurrence (the advance script's last
/// argument of each schedule).
fn state_tail(state: &ScheduleState) -> String {
    format!("{} {}", state.last.unwrap_or(0), state.missed)
}

impl Store {
    /// Stores `spec` (a new schedule, or a changed one: its occurrences are then
    /// made afresh from now on), confirmed by replicas as
    /// `redis.min_replicas_acked` asks: whether it is new, and Redis's time of the
    /// change.
    pub async fn put_schedule(&self, spec: &ScheduleSpec) -> Result<Changed> {
        let json = serde_json::to_string(spec).expect("a schedule serializes");
        let key = self.keys.schedules();
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI")
            .cmd("HSET")
            .arg(&key)
            .arg(&spec.id)
            .arg(json)
            .cmd("HDEL")
            .arg(state_key(&key))
            .arg(&spec.id);
        self.schedule_change(pipe, 2, "put").await
    }

    /// Stores `spec` only if no schedule of its id exists (`changed` false then,
    /// and nothing written): two nodes adding the same declared schedule at once
    /// keep the first one's.
    pub async fn add_schedule(&self, spec: &ScheduleSpec) -> Result<Changed> {
        let json = serde_json::to_string(spec).expect("a schedule serializes");
        let key = self.keys.schedules();
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI")
            .cmd("HSETNX")
            .arg(&key)
            .arg(&spec.id)
            .arg(json);
        self.schedule_change(pipe, 1, "add").await
    }

    /// The change of `queued` commands queued in `pipe` after its MULTI (its first
    /// command's reply the answer), with the version moved and Redis's time read in
    /// the same transaction.
    async fn schedule_change(
        &self,
        mut pipe: redis::Pipeline,
        queued: usize,
        what: &str,
    ) -> Result<Changed> {
        pipe.cmd("INCR")
            .arg(version_key(&self.keys.schedules()))
            .cmd("TIME")
            .cmd("EXEC");
        // MULTI's and each queued command's replies are skipped: EXEC's holds them.
        let (replies, acked) = self.query_acked(pipe, queued + 3, 1).await?;
        let bad = |e: String| StoreError::Reply(format!("schedule {what}: {e}"));
        let exec: Vec<Value> = redis::from_redis_value(
            replies
                .into_iter()
                .next()
                .ok_or_else(|| bad("no reply".into()))?,
        )
        .map_err(|e| bad(e.to_string()))?;
        let (Some(first), Some(time)) = (exec.first(), exec.last()) else {
            return Err(bad(format!("{} replies in EXEC's", exec.len())));
        };
        let changed: i64 =
            redis::from_redis_value(first.clone()).map_err(|e| bad(e.to_string()))?;
        let (secs, micros): (u64, u64) =
            redis::from_redis_value(time.clone()).map_err(|e| bad(e.to_string()))?;
        Ok(Changed {
            changed: changed > 0,
            at_ms: secs * 1000 + micros / 1000,
            replicated: super::acked::confirmed(acked),
        })
    }

    /// Puts back a schedule a restore read from the journal, with how far it was
    /// made, unless Redis holds one of its id: whether it was put back.
    pub async fn restore_schedule(
        &self,
        spec: &ScheduleSpec,
        made: Option<ScheduleState>,
    ) -> Result<bool> {
        let key = self.keys.schedules();
        let json = serde_json::to_string(spec).expect("a schedule serializes");
        let state = made.map_or_else(String::new, |made| {
            format!("{} {}", made.next, state_tail(&made))
        });
        // One script: the definition and how far it was made land together.
        let mut call = self.scripts.restore_schedule.key(&key);
        call.key(state_key(&key)).key(version_key(&key));
        call.arg(&spec.id).arg(json).arg(state);
        let restored: i64 = call
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        Ok(restored == 1)
    }

    /// How many schedules there are.
    pub async fn schedule_count(&self) -> Result<u64> {
        Ok(self.conn.clone().hlen(self.keys.schedules()).await?)
    }

    /// One schedule and how far it is made.
    pub async fn schedule_spec(
        &self,
        id: &str,
    ) -> Result<Option<(ScheduleSpec, Option<ScheduleState>)>> {
        let key = self.keys.schedules();
        let (json, state): (Option<String>, Option<String>) = redis::pipe()
            .hget(&key, id)
            .hget(state_key(&key), id)
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(json) = json else { return Ok(None) };
        let spec = serde_json::from_str(&json)
            .map_err(|e| StoreError::Reply(format!("schedule {id}: {e}")))?;
        Ok(Some((spec, state.as_deref().and_then(parse_state))))
    }

    /// Every schedule, by id, and how far each is made.
    pub async fn schedule_specs(&self) -> Result<Vec<(ScheduleSpec, Option<ScheduleState>)>> {
        let key = self.keys.schedules();
        let (all, states): (
            Vec<(String, String)>,
            std::collections::HashMap<String, String>,
        ) = redis::pipe()
            .hgetall(&key)
            .hgetall(state_key(&key))
            .query_async(&mut self.conn.clone())
            .await?;
        let mut out = Vec::with_capacity(all.len());
        for (id, json) in all {
            let spec: ScheduleSpec = serde_json::from_str(&json)
                .map_err(|e| StoreError::Reply(format!("schedule {id}: {e}")))?;
            out.push((spec, states.get(&id).and_then(|s| parse_state(s))));
        }
        out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        Ok(out)
    }

    /// The definitions' version: it moves with every change of one (0: none yet).
    pub async fn schedules_version(&self) -> Result<u64> {
        let version: Option<u64> = self
            .conn
            .clone()
            .get(version_key(&self.keys.schedules()))
            .await?;
        Ok(version.unwrap_or(0))
    }

    /// Deletes a schedule (its messages already made stay scheduled), confirmed by
    /// replicas as [`Store::put_schedule`]: `changed` false when there was none.
    pub async fn delete_schedule(&self, id: &str) -> Result<Changed> {
        let key = self.keys.schedules();
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI")
            .cmd("HDEL")
            .arg(&key)
            .arg(id)
            .cmd("HDEL")
            .arg(state_key(&key))
            .arg(id);
        self.schedule_change(pipe, 2, "delete").await
    }

    /// Records, for the leader of `epoch`, how far each schedule's occurrences are
    /// made (its messages pushed first): `(id, read, state)`, only where it still
    /// reads `read` (None: nothing made yet) and the epoch holds shard 0's fence.
    /// One call for up to `ADVANCES_PER_CALL` schedules; answers in order.
    pub async fn advance_schedules(
        &self,
        epoch: u64,
        advances: &[(String, Option<ScheduleState>, ScheduleState)],
    ) -> Result<Vec<Advanced>> {
        let key = self.keys.schedules();
        let mut out = Vec::with_capacity(advances.len());
        for chunk in advances.chunks(ADVANCES_PER_CALL) {
            let mut call = self.scripts.advance_schedule.prepare_invoke();
            call.key(self.keys.shard(0).fence)
                .key(state_key(&key))
                .key(&key)
                .arg(epoch);
            for (id, read, state) in chunk {
                call.arg(id)
                    .arg(read.map_or(0, |r| r.next))
                    .arg(state.next)
                    .arg(state_tail(state));
            }
            let replies: Vec<String> = call
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(StoreError::from_script)?;
            for reply in replies {
                out.push(match reply.as_str() {
                    "advanced" => Advanced::Advanced,
                    "moved" => Advanced::Moved,
                    "gone" => Advanced::Gone,
                    other => {
                        return Err(StoreError::Reply(format!(
                            "advance_schedule said {other:?}"
                        )));
                    }
                });
            }
        }
        Ok(out)
    }
}

/// Schedules one advance call records.
pub const ADVANCES_PER_CALL: usize = 250;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back() {
        for (text, state) in [
            ("5 0", Some((5, None, 0))),
            ("9 7", Some((9, Some(7), 0))),
            ("9 7 3", Some((9, Some(7), 3))),
            ("9", None),
            ("x 1", None),
            ("9 7 x", None),
            ("9 7 3 1", None),
        ] {
            let want = state.map(|(next, last, missed)| ScheduleState { next, last, missed });
            assert_eq!(parse_state(text), want, "{text}");
            if let Some(want) = want {
                assert_eq!(
                    parse_state(&format!("{} {}", want.next, state_tail(&want))),
                    Some(want)
                );
            }
        }
    }
}
