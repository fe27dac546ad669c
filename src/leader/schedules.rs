//! Recurring schedules made into messages, by the leader of shard 0, each round
//! (every [`ROUND`]) up to `schedules.horizon` ahead.
//!
//! An occurrence is an ordinary delayed message whose id is the schedule's and the
//! occurrence's (`<schedule>.<ms>`). The leader pushes a round's messages first and
//! only then records how far the schedule is made (fenced by shard 0's fence): a
//! leader that dies in between leaves the next one to push the same ids again,
//! which are duplicates. So a leader change, a restart or a standby that takes over
//! mid-horizon never skips an occurrence nor doubles one.
//!
//! Occurrences more than [`GRACE`] in the past when first made (every node was down,
//! or the schedule was paused) were missed: the schedule's `misfire` policy says
//! which of them are sent, now.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::term::Term;
use crate::complaint::Complaint;
use crate::config::Config;
use crate::message::{Due, MessageId, MessageKey, NewMessage};
use crate::metrics as m;
use crate::schedule::{ScheduleSpec, occurrence_id, plan};
use crate::store::{Advanced, BatchItem, ScheduleState, Scheduled, Store, StoreError};

/// How often the leader looks at the schedules.
pub const ROUND: Duration = Duration::from_millis(500);
/// How late an occurrence may be made and still be sent as usual.
pub const GRACE: Duration = Duration::from_secs(5);
static ROUND_FAILED: Complaint = Complaint::new(
    "making schedules' occurrences failed; the next round retries",
    "schedules' occurrences are made again",
);

/// Makes the schedules' occurrences while `term` lasts (on the node whose term
/// holds shard 0).
pub async fn run(term: Term, live: watch::Receiver<Arc<Config>>, store: Store) {
    if !store.owns(0) {
        return;
    }
    loop {
        let config = live.borrow().clone();
        match round(&term, &config, &store).await {
            Ok(()) => {
                if let Some(said) = ROUND_FAILED.recovered() {
                    tracing::info!("{said}");
                }
            }
            Err(StoreError::Fenced { held, .. }) => return term.fenced("making schedules", held),
            Err(e) => {
                if let Some(said) = ROUND_FAILED.failed() {
                    tracing::warn!(error = %e, "{said}");
                }
            }
        }
        tokio::select! {
            _ = term.ended() => return,
            _ = tokio::time::sleep(ROUND) => {}
        }
    }
}

async fn round(term: &Term, config: &Config, store: &Store) -> Result<(), StoreError> {
    let now = store.now_ms().await? as i64;
    let horizon = config
        .schedules
        .horizon_within(config.records.retention)
        .as_millis() as i64;
    let own = config.forwarder.own_fields();
    for (spec, state) in store.schedule_specs().await? {
        if spec.paused || term.is_over() {
            continue;
        }
        let when = match spec.validate(|fields| {
            crate::message::check_field_names(fields, &own).map_err(|e| e.to_string())
        }) {
            Ok(when) => when,
            Err(why) => {
                tracing::warn!(schedule = spec.id, %why, "schedule left alone: it breaks a rule");
                continue;
            }
        };
        let next = match state {
            Some(s) => Some(s.next),
            None => spec.first(&when),
        };
        let planned = plan(&spec, &when, next, now, horizon, GRACE.as_millis() as i64);
        if planned.is_empty() {
            continue;
        }
        if planned.missed > 0 {
            tracing::info!(
                schedule = spec.id,
                missed = planned.missed,
                sent = planned.late.len(),
                policy = ?spec.misfire,
                "schedule missed occurrences while no leader made them"
            );
            metrics::counter!(m::SCHEDULE_MISSED).increment(planned.missed as u64);
        }
        let items: Vec<BatchItem> = planned
            .late
            .iter()
            .map(|&at| occurrence(&spec, at, Due::In(Duration::ZERO)))
            .chain(
                planned
                    .coming
                    .iter()
                    .map(|&at| occurrence(&spec, at, Due::At(at as u64 + spec.jitter_of(at)))),
            )
            .collect::<Result<_, _>>()?;
        let outcomes = match items.is_empty() {
            true => Vec::new(),
            false => {
                store
                    .schedule_many(&items, config.api.limits.max_delay, None)
                    .await
            }
        };
        for outcome in outcomes {
            match outcome? {
                Scheduled::Scheduled { .. } => {
                    metrics::counter!(m::SCHEDULE_OCCURRENCES).increment(1)
                }
                Scheduled::Duplicate { .. } | Scheduled::Replaced { .. } => {}
            }
        }
        let advanced = store
            .advance_schedule(
                term.epoch(),
                &spec.id,
                state,
                ScheduleState {
                    next: planned.next.unwrap_or(i64::MAX),
                    last: planned.last.or(state.and_then(|s| s.last)),
                },
            )
            .await?;
        if advanced == Advanced::Moved {
            tracing::debug!(
                schedule = spec.id,
                "another leader advanced the schedule first"
            );
        }
    }
    Ok(())
}

/// The message of `spec`'s occurrence at `at`.
fn occurrence(spec: &ScheduleSpec, at: i64, due: Due) -> Result<BatchItem, StoreError> {
    let id = MessageId::parse(&occurrence_id(&spec.id, at))
        .map_err(|e| StoreError::Reply(format!("schedule {}: {e}", spec.id)))?;
    let key = spec
        .key
        .as_deref()
        .map(MessageKey::parse)
        .transpose()
        .map_err(|e| StoreError::Reply(format!("schedule {}: {e}", spec.id)))?;
    Ok(BatchItem::new(
        NewMessage::new(spec.stream.clone(), spec.fields.clone(), due)
            .with_id(id)
            .with_key(key),
    ))
}
