//! Leadership as a value: who leads, under which epoch.
//!
//! An elector (standalone here, etcd in `election`) publishes the current [`Role`]
//! through a watch channel; leader-only loops start when it says `Leader` and are
//! cancelled when it says anything else. Loops that learn they were deposed (a
//! `FENCED` reply) ask the elector to step down through the same handle.

use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// One term of leadership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// Strictly increasing across leaders: the fence every leader-only script checks.
    pub epoch: u64,
    pub since: SystemTime,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not leading: serving the API only.
    Follower,
    Leader(Term),
}

impl Role {
    pub fn epoch(&self) -> Option<u64> {
        match self {
            Role::Leader(term) => Some(term.epoch),
            Role::Follower => None,
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader(_))
    }
}

/// Why a leader gives up its term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDown {
    /// A newer leader raised the fence above this one's epoch.
    Fenced { epoch: u64, held: u64 },
    /// An operator asked for a planned switchover.
    Resign,
    /// The Redis master moved (a Sentinel failover): the fences there may have gone
    /// back with the writes the failover lost, so a new term raises them.
    MasterMoved { epoch: u64 },
}

/// What every part of the daemon sees of leadership.
#[derive(Clone, Debug)]
pub struct Leadership {
    role: watch::Receiver<Role>,
    requests: mpsc::UnboundedSender<StepDown>,
    /// Details the elector publishes for `/v1/leader` (who leads, lease left).
    info: watch::Receiver<LeaderInfo>,
    /// The last term this node ended, and why (see [`Elector::end`]).
    ended: watch::Receiver<Option<Ended>>,
}

/// A term this node ended, for the leadership history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub epoch: u64,
    /// `resigned`, `switchover`, `shut down`, `lease lost`, `fenced` or `master moved`.
    pub why: &'static str,
    pub at: SystemTime,
}

/// What this node knows of the current leader, for operators.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderInfo {
    pub node_id: Option<String>,
    pub address: Option<String>,
    pub epoch: Option<u64>,
    /// The leader's etcd lease (etcd mode): a standby that sees the leader gone
    /// from Redis ends it (see `election::takeover`).
    pub lease: Option<i64>,
    /// When this node's lease runs out by its own clock, while it leads (etcd mode):
    /// the local deadline of the last renewal, or a past instant once it is beyond it
    /// (failsafe). See [`LeaderInfo::lease_left`].
    pub lease_deadline: Option<Instant>,
    pub mode: &'static str,
    /// Whether etcd answered the last query (None without etcd), for `/readyz`.
    pub etcd_reachable: Option<bool>,
}

impl LeaderInfo {
    /// Lease time left now (zero beyond the deadline), while this node leads.
    pub fn lease_left(&self) -> Option<Duration> {
        self.lease_deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// The elector's side of a [`Leadership`].
pub struct Elector {
    pub role: watch::Sender<Role>,
    pub requests: mpsc::UnboundedReceiver<StepDown>,
    pub info: watch::Sender<LeaderInfo>,
    pub ended: watch::Sender<Option<Ended>>,
    /// The election group it elects for (`election.mode = "per_shard"`): its
    /// metrics carry a `group` label.
    pub group: Option<u16>,
}

/// A connected pair: the elector publishes, everyone else reads.
pub fn channel() -> (Elector, Leadership) {
    channel_for(None)
}

/// [`channel`] for one election group's elector.
pub fn channel_for(group: Option<u16>) -> (Elector, Leadership) {
    let (role_tx, role_rx) = watch::channel(Role::Follower);
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (info_tx, info_rx) = watch::channel(LeaderInfo::default());
    let (ended_tx, ended_rx) = watch::channel(None);
    (
        Elector {
            role: role_tx,
            requests: req_rx,
            info: info_tx,
            ended: ended_tx,
            group,
        },
        Leadership {
            role: role_rx,
            requests: req_tx,
            info: info_rx,
            ended: ended_rx,
        },
    )
}

impl Leadership {
    pub fn current(&self) -> Role {
        self.role.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    pub fn info(&self) -> LeaderInfo {
        self.info.borrow().clone()
    }

    /// Follows what the elector publishes for operators (leader, epoch, mode).
    pub fn info_updates(&self) -> watch::Receiver<LeaderInfo> {
        self.info.clone()
    }

    /// Follows the terms this node ends.
    pub fn ends(&self) -> watch::Receiver<Option<Ended>> {
        self.ended.clone()
    }

    /// Asks the elector to end the current term. Ignored if the term already ended.
    pub fn step_down(&self, why: StepDown) {
        let _ = self.requests.send(why);
    }
}

impl Elector {
    /// Ends the current term (if this node leads) for `why` (see [`Ended::why`]):
    /// publishes the end for the leadership history, then the role.
    pub fn end(&self, why: &'static str, reason: &str) {
        if let Some(epoch) = self.role.borrow().epoch() {
            self.ended.send_replace(Some(Ended {
                epoch,
                why,
                at: SystemTime::now(),
            }));
        }
        self.set(Role::Follower, reason);
    }

    /// Publishes a role change, and records it in logs and metrics.
    pub fn set(&self, role: Role, reason: &str) {
        let old = self.role.borrow().clone();
        if old == role {
            return;
        }
        let leads = if role.is_leader() { 1.0 } else { 0.0 };
        match &role {
            Role::Leader(term) => {
                tracing::info!(
                    epoch = term.epoch,
                    group = self.group,
                    reason,
                    "leadership gained"
                );
            }
            Role::Follower => {
                tracing::warn!(
                    epoch = old.epoch(),
                    group = self.group,
                    reason,
                    "leadership lost"
                )
            }
        }
        match self.group {
            None => {
                if let Role::Leader(term) = &role {
                    metrics::gauge!(crate::metrics::EPOCH).set(term.epoch as f64);
                }
                metrics::gauge!(crate::metrics::IS_LEADER).set(leads);
                metrics::counter!(crate::metrics::TRANSITIONS).increment(1);
            }
            Some(group) => {
                let group = group.to_string();
                if let Role::Leader(term) = &role {
                    metrics::gauge!(crate::metrics::GROUP_EPOCH, "group" => group.clone())
                        .set(term.epoch as f64);
                }
                metrics::gauge!(crate::metrics::GROUP_LEADER, "group" => group).set(leads);
            }
        }
        self.role.send_replace(role);
    }
}

/// Leads without etcd: takes an epoch from Redis and leads until fenced out by a
/// newer standalone instance (then it serves the API only) or until `cancel`.
pub async fn run_standalone(
    store: Store,
    node_id: String,
    address: String,
    mut elector: Elector,
    cancel: CancellationToken,
) {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    static NO_EPOCH: crate::complaint::Complaint = crate::complaint::Complaint::new(
        "standalone: cannot take an epoch from Redis; retrying",
        "standalone: took an epoch from Redis",
    );
    let mut above = 0;
    'terms: loop {
        let epoch = loop {
            match store.next_standalone_epoch(above).await {
                Ok(epoch) => {
                    if let Some(said) = NO_EPOCH.recovered() {
                        tracing::info!("{said}");
                    }
                    break epoch;
                }
                Err(e) => {
                    if let Some(said) = NO_EPOCH.failed() {
                        tracing::warn!(error = %e, "{said}");
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => break 'terms,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        };
        backoff.reset();
        // The role first: whoever sees the standalone details (the service manager's
        // READY, `/v1/leader`) then also sees this node leading.
        elector.set(
            Role::Leader(Term {
                epoch,
                since: SystemTime::now(),
            }),
            "standalone: no etcd configured",
        );
        elector.info.send_replace(LeaderInfo {
            node_id: Some(node_id.clone()),
            address: Some(address.clone()),
            epoch: Some(epoch),
            lease: None,
            lease_deadline: None,
            mode: "standalone",
            etcd_reachable: None,
        });
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break 'terms,
                request = elector.requests.recv() => match request {
                    Some(StepDown::Fenced { epoch, held }) => {
                        // The term logged the fencing (`Term::fenced`); this is what follows.
                        tracing::info!(epoch, held, "standalone: a newer instance leads; serving the API only from now on");
                        metrics::counter!(crate::metrics::FENCED).increment(1);
                        elector.info.send_modify(|i| { i.node_id = None; i.address = None; i.epoch = Some(held); });
                        elector.end("fenced", "fenced");
                    }
                    Some(StepDown::MasterMoved { epoch: moved }) if moved == epoch => {
                        // A new epoch, above this one, from the new master.
                        elector.end("master moved", "the Redis master moved");
                        above = epoch;
                        continue 'terms;
                    }
                    Some(StepDown::MasterMoved { .. }) => {}
                    Some(StepDown::Resign) => {
                        tracing::warn!("standalone: resign requested, but with no etcd there is no one to hand over to; still leading");
                    }
                    None => break 'terms,
                }
            }
        }
    }
    elector.end("shut down", "shutting down");
}

/// One election group of `election.mode = "per_shard"`: its shards and who leads
/// them.
#[derive(Clone, Debug)]
pub struct Group {
    pub group: u16,
    pub shards: Vec<u16>,
    pub leadership: Leadership,
}

/// The node's leadership over its election groups as one [`Leadership`], for
/// what speaks of the node as a whole (`/v1/leader`, `/readyz`, the service
/// manager): it leads while it leads any group, with the highest epoch among
/// them and since the earliest; etcd counts as reachable while every group's
/// elector reached it; the leader named is this node while it leads a group, else
/// group 0's. A step-down asked of it is asked of every group. The merging runs
/// until every group's elector is gone.
pub fn merge(
    node_id: String,
    address: String,
    groups: &[Group],
) -> (Leadership, impl std::future::Future<Output = ()> + use<>) {
    let (mut elector, merged) = channel();
    let sources: Vec<Leadership> = groups.iter().map(|g| g.leadership.clone()).collect();
    let run = async move {
        let mut roles: Vec<_> = sources.iter().map(Leadership::subscribe).collect();
        let mut infos: Vec<_> = sources.iter().map(Leadership::info_updates).collect();
        loop {
            let (role, info) = merged_view(&node_id, &address, &roles, &infos);
            elector.info.send_replace(info);
            elector.set(role, "election groups changed");
            let changes = roles
                .iter_mut()
                .map(|r| Box::pin(r.changed()) as Changed<'_>)
                .chain(
                    infos
                        .iter_mut()
                        .map(|i| Box::pin(i.changed()) as Changed<'_>),
                );
            tokio::select! {
                (changed, _, _) = futures::future::select_all(changes) => if changed.is_err() { return },
                request = elector.requests.recv() => match request {
                    Some(request) => sources.iter().for_each(|s| s.step_down(request.clone())),
                    None => return,
                },
            }
        }
    };
    (merged, run)
}

/// A change of one of the watched values [`merge`] follows.
type Changed<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), watch::error::RecvError>> + Send + 'a>,
>;

/// The merged role and details of [`merge`].
fn merged_view(
    node_id: &str,
    address: &str,
    roles: &[watch::Receiver<Role>],
    infos: &[watch::Receiver<LeaderInfo>],
) -> (Role, LeaderInfo) {
    let terms: Vec<Term> = roles
        .iter()
        .filter_map(|r| match &*r.borrow() {
            Role::Leader(term) => Some(term.clone()),
            Role::Follower => None,
        })
        .collect();
    let infos: Vec<LeaderInfo> = infos.iter().map(|i| i.borrow().clone()).collect();
    let role = match terms.iter().map(|t| t.epoch).max() {
        Some(epoch) => Role::Leader(Term {
            epoch,
            since: terms.iter().map(|t| t.since).min().expect("some term"),
        }),
        None => Role::Follower,
    };
    let first = infos.first().cloned().unwrap_or_default();
    let leading = role.is_leader();
    let info = LeaderInfo {
        node_id: if leading {
            Some(node_id.to_owned())
        } else {
            first.node_id
        },
        address: if leading {
            Some(address.to_owned())
        } else {
            first.address
        },
        epoch: infos.iter().filter_map(|i| i.epoch).max(),
        lease: None,
        lease_deadline: infos.iter().filter_map(|i| i.lease_deadline).min(),
        mode: first.mode,
        etcd_reachable: infos
            .iter()
            .map(|i| i.etcd_reachable)
            .reduce(|a, b| match (a, b) {
                (Some(a), Some(b)) => Some(a && b),
                _ => None,
            })
            .flatten(),
    };
    (role, info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(epoch: u64) -> Role {
        Role::Leader(Term {
            epoch,
            since: SystemTime::UNIX_EPOCH + Duration::from_secs(epoch),
        })
    }

    #[tokio::test]
    async fn the_node_leads_while_it_leads_any_group_and_resigns_them_all() {
        let (mut electors, groups): (Vec<Elector>, Vec<Group>) = (0..3)
            .map(|g| {
                let (elector, leadership) = channel_for(Some(g));
                let group = Group {
                    group: g,
                    shards: vec![g],
                    leadership,
                };
                (elector, group)
            })
            .unzip();
        let (merged, run) = merge("me".into(), "127.0.0.1:1".into(), &groups);
        let merging = tokio::spawn(run);
        let mut roles = merged.subscribe();
        assert_eq!(merged.current(), Role::Follower);

        electors[1].set(leader(5), "won");
        electors[2].set(leader(7), "won");
        let role = roles
            .wait_for(|r| r.epoch() == Some(7))
            .await
            .unwrap()
            .clone();
        // The highest epoch, since the earliest term.
        assert_eq!(
            role,
            Role::Leader(Term {
                epoch: 7,
                since: SystemTime::UNIX_EPOCH + Duration::from_secs(5)
            })
        );
        assert_eq!(merged.info().node_id.as_deref(), Some("me"));

        merged.step_down(StepDown::Resign);
        for elector in &mut electors {
            assert_eq!(elector.requests.recv().await, Some(StepDown::Resign));
        }
        electors[1].set(Role::Follower, "resigned");
        electors[2].set(Role::Follower, "resigned");
        roles.wait_for(|r| !r.is_leader()).await.unwrap();

        // The merging ends with the groups' electors.
        drop(electors);
        merging.await.unwrap();
    }
}
