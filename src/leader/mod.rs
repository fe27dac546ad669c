//! What runs only while this node leads. [`run_while_leading`] starts a
//! [`Term`] each time this node becomes leader: it raises the fences,
//! then starts the leader-only workers (the forward loops and their housekeeping
//! in [`forwarder`], the redelivery sweep in [`sweeper`], the journal's keeper in
//! [`keeper`]) under the term's own cancellation token, and stops them, each after
//! at most the script call in flight, when the role changes or the daemon stops.
//! Workers receive the term and never decide leadership; [`term`] sits below them
//! and this module, which starts them, above.

pub mod forwarder;
pub mod keeper;
pub mod rate;
pub mod schedules;
pub mod sweeper;
pub mod term;
mod timer;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::leadership::{Leadership, Role};
use crate::store::{Store, StoreError};
use term::Term;

/// Runs the leader-only workers during every term this node leads, until `cancel`.
/// Returns once every worker has stopped. `live` is the running configuration: a
/// term starts with its latest value, and workers follow the reloadable keys as
/// they change.
pub async fn run_while_leading(
    live: watch::Receiver<Arc<Config>>,
    store: Store,
    journal: Option<crate::journal::Journal>,
    leadership: Leadership,
    cancel: CancellationToken,
) {
    let mut roles = leadership.subscribe();
    loop {
        let role = roles.borrow_and_update().clone();
        if let Role::Leader(lead) = role {
            let term = Term::new(
                lead.epoch,
                &store.owned_shards(),
                leadership.clone(),
                cancel.child_token(),
            );
            let mut work = JoinSet::new();
            work.spawn(serve(
                term.clone(),
                live.clone(),
                store.clone(),
                journal.clone(),
            ));
            // None: the term ended on its own (fenced) while the role still says
            // leader; Some(gone): the role changed (or its sender is gone).
            let role_changed = tokio::select! {
                _ = cancel.cancelled() => Some(false),
                _ = term.ended() => None,
                changed = roles.changed() => Some(changed.is_err()),
            };
            term.token.cancel();
            work.join_all().await;
            tracing::info!(
                epoch = lead.epoch,
                forwarded = term.forwarded.load(Ordering::Relaxed),
                "leader loops stopped"
            );
            match role_changed {
                Some(true) => return,
                Some(false) => {}
                // Fenced: no new term until the elector has acted on the step-down.
                None => tokio::select! {
                    _ = cancel.cancelled() => {}
                    changed = roles.changed() => if changed.is_err() { return; }
                },
            }
        } else {
            tokio::select! {
                _ = cancel.cancelled() => {}
                changed = roles.changed() => if changed.is_err() { return; }
            }
        }
        if cancel.is_cancelled() {
            return;
        }
    }
}

static RAISE_FAILED: crate::complaint::Complaint = crate::complaint::Complaint::new(
    "cannot raise the fences yet; retrying",
    "the fences are raised",
);

/// One term: fences first (from then on an older leader's scripts are refused),
/// then every leader-only worker, until the term ends.
async fn serve(
    term: Term,
    live: watch::Receiver<Arc<Config>>,
    store: Store,
    journal: Option<crate::journal::Journal>,
) {
    // Every write of the term goes to the master it began on (see `Store::pinned`).
    let store = store.pinned();
    if let (Some(mut changes), Some(pin)) = (store.master_changes(), store.pinned_to()) {
        let term = term.clone();
        tokio::spawn(async move {
            loop {
                let (moves, address) = changes.borrow_and_update().clone();
                if moves != pin {
                    return term.master_moved(&address);
                }
                tokio::select! {
                    _ = term.ended() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
    }
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match store.raise_fences(term.epoch()).await {
            Ok(()) => {
                if let Some(said) = RAISE_FAILED.recovered_on(term.place()) {
                    tracing::info!("{said}");
                }
                break;
            }
            Err(StoreError::Fenced { held, .. }) => return term.fenced("raising the fences", held),
            Err(e) => {
                if let Some(said) = RAISE_FAILED.failed_on(term.place()) {
                    tracing::warn!(epoch = term.epoch(), error = %e, "{said}");
                }
                tokio::select! {
                    _ = term.ended() => return,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
        }
    }
    tracing::info!(
        epoch = term.epoch(),
        shards = store.owned_shards().len(),
        "fences raised; forwarding"
    );
    let mut workers = JoinSet::new();
    // Occurrences of schedules are pushed as a producer's are: journaled first.
    let ingest = crate::ingest::Ingest::new(
        store.clone(),
        journal.clone().map(crate::journal::Committer::start),
    );
    if let Some(journal) = journal {
        // Held until the keeper has seen that Redis still has the journal's data.
        term.hold(true);
        workers.spawn(keeper::run(
            term.clone(),
            live.clone(),
            store.clone(),
            journal,
        ));
    }
    forwarder::start(&mut workers, &term, live.clone(), &store);
    workers.spawn(schedules::run(term.clone(), live.clone(), ingest));
    workers.spawn(sweeper::run(live, store, term));
    workers.join_all().await;
}
