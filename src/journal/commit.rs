//! Group commit of pushes: every push waits for the journal's transaction that
//! carries it, and pushes that arrive while one is in flight share the next.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Came, Journal, JournalError, Push, Result};
use crate::message::{Due, NewMessage};

/// Rows one transaction carries at most.
const MAX_ROWS: usize = 4000;
/// Transactions in flight at once (each on a connection of the pool).
const IN_FLIGHT: usize = 4;
/// A transaction not committed by then fails its pushes (MySQL hung, a network
/// partition): they answer 503 rather than wait without end.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// One caller's pushes and where its answer goes.
struct Job {
    rows: Vec<(NewMessage, u64, bool)>,
    came: Came,
    /// Redis's time when the pushes began: their rows' `updated_ms`.
    at_ms: u64,
    done: oneshot::Sender<Result<()>>,
}

/// The handle pushes go through. Cheap to clone.
#[derive(Clone)]
pub struct Committer {
    jobs: mpsc::Sender<Job>,
    journal: Journal,
}

impl Committer {
    /// Starts the committing task; it ends when every handle is dropped.
    pub fn start(journal: Journal) -> Committer {
        let (jobs, rx) = mpsc::channel(16_384);
        tokio::spawn(run(journal.clone(), rx));
        Committer { jobs, journal }
    }

    /// The journal it writes to.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Journals `messages` as scheduled (each with whether it replaces an earlier
    /// message of its id) and returns once they are committed. `at_ms` is Redis's
    /// time read before the pushes: stamped on their rows (for [`Journal::discard`],
    /// and so that an outbox line of an earlier change does not undo them), and
    /// what a relative delay counts from (the caller hands Redis the same due time).
    /// `came` says how they came (their transition log's first step).
    pub async fn scheduled(
        &self,
        messages: &[(&NewMessage, bool)],
        at_ms: u64,
        came: &Came,
    ) -> Result<()> {
        let rows = messages
            .iter()
            .map(|(m, replace)| ((*m).clone(), due_ms(m.due, at_ms), *replace))
            .collect();
        let (done, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                rows,
                came: came.clone(),
                at_ms,
                done,
            })
            .await
            .map_err(|_| JournalError::Mysql("the journal's writer has stopped".into()))?;
        answer.await.unwrap_or_else(|_| {
            Err(JournalError::Mysql(
                "the journal's writer has stopped".into(),
            ))
        })
    }
}

/// A message's due time, a relative one counted from `now` (Redis's time; the
/// journal's due time is for a restore, which schedules it again at that time).
fn due_ms(due: Due, now: u64) -> u64 {
    match due {
        Due::At(at) => at,
        Due::In(delay) => now.saturating_add(delay.as_millis() as u64),
    }
}

/// Epoch ms by this node's clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Takes what waits, up to [`MAX_ROWS`] rows, into one transaction, with up to
/// [`IN_FLIGHT`] transactions at once.
async fn run(journal: Journal, mut jobs: mpsc::Receiver<Job>) {
    let slots = std::sync::Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = jobs.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        // Waiting for a free slot let more jobs queue up: they go in this one.
        let mut batch = vec![first];
        let mut rows = batch[0].rows.len();
        while rows < MAX_ROWS {
            match jobs.try_recv() {
                Ok(job) => {
                    rows += job.rows.len();
                    batch.push(job);
                }
                Err(_) => break,
            }
        }
        let journal = journal.clone();
        tokio::spawn(async move {
            let pushes: Vec<Push<'_>> = batch
                .iter()
                .flat_map(|job| job.rows.iter().map(move |row| (row, job)))
                .map(|((msg, due_ms, replace), job)| Push {
                    msg,
                    due_ms: *due_ms,
                    replace: *replace,
                    at_ms: job.at_ms,
                    came: &job.came,
                })
                .collect();
            let result = match tokio::time::timeout(
                WRITE_TIMEOUT,
                journal.record_scheduled(&pushes),
            )
            .await
            {
                Ok(result) => result,
                Err(_) => Err(JournalError::Mysql(format!(
                    "no commit within {}s",
                    WRITE_TIMEOUT.as_secs()
                ))),
            };
            drop(pushes);
            crate::metrics::journal_commit(rows, result.is_ok());
            for job in batch {
                let _ = job.done.send(result.clone());
            }
            drop(permit);
        });
    }
}
