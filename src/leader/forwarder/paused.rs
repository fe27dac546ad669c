//! Paused streams (`delayq pause`): the set followed while the term is held, and
//! each paused stream's forwarding budget of none.

use super::*;

/// How often a term reads the paused streams: a resume takes effect within this. A
/// pause is in force once Redis took it: every forward call reads the set itself (on
/// Redis Cluster, its slot's copy of it).
pub const PAUSED_EVERY: Duration = Duration::from_millis(250);

/// Follows the paused streams (an operator's `POST /v1/streams/{stream}/pause`)
/// until the term ends, waking every loop when they change: a resumed stream's
/// held messages go at once. A read that fails keeps the last set; until the first
/// read succeeds the loops forward nothing. While the term is held (Redis lost its
/// data, and a restore puts the paused streams back) the set is unknown again:
/// the loops wait for a read made after the hold.
pub(super) async fn follow_paused(
    store: Store,
    term: Term,
    paused: watch::Sender<Option<Arc<BTreeSet<String>>>>,
    wakers: Arc<Vec<Notify>>,
    cancel: CancellationToken,
) {
    loop {
        if term.is_held() {
            paused.send_replace(None);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = term.unheld() => {}
            }
            continue;
        }
        let read = store.paused().await;
        if term.is_held() {
            continue; // read across a hold: perhaps from before the restore
        }
        match read {
            Ok(now) if paused.borrow().as_deref() != Some(&now) => {
                if paused.borrow().is_some() || !now.is_empty() {
                    tracing::info!(paused = ?now, "paused streams");
                }
                paused.send_replace(Some(Arc::new(now)));
                wakers.iter().for_each(Notify::notify_one);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read the paused streams"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = term.held() => {}
            _ = tokio::time::sleep(PAUSED_EVERY) => {}
        }
    }
}

/// A paused stream's budget is 0 for the call: its due messages move to its held
/// set, in due order, and wait there (the permits a limited stream had taken go
/// back to its bucket).
pub(super) fn pause_budgets(
    budgets: &mut Vec<(String, usize)>,
    paused: &BTreeSet<String>,
    limits: &StreamLimits,
) {
    for stream in paused {
        match budgets.iter_mut().find(|(s, _)| s == stream) {
            Some((_, budget)) => {
                limits.give_back(&[(stream.clone(), *budget)], &[]);
                *budget = 0;
            }
            None => budgets.push((stream.clone(), 0)),
        }
    }
}
