//! A round's campaign: the node's presence announced in Redis, standing aside while
//! another node campaigns and this one has no presence, then etcd's campaign on the
//! election key, watched so that a stuck one is noticed.

use super::*;

/// How often a standby whose campaign has not returned asks etcd who leads. When
/// the answer is its own key twice running, the campaign is stuck and is sent
/// again, which returns at once (the key is already first in line). Seen after etcd
/// members restart: the member serving a campaign can leave it waiting until etcd's
/// request timeout, seconds after the leader before it resigned.
pub(super) const STUCK_CAMPAIGN_CHECK: Duration = Duration::from_millis(100);

/// How long a node waits for its presence in Redis (see `takeover`) before it
/// campaigns anyway, if no other node campaigns: a node that cannot reach Redis
/// may still lead while no standby can reach Redis either.
pub(super) const PRESENCE_WAIT: Duration = Duration::from_secs(1);

/// How often a node whose Redis does not answer, standing aside, looks again
/// whether another node still campaigns.
pub(super) const ASIDE_CHECK: Duration = Duration::from_secs(1);

pub(super) static CAMPAIGN_FAILED: Complaint =
    Complaint::across("group", "campaign failed", "campaigning works again");

/// Longest a leader waits for the other standbys to leave the election before it
/// hands over to a switchover's node.
pub(super) const STAND_ASIDE_WAIT: Duration = Duration::from_secs(2);

impl Node {
    /// Waits until every candidate but this node and `to` has left the election
    /// (each standby does once it reads the switchover key), at most
    /// [`STAND_ASIDE_WAIT`]: `to`, the one candidate left, then leads next.
    pub(super) async fn others_stood_aside(&self, to: &str) {
        let prefix = format!("{}/", self.config.election_prefix);
        let deadline = Instant::now() + STAND_ASIDE_WAIT;
        loop {
            let read = observe::campaigners(&self.client, &self.config, &prefix, None).await;
            let only_us = read.is_ok_and(|r| {
                r.kvs().iter().all(|kv| {
                    let node = LeaderValue::parse(kv.value()).node_id;
                    node == self.me.node_id || node == to
                })
            });
            if only_us || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(SWITCHOVER_EVERY / 2).await;
        }
    }

    /// Holds this node's presence for `lease` in Redis before it campaigns with it,
    /// so that no standby ever finds a leader without one; waits at most
    /// [`PRESENCE_WAIT`]. Err when cancelled.
    pub(super) async fn announce(&mut self, lease: i64) -> Result<(), ()> {
        self.want.send_replace(Some(lease));
        if self.presence_within(lease, PRESENCE_WAIT).await? {
            return Ok(());
        }
        // Redis does not serve this node: it stays out of the race while another
        // node campaigns (one that reaches Redis, or that gave up waiting first),
        // so it never wins a group it cannot serve; alone, it campaigns anyway.
        let mut said = false;
        loop {
            let others = self.other_campaigners().await;
            if others == 0 {
                tracing::warn!(
                    "no presence in Redis yet (Redis does not answer); no other node campaigns, so campaigning anyway, and a standby that reaches Redis may end this lease"
                );
                return Ok(());
            }
            if !said {
                tracing::warn!(
                    others,
                    "no presence in Redis (Redis does not answer this node); standing aside while other nodes campaign"
                );
                said = true;
            }
            if self.presence_within(lease, ASIDE_CHECK).await? {
                tracing::info!("presence in Redis held: campaigning");
                return Ok(());
            }
        }
    }

    /// Whether this node's presence for `lease` is held within `wait`; Err when
    /// cancelled.
    pub(super) async fn presence_within(&mut self, lease: i64, wait: Duration) -> Result<bool, ()> {
        tokio::select! {
            _ = self.cancel.cancelled() => Err(()),
            r = tokio::time::timeout(
                wait,
                self.held.wait_for(|h| h.is_some_and(|h| h.lease == lease)),
            ) => Ok(r.is_ok_and(|r| r.is_ok())),
        }
    }

    /// How many other nodes campaign in this election now (an unreadable etcd
    /// counts as none: the campaign then fails or waits on its own).
    pub(super) async fn other_campaigners(&self) -> usize {
        let prefix = format!("{}/", self.config.election_prefix);
        match observe::campaigners(&self.client, &self.config, &prefix, None).await {
            Ok(read) => read
                .kvs()
                .iter()
                .filter(|kv| LeaderValue::parse(kv.value()).node_id != self.me.node_id)
                .count(),
            Err(_) => 0,
        }
    }

    /// Where this node's election failures count (`Complaint::failed_on`): its
    /// election group.
    pub(super) fn place(&self) -> u64 {
        self.elector.group.map_or(0, u64::from)
    }

    /// Campaigns until this node leads; the lease stays alive meanwhile.
    pub(super) async fn campaign(&mut self, lease: &mut Lease) -> Result<LeaderKey, Next> {
        let mut retry = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let me = self.me.node_id.clone();
        let mut switch = self.switchover.clone();
        loop {
            let mut election = self.client.election_client();
            let attempt = election.campaign(
                self.config.election_prefix.clone(),
                self.value.clone(),
                lease.id,
            );
            tokio::pin!(attempt);
            let sent = Instant::now();
            let mut check = tokio::time::interval(STUCK_CAMPAIGN_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut named_leader = 0;
            let failure = loop {
                tokio::select! {
                    _ = self.cancel.cancelled() => return Err(Next::Stop),
                    state = lease.changed() => if state.contact == Contact::Gone {
                        tracing::info!("lease expired while standing by; campaigning again with a new one");
                        return Err(Next::Again(Duration::ZERO));
                    },
                    Some(request) = self.elector.requests.recv() => {
                        tracing::debug!(?request, "not leading; step-down request ignored");
                    }
                    _ = switchover_turns(&mut switch, &me, true) => {
                        return Err(Next::Again(Duration::ZERO));
                    }
                    result = &mut attempt => match result {
                        Ok(mut resp) => match resp.take_leader() {
                            Some(key) => {
                                if let Some(said) = CAMPAIGN_FAILED.recovered_on(self.place()) {
                                    tracing::info!("{said}");
                                }
                                return Ok(key);
                            }
                            None => break Some(anyhow!("etcd answered the campaign without a leader key")),
                        },
                        Err(e) => break Some(anyhow::Error::from(e)),
                    },
                    _ = check.tick() => {
                        // A campaign that stands waits for the leader before it: etcd took it.
                        if sent.elapsed() > Duration::from_secs(1)
                            && let Some(said) = CAMPAIGN_FAILED.recovered_on(self.place())
                        {
                            tracing::info!("{said}");
                        }
                        if self.etcd_names_leader(lease.id).await {
                            named_leader += 1;
                        } else {
                            named_leader = 0;
                        }
                        if named_leader >= 2 {
                            break None;
                        }
                    }
                }
            };
            let Some(failure) = failure else {
                tracing::info!(
                    "etcd names this node leader but its campaign has not returned; campaigning again at once"
                );
                continue;
            };
            // A campaign that stood a while before failing (its etcd member went away,
            // or etcd timed it out when the leader resigned) is no failure streak: the
            // next one goes out after the first, short delay, not a grown one.
            if sent.elapsed() > Duration::from_secs(1) {
                retry.reset();
            }
            let delay = retry.next_delay();
            if let Some(said) = CAMPAIGN_FAILED.failed_on(self.place()) {
                tracing::warn!(error = %explain(&self.config, failure.as_ref()), retry_in = ?delay, "{said}");
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return Err(Next::Stop),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Whether etcd's current leader key is this node's (made with `lease_id`);
    /// false when etcd does not answer soon.
    pub(super) async fn etcd_names_leader(&self, lease_id: i64) -> bool {
        let mut election = self.client.election_client();
        let asked = tokio::time::timeout(
            STUCK_CAMPAIGN_CHECK * 5,
            election.leader(self.config.election_prefix.clone()),
        )
        .await;
        matches!(asked, Ok(Ok(resp)) if resp.kv().is_some_and(|kv| kv.lease() == lease_id))
    }
}
