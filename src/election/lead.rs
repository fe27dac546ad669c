//! Leading: the term from the moment etcd names this node until its lease or key is
//! gone or it resigns, and the lease given back (resigned, revoked) after it.

use super::*;

/// How long a node that resigned stays out of the race, so that another takes
/// over (those already campaigning win within milliseconds).
pub(super) const RESIGN_PAUSE: Duration = Duration::from_secs(1);

/// Bound on each of resign and revoke when a term ends, so shutdown stays fast
/// even when etcd is gone.
pub(super) const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

impl Node {
    /// Leads until the term ends, and says why it ended. The role is `Follower`
    /// again when this returns.
    pub(super) async fn lead(
        &mut self,
        lease: &mut Lease,
        epoch: u64,
        watch: &mut KeyWatch,
    ) -> TermEnd {
        let failsafe = self.config.failsafe;
        let state = lease.state();
        if state.contact == Contact::Gone {
            return TermEnd::LeaseGone;
        }
        if Instant::now() >= state.deadline && at_deadline(state, failsafe) == AtDeadline::StepDown
        {
            return TermEnd::Deadline;
        }
        self.elector.set(
            Role::Leader(Term {
                epoch,
                since: SystemTime::now(),
            }),
            "won the etcd election",
        );
        self.publish_lease(state.deadline, epoch, lease.id);
        let me = self.me.node_id.clone();
        let mut switch = self.switchover.clone();
        // Asked of Redis, not of the follower's last read: a leader with no other
        // standby to wait for resigns at once, and this node may win before its
        // follower has read the key. Left in place, the key would keep the other
        // standbys out of the election until it expires.
        // In the background: a Redis that does not answer (a cluster connection
        // learning a new topology) must not keep this term from watching its
        // lease and key, or a node that lost the group would go on claiming it.
        let (store, node, within) = (self.store.clone(), me.clone(), self.config.connect_timeout);
        tokio::spawn(async move {
            match tokio::time::timeout(within, store.clear_switchover(&node)).await {
                Ok(Ok(true)) => tracing::info!(epoch, "switchover done: this node leads"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot clear the switchover key; it expires by itself")
                }
                Err(_) => tracing::warn!(
                    "cannot clear the switchover key (Redis did not answer in time); it expires by itself"
                ),
            }
        });

        // Past the deadline under failsafe, or waiting at it for the renewal out:
        // the deadline timer is off until the lease's next news.
        let mut beyond_deadline = false;
        let mut awaiting_renewal = false;
        let mut told_unreachable = false;
        let end = loop {
            let deadline = lease.state().deadline;
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break TermEnd::Shutdown,
                Some(request) = self.elector.requests.recv() => match request {
                    StepDown::Fenced { epoch: caller, held } if caller == epoch => break TermEnd::Fenced { held },
                    StepDown::Resign => break TermEnd::Resigned,
                    StepDown::MasterMoved { epoch: caller } if caller == epoch => break TermEnd::MasterMoved,
                    other => tracing::debug!(?other, "step-down request from an earlier term ignored"),
                },
                state = lease.changed() => match state.contact {
                    Contact::Gone => break TermEnd::LeaseGone,
                    Contact::Renewed => {
                        if beyond_deadline {
                            tracing::info!(epoch, "etcd answers again and the lease holds; leading under its deadline again");
                        }
                        // A deadline that passed meanwhile fires again at once.
                        beyond_deadline = false;
                        awaiting_renewal = false;
                        told_unreachable = false;
                        self.publish_lease(state.deadline, epoch, lease.id);
                    }
                    Contact::Unreachable => {
                        if !told_unreachable {
                            told_unreachable = true;
                            tracing::warn!(epoch, failsafe, left = ?state.deadline.saturating_duration_since(Instant::now()),
                                "etcd does not answer lease renewals; leading until the lease deadline{}",
                                if failsafe { ", and beyond it while etcd stays unreachable (failsafe)" } else { "" });
                        }
                        // The renewal waited for at the deadline failed: the
                        // deadline's rule decides on that.
                        if std::mem::take(&mut awaiting_renewal) {
                            match at_deadline(state, failsafe) {
                                AtDeadline::KeepLeading => {
                                    beyond_deadline = true;
                                    self.beyond_deadline(epoch, state.deadline, lease.id);
                                }
                                _ => break TermEnd::Deadline,
                            }
                        }
                    }
                },
                _ = tokio::time::sleep_until(deadline), if !beyond_deadline && !awaiting_renewal => {
                    match at_deadline(lease.state(), failsafe) {
                        AtDeadline::StepDown => break TermEnd::Deadline,
                        AtDeadline::KeepLeading => {
                            beyond_deadline = true;
                            self.beyond_deadline(epoch, deadline, lease.id);
                        }
                        AtDeadline::AwaitRenewal => {
                            awaiting_renewal = true;
                            tracing::debug!(epoch, "lease deadline reached with a renewal out: deciding on its answer");
                        }
                    }
                }
                () = watch.deleted() => break TermEnd::KeyDeleted,
                _ = switchover_turns(&mut switch, &me, true) => {
                    let to = switch.borrow().clone().unwrap_or_default();
                    self.others_stood_aside(&to).await;
                    break TermEnd::Switchover;
                }
            }
        };
        self.elector.end(end.kind(), &end.reason());
        let me = self.me.node_id.clone();
        self.elector.info.send_modify(|i| {
            i.lease_deadline = None;
            if i.node_id.as_deref() == Some(me.as_str()) {
                i.node_id = None;
                i.address = None;
                i.epoch = None;
                i.lease = None;
            }
        });
        metrics::gauge!(m::LEASE_REMAINING).set(0.0);
        if let TermEnd::Fenced { held } = end {
            // The term said it, once for every group fenced with it (`Term::fenced`).
            metrics::counter!(m::FENCED).increment(1);
            tracing::debug!(epoch, held, "fenced out: the term is over");
        }
        end
    }

    /// Past the lease deadline under failsafe, etcd unreachable: said, and shown.
    fn beyond_deadline(&self, epoch: u64, deadline: Instant, lease: i64) {
        tracing::warn!(
            epoch,
            "lease deadline passed while etcd is unreachable; failsafe: still forwarding under the fence"
        );
        self.publish_lease(deadline, epoch, lease);
    }

    /// Shows the lease time left on `/v1/leader` and in metrics (zero once the
    /// deadline has passed, under failsafe).
    pub(super) fn publish_lease(&self, deadline: Instant, epoch: u64, lease: i64) {
        let left = deadline.saturating_duration_since(Instant::now());
        metrics::gauge!(m::LEASE_REMAINING).set(left.as_secs_f64());
        let me = self.me.clone();
        self.elector.info.send_modify(|i| {
            i.node_id = Some(me.node_id);
            i.address = Some(me.address);
            i.epoch = Some(epoch);
            i.lease = Some(lease);
            i.lease_deadline = Some(deadline);
        });
    }

    /// Resigns (a standby takes over within milliseconds) and revokes the lease,
    /// each bounded so that shutdown stays fast when etcd is gone.
    pub(super) async fn release(&self, lease: Lease, key: Option<LeaderKey>) {
        let gone = lease.state().contact == Contact::Gone;
        let id = lease.id;
        drop(lease);
        if gone {
            return;
        }
        if let Some(key) = key {
            let asked = Instant::now();
            let election = self.client.election_client();
            let resigned = call(RELEASE_TIMEOUT, || {
                let mut c = election.clone();
                let key = key.clone();
                async move { c.resign(Some(ResignOptions::new().with_leader(key))).await }
            })
            .await;
            match resigned {
                Ok(_) => {
                    tracing::debug!(took = ?asked.elapsed(), "resigned: the leader key is deleted")
                }
                Err(e) => tracing::warn!(
                    error = %explain(&self.config, e.as_ref()),
                    "cannot resign; the lease will expire instead"
                ),
            }
        }
        let lease_client = self.client.lease_client();
        let revoked = call(RELEASE_TIMEOUT, || {
            let mut c = lease_client.clone();
            async move { c.revoke(id).await }
        })
        .await;
        if let Err(e) = revoked {
            tracing::debug!(
                error = %readable(e.as_ref()),
                "cannot revoke the lease; it will expire"
            );
        }
    }
}
