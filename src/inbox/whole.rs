//! A marked read stored whole: one schedule call stores every entry of the read and
//! settles it (see `delayq_client::store::InboxRead`), the common case; a read that
//! cannot be (an entry rejected, a call that failed) is released first, its entries
//! made pending one by one, and then goes as [`Worker::handle`] takes any entries.

use super::*;

/// How a marked read's try to store it whole went.
enum Whole<'e> {
    /// Stored and settled; these entries were too far ahead (now pending one by one,
    /// for this node) and are still to be rejected.
    Stored(Vec<&'e InboxEntry>),
    /// Not stored: the read is to be released.
    Not,
}

impl Worker {
    /// Whether reads are marked from now on (`was`: until now): on standalone Redis,
    /// with reads one schedule call carries, while no reader of an older release
    /// reads the inbox (see `delayq_client::store::InboxRead`).
    pub(super) async fn reads_marked(
        &self,
        reader: &mut InboxReader,
        was: bool,
    ) -> Result<bool, StoreError> {
        if self.store.is_cluster() || self.inbox.batch_size > MAX_PER_CALL {
            return Ok(false);
        }
        let older = reader.older_readers().await?;
        if older && was {
            tracing::info!(inbox = %self.queue.stream, "a reader of an older release reads the inbox: reading it entry by entry meanwhile");
        }
        Ok(!older)
    }

    /// Handles what one read handed out: a marked read stored whole where it can be,
    /// else released and handled entry by entry; an unmarked read entry by entry.
    pub(super) async fn handle_read(
        &self,
        read: InboxRead,
        cancel: &CancellationToken,
    ) -> Result<(), StoreError> {
        let Some(marked) = read.marked else {
            return self.handle(&read.entries, None, cancel).await;
        };
        match self.store_whole(&read.entries, &marked).await {
            Whole::Stored(far) if far.is_empty() => Ok(()),
            Whole::Stored(far) => {
                let far: Vec<InboxEntry> = far.into_iter().cloned().collect();
                self.handle(&far, None, cancel).await
            }
            Whole::Not => {
                if self.release(&marked, cancel).await? {
                    self.handle(&read.entries, None, cancel).await
                } else {
                    Ok(())
                }
            }
        }
    }

    /// One schedule call for every entry of the read, settling it, when every entry
    /// is valid and the call carries them all.
    async fn store_whole<'e>(&self, entries: &'e [InboxEntry], marked: &str) -> Whole<'e> {
        let config = self.config();
        let mut items = Vec::with_capacity(entries.len());
        for entry in entries {
            match parse_entry(entry, &config) {
                Ok(msg) => items.push(BatchItem {
                    msg,
                    mode: ScheduleMode::New,
                    inbox_entry: Some(entry.id.clone()),
                }),
                Err(_) => return Whole::Not,
            }
        }
        let ack = Some(InboxAck {
            stream: &self.queue.stream,
            group: &self.queue.group,
            read: Some(marked),
        });
        let max_delay = config.api.limits.max_delay;
        let came = &crate::journal::Came::node("inbox", &config.node_id);
        let outcomes = self
            .ingest
            .schedule_many(&items, max_delay, ack, came)
            .await;
        // A failed call fails every message alike; too far is one message's answer.
        if outcomes.iter().any(|o| {
            o.as_ref()
                .is_err_and(|e| !matches!(e, StoreError::TooFar { .. }))
        }) {
            return Whole::Not;
        }
        let (mut scheduled, mut duplicates, mut far) = (0u64, 0u64, Vec::new());
        for (entry, outcome) in entries.iter().zip(outcomes) {
            match outcome {
                Ok(Scheduled::Duplicate { .. }) => duplicates += 1,
                Ok(_) => scheduled += 1,
                Err(_) => far.push(entry),
            }
        }
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "scheduled").increment(scheduled);
        metrics::counter!(m::INBOX_ENTRIES, "outcome" => "duplicate").increment(duplicates);
        Whole::Stored(far)
    }

    /// Releases the marked read `marked`, retrying with backoff until it is done or
    /// `cancel` comes (its reader's next life, or another instance once it is idle
    /// for `inbox.reclaim_after`, releases it then). Whether its entries are now
    /// pending for this node: not when it was settled already (a call answered in
    /// error after storing it) or taken over.
    async fn release(&self, marked: &str, cancel: &CancellationToken) -> Result<bool, StoreError> {
        let node = self.config().node_id.clone();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let released = self
                .store
                .release_inbox_read(&self.queue, marked, &node, 0, Duration::ZERO)
                .await;
            match released {
                Ok(ids) => return Ok(!ids.is_empty()),
                Err(error) => {
                    let what = format!("the release of read {marked}");
                    self.wait_to_retry(&mut backoff, error, &what, cancel)
                        .await?
                }
            }
        }
    }
}
