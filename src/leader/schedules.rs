//! Recurring schedules made into messages, by the leader of shard 0, each round
//! (every [`ROUND`]) up to `scheduler.horizon` ahead.
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
use crate::ingest::Ingest;
use crate::message::{Due, MessageId, MessageKey, NewMessage};
use crate::metrics as m;
use crate::schedule::{ScheduleSpec, When, occurrence_id, plan};
use crate::store::{Advanced, BatchItem, ScheduleState, Scheduled, Store, StoreError};

/// How often the leader looks at the schedules.
pub const ROUND: Duration = Duration::from_millis(500);
/// How late an occurrence may be made and still be sent as usual.
pub const GRACE: Duration = Duration::from_secs(5);
static ROUND_FAILED: Complaint = Complaint::new(
    "making schedules' occurrences failed; the next round retries",
    "schedules' occurrences are made again",
);

/// What this term knows of the schedules: their definitions as of `version` (read
/// again only when another node changed one), each with when it fires and how far
/// it is made. A term starts with none.
#[derive(Default)]
struct Known {
    version: Option<u64>,
    schedules: Vec<(ScheduleSpec, When, Option<ScheduleState>)>,
}

/// Makes the schedules' occurrences while `term` lasts (on the node whose term
/// holds shard 0), pushing them through `ingest`: with the journal on, journaled
/// first, so that a restore after a loss of Redis's data knows how far each
/// schedule was made.
pub async fn run(term: Term, live: watch::Receiver<Arc<Config>>, ingest: Ingest) {
    let store = ingest.store().clone();
    if !store.owns(0) {
        return;
    }
    let mut known = Known::default();
    loop {
        let config = live.borrow().clone();
        match round(&term, &config, &ingest, &mut known).await {
            Ok(()) => {
                if let Some(said) = ROUND_FAILED.recovered() {
                    tracing::info!("{said}");
                }
            }
            Err(StoreError::Fenced { held, .. }) => return term.fenced("making schedules", held),
            Err(e) => {
                // Read everything again: what failed may have half moved on.
                known.version = None;
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

/// Reads the definitions again when their version moved (`now`: Redis's clock,
/// for what a changed schedule withdraws).
async fn refresh(
    config: &Config,
    store: &Store,
    known: &mut Known,
    now: i64,
) -> Result<(), StoreError> {
    let version = store.schedules_version().await?;
    if known.version == Some(version) {
        return Ok(());
    }
    let own = config.own_fields();
    let before = std::mem::take(&mut known.schedules);
    let stored = store.schedule_specs().await?;
    // A schedule deleted, changed or paused since this term last read it: the
    // occurrences it made and that are not due yet are withdrawn, so that a change
    // takes effect now rather than a horizon later.
    for (old, when, made) in &before {
        let Some(made) = made else { continue };
        let still = stored.iter().find(|(spec, _)| spec.id == old.id);
        if still.is_some_and(|(spec, _)| spec == old) {
            continue;
        }
        let withdrawn = withdraw(store, config, old, when, *made, now).await?;
        if withdrawn > 0 {
            tracing::info!(
                schedule = old.id,
                withdrawn,
                "schedule changed: occurrences made and not yet due withdrawn"
            );
        }
    }
    for (spec, state) in stored {
        let rule = |fields: &crate::message::Fields| {
            crate::message::check_field_names(&spec.stream, fields, &own).map_err(|e| e.to_string())
        };
        match spec.validate(rule) {
            Ok(when) => known.schedules.push((spec, when, state)),
            Err(why) => {
                tracing::warn!(schedule = spec.id, %why, "schedule left alone: it breaks a rule");
            }
        }
    }
    known.version = Some(version);
    Ok(())
}

/// One round: every schedule's plan, then all their messages in as few calls as
/// the store makes (up to 1000 messages a call), then how far each is made, in
/// calls of many schedules: a firing of 10,000 schedules at one instant costs
/// Redis a few dozen calls, not two for each.
async fn round(
    term: &Term,
    config: &Config,
    ingest: &Ingest,
    known: &mut Known,
) -> Result<(), StoreError> {
    let store = ingest.store();
    let now = store.now_ms().await? as i64;
    refresh(config, store, known, now).await?;
    let horizon = config
        .scheduler
        .horizon_within(config.records.retention)
        .as_millis() as i64;
    let mut items = Vec::new();
    let mut advances = Vec::new();
    let mut planned_of = Vec::new();
    for (i, (spec, when, state)) in known.schedules.iter().enumerate() {
        if spec.paused || term.is_over() {
            continue;
        }
        // Nothing due within the horizon: nothing to do.
        if state.is_some_and(|s| s.next > now + horizon) {
            continue;
        }
        let grace = GRACE.as_millis() as i64;
        let next = match state {
            Some(s) => made_unrecorded(store, spec, when, s.next, now - grace).await?,
            None => spec.first(when),
        };
        let planned = plan(spec, when, next, now, horizon, grace);
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
            let label = m::schedule_label(&spec.id);
            metrics::counter!(m::SCHEDULE_MISSED, "schedule" => label.clone())
                .increment(planned.missed as u64);
            metrics::counter!(m::SCHEDULE_SKIPPED, "schedule" => label)
                .increment((planned.missed - planned.late.len()) as u64);
        }
        for &at in &planned.late {
            items.push(occurrence(spec, at, Due::In(Duration::ZERO))?);
        }
        for &at in &planned.coming {
            items.push(occurrence(
                spec,
                at,
                Due::At(at as u64 + spec.jitter_of(at)),
            )?);
        }
        let made = ScheduleState {
            next: planned.next.unwrap_or(i64::MAX),
            last: planned.last.or(state.and_then(|s| s.last)),
            missed: state.map_or(0, |s| s.missed) + planned.missed as u64,
        };
        advances.push((spec.id.clone(), *state, made));
        planned_of.push((i, made));
    }
    if advances.is_empty() {
        return Ok(());
    }
    // Every message first: an advance recorded before its messages were stored
    // could lose them to a leader change.
    if !items.is_empty() {
        let outcomes = ingest
            .schedule_many(
                &items,
                config.api.limits.max_delay,
                None,
                &crate::journal::Came::node("schedule", &config.node_id),
            )
            .await;
        for (item, outcome) in items.iter().zip(outcomes) {
            match outcome? {
                Scheduled::Scheduled { .. } => {
                    // The schedule's id: the occurrence's, up to its last dot.
                    let id = item.msg.id.as_str();
                    let schedule = id.rsplit_once('.').map_or(id, |(s, _)| s);
                    metrics::counter!(m::SCHEDULE_OCCURRENCES, "schedule" => m::schedule_label(schedule))
                        .increment(1)
                }
                Scheduled::Duplicate { .. } | Scheduled::Replaced { .. } => {}
            }
        }
    }
    let answers = store.advance_schedules(term.epoch(), &advances).await?;
    for ((i, made), answer) in planned_of.into_iter().zip(answers) {
        match answer {
            Advanced::Advanced => known.schedules[i].2 = Some(made),
            // Changed or deleted meanwhile, or another leader went first: read
            // everything again next round. What this round pushed is kept as made,
            // so that the next round withdraws it if the schedule was changed or
            // deleted (a DELETE answered while this round pushed left it stored).
            Advanced::Moved | Advanced::Gone => {
                tracing::debug!(
                    schedule = known.schedules[i].0.id,
                    "schedule changed under this round"
                );
                known.schedules[i].2 = Some(made);
                known.version = None;
            }
        }
    }
    Ok(())
}

/// The first of `spec`'s occurrences from `next` that is not in Redis, looking only
/// at those already missed (before `late_before`): a leader that died between
/// pushing a round's messages and recording the advance left them made, and they
/// are neither missed nor sent again. In a steady round `next` is ahead of the
/// clock and nothing is read.
async fn made_unrecorded(
    store: &Store,
    spec: &ScheduleSpec,
    when: &When,
    next: i64,
    late_before: i64,
) -> Result<Option<i64>, StoreError> {
    let mut next = Some(next);
    for _ in 0..crate::schedule::MAX_PER_ROUND {
        let Some(at) = next.filter(|&at| at < late_before) else {
            break;
        };
        let id = MessageId::parse(&occurrence_id(&spec.id, at))
            .map_err(|e| StoreError::Reply(format!("schedule {}: {e}", spec.id)))?;
        if matches!(store.get(&id).await?, crate::store::Status::Unknown) {
            break;
        }
        next = when.next_after(at);
    }
    Ok(next)
}

/// Cancels `spec`'s occurrences after `now` that were made (before `made.next`);
/// returns how many were still pending.
async fn withdraw(
    store: &Store,
    config: &Config,
    spec: &ScheduleSpec,
    when: &When,
    made: ScheduleState,
    now: i64,
) -> Result<usize, StoreError> {
    let mut withdrawn = 0;
    let mut at = when.next_after(now);
    for _ in 0..crate::schedule::MAX_PER_ROUND {
        let Some(t) = at.filter(|&t| t < made.next) else {
            break;
        };
        let id = MessageId::parse(&occurrence_id(&spec.id, t))
            .map_err(|e| StoreError::Reply(format!("schedule {}: {e}", spec.id)))?;
        if store.cancel(&id, config.records.retention).await? == crate::store::Cancelled::Cancelled
        {
            withdrawn += 1;
        }
        at = when.next_after(t);
    }
    Ok(withdrawn)
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
