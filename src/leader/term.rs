//! One leadership term: "this node leads with epoch E", the handle every
//! leader-only worker receives (started by [`super::run_while_leading`]). Workers
//! never decide leadership; [`Term::fenced`] is the only place where a `FENCED`
//! reply becomes a step-down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::leadership::{Leadership, StepDown};

/// A term as its workers see it. Cheap to clone: clones share the term.
#[derive(Clone)]
pub struct Term {
    epoch: u64,
    /// The shards the term leads (its election group's, or all).
    shards: usize,
    /// The lowest of them: names the term's group in the complaints shared by
    /// every group's terms (see `complaint`).
    place: u64,
    leadership: Leadership,
    pub(super) token: CancellationToken,
    /// Set by the first worker that was fenced, so the step-down is asked and
    /// logged once however many workers were refused.
    fenced: Arc<AtomicBool>,
    /// Messages the term forwarded, for the line that ends it.
    pub(super) forwarded: Arc<AtomicU64>,
    /// True while forwarding and redelivery must wait: Redis lost the journal's
    /// data and a restore is due (see `keeper`).
    held: watch::Sender<bool>,
}

impl Term {
    pub(super) fn new(
        epoch: u64,
        shards: &[u16],
        leadership: Leadership,
        token: CancellationToken,
    ) -> Term {
        Term {
            epoch,
            shards: shards.len(),
            place: shards.iter().min().map_or(0, |s| u64::from(*s)),
            leadership,
            token,
            fenced: Arc::new(AtomicBool::new(false)),
            forwarded: Arc::new(AtomicU64::new(0)),
            held: watch::Sender::new(false),
        }
    }

    /// Counts messages the term forwarded.
    pub fn forwarded(&self, n: u64) {
        self.forwarded.fetch_add(n, Ordering::Relaxed);
    }

    /// Holds forwarding and redelivery (`true`) or lets them go on.
    pub fn hold(&self, held: bool) {
        self.held
            .send_if_modified(|h| std::mem::replace(h, held) != held);
    }

    /// Returns once forwarding may go on (at once unless held), or the term ends.
    pub async fn unheld(&self) {
        self.until_held(false).await
    }

    /// Returns once forwarding is held (or the term ends).
    pub async fn held(&self) {
        self.until_held(true).await
    }

    async fn until_held(&self, held: bool) {
        let mut state = self.held.subscribe();
        tokio::select! {
            _ = self.token.cancelled() => {}
            _ = state.wait_for(|h| *h == held) => {}
        }
    }

    /// Whether forwarding is held now.
    pub fn is_held(&self) -> bool {
        *self.held.borrow()
    }

    /// The epoch every leader-only script call of this term carries.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Where the term's workers fail and recover, for complaints that the terms of
    /// every election group share (`Complaint::failed_on`): the same for every
    /// term of a group, different between groups.
    pub fn place(&self) -> u64 {
        self.place
    }

    /// Completes when the term is over (role change, fenced, or shutdown).
    pub async fn ended(&self) {
        self.token.cancelled().await
    }

    pub fn is_over(&self) -> bool {
        self.token.is_cancelled()
    }

    /// A token cancelled when the term ends, for a worker's own sub-tasks.
    pub fn child_token(&self) -> CancellationToken {
        self.token.child_token()
    }

    /// A newer leader holds the fence and refused `what` (`"forward"`,
    /// `"trimming"`, …): the term is over. Asks the elector to step down, once,
    /// and ends the term, so every worker stops now rather than at its own next
    /// refusal. Logged once for the term, together with the other election groups'
    /// terms fenced at the same time (see [`FENCE_GATHER`]).
    pub fn fenced(&self, what: &str, held: u64) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            let hint = self.leadership.info().mode == "etcd";
            Fences::report(Fences {
                terms: 1,
                shards: self.shards,
                epoch: self.epoch,
                held,
                what: what.to_owned(),
                hint,
            });
            self.leadership.step_down(StepDown::Fenced {
                epoch: self.epoch,
                held,
            });
        }
        self.token.cancel();
    }

    /// The Redis master moved (Sentinel failover) during the term: its fences may
    /// have gone back with the writes the failover lost, and only a new epoch from
    /// the election is sure to be above every one they held. Asks the elector for a
    /// new term, once, and ends this one.
    pub fn master_moved(&self, address: &str) {
        if !self.fenced.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                epoch = self.epoch,
                %address,
                "the Redis master moved: ending this term so a new one raises the fences there"
            );
            self.leadership
                .step_down(StepDown::MasterMoved { epoch: self.epoch });
        }
        self.token.cancel();
    }
}

/// How long a fencing waits for the other election groups' terms fenced with it
/// before it is logged: a newer leader raises every group's fences at once, and
/// the node learns of each at its next script call there, within milliseconds.
pub const FENCE_GATHER: Duration = Duration::from_millis(250);

/// Terms fenced within [`FENCE_GATHER`] of each other, logged as one line.
struct Fences {
    terms: usize,
    shards: usize,
    /// The first term's epoch, the highest fence, what was refused first.
    epoch: u64,
    held: u64,
    what: String,
    /// Elected through etcd: the line says what a fencing after every election means.
    hint: bool,
}

/// The fencing gathered so far, waiting to be logged.
static GATHERED: Mutex<Option<Fences>> = Mutex::new(None);

impl Fences {
    /// Logs `fenced` after [`FENCE_GATHER`] with any fenced meanwhile (at once
    /// outside a runtime).
    fn report(fenced: Fences) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return fenced.log();
        };
        if !fenced.gather(&GATHERED) {
            return;
        }
        runtime.spawn(async {
            tokio::time::sleep(FENCE_GATHER).await;
            let taken = GATHERED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(fences) = taken {
                fences.log();
            }
        });
    }

    /// Adds `self` to what `gathered` holds; true when it is the first, whose
    /// caller logs them all after [`FENCE_GATHER`].
    fn gather(self, gathered: &Mutex<Option<Fences>>) -> bool {
        let mut gathered = gathered.lock().unwrap_or_else(PoisonError::into_inner);
        match gathered.as_mut() {
            Some(g) => {
                g.terms += self.terms;
                g.shards += self.shards;
                g.held = g.held.max(self.held);
                false
            }
            None => {
                *gathered = Some(self);
                true
            }
        }
    }

    fn message(&self) -> String {
        let s = if self.shards == 1 { "" } else { "s" };
        let hint = if self.hint {
            ". If this repeats after every election, the fence is above the epochs etcd gives: a standalone instance (etcd.endpoints = []) ran on this Redis, or the etcd cluster was rebuilt. Once no such instance runs, etcd's revision passes a small fence within a few elections; otherwise see `delayq fence show` and docs/ha.md"
        } else {
            ""
        };
        format!(
            "fenced on {} shard{s} by epoch {}; stepping down{hint}",
            self.shards, self.held
        )
    }

    fn log(&self) {
        tracing::error!(
            epoch = self.epoch,
            held = self.held,
            refused = %self.what,
            terms = self.terms,
            "{}",
            self.message()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_term_steps_down_once_and_ends_for_every_worker() {
        let (mut elector, leadership) = crate::leadership::channel();
        let term = Term::new(7, &[0, 1, 2, 3], leadership, CancellationToken::new());
        let workers = [term.clone(), term.clone(), term.clone()];
        let sub_task = workers[0].child_token();
        for (i, worker) in workers.iter().enumerate() {
            worker.fenced("forward", 9 + i as u64);
        }
        assert!(term.is_over() && sub_task.is_cancelled());
        match elector.requests.try_recv() {
            Ok(StepDown::Fenced { epoch: 7, held: 9 }) => {}
            other => panic!("one step-down for the first refusal, got {other:?}"),
        }
        assert!(elector.requests.try_recv().is_err(), "asked once only");
    }

    #[test]
    fn the_terms_of_groups_fenced_together_make_one_line() {
        let fenced = |epoch, shards, held, what: &str| Fences {
            terms: 1,
            shards,
            epoch,
            held,
            what: what.to_owned(),
            hint: false,
        };
        let gathered = Mutex::new(None);
        assert!(
            fenced(7, 4, 9, "forward").gather(&gathered),
            "the first logs"
        );
        assert!(!fenced(8, 4, 10, "sweep").gather(&gathered));
        assert!(!fenced(6, 1, 9, "trimming").gather(&gathered));
        let line = gathered.lock().unwrap().take().unwrap();
        assert_eq!(
            (line.terms, line.epoch, line.what.as_str()),
            (3, 7, "forward")
        );
        assert_eq!(
            line.message(),
            "fenced on 9 shards by epoch 10; stepping down"
        );
        let one = Fences {
            hint: true,
            ..fenced(7, 1, 9, "forward")
        };
        assert!(
            one.message().starts_with(
                "fenced on 1 shard by epoch 9; stepping down. If this repeats after every election"
            ) && one
                .message()
                .contains("a standalone instance (etcd.endpoints = [])"),
            "{}",
            one.message()
        );
    }
}
